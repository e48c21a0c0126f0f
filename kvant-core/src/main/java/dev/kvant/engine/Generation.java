package dev.kvant.engine;

/**
 * A request accepted by the {@link Engine}: the caller's handle to cancel it. Its progress arrives as
 * {@link GenerationEvent}s.
 */
public final class Generation {
    private final long id;
    private volatile boolean cancelled;

    Generation(long id) {
        this.id = id;
    }

    /** Unique among the engine's generations. */
    public long id() {
        return id;
    }

    /**
     * Asks the engine to stop this generation; its sequence is freed at the next step and a {@link
     * GenerationEvent.Finished} with {@link FinishReason#CANCELLED} ends it (unless it had ended already).
     */
    public void cancel() {
        cancelled = true;
    }

    public boolean isCancelled() {
        return cancelled;
    }
}
