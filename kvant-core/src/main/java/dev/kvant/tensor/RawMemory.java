package dev.kvant.tensor;

import java.lang.foreign.MemorySegment;

/**
 * The one unchecked view of native memory the kernels read through, and the checks that make reading through it
 * safe.
 *
 * <p>Why: a vector load from a {@link MemorySegment} repeats the segment's checks (type, bounds, liveness) on
 * every access, and inside the nested loops of a block kernel C2 turned each bounds check into some 30 scalar
 * instructions (its rewrite of long-indexed range checks). Reading through {@link #ALL}, a constant segment
 * spanning the whole address space, leaves one trivial compare per load: Q4_K {@code dot4} went from 16 to 18.5
 * G values/s on one core of the 2-core Zen 5 development VM (thread CPU time, a 256 x 4096 matrix in L2).
 *
 * <p>The price is that the kernels trust their addresses, so every entry point checks first: the segment is
 * native (heap segments are copied), alive, and holds every byte the kernel will read. Closing a segment's arena
 * while a kernel is reading it is not detected.
 */
final class RawMemory {
    static final MemorySegment ALL = MemorySegment.NULL.reinterpret(Long.MAX_VALUE);

    private RawMemory() {
    }

    /**
     * The absolute address of {@code bytes} bytes at {@code offset} in a native segment, after checking that
     * they lie inside it and that it is alive.
     */
    static long address(MemorySegment s, long offset, long bytes) {
        if (!s.isNative()) {
            throw new IllegalArgumentException("kernels read native memory only; got a heap segment");
        }
        if (offset < 0 || bytes < 0 || offset > s.byteSize() - bytes) {
            throw new IndexOutOfBoundsException("bytes " + offset + " .. " + (offset + bytes)
                    + " are outside a segment of " + s.byteSize() + " bytes");
        }
        if (!s.scope().isAlive()) {
            throw new IllegalStateException("the segment's memory has been released");
        }
        return s.address() + offset;
    }
}
