package dev.kvant.engine;

/**
 * A snapshot of an {@link Engine}'s state and counters since it started.
 *
 * @param waiting          requests queued for a slot
 * @param running          sequences prefilling or decoding
 * @param totalPages       pages of the KV pool
 * @param freePages        pages no sequence and no cached prefix holds
 * @param cachedPrefixes   entries in the prefix cache
 * @param promptTokens     prompt tokens of started requests
 * @param cachedTokens     of those, taken from the prefix cache instead of computed
 * @param generatedTokens  tokens generated
 * @param prefixHits       requests that reused a cached prefix
 * @param prefixMisses     requests that found none
 * @param steps            engine steps run (a step decodes, reads a prompt chunk, or both)
 * @param decodeSteps      steps that decoded at least one sequence
 * @param decodeRows       sequences decoded, summed over steps (decodeRows / decodeSteps is the mean batch)
 */
public record EngineStats(int waiting, int running, int totalPages, int freePages, int cachedPrefixes,
                          long promptTokens, long cachedTokens, long generatedTokens, long prefixHits,
                          long prefixMisses, long steps, long decodeSteps, long decodeRows) {

    public int usedPages() {
        return totalPages - freePages;
    }
}
