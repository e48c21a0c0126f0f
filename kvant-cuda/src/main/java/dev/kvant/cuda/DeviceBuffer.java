package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A range of device memory: a device address and a size. It is one of three kinds, and closing it does what its
 * kind calls for:
 * <ul>
 *   <li>an allocation of its own ({@link CudaContext#allocate}): close frees it with cuMemFree;</li>
 *   <li>a slice of another buffer ({@link #slice}): usable while its parent is; close only retires the slice;</li>
 *   <li>scratch from a {@link DevicePool}: usable until the pool's next reset; close only retires it.</li>
 * </ul>
 * Every copy is bounds-checked against this buffer (and the host segment) before the driver sees it, and a buffer
 * used after close, after its parent's close, or after its pool's reset refuses with an {@link IllegalStateException}.
 *
 * <p>Synchronous copies ({@code copyFromHost}, {@code copyToHost}, {@code copyFrom}) go through the legacy default
 * stream and so wait for work queued there; the {@code ...Async} variants take a stream.
 */
public final class DeviceBuffer implements AutoCloseable {
    private final CudaContext context;
    private final long address;
    private final long byteSize;
    private final DeviceBuffer parent;
    private final DevicePool pool;
    private final long poolGeneration;
    private final boolean owning;
    private volatile boolean closed;

    private DeviceBuffer(CudaContext context, long address, long byteSize, DeviceBuffer parent, DevicePool pool,
                         long poolGeneration, boolean owning) {
        this.context = context;
        this.address = address;
        this.byteSize = byteSize;
        this.parent = parent;
        this.pool = pool;
        this.poolGeneration = poolGeneration;
        this.owning = owning;
    }

    static DeviceBuffer owned(CudaContext context, long address, long byteSize) {
        return new DeviceBuffer(context, address, byteSize, null, null, 0, true);
    }

    static DeviceBuffer pooled(CudaContext context, long address, long byteSize, DevicePool pool, long generation) {
        return new DeviceBuffer(context, address, byteSize, null, pool, generation, false);
    }

    /** A foreign device address this buffer neither owns nor frees (tests; memory owned by a library). */
    static DeviceBuffer wrap(CudaContext context, long address, long byteSize) {
        return new DeviceBuffer(context, address, byteSize, null, null, 0, false);
    }

    /** The device address (CUdeviceptr). */
    public long address() {
        checkLive();
        return address;
    }

    public long byteSize() {
        return byteSize;
    }

    public CudaContext context() {
        return context;
    }

    /** {@code bytes} bytes at {@code offset}, sharing this buffer's memory. */
    public DeviceBuffer slice(long offset, long bytes) {
        checkRange("slice", offset, bytes);
        return new DeviceBuffer(context, address + offset, bytes, this, null, 0, false);
    }

    // ---- host ⇄ device, synchronous

    /** Copies all of {@code src} to the start of this buffer. Heap segments are staged through native memory. */
    public void copyFromHost(MemorySegment src) {
        copyFromHost(src, 0);
    }

    /** Copies all of {@code src} to {@code offset} bytes into this buffer. */
    public void copyFromHost(MemorySegment src, long offset) {
        checkRange("copyFromHost", offset, src.byteSize());
        context.makeCurrent();
        if (src.isNative()) {
            context.driver().memcpyHtoD(address + offset, src, src.byteSize());
        } else {
            try (Arena staging = Arena.ofConfined()) {
                MemorySegment copy = staging.allocate(src.byteSize(), 16).copyFrom(src);
                context.driver().memcpyHtoD(address + offset, copy, copy.byteSize());
            }
        }
    }

    /**
     * Queues a copy of {@code bytes} from {@code src} (a buffer of any context, another device's too) into this
     * buffer, on {@code stream}.
     */
    public void copyFromPeerAsync(DeviceBuffer src, long srcOffset, long dstOffset, long bytes, CudaStream stream) {
        src.checkRange("copyFromPeerAsync source", srcOffset, bytes);
        checkRange("copyFromPeerAsync", dstOffset, bytes);
        stream.context().makeCurrent();
        context.driver().memcpyPeerAsync(address + dstOffset, context.handle(), src.address + srcOffset,
                src.context.handle(), bytes, stream.handle());
    }

    /** Fills all of {@code dst} from the start of this buffer. */
    public void copyToHost(MemorySegment dst) {
        copyToHost(dst, 0);
    }

    /** Fills all of {@code dst} from {@code offset} bytes into this buffer. */
    public void copyToHost(MemorySegment dst, long offset) {
        checkRange("copyToHost", offset, dst.byteSize());
        if (dst.isReadOnly()) {
            throw new IllegalArgumentException("copyToHost: the destination host segment is read-only");
        }
        context.makeCurrent();
        if (dst.isNative()) {
            context.driver().memcpyDtoH(dst, address + offset, dst.byteSize());
        } else {
            try (Arena staging = Arena.ofConfined()) {
                MemorySegment copy = staging.allocate(dst.byteSize(), 16);
                context.driver().memcpyDtoH(copy, address + offset, copy.byteSize());
                dst.copyFrom(copy);
            }
        }
    }

    // ---- host ⇄ device, on a stream

    /**
     * Queues a copy of all of {@code src} to {@code offset} on {@code stream}. {@code src} must be native and must
     * stay alive until the stream has run the copy; only page-locked memory ({@link PinnedBuffer}) truly overlaps.
     */
    public void copyFromHostAsync(MemorySegment src, long offset, CudaStream stream) {
        checkRange("copyFromHostAsync", offset, src.byteSize());
        requireNative("copyFromHostAsync", src);
        context.makeCurrent();
        context.driver().memcpyHtoDAsync(address + offset, src, src.byteSize(), stream.handle());
    }

    /** Queues a copy filling all of {@code dst} from {@code offset}; the same rules as {@link #copyFromHostAsync}. */
    public void copyToHostAsync(MemorySegment dst, long offset, CudaStream stream) {
        checkRange("copyToHostAsync", offset, dst.byteSize());
        requireNative("copyToHostAsync", dst);
        if (dst.isReadOnly()) {
            throw new IllegalArgumentException("copyToHostAsync: the destination host segment is read-only");
        }
        context.makeCurrent();
        context.driver().memcpyDtoHAsync(dst, address + offset, dst.byteSize(), stream.handle());
    }

    // ---- device → device

    /** Copies all of {@code src} to the start of this buffer. */
    public void copyFrom(DeviceBuffer src) {
        copyFrom(src, 0, 0, src.byteSize());
    }

    /** Copies {@code bytes} bytes from {@code srcOffset} in {@code src} to {@code dstOffset} here. */
    public void copyFrom(DeviceBuffer src, long srcOffset, long dstOffset, long bytes) {
        src.checkRange("copyFrom (source)", srcOffset, bytes);
        checkRange("copyFrom", dstOffset, bytes);
        context.makeCurrent();
        context.driver().memcpyDtoD(address + dstOffset, src.address + srcOffset, bytes);
    }

    public void copyFromAsync(DeviceBuffer src, long srcOffset, long dstOffset, long bytes, CudaStream stream) {
        src.checkRange("copyFromAsync (source)", srcOffset, bytes);
        checkRange("copyFromAsync", dstOffset, bytes);
        context.makeCurrent();
        context.driver().memcpyDtoDAsync(address + dstOffset, src.address + srcOffset, bytes, stream.handle());
    }

    // ---- fills

    /** Sets every byte to {@code value}. */
    public void fillBytes(byte value) {
        checkLive();
        context.makeCurrent();
        context.driver().memsetD8(address, value, byteSize);
    }

    /** Sets every 32-bit word to {@code value}; the size must be a multiple of 4. */
    public void fillInts(int value) {
        long words = wordCount("fillInts");
        context.makeCurrent();
        context.driver().memsetD32(address, value, words);
    }

    /** Sets every float to {@code value}, e.g. NaN to poison an output before a kernel writes it. */
    public void fillFloats(float value) {
        fillInts(Float.floatToRawIntBits(value));
    }

    public void fillBytesAsync(byte value, CudaStream stream) {
        checkLive();
        context.makeCurrent();
        context.driver().memsetD8Async(address, value, byteSize, stream.handle());
    }

    public void fillIntsAsync(int value, CudaStream stream) {
        long words = wordCount("fillIntsAsync");
        context.makeCurrent();
        context.driver().memsetD32Async(address, value, words, stream.handle());
    }

    /** Frees an allocation of its own; retires a slice or pooled scratch. Idempotent, and safe from two threads. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        if (owning) {
            context.release(() -> context.driver().memFree(address));
        }
    }

    /** Whether the buffer may still be used (not closed, parent alive, pool not reset since). */
    public boolean isLive() {
        if (closed || (parent != null && !parent.isLive())) {
            return false;
        }
        return pool == null || (!pool.isClosed() && pool.generation() == poolGeneration);
    }

    void checkLive() {
        if (closed) {
            throw new IllegalStateException("device buffer " + this + " was used after close()");
        }
        if (parent != null && !parent.isLive()) {
            throw new IllegalStateException("device buffer " + this + " is a slice of a buffer that was closed");
        }
        if (pool != null && (pool.isClosed() || pool.generation() != poolGeneration)) {
            throw new IllegalStateException("device buffer " + this + " is scratch from a DevicePool that was "
                    + (pool.isClosed() ? "closed" : "reset") + " after it was handed out");
        }
    }

    void checkRange(String operation, long offset, long bytes) {
        checkLive();
        if (offset < 0 || bytes < 0 || offset > byteSize - bytes) {
            throw new IndexOutOfBoundsException(operation + ": " + bytes + " bytes at offset " + offset
                    + " do not fit device buffer " + this);
        }
    }

    private long wordCount(String operation) {
        checkLive();
        if (byteSize % 4 != 0 || address % 4 != 0) {
            throw new IllegalArgumentException(operation + ": device buffer " + this
                    + " is not a whole number of aligned 32-bit words");
        }
        return byteSize / 4;
    }

    private static void requireNative(String operation, MemorySegment host) {
        if (!host.isNative()) {
            throw new IllegalArgumentException(operation + " needs native host memory (a PinnedBuffer to overlap "
                    + "with the host); got a heap segment");
        }
    }

    @Override
    public String toString() {
        return CudaDriver.hex(address) + " (" + byteSize + " bytes)";
    }
}
