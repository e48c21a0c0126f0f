package dev.kvant.select;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.attention.AttentionProblem;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;
import dev.kvant.tensor.Parallel;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.IntStream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

class PageTopKTest {
    private static final long SEED = new SplittableRandom().nextLong();
    private static final Parallel POOL = new Parallel(2);

    @AfterAll
    static void closePool() {
        POOL.close();
    }

    /**
     * The brute-force selection of one (query block, kv head): block min/max from the decoded rows, the bound in
     * double, every candidate ranked by (score desc, index asc). Returns the list and the candidates' scores.
     */
    static int[] reference(KvSequence seq, float[] q, int start, int n, int heads, SelectionConfig c, int qb, int g,
                           double[] scoresOut) {
        KvFormat kf = seq.cache().kFormat();
        int headDim = seq.cache().geometry().headDimK();
        int dim = kf.domainDim(headDim);
        int group = heads / seq.cache().geometry().kvHeads();
        int bt = c.blockTokens();
        int t0 = qb * Selection.QUERY_BLOCK;
        int t1 = Math.min(n, t0 + Selection.QUERY_BLOCK);
        int visible = (start + t1 + bt - 1) / bt;
        int sink = Math.min(visible, (c.sink() + bt - 1) / bt);
        int recentFrom = Math.max(sink, (start + t0) / bt - (c.recent() + bt - 1) / bt);
        int k = Math.max(0, c.budget() / bt - sink - (visible - recentFrom));
        if (k >= recentFrom - sink) {
            return IntStream.range(0, visible).toArray();
        }
        float[] row = new float[dim];
        List<Integer> cand = new ArrayList<>();
        for (int b = sink; b < recentFrom; b++) {
            double[] mn = new double[dim];
            double[] mx = new double[dim];
            Arrays.fill(mn, Double.POSITIVE_INFINITY);
            Arrays.fill(mx, Double.NEGATIVE_INFINITY);
            for (int pos = b * bt; pos < (b + 1) * bt; pos++) {
                seq.decodeK(0, pos, g, row, 0);
                for (int d = 0; d < dim; d++) {
                    mn[d] = Math.min(mn[d], row[d]);
                    mx[d] = Math.max(mx[d], row[d]);
                }
            }
            scoresOut[b] = bound(q, headDim, dim, heads, group, kf, t0, t1, g, mn, mx);
            cand.add(b);
        }
        int per = c.coarseBlocks();
        // the coarse block the recent window cuts is not ranked when its rows reach the query block's own
        int jEnd = per == 0 ? 0 : recentFrom / per;
        boolean reaches = per > 0 && jEnd * per < recentFrom && (jEnd + 1L) * c.coarseTokens() > start + t0;
        int jRank = per == 0 || reaches || jEnd * per == recentFrom ? jEnd : jEnd + 1;
        if (per > 0 && jRank - sink / per > c.coarseKeep()) {
            // coarse bounds from the rows of each ranked coarse block (up to the written length), keep the best
            int len = start + n;
            List<Integer> coarse = new ArrayList<>();
            double[] cs = new double[jRank];
            for (int j = sink / per; j < jRank; j++) {
                double[] mn = new double[dim];
                double[] mx = new double[dim];
                Arrays.fill(mn, Double.POSITIVE_INFINITY);
                Arrays.fill(mx, Double.NEGATIVE_INFINITY);
                for (int pos = j * c.coarseTokens(); pos < Math.min(len, (j + 1) * c.coarseTokens()); pos++) {
                    seq.decodeK(0, pos, g, row, 0);
                    for (int d = 0; d < dim; d++) {
                        mn[d] = Math.min(mn[d], row[d]);
                        mx[d] = Math.max(mx[d], row[d]);
                    }
                }
                cs[j] = bound(q, headDim, dim, heads, group, kf, t0, t1, g, mn, mx);
                coarse.add(j);
            }
            coarse.sort(Comparator.<Integer>comparingDouble(j -> -cs[j]).thenComparingInt(j -> j));
            List<Integer> kept = coarse.subList(0, c.coarseKeep());
            cand.removeIf(b -> b / per < jRank && !kept.contains(b / per));
            k = Math.min(k, cand.size());
        }
        cand.sort(Comparator.<Integer>comparingDouble(b -> -scoresOut[b]).thenComparingInt(b -> b));
        List<Integer> out = new ArrayList<>();
        for (int b = 0; b < sink; b++) {
            out.add(b);
        }
        out.addAll(cand.subList(0, k).stream().sorted().toList());
        for (int b = recentFrom; b < visible; b++) {
            out.add(b);
        }
        return out.stream().mapToInt(Integer::intValue).toArray();
    }

    /** The largest bound over the query block's tokens and the kv head's query heads, in double. */
    private static double bound(float[] q, int headDim, int dim, int heads, int group, KvFormat kf, int t0, int t1,
                                int g, double[] mn, double[] mx) {
        double best = Double.NEGATIVE_INFINITY;
        for (int t = t0; t < t1; t++) {
            for (int h = g * group; h < (g + 1) * group; h++) {
                float[] qr = new float[dim];
                System.arraycopy(q, (t * heads + h) * headDim, qr, 0, headDim);
                kf.rotate(qr, 0, headDim);
                double s = 0;
                for (int d = 0; d < dim; d++) {
                    s += Math.max(qr[d] * mn[d], qr[d] * mx[d]);
                }
                best = Math.max(best, s);
            }
        }
        return best;
    }

    @ParameterizedTest(name = "{0} n={1} budget={2} block={3} coarse={4} keep={5}")
    @CsvSource({"f16,1,512,16,64,4", "turbo3,1,1024,16,256,3", "q8_0,20,512,16,128,5", "f16,1,512,32,512,2"})
    void coarseRoundsChooseTheBlocksOfABruteForceReference(String format, int n, int budget, int block, int coarse,
                                                           int keep) {
        checkAgainstReference(format, n, budget, block, coarse, keep);
    }

    /**
     * A prefill chunk's rows are written before its queries select: the lists of a query block must not depend on
     * the rows after it. Coarse blocks of 512 tokens, a recent window of 128: the coarse block the window cuts holds
     * the first query block's own rows and the next block's; its rows are made faint up to the second query block
     * (it would never rank) and large after (it would always rank), and the first query block's lists must equal
     * those of a chunk that stops after it.
     */
    @Test
    void aChunksLaterRowsDoNotChangeTheChoiceOfItsEarlierQueries() {
        KvFormat f = KvFormat.parse("f16");
        int kvHeads = 2, heads = 4, d = 128, start = 4000;
        KvGeometry geo = new KvGeometry(1, kvHeads, d, d);
        SelectionConfig c = new SelectionConfig(512, 16, 64, 128, 0, 512, 2);
        SplittableRandom r = new SplittableRandom(SEED);
        float[] k = new float[(start + 128) * kvHeads * d];
        float[] v = new float[k.length];
        for (int i = 0; i < k.length; i++) {
            int pos = i / (kvHeads * d);
            // the cut coarse block (positions 3584..4095): faint up to the chunk's second query block, large after
            k[i] = (float) r.nextGaussian() * (pos >= start + 64 ? 50f : pos >= 3584 ? 0.01f : 1f);
            v[i] = (float) r.nextGaussian();
        }
        float[] q = new float[128 * heads * d];
        for (int i = 0; i < q.length; i++) {
            q[i] = (float) r.nextGaussian();
        }
        int[][] lists = new int[2][];
        for (int run = 0; run < 2; run++) {
            int n = run == 0 ? 128 : 64;
            try (KvCache cache = KvCache.forTokens(geo, f, f, 64, start + n)) {
                KvSequence seq = cache.newSequence();
                seq.writeRows(0, 0, start + n, k, 0, v, 0);
                seq.enableKeySummaries(16, 512);
                Selection sel = new Selection();
                new PageTopK(c).select(seq, 0, Arrays.copyOf(q, n * heads * d), n, start, heads, sel, POOL);
                assertFalse(sel.all());
                List<Integer> both = new ArrayList<>();
                for (int g = 0; g < kvHeads; g++) {
                    for (int i = 0; i < sel.count(0, g); i++) {
                        both.add(sel.blocks()[sel.offset(0, g) + i]);
                    }
                    both.add(-1);
                }
                lists[run] = both.stream().mapToInt(Integer::intValue).toArray();
            }
        }
        assertArrayEquals(lists[1], lists[0], "the first query block's lists with the chunk's later rows written"
                + " (seed " + SEED + ")");
    }

    @Test
    void aCoarseLevelThatKeepsEveryCandidateChoosesAsOneRound() {
        KvFormat f = KvFormat.parse("turbo3");
        int start = 3000;
        try (AttentionProblem p = AttentionProblem.random(f, f, 2, 2, 128, 128, start, 1, 64, SEED)) {
            SelectionConfig flat = new SelectionConfig(512, 16, 64, 128, 0);
            SelectionConfig wide = new SelectionConfig(512, 16, 64, 128, 0, 256, 1000);
            Selection a = new Selection();
            Selection b = new Selection();
            p.seq().enableKeySummaries(16);
            new PageTopK(flat).select(p.seq(), 0, p.queries(), 1, start, p.heads(), a, POOL);
            p.seq().enableKeySummaries(16, 256);
            new PageTopK(wide).select(p.seq(), 0, p.queries(), 1, start, p.heads(), b, POOL);
            for (int g = 0; g < 2; g++) {
                assertArrayEquals(Arrays.copyOfRange(a.blocks(), a.offset(0, g), a.offset(0, g) + a.count(0, g)),
                        Arrays.copyOfRange(b.blocks(), b.offset(0, g), b.offset(0, g) + b.count(0, g)));
            }
        }
    }

    @ParameterizedTest(name = "{0} n={1} budget={2} block={3}")
    @CsvSource({"f16,1,512,16", "f16,40,256,16", "turbo3,1,1024,16", "turbo3,3,512,32", "q8_0,1,330,64",
            "q4_0h,17,640,16"})
    void selectorChoosesTheBlocksOfABruteForceReference(String format, int n, int budget, int block) {
        checkAgainstReference(format, n, budget, block, 0, 0);
    }

    private static void checkAgainstReference(String format, int n, int budget, int block, int coarse, int keep) {
        KvFormat f = KvFormat.parse(format);
        int start = 4000;
        SelectionConfig c = new SelectionConfig(budget, block, 64, 128, 0, coarse, keep);
        try (AttentionProblem p = AttentionProblem.random(f, f, 2, 2, 128, 128, start, n, 64, SEED)) {
            p.seq().enableKeySummaries(block, coarse);
            Selection sel = new Selection();
            new PageTopK(c).select(p.seq(), 0, p.queries(), n, start, p.heads(), sel, POOL);
            assertFalse(sel.all());
            for (int qb = 0; qb < sel.queryBlocks(); qb++) {
                for (int g = 0; g < 2; g++) {
                    double[] scores = new double[sel.stride()];
                    int[] want = reference(p.seq(), p.queries(), start, n, p.heads(), c, qb, g, scores);
                    int[] got = Arrays.copyOfRange(sel.blocks(), sel.offset(qb, g), sel.offset(qb, g) + sel.count(qb, g));
                    if (!Arrays.equals(want, got)) {
                        // Float and double bounds may order two blocks differently only when they nearly tie.
                        List<Integer> a = Arrays.stream(want).boxed().toList();
                        List<Integer> b = Arrays.stream(got).boxed().toList();
                        double lo = Double.POSITIVE_INFINITY;
                        double hi = Double.NEGATIVE_INFINITY;
                        for (int x : want) {
                            if (!b.contains(x)) {
                                lo = Math.min(lo, scores[x]);
                            }
                        }
                        for (int x : got) {
                            if (!a.contains(x)) {
                                hi = Math.max(hi, scores[x]);
                            }
                        }
                        assertTrue(Math.abs(lo - hi) <= 1e-5 * Math.abs(lo), "query block " + qb + ", kv head " + g
                                + ": selected " + Arrays.toString(got) + ", reference " + Arrays.toString(want)
                                + " (seed " + SEED + ")");
                    }
                    assertTrue(sel.tokens(qb, g) <= budget, "selection of " + sel.tokens(qb, g)
                            + " tokens exceeds the budget " + budget);
                }
            }
        }
    }

    @Test
    void tiesGoToTheLowestBlockIndex() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        KvGeometry geo = new KvGeometry(1, 1, 64, 64);
        try (KvCache cache = KvCache.forTokens(geo, KvFormat.parse("f16"), KvFormat.parse("f16"), 64, 1024);
             KvSequence seq = cache.newSequence()) {
            seq.enableKeySummaries(16);
            float[] k = new float[64];
            float[] v = new float[64];
            for (int d = 0; d < 64; d++) {
                k[d] = (float) rnd.nextGaussian();
                v[d] = (float) rnd.nextGaussian();
            }
            for (int pos = 0; pos < 1000; pos++) {
                seq.write(0, pos, k, 0, v, 0);
            }
            float[] q = new float[64];
            for (int d = 0; d < 64; d++) {
                q[d] = (float) rnd.nextGaussian();
            }
            Selection sel = new Selection();
            new PageTopK(new SelectionConfig(16 * 10, 16, 16, 16, 0)).select(seq, 0, q, 1, 999, 1, sel, POOL);
            // sink block 0; recent blocks 61 (one before the query's) and 62 (the query's); 7 top blocks, all tied.
            int[] got = Arrays.copyOf(sel.blocks(), sel.count(0, 0));
            assertArrayEquals(new int[] {0, 1, 2, 3, 4, 5, 6, 7, 61, 62}, got, "seed " + SEED);
        }
    }

    @Test
    void sinkRecentAndOwnBlocksAreAlwaysSelected() {
        int start = 3000;
        SelectionConfig c = new SelectionConfig(352, 16, 64, 256, 0);   // the least: the windows and one chosen
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("turbo3"), KvFormat.parse("turbo3"), 2, 2, 64,
                64, start, 1, 64, SEED)) {
            p.seq().enableKeySummaries(16);
            Selection sel = new Selection();
            new PageTopK(c).select(p.seq(), 0, p.queries(), 1, start, p.heads(), sel, POOL);
            int own = start / 16;
            for (int g = 0; g < 2; g++) {
                int[] got = Arrays.copyOfRange(sel.blocks(), sel.offset(0, g), sel.offset(0, g) + sel.count(0, g));
                int[] windows = IntStream.concat(IntStream.range(0, 4), IntStream.rangeClosed(own - 16, own)).toArray();
                assertEquals(windows.length + 1, got.length, "the windows and one chosen block");
                for (int b : windows) {
                    assertTrue(Arrays.binarySearch(got, b) >= 0, "block " + b + " of the windows in "
                            + Arrays.toString(got));
                }
            }
        }
    }

    @Test
    void selectionIsTheSameOnEveryRunAndThreadCount() {
        int start = 6000;
        int n = 33;
        SelectionConfig c = SelectionConfig.topK(1024);
        try (AttentionProblem p = AttentionProblem.random(KvFormat.parse("f16"), KvFormat.parse("f16"), 4, 2, 128, 128,
                start, n, 64, SEED);
             Parallel one = new Parallel(1)) {
            p.seq().enableKeySummaries(16);
            Selection a = new Selection();
            Selection b = new Selection();
            new PageTopK(c).select(p.seq(), 0, p.queries(), n, start, p.heads(), a, one);
            new PageTopK(c).select(p.seq(), 0, p.queries(), n, start, p.heads(), b, POOL);
            int size = a.queryBlocks() * 4 * a.stride();
            assertArrayEquals(Arrays.copyOf(a.counts(), a.queryBlocks() * 4), Arrays.copyOf(b.counts(), b.queryBlocks() * 4));
            for (int qb = 0; qb < a.queryBlocks(); qb++) {
                for (int g = 0; g < 4; g++) {
                    int o = a.offset(qb, g);
                    assertArrayEquals(Arrays.copyOfRange(a.blocks(), o, o + a.count(qb, g)),
                            Arrays.copyOfRange(b.blocks(), o, o + b.count(qb, g)), "seed " + SEED);
                }
            }
            assertEquals(size, a.queryBlocks() * 4 * a.stride());
        }
    }

    @Test
    void sortKeyOrdersByDescendingScoreThenAscendingBlock() {
        float[] scores = {3f, -2f, 0f, -0f, 3f, Float.NEGATIVE_INFINITY, 1e-30f, -1e30f};
        long[] keys = new long[scores.length];
        for (int i = 0; i < scores.length; i++) {
            keys[i] = PageTopK.key(scores[i], i);
        }
        PageTopK.smallest(keys, keys.length, 3);
        int[] top = Arrays.stream(Arrays.copyOf(keys, 3)).mapToInt(x -> (int) x).sorted().toArray();
        assertArrayEquals(new int[] {0, 4, 6}, top);
        long[] sorted = keys.clone();
        Arrays.sort(sorted);
        assertArrayEquals(new int[] {0, 4, 6, 2, 3, 1, 7, 5}, Arrays.stream(sorted).mapToInt(x -> (int) x).toArray());
    }

    @Test
    void aNaNScoreOfEitherSignComesFirst() {
        float negativeNaN = Float.intBitsToFloat(0xffc00000);
        float[] scores = {Float.POSITIVE_INFINITY, negativeNaN, 1f, Float.NaN, Float.NEGATIVE_INFINITY};
        long[] keys = new long[scores.length];
        for (int i = 0; i < scores.length; i++) {
            keys[i] = PageTopK.key(scores[i], i);
        }
        Arrays.sort(keys);
        assertArrayEquals(new int[] {1, 3, 0, 2, 4}, Arrays.stream(keys).mapToInt(x -> (int) x).toArray());
    }

    /**
     * Windows near 2^31 tokens count their blocks without overflow (a sink or recent window of Integer.MAX_VALUE
     * made a negative block count and an out-of-bounds read; now no budget holds them), and the default coarse keep
     * stays within the keeps taken: a budget of 600,000 with coarse blocks of 32 refused its own default keep.
     */
    @Test
    void hugeWindowsAndBudgetsCountTheirBlocksWithoutOverflow() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new SelectionConfig(Integer.MAX_VALUE, 16, Integer.MAX_VALUE, Integer.MAX_VALUE, 0));
        assertTrue(e.getMessage().contains("--select-sink 2147483647 (134217728) + --select-recent 2147483647"
                + " (134217728)") && e.getMessage().contains("268435458 pages"), e.getMessage());
        assertEquals(268435458L * 16, SelectionConfig.leastBudget(16, Integer.MAX_VALUE, Integer.MAX_VALUE));
        assertEquals(1 << 16, SelectionConfig.defaultCoarseKeep(600_000, 32));
        assertEquals(1 << 16, SelectionConfig.defaultCoarseKeep(Integer.MAX_VALUE, 32));
        assertEquals(32, SelectionConfig.defaultCoarseKeep(64, 256));
        new SelectionConfig(600_000, 16, 64, 256, 2, 32, SelectionConfig.defaultCoarseKeep(600_000, 32));
    }

    /**
     * The budget is counted as PageTopK counts it, in whole pages: the windows' pages (each rounded up) and two, the
     * queries' own and one chosen. Pages of 1024 with the default windows (64 and 256 tokens, a page each) and a
     * budget of 2048 passed a check in tokens (2048 >= 64 + 256 + 1024), then attended up to 3072 tokens and never
     * chose a page.
     */
    @Test
    void aBudgetItsWindowsFillInWholePagesIsRefused() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new SelectionConfig(2048, 1024, 64, 256, 2));
        assertTrue(e.getMessage().contains("--select-budget 2048 is 2 pages of --select-page 1024")
                && e.getMessage().contains("--select-sink 64 (1) + --select-recent 256 (1)")
                && e.getMessage().contains("= 4 pages, a budget of at least 4096 tokens"), e.getMessage());
        assertEquals(4096, SelectionConfig.leastBudget(1024, 64, 256));
        assertThrows(IllegalArgumentException.class, () -> new SelectionConfig(4095, 1024, 64, 256, 2));
        new SelectionConfig(4096, 1024, 64, 256, 2);
        assertEquals(352, SelectionConfig.leastBudget(16, 64, 256));
        assertThrows(IllegalArgumentException.class, () -> SelectionConfig.topK(351));
        SelectionConfig.topK(352);
    }

    /**
     * Over random accepted configs (pages 16..1024, windows and budgets off page multiples, with and without a
     * coarse level), no list attends more tokens than the budget, at any decode position nor in prefill chunks
     * whose query blocks straddle page edges; and at decode the choice runs: a one-round list short of every
     * visible page holds budget / page of them.
     */
    @Test
    void noSelectionAttendsMoreThanItsBudget() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        int ctx = 6144;
        int n = 40;
        KvFormat f = KvFormat.parse("f16");
        try (AttentionProblem p = AttentionProblem.random(f, f, 1, 2, 32, 32, ctx - n, n, 64, SEED);
             Parallel one = new Parallel(1)) {
            Selection sel = new Selection();
            for (int i = 0; i < 16; i++) {
                int page = i == 0 ? 1024 : 16 << rnd.nextInt(7);
                int sink = i == 0 ? 64 : rnd.nextInt(2 * page);
                int recent = i == 0 ? 256 : rnd.nextInt(3 * page);
                int least = (int) SelectionConfig.leastBudget(page, sink, recent);
                int budget = least + rnd.nextInt(i == 0 ? 1 : 4 * page);
                int coarse = i % 3 == 2 ? page << (1 + rnd.nextInt(3)) : 0;
                int keep = coarse == 0 ? 0 : 1 + rnd.nextInt(3);
                String what = "budget " + budget + ", page " + page + ", sink " + sink + ", recent " + recent
                        + ", coarse " + coarse + " keep " + keep + " (seed " + SEED + ")";
                assertThrows(IllegalArgumentException.class,
                        () -> new SelectionConfig(least - 1, page, sink, recent, 0, coarse, keep), what);
                SelectionConfig c = new SelectionConfig(budget, page, sink, recent, 0, coarse, keep);
                PageTopK topK = new PageTopK(c);
                p.seq().enableKeySummaries(page, coarse);
                for (int pos = 0; pos < ctx; pos++) {
                    topK.select(p.seq(), 0, p.queries(), 1, pos, p.heads(), sel, one);
                    assertTrue(sel.tokens(0, 0) <= budget, sel.tokens(0, 0) + " tokens at " + pos + ", " + what);
                    if (coarse == 0) {
                        assertEquals(Math.min(sel.stride(), budget / page), sel.count(0, 0), "at " + pos + ", " + what);
                    }
                }
                for (int r = 0; r < 8; r++) {
                    int start = rnd.nextInt(ctx - n + 1);
                    topK.select(p.seq(), 0, p.queries(), n, start, p.heads(), sel, one);
                    for (int qb = 0; qb < sel.queryBlocks(); qb++) {
                        assertTrue(sel.tokens(qb, 0) <= budget, sel.tokens(qb, 0) + " tokens for " + n + " queries at "
                                + start + ", query block " + qb + ", " + what);
                    }
                }
            }
        }
    }
}
