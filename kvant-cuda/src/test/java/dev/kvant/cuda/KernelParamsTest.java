package dev.kvant.cuda;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.SplittableRandom;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_DOUBLE;
import static java.lang.foreign.ValueLayout.JAVA_FLOAT;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The kernelParams array cuLaunchKernel reads: one pointer per parameter, each to that parameter's value. */
class KernelParamsTest {

    @Test
    void packsOnePointerPerArgumentEachPointingAtItsValue() {
        long seed = GpuFixture.seed("packsOnePointerPerArgumentEachPointingAtItsValue");
        SplittableRandom r = new SplittableRandom(seed);
        long l = r.nextLong();
        int i = r.nextInt();
        float f = (float) r.nextDouble(-1e6, 1e6);
        double d = r.nextDouble(-1e6, 1e6);
        long deviceAddress = r.nextLong(1, 1L << 48) & -256L;
        DeviceBuffer buffer = DeviceBuffer.wrap(null, deviceAddress, 4096);
        String why = "seed " + seed;
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment params = KernelParams.pack(arena, buffer, l, i, f, d, buffer.slice(256, 16));
            assertEquals(6 * ADDRESS.byteSize(), params.byteSize(), why);
            MemorySegment[] values = new MemorySegment[6];
            for (int k = 0; k < 6; k++) {
                values[k] = params.getAtIndex(ADDRESS, k).reinterpret(8);
                assertEquals(0, values[k].address() % 8, "argument " + k + " is 8-byte aligned; " + why);
            }
            assertEquals(deviceAddress, values[0].get(JAVA_LONG, 0), why);
            assertEquals(l, values[1].get(JAVA_LONG, 0), why);
            assertEquals(i, values[2].get(JAVA_INT, 0), why);
            assertEquals(Float.floatToRawIntBits(f), values[3].get(JAVA_INT, 0), why);
            assertEquals(f, values[3].get(JAVA_FLOAT, 0), why);
            assertEquals(d, values[4].get(JAVA_DOUBLE, 0), why);
            assertEquals(deviceAddress + 256, values[5].get(JAVA_LONG, 0), "a slice passes its own address; " + why);
            for (int a = 0; a < 6; a++) {
                for (int b = a + 1; b < 6; b++) {
                    long gap = Math.abs(values[a].address() - values[b].address());
                    assertTrue(gap >= 8, "values " + a + " and " + b + " do not overlap; " + why);
                }
                long offset = values[a].address() - params.address();
                assertTrue(offset >= params.byteSize() || offset < 0,
                        "value " + a + " lies outside the pointer array; " + why);
            }
        }
    }

    @Test
    void anIntOccupiesExactlyFourLittleEndianBytes() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment params = KernelParams.pack(arena, 0x01020304);
            MemorySegment value = params.get(ADDRESS, 0).reinterpret(8);
            assertEquals(0x04, value.get(JAVA_BYTE, 0));
            assertEquals(0x01, value.get(JAVA_BYTE, 3));
            assertEquals(0, value.get(JAVA_INT, 4), "the rest of the slot stays zero");
        }
    }

    @Test
    void noArgumentsPackToNull() {
        try (Arena arena = Arena.ofConfined()) {
            assertEquals(MemorySegment.NULL, KernelParams.pack(arena));
        }
    }

    @Test
    void unsupportedArgumentIsRejectedNamingItsPositionAndType() {
        try (Arena arena = Arena.ofConfined()) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> KernelParams.pack(arena, 1L, "n", 2));
            assertEquals("kernel argument 1 is a String; pass long, int, float, double or DeviceBuffer", e.getMessage());
            IllegalArgumentException n = assertThrows(IllegalArgumentException.class,
                    () -> KernelParams.pack(arena, 1L, 2, null));
            assertEquals("kernel argument 2 is null", n.getMessage());
        }
    }

    @Test
    void closedBufferCannotBePassedToAKernel() {
        DeviceBuffer buffer = DeviceBuffer.wrap(null, 1L << 20, 64);
        buffer.close();
        try (Arena arena = Arena.ofConfined()) {
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> KernelParams.pack(arena, buffer));
            assertTrue(e.getMessage().contains("used after close()"), e.getMessage());
        }
    }
}
