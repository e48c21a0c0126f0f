package dev.kvant.kv;

/**
 * A sequence asked for more pages than the cache has free. Recoverable: the operation that threw changed nothing,
 * so the caller can free other sequences, truncate, or refuse the request.
 */
public class KvCacheFullException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final int requestedTokens;
    private final int fittingTokens;

    public KvCacheFullException(String message, int requestedTokens, int fittingTokens) {
        super(message);
        this.requestedTokens = requestedTokens;
        this.fittingTokens = fittingTokens;
    }

    /** The sequence length the failed operation needed. */
    public int requestedTokens() {
        return requestedTokens;
    }

    /** The longest length the sequence could reach with the pages free now. */
    public int fittingTokens() {
        return fittingTokens;
    }
}
