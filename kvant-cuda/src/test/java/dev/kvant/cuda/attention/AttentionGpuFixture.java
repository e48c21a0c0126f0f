package dev.kvant.cuda.attention;

import dev.kvant.cuda.Cuda;
import dev.kvant.cuda.CudaAvailability;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaUnavailableException;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.Nvrtc;
import dev.kvant.cuda.TestSeed;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Assumptions;

/**
 * What the attention GPU tests share: one context and kernel cache for the whole run (modules compile once, in
 * parallel, on first use), the skip-without-CUDA assumption, printed seeds, and float/int transfers.
 */
final class AttentionGpuFixture {
    private static CudaContext context;
    private static KernelCache cache;
    private static boolean warmed;

    private AttentionGpuFixture() {
    }

    /** Skips the calling test unless a CUDA device and NVRTC can be used; opens them once. */
    static synchronized CudaContext context() {
        CudaAvailability a = Cuda.available();
        Assumptions.assumeTrue(a.ok(), () -> "no CUDA GPU: " + a.reason());
        try {
            Nvrtc.load();
        } catch (CudaUnavailableException e) {
            Assumptions.abort("no NVRTC: " + e.getMessage());
        }
        if (context == null) {
            context = CudaContext.open();
            cache = KernelCache.open(context);
        }
        return context;
    }

    /** The kernel cache, with every standard attention module compiled (in parallel) the first time. */
    static synchronized KernelCache cache() {
        context();
        if (!warmed) {
            long t0 = System.nanoTime();
            AttentionPrecompile.compile(cache, context.computeCapability().arch(), AttentionPrecompile.standardShapes(),
                    Runtime.getRuntime().availableProcessors());
            AttentionPrecompile.compile(cache, context.computeCapability().arch(),
                    AttentionPrecompile.selectionShapes(), Runtime.getRuntime().availableProcessors(), true);
            System.out.printf("attention modules ready in %.1f s (%s)%n", (System.nanoTime() - t0) / 1e9,
                    cache.stats());
            warmed = true;
        }
        return cache;
    }

    /** A fresh seed, printed; {@code -Dkvant.test.seed=N} replays N (a failing run's printed seed). */
    static long seed(String test) {
        long seed = TestSeed.next();
        System.out.println(test + ": seed " + seed);
        return seed;
    }

    static DeviceBuffer upload(CudaContext context, float[] values) {
        DeviceBuffer b = context.allocate(4L * Math.max(1, values.length));
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(4L * Math.max(1, values.length), 16);
            MemorySegment.copy(values, 0, s, ValueLayout.JAVA_FLOAT, 0, values.length);
            b.copyFromHost(s);
        }
        return b;
    }

    static DeviceBuffer upload(CudaContext context, int[] values) {
        DeviceBuffer b = context.allocate(4L * Math.max(1, values.length));
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(4L * Math.max(1, values.length), 16);
            MemorySegment.copy(values, 0, s, ValueLayout.JAVA_INT, 0, values.length);
            b.copyFromHost(s);
        }
        return b;
    }

    static float[] download(DeviceBuffer b, int count) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(4L * count, 16);
            b.copyToHost(s);
            return s.toArray(ValueLayout.JAVA_FLOAT);
        }
    }

    static byte[] downloadBytes(DeviceBuffer b) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(b.byteSize(), 16);
            b.copyToHost(s);
            return s.toArray(ValueLayout.JAVA_BYTE);
        }
    }

    /** Gaussian values; every {@code outlierEvery}-th row gets two RoPE channel pairs (i, i + d/2) times 4. */
    static float[] gaussianRows(SplittableRandom r, int rows, int d, double scale, int outlierEvery) {
        float[] x = new float[rows * d];
        for (int row = 0; row < rows; row++) {
            for (int i = 0; i < d; i++) {
                x[row * d + i] = (float) (gaussian(r) * scale);
            }
            if (outlierEvery > 0 && row % outlierEvery == 0) {
                for (int i : new int[] {3, 3 + d / 2, 11, 11 + d / 2}) {
                    x[row * d + i] *= 4f;
                }
            }
        }
        return x;
    }

    static double gaussian(SplittableRandom r) {
        double u1 = 1.0 - r.nextDouble();
        double u2 = r.nextDouble();
        return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2);
    }
}
