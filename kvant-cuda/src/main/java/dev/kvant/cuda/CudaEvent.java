package dev.kvant.cuda;

import java.lang.foreign.MemorySegment;

/**
 * A marker in a stream, used here to time device work: record a start and an end event around the work, synchronize
 * on the end, and read the milliseconds between them as the GPU measured them (no host launch overhead).
 */
public final class CudaEvent implements AutoCloseable {
    private final CudaContext context;
    private final MemorySegment handle;
    private boolean closed;

    CudaEvent(CudaContext context, MemorySegment handle) {
        this.context = context;
        this.handle = handle;
    }

    public MemorySegment handle() {
        if (closed) {
            throw new IllegalStateException("CUDA event " + CudaDriver.hex(handle) + " was used after close()");
        }
        return handle;
    }

    /** Queues this event on {@code stream}: it completes when the work queued before it has. */
    public void record(CudaStream stream) {
        context.makeCurrent();
        context.driver().eventRecord(handle(), stream.handle());
    }

    /** Waits for the event to complete. */
    public void synchronize() {
        context.makeCurrent();
        context.driver().eventSynchronize(handle());
    }

    /** Milliseconds from {@code start} to {@code end}, both recorded; waits for {@code end} first. */
    public static float elapsedMillis(CudaEvent start, CudaEvent end) {
        end.synchronize();
        return end.context.driver().eventElapsedTime(start.handle(), end.handle());
    }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        context.release(() -> context.driver().eventDestroy(handle));
    }
}
