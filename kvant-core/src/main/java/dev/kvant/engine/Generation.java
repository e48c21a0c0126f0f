package dev.kvant.engine;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * A request accepted by the {@link Engine}: the caller's handle to cancel it. Its progress arrives as
 * {@link GenerationEvent}s.
 */
public final class Generation {
    private final long id;
    private volatile boolean cancelled;
    /** 0 live, 1 cancelled (and counted so by the engine), 2 settled: the engine is done with it. */
    private final AtomicInteger state = new AtomicInteger();
    private final Runnable onCancel;

    Generation(long id, Runnable onCancel) {
        this.id = id;
        this.onCancel = onCancel;
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
        if (state.compareAndSet(0, 1)) {
            onCancel.run();   // its place stops counting against the queue now, not when the engine frees it
        }
    }

    /** The engine is done with it; whether a cancel had counted it first. */
    boolean settle() {
        return state.getAndSet(2) == 1;
    }

    public boolean isCancelled() {
        return cancelled;
    }
}
