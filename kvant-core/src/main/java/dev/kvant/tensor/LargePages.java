package dev.kvant.tensor;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.util.Locale;

/**
 * Large buffers that their user fills completely (a packed copy of a weight matrix, a synthetic model's weights):
 * anonymous memory from
 * {@code mmap}, asked for transparent huge pages ({@code madvise(MADV_HUGEPAGE)}), not zeroed first.
 *
 * <p>Why: {@link Arena#allocate} zeroes what it returns, and on the development VM the first touch of each 4 KiB
 * page costs some 20 µs, so a gigabyte took 5-6 s to allocate, all on one thread, before the packing wrote it again.
 * With 2 MiB pages the faults are 512 times fewer, and the kernels streaming the buffer miss the TLB less.
 *
 * <p>Linux only (the flag values are Linux's); elsewhere, or when a call fails, an ordinary zeroed allocation.
 */
public final class LargePages {
    private static final int PROT_READ_WRITE = 0x1 | 0x2;
    private static final int MAP_PRIVATE_ANONYMOUS = 0x02 | 0x20;
    private static final int MADV_HUGEPAGE = 14;
    private static final long HUGE_PAGE = 2L << 20;
    private static final MethodHandle MMAP;
    private static final MethodHandle MADVISE;
    private static final MethodHandle MUNMAP;

    static {
        MethodHandle mmap = null, madvise = null, munmap = null;
        if (System.getProperty("os.name", "").toLowerCase(Locale.ROOT).startsWith("linux")) {
            try {
                Linker linker = Linker.nativeLinker();
                SymbolLookup libc = linker.defaultLookup();
                mmap = linker.downcallHandle(libc.find("mmap").orElseThrow(), FunctionDescriptor.of(
                        ValueLayout.ADDRESS, ValueLayout.ADDRESS, ValueLayout.JAVA_LONG, ValueLayout.JAVA_INT,
                        ValueLayout.JAVA_INT, ValueLayout.JAVA_INT, ValueLayout.JAVA_LONG));
                madvise = linker.downcallHandle(libc.find("madvise").orElseThrow(), FunctionDescriptor.of(
                        ValueLayout.JAVA_INT, ValueLayout.ADDRESS, ValueLayout.JAVA_LONG, ValueLayout.JAVA_INT));
                munmap = linker.downcallHandle(libc.find("munmap").orElseThrow(), FunctionDescriptor.of(
                        ValueLayout.JAVA_INT, ValueLayout.ADDRESS, ValueLayout.JAVA_LONG));
            } catch (RuntimeException e) {
                mmap = null;
            }
        }
        MMAP = mmap;
        MADVISE = madvise;
        MUNMAP = munmap;
    }

    private LargePages() {
    }

    /**
     * {@code bytes} bytes, 64-byte aligned (page aligned when mapped), contents unspecified: the caller writes every
     * byte before reading any. Unmapped when the segment becomes unreachable.
     */
    static MemorySegment allocate(long bytes) {
        return allocate(bytes, Arena.ofAuto());
    }

    /** As {@link #allocate(long)}, unmapped when {@code arena} closes. */
    public static MemorySegment allocate(long bytes, Arena arena) {
        if (MMAP != null && bytes >= HUGE_PAGE) {
            long size = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
            try {
                MemorySegment at = (MemorySegment) MMAP.invokeExact(MemorySegment.NULL, size, PROT_READ_WRITE,
                        MAP_PRIVATE_ANONYMOUS, -1, 0L);
                if (at.address() != -1L && at.address() != 0L) {
                    int ignored = (int) MADVISE.invokeExact(at, size, MADV_HUGEPAGE);  // a hint: failure is harmless
                    long address = at.address();
                    return at.reinterpret(size, arena, s -> unmap(address, size)).asSlice(0, bytes);
                }
            } catch (Throwable e) {
                // fall through to an ordinary allocation
            }
        }
        return arena.allocate(bytes, 64);
    }

    private static void unmap(long address, long size) {
        try {
            int ignored = (int) MUNMAP.invokeExact(MemorySegment.ofAddress(address), size);
        } catch (Throwable e) {
            // nothing to do at this point: the mapping stays until the process ends
        }
    }
}
