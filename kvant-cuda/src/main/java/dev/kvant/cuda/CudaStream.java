package dev.kvant.cuda;

import java.lang.foreign.MemorySegment;

/** A queue of device work that runs in order; work on different streams may overlap. */
public final class CudaStream implements AutoCloseable {
    private final CudaContext context;
    private final MemorySegment handle;
    private final boolean owned;
    private volatile boolean overlapLaunches;
    private boolean closed;

    CudaStream(CudaContext context, MemorySegment handle, boolean owned) {
        this.context = context;
        this.handle = handle;
        this.owned = owned;
    }

    static CudaStream legacyDefault(CudaContext context) {
        return new CudaStream(context, MemorySegment.NULL, false);
    }

    /**
     * Marks (or unmarks) this stream for overlapped launches: with {@link CudaContext.LaunchOverlap#MARKED}, the
     * default, kvant's kernels queued here while marked start as programmatic dependents of the kernel before
     * them. The model marks its stream while it queues a decode step; prefill, whose chain has cuBLAS GEMMs in
     * it, stays plain.
     */
    public void overlapLaunches(boolean on) {
        this.overlapLaunches = on;
    }

    public boolean overlapsLaunches() {
        return overlapLaunches;
    }

    /** Later work on this stream waits until {@code event} (of any context) has happened. */
    public void waitFor(CudaEvent event) {
        context.makeCurrent();
        context.driver().streamWaitEvent(handle(), event.handle());
    }

    /** The CUstream handle (NULL for the legacy default stream). */
    public MemorySegment handle() {
        if (closed) {
            throw new IllegalStateException("CUDA stream " + CudaDriver.hex(handle) + " was used after close()");
        }
        return handle;
    }

    public CudaContext context() {
        return context;
    }

    /** Whether this is the legacy default stream, which cannot be captured into a graph. */
    public boolean isLegacyDefault() {
        return handle.equals(MemorySegment.NULL);
    }

    /** Waits until every piece of work queued so far has finished. */
    public void synchronize() {
        context.makeCurrent();
        context.driver().streamSynchronize(handle());
    }

    /** Destroys a stream this context created (work already queued still completes); idempotent. */
    @Override
    public synchronized void close() {
        if (closed || !owned) {
            return;
        }
        closed = true;
        context.release(() -> context.driver().streamDestroy(handle));
    }
}
