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
 * @param pipeline      decode steps of different sequences in flight at once: 0 takes the backend's
 *                      {@link dev.kvant.backend.Backend#pipelineDepth} (a layer split over n GPUs keeps n in flight),
 *                      1 runs one step at a time, N at most N (never more than the backend's depth)
 * @param approximatePrefixes with prefixCache, reuse any cached prefix also where only a prompt's whole chunks give
 *                      the bits of the same prompt computed afresh (a pool whose forks do not keep bits: the GPU
 *                      backend, keys centered on their page's mean; a model that selects KV pages): a conversation's
 *                      reply is reused too, but a request's output then depends on what the cache held (in its last
 *                      bits, and so at times in its tokens). Off: such engines reuse whole prompt chunks only
 *                      ({@link Engine#prefixReuseStep}).
 */
public record EngineConfig(int parallel, int contextLength, int prefillChunk, int maxQueue, boolean prefixCache,
                           int pipeline, boolean approximatePrefixes) {

    /** With the backend's pipeline depth. */
    public EngineConfig(int parallel, int contextLength, int prefillChunk, int maxQueue, boolean prefixCache) {
        this(parallel, contextLength, prefillChunk, maxQueue, prefixCache, 0);
    }

    /** Reusing only prefixes that keep the bits of a fresh computation. */
    public EngineConfig(int parallel, int contextLength, int prefillChunk, int maxQueue, boolean prefixCache,
                        int pipeline) {
        this(parallel, contextLength, prefillChunk, maxQueue, prefixCache, pipeline, false);
    }

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
        if (pipeline < 0) {
            throw new IllegalArgumentException("the pipeline depth must not be negative, got " + pipeline);
        }
        if (maxQueue < 0) {
            throw new IllegalArgumentException("the queue bound must not be negative, got " + maxQueue);
        }
    }
}
