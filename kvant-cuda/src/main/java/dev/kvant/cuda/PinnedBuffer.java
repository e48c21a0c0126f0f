package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * Page-locked host memory (cuMemAllocHost): the DMA engines read and write it directly, so copies between it and the
 * device run at full PCIe/NVLink speed and asynchronous copies truly overlap with the host. Pinning is expensive
 * and takes memory from the OS; use it for staging buffers, not for everything.
 *
 * <p>The {@link #segment()} is bound to an arena closed by {@link #close()}, so it cannot be touched after the memory
 * is freed.
 */
public final class PinnedBuffer implements AutoCloseable {
    private final CudaContext context;
    private final MemorySegment raw;
    private final Arena arena;
    private final MemorySegment segment;
    private boolean closed;

    PinnedBuffer(CudaContext context, long bytes) {
        if (bytes <= 0) {
            throw new IllegalArgumentException("pinned allocation of " + bytes + " bytes: the size must be positive");
        }
        this.context = context;
        context.makeCurrent();
        this.raw = context.driver().memAllocHost(bytes);
        this.arena = Arena.ofShared();
        this.segment = raw.reinterpret(bytes, arena, null);
    }

    /** The host memory, {@code byteSize()} bytes; invalid after close. */
    public MemorySegment segment() {
        return segment;
    }

    public long byteSize() {
        return segment.byteSize();
    }

    /** Invalidates the segment and frees the memory; idempotent. The caller ensures no copy still uses it. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        arena.close();
        context.release(() -> context.driver().memFreeHost(raw));
    }
}
