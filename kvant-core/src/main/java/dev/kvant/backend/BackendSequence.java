package dev.kvant.backend;

/** One sequence on a backend: its KV cache and position. Not thread-safe; one caller at a time. */
public interface BackendSequence extends AutoCloseable {

    /** Tokens held in the cache. */
    int length();

    /** The most tokens the cache can hold. */
    int capacity();

    /**
     * Runs tokens[off .. off+n) at positions length() .. length()+n-1 and appends their keys and values. Writes the
     * logits of every token (allLogits: n x vocab) or of the last one (vocab floats) into logits.
     */
    void forward(int[] tokens, int off, int n, boolean allLogits, float[] logits);

    /**
     * As {@link #forward} without the logits, returning the id of the largest logit after the last token (the lowest
     * id among equal ones). A backend on a device computes it there and copies back only the id.
     */
    int forwardGreedy(int[] tokens, int off, int n);

    /**
     * Appends {@code tokens} positions whose K and V rows (every layer, every kv head) are standard normal draws,
     * quantized into the cache as real rows are; no model computation. For benchmarks at depths a prefill would take
     * minutes to reach (`kvant bench --depth-fill random`): decode speed depends on what the cache holds, not on how
     * it got there.
     */
    void fillRandom(int tokens, long seed);

    /**
     * The ids of this sequence's cache pages in its pool (a copy; {@link SequencePool#holders} counts a page's
     * holders), so that what closing some sequences gives back can be told; null where the backend does not say.
     */
    default int[] pageIds() {
        return null;
    }

    /** Forgets everything after the first {@code length} tokens. */
    void truncate(int length);

    @Override
    void close();
}
