package dev.kvant.attention;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.tensor.Parallel;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

class CpuAttentionTest {
    private static final long SEED = new SplittableRandom().nextLong();
    private static final Parallel POOL = new Parallel(2);

    @AfterAll
    static void closePool() {
        POOL.close();
    }

    /** The kernel variants, each computing all n tokens' outputs of a problem. */
    enum Variant {
        ATTEND, DECODE, MULTI_QUERY, PREFILL;

        void run(AttentionProblem p, AttentionOptions o, float[] out, Parallel pool) {
            switch (this) {
                case ATTEND -> CpuAttention.attend(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(), p.scale(), o,
                        out, pool);
                case MULTI_QUERY -> CpuAttention.decode(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(),
                        p.scale(), o, out, pool);
                case PREFILL -> CpuAttention.prefill(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(), p.scale(),
                        o, out, pool);
                case DECODE -> {
                    int dK = p.cache().geometry().headDimK();
                    int dV = p.cache().geometry().headDimV();
                    int hq = p.heads() * dK;
                    int hv = p.heads() * dV;
                    float[] one = new float[hv];
                    for (int t = 0; t < p.n(); t++) {
                        float[] q = Arrays.copyOfRange(p.queries(), t * hq, (t + 1) * hq);
                        Arrays.fill(one, Float.NaN);
                        CpuAttention.decode(p.seq(), 0, q, 1, p.start() + t, p.heads(), p.scale(), o, one, pool);
                        System.arraycopy(one, 0, out, t * hv, hv);
                    }
                }
            }
        }
    }

    /**
     * Bound on the NMSE against the float64 reference. The reference reads the same decoded rows, so what is left
     * is float rounding of dot products, softmax and sums (measured 1e-14 .. 1e-11); rotated formats add the float
     * rotation of query and output.
     */
    static double nmseBound(KvFormat k, KvFormat v) {
        return k.rotated() || v.rotated() ? 1e-9 : 1e-10;
    }

    static double nmse(float[] out, double[] ref) {
        double num = 0;
        double den = 0;
        for (int i = 0; i < ref.length; i++) {
            double e = out[i] - ref[i];
            num += e * e;
            den += ref[i] * ref[i];
        }
        return num / den;
    }

    private static String seed(long seed) {
        return " (seed " + seed + ")";
    }

    private static float[] run(Variant v, AttentionProblem p, AttentionOptions o, Parallel pool) {
        float[] out = new float[p.outputSize()];
        Arrays.fill(out, Float.NaN);
        v.run(p, o, out, pool);
        return out;
    }

    private static void checkAgainstReference(AttentionProblem p, AttentionOptions o, double bound, String what,
                                              Variant... variants) {
        double[] ref = AttentionReference.attend(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(), p.scale(), o);
        for (Variant v : variants) {
            float[] out = run(v, p, o, POOL);
            for (int i = 0; i < out.length; i++) {
                if (!Float.isFinite(out[i])) {
                    fail(v + " left output " + i + " = " + out[i] + " for " + what);
                }
            }
            double e = nmse(out, ref);
            assertTrue(e <= bound, v + " NMSE " + e + " > " + bound + " for " + what);
        }
    }

    /** Every format, and K formats centered on their page's mean (one per family). */
    static List<KvFormat> formatsAndCentered() {
        List<KvFormat> all = new ArrayList<>(KvFormat.all());
        for (String name : new String[] {"turbo3+mean", "q4_0h+mean", "q8_0+mean"}) {
            all.add(KvFormat.parse(name));
        }
        return all;
    }

    /** V of a K format: a centered K format's rows with plain values. */
    static KvFormat valuesFor(KvFormat k) {
        return PageMeanFormat.rows(k);
    }

    static Stream<Arguments> formatsHeadSizesAndGroups() {
        List<Arguments> args = new ArrayList<>();
        for (KvFormat f : formatsAndCentered()) {
            for (int d : new int[] {64, 128, 256}) {
                for (int g : new int[] {1, 4, 8}) {
                    args.add(Arguments.of(f.name(), d, g));
                }
            }
        }
        return args.stream();
    }

    @ParameterizedTest(name = "{0} d={1} gqa={2}")
    @MethodSource("formatsHeadSizesAndGroups")
    void everyKernelMatchesFloat64Reference(String format, int headDim, int group) {
        KvFormat f = KvFormat.parse(format);
        KvFormat v = valuesFor(f);
        long seed = SEED ^ (format.hashCode() * 31L + headDim * 7L + group);
        SplittableRandom rnd = new SplittableRandom(seed);
        int start = 60 + rnd.nextInt(60);
        try (AttentionProblem p = AttentionProblem.random(f, v, 2, group, headDim, headDim, start, 5, 16, seed)) {
            checkAgainstReference(p, AttentionOptions.defaults(), nmseBound(f, v),
                    format + " d=" + headDim + " gqa=" + group + " start=" + start + seed(seed), Variant.values());
        }
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("formats")
    void contextsSpanningSeveralPartitionsMatchReference(String format) {
        KvFormat f = KvFormat.parse(format);
        KvFormat v = valuesFor(f);
        long seed = SEED ^ format.hashCode();
        int start = 2 * CpuAttention.PARTITION + new SplittableRandom(seed).nextInt(CpuAttention.PARTITION);
        try (AttentionProblem p = AttentionProblem.random(f, v, 2, 4, 128, 128, start, 12, 64, seed)) {
            checkAgainstReference(p, AttentionOptions.defaults(), nmseBound(f, v),
                    format + " start=" + start + seed(seed), Variant.DECODE, Variant.MULTI_QUERY, Variant.PREFILL);
        }
    }

    static Stream<String> formats() {
        return formatsAndCentered().stream().map(KvFormat::name);
    }

    /**
     * A layer is read only as far as it is written: another layer being written further (the model writes and reads
     * layer by layer) does not make this one's unwritten rows (an earlier sequence's bytes) readable.
     */
    @Test
    void aLayerIsReadOnlyAsFarAsItIsWritten() {
        try (dev.kvant.kv.KvCache cache = dev.kvant.kv.KvCache.forTokens(new dev.kvant.kv.KvGeometry(2, 1, 64, 64),
                KvFormat.parse("f16"), KvFormat.parse("f16"), 16, 64)) {
            dev.kvant.kv.KvSequence seq = cache.newSequence();
            float[] rows = new float[10 * 64];
            seq.writeRows(0, 0, 10, rows, 0, rows, 0);
            seq.writeRows(1, 0, 5, rows, 0, rows, 0);
            float[] q = new float[2 * 64];
            float[] out = new float[2 * 64];
            CpuAttention.attend(seq, 0, q, 1, 9, 2, 0.125f, out, POOL);
            CpuAttention.attend(seq, 1, q, 1, 4, 2, 0.125f, out, POOL);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> CpuAttention.attend(seq, 1, q, 1, 9, 2, 0.125f, out, POOL));
            assertTrue(e.getMessage().contains("layer 1 holds keys and values for 5 positions"), e.getMessage());
        }
    }

    @Test
    void mixedFormatsAndHeadSizesMatchReference() {
        String[][] cases = {{"q8_0", "turbo3", "128", "128"}, {"turbo4", "f16", "128", "64"}, {"turbo2", "q4_0h", "80", "96"},
                {"f16", "int8", "96", "80"}, {"q4_0", "bf16", "40", "72"}, {"turbo3", "turbo3", "192", "192"},
                {"int8", "turbo2", "256", "128"}, {"turbo2+mean", "q8_0", "80", "96"}, {"q4_0+mean", "turbo3", "192", "128"}};
        for (String[] c : cases) {
            KvFormat k = KvFormat.parse(c[0]);
            KvFormat v = KvFormat.parse(c[1]);
            int dK = Integer.parseInt(c[2]);
            int dV = Integer.parseInt(c[3]);
            long seed = SEED ^ Arrays.hashCode(c);
            try (AttentionProblem p = AttentionProblem.random(k, v, 3, 2, dK, dV, 90, 7, 24, seed)) {
                checkAgainstReference(p, AttentionOptions.defaults(), nmseBound(k, v),
                        String.join("/", c) + seed(seed), Variant.values());
            }
        }
    }

    /**
     * A V row past the f16 range at the last position of a prefill chunk (an activation of 1e6) leaves the earlier
     * queries, which do not see it, as they are: the f16 cache stores it saturated, so the zero weight those queries
     * give it adds 0, where an infinity would have made their outputs NaN (0·inf). Each earlier query's output has
     * the bits of a prefill that stops before that row.
     */
    @Test
    void aValuePastTheHalfRangeDoesNotReachTheQueriesBeforeIt() {
        KvFormat f = KvFormat.parse("f16");
        int kvHeads = 2, group = 2, d = 64, n = 20;
        try (AttentionProblem p = AttentionProblem.random(f, f, kvHeads, group, d, d, 0, n, 16, SEED)) {
            float[] k = new float[kvHeads * d];
            float[] v = new float[kvHeads * d];
            java.util.Arrays.fill(k, 0.5f);
            java.util.Arrays.fill(v, 1e6f);
            p.seq().truncate(n - 1);
            p.seq().writeRows(0, n - 1, 1, k, 0, v, 0);
            int heads = p.heads();
            float[] all = new float[n * heads * d];
            CpuAttention.prefill(p.seq(), 0, p.queries(), n, 0, heads, p.scale(), AttentionOptions.defaults(), all,
                    POOL);
            float[] first = new float[(n - 1) * heads * d];
            CpuAttention.prefill(p.seq(), 0, java.util.Arrays.copyOf(p.queries(), (n - 1) * heads * d), n - 1, 0,
                    heads, p.scale(), AttentionOptions.defaults(), first, POOL);
            assertArrayEquals(first, java.util.Arrays.copyOf(all, first.length), "seed " + SEED);
            for (float x : all) {
                assertTrue(Float.isFinite(x), "seed " + SEED);
            }
        }
    }

    /** Pages of 6 and 10 tokens: tiles and 4-row blocks cross pages, so page means are added row by row there. */
    @Test
    void centeredKeysOnPagesThatCutTilesMatchReference() {
        for (int page : new int[] {6, 10}) {
            for (String name : new String[] {"turbo3+mean", "q8_0+mean"}) {
                KvFormat k = KvFormat.parse(name);
                long seed = SEED ^ name.hashCode() ^ page;
                try (AttentionProblem p = AttentionProblem.random(k, valuesFor(k), 2, 4, 128, 128,
                        CpuAttention.PARTITION + 37, 9, page, seed)) {
                    checkAgainstReference(p, AttentionOptions.defaults(), nmseBound(k, k),
                            name + " pages of " + page + seed(seed), Variant.values());
                }
            }
        }
    }

    @Test
    void softCapMatchesReference() {
        for (String name : new String[] {"f16", "q8_0", "turbo3"}) {
            KvFormat f = KvFormat.parse(name);
            long seed = SEED ^ name.hashCode() ^ 5;
            try (AttentionProblem p = AttentionProblem.random(f, f, 2, 4, 128, 128, 1100, 6, 32, seed)) {
                // Scores here reach about ±20: a cap of 5 bends most of them.
                checkAgainstReference(p, new AttentionOptions(5f, 0f), 1e-9, name + " soft-cap 5" + seed(seed),
                        Variant.values());
            }
        }
    }

    @Test
    void threadCountDoesNotChangeBits() {
        long seed = SEED ^ 11;
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("turbo3"), KvFormat.parse("q8_0"), 4, 4, 128,
                128, 2 * CpuAttention.PARTITION + 77, 20, 48, seed);
             Parallel three = new Parallel(3)) {
            for (Variant v : Variant.values()) {
                float[] one = run(v, p, AttentionOptions.defaults(), Parallel.serial());
                assertArrayEquals(one, run(v, p, AttentionOptions.defaults(), POOL), v + " 1 vs 2 threads" + seed(seed));
                assertArrayEquals(one, run(v, p, AttentionOptions.defaults(), three), v + " 1 vs 3 threads" + seed(seed));
            }
        }
    }

    @Test
    void multiQueryEqualsRepeatedSingleQueryDecodeBitForBit() {
        for (String name : new String[] {"f16", "int8", "q4_0h", "turbo2"}) {
            long seed = SEED ^ name.hashCode() ^ 17;
            KvFormat f = KvFormat.parse(name);
            // start chosen so that the 8 tokens straddle a partition boundary
            try (AttentionProblem p = AttentionProblem.random(f, f, 2, 4, 128, 128, CpuAttention.PARTITION - 3, 8, 16,
                    seed)) {
                AttentionOptions o = AttentionOptions.defaults();
                assertArrayEquals(run(Variant.DECODE, p, o, POOL), run(Variant.MULTI_QUERY, p, o, POOL),
                        name + seed(seed));
            }
        }
    }

    @Test
    void promptInChunksEqualsOneShotPrefillBitForBit() {
        long seed = SEED ^ 23;
        SplittableRandom rnd = new SplittableRandom(seed);
        KvFormat f = KvFormat.parse("turbo3");
        int n = 1300;
        try (AttentionProblem p = AttentionProblem.random(f, KvFormat.parse("f16"), 2, 4, 64, 64, 0, n, 64, seed)) {
            int heads = p.heads();
            float[] oneShot = run(Variant.PREFILL, p, AttentionOptions.defaults(), POOL);
            float[] chunked = new float[oneShot.length];
            Arrays.fill(chunked, Float.NaN);
            StringBuilder cuts = new StringBuilder();
            for (int t0 = 0; t0 < n; ) {
                int m = Math.min(n - t0, 1 + rnd.nextInt(rnd.nextBoolean() ? 8 : 400));
                cuts.append(m).append(' ');
                float[] q = Arrays.copyOfRange(p.queries(), t0 * heads * 64, (t0 + m) * heads * 64);
                float[] out = new float[m * heads * 64];
                CpuAttention.attend(p.seq(), 0, q, m, t0, heads, p.scale(), AttentionOptions.defaults(), out, POOL);
                System.arraycopy(out, 0, chunked, t0 * heads * 64, out.length);
                t0 += m;
            }
            assertArrayEquals(oneShot, chunked, "chunks " + cuts + seed(seed));
        }
    }

    @Test
    void sparseVDropsOnlyRowsWithSmallWeight() {
        for (String name : new String[] {"f16", "q8_0", "turbo3"}) {
            long seed = SEED ^ name.hashCode() ^ 29;
            KvFormat f = KvFormat.parse(name);
            float threshold = 1e-3f;
            int start = 1500;
            try (AttentionProblem p = AttentionProblem.random(f, f, 2, 4, 128, 128, start, 4, 64, seed)) {
                double[] dense = AttentionReference.attend(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(),
                        p.scale(), AttentionOptions.defaults());
                double maxV = 0;
                float[] row = new float[128];
                for (int pos = 0; pos < start + p.n(); pos++) {
                    for (int g = 0; g < 2; g++) {
                        p.seq().decodeV(0, pos, g, row, 0);
                        for (float x : row) {
                            maxV = Math.max(maxV, Math.abs(x));
                        }
                    }
                }
                // A dropped row has a final weight below T, so no output moves by more than rows × T × max|v|.
                double bound = (start + p.n()) * threshold * maxV;
                float[] sparseOut = null;
                for (Variant v : Variant.values()) {
                    float[] out = run(v, p, new AttentionOptions(0f, threshold), POOL);
                    double maxDiff = 0;
                    for (int i = 0; i < out.length; i++) {
                        maxDiff = Math.max(maxDiff, Math.abs(out[i] - dense[i]));
                    }
                    assertTrue(maxDiff > 1e-6, v + " sparse V changed nothing" + seed(seed));
                    assertTrue(maxDiff <= bound, v + " sparse V moved an output by " + maxDiff + " > " + bound
                            + seed(seed));
                    if (sparseOut == null) {
                        sparseOut = out;
                    } else {
                        assertArrayEquals(sparseOut, out, v + " differs from " + Variant.ATTEND + seed(seed));
                    }
                }
            }
        }
    }

    @Test
    void positionsNotYetWrittenAreAnErrorNamingThem() {
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("f16"), KvFormat.parse("f16"), 2, 2, 64, 64, 10,
                2, 16, 1)) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> CpuAttention.attend(p.seq(), 0, p.queries(), 2, 11, p.heads(), 1f, new float[256], POOL));
            assertTrue(e.getMessage().contains("11..12") && e.getMessage().contains("12 positions"), e.getMessage());
            IllegalArgumentException g = assertThrows(IllegalArgumentException.class,
                    () -> CpuAttention.attend(p.seq(), 0, p.queries(), 1, 0, 3, 1f, new float[256], POOL));
            assertTrue(g.getMessage().contains("multiple of the kv head count"), g.getMessage());
        }
    }

    @Test
    void scoresDoNotDependOnKernelShape() {
        // The same query scored alone, in a pair and in a block of four gives the same bits.
        SplittableRandom rnd = new SplittableRandom(SEED);
        int dp = 128;
        float[] q = new float[5 * dp];
        float[] kt = new float[8 * dp];
        for (int i = 0; i < q.length; i++) {
            q[i] = (float) rnd.nextGaussian();
        }
        for (int i = 0; i < kt.length; i++) {
            kt[i] = (float) rnd.nextGaussian();
        }
        int[] off = {0, dp, 2 * dp, 3 * dp, 4 * dp};
        float[] four = new float[8 * 8];
        float[] single = new float[8 * 8];
        TileKernels.scores(q, off, 5, 8, kt, 0, dp, 8, dp, four, 0, 0, new float[16 * Lanes.L]);
        for (int i = 0; i < 5; i++) {
            TileKernels.scores(q, new int[] {off[i]}, 1, 8, kt, 0, dp, 8, dp, single, 0, 0, new float[16 * Lanes.L]);
            for (int r = 0; r < 8; r++) {
                float alone = single[TileKernels.at(r, 0, 8)];
                assertEquals(Float.floatToRawIntBits(alone), Float.floatToRawIntBits(four[TileKernels.at(r, i, 8)]),
                        "query " + i + " row " + r + seed(SEED));
                double exact = 0;
                for (int d = 0; d < dp; d++) {
                    exact += (double) q[off[i] + d] * kt[r * dp + d];
                }
                assertEquals(exact, alone, 1e-4 * Math.max(1, Math.abs(exact)), "dot" + seed(SEED));
            }
        }
    }

    /**
     * A problem whose queries do not fit in an int-indexed array is refused by its sizes: 2^20 heads of 4,096 values
     * made 2^32 floats, an int product of 0, and failed as "Index 0 out of bounds for length 0" (a replay of a dump
     * with such a header printed that, or a negative array size).
     */
    @Test
    void aProblemTooWideForAnArrayIsRefusedBySize() {
        KvFormat f = KvFormat.parse("f16");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> AttentionProblem.random(f, f, 1, 1 << 20, 4096, 64, 0, 1, 64, SEED));
        assertTrue(e.getMessage().contains("1 queries of 1 x 1048576 heads of 4096 / 64 values")
                && e.getMessage().contains("do not fit in an array"), e.getMessage());
    }
}
