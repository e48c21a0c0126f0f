package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class KvCacheTest {
    private static final KvGeometry GEOMETRY = new KvGeometry(3, 2, 128, 64);

    private static float[] tokens(SplittableRandom rnd, int n, int kvHeads, int dim) {
        float[] x = new float[n * kvHeads * dim];
        for (int i = 0; i < x.length; i++) {
            x[i] = (float) (rnd.nextGaussian() + 0.1);
        }
        return x;
    }

    /** Every byte of every page of every layer, for before/after comparisons. */
    private static byte[] snapshot(KvCache cache) {
        int layers = cache.geometry().layers();
        long size = 0;
        for (int l = 0; l < layers; l++) {
            size += cache.kPool(l).byteSize() + cache.vPool(l).byteSize();
        }
        byte[] all = new byte[(int) size];
        int at = 0;
        for (int l = 0; l < layers; l++) {
            for (MemorySegment pool : new MemorySegment[] {cache.kPool(l), cache.vPool(l)}) {
                MemorySegment.copy(pool, java.lang.foreign.ValueLayout.JAVA_BYTE, 0, all, at, (int) pool.byteSize());
                at += (int) pool.byteSize();
            }
        }
        return all;
    }

    private static int[] table(KvSequence s) {
        int[] t = new int[s.pageCount()];
        for (int i = 0; i < t.length; i++) {
            t[i] = s.page(i);
        }
        return t;
    }

    private static void writeAllLayers(KvSequence s, int pos, int n, float[] k, float[] v) {
        for (int l = 0; l < s.cache().geometry().layers(); l++) {
            s.writeRows(l, pos, n, k, 0, v, 0);
        }
    }

    @Test
    void capacityIsPlannedFromTokensOrBytes() {
        KvFormat k = TurboFormat.TURBO3;
        KvFormat v = Q4Format.Q4_0H;
        long perToken = 3L * 2 * (50 + 36);
        try (KvCache byTokens = KvCache.forTokens(GEOMETRY, k, v, 16, 100)) {
            assertEquals(perToken, byTokens.bytesPerToken());
            assertEquals(7, byTokens.totalPages());
            assertEquals(112, byTokens.capacityTokens());
            assertEquals(7, byTokens.freePages());
            assertEquals(16 * 2 * 50, byTokens.kPage(2, 6).byteSize());
            assertEquals((5 * 2 + 1) * 36, byTokens.vRowOffset(5, 1));
        }
        try (KvCache byBudget = KvCache.forBudget(GEOMETRY, k, v, 16, perToken * 16 * 5 + perToken * 15)) {
            assertEquals(5, byBudget.totalPages());
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> KvCache.forBudget(GEOMETRY, k, v, 16, perToken * 15));
        assertTrue(e.getMessage().contains("holds no page"), e.getMessage());
        try (KvCache f16 = KvCache.forTokens(GEOMETRY, HalfFormat.F16, HalfFormat.F16, 16, 16)) {
            assertTrue(f16.bytesPerToken() > 4 * KvCache.bytesPerToken(GEOMETRY, TurboFormat.TURBO3, TurboFormat.TURBO3),
                    "turbo3 holds a context in over 4x less memory than f16");
        }
    }

    /**
     * Rows come back from where they were written: each decoded row is close to its own input (a misplaced row,
     * unrelated to it, would have relative error about 2; turbo2's worst single rows reach about 0.3).
     */
    @Test
    void decodedRowsAreWhatWasWritten() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        for (KvFormat k : KvFormat.all()) {
            KvFormat v = KvFormat.all().get(rnd.nextInt(KvFormat.all().size()));
            try (KvCache cache = KvCache.forTokens(GEOMETRY, k, v, 4, 32); KvSequence s = cache.newSequence()) {
                int n = 9;
                float[] kx = tokens(rnd, n, 2, 128);
                float[] vx = tokens(rnd, n, 2, 64);
                writeAllLayers(s, 0, n, kx, vx);
                assertEquals(n, s.length());
                float[] got = new float[128];
                float[] expected = new float[128];
                for (int pos = 0; pos < n; pos++) {
                    for (int h = 0; h < 2; h++) {
                        s.decodeK(2, pos, h, got, 0);
                        System.arraycopy(kx, (pos * 2 + h) * 128, expected, 0, 128);
                        k.rotate(expected, 0, 128);
                        double err = 0;
                        double norm = 0;
                        for (int i = 0; i < 128; i++) {
                            err += (expected[i] - got[i]) * (expected[i] - got[i]);
                            norm += expected[i] * expected[i];
                        }
                        assertTrue(err / norm < 0.5, "seed " + seed + " " + k + ": K row " + pos + "/" + h + " error " + err / norm);
                        s.decodeV(0, pos, h, got, 0);
                        System.arraycopy(vx, (pos * 2 + h) * 64, expected, 0, 64);
                        v.rotate(expected, 0, 64);
                        err = 0;
                        norm = 0;
                        for (int i = 0; i < 64; i++) {
                            err += (expected[i] - got[i]) * (expected[i] - got[i]);
                            norm += expected[i] * expected[i];
                        }
                        assertTrue(err / norm < 0.5, "seed " + seed + " " + v + ": V row " + pos + "/" + h + " error " + err / norm);
                    }
                }
            }
        }
    }

    @Test
    void writeRowsIsBitIdenticalToSingleWrites() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        for (KvFormat f : KvFormat.all()) {
            try (KvCache a = KvCache.forTokens(GEOMETRY, f, f, 5, 40); KvCache b = KvCache.forTokens(GEOMETRY, f, f, 5, 40)) {
                KvSequence sa = a.newSequence();
                KvSequence sb = b.newSequence();
                int start = 3;   // the first rows, then a write from the middle of a page
                int n = 13;
                float[] k0 = tokens(rnd, start, 2, 128);
                float[] v0 = tokens(rnd, start, 2, 64);
                float[] k = tokens(rnd, n, 2, 128);
                float[] v = tokens(rnd, n, 2, 64);
                for (int l = 0; l < 3; l++) {
                    sa.writeRows(l, 0, start, k0, 0, v0, 0);
                    sb.writeRows(l, 0, start, k0, 0, v0, 0);
                    sa.writeRows(l, start, n, k, 0, v, 0);
                    for (int t = 0; t < n; t++) {
                        sb.write(l, start + t, k, t * 2 * 128, v, t * 2 * 64);
                    }
                }
                assertEquals(start + n, sa.length());
                assertEquals(start + n, sb.length());
                assertTrue(Arrays.equals(table(sa), table(sb)), "same page tables");
                assertTrue(Arrays.equals(snapshot(a), snapshot(b)), "seed " + seed + " " + f + ": writeRows differs from single writes");
            }
        }
    }

    @Test
    void fullCacheExceptionLeavesTheCacheUnchanged() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        try (KvCache cache = new KvCache(GEOMETRY, TurboFormat.TURBO4, Int8Format.Q8_0, 4, 5)) {
            KvSequence a = cache.newSequence();
            writeAllLayers(a, 0, 10, tokens(rnd, 10, 2, 128), tokens(rnd, 10, 2, 64));
            KvSequence b = cache.fork(a, 8);
            assertEquals(2, cache.freePages());
            byte[] before = snapshot(cache);
            int[] tableA = table(a);
            int[] tableB = table(b);

            KvCacheFullException e = assertThrows(KvCacheFullException.class, () -> a.reserve(21));
            assertEquals(20, e.fittingTokens());
            assertEquals(21, e.requestedTokens());
            assertTrue(e.getMessage().contains("fits 20 tokens"), e.getMessage());
            // 12 new tokens need 3 pages; 2 are free.
            assertThrows(KvCacheFullException.class,
                    () -> b.writeRows(1, 8, 12, tokens(rnd, 12, 2, 128), 0, tokens(rnd, 12, 2, 64), 0));
            KvSequence c = cache.fork(a, 10);
            a.reserve(16);
            assertEquals(0, cache.freePages());
            // a's first page is shared with b and c: writing into it needs a copy, and no page is free.
            KvCacheFullException cow = assertThrows(KvCacheFullException.class,
                    () -> a.write(0, 1, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0));
            assertTrue(cow.getMessage().contains("copy-on-write"), cow.getMessage());
            assertThrows(KvCacheFullException.class, () -> cache.fork(a, 9));
            c.close();
            a.truncate(10);

            assertEquals(2, cache.freePages());
            assertTrue(Arrays.equals(tableA, table(a)), "a's pages unchanged");
            assertTrue(Arrays.equals(tableB, table(b)), "b's pages unchanged");
            assertEquals(10, a.length());
            assertEquals(8, b.length());
            assertTrue(pagesEqual(before, snapshot(cache), cache, tableA, tableB),
                    "seed " + seed + ": failed operations changed no row of a or b");
        }
    }

    /** What a full cache says a sequence fits is never less than what the sequence already holds. */
    @Test
    void aFullCacheNeverSaysASequenceFitsLessThanItHolds() {
        SplittableRandom rnd = new SplittableRandom(5);
        try (KvCache cache = new KvCache(GEOMETRY, TurboFormat.TURBO4, Int8Format.Q8_0, 4, 3)) {
            KvSequence parent = cache.newSequence();
            writeAllLayers(parent, 0, 12, tokens(rnd, 12, 2, 128), tokens(rnd, 12, 2, 64));
            KvSequence child = cache.fork(parent, 12);   // all three pages shared, none free
            child.truncate(9);
            // writing at 9 needs a private copy of the third page, and no page is free
            KvCacheFullException e = assertThrows(KvCacheFullException.class,
                    () -> child.write(0, 9, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0));
            assertEquals(9, e.fittingTokens(), e.getMessage());
        }
    }

    @Test
    void aWritePastTheEndIsRefusedRatherThanLeavingAGapOfOldRows() {
        SplittableRandom rnd = new SplittableRandom(3);
        try (KvCache cache = new KvCache(GEOMETRY, TurboFormat.TURBO4, Int8Format.Q8_0, 4, 8)) {
            KvSequence s = cache.newSequence();
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> s.writeRows(0, 5, 1, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0));
            assertTrue(e.getMessage().contains("without gaps"), e.getMessage());
            assertEquals(0, s.length());
            assertEquals(0, s.pageCount());
            writeAllLayers(s, 0, 3, tokens(rnd, 3, 2, 128), tokens(rnd, 3, 2, 64));
            s.write(0, 3, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0);   // right after: taken
            s.write(1, 1, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0);   // over earlier rows: taken
            assertThrows(IllegalArgumentException.class,
                    () -> s.write(1, 4, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0));   // layer 1 holds 3
        }
    }

    @Test
    void aFullStepNamesTheFirstSequenceThatDoesNotFit() {
        SplittableRandom rnd = new SplittableRandom(5);
        try (KvCache cache = new KvCache(GEOMETRY, TurboFormat.TURBO4, Int8Format.Q8_0, 4, 6)) {
            KvSequence a = cache.newSequence();
            KvSequence b = cache.newSequence();
            writeAllLayers(b, 0, 4, tokens(rnd, 4, 2, 128), tokens(rnd, 4, 2, 64));   // b: 1 page; 5 free
            // a asks for 3 pages (fits), b for 3 more (its 2nd..4th): 6 > 5; b could reach 3 pages = 12 tokens
            KvCacheFullException e = assertThrows(KvCacheFullException.class,
                    () -> KvSequence.reserveAll(new KvSequence[] {a, b}, new int[] {12, 16}));
            assertEquals(16, e.requestedTokens());
            assertEquals(12, e.fittingTokens());
            assertTrue(e.getMessage().contains("sequence 1"), e.getMessage());
            assertEquals(5, cache.freePages());
        }
    }

    /** True when the bytes of the given pages are equal in both snapshots (other pages may have been reused). */
    private static boolean pagesEqual(byte[] before, byte[] after, KvCache cache, int[]... tables) {
        int layers = cache.geometry().layers();
        long poolsPerLayer = cache.kPool(0).byteSize() + cache.vPool(0).byteSize();
        for (int[] t : tables) {
            for (int p : t) {
                for (int l = 0; l < layers; l++) {
                    long kAt = l * poolsPerLayer + p * cache.kPageBytes();
                    long vAt = l * poolsPerLayer + cache.kPool(0).byteSize() + p * cache.vPageBytes();
                    if (!Arrays.equals(before, (int) kAt, (int) (kAt + cache.kPageBytes()), after, (int) kAt, (int) (kAt + cache.kPageBytes()))
                            || !Arrays.equals(before, (int) vAt, (int) (vAt + cache.vPageBytes()), after, (int) vAt, (int) (vAt + cache.vPageBytes()))) {
                        return false;
                    }
                }
            }
        }
        return true;
    }

    @Test
    void forkSharesFullPagesAndCopiesTheBoundaryPage() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        try (KvCache cache = new KvCache(GEOMETRY, TurboFormat.TURBO3, TurboFormat.TURBO2, 4, 16)) {
            KvSequence parent = cache.newSequence();
            float[] k = tokens(rnd, 11, 2, 128);
            float[] v = tokens(rnd, 11, 2, 64);
            writeAllLayers(parent, 0, 11, k, v);
            KvSequence child = cache.fork(parent, 10);
            assertEquals(10, child.length());
            assertEquals(3, child.pageCount());
            assertEquals(parent.page(0), child.page(0));
            assertEquals(parent.page(1), child.page(1));
            assertNotEquals(parent.page(2), child.page(2));
            assertEquals(2, cache.refCount(parent.page(0)));
            assertEquals(1, cache.refCount(child.page(2)));
            float[] p = new float[128];
            float[] c = new float[128];
            for (int pos = 0; pos < 10; pos++) {
                for (int l = 0; l < 3; l++) {
                    parent.decodeK(l, pos, 1, p, 0);
                    child.decodeK(l, pos, 1, c, 0);
                    assertTrue(Arrays.equals(p, c), "prefix row " + pos + " of layer " + l);
                }
            }
        }
    }

    @Test
    void writesIntoSharedPagesCopyOnWriteAndKeepTheOtherSequencesRows() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        try (KvCache cache = new KvCache(GEOMETRY, Q4Format.Q4_0H, Int8Format.INT8, 4, 16)) {
            KvSequence parent = cache.newSequence();
            writeAllLayers(parent, 0, 12, tokens(rnd, 12, 2, 128), tokens(rnd, 12, 2, 64));
            KvSequence child = cache.fork(parent, 12);
            int shared = parent.page(1);
            assertEquals(shared, child.page(1));
            float[][] parentRows = new float[12][128];
            for (int pos = 0; pos < 12; pos++) {
                parent.decodeK(1, pos, 0, parentRows[pos], 0);
            }
            // The child rewrites position 5 (page 1, shared): it gets its own copy of page 1.
            child.write(1, 5, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0);
            assertNotEquals(shared, child.page(1));
            assertEquals(1, cache.refCount(shared));
            assertEquals(parent.page(0), child.page(0), "untouched pages stay shared");
            float[] row = new float[128];
            for (int pos = 0; pos < 12; pos++) {
                parent.decodeK(1, pos, 0, row, 0);
                assertTrue(Arrays.equals(parentRows[pos], row), "parent row " + pos + " intact");
                child.decodeK(1, pos, 0, row, 0);
                if (pos == 5) {
                    assertTrue(!Arrays.equals(parentRows[pos], row), "child sees its own write");
                } else {
                    assertTrue(Arrays.equals(parentRows[pos], row), "child row " + pos + " copied with the page");
                }
            }
            // The parent now writes into page 0, still shared: it copies, the child keeps the old rows.
            int page0 = parent.page(0);
            parent.write(2, 0, tokens(rnd, 1, 2, 128), 0, tokens(rnd, 1, 2, 64), 0);
            assertNotEquals(page0, parent.page(0));
            assertEquals(page0, child.page(0));
            assertEquals(1, cache.refCount(page0));
        }
    }

    @Test
    void truncateFreesPagesPastTheLength() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        try (KvCache cache = new KvCache(GEOMETRY, HalfFormat.BF16, HalfFormat.F16, 4, 8)) {
            KvSequence s = cache.newSequence();
            writeAllLayers(s, 0, 14, tokens(rnd, 14, 2, 128), tokens(rnd, 14, 2, 64));
            assertEquals(4, s.pageCount());
            s.truncate(5);
            assertEquals(5, s.length());
            assertEquals(2, s.pageCount());
            assertEquals(6, cache.freePages());
            assertThrows(IllegalArgumentException.class, () -> s.truncate(6));
            s.truncate(0);
            assertEquals(8, cache.freePages());
            s.close();
            assertThrows(IllegalStateException.class, () -> s.reserve(1));
        }
    }

    /**
     * Random alloc/free/share/truncate/write sequences: at every step each page's reference count equals the
     * number of page tables holding it, free + used = total, and closing everything frees every page.
     */
    @Test
    void pageOwnershipInvariantsHoldUnderRandomOperations() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        KvGeometry g = new KvGeometry(2, 1, 64, 64);
        float[] k = tokens(rnd, 16, 1, 64);
        float[] v = tokens(rnd, 16, 1, 64);
        for (int round = 0; round < 4; round++) {
            int pageTokens = 1 + rnd.nextInt(6);
            try (KvCache cache = new KvCache(g, TurboFormat.TURBO2, Q4Format.Q4_0, pageTokens, 12)) {
                List<KvSequence> live = new ArrayList<>();
                int fullErrors = 0;
                for (int step = 0; step < 400; step++) {
                    String op;
                    int choice = rnd.nextInt(10);
                    KvSequence s = live.isEmpty() ? null : live.get(rnd.nextInt(live.size()));
                    try {
                        if (s == null || choice == 0) {
                            op = "new";
                            live.add(cache.newSequence());
                        } else if (choice <= 3) {
                            int n = 1 + rnd.nextInt(16);
                            int layer = rnd.nextInt(2);
                            int pos = rnd.nextInt(s.layerLength(layer) + 1);   // no gaps: rows go in order
                            op = "write " + n + " at " + pos;
                            s.writeRows(layer, pos, n, k, 0, v, 0);
                        } else if (choice == 4) {
                            op = "reserve";
                            s.reserve(s.length() + rnd.nextInt(10));
                        } else if (choice <= 6) {
                            op = "fork";
                            live.add(cache.fork(s, rnd.nextInt(s.length() + 1)));
                        } else if (choice == 7) {
                            op = "truncate";
                            s.truncate(rnd.nextInt(s.length() + 1));
                        } else {
                            op = "close";
                            s.close();
                            live.remove(s);
                        }
                    } catch (KvCacheFullException e) {
                        op = "full";
                        fullErrors++;
                    }
                    checkOwnership(cache, live, "seed " + seed + " round " + round + " step " + step + " (" + op + ")");
                }
                assertTrue(fullErrors > 0, "seed " + seed + ": the random walk reached a full cache");
                for (KvSequence s : live) {
                    s.close();
                }
                assertEquals(cache.totalPages(), cache.freePages(), "seed " + seed + ": all pages free after closing");
            }
        }
    }

    private static void checkOwnership(KvCache cache, List<KvSequence> live, String where) {
        Map<Integer, Integer> holders = new HashMap<>();
        for (KvSequence s : live) {
            int[] t = table(s);
            if (t.length != (s.length() + cache.pageTokens() - 1) / cache.pageTokens() && t.length * cache.pageTokens() < s.length()) {
                fail(where + ": a sequence of " + s.length() + " tokens has only " + t.length + " pages");
            }
            for (int p : t) {
                holders.merge(p, 1, Integer::sum);
            }
        }
        int used = 0;
        for (int p = 0; p < cache.totalPages(); p++) {
            int expected = holders.getOrDefault(p, 0);
            assertEquals(expected, cache.refCount(p), where + ": reference count of page " + p);
            if (expected > 0) {
                used++;
            }
        }
        assertEquals(cache.totalPages(), cache.freePages() + used, where + ": free + used");
    }
}
