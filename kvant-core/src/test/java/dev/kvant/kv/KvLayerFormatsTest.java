package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.attention.CpuAttention;
import dev.kvant.tensor.Parallel;
import java.util.Arrays;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/** Caches whose layers keep their own K and V formats ({@code --ctk-layer}, {@code --ctv-layer}). */
class KvLayerFormatsTest {
    private static final KvFormat TURBO3 = KvFormat.parse("turbo3");
    private static final KvFormat Q8_0 = KvFormat.parse("q8_0");
    private static final KvFormat F16 = KvFormat.parse("f16");
    private static final KvFormat TURBO3_MEAN = KvFormat.parse("turbo3+mean");
    private static final KvGeometry G = new KvGeometry(3, 2, 128, 128);

    @Test
    void layersResolveByIndexOrFromTheEnd() {
        KvLayerFormats f = KvLayerFormats.of(TURBO3, TURBO3).withK(-1, Q8_0).withV(0, F16);
        assertSame(TURBO3, f.k(0, 3));
        assertSame(TURBO3, f.k(1, 3));
        assertSame(Q8_0, f.k(2, 3));
        assertSame(F16, f.v(0, 3));
        assertSame(TURBO3, f.v(2, 3));
        // the same setting on a deeper model names its last layer
        assertSame(Q8_0, f.k(31, 32));
        assertSame(TURBO3, f.k(2, 32));
        assertFalse(f.uniform(3));
        assertTrue(KvLayerFormats.of(TURBO3, TURBO3).withK(-1, TURBO3).uniform(3));
        // every layer given the same format of its own: one pair after all
        assertTrue(KvLayerFormats.of(TURBO3, TURBO3).withK(0, Q8_0).withK(1, Q8_0).uniform(2));
        assertEquals("turbo3/turbo3, layer -1: q8_0/turbo3, layer 0: turbo3/f16", f.name());
    }

    @Test
    void layersOutsideTheModelOrNamedTwiceAreRefused() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> KvLayerFormats.of(TURBO3, TURBO3).withK(3, Q8_0).check(3));
        assertTrue(e.getMessage().contains("the model has 3 layers"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> KvLayerFormats.of(TURBO3, TURBO3).withV(-4, Q8_0).check(3));
        e = assertThrows(IllegalArgumentException.class,
                () -> KvLayerFormats.of(TURBO3, TURBO3).withK(2, Q8_0).withK(-1, F16).check(3));
        assertTrue(e.getMessage().contains("layer 2"), e.getMessage());
        // the same format twice is no conflict; two for one index are
        KvLayerFormats.of(TURBO3, TURBO3).withK(2, Q8_0).withK(-1, Q8_0).check(3);
        KvLayerFormats.of(TURBO3, TURBO3).withK(1, Q8_0).withK(1, Q8_0);
        assertThrows(IllegalArgumentException.class, () -> KvLayerFormats.of(TURBO3, TURBO3).withV(1, Q8_0)
                .withV(1, F16));
        // key summaries keep one key size: a rotated format pads a head of 96 to 128, q8_0 does not
        KvLayerFormats padded = KvLayerFormats.of(TURBO3, TURBO3).withK(-1, Q8_0);
        assertEquals(128, padded.keyDomainDim(128, 3));
        e = assertThrows(IllegalArgumentException.class, () -> padded.keyDomainDim(96, 3));
        assertTrue(e.getMessage().contains("--select"), e.getMessage());
        assertThrows(IllegalArgumentException.class,
                () -> new KvCache(G, KvLayerFormats.of(TURBO3, TURBO3).withV(1, TURBO3_MEAN), 16, 4));
    }

    @Test
    void eachLayerKeepsItsOwnRowsAndBytes() {
        KvLayerFormats f = KvLayerFormats.of(TURBO3, TURBO3).withK(-1, Q8_0).withV(-1, Q8_0).withK(0, TURBO3_MEAN);
        long perToken = 0;
        for (int l = 0; l < 3; l++) {
            perToken += KvCache.bytesPerToken(new KvGeometry(1, 2, 128, 128), f.k(l, 3), f.v(l, 3));
        }
        long seed = new SplittableRandom().nextLong();
        SplittableRandom r = new SplittableRandom(seed);
        int n = 45;
        float[] k = rows(r, n);
        float[] v = rows(r, n);
        try (KvCache mixed = new KvCache(G, f, 16, 8)) {
            assertEquals(perToken, mixed.bytesPerToken(), "bytes a token: the layers' own, summed");
            long pageBytes = 0;
            for (int l = 0; l < 3; l++) {
                pageBytes += mixed.kPageBytes(l) + mixed.vPageBytes(l);
                assertEquals(KvCache.kPageBytes(G, f.k(l, 3), 16), mixed.kPageBytes(l));
            }
            assertEquals(pageBytes, KvCache.pageBytes(G, f, 16));
            assertThrows(IllegalStateException.class, mixed::kFormat, "one K format for a cache whose layers differ");
            assertThrows(IllegalStateException.class, mixed::kRowBytes);
            KvSequence s = mixed.newSequence();
            for (int l = 0; l < 3; l++) {
                s.writeRows(l, 0, n, k, 0, v, 0);
            }
            KvSequence fork = s.fork(37);   // shares two pages, copies the one it ends in
            // the parent writes on inside its first page: a copy on write, page by page in every layer's sizes
            float[] k2 = rows(r, 5);
            float[] v2 = rows(r, 5);
            for (int l = 0; l < 3; l++) {
                s.writeRows(l, 20, 5, k2, 0, v2, 0);
            }
            for (int l = 0; l < 3; l++) {
                try (KvCache alone = new KvCache(G, f.k(l, 3), f.v(l, 3), 16, 8)) {
                    KvSequence a = alone.newSequence();
                    a.writeRows(l, 0, n, k, 0, v, 0);
                    KvSequence rewritten = alone.newSequence();
                    rewritten.writeRows(l, 0, n, k, 0, v, 0);
                    rewritten.writeRows(l, 20, 5, k2, 0, v2, 0);
                    float[] want = new float[128];
                    float[] got = new float[128];
                    for (int pos = 0; pos < n; pos++) {
                        for (int h = 0; h < 2; h++) {
                            for (boolean isV : new boolean[] {false, true}) {
                                String what = (isV ? "V" : "K") + ", layer " + l + " at " + pos + "; seed " + seed;
                                // the parent: the first rows, then its own at 20..24 (copied on write)
                                decode(rewritten, isV, l, pos, h, want);
                                decode(s, isV, l, pos, h, got);
                                assertArrayEquals(want, got, "parent " + what);
                                if (pos < 37) {   // the fork: the first rows throughout
                                    decode(a, isV, l, pos, h, want);
                                    decode(fork, isV, l, pos, h, got);
                                    assertArrayEquals(want, got, "fork " + what);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    private static void decode(KvSequence s, boolean isV, int layer, int pos, int head, float[] dst) {
        if (isV) {
            s.decodeV(layer, pos, head, dst, 0);
        } else {
            s.decodeK(layer, pos, head, dst, 0);
        }
    }

    /** CPU attention over a layer of a mixed cache gives the bits it gives over a cache of that layer's formats. */
    @Test
    void attentionReadsEachLayerInItsFormats() {
        KvLayerFormats f = KvLayerFormats.of(TURBO3, TURBO3).withK(-1, Q8_0).withV(1, F16).withK(1, TURBO3_MEAN);
        long seed = new SplittableRandom().nextLong();
        SplittableRandom r = new SplittableRandom(seed);
        int n = 300;
        int heads = 8;
        float[] k = rows(r, n);
        float[] v = rows(r, n);
        float[] q = new float[40 * heads * 128];
        for (int i = 0; i < q.length; i++) {
            q[i] = (float) r.nextGaussian();
        }
        try (Parallel pool = new Parallel(2); KvCache mixed = new KvCache(G, f, 16, 32)) {
            KvSequence s = mixed.newSequence();
            for (int l = 0; l < 3; l++) {
                s.writeRows(l, 0, n, k, 0, v, 0);
            }
            for (int l = 0; l < 3; l++) {
                try (KvCache alone = new KvCache(G, f.k(l, 3), f.v(l, 3), 16, 32)) {
                    KvSequence a = alone.newSequence();
                    a.writeRows(l, 0, n, k, 0, v, 0);
                    for (int m : new int[] {1, 3, 40}) {   // decode, multi-query decode, prefill
                        float[] want = new float[m * heads * 128];
                        float[] got = new float[m * heads * 128];
                        Arrays.fill(got, Float.NaN);
                        CpuAttention.attend(a, l, q, m, n - m, heads, 0.088f, want, pool);
                        CpuAttention.attend(s, l, q, m, n - m, heads, 0.088f, got, pool);
                        assertArrayEquals(want, got, m + " queries, layer " + l + " (" + f.k(l, 3).name() + "/"
                                + f.v(l, 3).name() + "); seed " + seed);
                    }
                }
            }
        }
    }

    /** A block selection over a layer of a mixed cache chooses what it chooses over a cache of that layer's formats. */
    @Test
    void selectionScoresEachLayerInItsKeyDomain() {
        KvLayerFormats f = KvLayerFormats.of(TURBO3, TURBO3).withK(0, Q8_0).withK(1, TURBO3_MEAN);
        long seed = new SplittableRandom().nextLong();
        SplittableRandom r = new SplittableRandom(seed);
        int n = 2000;
        int heads = 8;
        float[] k = rows(r, n);
        float[] v = rows(r, n);
        float[] q = new float[heads * 128];
        for (int i = 0; i < q.length; i++) {
            q[i] = (float) r.nextGaussian() + (i % 128 == 5 ? 3f : 0f);
        }
        dev.kvant.select.SelectionConfig config = new dev.kvant.select.SelectionConfig(256, 16, 16, 32, 0);
        try (Parallel pool = new Parallel(2); KvCache mixed = new KvCache(G, f, 16, 160)) {
            KvSequence s = mixed.newSequence();
            s.enableKeySummaries(16);
            for (int l = 0; l < 3; l++) {
                s.writeRows(l, 0, n, k, 0, v, 0);
            }
            for (int l = 0; l < 3; l++) {
                try (KvCache alone = new KvCache(G, f.k(l, 3), f.v(l, 3), 16, 160)) {
                    KvSequence a = alone.newSequence();
                    a.enableKeySummaries(16);
                    for (int m = 0; m < 3; m++) {
                        a.writeRows(m, 0, n, k, 0, v, 0);
                    }
                    dev.kvant.select.Selection want = new dev.kvant.select.Selection();
                    dev.kvant.select.Selection got = new dev.kvant.select.Selection();
                    new dev.kvant.select.PageTopK(config).select(a, l, q, 1, n - 1, heads, want, pool);
                    new dev.kvant.select.PageTopK(config).select(s, l, q, 1, n - 1, heads, got, pool);
                    for (int g = 0; g < 2; g++) {
                        assertTrue(want.count(0, g) < n / 16, "the budget leaves blocks out");
                        assertArrayEquals(Arrays.copyOfRange(want.blocks(), want.offset(0, g), want.offset(0, g)
                                        + want.count(0, g)),
                                Arrays.copyOfRange(got.blocks(), got.offset(0, g), got.offset(0, g) + got.count(0, g)),
                                "layer " + l + " (" + f.k(l, 3).name() + "), kv head " + g + "; seed " + seed);
                    }
                }
            }
        }
    }

    /** n tokens of K or V rows (2 kv heads of 128), some channels offset as real keys have. */
    private static float[] rows(SplittableRandom r, int n) {
        float[] x = new float[n * 2 * 128];
        for (int i = 0; i < x.length; i++) {
            x[i] = (float) r.nextGaussian() + (i % 128 == 5 ? 6f : 0f);
        }
        return x;
    }
}
