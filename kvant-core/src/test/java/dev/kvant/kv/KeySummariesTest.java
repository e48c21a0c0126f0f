package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

class KeySummariesTest {
    private static final long SEED = new SplittableRandom().nextLong();

    /** Checks every written block of every layer against min/max of the decoded rows. */
    static void assertExact(KvSequence seq, String what) {
        KeySummaries ks = seq.keySummaries();
        KvGeometry g = seq.cache().geometry();
        int dim = ks.dim();
        float[] row = new float[dim];
        for (int l = 0; l < g.layers(); l++) {
            float[] s = ks.layer(l);
            for (int b = 0; b < ks.blocks(); b++) {
                for (int h = 0; h < g.kvHeads(); h++) {
                    float[] mn = new float[dim];
                    float[] mx = new float[dim];
                    java.util.Arrays.fill(mn, Float.POSITIVE_INFINITY);
                    java.util.Arrays.fill(mx, Float.NEGATIVE_INFINITY);
                    for (int p = b * ks.blockTokens(); p < Math.min(seq.length(), (b + 1) * ks.blockTokens()); p++) {
                        seq.decodeK(l, p, h, row, 0);
                        for (int d = 0; d < dim; d++) {
                            mn[d] = Math.min(mn[d], row[d]);
                            mx[d] = Math.max(mx[d], row[d]);
                        }
                    }
                    int o = ks.offset(b, h);
                    for (int d = 0; d < dim; d++) {
                        assertEquals(mn[d], s[o + d], what + ": layer " + l + " block " + b + " head " + h + " min["
                                + d + "] (seed " + SEED + ")");
                        assertEquals(mx[d], s[o + dim + d], what + ": max[" + d + "] (seed " + SEED + ")");
                    }
                }
            }
            int ct = ks.coarseTokens();
            for (int j = 0; ct > 0 && j < (seq.length() + ct - 1) / ct; j++) {
                for (int h = 0; h < g.kvHeads(); h++) {
                    int o = ks.coarseOffset(j, h);
                    for (int d = 0; d < dim; d++) {
                        float mn = Float.POSITIVE_INFINITY;
                        float mx = Float.NEGATIVE_INFINITY;
                        for (int p = j * ct; p < Math.min(seq.length(), (j + 1) * ct); p++) {
                            seq.decodeK(l, p, h, row, 0);
                            mn = Math.min(mn, row[d]);
                            mx = Math.max(mx, row[d]);
                        }
                        assertEquals(mn, ks.coarse(l)[o + d], what + ": coarse block " + j + " min (seed " + SEED + ")");
                        assertEquals(mx, ks.coarse(l)[o + dim + d], what + ": coarse max (seed " + SEED + ")");
                    }
                }
            }
        }
    }

    private static void write(KvSequence seq, SplittableRandom rnd, int pos, int n) {
        KvGeometry g = seq.cache().geometry();
        float[] k = new float[n * g.kvHeads() * g.headDimK()];
        float[] v = new float[n * g.kvHeads() * g.headDimV()];
        for (int i = 0; i < k.length; i++) {
            k[i] = (float) rnd.nextGaussian();
        }
        for (int i = 0; i < v.length; i++) {
            v[i] = (float) rnd.nextGaussian();
        }
        for (int l = 0; l < g.layers(); l++) {
            seq.writeRows(l, pos, n, k, 0, v, 0);
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"f16", "q8_0", "turbo3", "q4_0h"})
    void summariesStayExactThroughWritesTruncationOverwriteAndFork(String format) {
        for (int coarse : new int[] {0, 32, 64}) {
            check(format, coarse);
        }
    }

    private static void check(String format, int coarse) {
        SplittableRandom rnd = new SplittableRandom(SEED);
        KvFormat f = KvFormat.parse(format);
        try (KvCache cache = KvCache.forTokens(new KvGeometry(2, 2, 96, 64), f, f, 64, 2048)) {
            KvSequence seq = cache.newSequence();
            write(seq, rnd, 0, 70);
            seq.enableKeySummaries(16, coarse);
            assertExact(seq, "built from existing rows");
            write(seq, rnd, 70, 1);
            write(seq, rnd, 71, 100);
            assertExact(seq, "after appends");
            seq.truncate(90);
            write(seq, rnd, 90, 3);
            assertExact(seq, "after truncation and rewrite");
            for (int pos = 93; pos < 115; pos++) {   // decode's appends, one token a step, across two block edges
                write(seq, rnd, pos, 1);
            }
            assertExact(seq, "after single-token appends");
            write(seq, rnd, 40, 2);
            assertExact(seq, "after an overwrite");
            seq.truncate(109);   // inside a block, then an overwrite before it, then the append at the cut
            write(seq, rnd, 20, 1);
            write(seq, rnd, 109, 1);
            assertExact(seq, "after a truncation, an overwrite and an append at the cut");
            KvSequence child = cache.fork(seq, 75);
            assertExact(child, "fork");
            write(child, rnd, 75, 20);
            assertExact(child, "fork after writes");
            assertExact(seq, "parent after the fork's writes");
        }
    }

    /** A cut with no write after it (nor one at it) still leaves exact summaries: the cut's blocks are recomputed. */
    @ParameterizedTest
    @ValueSource(strings = {"f16", "turbo3"})
    void summariesStayExactAfterATruncationNoWriteReaches(String format) {
        for (int coarse : new int[] {0, 32}) {
            SplittableRandom rnd = new SplittableRandom(SEED + coarse);
            KvFormat f = KvFormat.parse(format);
            try (KvCache cache = KvCache.forTokens(new KvGeometry(2, 2, 96, 64), f, f, 64, 512)) {
                KvSequence seq = cache.newSequence();
                seq.enableKeySummaries(16, coarse);
                write(seq, rnd, 0, 50);
                seq.truncate(40);   // inside block 2 (32..47)
                assertExact(seq, "after a cut inside a block, coarse " + coarse);
                write(seq, rnd, 10, 1);   // an overwrite before the cut
                assertExact(seq, "after an overwrite before the cut, coarse " + coarse);
                write(seq, rnd, 40, 30);
                seq.truncate(48);   // on a block edge, inside a coarse block
                assertExact(seq, "after a cut on a block edge, coarse " + coarse);
            }
        }
    }

    /** Writes n rows of constant value x at pos into one layer. */
    private static void writeLayer(KvSequence seq, int layer, int pos, int n, float x) {
        KvGeometry g = seq.cache().geometry();
        float[] k = new float[n * g.kvHeads() * g.headDimK()];
        float[] v = new float[n * g.kvHeads() * g.headDimV()];
        java.util.Arrays.fill(k, x);
        java.util.Arrays.fill(v, x);
        seq.writeRows(layer, pos, n, k, 0, v, 0);
    }

    /**
     * A write that would leave a gap (refused), and layers written to different lengths, then filled in: an append
     * after them must not merge into a block the write before recomputed over rows past where the summaries were
     * exact.
     */
    @ParameterizedTest
    @ValueSource(strings = {"f16", "q8_0"})
    void summariesStayExactThroughGapsAndLayersOfDifferentLengths(String format) {
        KvFormat f = KvFormat.parse(format);
        try (KvCache cache = KvCache.forTokens(new KvGeometry(2, 1, 64, 64), f, f, 64, 256)) {
            KvSequence gap = cache.newSequence();
            gap.enableKeySummaries(4);
            for (int l = 0; l < 2; l++) {
                writeLayer(gap, l, 0, 2, 1f);
                int layer = l;
                assertThrows(IllegalArgumentException.class, () -> writeLayer(gap, layer, 6, 1, 1f));   // a gap
                writeLayer(gap, l, 2, 1, 100f);
                writeLayer(gap, l, 2, 5, 1f);   // row 2 again, then on
            }
            assertExact(gap, "after a refused gap and a rewritten row");
            KvSequence lag = cache.newSequence();
            lag.enableKeySummaries(4);
            writeLayer(lag, 0, 0, 6, 5f);
            writeLayer(lag, 1, 0, 6, 5f);
            writeLayer(lag, 0, 6, 1, 5f);       // layer 0 ahead
            writeLayer(lag, 1, 5, 1, 5f);       // layer 1 overwrites, its row 6 not written yet
            writeLayer(lag, 1, 6, 1, 5f);
            assertExact(lag, "after layers written to different lengths");
        }
    }
    /**
     * A layer behind the others summarizes only the rows it holds, not what its pages held for an earlier owner;
     * reading a row a layer has not written is refused.
     */
    @org.junit.jupiter.api.Test
    void aLayerBehindTheOthersSummarizesOnlyItsOwnRows() {
        KvGeometry g = new KvGeometry(2, 1, 64, 64);
        try (KvCache c = new KvCache(g, Int8Format.Q8_0, Int8Format.Q8_0, 16, 8)) {
            KvSequence old = c.newSequence();
            float[] big = new float[64 * 64];
            java.util.Arrays.fill(big, 100f);
            for (int l = 0; l < 2; l++) {
                old.writeRows(l, 0, 64, big, 0, big, 0);
            }
            old.close();
            KvSequence s = c.newSequence();
            s.enableKeySummaries(16);
            float[] small = new float[64 * 64];
            java.util.Arrays.fill(small, 1f);
            s.writeRows(0, 0, 40, small, 0, small, 0);   // layer 0 ahead
            s.writeRows(1, 0, 20, small, 0, small, 0);   // layer 1 behind
            s.writeRows(1, 20, 5, small, 0, small, 0);   // layer 1 holds 25 rows, in pages an old sequence filled
            float[] sum = s.keySummaries().layer(1);
            int o = s.keySummaries().offset(1, 0);       // block 1: rows 16..31, of which 16..24 are written
            float[] row = new float[64];
            float mx = Float.NEGATIVE_INFINITY;
            for (int p = 16; p < 25; p++) {
                s.decodeK(1, p, 0, row, 0);
                mx = Math.max(mx, row[0]);
            }
            assertEquals(mx, sum[o + 64], "block 1's maximum is that of layer 1's rows");
            assertThrows(IndexOutOfBoundsException.class, () -> s.decodeK(1, 30, 0, row, 0));
            s.decodeK(0, 30, 0, row, 0);   // layer 0 holds it
        }
    }

    /**
     * The summary arrays grow by a quarter, never past the blocks of the cache's capacity: written halfway they hold
     * at most 1.25x the blocks the tokens need (doubling held 1,024 blocks for 625, and 600K tokens took 134.2M
     * floats a layer for 76.8M), and written to the capacity exactly its blocks, what --kv-mem plans; the summaries
     * stay exact.
     */
    @Test
    void summaryArraysStayWithinAQuarterOfTheirBlocksAndTheCapacity() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        KvGeometry g = new KvGeometry(2, 2, 16, 16);
        int capacity = 40_000;
        try (KvCache cache = KvCache.forTokens(g, KvFormat.parse("f16"), KvFormat.parse("f16"), 64, capacity);
             KvSequence seq = cache.newSequence()) {
            KeySummaries ks = seq.enableKeySummaries(16, 256);
            int perBlock = g.kvHeads() * 2 * ks.dim();
            int pos = 0;
            for (int stop : new int[] {10_000, capacity}) {
                for (; pos < stop; pos += 100) {
                    write(seq, rnd, pos, 100);
                }
                int blocks = (stop + 15) / 16;
                int coarse = (stop + 255) / 256;
                for (int l = 0; l < g.layers(); l++) {
                    int held = ks.layer(l).length / perBlock;
                    int heldCoarse = ks.coarse(l).length / perBlock;
                    if (stop == capacity) {
                        assertEquals(blocks, held, "blocks held at the capacity, layer " + l);
                        assertEquals(coarse, heldCoarse, "coarse blocks held at the capacity, layer " + l);
                    } else {
                        assertTrue(held >= blocks && held <= blocks * 5 / 4, held + " blocks held for " + blocks);
                        assertTrue(heldCoarse >= coarse && heldCoarse <= coarse * 5 / 4, heldCoarse
                                + " coarse blocks held for " + coarse);
                    }
                }
                assertExact(seq, stop + " tokens");
            }
        }
    }
}
