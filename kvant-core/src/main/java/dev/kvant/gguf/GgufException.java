package dev.kvant.gguf;

/**
 * A GGUF file (or a writer's input) is not what it claims to be. The message names the file, the key or tensor, and
 * what is wrong, so that a user can act on it without a stack trace.
 */
public class GgufException extends RuntimeException {
    public GgufException(String message) {
        super(message);
    }

    public GgufException(String message, Throwable cause) {
        super(message, cause);
    }
}
