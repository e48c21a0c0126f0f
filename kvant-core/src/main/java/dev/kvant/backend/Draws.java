package dev.kvant.backend;

/**
 * How a decode step that draws where the model runs ({@link Backend#startDecodeDrawn}) chooses each sequence's
 * token: {@code temperature[i]} 0 takes row i's largest logit (the lowest id among equal ones), as {@link
 * Backend#startDecode(BackendSequence[], int[], float[])} with no logits does; above 0 it draws token t with
 * probability exp(l_t / T) / Σ exp(l / T) — the host sampler's distribution at that temperature with no other
 * filter — its randomness from {@code key[i]} alone: the same key and the same logits give the same token, in any
 * batch. The ids of {@code banned[i]} (null: none; at most {@link #MAX_BANNED}) are never chosen.
 */
public record Draws(float[] temperature, long[] key, int[][] banned) {

    /** The most banned ids a draw takes (a request's end-of-generation tokens, with {@code ignore_eos}). */
    public static final int MAX_BANNED = 4;

    public Draws {
        if (temperature.length != key.length || temperature.length != banned.length) {
            throw new IllegalArgumentException(temperature.length + " temperatures, " + key.length + " keys and "
                    + banned.length + " banned lists");
        }
        for (float t : temperature) {
            if (!(t >= 0) || Float.isInfinite(t)) {
                throw new IllegalArgumentException("a draw's temperature must be a finite number of at least 0, got "
                        + t);
            }
        }
        for (int[] b : banned) {
            if (b != null && b.length > MAX_BANNED) {
                throw new IllegalArgumentException("a draw bans at most " + MAX_BANNED + " ids, got " + b.length);
            }
        }
    }

    /** Draw i alone. */
    public Draws one(int i) {
        return new Draws(new float[] {temperature[i]}, new long[] {key[i]}, new int[][] {banned[i]});
    }
}
