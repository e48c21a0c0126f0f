package dev.kvant.cuda;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.SplittableRandom;

import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** NVRTC → kernel cache → cuModuleLoadData → cuLaunchKernel, with kvant's copy.cu and fill_check.cu. */
@Tag("gpu")
class KernelLaunchGpuTest {
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

    @Test
    void copyKernelCopiesEveryWordOverAPoisonedOutput() {
        long seed = GpuFixture.seed("copyKernelCopiesEveryWordOverAPoisonedOutput");
        SplittableRandom r = new SplittableRandom(seed);
        try (DeviceCopy copy = DeviceCopy.load(context, cache);
             CudaStream stream = context.createStream();
             Arena arena = Arena.ofConfined()) {
            for (long words : new long[]{1, 255, 257, 1_000_003, 132L * 8 * 256 * 3 + 7}) {
                long bytes = words * 16;
                String why = words + " words; seed " + seed;
                try (DeviceBuffer src = context.allocate(bytes + 16); DeviceBuffer dst = context.allocate(bytes + 16)) {
                    MemorySegment host = arena.allocate(bytes);
                    for (long i = 0; i < bytes / 8; i++) {
                        host.setAtIndex(JAVA_LONG, i, r.nextLong());
                    }
                    src.copyFromHost(host);
                    dst.fillFloats(Float.NaN);
                    copy.copy(src, dst, bytes, stream);
                    stream.synchronize();
                    MemorySegment back = arena.allocate(bytes + 16);
                    dst.copyToHost(back);
                    assertEquals(-1, back.asSlice(0, bytes).mismatch(host), why);
                    assertEquals(0x7FC00000, back.get(JAVA_INT, bytes), "the word past the end is untouched; " + why);
                }
            }
        }
    }

    @Test
    void copyRefusesMisalignedOrOverlappingBuffers() {
        try (DeviceCopy copy = DeviceCopy.load(context, cache); DeviceBuffer d = context.allocate(4096)) {
            assertThrows(IllegalArgumentException.class, () -> copy.copy(d.slice(8, 1024), d.slice(2048, 1024), 1024,
                    context.defaultStream()));
            assertThrows(IllegalArgumentException.class, () -> copy.copy(d, d.slice(16, 2048), 1024,
                    context.defaultStream()));
            assertThrows(IllegalArgumentException.class, () -> copy.copy(d, d.slice(2048, 2048), 1000,
                    context.defaultStream()));
        }
    }

    @Test
    void fillPatternWritesEveryElementAndTheCheckKernelCountsMismatches() {
        long seed = GpuFixture.seed("fillPatternWritesEveryElementAndTheCheckKernelCountsMismatches");
        int patternSeed = (int) seed;
        long n = 3_000_017;
        try (CudaModule module = context.loadModule(cache, KernelSource.resource("fill_check.cu"));
             DeviceBuffer data = context.allocate(n * 4);
             DeviceBuffer count = context.allocate(8);
             CudaStream stream = context.createStream();
             Arena arena = Arena.ofConfined()) {
            data.fillFloats(Float.NaN);
            module.function("kvant_fill_pattern").launch(Dim3.of(1024), Dim3.of(256), 0, stream, data, n, patternSeed);
            stream.synchronize();
            MemorySegment back = arena.allocate(n * 4);
            data.copyToHost(back);
            for (long i = 0; i < n; i++) {
                assertEquals(FillPattern.value(i, patternSeed), back.getAtIndex(JAVA_INT, i),
                        "element " + i + "; seed " + seed);
            }

            CudaFunction check = module.function("kvant_check_pattern");
            MemorySegment mismatches = arena.allocate(JAVA_LONG);
            count.fillInts(0);
            check.launch(Dim3.of(512), Dim3.of(256), 0, stream, data, n, patternSeed, count);
            stream.synchronize();
            count.copyToHost(mismatches);
            assertEquals(0, mismatches.get(JAVA_LONG, 0), "seed " + seed);

            long broken = new SplittableRandom(seed).nextLong(n);
            data.slice(broken * 4, 4).fillInts(~FillPattern.value(broken, patternSeed));
            count.fillInts(0);
            check.launch(Dim3.of(512), Dim3.of(256), 0, stream, data, n, patternSeed, count);
            stream.synchronize();
            count.copyToHost(mismatches);
            assertEquals(1, mismatches.get(JAVA_LONG, 0), "element " + broken + " was changed; seed " + seed);
        }
    }

    @Test
    void secondCompileIsACacheHitThatNeverReachesNvrtc(@TempDir Path dir) {
        GpuFixture.CountingCompiler nvrtc = new GpuFixture.CountingCompiler(Nvrtc.load());
        KernelCache counted = new KernelCache(dir, nvrtc, context.driverVersion());
        String arch = context.computeCapability().arch();
        KernelSource source = KernelSource.resource("copy.cu");
        byte[] first = counted.cubin(source, arch);
        byte[] second = counted.cubin(source, arch);
        assertEquals(1, nvrtc.calls);
        assertArrayEquals(first, second);
        assertEquals(new KernelCache.Stats(1, 1, 0), counted.stats());
        try (CudaModule module = context.loadModule("copy.cu (cached)", second)) {
            assertTrue(module.function("kvant_copy16").registers() > 0);
        }
    }

    @Test
    void corruptCacheFileIsRebuiltAndTheKernelStillRuns(@TempDir Path dir) throws IOException {
        long seed = GpuFixture.seed("corruptCacheFileIsRebuiltAndTheKernelStillRuns");
        GpuFixture.CountingCompiler nvrtc = new GpuFixture.CountingCompiler(Nvrtc.load());
        KernelCache counted = new KernelCache(dir, nvrtc, context.driverVersion());
        String arch = context.computeCapability().arch();
        KernelSource source = KernelSource.resource("fill_check.cu");
        counted.cubin(source, arch);
        Path file = dir.resolve(counted.key(source, arch, KernelCache.options(arch, Map.of())).fileName());
        byte[] bytes = Files.readAllBytes(file);
        int at = KernelCache.HEADER_BYTES + new SplittableRandom(seed).nextInt(bytes.length - KernelCache.HEADER_BYTES);
        bytes[at] ^= 0x40;
        Files.write(file, bytes);

        try (CudaModule module = context.loadModule(counted, source);
             DeviceBuffer data = context.allocate(4096 * 4);
             Arena arena = Arena.ofConfined()) {
            assertEquals(2, nvrtc.calls, "recompiled; seed " + seed);
            assertEquals(1, counted.stats().rebuilt());
            data.fillFloats(Float.NaN);
            module.function("kvant_fill_pattern").launch(Dim3.of(4), Dim3.of(256), 0, context.defaultStream(),
                    data, 4096L, 99);
            context.synchronize();
            MemorySegment back = arena.allocate(4096 * 4);
            data.copyToHost(back);
            for (long i = 0; i < 4096; i++) {
                assertEquals(FillPattern.value(i, 99), back.getAtIndex(JAVA_INT, i), "element " + i);
            }
        }
    }

    @Test
    void dynamicSharedMemoryAbove48KiBNeedsTheOptIn() {
        int bytes = Math.min(96 << 10, context.maxSharedMemoryPerBlockOptin());
        try (CudaModule module = context.loadModule(cache, KernelSource.resource("copy.cu"));
             DeviceBuffer src = context.allocate(4096);
             DeviceBuffer dst = context.allocate(4096)) {
            CudaFunction copy = module.function("kvant_copy16");
            CudaException refused = assertThrows(CudaException.class, () -> copy.launch(Dim3.of(1), Dim3.of(256),
                    bytes, context.defaultStream(), src, dst, 256L));
            // cuLaunchKernel, or cuLaunchKernelEx where launches overlap (sm_90+)
            assertTrue(refused.getMessage().matches("cuLaunchKernel(Ex)?\\(copy\\.cu:kvant_copy16, grid \\(1, 1, 1\\), "
                    + "block \\(256, 1, 1\\), shared " + bytes + " bytes(, overlapped)?\\) failed: CUDA_ERROR_.*"),
                    refused.getMessage());
            copy.setMaxDynamicSharedMemory(bytes);
            src.fillInts(42);
            copy.launch(Dim3.of(1), Dim3.of(256), bytes, context.defaultStream(), src, dst, 256L);
            context.synchronize();
            try (Arena arena = Arena.ofConfined()) {
                MemorySegment back = arena.allocate(4096);
                dst.copyToHost(back);
                assertEquals(42, back.getAtIndex(JAVA_INT, 1023));
            }
        }
    }

    @Test
    void launchOfMoreThan1024ThreadsPerBlockIsRefusedUpFront() {
        try (CudaModule module = context.loadModule(cache, KernelSource.resource("copy.cu"))) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> module.function("kvant_copy16")
                    .launch(Dim3.of(1), Dim3.of(64, 32), 0, context.defaultStream(), 0L, 0L, 0L));
            assertTrue(e.getMessage().contains("has 2048 threads; CUDA allows at most 1024"), e.getMessage());
        }
    }

    @Test
    void missingKernelNameIsAnErrorNamingIt() {
        try (CudaModule module = context.loadModule(cache, KernelSource.resource("copy.cu"))) {
            CudaException e = assertThrows(CudaException.class, () -> module.function("kvant_no_such_kernel"));
            assertTrue(e.getMessage().startsWith("cuModuleGetFunction(\"kvant_no_such_kernel\") failed: CUDA_ERROR_NOT_FOUND"),
                    e.getMessage());
        }
    }

    @Test
    void garbageImageIsRejectedByTheDriver() {
        // NUL-terminated text: the driver takes a non-ELF image for PTX and reads it up to the NUL.
        byte[] garbage = "this is not a cubin, nor PTX\0".getBytes(java.nio.charset.StandardCharsets.US_ASCII);
        CudaException e = assertThrows(CudaException.class, () -> context.loadModule("garbage.cubin", garbage));
        assertTrue(e.getMessage().startsWith("cuModuleLoadData(garbage.cubin, " + garbage.length
                + " bytes) failed: CUDA_ERROR_"), e.getMessage());
    }
}
