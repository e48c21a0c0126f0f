package dev.kvant.attention;

/**
 * Choices that change what attention computes (not how fast).
 *
 * @param softCap logit soft-cap c: every scaled score s becomes {@code c·tanh(s/c)} before the softmax (Gemma 2
 *                uses 50); 0 turns it off
 * @param sparseV sparse-V threshold T: a value row is left out of a query's weighted sum when its softmax weight is
 *                certainly below T (see {@link CpuAttention}); 0 turns it off
 */
public record AttentionOptions(float softCap, float sparseV) {
    private static final AttentionOptions DEFAULTS = new AttentionOptions(0f, 0f);

    public AttentionOptions {
        if (!(softCap >= 0f) || Float.isInfinite(softCap)) {
            throw new IllegalArgumentException("logit soft-cap must be a finite number >= 0 (0 = off), got " + softCap);
        }
        if (!(sparseV >= 0f && sparseV < 1f)) {
            throw new IllegalArgumentException("--sparse-v threshold must be in [0, 1) (0 = off), got " + sparseV);
        }
    }

    /** No soft-cap, no sparse V: exact attention. */
    public static AttentionOptions defaults() {
        return DEFAULTS;
    }

    public AttentionOptions withSoftCap(float c) {
        return new AttentionOptions(c, sparseV);
    }

    public AttentionOptions withSparseV(float t) {
        return new AttentionOptions(softCap, t);
    }
}
