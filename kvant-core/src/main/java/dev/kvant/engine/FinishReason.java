package dev.kvant.engine;

/** Why a generation ended. */
public enum FinishReason {
    /** The model produced an end-of-generation token (not part of the output). */
    STOP,
    /** maxTokens were generated. */
    LENGTH,
    /** The sequence filled its context. */
    CONTEXT,
    /** The caller cancelled it (a client that went away, a stop string found). */
    CANCELLED
}
