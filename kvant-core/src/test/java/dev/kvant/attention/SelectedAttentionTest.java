package dev.kvant.attention;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvFormat;
import dev.kvant.select.PageTopK;
import dev.kvant.select.Selection;
import dev.kvant.select.SelectionConfig;
import dev.kvant.tensor.Parallel;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/** Attention through a selection of blocks: dense bits when every block is selected, the reference otherwise. */
class SelectedAttentionTest {
    private static final long SEED = new SplittableRandom().nextLong();
    private static final Parallel POOL = new Parallel(2);

    @AfterAll
    static void closePool() {
        POOL.close();
    }

    /** Every block of every query block and kv head. */
    static Selection everything(int blockTokens, int kvHeads, int start, int n) {
        int qbs = (n + Selection.QUERY_BLOCK - 1) / Selection.QUERY_BLOCK;
        int visible = (start + n + blockTokens - 1) / blockTokens;
        int[][][] lists = new int[qbs][kvHeads][];
        for (int[][] q : lists) {
            for (int g = 0; g < kvHeads; g++) {
                q[g] = java.util.stream.IntStream.range(0, visible).toArray();
            }
        }
        return Selection.of(blockTokens, start, n, lists);
    }

    /**
     * Random lists: each block kept with probability keep, plus the query block's own blocks; a list that drew every
     * other block too loses its first (with three blocks of 1024 both others came up once in a few hundred runs,
     * and the selection was then dense attention).
     */
    static Selection random(SplittableRandom rnd, int blockTokens, int kvHeads, int start, int n, double keep) {
        int qbs = (n + Selection.QUERY_BLOCK - 1) / Selection.QUERY_BLOCK;
        int[][][] lists = new int[qbs][kvHeads][];
        for (int qb = 0; qb < qbs; qb++) {
            int first = (start + qb * Selection.QUERY_BLOCK) / blockTokens;
            int last = (start + Math.min(n, (qb + 1) * Selection.QUERY_BLOCK) - 1) / blockTokens;
            int visible = (start + n + blockTokens - 1) / blockTokens;
            for (int g = 0; g < kvHeads; g++) {
                List<Integer> l = new ArrayList<>();
                for (int b = 0; b < visible; b++) {
                    if (b >= first && b <= last || rnd.nextDouble() < keep) {
                        l.add(b);
                    }
                }
                if (l.size() == visible && first > 0) {
                    l.remove(0);
                }
                lists[qb][g] = l.stream().mapToInt(Integer::intValue).toArray();
            }
        }
        return Selection.of(blockTokens, start, n, lists);
    }

    private static void assertSameBits(float[] want, float[] got, String what) {
        for (int i = 0; i < want.length; i++) {
            if (Float.floatToRawIntBits(want[i]) != Float.floatToRawIntBits(got[i])) {
                throw new AssertionError(what + ": output " + i + " is " + got[i] + ", dense gives " + want[i]
                        + " (seed " + SEED + ")");
            }
        }
    }

    @ParameterizedTest(name = "{0} n={1} block={2} sparseV={3}")
    @CsvSource({"f16,1,16,0", "f16,5,16,0", "q8_0,1,64,0", "turbo3,1,16,0", "turbo3,40,16,0", "f16,40,32,0",
            "q4_0,3,16,0.001", "turbo4,24,16,0.001", "turbo3+mean,1,16,0", "turbo3+mean,40,32,0"})
    void attentionThroughEveryBlockEqualsDenseBitForBit(String format, int n, int block, float sparseV) {
        KvFormat f = KvFormat.parse(format);
        AttentionOptions o = AttentionOptions.defaults().withSparseV(sparseV);
        int start = CpuAttention.PARTITION + 300;
        try (AttentionProblem p = AttentionProblem.random(f, CpuAttentionTest.valuesFor(f), 2, 2, 128, 128, start, n,
                64, SEED)) {
            float[] dense = new float[p.outputSize()];
            float[] sel = new float[p.outputSize()];
            Arrays.fill(dense, Float.NaN);
            Arrays.fill(sel, Float.NaN);
            Selection all = everything(block, 2, start, n);
            assertTrue(!all.all(), "explicit lists must take the selected path");
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), o, dense, POOL);
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), o, all, sel, POOL);
            assertSameBits(dense, sel, format + " attend");
            if (n > 1) {
                Arrays.fill(sel, Float.NaN);
                CpuAttention.prefill(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), o, all, sel, POOL);
                assertSameBits(dense, sel, format + " prefill");
            }
        }
    }

    @ParameterizedTest(name = "{0} n={1} block={2}")
    @CsvSource({"f16,1,16", "f16,6,16", "f16,37,16", "turbo3,1,16", "turbo3,20,64", "q8_0,1,1024",
        "turbo2+mean,7,16"})
    void attentionThroughASelectionMatchesFloat64ReferenceOverTheSelectedBlocks(String format, int n, int block) {
        KvFormat f = KvFormat.parse(format);
        SplittableRandom rnd = new SplittableRandom(SEED);
        int start = 3000;
        try (AttentionProblem p = AttentionProblem.random(f, CpuAttentionTest.valuesFor(f), 2, 3, 64, 64, start, n, 64,
                SEED)) {
            Selection sel = random(rnd, block, 2, start, n, 0.2);
            float[] out = new float[p.outputSize()];
            Arrays.fill(out, Float.NaN);
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), AttentionOptions.defaults(),
                    sel, out, POOL);
            double[] ref = AttentionReference.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(),
                    AttentionOptions.defaults(), sel);
            double dense = CpuAttentionTest.nmse(out, AttentionReference.attend(p.seq(), 0, p.queries(), n, start,
                    p.heads(), p.scale(), AttentionOptions.defaults()));
            double err = CpuAttentionTest.nmse(out, ref);
            assertTrue(err < CpuAttentionTest.nmseBound(f, f), "NMSE " + err + " against the selected reference (seed "
                    + SEED + ")");
            assertTrue(dense > 100 * err, "a 20% selection should differ from dense attention: NMSE " + dense
                    + " vs " + err + " (seed " + SEED + ")");
        }
    }

    @Test
    void selectedBitsDoNotDependOnThreadCount() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        int start = 5000;
        int n = 30;
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("turbo3"), KvFormat.parse("q8_0"), 4, 2, 128,
                128, start, n, 64, SEED);
             Parallel one = new Parallel(1);
             Parallel three = new Parallel(3)) {
            Selection sel = random(rnd, 16, 4, start, n, 0.1);
            float[] a = new float[p.outputSize()];
            float[] b = new float[p.outputSize()];
            Arrays.fill(a, Float.NaN);
            Arrays.fill(b, Float.NaN);
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), AttentionOptions.defaults(),
                    sel, a, one);
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), AttentionOptions.defaults(),
                    sel, b, three);
            assertSameBits(a, b, "1 vs 3 threads");
        }
    }

    @Test
    void topKWithBudgetCoveringTheContextEqualsDenseBitForBit() {
        int start = 1500;
        int n = 20;
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("turbo3"), KvFormat.parse("turbo3"), 2, 2,
                128, 128, start, n, 64, SEED)) {
            p.seq().enableKeySummaries(16);
            Selection sel = new Selection();
            new PageTopK(new SelectionConfig(start + n, 16, 64, 256, 0)).select(p.seq(), 0, p.queries(), n, start,
                    p.heads(), sel, POOL);
            assertTrue(sel.all(), "a budget of the whole context selects everything");
            float[] dense = new float[p.outputSize()];
            float[] got = new float[p.outputSize()];
            Arrays.fill(got, Float.NaN);
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), AttentionOptions.defaults(),
                    dense, POOL);
            CpuAttention.attend(p.seq(), 0, p.queries(), n, start, p.heads(), p.scale(), AttentionOptions.defaults(),
                    sel, got, POOL);
            assertSameBits(dense, got, "budget >= context");
        }
    }

    @Test
    void aSelectionWithoutItsQueriesOwnBlockIsAnErrorNamingIt() {
        int start = 200;
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("f16"), KvFormat.parse("f16"), 1, 2, 64, 64,
                start, 1, 64, SEED)) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Selection.of(16, start, 1,
                    new int[][][] {{{0, 1, 2}}}));
            assertTrue(e.getMessage().contains("lacks block 12"), e.getMessage());
            assertEquals(12, start / 16);
        }
    }
}
