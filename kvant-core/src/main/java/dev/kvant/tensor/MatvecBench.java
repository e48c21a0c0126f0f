package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.L;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorSpecies;

/**
 * Throughput of the weight kernels beside the machine's own memory bandwidth, measured in one run so the ratio
 * means something on a shared machine. Not a test: nothing is asserted.
 *
 * <pre>
 * java --add-modules jdk.incubator.vector --enable-native-access=ALL-UNNAMED -cp kvant-core/target/classes \
 *     dev.kvant.tensor.MatvecBench [threads,...] [matrix MiB] [small|matvec|matmul|all]
 * java ... dev.kvant.tensor.MatvecBench [threads,...] model FILE.gguf
 * </pre>
 *
 * <ul>
 *   <li>copy: {@code MemorySegment.copy} between two 256 MiB buffers, counting bytes read plus written;
 *   <li>read: a vectorized sum over the matrix-sized buffer (pure streaming read, what a matvec does);
 *   <li>matvec: bytes of weights per second on a matrix of the given size (4096 columns, rows to fill it),
 *       and its ratio to the copy bandwidth, each repetition's matvec timed right after a copy (the machine may
 *       be shared, and its memory bandwidth drifts with what runs beside); formats with a packed layout
 *       (Q4_0) are measured in the file's layout too;
 *   <li>matmul: GFLOP/s (2 * rows * cols * n) for n = 512 vectors on prompt-sized shapes;
 *   <li>model: the matvec of every 2-D matrix of a GGUF file but the token embedding, one after the other in the
 *       file's order, as a decode step reads them (a model larger than the caches streams from memory), in the
 *       file's layout and as {@link WeightMatrix#packForCpu} lays them out: ms per pass, GB/s, and µs per pass
 *       of each matrix shape.
 * </ul>
 * Matrices are packed for the CPU kernels first ({@link WeightMatrix#packForCpu}), as the CPU backend does.
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
        if (args.length > 2 && args[1].equals("model")) {
            System.out.println("lanes: " + Lanes.F + ", cpus: " + Runtime.getRuntime().availableProcessors());
            for (int threads : threadCounts) {
                System.out.println("== " + threads + " thread(s), " + args[2]);
                for (boolean pack : new boolean[]{false, true}) {
                    model(java.nio.file.Path.of(args[2]), threads, pack).forEach(System.out::println);
                }
            }
            return;
        }
        long matrixBytes = (args.length > 1 ? Long.parseLong(args[1]) : 1024) << 20;
        String parts = args.length > 2 ? args[2] : "all";
        System.out.println("lanes: " + Lanes.F + ", cpus: " + Runtime.getRuntime().availableProcessors());
        for (int threads : threadCounts) {
            System.out.println("== " + threads + " thread(s), matvec matrix " + (matrixBytes >> 20) + " MiB");
            run(threads, matrixBytes, parts, true);
        }
    }

    /**
     * Runs the measurements at {@code threads} threads: {@code parts} is "small" (pool overhead and decode-sized
     * matvecs), "matvec" (those and streaming matvecs), "matmul", or "all". Prints each line as it comes when
     * {@code print}.
     */
    public static List<Result> run(int threads, long matrixBytes, String parts, boolean print) {
        List<Result> results = new ArrayList<>();
        try (Parallel pool = new Parallel(threads); Arena arena = Arena.ofShared()) {
            boolean streaming = parts.equals("all") || parts.equals("matvec");
            if (!parts.equals("matmul")) {
                add(results, print, new Result("pool forEach, 8 empty tasks", forEachMicros(pool), "us/call"));
                for (GgmlType type : new GgmlType[]{GgmlType.Q8_0, GgmlType.Q4_K}) {
                    add(results, print, new Result("matvec " + type + " 512x512 (decode-sized)",
                            smallMatvecMicros(type, pool, arena), "us/call"));
                }
                if (threads == 1) {
                    for (GgmlType type : MATVEC_TYPES) {
                        add(results, print, new Result("in-cache matvec " + type + ", per CPU second",
                                inCacheGigaValues(type, arena), "G values"));
                    }
                }
            }
            if (streaming) {
                MemorySegment big = arena.allocate(matrixBytes, 64);
                MemorySegment copyBuffers = arena.allocate(COPY_BYTES * 2, 64);
                fill(big);
                fill(copyBuffers);
                Runnable copy = copier(copyBuffers, pool);
                double copyRate = 2.0 * COPY_BYTES / median(copy) / 1e9;
                add(results, print, new Result("copy (read+write)", copyRate, "GB/s"));
                add(results, print, new Result("read (streaming sum)", readBandwidth(big, pool), "GB/s"));
                for (GgmlType type : MATVEC_TYPES) {
                    double[] rateAndRatio = matvecBandwidth(type, big, pool, copy, true);
                    add(results, print, new Result("matvec " + type, rateAndRatio[0], "GB/s"));
                    add(results, print, new Result("matvec " + type + " / copy", rateAndRatio[1], "x"));
                    if (((FusedRows) WeightFormat.of(type)).packing(MATVEC_COLS) != null) {
                        rateAndRatio = matvecBandwidth(type, big, pool, copy, false);
                        add(results, print, new Result("matvec " + type + ", file layout", rateAndRatio[0], "GB/s"));
                        add(results, print, new Result("matvec " + type + ", file layout / copy", rateAndRatio[1],
                                "x"));
                    }
                }
            }
            if (parts.equals("all") || parts.equals("matmul")) {
                add(results, print, new Result("fma peak (independent vector fmas, all threads)", fmaPeakGflops(pool),
                        "GFLOP/s"));
            }
            for (int[] shape : parts.equals("all") || parts.equals("matmul") ? MATMUL_SHAPES : new int[0][]) {
                for (GgmlType type : MATMUL_TYPES) {
                    add(results, print, new Result("matmul " + type + " " + shape[0] + "x" + shape[1] + " n=512",
                            matmulGflops(type, shape[0], shape[1], 512, pool, arena), "GFLOP/s"));
                }
            }
        }
        return results;
    }

    /**
     * The matvecs of a decode step over the model at {@code path}: every 2-D matrix but the token embedding, in
     * the file's order, the file's layout or (with {@code pack}) {@link WeightMatrix#packForCpu}'s.
     */
    public static List<Result> model(java.nio.file.Path path, int threads, boolean pack) {
        List<Result> results = new ArrayList<>();
        dev.kvant.gguf.GgufFile file = dev.kvant.gguf.GgufFile.open(path);
        try (Parallel pool = new Parallel(threads)) {
            List<WeightMatrix> ms = new ArrayList<>();
            long bytes = 0;
            for (dev.kvant.gguf.GgufTensorInfo t : file.tensors()) {
                if (t.dims() != 2 || t.name().equals("token_embd.weight")) {
                    continue;
                }
                WeightMatrix m = new WeightMatrix(t.name(), WeightFormat.of(t.type()), file.data(t), (int) t.rows(),
                        (int) t.rowLength());
                if (pack) {
                    m.packForCpu(pool);
                }
                ms.add(m);
                bytes += m.rowBytes() * m.rows();
            }
            SplittableRandom random = new SplittableRandom(5);
            List<float[]> xs = new ArrayList<>();
            List<float[]> outs = new ArrayList<>();
            for (WeightMatrix m : ms) {
                float[] x = new float[m.cols()];
                for (int i = 0; i < x.length; i++) {
                    x[i] = (float) random.nextGaussian();
                }
                xs.add(x);
                outs.add(new float[m.rows()]);
            }
            java.util.Map<String, long[]> perShape = new java.util.TreeMap<>();
            int passes = 20;
            double best = Double.MAX_VALUE;
            for (int round = 0; round < 8; round++) {
                perShape.clear();
                long start = System.nanoTime();
                for (int pass = 0; pass < passes; pass++) {
                    for (int i = 0; i < ms.size(); i++) {
                        WeightMatrix m = ms.get(i);
                        long t0 = System.nanoTime();
                        m.matvec(xs.get(i), outs.get(i), pool);
                        String shape = m.name().replaceAll("^blk\\.\\d+\\.", "") + " " + m.rows() + "x" + m.cols()
                                + " " + m.format().type();
                        perShape.computeIfAbsent(shape, k -> new long[1])[0] += System.nanoTime() - t0;
                    }
                }
                best = Math.min(best, (System.nanoTime() - start) / 1e6 / passes);
            }
            String layout = pack ? "packed for the CPU" : "file layout";
            results.add(new Result("pass, " + layout, best, "ms (best of 8 rounds)"));
            results.add(new Result("pass, " + layout, bytes / best / 1e6, "GB/s"));
            for (var e : perShape.entrySet()) {
                results.add(new Result("  " + e.getKey(), e.getValue()[0] / 1e3 / passes, "us/pass (last round)"));
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
            s.set(ValueLayout.JAVA_LONG_UNALIGNED, i, random.nextLong());
        }
    }

    private static final long COPY_BYTES = 256L << 20;

    /** Copies the first half of the buffers onto the second, split over the pool. */
    private static Runnable copier(MemorySegment buffers, Parallel pool) {
        int parts = pool.threads();
        long part = COPY_BYTES / parts;
        return () -> pool.forEach(parts, t -> MemorySegment.copy(buffers, t * part, buffers, COPY_BYTES + t * part,
                part));
    }

    private static volatile long sink;

    private static double readBandwidth(MemorySegment big, Parallel pool) {
        int parts = pool.threads();
        long part = big.byteSize() / parts / 256 * 256;
        long base = RawMemory.address(big, 0, part * parts);
        float[] sums = new float[parts];
        double seconds = median(() -> {
            pool.forEach(parts, t -> sums[t] = streamingSum(base + t * part, part));
            sink += (long) sums[0];
        });
        return (double) part * parts / seconds / 1e9;
    }

    /** Sums {@code bytes} bytes as floats, four independent accumulators, the way a matvec streams its weights. */
    private static float streamingSum(long address, long bytes) {
        VectorSpecies<Float> f = Lanes.F;
        FloatVector a0 = FloatVector.zero(f), a1 = a0, a2 = a0, a3 = a0;
        long step = f.vectorByteSize();
        for (long i = 0; i < bytes / (4 * step); i++) {
            long at = address + i * 4 * step;
            a0 = a0.add(FloatVector.fromMemorySegment(f, RawMemory.ALL, at, ByteOrder.LITTLE_ENDIAN));
            a1 = a1.add(FloatVector.fromMemorySegment(f, RawMemory.ALL, at + step, ByteOrder.LITTLE_ENDIAN));
            a2 = a2.add(FloatVector.fromMemorySegment(f, RawMemory.ALL, at + 2 * step, ByteOrder.LITTLE_ENDIAN));
            a3 = a3.add(FloatVector.fromMemorySegment(f, RawMemory.ALL, at + 3 * step, ByteOrder.LITTLE_ENDIAN));
        }
        float[] t = new float[f.length()];
        a0.add(a1).add(a2).add(a3).intoArray(t, 0);
        return t[0];
    }

    /**
     * A matrix of {@code type} filling as much of {@code big} as whole rows allow. The bytes are 64 really
     * quantized rows repeated, so scales are sane (no NaN or subnormal surprises) yet every byte must be read.
     */
    private static double[] matvecBandwidth(GgmlType type, MemorySegment big, Parallel pool, Runnable copy,
                                            boolean pack) {
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
        if (pack) {
            m.packForCpu(pool);
        }
        float[] x = gaussian(MATVEC_COLS, 3);
        float[] out = new float[rows];
        for (int i = 0; i < 3; i++) {
            m.matvec(x, out, pool);
        }
        double[] rate = new double[REPS];
        double[] ratio = new double[REPS];
        for (int i = 0; i < REPS; i++) {
            long start = System.nanoTime();
            copy.run();
            long middle = System.nanoTime();
            m.matvec(x, out, pool);
            long end = System.nanoTime();
            double copyRate = 2.0 * COPY_BYTES / (middle - start);
            rate[i] = (double) data.byteSize() / (end - middle);
            ratio[i] = rate[i] / copyRate;
        }
        Arrays.sort(rate);
        Arrays.sort(ratio);
        return new double[]{rate[REPS / 2], ratio[REPS / 2]};
    }

    /** Microseconds per forEach of 8 tasks that do nothing: the pool's own cost per call. */
    private static double forEachMicros(Parallel pool) {
        int calls = 20_000;
        double seconds = median(() -> {
            for (int i = 0; i < calls; i++) {
                pool.forEach(8, t -> { });
            }
        });
        return seconds / calls * 1e6;
    }

    /** Microseconds per matvec of a 512 x 512 matrix (cache-resident), as a small model's decode step does. */
    private static double smallMatvecMicros(GgmlType type, Parallel pool, Arena arena) {
        WeightFormat f = WeightFormat.of(type);
        int n = 512;
        MemorySegment data = arena.allocate(f.bytesFor(n) * n, 64);
        float[] values = gaussian(n * n, 6);
        for (int r = 0; r < n; r++) {
            f.quantize(values, r * n, n, data, r * f.bytesFor(n));
        }
        WeightMatrix m = new WeightMatrix("bench.small." + type, f, data, n, n);
        m.packForCpu(pool);
        float[] x = gaussian(n, 7);
        float[] out = new float[n];
        int calls = 2_000;
        double seconds = median(() -> {
            for (int i = 0; i < calls; i++) {
                m.matvec(x, out, pool);
            }
        });
        return seconds / calls * 1e6;
    }

    /**
     * Values per second of the calling thread's CPU time, for matvecs of a 256 x 4096 matrix that stays in L2:
     * the kernels' own speed, which neither memory bandwidth nor (much) a busy neighbour moves. Best of ten.
     */
    private static double inCacheGigaValues(GgmlType type, Arena arena) {
        WeightFormat f = WeightFormat.of(type);
        int rows = 256;
        int cols = MATVEC_COLS;
        MemorySegment data = arena.allocate(f.bytesFor(cols) * rows, 64);
        float[] values = gaussian(rows * cols, 8);
        for (int r = 0; r < rows; r++) {
            f.quantize(values, r * cols, cols, data, r * f.bytesFor(cols));
        }
        WeightMatrix m = new WeightMatrix("bench.cache." + type, f, data, rows, cols);
        m.packForCpu(Parallel.serial());
        float[] x = gaussian(cols, 9);
        float[] out = new float[rows];
        ThreadMXBean cpu = ManagementFactory.getThreadMXBean();
        int calls = 300;
        double best = 0;
        for (int rep = 0; rep < REPS + 3; rep++) {
            long start = cpu.getCurrentThreadCpuTime();
            for (int i = 0; i < calls; i++) {
                m.matvec(x, out, Parallel.serial());
            }
            long end = cpu.getCurrentThreadCpuTime();
            best = Math.max(best, (double) rows * cols * calls / (end - start));
        }
        return best;
    }

    /**
     * The machine's float multiply-add ceiling for the matmul figures: every thread runs chains of twelve independent
     * vector fmas on registers (no memory), as many as the pool has threads; 2 flops a lane an fma.
     */
    private static double fmaPeakGflops(Parallel pool) {
        int threads = pool.threads();
        float[][] sinks = new float[threads][L];
        long iters = 20_000_000L;
        double seconds = median(() -> pool.forEach(threads, t -> fmaChains(sinks[t], iters)));
        return threads * iters * 12.0 * 2 * L / seconds / 1e9;
    }

    private static void fmaChains(float[] sink, long iters) {
        FloatVector c0 = FloatVector.broadcast(F, 1f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
        FloatVector c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
        FloatVector m = FloatVector.broadcast(F, 0.999999f), b = FloatVector.broadcast(F, 1e-6f);
        for (long i = 0; i < iters; i++) {
            c0 = c0.fma(m, b);
            c1 = c1.fma(m, b);
            c2 = c2.fma(m, b);
            c3 = c3.fma(m, b);
            c4 = c4.fma(m, b);
            c5 = c5.fma(m, b);
            c6 = c6.fma(m, b);
            c7 = c7.fma(m, b);
            c8 = c8.fma(m, b);
            c9 = c9.fma(m, b);
            c10 = c10.fma(m, b);
            c11 = c11.fma(m, b);
        }
        c0.add(c1).add(c2).add(c3).add(c4).add(c5).add(c6).add(c7).add(c8).add(c9).add(c10).add(c11)
                .intoArray(sink, 0);
    }

    private static double matmulGflops(GgmlType type, int rows, int cols, int n, Parallel pool, Arena arena) {
        WeightFormat f = WeightFormat.of(type);
        MemorySegment data = arena.allocate(f.bytesFor(cols) * rows, 64);
        float[] values = gaussian(rows * cols, 4);
        for (int r = 0; r < rows; r++) {
            f.quantize(values, r * cols, cols, data, r * f.bytesFor(cols));
        }
        WeightMatrix m = new WeightMatrix("bench." + type, f, data, rows, cols);
        m.packForCpu(pool);
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
