package dev.kvant.cuda.attention;

import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;
import dev.kvant.cuda.Nvrtc;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.kv.TurboFormat;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * Compiles attention modules into a kernel cache, in parallel: before a benchmark or a captured graph, so NVRTC
 * never runs in a timed region, and ahead of time for a machine where compiling is slow (the GPU test machine gets
 * the cubins of {@link #standardShapes()} compiled by scripts/gpu-suite, keyed by the driver version it will report).
 *
 * <pre>java -cp kvant-cuda.jar:kvant-core.jar dev.kvant.cuda.attention.AttentionPrecompile DIR sm_90 13000 [threads]</pre>
 * ({@code DIR auto [threads]} on the GPU machine: its own architecture and driver, as scripts/gpu-remote runs it
 * before the tests when no cubins came staged).
 */
public final class AttentionPrecompile {
    private AttentionPrecompile() {
    }

    public static void main(String[] args) throws Exception {
        boolean auto = args.length >= 2 && args[1].equals("auto");
        if (args.length < (auto ? 2 : 3)) {
            System.err.println("usage: AttentionPrecompile CACHE_DIR (ARCH DRIVER_VERSION | auto) [THREADS]  "
                    + "(e.g. /tmp/cubin sm_90 13000; auto: this machine's GPU and driver, on the GPU machine itself)");
            System.exit(2);
        }
        String arch;
        int driver;
        if (auto) {   // what a CudaContext here keys its modules by
            try (dev.kvant.cuda.CudaContext context = dev.kvant.cuda.CudaContext.open()) {
                arch = context.computeCapability().arch();
                driver = context.driverVersion();
            }
        } else {
            arch = args[1];
            driver = Integer.parseInt(args[2]);
        }
        int at = auto ? 2 : 3;
        int threads = args.length > at ? Integer.parseInt(args[at]) : Runtime.getRuntime().availableProcessors();
        KernelCache cache = new KernelCache(Path.of(args[0]), Nvrtc.load(), driver);
        long t0 = System.nanoTime();
        cache.cubin(dev.kvant.cuda.model.CudaBackend.kernelSource(), arch, Map.of());
        compile(cache, arch, standardShapes(), threads);
        compile(cache, arch, centeredWriteShapes(), threads);
        compile(cache, arch, selectionShapes(), threads, true);
        System.out.printf("compiled the model module and the attention modules of %d shapes (with selection: %d) for"
                + " %s into %s in %.1f s (%s)%n", standardShapes().size(), selectionShapes().size(), arch, args[0],
                (System.nanoTime() - t0) / 1e9, cache.stats());
    }

    /**
     * The shapes the GPU tests and AttentionGpuBench use: every format for K and V alike, head sizes 64, 128, 256,
     * 8 kv heads (llama3-8b has 8; decode blocks depend only on the kv heads, the GQA group is a launch argument),
     * and three mixed pairs (turbo3 K with q8_0 V; turbo2 K with turbo4 V, each decoded straight from the stage
     * through a table of its own; bf16 K with turbo4 V and different head sizes).
     */
    public static List<AttentionShape> standardShapes() {
        List<AttentionShape> shapes = new ArrayList<>();
        for (int d : new int[] {64, 128, 256}) {
            for (KvFormat f : KvFormat.all()) {
                shapes.add(new AttentionShape(new KvGeometry(1, 8, d, d), 32, f, f, 64));
            }
        }
        // tinycode and the synthetic "tiny" shape: 4 query heads over 2 kv heads of 128
        for (KvFormat f : KvFormat.all()) {
            shapes.add(new AttentionShape(new KvGeometry(1, 2, 128, 128), 4, f, f, 64));
        }
        shapes.add(new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, TurboFormat.TURBO3,
                KvFormat.parse("q8_0"), 64));
        shapes.add(new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, TurboFormat.TURBO2, TurboFormat.TURBO4,
                64));
        shapes.add(new AttentionShape(new KvGeometry(1, 8, 64, 128), 32, KvFormat.parse("bf16"), TurboFormat.TURBO4,
                64));
        // keys centered on their page's mean: each family, and the tinycode shape
        for (String[] kv : new String[][] {{"turbo3+mean", "turbo3"}, {"turbo4+mean", "turbo4"},
                {"turbo2+mean", "turbo2"}, {"q4_0h+mean", "q4_0h"}, {"q8_0+mean", "turbo3"}, {"q4_0+mean", "q8_0"}}) {
            shapes.add(new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, KvFormat.parse(kv[0]),
                    KvFormat.parse(kv[1]), 64));
        }
        shapes.add(new AttentionShape(new KvGeometry(1, 2, 128, 128), 4, KvFormat.parse("turbo3+mean"),
                TurboFormat.TURBO3, 64));
        shapes.add(new AttentionShape(new KvGeometry(1, 8, 64, 64), 32, KvFormat.parse("turbo3+mean"),
                TurboFormat.TURBO3, 64));
        shapes.add(new AttentionShape(new KvGeometry(1, 8, 256, 256), 32, KvFormat.parse("turbo2+mean"),
                TurboFormat.TURBO2, 64));
        return shapes;
    }

    /**
     * The shapes KvWriteGpuTest writes centered keys through: every format that takes {@code +mean}, head sizes 64,
     * 128, 256, q8_0 values (compiled ahead too: on the GPU machine each module would cost seconds of NVRTC).
     */
    public static List<AttentionShape> centeredWriteShapes() {
        List<AttentionShape> shapes = new ArrayList<>();
        for (int d : new int[] {64, 128, 256}) {
            for (String f : new String[] {"turbo3", "turbo4", "turbo2", "q4_0h", "q4_0", "q8_0", "int8"}) {
                shapes.add(new AttentionShape(new KvGeometry(1, 8, d, d), 32, KvFormat.parse(f + "+mean"),
                        KvFormat.parse("q8_0"), 64));
            }
        }
        return shapes;
    }

    /** The shapes the selection tests and benchmarks use: head size 128, 8 and 2 kv heads, every format. */
    public static List<AttentionShape> selectionShapes() {
        List<AttentionShape> shapes = new ArrayList<>();
        for (AttentionShape s : standardShapes()) {
            if (s.headDimK() == 128 && s.headDimV() == 128 && PageMeanFormat.rows(s.kFormat()) == s.vFormat()) {
                shapes.add(s);
            }
        }
        return shapes;
    }

    /** Compiles (or finds) the module of every shape for {@code arch} on {@code threads} threads. */
    public static void compile(KernelCache cache, String arch, List<AttentionShape> shapes, int threads) {
        compile(cache, arch, shapes, threads, false);
    }

    /**
     * As above; with {@code selection} also the one-kv-head-per-block module of each shape, which has the selected
     * decode (CudaAttention#enableSelection loads it).
     */
    public static void compile(KernelCache cache, String arch, List<AttentionShape> shapes, int threads,
                               boolean selection) {
        Map<String, Map.Entry<KernelSource, Map<String, String>>> distinct = new LinkedHashMap<>();
        for (AttentionShape s : shapes) {
            KernelSource source = AttentionSource.source(s);
            distinct.putIfAbsent(source.name(), Map.entry(source, AttentionSource.defines(s)));
            if (selection) {
                KernelSource one = AttentionSource.source(s, 1);
                distinct.putIfAbsent(one.name(), Map.entry(one, AttentionSource.defines(s, 1)));
            }
        }
        ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, threads));
        try {
            List<Future<byte[]>> jobs = new ArrayList<>();
            for (Map.Entry<KernelSource, Map<String, String>> m : distinct.values()) {
                jobs.add(pool.submit(() -> cache.cubin(m.getKey(), arch, m.getValue())));
            }
            for (Future<byte[]> job : jobs) {
                try {
                    job.get();
                } catch (java.util.concurrent.ExecutionException e) {
                    if (e.getCause() instanceof RuntimeException r) {
                        throw r;
                    }
                    throw new IllegalStateException(e.getCause());
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while compiling attention modules", e);
        } finally {
            pool.shutdownNow();
        }
    }
}
