package dev.kvant.cuda.attention;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.select.SelectionConfig;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Decode attention through a query-aware selection at long contexts, one llama3-8b layer (32 query heads, 8 kv
 * heads, head size 128), one sequence: for each cache length, the median time of dense decode, of the selection
 * (scores + top-k) alone, and of selection + selected decode (what a selected layer costs per token; all timed as
 * graph replays, as the decode step runs them), and that
 * times the layers of the model (the first {@code denseLayers} dense). The cache is filled on the device (normal K
 * and V through the quantize kernel, summaries kept as decode keeps them), pages shuffled over the pool.
 *
 * <pre>java ... dev.kvant.cuda.attention.SelectionGpuBench [formats [lengths [budget [coarseTokens]]]]
 *   e.g. turbo3,f16 32768,131072,524288 2048 256</pre>
 */
public final class SelectionGpuBench {
    static final int LAYERS = 32;
    static final int CHUNK = 16384;

    private SelectionGpuBench() {
    }

    public static void main(String[] args) {
        List<KvFormat> formats = new ArrayList<>();
        for (String name : (args.length > 0 ? args[0] : "turbo3").split(",")) {
            formats.add(KvFormat.parse(name.strip()));
        }
        List<Integer> lengths = new ArrayList<>();
        for (String l : (args.length > 1 ? args[1] : "32768,131072,524288").split(",")) {
            lengths.add(Integer.parseInt(l.strip()));
        }
        int budget = args.length > 2 ? Integer.parseInt(args[2]) : SelectionConfig.DEFAULT_BUDGET;
        int coarse = args.length > 3 ? Integer.parseInt(args[3]) : 0;
        SelectionConfig config = SelectionConfig.topK(budget).withCoarse(coarse);
        int maxLen = lengths.stream().mapToInt(Integer::intValue).max().orElseThrow();
        List<String> rows = new ArrayList<>();
        try (CudaContext context = CudaContext.open(); CudaStream stream = context.createStream()) {
            KernelCache cache = KernelCache.open(context);
            List<AttentionShape> shapes = new ArrayList<>();
            for (KvFormat f : formats) {
                shapes.add(AttentionGpuBench.shape(f));
            }
            AttentionPrecompile.compile(cache, context.computeCapability().arch(), shapes,
                    Runtime.getRuntime().availableProcessors(), true);
            System.out.printf(Locale.ROOT, "device: %s; selection %s%n", context, config);
            for (KvFormat f : formats) {
                run(context, cache, stream, f, config, lengths, maxLen, rows);
            }
        }
        System.out.println();
        System.out.println("### Decode attention through a selection (llama3-8b layer: 32 q heads, 8 kv heads, d 128; "
                + "one sequence; " + config + ")");
        System.out.println();
        System.out.println("| K/V format | cached tokens | dense (µs) | select (µs) | select + decode (µs) | "
                + "per token, " + LAYERS + " layers (ms): dense | selected |");
        System.out.println("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        rows.forEach(System.out::println);
    }

    private static void run(CudaContext context, KernelCache cache, CudaStream stream, KvFormat f,
                            SelectionConfig config, List<Integer> lengths, int maxLen, List<String> rows) {
        AttentionShape shape = AttentionGpuBench.shape(f);
        int pageTokens = AttentionGpuBench.PAGE_TOKENS;
        int pages = (maxLen + pageTokens - 1) / pageTokens;
        int[] table = AttentionGpuBench.shuffled(pages, 42);
        int kvh = AttentionGpuBench.KV_HEADS, heads = AttentionGpuBench.HEADS, d = AttentionGpuBench.D;
        try (CudaKvCache kv = CudaKvCache.allocate(context, shape.geometry(), f, f, pageTokens, pages);
             CudaAttention writer = CudaAttention.create(context, cache, shape, AttentionPlan.of(1, 1, maxLen, 0));
             DeviceBatch batch = DeviceBatch.allocate(context, 1, pages);
             DeviceBuffer k = context.allocate(4L * CHUNK * kvh * d);
             DeviceBuffer v = context.allocate(4L * CHUNK * kvh * d);
             DeviceBuffer slots = context.allocate(4L * CHUNK);
             DeviceBuffer q = context.allocate(4L * heads * d);
             DeviceBuffer out = context.allocate(4L * heads * d);
             Arena arena = Arena.ofConfined()) {
            writer.enableSelection(config, 0);
            kv.enableKeySummaries(config.blockTokens(), config.coarseTokens());
            batch.set(0, table, table.length, maxLen);
            batch.upload();
            MemorySegment hostSlots = arena.allocate(4L * CHUNK, 16);
            for (int t0 = 0; t0 < maxLen; t0 += CHUNK) {
                int n = Math.min(CHUNK, maxLen - t0);
                for (int t = 0; t < n; t++) {
                    int pos = t0 + t;
                    hostSlots.setAtIndex(ValueLayout.JAVA_INT, t, table[pos / pageTokens] * pageTokens
                            + pos % pageTokens);
                }
                slots.copyFromHost(hostSlots);
                writer.fillNormal(k, (long) n * kvh * d, 2 * (t0 / CHUNK), 1f, stream);
                writer.fillNormal(v, (long) n * kvh * d, 2 * (t0 / CHUNK) + 1, 1f, stream);
                writer.quantizeRows(kv, 0, k, v, slots, n, stream);
                writer.summarize(kv, 0, batch, 0, t0 + n, n, stream);
                stream.synchronize();
            }
            writer.fillNormal(q, (long) heads * d, 7, 1f, stream);
            stream.synchronize();
            System.out.printf(Locale.ROOT, "%s: %d tokens cached (%d MiB), %s%n", f.name(), maxLen,
                    kv.byteSize() >> 20, writer.selectionSummary());
            for (int len : lengths) {
                try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                        AttentionPlan.of(1, 1, len, 0))) {
                    attention.enableSelection(config, 0);
                    batch.setLength(0, len);
                    batch.upload();
                    double dense = graphTime(context, stream,
                            () -> attention.decode(kv, 0, q, batch, 1, out, stream));
                    double select = graphTime(context, stream,
                            () -> attention.select(kv, 0, q, batch, 1, 1, stream));
                    double selected = graphTime(context, stream, () -> {
                        attention.select(kv, 0, q, batch, 1, 1, stream);
                        attention.decodeSelected(kv, 0, q, batch, 1, 1, out, null, null, stream);
                    });
                    int denseLayers = Math.min(LAYERS, config.denseLayers());
                    double perTokenDense = LAYERS * dense;
                    double perTokenSelected = denseLayers * dense + (LAYERS - denseLayers) * selected;
                    rows.add(String.format(Locale.ROOT, "| %s | %d | %.1f | %.1f | %.1f | %.2f | %.2f |", f.name(), len,
                            dense * 1e3, select * 1e3, selected * 1e3, perTokenDense, perTokenSelected));
                    System.out.printf(Locale.ROOT, "%s L=%d: dense %.1f µs, select %.1f µs, select+decode %.1f µs%n",
                            f.name(), len, dense * 1e3, select * 1e3, selected * 1e3);
                }
            }
        }
    }

    /** {@link AttentionGpuBench#graphTime} with 2 warm-up and 20 timed replays. */
    private static double graphTime(CudaContext context, CudaStream stream, Runnable work) {
        return AttentionGpuBench.graphTime(context, stream, 2, 20, work);
    }

    private static double median(double[] ms) {
        return AttentionGpuBench.median(ms);
    }
}
