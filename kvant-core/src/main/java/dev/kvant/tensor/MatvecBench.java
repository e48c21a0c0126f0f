package dev.kvant.tensor;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import jdk.incubator.vector.LongVector;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorSpecies;

/**
 * Throughput of the weight kernels beside the machine's own memory bandwidth, measured in one run so the ratio
 * means something on a shared machine. Not a test: nothing is asserted.
 *
 * <pre>
 * java --add-modules jdk.incubator.vector -cp kvant-core/target/classes dev.kvant.tensor.MatvecBench [threads,...] [matrix MiB]
 * </pre>
 *
 * <ul>
 *   <li>copy: {@code MemorySegment.copy} of a buffer far larger than caches, counting bytes read plus written;
 *   <li>read: a vectorized sum over the matrix-sized buffer (pure streaming read, what a matvec does);
 *   <li>matvec: bytes of weights per second on a matrix of the given size (4096 columns, rows to fill it);
 *   <li>matmul: GFLOP/s (2 * rows * cols * n) for n = 512 vectors on prompt-sized shapes.
 * </ul>
 * Each figure is the median of several repetitions after warm-up.
 */
public final class MatvecBench {
    /** One measured figure. */
    public record Result(String what, double value, String unit) {
        @Override
        public String toString() {
            return String.format(Locale.ROOT, "%-34s %9.2f %s", what, value, unit);
        }
    }

    private static final int REPS = 7;
    private static final int MATVEC_COLS = 4096;
    private static final GgmlType[] MATVEC_TYPES = {GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.F16,
            GgmlType.Q6_K, GgmlType.Q5_K, GgmlType.BF16, GgmlType.F32};
    private static final GgmlType[] MATMUL_TYPES = {GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_0, GgmlType.Q4_K};
    /** rows x cols of the matmul shapes: a 2048-wide projection, and a 512-wide model's FFN up and down. */
    private static final int[][] MATMUL_SHAPES = {{2048, 2048}, {1536, 512}, {512, 1536}};

    private MatvecBench() {
    }

    public static void main(String[] args) {
        int[] threadCounts = args.length > 0
                ? Arrays.stream(args[0].split(",")).mapToInt(Integer::parseInt).toArray() : new int[]{1, 2};
        long matrixBytes = (args.length > 1 ? Long.parseLong(args[1]) : 1024) << 20;
        System.out.println("lanes: " + Lanes.F + ", cpus: " + Runtime.getRuntime().availableProcessors());
        for (int threads : threadCounts) {
            System.out.println("== " + threads + " thread(s), matvec matrix " + (matrixBytes >> 20) + " MiB");
            run(threads, matrixBytes, true);
        }
    }

    /** Runs every measurement at {@code threads} threads; prints each line as it comes when {@code print}. */
    public static List<Result> run(int threads, long matrixBytes, boolean print) {
        List<Result> results = new ArrayList<>();
        try (Parallel pool = new Parallel(threads); Arena arena = Arena.ofShared()) {
            MemorySegment big = arena.allocate(matrixBytes, 64);
            fill(big);
            add(results, print, new Result("copy (read+write)", copyBandwidth(big, pool), "GB/s"));
            add(results, print, new Result("read (streaming sum)", readBandwidth(big, pool), "GB/s"));
            for (GgmlType type : MATVEC_TYPES) {
                add(results, print, new Result("matvec " + type, matvecBandwidth(type, big, pool), "GB/s"));
            }
            for (int[] shape : MATMUL_SHAPES) {
                for (GgmlType type : MATMUL_TYPES) {
                    add(results, print, new Result("matmul " + type + " " + shape[0] + "x" + shape[1] + " n=512",
                            matmulGflops(type, shape[0], shape[1], 512, pool, arena), "GFLOP/s"));
                }
            }
        }
        return results;
    }

    private static void add(List<Result> results, boolean print, Result r) {
        results.add(r);
        if (print) {
            System.out.println(r);
        }
    }

    private static void fill(MemorySegment s) {
        SplittableRandom random = new SplittableRandom(1);
        for (long i = 0; i + 8 <= s.byteSize(); i += 8) {
            s.set(java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED, i, random.nextLong());
        }
    }

    /** Copies half the buffer onto the other half, split over the pool; counts read plus written bytes. */
    private static double copyBandwidth(MemorySegment big, Parallel pool) {
        long half = big.byteSize() / 2;
        int parts = pool.threads();
        long part = half / parts;
        double seconds = median(() -> pool.forEach(parts, t ->
                MemorySegment.copy(big, t * part, big, half + t * part, part)));
        return 2.0 * part * parts / seconds / 1e9;
    }

    private static volatile long sink;

    private static double readBandwidth(MemorySegment big, Parallel pool) {
        VectorSpecies<Long> species = LongVector.SPECIES_PREFERRED;
        int parts = pool.threads();
        long part = big.byteSize() / parts / 64 * 64;
        long[] sums = new long[parts];
        double seconds = median(() -> {
            pool.forEach(parts, t -> {
                LongVector a0 = LongVector.zero(species), a1 = a0, a2 = a0, a3 = a0;
                long step = species.vectorByteSize();
                long end = (t + 1) * part;
                for (long at = t * part; at + 4 * step <= end; at += 4 * step) {
                    a0 = a0.add(LongVector.fromMemorySegment(species, big, at, java.nio.ByteOrder.LITTLE_ENDIAN));
                    a1 = a1.add(LongVector.fromMemorySegment(species, big, at + step, java.nio.ByteOrder.LITTLE_ENDIAN));
                    a2 = a2.add(LongVector.fromMemorySegment(species, big, at + 2 * step, java.nio.ByteOrder.LITTLE_ENDIAN));
                    a3 = a3.add(LongVector.fromMemorySegment(species, big, at + 3 * step, java.nio.ByteOrder.LITTLE_ENDIAN));
                }
                sums[t] = a0.add(a1).add(a2).add(a3).reduceLanes(VectorOperators.ADD);
            });
            sink += sums[0];
        });
        return (double) part * parts / seconds / 1e9;
    }

    /**
     * A matrix of {@code type} filling as much of {@code big} as whole rows allow. The bytes are 64 really
     * quantized rows repeated, so scales are sane (no NaN or subnormal surprises) yet every byte must be read.
     */
    private static double matvecBandwidth(GgmlType type, MemorySegment big, Parallel pool) {
        WeightFormat f = WeightFormat.of(type);
        long rowBytes = f.bytesFor(MATVEC_COLS);
        int rows = (int) Math.min(Integer.MAX_VALUE & ~3, big.byteSize() / rowBytes) & ~3;
        MemorySegment data = big.asSlice(0, rows * rowBytes);
        int distinct = 64;
        float[] values = gaussian(distinct * MATVEC_COLS, 2);
        for (int r = 0; r < distinct; r++) {
            f.quantize(values, r * MATVEC_COLS, MATVEC_COLS, data, r * rowBytes);
        }
        MemorySegment pattern = data.asSlice(0, distinct * rowBytes);
        for (long at = distinct * rowBytes; at < data.byteSize(); at += pattern.byteSize()) {
            MemorySegment.copy(pattern, 0, data, at, Math.min(pattern.byteSize(), data.byteSize() - at));
        }
        WeightMatrix m = new WeightMatrix("bench." + type, f, data, rows, MATVEC_COLS);
        float[] x = gaussian(MATVEC_COLS, 3);
        float[] out = new float[rows];
        double seconds = median(() -> m.matvec(x, out, pool));
        return data.byteSize() / seconds / 1e9;
    }

    private static double matmulGflops(GgmlType type, int rows, int cols, int n, Parallel pool, Arena arena) {
        WeightFormat f = WeightFormat.of(type);
        MemorySegment data = arena.allocate(f.bytesFor(cols) * rows, 64);
        float[] values = gaussian(rows * cols, 4);
        for (int r = 0; r < rows; r++) {
            f.quantize(values, r * cols, cols, data, r * f.bytesFor(cols));
        }
        WeightMatrix m = new WeightMatrix("bench." + type, f, data, rows, cols);
        float[] x = gaussian(n * cols, 5);
        float[] out = new float[n * rows];
        double seconds = median(() -> m.matmul(x, n, out, pool));
        return 2.0 * rows * cols * n / seconds / 1e9;
    }

    private static float[] gaussian(int n, long seed) {
        SplittableRandom random = new SplittableRandom(seed);
        float[] v = new float[n];
        for (int i = 0; i < n; i++) {
            double u = random.nextDouble(1e-12, 1);
            v[i] = (float) (Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random.nextDouble()));
        }
        return v;
    }

    /** Median seconds of {@link #REPS} timed runs, after three untimed ones. */
    private static double median(Runnable body) {
        for (int i = 0; i < 3; i++) {
            body.run();
        }
        double[] t = new double[REPS];
        for (int i = 0; i < REPS; i++) {
            long start = System.nanoTime();
            body.run();
            t[i] = (System.nanoTime() - start) / 1e9;
        }
        Arrays.sort(t);
        return t[REPS / 2];
    }
}
