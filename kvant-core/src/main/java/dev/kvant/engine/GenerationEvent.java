package dev.kvant.engine;

/**
 * What the {@link Engine} reports about one generation, in order: {@link Started} once the request holds a sequence,
 * a {@link Token} per generated token, then exactly one of {@link Finished} or {@link Failed}. Delivered on the
 * engine's thread: a listener must not block (hand the event to a queue).
 */
public sealed interface GenerationEvent {

    /**
     * The request got a sequence; cachedTokens of its prompt come from the prefix cache and are not computed.
     */
    record Started(int promptTokens, int cachedTokens) implements GenerationEvent {
    }

    /** The next generated token (end-of-generation tokens are not reported). */
    record Token(int id) implements GenerationEvent {
    }

    /** The generation ended normally or was cancelled; the counts are what usage reports. */
    record Finished(FinishReason reason, int promptTokens, int cachedTokens, int generatedTokens)
            implements GenerationEvent {
    }

    /** The generation could not go on; message says why in words a client can act on. */
    record Failed(String message, boolean shuttingDown) implements GenerationEvent {
    }
}
