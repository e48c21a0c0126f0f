package dev.kvant.engine;

/** A prompt or generation does not fit the context; the session is unchanged and can still be used. */
public class ContextFullException extends RuntimeException {
    public ContextFullException(String message) {
        super(message);
    }
}
