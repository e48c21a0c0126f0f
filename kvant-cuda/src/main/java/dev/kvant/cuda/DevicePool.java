package dev.kvant.cuda;

/**
 * A bump allocator for per-step scratch: one cuMemAlloc up front, then {@link #allocate} hands out 256-byte aligned
 * slices of it by moving a pointer, and {@link #reset} takes them all back at once.
 *
 * <p>Why a bump arena rather than size classes: a decode step allocates the same sequence of scratch buffers every
 * time, so after {@code reset()} the n-th allocation of a step gets the same address as in the previous step. That
 * is what lets a CUDA graph captured once replay forever: its kernels hold the addresses they were captured with.
 * And with no cuMemAlloc on the hot path, a stream capture never allocates (cuMemAlloc is illegal during a global
 * capture).
 *
 * <p>Rules: size the pool for the largest step (see {@link #highWater()}); exhausting it throws rather than falling
 * back to cuMemAlloc; a buffer handed out before a reset refuses use after it. Not meant to be shared by threads
 * running different steps at once (allocation is synchronized, but one thread's reset retires everyone's scratch).
 */
public final class DevicePool implements AutoCloseable {
    /** Alignment of every slice: what cuMemAlloc guarantees, ample for 16-byte vector loads and cuBLASLt. */
    public static final long ALIGNMENT = 256;

    private final CudaContext context;
    private final DeviceBuffer block;
    private long top;
    private long highWater;
    private volatile long generation;
    private volatile boolean closed;

    DevicePool(CudaContext context, long capacity) {
        if (capacity <= 0) {
            throw new IllegalArgumentException("device pool of " + capacity + " bytes: the size must be positive");
        }
        this.context = context;
        this.block = context.allocate(capacity);
    }

    /** {@code bytes} of scratch (rounded up to {@link #ALIGNMENT}), valid until the next {@link #reset}. */
    public synchronized DeviceBuffer allocate(long bytes) {
        if (closed) {
            throw new IllegalStateException("device pool was used after close()");
        }
        if (bytes <= 0) {
            throw new IllegalArgumentException("scratch of " + bytes + " bytes: the size must be positive");
        }
        long room = block.byteSize() - top;
        // the size itself first: rounding one near Long.MAX_VALUE up would wrap to a negative size
        if (bytes > room || alignUp(bytes) > room) {
            throw new IllegalStateException("device pool of " + block.byteSize() + " bytes is exhausted: " + bytes
                    + " bytes requested with " + top + " in use; size the pool for the largest step");
        }
        long offset = top;
        top += alignUp(bytes);
        highWater = Math.max(highWater, top);
        return DeviceBuffer.pooled(context, block.address() + offset, bytes, this, generation);
    }

    /** Takes back every slice; slices handed out before refuse use afterwards. */
    public synchronized void reset() {
        top = 0;
        generation++;
    }

    public long capacity() {
        return block.byteSize();
    }

    /** Bytes handed out since the last reset, alignment included. */
    public synchronized long used() {
        return top;
    }

    /** The most bytes ever in use at once: what a step actually needs. */
    public synchronized long highWater() {
        return highWater;
    }

    long generation() {
        return generation;
    }

    boolean isClosed() {
        return closed;
    }

    static long alignUp(long bytes) {
        return (bytes + ALIGNMENT - 1) & -ALIGNMENT;
    }

    /** Frees the pool's memory; every slice refuses use afterwards. */
    @Override
    public synchronized void close() {
        if (!closed) {
            closed = true;
            block.close();
        }
    }
}
