package dev.kvant.cuda;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Path;
import java.util.SplittableRandom;

import static java.lang.foreign.ValueLayout.JAVA_INT;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Stream capture into a CUDA graph, replay, and event timing. */
@Tag("gpu")
class CudaGraphGpuTest {
    private static CudaContext context;
    private static KernelCache cache;
    @TempDir
    static Path cacheDir;

    @BeforeAll
    static void open() {
        if (Cuda.available().ok()) {
            context = CudaContext.open();
        }
    }

    @BeforeEach
    void requireGpuAndNvrtc() {
        GpuFixture.assumeCuda();
        Nvrtc nvrtc = GpuFixture.assumeNvrtc();
        if (cache == null) {
            cache = new KernelCache(cacheDir, nvrtc, context.driverVersion());
        }
    }

    @AfterAll
    static void close() {
        if (context != null) {
            context.close();
        }
    }

    /**
     * Graph = [mix A in place; copy A → B]. Capture runs nothing; each replay advances A by one mix, so after three
     * replays B must equal mix³(A₀) — which two replays, or four, would not give.
     */
    @Test
    void captureOfTwoKernelsReplayedThreeTimesGivesThreeSteps() {
        long seed = GpuFixture.seed("captureOfTwoKernelsReplayedThreeTimesGivesThreeSteps");
        SplittableRandom r = new SplittableRandom(seed);
        int n = 1 << 20;
        int mixSeed = r.nextInt();
        try (CudaModule fill = context.loadModule(cache, KernelSource.resource("fill_check.cu"));
             DeviceCopy copy = DeviceCopy.load(context, cache);
             DeviceBuffer a = context.allocate(n * 4L);
             DeviceBuffer b = context.allocate(n * 4L);
             CudaStream stream = context.createStream();
             Arena arena = Arena.ofConfined()) {
            MemorySegment initial = arena.allocate(n * 4L);
            for (int i = 0; i < n; i++) {
                initial.setAtIndex(JAVA_INT, i, r.nextInt());
            }
            a.copyFromHost(initial);
            b.fillFloats(Float.NaN);
            CudaFunction mix = fill.function("kvant_mix_pattern");

            CudaGraph graph = CudaGraph.capture(stream, () -> {
                mix.launch(Dim3.of(256), Dim3.of(256), 0, stream, a, (long) n, mixSeed);
                copy.copy(a, b, n * 4L, stream);
            });
            try (graph) {
                MemorySegment back = arena.allocate(n * 4L);
                a.copyToHost(back);
                assertEquals(-1, back.mismatch(initial), "capture ran nothing; seed " + seed);

                for (int replay = 0; replay < 3; replay++) {
                    graph.launch(stream);
                }
                stream.synchronize();
                b.copyToHost(back);
                for (int i = 0; i < n; i++) {
                    int expected = initial.getAtIndex(JAVA_INT, i);
                    for (int step = 0; step < 3; step++) {
                        expected = FillPattern.mix(expected, i, mixSeed);
                    }
                    assertEquals(expected, back.getAtIndex(JAVA_INT, i), "element " + i + "; seed " + seed);
                }
            }
        }
    }

    @Test
    void theLegacyDefaultStreamCannotBeCaptured() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> CudaGraph.capture(context.defaultStream(), () -> { }));
        assertTrue(e.getMessage().contains("legacy default stream cannot be captured"), e.getMessage());
    }

    @Test
    void anExceptionDuringCaptureEndsTheCaptureAndLeavesTheStreamUsable() {
        try (CudaStream stream = context.createStream(); DeviceBuffer d = context.allocate(1024)) {
            IllegalStateException thrown = new IllegalStateException("boom");
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> CudaGraph.capture(stream, () -> {
                d.fillIntsAsync(1, stream);
                throw thrown;
            }));
            assertSame(thrown, e);
            try (CudaGraph again = CudaGraph.capture(stream, () -> d.fillIntsAsync(7, stream));
                 Arena arena = Arena.ofConfined()) {
                again.launch(stream);
                stream.synchronize();
                MemorySegment back = arena.allocate(1024);
                d.copyToHost(back);
                assertEquals(7, back.getAtIndex(JAVA_INT, 255));
            }
        }
    }

    @Test
    void allocatingDuringAGlobalCaptureFailsLoudly() {
        try (CudaStream stream = context.createStream()) {
            CudaException e = assertThrows(CudaException.class,
                    () -> CudaGraph.capture(stream, () -> context.allocate(1 << 20).close()));
            // The driver either refuses the allocation or invalidates the capture, which cuStreamEndCapture reports.
            assertTrue(e.getMessage().startsWith("cuMemAlloc_v2(1048576 bytes) failed: CUDA_ERROR_")
                    || e.getMessage().startsWith("cuStreamEndCapture("), e.getMessage());
        }
    }

    @Test
    void eventsTimeDeviceWorkInPositiveMilliseconds() {
        long bytes = 256L << 20;
        try (DeviceCopy copy = DeviceCopy.load(context, cache);
             DeviceBuffer src = context.allocate(bytes);
             DeviceBuffer dst = context.allocate(bytes);
             CudaStream stream = context.createStream();
             CudaEvent start = context.createEvent();
             CudaEvent end = context.createEvent()) {
            src.fillInts(0x3F800000);
            start.record(stream);
            copy.copy(src, dst, bytes, stream);
            end.record(stream);
            float ms = CudaEvent.elapsedMillis(start, end);
            assertTrue(ms > 0 && ms < 10_000, ms + " ms");
            double gbps = copy.bandwidthGBps(src, dst, bytes, 10, stream);
            System.out.printf("copy of %d MiB: %.3f ms once; %.0f GB/s read+write over 10%n", bytes >> 20, ms, gbps);
            assertTrue(gbps > 1, gbps + " GB/s");
        }
    }
}
