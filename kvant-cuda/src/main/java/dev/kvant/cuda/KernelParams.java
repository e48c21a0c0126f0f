package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_DOUBLE;
import static java.lang.foreign.ValueLayout.JAVA_FLOAT;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * Packs kernel arguments the way cuLaunchKernel wants them: {@code void** kernelParams}, an array with one pointer
 * per kernel parameter, each pointing at that parameter's value. The driver reads each value with the size the
 * kernel's signature gives it, so the Java type must match the CUDA one:
 *
 * <table>
 *   <tr><th>Java</th><th>CUDA parameter</th><th>bytes</th></tr>
 *   <tr><td>long / Long</td><td>long long, size_t, unsigned long long</td><td>8</td></tr>
 *   <tr><td>int / Integer</td><td>int, unsigned int</td><td>4</td></tr>
 *   <tr><td>float / Float</td><td>float</td><td>4</td></tr>
 *   <tr><td>double / Double</td><td>double</td><td>8</td></tr>
 *   <tr><td>{@link DeviceBuffer}</td><td>any pointer, T*</td><td>8 (the device address)</td></tr>
 * </table>
 *
 * <p>Every value gets its own 8-byte, 8-aligned slot after the pointer array, in one zeroed allocation. The values
 * are copied by the driver during the launch call, so the arena may close as soon as cuLaunchKernel returns (also
 * under stream capture: the graph node keeps its own copy).
 */
public final class KernelParams {
    /** Bytes per value slot: the largest parameter kind we pack, and its alignment. */
    static final long SLOT = 8;

    private KernelParams() {
    }

    /**
     * The kernelParams array for {@code args}, allocated in {@code arena}; {@link MemorySegment#NULL} when there are
     * none (the driver accepts NULL for a kernel without parameters).
     *
     * @throws IllegalArgumentException naming the argument's position and type, for a null or unsupported argument
     */
    public static MemorySegment pack(Arena arena, Object... args) {
        if (args.length == 0) {
            return MemorySegment.NULL;
        }
        long pointers = args.length * ADDRESS.byteSize();
        MemorySegment block = arena.allocate(pointers + args.length * SLOT, SLOT);
        for (int i = 0; i < args.length; i++) {
            MemorySegment slot = block.asSlice(pointers + i * SLOT, SLOT);
            switch (args[i]) {
                case Long v -> slot.set(JAVA_LONG, 0, v);
                case Integer v -> slot.set(JAVA_INT, 0, v);
                case Float v -> slot.set(JAVA_FLOAT, 0, v);
                case Double v -> slot.set(JAVA_DOUBLE, 0, v);
                case DeviceBuffer b -> slot.set(JAVA_LONG, 0, b.address());
                case null -> throw new IllegalArgumentException("kernel argument " + i + " is null");
                default -> throw new IllegalArgumentException("kernel argument " + i + " is a "
                        + args[i].getClass().getSimpleName() + "; pass long, int, float, double or DeviceBuffer");
            }
            block.setAtIndex(ADDRESS, i, slot);
        }
        return block.asSlice(0, pointers);
    }
}
