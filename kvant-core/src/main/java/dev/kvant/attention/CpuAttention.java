package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvSequence;
import dev.kvant.select.Selection;
import dev.kvant.tensor.Parallel;

/**
 * Causal attention of consecutive queries of one sequence over its compressed KV cache, on the CPU. The cache is
 * read as it is stored: rows are decoded a tile of {@value #DENSE_TILE} positions (through a selection: {@value
 * #TILE}) at a time into thread-local floats (the only uncompressed copy) and used at once.
 *
 * <p>Every query is computed the same way, whichever entry point runs it: the positions it sees are cut into
 * partitions of {@value #PARTITION} (a constant of the algorithm, never of the machine), each partition gives a
 * softmax partial (max, sum, unnormalized weighted sum of V rows), and the partials are merged in ascending order
 * ({@link Softmax#merge}). The entry points only schedule that work differently:
 * <ul>
 * <li>{@link #decode}: split-K. Tasks are (partition, group of kv heads), each serving all queries of its GQA
 *     groups (and all n tokens, for multi-query verification), writing partials; a second step merges them per kv
 *     head.</li>
 * <li>{@link #prefill}: tasks are (kv head, block of tokens), each walking the partitions in order and merging as
 *     it goes, so no partials are stored; K and V tiles are decoded once per block of about 64 query rows.</li>
 * </ul>
 * So the output of a query is bit for bit the same from decode, multi-query or prefill, whatever the prompt is cut
 * into and whatever the thread count: no sum depends on thread, tile or batch.
 *
 * <p>Selected (sparse) attention: given a {@link Selection}, each query attends only to the blocks its query
 * block's list holds for its kv head. The work keeps the dense structure (same partitions, tiles, order of sums and
 * merges); unselected tiles are skipped and weigh exactly 0, so a selection of every block gives the dense bits.
 *
 * <p>Rotated formats: the query is rotated into K's domain once (⟨Rq, Rk⟩ = ⟨q, k⟩), keys are never de-rotated,
 * and the output is rotated out of V's domain once per head.
 */
public final class CpuAttention {

    /** Positions per split-K partition. 1024: 2 MB of partials for 128K positions × 32 heads, few tasks' overhead. */
    public static final int PARTITION = 1024;
    /**
     * Positions per decoded K or V tile through a selection (times the task's kv heads): the finest selection block,
     * so that a tile is wanted or not as a whole.
     */
    static final int TILE = 16;
    /**
     * Positions per decoded K or V tile of dense attention (times the task's kv heads: with 8 heads of 128, 256 KB,
     * in L2). Each tile pays per kv head for a scores call and a weighted-sum call that load and store their
     * accumulators: 64 rows spread that over four times the rows of 16, and ran decode 9-11% faster at 32K
     * (docs/BENCHMARKS.md). Which tile a row is in changes no result.
     */
    static final int DENSE_TILE = 64;
    /** Up to this many tokens per call run split-K (decode, speculative verification); more run as prefill. */
    public static final int MAX_MULTI_QUERY = 8;
    /**
     * Query rows (tokens × group) per prefill task: enough to amortize a tile's decode over many queries, few enough
     * that a task's scores (heads × {@value #PARTITION} × rows floats) stay near L2. 128 rather than 64: prefill of
     * 512 tokens after 4K, llama3-8b geometry, 9% faster over f16 (docs/BENCHMARKS.md).
     */
    static final int PREFILL_QUERY_ROWS = 128;

    private CpuAttention() {
    }

    /** {@link #attend(KvSequence, int, float[], int, int, int, float, AttentionOptions, float[], Parallel)} with defaults. */
    public static void attend(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                              float[] out, Parallel pool) {
        attend(seq, layer, q, n, start, heads, scale, AttentionOptions.defaults(), out, pool);
    }

    /**
     * Attention of n consecutive tokens at positions start .. start+n-1, query t seeing positions 0 .. start+t;
     * their keys and values must already be in the cache. Runs {@link #decode} for n ≤ {@value #MAX_MULTI_QUERY},
     * else {@link #prefill}; both give the same bits.
     *
     * @param q     queries [n][heads][headDimK], unrotated (not modified)
     * @param scale softmax scale, usually 1/sqrt(headDimK)
     * @param out   outputs [n][heads][headDimV]
     */
    public static void attend(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                              AttentionOptions opts, float[] out, Parallel pool) {
        if (n <= MAX_MULTI_QUERY) {
            decode(seq, layer, q, n, start, heads, scale, opts, out, pool);
        } else {
            prefill(seq, layer, q, n, start, heads, scale, opts, out, pool);
        }
    }

    /**
     * {@link #attend} through a selection (null, or one that holds every block: dense). The selection must be
     * for these n queries at start, for this cache's kv heads.
     */
    public static void attend(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                              AttentionOptions opts, Selection sel, float[] out, Parallel pool) {
        if (n <= MAX_MULTI_QUERY) {
            decode(seq, layer, q, n, start, heads, scale, opts, sel, out, pool);
        } else {
            prefill(seq, layer, q, n, start, heads, scale, opts, sel, out, pool);
        }
    }

    /**
     * Split-K attention: tasks over (partition, group of kv heads), then a merge per kv head. Meant for 1 to 8
     * tokens.
     */
    public static void decode(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                              AttentionOptions opts, float[] out, Parallel pool) {
        decode(seq, layer, q, n, start, heads, scale, opts, null, out, pool);
    }

    /** {@link #decode} through a selection (null: dense); more than one query block runs as {@link #prefill}. */
    public static void decode(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                              AttentionOptions opts, Selection sel, float[] out, Parallel pool) {
        if (sel != null && !sel.all() && sel.queryBlocks() > 1) {
            prefill(seq, layer, q, n, start, heads, scale, opts, sel, out, pool);
            return;
        }
        AttentionCall c = setUp(seq, layer, q, n, start, heads, scale, opts, sel, out, pool);
        int kvHeads = c.kvHeads;
        int parts = (start + n + PARTITION - 1) / PARTITION;
        int slots = (n * c.group + 3) & ~3;
        c.partials(parts, slots);
        int split = headSplit(kvHeads, parts, pool.threads());
        int perTask = kvHeads / split;
        pool.forEach(parts * split, task -> {
            int p = task / split;
            int g0 = task % split * perTask;
            if (c.selection == null) {
                PartitionWorker.get().partition(c, p, g0, perTask, 0, n, c.partMax, c.partSum, c.partAcc,
                        (g0 * parts + p) * slots, parts * slots);
            } else {
                PartitionWorker.get().partitionSelected(c, 0, p, g0, perTask, 0, n, c.partMax, c.partSum,
                        c.partAcc, (g0 * parts + p) * slots, parts * slots);
            }
        });
        pool.forEach(kvHeads, g -> PartitionWorker.get().mergeSplit(c, g, out));
    }

    /**
     * How many groups to cut the kv heads into: as few as give every thread about two tasks. A task reads its
     * heads' rows of a position together (they are adjacent in the cache), so fewer, wider tasks read memory more
     * sequentially; which heads a task serves does not change any result.
     */
    static int headSplit(int kvHeads, int parts, int threads) {
        int want = threads == 1 ? 1 : 2 * threads;
        for (int d = 1; d <= kvHeads; d++) {
            if (kvHeads % d == 0 && parts * d >= want) {
                return d;
            }
        }
        return kvHeads;
    }

    /** Attention by blocks of tokens, each walking its partitions in order: for prompts. */
    public static void prefill(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                               AttentionOptions opts, float[] out, Parallel pool) {
        prefill(seq, layer, q, n, start, heads, scale, opts, null, out, pool);
    }

    /**
     * {@link #prefill} through a selection (null: dense). A task's tokens then lie in one query block of the
     * selection: the block size is cut to a power of two up to {@value Selection#QUERY_BLOCK}, which changes no
     * result (no sum depends on the blocking).
     */
    public static void prefill(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                               AttentionOptions opts, Selection sel, float[] out, Parallel pool) {
        AttentionCall c = setUp(seq, layer, q, n, start, heads, scale, opts, sel, out, pool);
        int kvHeads = c.kvHeads;
        int dense = Math.max(1, Math.min(n, PREFILL_QUERY_ROWS / c.group));
        int tokens = c.selection == null ? dense : Integer.highestOneBit(Math.min(dense, Selection.QUERY_BLOCK));
        int blocks = (n + tokens - 1) / tokens;
        int perTask = prefillHeads(kvHeads, blocks, pool.threads());
        int groups = kvHeads / perTask;
        // Later blocks see more positions: hand them out first so the short ones fill the gaps at the end.
        pool.forEach(groups * blocks, task -> {
            int g0 = task % groups * perTask;
            int b = blocks - 1 - task / groups;
            int t0 = b * tokens;
            PartitionWorker.get().prefillBlock(c, g0, perTask, t0, Math.min(tokens, n - t0), out);
        });
    }

    /**
     * kv heads per prefill task: 2 when that still leaves every thread two tasks, else 1. Two heads are adjacent in
     * the cache, so a task reads (and stages) a contiguous run per position instead of striding over the other head;
     * more would grow the per-task scores (heads × {@value #PARTITION} × {@value #PREFILL_QUERY_ROWS} floats) past
     * L2.
     */
    static int prefillHeads(int kvHeads, int blocks, int threads) {
        return kvHeads % 2 == 0 && blocks * (kvHeads / 2) >= 2 * threads ? 2 : 1;
    }

    private static AttentionCall setUp(KvSequence seq, int layer, float[] q, int n, int start, int heads,
                                       float scale, AttentionOptions opts, Selection sel, float[] out,
                                       Parallel pool) {
        KvCache cache = seq.cache();
        int kvHeads = cache.geometry().kvHeads();
        if (n < 1 || start < 0) {
            throw new IllegalArgumentException("attention of " + n + " tokens at position " + start);
        }
        if (heads < kvHeads || heads % kvHeads != 0) {
            throw new IllegalArgumentException(heads + " query heads cannot share " + kvHeads
                    + " kv heads: the query head count must be a multiple of the kv head count");
        }
        if (start + n > seq.layerLength(layer)) {   // a layer's own rows: another layer may be written further
            throw new IllegalArgumentException("attention for positions " + start + ".." + (start + n - 1)
                    + " but layer " + layer + " holds keys and values for " + seq.layerLength(layer) + " positions");
        }
        int dK = cache.geometry().headDimK();
        int dV = cache.geometry().headDimV();
        if (q.length < n * heads * dK || out.length < n * heads * dV) {
            throw new IllegalArgumentException("attention buffers too small: q has " + q.length + " floats, needs "
                    + n * heads * dK + "; out has " + out.length + ", needs " + n * heads * dV);
        }
        if (sel != null) {
            checkSelection(sel, n, start, kvHeads);
        }
        AttentionCall c = AttentionCall.get();
        c.set(seq, layer, n, start, heads, opts);
        c.selection = sel == null || sel.all() ? null : sel;
        if (n * heads <= 64) {
            for (int t = 0; t < n; t++) {
                PartitionWorker.get().prepareQueries(c, q, t, scale);
            }
        } else {
            pool.forEach(n, t -> PartitionWorker.get().prepareQueries(c, q, t, scale));
        }
        return c;
    }

    private static void checkSelection(Selection sel, int n, int start, int kvHeads) {
        if (sel.start() != start || sel.n() != n || sel.kvHeads() != kvHeads) {
            throw new IllegalArgumentException("selection made for " + sel.n() + " queries at " + sel.start() + " over "
                    + sel.kvHeads() + " kv heads, used for " + n + " queries at " + start + " over " + kvHeads);
        }
        int bt = sel.blockTokens();
        if (bt % TILE != 0 || PARTITION % bt != 0) {
            throw new IllegalArgumentException("selection blocks of " + bt + " tokens: attention needs whole tiles of "
                    + TILE + " inside one partition of " + PARTITION);
        }
        sel.check();
    }
}
