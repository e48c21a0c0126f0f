package dev.kvant.select;

import java.util.Arrays;

/**
 * Which blocks of the cache the queries of one attention call attend to: for every query block (the call's tokens
 * cut into runs of {@value #QUERY_BLOCK} from its first) and every kv head, an ascending list of block indices
 * (block b = positions [b·blockTokens, (b+1)·blockTokens)).
 *
 * <p>Layout, the one a GPU kernel consumes as it is: {@code blocks[(qb·kvHeads + g)·stride + i]} for
 * {@code i < counts[qb·kvHeads + g]}, stride = blocks visible to the call ({@link #stride()}), so one (query block,
 * kv head) list is a contiguous run and the whole selection two int arrays. A list always holds the blocks of its
 * own queries' positions (a query never sees only unselected rows), is strictly ascending and below
 * {@link #stride()}. Causality still applies inside selected blocks.
 *
 * <p>Reused from call to call: {@link #reset} resizes without shrinking, so a decode step allocates nothing.
 */
public final class Selection {
    /** Tokens per query block: one attention tile of positions, so decode (n ≤ 8) always has one block. */
    public static final int QUERY_BLOCK = 16;

    private int blockTokens;
    private int kvHeads;
    private int start;
    private int n;
    private int queryBlocks;
    private int stride;
    private int[] blocks = new int[0];
    private int[] counts = new int[0];
    private boolean all;

    /** Sizes the selection for n queries at positions start .. start+n-1, every list empty. */
    public void reset(int blockTokens, int kvHeads, int start, int n) {
        if (blockTokens < 1 || kvHeads < 1 || start < 0 || n < 1) {
            throw new IllegalArgumentException("selection of " + n + " queries at " + start + " over blocks of "
                    + blockTokens + " for " + kvHeads + " kv heads");
        }
        this.blockTokens = blockTokens;
        this.kvHeads = kvHeads;
        this.start = start;
        this.n = n;
        this.queryBlocks = (n + QUERY_BLOCK - 1) / QUERY_BLOCK;
        this.stride = (start + n + blockTokens - 1) / blockTokens;
        long need = (long) queryBlocks * kvHeads * stride;
        if (need > Integer.MAX_VALUE - 16) {
            throw new IllegalArgumentException("a selection of " + need + " entries does not fit in an array");
        }
        if (blocks.length < need) {
            blocks = new int[(int) need];
        }
        if (counts.length < queryBlocks * kvHeads) {
            counts = new int[queryBlocks * kvHeads];
        }
        Arrays.fill(counts, 0, queryBlocks * kvHeads, 0);
        all = false;
    }

    /**
     * A selection from explicit lists: lists[qb][g] = ascending block indices. For tests and replays; {@link #all}
     * stays false even when the lists are full, so attention runs its selected path on them.
     */
    public static Selection of(int blockTokens, int start, int n, int[][][] lists) {
        Selection s = new Selection();
        s.reset(blockTokens, lists[0].length, start, n);
        if (lists.length != s.queryBlocks) {
            throw new IllegalArgumentException(n + " queries make " + s.queryBlocks + " query blocks, not "
                    + lists.length);
        }
        for (int qb = 0; qb < lists.length; qb++) {
            for (int g = 0; g < s.kvHeads; g++) {
                int[] l = lists[qb][g];
                if (l.length > s.stride) {
                    throw new IllegalArgumentException("query block " + qb + ", kv head " + g + " lists " + l.length
                            + " blocks but only " + s.stride + " are visible");
                }
                System.arraycopy(l, 0, s.blocks, s.offset(qb, g), l.length);
                s.counts[qb * s.kvHeads + g] = l.length;
            }
        }
        s.check();
        return s;
    }

    /** Every block for every query block: the selection that equals dense attention. */
    public void selectAll() {
        for (int qb = 0; qb < queryBlocks; qb++) {
            for (int g = 0; g < kvHeads; g++) {
                int o = offset(qb, g);
                for (int b = 0; b < stride; b++) {
                    blocks[o + b] = b;
                }
                counts[qb * kvHeads + g] = stride;
            }
        }
        all = true;
    }

    void setCount(int qb, int g, int count) {
        counts[qb * kvHeads + g] = count;
    }

    void setAll(boolean all) {
        this.all = all;
    }

    public int blockTokens() {
        return blockTokens;
    }

    public int kvHeads() {
        return kvHeads;
    }

    /** Position of the call's first query. */
    public int start() {
        return start;
    }

    /** Queries (tokens) of the call. */
    public int n() {
        return n;
    }

    public int queryBlocks() {
        return queryBlocks;
    }

    /** Capacity of one list: the blocks visible to the call's last query, ceil((start + n) / blockTokens). */
    public int stride() {
        return stride;
    }

    /**
     * True when the selector found every list full, so attention may take its dense path (same bits, no masks). A
     * hint: false does not promise some list is short.
     */
    public boolean all() {
        return all;
    }

    /** The block lists (layout in the class comment); read-only for callers. */
    public int[] blocks() {
        return blocks;
    }

    /** The list lengths, per (query block, kv head); read-only for callers. */
    public int[] counts() {
        return counts;
    }

    public int offset(int qb, int g) {
        return (qb * kvHeads + g) * stride;
    }

    public int count(int qb, int g) {
        return counts[qb * kvHeads + g];
    }

    /** Tokens attended by one list (whole blocks, cut at the last query's position). */
    public int tokens(int qb, int g) {
        int o = offset(qb, g);
        int c = count(qb, g);
        int last = start + Math.min(n, (qb + 1) * QUERY_BLOCK);
        int t = 0;
        for (int i = 0; i < c; i++) {
            int b = blocks[o + i];
            t += Math.max(0, Math.min(blockTokens, last - b * blockTokens));
        }
        return t;
    }

    /** Index in the list of (qb, g) of its first block ≥ block (the list's count when there is none). */
    public int firstAtOrAfter(int qb, int g, int block) {
        int o = offset(qb, g);
        int lo = 0;
        int hi = count(qb, g);
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (blocks[o + mid] < block) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    public boolean contains(int qb, int g, int block) {
        int i = firstAtOrAfter(qb, g, block);
        return i < count(qb, g) && blocks[offset(qb, g) + i] == block;
    }

    /**
     * Checks the invariants of the class comment, naming the first list that breaks one: attention through a list
     * without its queries' own blocks would divide by a sum of nothing.
     */
    public void check() {
        for (int qb = 0; qb < queryBlocks; qb++) {
            for (int g = 0; g < kvHeads; g++) {
                checkList(blocks, offset(qb, g), count(qb, g), stride, blockTokens, start + qb * QUERY_BLOCK,
                        start + Math.min(n, (qb + 1) * QUERY_BLOCK) - 1, qb, g);
            }
        }
    }

    /**
     * Checks the lists (one per kv head) of one query block of {@code tokens} queries at {@code start}, as the only
     * query block of a call ({@link #check}'s rules), without building the selection: a replayed record is checked
     * where it is read, without the stride-sized arrays a selection of a late position takes.
     */
    static void checkQueryBlock(int blockTokens, int start, int tokens, int[][] lists) {
        if (tokens < 1 || tokens > QUERY_BLOCK) {
            throw new IllegalArgumentException("a query block holds 1.." + QUERY_BLOCK + " queries, not " + tokens);
        }
        int stride = (int) (((long) start + tokens + blockTokens - 1) / blockTokens);
        for (int g = 0; g < lists.length; g++) {
            checkList(lists[g], 0, lists[g].length, stride, blockTokens, start, start + tokens - 1, 0, g);
        }
    }

    /** List a[o, o+count) of (qb, g), queries at positions t0..t1: strictly ascending below stride, own blocks in. */
    private static void checkList(int[] a, int o, int count, int stride, int blockTokens, int t0, int t1, int qb,
                                  int g) {
        for (int i = 0; i < count; i++) {
            int b = a[o + i];
            if (b < 0 || b >= stride || i > 0 && b <= a[o + i - 1]) {
                throw new IllegalArgumentException("selection list of query block " + qb + ", kv head " + g
                        + " is not strictly ascending within [0, " + stride + "): entry " + i + " is " + b);
            }
        }
        for (int b = t0 / blockTokens; b <= t1 / blockTokens; b++) {
            if (Arrays.binarySearch(a, o, o + count, b) < 0) {
                throw new IllegalArgumentException("selection list of query block " + qb + ", kv head " + g
                        + " lacks block " + b + ", which holds its own queries' positions " + t0 + ".." + t1);
            }
        }
    }
}
