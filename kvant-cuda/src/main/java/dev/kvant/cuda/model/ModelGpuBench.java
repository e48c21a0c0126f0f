package dev.kvant.cuda.model;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaDriver;
import dev.kvant.cuda.CudaEvent;
import dev.kvant.cuda.CudaFunction;
import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.DeviceCopy;
import dev.kvant.cuda.KernelCache;
import dev.kvant.tensor.WeightFormat;

import java.util.Arrays;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * Times the decode kernels of model.cu one by one on the llama3-8b projections (Q4_0 and Q8_0, random blocks), with
 * float and with 8-bit vectors, for one vector and for eight: microseconds per launch and the weight bytes read per
 * second against the copy bandwidth measured in the same run. A graph's launches go round copies of the matrix that
 * together exceed the L2, so each launch reads its weights from DRAM as a decode step does.
 *
 * <pre>java -cp kvant-cuda.jar:kvant-core.jar dev.kvant.cuda.model.ModelGpuBench [q4_0,q8_0,...]</pre>
 * (the argument: the weight layouts to time, by kernel suffix; every layout without one)
 */
public final class ModelGpuBench {
    private ModelGpuBench() {
    }

    record Shape(String name, int rows, int cols, int mode) {
    }

    /** Bytes of weights a timed graph reads before it reads a matrix again: several times the H200's 50 MB L2. */
    private static final long L2_COLD_BYTES = 256L << 20;

    public static void main(String[] args) {
        // the layouts to time (kernel suffixes, e.g. "q4_0,q8_0"); all without an argument
        java.util.Set<String> only = args.length == 0 ? null
                : java.util.Set.of(args[0].toLowerCase(Locale.ROOT).split(","));
        java.util.function.Predicate<WeightLayout> timed = l -> only == null || only.contains(l.kernelSuffix);
        Shape[] shapes = {
                new Shape("qkv", 6144, 4096, ModelKernels.MV_STORE),
                new Shape("wo", 4096, 4096, ModelKernels.MV_ADD),
                new Shape("gate|up", 28672, 4096, ModelKernels.MV_SWIGLU),
                new Shape("down", 4096, 14336, ModelKernels.MV_ADD),
                new Shape("output", 128256, 4096, ModelKernels.MV_STORE)};
        try (CudaContext context = CudaContext.open()) {
            KernelCache cache = KernelCache.open(context);
            CudaStream stream = context.createStream();
            double copy;
            try (DeviceCopy c = DeviceCopy.load(context, cache);
                 DeviceBuffer a = context.allocate(1L << 30);
                 DeviceBuffer b = context.allocate(1L << 30)) {
                copy = c.bandwidthGBps(a, b, 1L << 30, 10, stream);
            }
            System.out.printf(Locale.ROOT, "copy %.0f GB/s (read + written)%n%n", copy);
            System.out.println("| format | matrix | rows x cols | vectors | kernel | µs | GB/s | of copy |");
            System.out.println("| --- | --- | --- | ---: | --- | ---: | ---: | ---: |");
            try (ModelKernels k = new ModelKernels(context, cache)) {
                // Q4_0 and Q8_0: 8-bit on the tensor cores and with dp4a (the dp4a default rows a warp), one vector
                // and eight; one vector of floats
                int T = ModelKernels.TENSOR_TILE;
                int[][] planar = {{1, 1, 1}, {1, 1, 2}, {1, 1, T}, {8, 1, T}, {1, 0, 4}, {8, 2, 0}, {32, 2, 0}};
                for (WeightLayout layout : new WeightLayout[] {WeightLayout.Q4_0, WeightLayout.Q8_0}) {
                    if (!timed.test(layout)) {
                        continue;
                    }
                    kernelRow(layout, "", "tensor cores", k.tensorProduct(layout));
                    kernelRow(layout, "", "dequantizing f16", k.halfProduct(layout));
                    for (Shape s : shapes) {
                        timeShape(context, stream, k, layout, s, planar, copy);
                    }
                }
                // The other layouts: float vectors (and 8-bit ones where the layout has them), one vector and
                // eight; the float kernels' registers and local (spilled) bytes per thread.
                for (WeightLayout layout : new WeightLayout[] {WeightLayout.F16, WeightLayout.BF16, WeightLayout.Q4_K,
                        WeightLayout.Q5_K, WeightLayout.Q6_K}) {
                    if (!timed.test(layout)) {
                        continue;
                    }
                    for (int nvec : new int[] {1, 8}) {
                        kernelRow(layout, Integer.toString(nvec), "float vectors", k.floatProduct(layout, nvec));
                    }
                    if (layout.q8Vectors) {
                        kernelRow(layout, "", "tensor cores", k.tensorProduct(layout));
                        kernelRow(layout, "", "dequantizing f16", k.halfProduct(layout));
                    }
                    int[][] variants = layout.q8Vectors
                            ? new int[][] {{1, 1, 0}, {1, 1, T}, {8, 1, T}, {1, 0, 4}, {8, 0, 4}, {8, 2, 0}, {32, 2, 0}}
                            : new int[][] {{1, 0, 4}, {8, 0, 4}};
                    for (Shape s : shapes) {
                        timeShape(context, stream, k, layout, s, variants, copy);
                    }
                }
                try (DeviceBuffer x = context.allocate(4L * 14336);
                     DeviceBuffer w = context.allocate(4L * 4096);
                     DeviceBuffer yf = context.allocate(4L * 14336);
                     DeviceBuffer yq = context.allocate(14336);
                     DeviceBuffer ys = context.allocate(8L * 14336 / 32);
                     DeviceBuffer logits = context.allocate(4L * 128256);
                     DeviceBuffer ids = context.allocate(4)) {
                    fillRandom(context, x, 4L * 14336);
                    fillRandom(context, logits, 4L * 128256);
                    w.fillFloats(1f);
                    ModelKernels.Vectors y = new ModelKernels.Vectors(yf, yq, ys, 4096);
                    ModelKernels.Vectors wide = new ModelKernels.Vectors(x, yq, ys, 14336);
                    System.out.printf(Locale.ROOT, "%nrmsnorm 4096 (+ 8-bit): %.2f µs; quantize 14336: %.2f µs%n",
                            time(context, stream, () -> k.rmsnorm(x, w, y, 1, 4096, 1e-5f, stream)),
                            time(context, stream, () -> k.quantize(wide, 1, stream)));
                }
            }
            stream.close();
        }
    }

    /** A table row with a kernel's registers and local (spilled) bytes per thread. */
    private static void kernelRow(WeightLayout layout, String vectors, String what, CudaFunction f) {
        System.out.printf(Locale.ROOT, "| %s | (kernel) | | %s | %s: %d registers, %d local bytes | | | |%n",
                layout.kernelSuffix, vectors, what, f.registers(), f.attribute(CudaDriver.FUNC_LOCAL_SIZE_BYTES));
    }

    /**
     * Times each variant {vectors, 8-bit (1), float (0) or f16 (2: the dequantizing products, every row of the
     * matrix, a prompt chunk's GEMM) vectors, rows a warp (16: the tensor cores; 0: dp4a's choice)} of one
     * layout's product on one shape, random weights (planar layouts: every scale half 0x1010, small and finite) and
     * random vectors, and prints a row for each.
     */
    private static void timeShape(CudaContext context, CudaStream stream, ModelKernels k, WeightLayout layout,
                                  Shape s, int[][] variants, double copy) {
        long bytes;
        long scales = 0;
        long rowStride;
        if (layout.planar) {
            long blocks = (long) s.rows() * (s.cols() / layout.planeBlockValues());
            scales = blocks * layout.planeQuantBytes();
            bytes = scales + blocks * 2;
            rowStride = s.cols() / 32;
        } else {
            rowStride = WeightFormat.of(layout.type).bytesFor(s.cols());
            bytes = rowStride * s.rows();
        }
        // Copies enough that a graph's launches read more than the 50 MB L2 holds before coming back to one: the
        // decode step reads each matrix once a token, from DRAM (one copy, as before, put qkv, wo and down in L2).
        int copies = (int) Math.max(1, Math.min(20, (L2_COLD_BYTES + bytes - 1) / bytes));
        try (DeviceBuffer w = context.allocate(bytes * copies);
             DeviceBuffer xf = context.allocate(4L * 8 * s.cols());
             DeviceBuffer xq = context.allocate(8L * s.cols());
             DeviceBuffer xs = context.allocate(8L * 8 * (s.cols() / 32));
             DeviceBuffer out = context.allocate(4L * ModelKernels.MH_VECTORS * s.rows());
             DeviceBuffer xh = context.allocate(2L * ModelKernels.MH_VECTORS * s.cols());
             DeviceBuffer partial = context.allocate(4L * ModelKernels.MH_MAX_SPLITS * ModelKernels.MH_VECTORS
                     * s.rows())) {
            fillRandom(context, w, bytes * copies);
            fillRandom(context, xf, 4L * 8 * s.cols());
            fillRandom(context, xh, 2L * ModelKernels.MH_VECTORS * s.cols());
            DeviceMatrix[] ms = new DeviceMatrix[copies];
            for (int c = 0; c < copies; c++) {
                DeviceBuffer wc = w.slice(c * bytes, bytes);
                if (layout.planar) {
                    wc.slice(scales, bytes - scales).fillBytes((byte) 0x10);
                }
                ms[c] = new DeviceMatrix(layout, wc, rowStride, scales, s.rows(), s.cols());
            }
            ModelKernels.Vectors x = new ModelKernels.Vectors(xf, xq, xs, s.cols());
            k.quantize(x, 8, stream);
            int[] next = {0};
            java.util.function.Supplier<DeviceMatrix> matrix = () -> ms[next[0]++ % copies];
            int outputs = s.mode() == ModelKernels.MV_SWIGLU ? s.rows() / 2 : s.rows();
            for (int[] variant : variants) {
                int nvec = variant[0];
                if (variant[1] == 2) {
                    double us = time(context, stream, () -> k.matmulHalf(matrix.get(), xh, nvec, out, s.rows(), false,
                            partial, stream));
                    double gbs = bytes / (us * 1e-6) / 1e9;
                    System.out.printf(Locale.ROOT, "| %s | %s | %d x %d | %d | f16 vectors, dequantizing | %.1f | %.0f"
                            + " | %.0f%% |%n", layout.kernelSuffix, s.name(), s.rows(), s.cols(), nvec, us, gbs,
                            100 * gbs / copy);
                    continue;
                }
                boolean q8 = variant[1] == 1;
                int rows = variant[2] != 0 ? variant[2] : q8 && nvec == 1 ? ModelKernels.rowsPerWarp(s.mode()) : 4;
                if (rows == 1 && s.mode() == ModelKernels.MV_SWIGLU) {
                    continue;
                }
                double us = time(context, stream, () -> k.matvec(q8, rows, matrix.get(), outputs, x, nvec, out,
                        outputs, null, s.mode(), outputs, null, stream));
                double gbs = bytes / (us * 1e-6) / 1e9;
                String kernel = !q8 ? "float vectors, " + rows + " rows a warp"
                        : rows == ModelKernels.TENSOR_TILE ? "8-bit vectors, tensor cores"
                        : "8-bit vectors, dp4a, " + rows + " rows a warp";
                System.out.printf(Locale.ROOT, "| %s | %s | %d x %d | %d | %s | %.1f | %.0f | %.0f%% |%n",
                        layout.kernelSuffix, s.name(), s.rows(), s.cols(), nvec, kernel, us, gbs, 100 * gbs / copy);
            }
        }
    }

    private static void fillRandom(CudaContext context, DeviceBuffer b, long bytes) {
        SplittableRandom r = new SplittableRandom(42);
        byte[] host = new byte[(int) Math.min(bytes, 1 << 24)];
        for (int i = 0; i < host.length; i++) {
            host[i] = (byte) (r.nextInt(256) & 0x3f);  // small finite floats/halves whatever the bytes are read as
        }
        for (long off = 0; off < bytes; off += host.length) {
            int n = (int) Math.min(host.length, bytes - off);
            b.copyFromHost(java.lang.foreign.MemorySegment.ofArray(host).asSlice(0, n), off);
        }
    }

    /**
     * Median of 9 replays of a CUDA graph of 20 launches, in µs per launch: kernels back to back as in the decode
     * graph, without the host's launch cost.
     */
    private static double time(CudaContext context, CudaStream stream, Runnable launch) {
        double[] t = new double[9];
        try (CudaGraph graph = CudaGraph.capture(stream, () -> {
                for (int i = 0; i < 20; i++) {
                    launch.run();
                }
            });
             CudaEvent start = context.createEvent(); CudaEvent end = context.createEvent()) {
            graph.launch(stream);
            for (int r = 0; r < t.length; r++) {
                start.record(stream);
                graph.launch(stream);
                end.record(stream);
                end.synchronize();
                t[r] = CudaEvent.elapsedMillis(start, end) * 1e3 / 20;
            }
        }
        Arrays.sort(t);
        return t[t.length / 2];
    }
}
