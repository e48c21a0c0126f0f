package dev.kvant.cuda.attention;

/**
 * The capacity a {@link CudaAttention} is built for; its scratch (split partials) is allocated once from it, so
 * launches never allocate and a captured decode graph keeps its addresses.
 *
 * @param maxSeqs        sequences in one decode launch
 * @param maxQueries     queries per sequence in one decode launch (1 for plain decode, up to 8)
 * @param maxTokens      cached tokens of the longest sequence a decode may see
 * @param splitTokens    the smallest decode split (a multiple of 16): a sequence of len tokens is cut into splits of
 *                       {@link #splitFor}(len, maxSplits) tokens, the fewest whole 16-token tiles, at least this
 *                       many tokens, that make at most {@link #maxSplits(int)} splits. A function of the plan, the
 *                       length and the kernel's layout, not of the device, so results do not depend on the GPU's
 *                       size; and a short sequence in a plan for long ones is still cut into many splits
 * @param maxPrefill     queries in one prefill launch (0: no prefill; prefill needs no scratch, this only bounds n)
 */
public record AttentionPlan(int maxSeqs, int maxQueries, int maxTokens, int splitTokens, int maxPrefill) {
    /** Queries per sequence the multi-query decode takes. */
    public static final int MAX_QUERIES = 8;
    /** Splits one merge takes (attention.cu MERGE_MAX_SPLITS). */
    public static final int MAX_SPLITS = 4096;

    public AttentionPlan {
        if (maxSeqs < 1 || maxQueries < 1 || maxQueries > MAX_QUERIES || maxTokens < 1 || maxPrefill < 0) {
            throw new IllegalArgumentException("attention plan needs maxSeqs >= 1, 1 <= maxQueries <= " + MAX_QUERIES
                    + ", maxTokens >= 1, maxPrefill >= 0; got " + maxSeqs + ", " + maxQueries + ", " + maxTokens + ", "
                    + maxPrefill);
        }
        if (splitTokens < 16 || splitTokens % 16 != 0) {
            throw new IllegalArgumentException("decode splits are whole 16-token tiles, got splitTokens=" + splitTokens);
        }
    }

    /**
     * Splits a decode aims at for each decode block an SM holds (its layout's shared memory allows one or two): with
     * the H200's 132 SMs, one sequence's splits then fill the GPU in one wave. A constant rather than the device's
     * SM count, so results do not depend on the GPU's size.
     */
    public static final int SPLITS_PER_BLOCK = 128;
    /** The most splits a decode launch takes (two decode blocks an SM); the scratch is sized for it. */
    public static final int TARGET_SPLITS = 2 * SPLITS_PER_BLOCK;
    /**
     * The smallest split of {@link #of}: one 16-token tile, so a short sequence (up to a few thousand tokens) spreads
     * over as many blocks as it has tiles, each paying its prologue and one tile rather than two in turn.
     */
    public static final int MIN_SPLIT = 16;

    /** A plan whose splits start at {@value #MIN_SPLIT} tokens. */
    public static AttentionPlan of(int maxSeqs, int maxQueries, int maxTokens, int maxPrefill) {
        return new AttentionPlan(maxSeqs, maxQueries, maxTokens, MIN_SPLIT, maxPrefill);
    }

    /**
     * The scratch's splits: {@value #TARGET_SPLITS} (so the partials, heads x (dV + 2) floats per split, about 17 KB
     * for llama3-8b, stay small next to the cache bytes a split reads), fewer when the plan's tokens need fewer.
     */
    public int maxSplits() {
        return maxSplits(2);
    }

    /**
     * The decode grid's x extent for a decode kernel of {@code blocksPerSm} blocks an SM (1 or 2): {@value
     * #SPLITS_PER_BLOCK} splits a block, fewer when the plan's tokens need fewer.
     */
    public int maxSplits(int blocksPerSm) {
        if (blocksPerSm < 1 || blocksPerSm > 2) {
            throw new IllegalArgumentException("decode blocks an SM are 1 or 2, got " + blocksPerSm);
        }
        return (int) Math.min((long) SPLITS_PER_BLOCK * blocksPerSm, ((long) maxTokens + splitTokens - 1) / splitTokens);
    }

    /** The split of a decode over len tokens in at most {@code maxSplits} splits (attention.cu split_for). */
    public int splitFor(int len, int maxSplits) {
        int tiles = ((len + maxSplits - 1) / maxSplits + 15) / 16;
        return Math.max(splitTokens, 16 * tiles);
    }
}
