package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/** Keys centered on their page's mean: names, layout, which mean a page gets, and what a reader sees. */
class PageMeanFormatTest {
    private static final long SEED = new SplittableRandom().nextLong();
    private static final int D = 128;
    private static final int HEADS = 2;
    private static final int PAGE = 16;
    private static final KvGeometry G = new KvGeometry(2, HEADS, D, D);

    /** Rows sharing a large per-channel offset (a real model's keys do), plus noise. */
    private static float[] keys(SplittableRandom rnd, int n, float offset) {
        float[] common = new float[HEADS * D];
        for (int i = 0; i < common.length; i++) {
            common[i] = (float) (offset * rnd.nextGaussian());
        }
        float[] x = new float[n * HEADS * D];
        for (int i = 0; i < x.length; i++) {
            x[i] = common[i % common.length] + (float) rnd.nextGaussian();
        }
        return x;
    }

    private static double error(KvSequence seq, float[] k, int n) {
        KvFormat f = seq.cache().kFormat();
        float[] row = new float[f.domainDim(D)];
        double e = 0;
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < HEADS; h++) {
                seq.decodeK(0, t, h, row, 0);
                f.unrotate(row, 0, D);
                for (int i = 0; i < D; i++) {
                    double d = row[i] - k[(t * HEADS + h) * D + i];
                    e += d * d;
                }
            }
        }
        return e;
    }

    @Test
    void namesParseAndRefuseWhatMakesNoSense() {
        KvFormat f = KvFormat.parse("turbo3+mean");
        assertInstanceOf(PageMeanFormat.class, f);
        assertEquals(TurboFormat.TURBO3, PageMeanFormat.rows(f));
        assertEquals("turbo3+mean", f.name());
        assertEquals(3.125 + 0.25, f.bitsPerValue(), 1e-12);
        assertThrows(IllegalArgumentException.class, () -> KvFormat.parse("turbo3+mean+mean"));
        assertThrows(IllegalArgumentException.class, () -> KvFormat.parse("+mean"));
        assertThrows(IllegalArgumentException.class, () -> KvFormat.parse("f16+mean"));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> KvCache.forTokens(G, TurboFormat.TURBO3, f, PAGE, 64));
        assertTrue(e.getMessage().contains("only keys"), e.getMessage());
    }

    @Test
    void pagesCarryTheMeansAndTheBudgetCountsThem() {
        KvFormat k = KvFormat.parse("turbo3+mean");
        try (KvCache c = KvCache.forTokens(G, k, TurboFormat.TURBO3, 64, 128)) {
            assertTrue(c.keyMeans());
            assertEquals(64L * HEADS * 50 + 2L * HEADS * D, c.kPageBytes());   // means: D halves per head
            assertEquals(KvCache.pageBytes(G, k, TurboFormat.TURBO3, 64), 64 * KvCache.bytesPerToken(G, k,
                    TurboFormat.TURBO3));
        }
    }

    @Test
    void centeringTakesASharedOffsetsErrorAwayAndReadersSeeTheKeys() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        int n = 4 * PAGE;
        float[] k = keys(rnd, n, 6f);
        float[] v = new float[n * HEADS * D];
        for (String name : new String[] {"turbo3", "turbo2", "q4_0", "q4_0h", "q8_0"}) {
            double plain;
            double centered;
            try (KvCache c = KvCache.forTokens(G, KvFormat.parse(name), TurboFormat.TURBO3, PAGE, n)) {
                KvSequence s = c.newSequence();
                s.writeRows(0, 0, n, k, 0, v, 0);
                plain = error(s, k, n);
            }
            try (KvCache c = KvCache.forTokens(G, KvFormat.parse(name + "+mean"), TurboFormat.TURBO3, PAGE, n)) {
                KvSequence s = c.newSequence();
                s.writeRows(0, 0, n, k, 0, v, 0);
                centered = error(s, k, n);
            }
            assertTrue(centered < 0.2 * plain, name + ": centered error " + centered + " vs plain " + plain
                    + " (seed " + SEED + ")");
        }
    }

    /** The mean of rows [from, to) of kv head h in f's domain, summed in order and rounded to halves. */
    private static float[] domainMean(KvFormat f, float[] k, int from, int to, int h) {
        int dom = f.domainDim(D);
        float[] sum = new float[dom];
        float[] row = new float[dom];
        for (int t = from; t < to; t++) {
            System.arraycopy(k, (t * HEADS + h) * D, row, 0, D);
            f.rotate(row, 0, D);
            for (int i = 0; i < dom; i++) {
                sum[i] += row[i];
            }
        }
        for (int i = 0; i < dom; i++) {
            sum[i] = Float.float16ToFloat(Float.floatToFloat16(sum[i] / (to - from)));
        }
        return sum;
    }

    @Test
    void encodingDomainRowsIsEncodingTheRowsTheyCameFrom() {
        SplittableRandom rnd = new SplittableRandom(SEED ^ 3);
        for (KvFormat f : KvFormat.all()) {
            for (int d : new int[] {64, 80, 128, 256}) {
                int rows = 5;
                int dom = f.domainDim(d);
                float[] x = new float[rows * d];
                float[] y = new float[rows * dom];
                for (int i = 0; i < x.length; i++) {
                    x[i] = (float) (3 * rnd.nextGaussian());
                }
                for (int r = 0; r < rows; r++) {
                    System.arraycopy(x, r * d, y, r * dom, d);
                    f.rotate(y, r * dom, d);
                }
                long rb = f.rowBytes(d);
                java.lang.foreign.MemorySegment a = java.lang.foreign.MemorySegment.ofArray(new byte[(int) (rows * rb)]);
                java.lang.foreign.MemorySegment b = java.lang.foreign.MemorySegment.ofArray(new byte[(int) (rows * rb)]);
                f.encodeRows(x, 0, rows, d, a, 0, rb);
                f.encodeDomainRows(y, 0, rows, d, b, 0, rb);
                assertEquals(-1L, a.mismatch(b), f.name() + " head " + d + " (seed " + SEED + ")");
            }
        }
    }

    @Test
    void aPageGetsItsOwnRowsMeanThePreviousPagesOrNone() {
        SplittableRandom rnd = new SplittableRandom(SEED ^ 1);
        KvFormat f = KvFormat.parse("turbo3+mean");
        int dom = f.domainDim(D);
        float[] k = keys(rnd, 3 * PAGE, 3f);
        float[] v = new float[3 * PAGE * HEADS * D];
        try (KvCache c = KvCache.forTokens(G, f, TurboFormat.TURBO3, PAGE, 8 * PAGE)) {
            KvSequence s = c.newSequence();
            float[] got = new float[dom];
            // one row opens page 0: too few to estimate, and one of them a sink: mean 0
            s.writeRows(0, 0, 1, k, 0, v, 0);
            c.keyMean(0, s.page(0), 1, got, 0);
            assertArrayEquals(new float[dom], got);
            // the rest of page 0 and a quarter of page 1 in one write: page 1 gets its rows' mean
            s.writeRows(0, 1, PAGE - 1 + PAGE / 4, k, HEADS * D, v, 0);
            float[] want = domainMean(f, k, PAGE, PAGE + PAGE / 4, 1);
            c.keyMean(0, s.page(1), 1, got, 0);
            assertArrayEquals(want, got);
            // filling page 1 row by row keeps its mean; a row opening page 2: the mean of page 1's keys as stored
            for (int t = PAGE + PAGE / 4; t < 2 * PAGE; t++) {
                s.writeRows(0, t, 1, k, t * HEADS * D, v, 0);
            }
            c.keyMean(0, s.page(1), 1, got, 0);
            assertArrayEquals(want, got);
            s.writeRows(0, 2 * PAGE, 1, k, 2 * PAGE * HEADS * D, v, 0);
            float[] stored = new float[dom];
            float[] row = new float[dom];
            for (int t = PAGE; t < 2 * PAGE; t++) {
                s.decodeK(0, t, 1, row, 0);
                for (int i = 0; i < dom; i++) {
                    stored[i] += row[i] / PAGE;
                }
            }
            c.keyMean(0, s.page(2), 1, got, 0);
            for (int i = 0; i < dom; i++) {
                assertEquals(stored[i], got[i], 2e-3 * Math.abs(got[i]) + 1e-4, "value " + i);
            }
            // a few rows opening a page after a previous page of the same write: their own mean
            KvSequence t = c.newSequence();
            t.writeRows(0, 0, PAGE + 2, k, 0, v, 0);
            c.keyMean(0, t.page(1), 0, got, 0);
            assertArrayEquals(domainMean(f, k, PAGE, PAGE + 2, 0), got);
            assertArrayEquals(domainMean(f, k, 0, PAGE, 0), meanOf(c, t, 0));
        }
    }

    private static float[] meanOf(KvCache c, KvSequence s, int lp) {
        float[] m = new float[c.kFormat().domainDim(D)];
        c.keyMean(0, s.page(lp), 0, m, 0);
        return m;
    }

    @Test
    void forksShareMeansAndCopiesKeepThem() {
        SplittableRandom rnd = new SplittableRandom(SEED ^ 2);
        KvFormat f = KvFormat.parse("q4_0+mean");
        int n = 2 * PAGE + 5;
        float[] k = keys(rnd, n, 3f);
        float[] v = keys(rnd, n, 0f);
        try (KvCache c = KvCache.forTokens(G, f, KvFormat.parse("f16"), PAGE, 8 * PAGE)) {
            KvSequence s = c.newSequence();
            for (int l = 0; l < G.layers(); l++) {
                s.writeRows(l, 0, n, k, 0, v, 0);
            }
            // every layer's pages get their own means (layers are written one after another)
            float[] a = new float[D];
            float[] b = new float[D];
            for (int l = 0; l < G.layers(); l++) {
                c.keyMean(l, s.page(1), 0, a, 0);
                assertArrayEquals(domainMean(f, k, PAGE, 2 * PAGE, 0), a, "layer " + l);
            }
            KvSequence child = c.fork(s, n);
            for (int t = 0; t < n; t++) {
                s.decodeK(1, t, 0, a, 0);
                child.decodeK(1, t, 0, b, 0);
                assertArrayEquals(a, b, "position " + t);
            }
            // the child writes into its copy of the partial page: the parent's rows and means are untouched
            float[] more = keys(rnd, 3, 3f);
            child.writeRows(1, n, 3, more, 0, new float[3 * HEADS * D], 0);
            for (int t = 0; t < n; t++) {
                s.decodeK(1, t, 0, a, 0);
                child.decodeK(1, t, 0, b, 0);
                assertArrayEquals(a, b, "position " + t + " after the child's write");
            }
        }
    }

    /**
     * A NaN or infinite key stays in its own row: the page mean adds 0 for it, so the page's other rows, the pages
     * opened after it (from the previous page's keys) and rows rewritten after a truncation decode finite (a NaN in
     * the mean used to make every row of its head non-finite from that page on, truncated away or not).
     */
    @Test
    void aNonFiniteKeyStaysInItsRow() {
        for (float bad : new float[] {Float.NaN, Float.POSITIVE_INFINITY}) {
            for (String name : new String[] {"q8_0+mean", "turbo3+mean"}) {
                SplittableRandom rnd = new SplittableRandom(SEED ^ 7);
                KvFormat f = KvFormat.parse(name);
                int n = 4 * PAGE;
                float[] k = keys(rnd, n, 3f);
                float[] v = new float[n * HEADS * D];
                int badRow = PAGE / 2;
                k[(badRow * HEADS) * D + 3] = bad;   // head 0, channel 3
                try (KvCache c = KvCache.forTokens(G, f, KvFormat.parse("f16"), PAGE, 8 * PAGE)) {
                    KvSequence s = c.newSequence();
                    s.writeRows(0, 0, PAGE, k, 0, v, 0);                  // page 0 whole, the bad row in it
                    for (int t = PAGE; t < n; t++) {                      // pages 1-3 a row at a time
                        s.writeRows(0, t, 1, k, t * HEADS * D, v, 0);
                    }
                    float[] mean = new float[f.domainDim(D)];
                    for (int lp = 0; lp < 4; lp++) {
                        c.keyMean(0, s.page(lp), 0, mean, 0);
                        for (float m : mean) {
                            assertTrue(Float.isFinite(m), name + " with " + bad + ": page " + lp + "'s mean");
                        }
                    }
                    float[] row = new float[f.domainDim(D)];
                    for (int t = 0; t < n; t++) {
                        if (t == badRow) {
                            continue;
                        }
                        s.decodeK(0, t, 0, row, 0);
                        for (float x : row) {
                            assertTrue(Float.isFinite(x), name + " with " + bad + ": row " + t + " decodes " + x);
                        }
                    }
                }
            }
        }
    }

    /** A page mean beyond the fp16 range is stored clamped, as scales and norms are, not as infinity. */
    @Test
    void aPageMeanBeyondTheHalfRangeIsClamped() {
        SplittableRandom rnd = new SplittableRandom(SEED ^ 8);
        KvFormat f = KvFormat.parse("q8_0+mean");
        float[] k = keys(rnd, PAGE, 1f);
        for (int t = 0; t < PAGE; t++) {
            k[(t * HEADS) * D] = 70000f + (float) rnd.nextGaussian();   // head 0, channel 0
        }
        try (KvCache c = KvCache.forTokens(G, f, KvFormat.parse("f16"), PAGE, 4 * PAGE)) {
            KvSequence s = c.newSequence();
            s.writeRows(0, 0, PAGE, k, 0, new float[PAGE * HEADS * D], 0);
            float[] row = new float[f.domainDim(D)];
            for (int t = 0; t < PAGE; t++) {
                s.decodeK(0, t, 0, row, 0);
                for (float x : row) {
                    assertTrue(Float.isFinite(x), "row " + t + " decodes " + x);
                }
            }
        }
    }
}
