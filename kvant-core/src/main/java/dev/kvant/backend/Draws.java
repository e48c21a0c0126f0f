package dev.kvant.backend;

/**
 * How a decode step that draws where the model runs ({@link Backend#startDecodeDrawn}) chooses each sequence's
 * token. {@code temperature[i]} 0 takes row i's largest logit (the lowest id among equal ones), as {@link
 * Backend#startDecode(BackendSequence[], int[], float[])} with no logits does. Above 0 it draws from the host
 * sampler's candidates ({@link dev.kvant.sample.Sampler}: with {@code topK[i]}, the k largest logits, then the fewest
 * of them reaching {@code topP[i]} of their weight, then those at least {@code minP[i]} as likely as the largest;
 * without it, every id at least minP as likely as the largest) token t with probability exp(l_t / T) over their
 * Σ exp(l / T), its randomness from {@code key[i]} alone: the same key and the same logits give the same token, in
 * any batch. The ids of {@code banned[i]} (null: none; at most {@link #MAX_BANNED}) are never chosen. {@code
 * penalty[i]} (null: none) changes the row's logits first, as the host sampler's repetition penalties do.
 */
public record Draws(float[] temperature, long[] key, int[][] banned, int[] topK, float[] topP, float[] minP,
                    Penalty[] penalty) {

    /**
     * The repetition penalties of one row ({@link dev.kvant.sample.Sampler}'s, in its float arithmetic): each id of
     * {@code ids} (ascending; a draw takes at most {@link #MAX_PENALIZED}), seen {@code counts} times in the window,
     * has its logit l become (l > 0 ? l / repeat : l · repeat) − (count · frequency + presence).
     */
    public record Penalty(float repeat, float frequency, float presence, int[] ids, int[] counts) {
        public Penalty {
            if (!(repeat > 0) || Float.isInfinite(repeat) || !Float.isFinite(frequency) || !Float.isFinite(presence)) {
                throw new IllegalArgumentException("a penalty's repeat must be a finite number above 0 and its "
                        + "frequency and presence finite, got " + repeat + ", " + frequency + ", " + presence);
            }
            if (ids.length != counts.length) {
                throw new IllegalArgumentException("a penalty names each id with its count: got " + ids.length
                        + " ids and " + counts.length + " counts");
            }
            for (int i = 0; i < ids.length; i++) {
                if (ids[i] < 0 || counts[i] < 1 || i > 0 && ids[i] <= ids[i - 1]) {
                    throw new IllegalArgumentException("a penalty's ids must be ascending and at least 0, each seen at"
                            + " least once: id " + ids[i] + " (count " + counts[i] + ") at " + i);
                }
            }
        }
    }

    /** The most banned ids a draw takes (a request's end-of-generation tokens, with {@code ignore_eos}). */
    public static final int MAX_BANNED = 4;
    /** The largest top-k a draw takes. */
    public static final int MAX_TOP_K = 256;
    /** The most distinct ids a draw's penalty names (a sampler's repetition window of up to this many tokens). */
    public static final int MAX_PENALIZED = 64;

    /** As the canonical constructor, without penalties. */
    public Draws(float[] temperature, long[] key, int[][] banned, int[] topK, float[] topP, float[] minP) {
        this(temperature, key, banned, topK, topP, minP, new Penalty[temperature.length]);
    }

    public Draws {
        int n = temperature.length;
        if (key.length != n || banned.length != n || topK.length != n || topP.length != n || minP.length != n
                || penalty.length != n) {
            throw new IllegalArgumentException("draws of different counts: " + n + " temperatures, " + key.length
                    + " keys, " + banned.length + " banned lists, " + topK.length + " top-k, " + topP.length
                    + " top-p, " + minP.length + " min-p, " + penalty.length + " penalties");
        }
        for (int i = 0; i < n; i++) {
            float t = temperature[i];
            if (!(t >= 0) || Float.isInfinite(t)) {
                throw new IllegalArgumentException("a draw's temperature must be a finite number of at least 0, got "
                        + t);
            }
            if (banned[i] != null && banned[i].length > MAX_BANNED) {
                throw new IllegalArgumentException("a draw bans at most " + MAX_BANNED + " ids, got "
                        + banned[i].length);
            }
            if (topK[i] < 0 || topK[i] > MAX_TOP_K) {
                throw new IllegalArgumentException("a draw's top-k must be 0 (off) to " + MAX_TOP_K + ", got "
                        + topK[i]);
            }
            if (!(topP[i] > 0 && topP[i] <= 1) || topP[i] < 1 && topK[i] == 0) {
                throw new IllegalArgumentException("a draw's top-p must be above 0 and at most 1, and below 1 only with"
                        + " top-k, got " + topP[i] + " with top-k " + topK[i]);
            }
            if (!(minP[i] >= 0 && minP[i] <= 1)) {
                throw new IllegalArgumentException("a draw's min-p must be between 0 and 1, got " + minP[i]);
            }
            if (penalty[i] != null && penalty[i].ids().length > MAX_PENALIZED) {
                throw new IllegalArgumentException("a draw's penalty names at most " + MAX_PENALIZED + " ids, got "
                        + penalty[i].ids().length);
            }
        }
    }

    /** Draw i alone. */
    public Draws one(int i) {
        return new Draws(new float[] {temperature[i]}, new long[] {key[i]}, new int[][] {banned[i]},
                new int[] {topK[i]}, new float[] {topP[i]}, new float[] {minP[i]}, new Penalty[] {penalty[i]});
    }
}
