package dev.kvant.cuda.attention;

/**
 * The capacity a {@link CudaAttention} is built for; its scratch (split partials) is allocated once from it, so
 * launches never allocate and a captured decode graph keeps its addresses.
 *
 * @param maxSeqs        sequences in one decode launch
 * @param maxQueries     queries per sequence in one decode launch (1 for plain decode, up to 8)
 * @param maxTokens      cached tokens of the longest sequence a decode may see
 * @param splitTokens    the smallest decode split (a multiple of 16): a sequence of len tokens is cut into splits of
 *                       {@link #splitFor}(len) tokens, the smallest power-of-two multiple of this that makes at most
 *                       {@link #maxSplits()} splits. A function of the plan and the length, not of the device, so
 *                       results do not depend on the GPU's size; and a short sequence in a plan for long ones is
 *                       still cut into many splits
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

    /** Splits a decode aims at: with the H200's 132 SMs and two decode blocks per SM, one wave. */
    public static final int TARGET_SPLITS = 256;
    /** The smallest split of {@link #of}. */
    public static final int MIN_SPLIT = 32;

    /** A plan whose splits start at 32 tokens. */
    public static AttentionPlan of(int maxSeqs, int maxQueries, int maxTokens, int maxPrefill) {
        return new AttentionPlan(maxSeqs, maxQueries, maxTokens, MIN_SPLIT, maxPrefill);
    }

    /**
     * The decode grid's x extent: {@value #TARGET_SPLITS} splits (so one sequence's splits fill the GPU in one
     * wave, and the partials, heads x (dV + 2) floats per split, about 17 KB for llama3-8b, stay small next to the
     * cache bytes a split reads), fewer when the plan's tokens need fewer.
     */
    public int maxSplits() {
        return (int) Math.min(TARGET_SPLITS, ((long) maxTokens + splitTokens - 1) / splitTokens);
    }

    /** The split of a decode over len tokens (attention.cu split_for): see {@code splitTokens}. */
    public int splitFor(int len) {
        int s = splitTokens;
        while ((len + s - 1) / s > maxSplits()) {
            s <<= 1;
        }
        return s;
    }
}
