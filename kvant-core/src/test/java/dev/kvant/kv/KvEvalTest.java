package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

class KvEvalTest {
    private static Map<String, KvEval.Row> byFormat(List<KvEval.Row> rows) {
        return rows.stream().collect(Collectors.toMap(KvEval.Row::format, Function.identity()));
    }

    /**
     * For N(0, I) queries E⟨q, e⟩² = ‖e‖², so the squared RMS inner-product error equals the relative MSE up to
     * sampling (512 rows × 16 queries: about 2% relative; 15% allowed).
     */
    /** The outlier queries weigh the channels where the rows carry their outliers, as a model's queries do. */
    @Test
    void outlierQueriesFallOnTheRowsOwnOutlierChannels() {
        for (long seed : new long[] {1, 7, 42}) {
            float[][] rows = KvEval.outlierRows(512, 128, seed);
            float[] own = KvEval.outlierScales(128, new java.util.SplittableRandom(seed ^ 0x5DEECE66DL));
            assertArrayEquals(own, KvEval.rowOutlierScales(rows, 128), "seed " + seed);
        }
        // a llama model's RoPE rotates channels 2i and 2i + 1 together: its outlier pairs are those
        float[][] rows = new float[64][128];
        java.util.SplittableRandom rnd = new java.util.SplittableRandom(5);
        for (float[] row : rows) {
            for (int i = 0; i < 128; i++) {
                row[i] = (float) rnd.nextGaussian() * (i == 90 || i == 91 ? 20 : i == 93 ? 10 : 1);
            }
        }
        float[] adjacent = KvEval.rowOutlierScales(rows, 128, false);
        for (int i = 0; i < 128; i++) {
            boolean outlier = i == 90 || i == 91 || i == 92 || i == 93;
            assertEquals(outlier ? 10f : 1f, adjacent[i], "channel " + i);
        }
    }

    @Test
    void gaussianQueryErrorIsTheSquareRootOfTheRelativeMse() {
        long seed = System.nanoTime();
        float[][] rows = KvEval.gaussianRows(512, 128, seed);
        Map<String, KvEval.Row> r = byFormat(KvEval.evaluate(KvFormat.all(), rows, 128, seed + 1, "gaussian"));
        for (KvEval.Row row : r.values()) {
            assertEquals(1.0, row.ipErrRel() * row.ipErrRel() / row.mseRel(), 0.15, "seed " + seed + " " + row);
            assertEquals("gaussian", row.source());
        }
        assertTrue(r.get("f16").mseRel() < 1e-6);
        assertTrue(r.get("q8_0").mseRel() < 1e-4);
        assertTrue(r.get("turbo2").mseRel() > r.get("turbo3").mseRel());
        assertTrue(r.get("turbo3").mseRel() > r.get("turbo4").mseRel());
        // the encoder's gain search leaves 0.80-0.86 of the renormalized nearest-centroid error 2 - 2√(1-D)
        double d = Codebook.sphere(4, 128).unitVectorMse();
        double plain = 2 - 2 * Math.sqrt(1 - d);
        double ratio = r.get("turbo4").mseRel() / plain;
        assertTrue(ratio > 0.75 && ratio < 0.92, "seed " + seed + ": turbo4 relative MSE " + ratio + " of 2-2√(1-D)");
    }

    /** Rotation spreads outlier channels over the block: q4_0h loses several times less than q4_0 on such rows. */
    @Test
    void rotationHelpsRowsWithOutlierChannels() {
        long seed = System.nanoTime();
        float[][] rows = KvEval.outlierRows(512, 128, seed);
        Map<String, KvEval.Row> r = byFormat(KvEval.evaluate(List.of(Q4Format.Q4_0, Q4Format.Q4_0H), rows, 128, seed, "outlier"));
        assertTrue(r.get("q4_0h").mseRel() * 3 < r.get("q4_0").mseRel(), "seed " + seed + ": " + r);
    }

    @Test
    void bitsPerValueCountPaddingAndRowsMustMatchTheHeadSize() {
        float[][] rows = KvEval.gaussianRows(8, 80, 1);
        Map<String, KvEval.Row> r = byFormat(KvEval.evaluate(List.of(Q4Format.Q4_0, Q4Format.Q4_0H, TurboFormat.TURBO3), rows, 80, 2, "x"));
        assertEquals(54, r.get("q4_0").rowBytes());
        assertEquals(4.5 * 128 / 80, r.get("q4_0h").bitsPerValue(), 1e-12);
        assertEquals(50 * 8.0 / 80, r.get("turbo3").bitsPerValue(), 1e-12);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> KvEval.evaluate(KvFormat.all(), new float[][] {new float[80], new float[81]}, 80, 1, "mixed"));
        assertTrue(e.getMessage().contains("mixed"), e.getMessage());
    }

    @Test
    void centeredFormatsLoseLessOnRowsSharingAnOffset() {
        // 2 layers x 200 positions x 2 kv heads of 128, every row a shared offset (per layer and head) plus noise
        int layers = 2, n = 200, heads = 2, d = 128;
        SplittableRandom rnd = new SplittableRandom(7);
        float[][] offsets = new float[layers * heads][d];
        for (float[] o : offsets) {
            for (int i = 0; i < d; i++) {
                o[i] = (float) (3 * rnd.nextGaussian());
            }
        }
        float[][] rows = new float[layers * n * heads][d];
        for (int l = 0; l < layers; l++) {
            for (int p = 0; p < n; p++) {
                for (int h = 0; h < heads; h++) {
                    for (int i = 0; i < d; i++) {
                        rows[(l * n + p) * heads + h][i] = offsets[l * heads + h][i] + (float) rnd.nextGaussian();
                    }
                }
            }
        }
        KvEval.Row plain = KvEval.evaluate(List.of(TurboFormat.TURBO3), rows, d, 1, "t").get(0);
        KvEval.Row centered = KvEval.evaluateCentered(List.of(KvFormat.parse("turbo3+mean")), rows, layers, heads, d,
                1, "t").get(0);
        assertEquals("turbo3+mean", centered.format());
        assertEquals(3.375, centered.bitsPerValue(), 1e-12);
        assertTrue(centered.mseRel() < 0.25 * plain.mseRel(), centered.mseRel() + " vs " + plain.mseRel());
    }

    /**
     * A model's queries weigh each row by the queries of its own layer and kv head: rows [layer][position][kv head],
     * each (layer, kv head) with queries on channels of its own, give the figure the sum over exactly those pairs
     * gives, plain and centered; without queries it is NaN; queries of the wrong count or size are refused.
     */
    @Test
    void modelQueriesWeighEachRowByItsOwnLayerAndHead() {
        int layers = 2, n = 40, heads = 3, d = 64, per = 5;
        SplittableRandom rnd = new SplittableRandom(11);
        float[][] rows = new float[layers * n * heads][d];
        for (float[] row : rows) {
            for (int i = 0; i < d; i++) {
                row[i] = (float) rnd.nextGaussian();
            }
        }
        float[][][][] q = new float[layers][heads][per][d];
        for (int l = 0; l < layers; l++) {
            for (int h = 0; h < heads; h++) {
                for (float[] x : q[l][h]) {
                    for (int i = 0; i < d; i++) {   // most of the weight on channel 7l + 11h
                        x[i] = (float) (rnd.nextGaussian() * (i == 7 * l + 11 * h ? 30 : 1));
                    }
                }
            }
        }
        KvEval.ModelQueries mq = new KvEval.ModelQueries(q, n, heads);
        KvEval.Row row = KvEval.evaluate(List.of(TurboFormat.TURBO3), rows, d, 1, "t", false, mq).get(0);
        double err = 0, ref = 0;
        java.lang.foreign.MemorySegment buf = java.lang.foreign.Arena.ofAuto().allocate(
                TurboFormat.TURBO3.rowBytes(d));
        for (int r = 0; r < rows.length; r++) {
            float[] dec = new float[TurboFormat.TURBO3.domainDim(d)];
            TurboFormat.TURBO3.encode(rows[r], 0, d, buf, 0);
            TurboFormat.TURBO3.decode(buf, 0, d, dec, 0);
            TurboFormat.TURBO3.unrotate(dec, 0, d);
            for (float[] x : q[r / (n * heads)][r % heads]) {
                double exact = 0, approx = 0;
                for (int i = 0; i < d; i++) {
                    exact += (double) x[i] * rows[r][i];
                    approx += (double) x[i] * dec[i];
                }
                err += (exact - approx) * (exact - approx);
                ref += exact * exact;
            }
        }
        assertEquals(Math.sqrt(err / ref), row.ipErrRelModelQ(), 1e-12);
        KvEval.Row centered = KvEval.evaluateCentered(List.of(KvFormat.parse("turbo3+mean")), rows, layers, heads, d,
                1, "t", false, mq).get(0);
        assertTrue(centered.ipErrRelModelQ() > 0 && centered.ipErrRelModelQ() < 1, centered.toString());
        assertTrue(Double.isNaN(KvEval.evaluate(List.of(TurboFormat.TURBO3), rows, d, 1, "t").get(0).ipErrRelModelQ()));
        assertThrows(IllegalArgumentException.class, () -> KvEval.evaluate(List.of(TurboFormat.TURBO3), rows, d, 1,
                "t", false, new KvEval.ModelQueries(q, n + 1, heads)));
        float[][][][] wide = new float[layers][heads][1][d + 1];
        assertThrows(IllegalArgumentException.class, () -> KvEval.evaluate(List.of(TurboFormat.TURBO3), rows, d, 1,
                "t", false, new KvEval.ModelQueries(wide, n, heads)));
    }

    /** A centered format's means are halves of the K domain, padded past a rotated head of 96: as the cache stores. */
    @Test
    void aCenteredFormatCountsItsMeansOverThePaddedDomain() {
        SplittableRandom rnd = new SplittableRandom(3);
        float[][] rows = new float[64][96];
        for (float[] row : rows) {
            for (int i = 0; i < 96; i++) {
                row[i] = (float) rnd.nextGaussian();
            }
        }
        KvEval.Row centered = KvEval.evaluateCentered(List.of(KvFormat.parse("turbo3+mean")), rows, 1, 1, 96, 1, "t")
                .get(0);
        // 50 bytes a row (a padded block of 128) and 128 halves of mean a 64-token page, per value of 96
        assertEquals((50 * 8.0 + 128 * 16.0 / 64) / 96, centered.bitsPerValue(), 1e-12);
    }

    @Test
    void paperReferenceFiguresAreTheLloydMaxErrors() {
        for (int bits = 1; bits <= 4; bits++) {
            assertEquals(KvEval.lloydMaxGaussianMse(bits), Codebook.gaussian(bits).unitVectorMse(),
                    1e-3 * KvEval.lloydMaxGaussianMse(bits));
            assertTrue(KvEval.lloydMaxGaussianMse(bits) < KvEval.paperMseBound(bits));
        }
        assertEquals(Math.sqrt(3) * Math.PI / 2 / 64, KvEval.paperMseBound(3), 1e-15);
    }
}
