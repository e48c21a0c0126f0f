package dev.kvant.engine;

import java.util.concurrent.atomic.AtomicInteger;

/**
 * A request accepted by the {@link Engine}: the caller's handle to cancel it. Its progress arrives as
 * {@link GenerationEvent}s.
 */
public final class Generation {
    private final long id;
    private volatile boolean cancelled;
    /**
     * 0 live, 3 being cancelled (the engine's count not yet raised), 1 cancelled (and counted so by the engine), 2
     * settled: the engine is done with it. Settling waits out 3, so the count never goes below the cancelled ones.
     */
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
        if (state.compareAndSet(0, 3)) {
            try {
                onCancel.run();   // its place stops counting against the queue now, not when the engine frees it
            } finally {
                state.set(1);
            }
        }
    }

    /** The engine is done with it; whether a cancel had counted it first. */
    boolean settle() {
        while (true) {
            int s = state.get();
            if (s == 3) {
                Thread.onSpinWait();   // a cancel between its claim and its count: a few instructions
            } else if (state.compareAndSet(s, 2)) {
                return s == 1;
            }
        }
    }

    public boolean isCancelled() {
        return cancelled;
    }
}
