package dev.kvant.cuda.attention;

/**
 * The capacity a {@link CudaAttention} is built for; its scratch (split partials) is allocated once from it, so
 * launches never allocate and a captured decode graph keeps its addresses.
 *
 * @param maxSeqs        sequences in one decode launch
 * @param maxQueries     queries per sequence in one decode launch (1 for plain decode, up to 8)
 * @param maxTokens      cached tokens of the longest sequence a decode may see
 * @param splitTokens    tokens per decode split (a multiple of 16): the partition of the split-K reduction. It is a
 *                       constant of the plan, not of the device, so results do not depend on the GPU's size
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
        if (((long) maxTokens + splitTokens - 1) / splitTokens > MAX_SPLITS) {
            throw new IllegalArgumentException(maxTokens + " tokens in splits of " + splitTokens + " make more than "
                    + MAX_SPLITS + " splits, the most one merge takes; use splits of at least "
                    + ((maxTokens + MAX_SPLITS - 1) / MAX_SPLITS) + " tokens");
        }
    }

    /** A plan with the default split for maxTokens. */
    public static AttentionPlan of(int maxSeqs, int maxQueries, int maxTokens, int maxPrefill) {
        return new AttentionPlan(maxSeqs, maxQueries, maxTokens, defaultSplit(maxTokens), maxPrefill);
    }

    /**
     * About 256 splits at maxTokens (a power of two between 32 and 4096 tokens): with the H200's 132 SMs and two
     * decode blocks per SM, one sequence's splits fill the GPU in one wave, and the partials (heads x (dV + 2)
     * floats per split, about 17 KB for llama3-8b) stay small next to the cache bytes a split reads.
     */
    public static int defaultSplit(int maxTokens) {
        int target = Math.max(1, (maxTokens + 255) / 256);
        int split = Integer.highestOneBit(target);
        if (split < target) {
            split <<= 1;
        }
        return Math.clamp(split, 32, 4096);
    }

    /** Splits of the longest sequence: the decode grid's x extent. */
    public int maxSplits() {
        return (int) (((long) maxTokens + splitTokens - 1) / splitTokens);
    }
}
