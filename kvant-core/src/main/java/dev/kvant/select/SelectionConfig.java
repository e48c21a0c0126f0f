package dev.kvant.select;

/**
 * The settings of query-aware page selection ({@code --select topk ...}).
 *
 * @param budget      tokens attended per query block and kv head, sink and recent windows included; whatever the
 *                    windows leave goes to the highest-scoring blocks (so about budget tokens whatever the context).
 *                    Counted in whole blocks: it must hold the windows' blocks (each rounded up) and two more, the
 *                    queries' own and one chosen, or the own two of a query block straddling a block edge
 * @param blockTokens positions per selection block (the granule of key summaries and of the selection): a power of
 *                    two from 16 (the attention tile) to 1024 (the attention partition), so a block is whole tiles
 *                    of one partition
 * @param sink        the first positions, always attended
 * @param recent      positions before the queries' own block, always attended (the queries' block is always)
 * @param denseLayers the first layers attend densely: their attention is broad and cheap to get wrong
 * @param coarseTokens 0, or positions per coarse block (a power of two, at least two blocks): blocks are then
 *                    chosen in two rounds — the {@code coarseKeep} coarse blocks with the highest bounds (from
 *                    summaries over the whole coarse block), then the best blocks inside them — so a step reads
 *                    summaries in proportion to context / coarseTokens + coarseKeep · coarseTokens / blockTokens
 *                    instead of context / blockTokens. The same choice as one round when the coarse candidates
 *                    are no more than coarseKeep
 * @param coarseKeep  coarse blocks whose blocks compete (0 with coarseTokens 0); one more where a recent window
 *                    shorter than a coarse block cuts one that reaches the queries' rows (PageTopK)
 */
public record SelectionConfig(int budget, int blockTokens, int sink, int recent, int denseLayers, int coarseTokens,
                              int coarseKeep) {
    public static final int DEFAULT_BUDGET = 2048;
    public static final int DEFAULT_BLOCK = 16;
    public static final int DEFAULT_SINK = 64;
    public static final int DEFAULT_RECENT = 256;
    public static final int DEFAULT_DENSE_LAYERS = 2;

    public SelectionConfig {
        if (budget < 1) {
            throw new IllegalArgumentException("--select-budget must be at least 1 token, got " + budget);
        }
        if (blockTokens < 16 || blockTokens > 1024 || Integer.bitCount(blockTokens) != 1) {
            throw new IllegalArgumentException("--select-page must be a power of two from 16 to 1024 (whole attention"
                    + " tiles of one partition), got " + blockTokens);
        }
        if (sink < 0 || recent < 0) {
            throw new IllegalArgumentException("--select-sink and --select-recent must be >= 0, got " + sink + " and "
                    + recent);
        }
        if (denseLayers < 0) {
            throw new IllegalArgumentException("--select-dense-layers must be >= 0, got " + denseLayers);
        }
        if (coarseTokens != 0 && (coarseTokens < 2 * blockTokens || Integer.bitCount(coarseTokens) != 1
                || coarseTokens > 256 * blockTokens)) {
            throw new IllegalArgumentException("--select-coarse must be 0 or a power of two from two to 256 pages ("
                    + 2 * blockTokens + ".." + 256 * blockTokens + " tokens here), got " + coarseTokens);
        }
        if (coarseTokens == 0 ? coarseKeep != 0 : coarseKeep < 1 || coarseKeep > 1 << 16) {
            throw new IllegalArgumentException("--select-coarse-keep must be 1.." + (1 << 16) + " with --select-coarse"
                    + " (and unused without), got " + coarseKeep);
        }
        // PageTopK counts in whole blocks: it always attends the sink's and the recent window's blocks (each rounded
        // up) and the queries' own, two where a query block of 16 straddles a block edge, and fills the rest of
        // budget / blockTokens. A budget without room for that plus one chosen block was exceeded by the windows,
        // and at decode the choice never ran (budget 2048 with pages of 1024 attended up to 3072 tokens).
        long least = leastBudget(blockTokens, sink, recent) / blockTokens;
        if (budget / blockTokens < least) {
            throw new IllegalArgumentException("--select-budget " + budget + " is " + budget / blockTokens
                    + " pages of --select-page " + blockTokens + ", too few for the pages always attended and one"
                    + " chosen: --select-sink " + sink + " (" + windowBlocks(sink, blockTokens) + ") + --select-recent "
                    + recent + " (" + windowBlocks(recent, blockTokens) + ") + the queries' own page and one chosen"
                    + " (or a second own page where 16 queries straddle a page edge) = " + least + " pages, a budget"
                    + " of at least " + least * blockTokens + " tokens (lower the windows or the page for a smaller"
                    + " budget)");
        }
    }

    /**
     * The smallest budget PageTopK honours with these windows, in tokens: their blocks (each rounded up) and two more,
     * the queries' own and one chosen at decode, or the two own blocks of a query block straddling a block edge.
     */
    public static long leastBudget(int blockTokens, int sink, int recent) {
        return ((long) windowBlocks(sink, blockTokens) + windowBlocks(recent, blockTokens) + 2) * blockTokens;
    }

    /** One-round selection: no coarse level. */
    public SelectionConfig(int budget, int blockTokens, int sink, int recent, int denseLayers) {
        this(budget, blockTokens, sink, recent, denseLayers, 0, 0);
    }

    /** With a coarse level of coarseTokens and the default keep ({@link #defaultCoarseKeep}). */
    public SelectionConfig withCoarse(int coarseTokens) {
        return coarseTokens == 0 ? new SelectionConfig(budget, blockTokens, sink, recent, denseLayers)
                : new SelectionConfig(budget, blockTokens, sink, recent, denseLayers, coarseTokens,
                defaultCoarseKeep(budget, coarseTokens));
    }

    /**
     * Four times the coarse blocks the budget fills, and at least 32: a coarse bound (min and max over many rows) is
     * loose, so the kept set must be wide — on tinycode at 8K, keeping twice the budget's coarse blocks lost needle
     * probes that one round finds (docs/BENCHMARKS.md); 32 coarse blocks of 256 keep every block of an 8K context.
     */
    public static int defaultCoarseKeep(int budget, int coarseTokens) {
        long fills = Math.max(1, ((long) budget + coarseTokens - 1) / coarseTokens);
        // at most the largest keep taken: a keep that large keeps every candidate anyway
        return (int) Math.min(1 << 16, Math.max(32, 4 * fills));
    }

    /** Blocks per coarse block (0 without a coarse level). */
    public int coarseBlocks() {
        return coarseTokens / blockTokens;
    }

    /** The defaults with another budget. */
    public static SelectionConfig topK(int budget) {
        return new SelectionConfig(budget, DEFAULT_BLOCK, DEFAULT_SINK, DEFAULT_RECENT, DEFAULT_DENSE_LAYERS);
    }

    /** Blocks of the sink window: ceil(sink / blockTokens). */
    public int sinkBlocks() {
        return blocksOf(sink);
    }

    /** Blocks of the recent window before the queries' first block: ceil(recent / blockTokens). */
    public int recentBlocks() {
        return blocksOf(recent);
    }

    private int blocksOf(int tokens) {
        return windowBlocks(tokens, blockTokens);
    }

    /** ceil(tokens / blockTokens), without the int overflow of a window near 2^31 tokens. */
    private static int windowBlocks(int tokens, int blockTokens) {
        return (int) (((long) tokens + blockTokens - 1) / blockTokens);
    }

    @Override
    public String toString() {
        return "topk budget " + budget + ", page " + blockTokens + ", sink " + sink + ", recent " + recent
                + ", dense layers " + denseLayers + (coarseTokens == 0 ? "" : ", coarse " + coarseTokens + " keep "
                + coarseKeep);
    }
}
