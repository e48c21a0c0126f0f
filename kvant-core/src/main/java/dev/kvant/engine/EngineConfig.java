package dev.kvant.engine;

/**
 * How an {@link Engine} schedules.
 *
 * @param parallel      sequences that decode together in one step
 * @param contextLength the most tokens one sequence holds (prompt and generated)
 * @param prefillChunk  prompt tokens computed per step; a long prompt takes several steps, and the other sequences
 *                      decode in between
 * @param maxQueue      requests that may wait for a free slot; more are refused
 * @param prefixCache   keep finished sequences' pages for later requests that start with the same tokens
 */
public record EngineConfig(int parallel, int contextLength, int prefillChunk, int maxQueue, boolean prefixCache) {

    public EngineConfig {
        if (parallel < 1 || parallel > 1024) {
            throw new IllegalArgumentException("parallel must be between 1 and 1024, got " + parallel);
        }
        if (contextLength < 2) {
            throw new IllegalArgumentException("the context must hold at least 2 tokens, got " + contextLength);
        }
        if (prefillChunk < 1) {
            throw new IllegalArgumentException("the prefill chunk must be positive, got " + prefillChunk);
        }
        if (maxQueue < 0) {
            throw new IllegalArgumentException("the queue bound must not be negative, got " + maxQueue);
        }
    }
}
