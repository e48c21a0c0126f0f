package dev.kvant.cuda;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.SplittableRandom;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Context, device memory, pinned memory and the pool, on a real GPU. */
@Tag("gpu")
class CudaMemoryGpuTest {
    private static CudaContext context;

    @BeforeAll
    static void open() {
        if (Cuda.available().ok()) {
            context = CudaContext.open();
            System.out.println(context + ", driver CUDA " + Cuda.versionString(context.driverVersion()));
        }
    }

    @BeforeEach
    void requireGpu() {
        GpuFixture.assumeCuda();
    }

    @AfterAll
    static void close() {
        if (context != null) {
            context.close();
        }
    }

    @Test
    void contextDescribesARealDevice() {
        assertFalse(context.deviceName().isBlank());
        assertTrue(context.computeCapability().major() >= 7, context.toString());
        assertTrue(context.multiprocessors() > 0, context.toString());
        CudaDriver.MemoryInfo memory = context.memoryInfo();
        assertTrue(memory.free() > 0 && memory.free() <= memory.total(), memory.toString());
        assertTrue(Math.abs(context.totalMemory() - memory.total()) <= context.totalMemory() / 100,
                "cuDeviceTotalMem " + context.totalMemory() + " and cuMemGetInfo " + memory.total() + " agree");
        assertTrue(context.maxSharedMemoryPerBlockOptin() >= 48 << 10, context.toString());
    }

    /**
     * Two contexts of one device share its primary context: what one made is freed when closed after that context,
     * while the other keeps the device open (it was skipped, and leaked, when its own context was closed), and the
     * other goes on working; once the last context of the device closes, closing what is left frees nothing and
     * does not fail.
     */
    @Test
    void whatAClosedContextMadeIsFreedWhileAnotherKeepsTheDevice() {
        long bytes = 512L << 20;
        try (CudaContext other = CudaContext.open(context.ordinal())) {
            CudaContext first = CudaContext.open(context.ordinal());
            DeviceBuffer buffer = first.allocate(bytes);
            CudaStream stream = first.createStream();
            CudaEvent event = first.createEvent();
            PinnedBuffer pinned = first.allocatePinned(4096);
            first.close();
            assertTrue(first.isClosed());
            long held = other.memoryInfo().free();
            buffer.close();
            stream.close();
            event.close();
            pinned.close();
            long freed = other.memoryInfo().free() - held;
            assertTrue(freed >= bytes - (32L << 20), "closing the buffer after its context gave back " + freed
                    + " bytes of its " + bytes);
            try (DeviceBuffer b = other.allocate(1 << 20); Arena arena = Arena.ofConfined()) {
                b.fillIntsAsync(7, other.defaultStream());
                other.synchronize();
                MemorySegment host = arena.allocate(1 << 20);
                b.copyToHost(host);
                assertEquals(7, host.get(JAVA_INT, 4096));
            }
        }
        // the suite's own context still holds the device: a third one opened and closed around it changes nothing
        CudaContext third = CudaContext.open(context.ordinal());
        DeviceBuffer late = third.allocate(1 << 20);
        third.close();
        late.close();
        try (DeviceBuffer b = context.allocate(1 << 20)) {
            assertEquals(1 << 20, b.byteSize());
        }
    }

    @Test
    void randomBytesSurviveHostToDeviceToDeviceToHost() {
        long seed = GpuFixture.seed("randomBytesSurviveHostToDeviceToDeviceToHost");
        SplittableRandom r = new SplittableRandom(seed);
        for (long bytes : new long[]{1, 17, 4096, 1_000_003, (64L << 20) + 5}) {
            String why = bytes + " bytes; seed " + seed;
            try (Arena arena = Arena.ofConfined();
                 DeviceBuffer a = context.allocate(bytes);
                 DeviceBuffer b = context.allocate(bytes)) {
                MemorySegment host = random(arena, bytes, r);
                MemorySegment back = arena.allocate(bytes);
                back.fill((byte) 0x5A);
                b.fillBytes((byte) 0xA5);
                a.copyFromHost(host);
                b.copyFrom(a);
                b.copyToHost(back);
                assertEquals(-1, back.mismatch(host), why);
                assertEquals(0, a.address() % 256, "cuMemAlloc is 256-byte aligned; " + why);
            }
        }
    }

    @Test
    void heapSegmentsAreStagedThroughNativeMemory() {
        long seed = GpuFixture.seed("heapSegmentsAreStagedThroughNativeMemory");
        int[] values = new SplittableRandom(seed).ints(10_001).toArray();
        int[] back = new int[values.length];
        java.util.Arrays.fill(back, 0x7FC00000);
        try (DeviceBuffer d = context.allocate(values.length * 4L)) {
            d.copyFromHost(MemorySegment.ofArray(values));
            d.copyToHost(MemorySegment.ofArray(back));
        }
        assertTrue(java.util.Arrays.equals(values, back), "seed " + seed);
    }

    @Test
    void asyncCopiesThroughPinnedMemoryOnAStream() {
        long seed = GpuFixture.seed("asyncCopiesThroughPinnedMemoryOnAStream");
        long bytes = (16L << 20) + 48;
        try (PinnedBuffer up = context.allocatePinned(bytes);
             PinnedBuffer down = context.allocatePinned(bytes);
             DeviceBuffer d = context.allocate(bytes);
             DeviceBuffer e = context.allocate(bytes);
             CudaStream stream = context.createStream()) {
            fillRandom(up.segment(), new SplittableRandom(seed));
            down.segment().fill((byte) 0x33);
            e.fillBytesAsync((byte) 0xCC, stream);
            d.copyFromHostAsync(up.segment(), 0, stream);
            e.copyFromAsync(d, 0, 0, bytes, stream);
            e.copyToHostAsync(down.segment(), 0, stream);
            stream.synchronize();
            assertEquals(-1, down.segment().mismatch(up.segment()), "seed " + seed);
        }
    }

    @Test
    void pinnedSegmentCannotBeTouchedAfterClose() {
        PinnedBuffer p = context.allocatePinned(4096);
        MemorySegment s = p.segment();
        s.set(JAVA_INT, 0, 7);
        p.close();
        assertThrows(IllegalStateException.class, () -> s.get(JAVA_INT, 0));
    }

    @Test
    void slicesCopyAtTheirOffsetAndNowhereElse() {
        long seed = GpuFixture.seed("slicesCopyAtTheirOffsetAndNowhereElse");
        try (Arena arena = Arena.ofConfined(); DeviceBuffer d = context.allocate(4096)) {
            d.fillBytes((byte) 0x11);
            MemorySegment patch = random(arena, 1000, new SplittableRandom(seed));
            d.slice(1000, 1000).copyFromHost(patch);
            MemorySegment back = arena.allocate(4096);
            d.copyToHost(back);
            for (long i = 0; i < 4096; i++) {
                byte expected = i >= 1000 && i < 2000 ? patch.get(JAVA_BYTE, i - 1000) : 0x11;
                assertEquals(expected, back.get(JAVA_BYTE, i), "byte " + i + "; seed " + seed);
            }
            MemorySegment part = arena.allocate(300);
            d.copyToHost(part, 1100);
            assertEquals(-1, part.mismatch(patch.asSlice(100, 300)), "seed " + seed);
        }
    }

    @Test
    void fillsSetEveryElement() {
        try (Arena arena = Arena.ofConfined(); DeviceBuffer d = context.allocate(1 << 20)) {
            MemorySegment back = arena.allocate(1 << 20);
            d.fillFloats(Float.NaN);
            d.copyToHost(back);
            for (long i = 0; i < (1 << 18); i++) {
                assertTrue(Float.isNaN(back.getAtIndex(java.lang.foreign.ValueLayout.JAVA_FLOAT, i)), "float " + i);
            }
            d.fillInts(0x12345678);
            d.copyToHost(back);
            for (long i = 0; i < (1 << 18); i++) {
                assertEquals(0x12345678, back.getAtIndex(JAVA_INT, i), "int " + i);
            }
        }
    }

    @Test
    void outOfRangeCopiesAreRefusedBeforeTheDriverSeesThem() {
        try (Arena arena = Arena.ofConfined(); DeviceBuffer d = context.allocate(1024)) {
            IndexOutOfBoundsException e = assertThrows(IndexOutOfBoundsException.class,
                    () -> d.copyFromHost(arena.allocate(1000), 100));
            assertTrue(e.getMessage().startsWith("copyFromHost: 1000 bytes at offset 100 do not fit device buffer 0x"),
                    e.getMessage());
            assertThrows(IndexOutOfBoundsException.class, () -> d.copyToHost(arena.allocate(2048)));
            assertThrows(IndexOutOfBoundsException.class, () -> d.slice(1000, 25));
            assertThrows(IndexOutOfBoundsException.class, () -> d.copyFrom(d, -1, 0, 4));
            assertThrows(IllegalArgumentException.class, () -> context.allocate(0));
        }
    }

    @Test
    void outOfMemoryNamesTheCallTheSizeAndTheError() {
        long absurd = 1L << 50;
        CudaException e = assertThrows(CudaException.class, () -> context.allocate(absurd));
        assertEquals("cuMemAlloc_v2(" + absurd + " bytes) failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)",
                e.getMessage());
        assertEquals(2, e.code());
    }

    @Test
    void buffersRefuseUseAfterClose() {
        DeviceBuffer d = context.allocate(256);
        DeviceBuffer slice = d.slice(0, 128);
        d.close();
        d.close();
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> d.fillBytes((byte) 0));
        assertTrue(e.getMessage().contains("used after close()"), e.getMessage());
        IllegalStateException s = assertThrows(IllegalStateException.class, () -> slice.fillBytes((byte) 0));
        assertTrue(s.getMessage().contains("slice of a buffer that was closed"), s.getMessage());
    }

    @Test
    void poolHandsOutAlignedDisjointScratchAndTheSameAddressesAfterReset() {
        long seed = GpuFixture.seed("poolHandsOutAlignedDisjointScratchAndTheSameAddressesAfterReset");
        SplittableRandom r = new SplittableRandom(seed);
        try (DevicePool pool = context.createPool(64L << 20); Arena arena = Arena.ofConfined()) {
            long[] sizes = r.longs(20, 4, 1 << 20).toArray();
            long[] first = new long[sizes.length];
            DeviceBuffer[] buffers = new DeviceBuffer[sizes.length];
            for (int i = 0; i < sizes.length; i++) {
                buffers[i] = pool.allocate(sizes[i]);
                first[i] = buffers[i].address();
                assertEquals(0, first[i] % DevicePool.ALIGNMENT, "seed " + seed);
                assertEquals(sizes[i], buffers[i].byteSize());
            }
            for (int i = 0; i < sizes.length; i++) {
                buffers[i].slice(0, sizes[i] & -4L).fillInts(i);
            }
            for (int i = 0; i < sizes.length; i++) {
                MemorySegment back = arena.allocate(sizes[i] & -4L);
                buffers[i].copyToHost(back);
                for (long w = 0; w < back.byteSize() / 4; w += 997) {
                    assertEquals(i, back.getAtIndex(JAVA_INT, w), "slice " + i + " was overwritten; seed " + seed);
                }
                assertEquals(i, back.getAtIndex(JAVA_INT, back.byteSize() / 4 - 1), "last word; seed " + seed);
            }
            long used = pool.used();
            pool.reset();
            assertEquals(0, pool.used());
            assertEquals(used, pool.highWater());
            IllegalStateException stale = assertThrows(IllegalStateException.class, () -> buffers[0].fillInts(0));
            assertTrue(stale.getMessage().contains("DevicePool that was reset"), stale.getMessage());
            for (int i = 0; i < sizes.length; i++) {
                assertEquals(first[i], pool.allocate(sizes[i]).address(),
                        "the same sequence gets the same addresses (graph replay relies on it); seed " + seed);
            }
        }
    }

    @Test
    void exhaustedPoolThrowsInsteadOfAllocating() {
        try (DevicePool pool = context.createPool(1 << 20)) {
            pool.allocate(1 << 19);
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> pool.allocate((1 << 19) + 1));
            assertTrue(e.getMessage().startsWith("device pool of 1048576 bytes is exhausted"), e.getMessage());
            // a size near Long.MAX_VALUE, whose rounding would wrap to a negative size, is refused as well
            assertThrows(IllegalStateException.class, () -> pool.allocate(Long.MAX_VALUE - 100));
        }
    }

    @Test
    void aContextIsUsableFromAnotherThread() throws Exception {
        long seed = GpuFixture.seed("aContextIsUsableFromAnotherThread");
        try (Arena arena = Arena.ofShared(); DeviceBuffer d = context.allocate(4096)) {
            MemorySegment host = random(arena, 4096, new SplittableRandom(seed));
            MemorySegment back = arena.allocate(4096);
            Thread platform = Thread.ofPlatform().start(() -> d.copyFromHost(host));
            platform.join();
            Thread virtual = Thread.ofVirtual().start(() -> d.copyToHost(back));
            virtual.join();
            assertEquals(-1, back.mismatch(host), "seed " + seed);
        }
    }

    @Test
    void twoStreamsAreDistinctAndTheDefaultStreamIsNull() {
        try (CudaStream a = context.createStream(); CudaStream b = context.createStream()) {
            assertNotEquals(a.handle(), b.handle());
            assertTrue(context.defaultStream().isLegacyDefault());
            assertFalse(a.isLegacyDefault());
        }
    }

    private static MemorySegment random(Arena arena, long bytes, SplittableRandom r) {
        MemorySegment s = arena.allocate(bytes);
        fillRandom(s, r);
        return s;
    }

    private static void fillRandom(MemorySegment s, SplittableRandom r) {
        for (long i = 0; i < s.byteSize(); i++) {
            s.set(JAVA_BYTE, i, (byte) r.nextInt());
        }
    }
}
