package dev.kvant.cuda;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.SplittableRandom;

import static java.lang.foreign.ValueLayout.JAVA_FLOAT;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * cuBLASLt's C[m,n] = A[m,k]·B[n,k]ᵀ against a float64 reference computed from the same half-precision inputs.
 * With fp32 accumulation of exactly representable products, the only error is fp32 rounding of the sums (and of
 * the output, when it is half precision), far inside NMSE 1e-5.
 */
@Tag("gpu")
class CublasLtGpuTest {
    private static final double NMSE_LIMIT = 1e-5;
    private static CudaContext context;
    private static CublasLt blas;

    @BeforeAll
    static void open() {
        if (Cuda.available().ok()) {
            context = CudaContext.open();
            blas = CublasLt.create(context);
            System.out.println("cuBLASLt " + CublasLt.libraryVersion() + " from " + CublasLt.libraryPath());
        }
    }

    @BeforeEach
    void requireGpu() {
        GpuFixture.assumeCuda();
    }

    @AfterAll
    static void close() {
        if (blas != null) {
            blas.close();
        }
        if (context != null) {
            context.close();
        }
    }

    @Test
    void f16GemmWithF32OutputMatchesFloat64Reference() {
        long seed = GpuFixture.seed("f16GemmWithF32OutputMatchesFloat64Reference");
        check(37, 96, 160, CudaDataType.F16, CudaDataType.F32, seed);
        check(128, 512, 1024, CudaDataType.F16, CudaDataType.F32, seed + 1);
        check(1, 4096, 4096, CudaDataType.F16, CudaDataType.F32, seed + 2);
    }

    @Test
    void bf16GemmWithF32OutputMatchesFloat64Reference() {
        long seed = GpuFixture.seed("bf16GemmWithF32OutputMatchesFloat64Reference");
        check(37, 96, 160, CudaDataType.BF16, CudaDataType.F32, seed);
        check(64, 256, 2048, CudaDataType.BF16, CudaDataType.F32, seed + 1);
    }

    @Test
    void halfPrecisionOutputsMatchFloat64Reference() {
        long seed = GpuFixture.seed("halfPrecisionOutputsMatchFloat64Reference");
        check(48, 128, 256, CudaDataType.F16, CudaDataType.F16, seed);
        check(48, 128, 256, CudaDataType.BF16, CudaDataType.BF16, seed + 1);
    }

    @Test
    void gemmCapturedInAGraphReplaysToTheSameResult() {
        long seed = GpuFixture.seed("gemmCapturedInAGraphReplaysToTheSameResult");
        int m = 16, n = 256, k = 512;
        try (Arena arena = Arena.ofConfined();
             DeviceBuffer a = context.allocate((long) m * k * 2);
             DeviceBuffer b = context.allocate((long) n * k * 2);
             DeviceBuffer c = context.allocate((long) m * n * 4);
             CudaStream stream = context.createStream()) {
            SplittableRandom r = new SplittableRandom(seed);
            double[] ad = upload(arena, a, m * k, CudaDataType.F16, r);
            double[] bd = upload(arena, b, n * k, CudaDataType.F16, r);
            blas.gemm(a, b, c, m, n, k, CudaDataType.F16, CudaDataType.F32, stream); // plans outside the capture
            stream.synchronize();
            c.fillFloats(Float.NaN);
            try (CudaGraph graph = CudaGraph.capture(stream,
                    () -> blas.gemm(a, b, c, m, n, k, CudaDataType.F16, CudaDataType.F32, stream))) {
                graph.launch(stream);
                stream.synchronize();
            }
            double nmse = nmse(download(arena, c, m * n, CudaDataType.F32), reference(ad, bd, m, n, k));
            assertTrue(nmse < NMSE_LIMIT, "NMSE " + nmse + "; seed " + seed);
        }
    }

    @Test
    void mismatchedShapesAndTypesAreRefusedBeforeCublas() {
        try (DeviceBuffer a = context.allocate(1024); DeviceBuffer c = context.allocate(1024)) {
            // 32x32 f16 operands need 2 KiB, more than the 1 KiB buffers hold.
            assertThrows(IndexOutOfBoundsException.class, () -> blas.gemm(a, a, c, 32, 32, 32, CudaDataType.F16,
                    CudaDataType.F32, context.defaultStream()));
            assertThrows(IllegalArgumentException.class, () -> blas.gemm(a, a, c, 2, 2, 2, CudaDataType.F32,
                    CudaDataType.F32, context.defaultStream()));
            assertThrows(IllegalArgumentException.class, () -> blas.gemm(a, a, c, 2, 2, 2, CudaDataType.F16,
                    CudaDataType.BF16, context.defaultStream()));
        }
    }

    private static void check(int m, int n, int k, CudaDataType in, CudaDataType out, long seed) {
        String why = "m=" + m + " n=" + n + " k=" + k + " " + in + "→" + out + "; seed " + seed;
        SplittableRandom r = new SplittableRandom(seed);
        try (Arena arena = Arena.ofConfined();
             DeviceBuffer a = context.allocate((long) m * k * in.bytes());
             DeviceBuffer b = context.allocate((long) n * k * in.bytes());
             DeviceBuffer c = context.allocate((long) m * n * out.bytes());
             CudaStream stream = context.createStream()) {
            double[] ad = upload(arena, a, m * k, in, r);
            double[] bd = upload(arena, b, n * k, in, r);
            c.fillBytes((byte) 0xFF); // NaN in every type
            blas.gemm(a, b, c, m, n, k, in, out, stream);
            stream.synchronize();
            double[] got = download(arena, c, m * n, out);
            double nmse = nmse(got, reference(ad, bd, m, n, k));
            System.out.printf("cuBLASLt %s: NMSE %.3e%n", why, nmse);
            assertTrue(nmse < NMSE_LIMIT, "NMSE " + nmse + " for " + why);
        }
    }

    /** C[i][j] = Σ_p A[i][p]·B[j][p] in float64, over the half-precision values actually uploaded. */
    static double[] reference(double[] a, double[] b, int m, int n, int k) {
        double[] c = new double[m * n];
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < n; j++) {
                double sum = 0;
                for (int p = 0; p < k; p++) {
                    sum += a[i * k + p] * b[j * k + p];
                }
                c[i * n + j] = sum;
            }
        }
        return c;
    }

    /** Σ(got − ref)² / Σ ref²; NaN (an unwritten output) fails any limit. */
    static double nmse(double[] got, double[] ref) {
        double err = 0, norm = 0;
        for (int i = 0; i < ref.length; i++) {
            double d = got[i] - ref[i];
            err += d * d;
            norm += ref[i] * ref[i];
        }
        return err / norm;
    }

    /** Uniform values in [-1, 1), rounded to {@code type}; returns them exactly as the device sees them. */
    private static double[] upload(Arena arena, DeviceBuffer target, int count, CudaDataType type, SplittableRandom r) {
        MemorySegment host = arena.allocate((long) count * 2);
        double[] exact = new double[count];
        for (int i = 0; i < count; i++) {
            float v = (float) r.nextDouble(-1, 1);
            short bits = type == CudaDataType.F16 ? Float.floatToFloat16(v) : toBf16(v);
            host.setAtIndex(JAVA_SHORT, i, bits);
            exact[i] = type == CudaDataType.F16 ? Float.float16ToFloat(bits) : fromBf16(bits);
        }
        target.copyFromHost(host);
        return exact;
    }

    private static double[] download(Arena arena, DeviceBuffer source, int count, CudaDataType type) {
        MemorySegment host = arena.allocate((long) count * type.bytes());
        source.copyToHost(host);
        double[] out = new double[count];
        for (int i = 0; i < count; i++) {
            out[i] = switch (type) {
                case F32 -> host.getAtIndex(JAVA_FLOAT, i);
                case F16 -> Float.float16ToFloat(host.getAtIndex(JAVA_SHORT, i));
                case BF16 -> fromBf16(host.getAtIndex(JAVA_SHORT, i));
            };
        }
        return out;
    }

    /** Round to nearest even, the conversion cuda_bf16.h's __float2bfloat16 performs (inputs here are finite). */
    static short toBf16(float v) {
        int bits = Float.floatToRawIntBits(v);
        return (short) ((bits + 0x7FFF + ((bits >>> 16) & 1)) >>> 16);
    }

    static float fromBf16(short bits) {
        return Float.intBitsToFloat((bits & 0xFFFF) << 16);
    }
}
