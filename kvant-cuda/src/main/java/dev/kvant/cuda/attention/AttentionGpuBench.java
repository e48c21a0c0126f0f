package dev.kvant.cuda.attention;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaEvent;
import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.DeviceCopy;
import dev.kvant.cuda.KernelCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.PageMeanFormat;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * GPU attention benchmark at llama3-8b geometry (32 query heads, 8 kv heads, head size 128), one layer:
 * <ul>
 * <li>decode of one query per sequence over 4K, 32K and 128K cached tokens, batch 1 and 16, every K/V format
 * (K and V alike), timed two ways: as a decode step runs it ({@link #graphTime}: {@value #INNER} decodes captured
 * into one graph and replayed, no host launch time inside) — the time, bytes of cache read per second and that over
 * the device copy bandwidth measured in the same run (DeviceCopy: bytes read + written per second) come from this —
 * and launched one at a time from Java between two events (host launch time included, which dominates short
 * decodes); and graph-timed as a decode step calls it, the queries rotated into K's basis by the step's RoPE
 * write ("model's basis");</li>
 * <li>causal prefill of 4K and 32K tokens in f16, turbo3, turbo2 (the warpgroup kernel's formats), q8_0, turbo4 and
 * q4_0h (the mma.sync one's, the last two with a rotated V): TFLOP/s counting 2 * L^2 * d * heads (the causal half of QK^T and PV), the convention
 * of scripts/gpu-sdpa-baseline.py;</li>
 * <li>quantize-on-write: K+V rows per second per format.</li>
 * </ul>
 * The cache is filled on the device (normal data through the quantize kernel), pages shuffled over the pool. A
 * format with keys centered on their page's mean ({@code turbo3+mean}) has the same values without them (turbo3),
 * and its prefill rows run where its base format's do.
 *
 * <pre>java --add-modules jdk.incubator.vector --enable-native-access=ALL-UNNAMED \
 *   -cp kvant-cuda.jar:kvant-core.jar dev.kvant.cuda.attention.AttentionGpuBench [format,...] [prefill=L,L,...]</pre>
 * With {@code prefill=L,...} only the prefill rows run, at those lengths (a sweep over lengths separates a prefill
 * block's fixed cost from its per-tile cost), over one sequence filled to the longest.
 */
public final class AttentionGpuBench {
    static final int KV_HEADS = 8;
    static final int HEADS = 32;
    static final int D = 128;
    static final int PAGE_TOKENS = 64;
    static final int MAX_BATCH = 16;
    static final int MAX_TOKENS = 131072;
    static final int[] LENGTHS = {4096, 32768, 131072};
    static final int[] BATCHES = {1, 16};
    static final int[] PREFILL = {4096, 32768};
    static final int CHUNK = 32768;
    /** Decodes a timed graph replays (graphTime). */
    static final int INNER = 10;

    private AttentionGpuBench() {
    }

    public static void main(String[] args) {
        List<KvFormat> formats = new ArrayList<>();
        if (args.length > 0) {
            for (String name : args[0].split(",")) {
                formats.add(KvFormat.parse(name.strip()));
            }
        } else {
            formats.addAll(KvFormat.all());
        }
        Sizes sizes = args.length > 1 ? Sizes.prefillOnly(args[1]) : Sizes.DEFAULT;
        try (CudaContext context = CudaContext.open(); CudaStream stream = context.createStream()) {
            KernelCache cache = KernelCache.open(context);
            List<AttentionShape> shapes = new ArrayList<>();
            for (KvFormat f : formats) {
                shapes.add(shape(f));
            }
            AttentionPrecompile.compile(cache, context.computeCapability().arch(), shapes,
                    Runtime.getRuntime().availableProcessors());
            double copy = copyBandwidth(context, cache, stream);
            System.out.printf(Locale.ROOT, "device: %s; copy bandwidth %.0f GB/s (read+write, 1 GiB buffers)%n",
                    context, copy);
            List<String> decodeRows = new ArrayList<>();
            List<String> prefillRows = new ArrayList<>();
            List<String> writeRows = new ArrayList<>();
            for (KvFormat f : formats) {
                run(context, cache, stream, f, copy, sizes, decodeRows, prefillRows, writeRows);
            }
            System.out.println();
            System.out.println("### Decode attention (llama3-8b layer: 32 q heads, 8 kv heads, d 128; one query per "
                    + "sequence)");
            System.out.println();
            // "model's basis": CudaAttention.decode with rotatedBasis, a decode step's call (its RoPE write rotates
            // the queries: that pass is not in this time), graph-timed as the first
            System.out.println("| K/V format | cached tokens | batch | time (µs, median) | cache read (GB/s) "
                    + "| of copy bw | launched (µs, median) | model's basis (µs) | of copy bw |");
            System.out.println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
            decodeRows.forEach(System.out::println);
            System.out.println();
            System.out.println("### Prefill attention (causal, one sequence, 32 q heads, 8 kv heads, d 128)");
            System.out.println();
            // "model's basis": CudaAttention.prefill with rotatedBasis, the model's call (its RoPE rotates the queries
            // and its f16 conversion turns the output back: those passes are not in this time)
            System.out.println("| K/V format | tokens | time (ms, median) | TFLOP/s | model's basis (ms) | TFLOP/s |");
            System.out.println("| --- | ---: | ---: | ---: | ---: | ---: |");
            prefillRows.forEach(System.out::println);
            System.out.println();
            System.out.println("### Quantize on write (K and V rows of 128 values, 262144 of each per launch)");
            System.out.println();
            System.out.println("| format | time (µs, median) | rows/s (K+V) | µs per llama3-8b token (32 layers) |");
            System.out.println("| --- | ---: | ---: | ---: |");
            writeRows.forEach(System.out::println);
        }
    }

    /**
     * What a run measures: decode at {@code lengths} x {@code batches} over a cache of {@code batch} sequences of
     * {@code tokens}, and prefill at {@code prefill} lengths.
     */
    record Sizes(int batch, int tokens, int[] lengths, int[] batches, int[] prefill) {
        static final Sizes DEFAULT = new Sizes(MAX_BATCH, MAX_TOKENS, LENGTHS, BATCHES, PREFILL);

        /** {@code prefill=L,L,...}: prefill alone at those lengths, one sequence. */
        static Sizes prefillOnly(String arg) {
            if (!arg.startsWith("prefill=")) {
                throw new IllegalArgumentException("expected prefill=L,L,... after the formats, got " + arg);
            }
            int[] lengths = Arrays.stream(arg.substring("prefill=".length()).split(","))
                    .mapToInt(x -> Integer.parseInt(x.strip())).sorted().toArray();
            int tokens = (lengths[lengths.length - 1] + CHUNK - 1) / CHUNK * CHUNK;
            return new Sizes(1, tokens, new int[0], new int[0], lengths);
        }
    }

    static AttentionShape shape(KvFormat f) {
        return new AttentionShape(new KvGeometry(1, KV_HEADS, D, D), HEADS, f, PageMeanFormat.rows(f), PAGE_TOKENS);
    }

    private static void run(CudaContext context, KernelCache cache, CudaStream stream, KvFormat f, double copy,
                            Sizes sizes, List<String> decodeRows, List<String> prefillRows, List<String> writeRows) {
        AttentionShape shape = shape(f);
        int pagesPerSeq = sizes.tokens() / PAGE_TOKENS;
        int pages = sizes.batch() * pagesPerSeq;
        int[] perm = shuffled(pages, 42);
        boolean prefill = List.of("f16", "turbo3", "turbo2", "q8_0", "turbo4", "q4_0h")
                .contains(PageMeanFormat.rows(f).name());
        int maxPrefill = prefill ? sizes.prefill()[sizes.prefill().length - 1] : 0;
        try (CudaKvCache kv = CudaKvCache.allocate(context, shape.geometry(), f, shape.vFormat(), PAGE_TOKENS, pages);
             CudaAttention writer = CudaAttention.create(context, cache, shape,
                     AttentionPlan.of(sizes.batch(), 1, sizes.tokens(), maxPrefill));
             DeviceBatch batch = DeviceBatch.allocate(context, sizes.batch(), pagesPerSeq);
             DeviceBuffer k = context.allocate(4L * CHUNK * KV_HEADS * D);
             DeviceBuffer v = context.allocate(4L * CHUNK * KV_HEADS * D);
             DeviceBuffer slots = context.allocate(4L * CHUNK);
             DeviceBuffer prevPages = context.allocate(4L * CHUNK);
             Arena arena = Arena.ofConfined()) {
            MemorySegment hostSlots = arena.allocate(4L * CHUNK, 16);
            MemorySegment hostPrev = arena.allocate(4L * CHUNK, 16);
            // ---- fill the cache (and time the quantize kernel on the first chunk)
            long n = (long) CHUNK * KV_HEADS * D;
            double[] writeTimes = null;
            for (int s = 0; s < sizes.batch(); s++) {
                int[] table = Arrays.copyOfRange(perm, s * pagesPerSeq, (s + 1) * pagesPerSeq);
                batch.set(s, table, table.length, sizes.tokens());
                for (int t0 = 0; t0 < sizes.tokens(); t0 += CHUNK) {
                    for (int t = 0; t < CHUNK; t++) {
                        int pos = t0 + t;
                        hostSlots.setAtIndex(ValueLayout.JAVA_INT, t,
                                table[pos / PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS);
                        // centered keys: the page before a write's first token (-1: none), -2 for the others
                        hostPrev.setAtIndex(ValueLayout.JAVA_INT, t,
                                t > 0 ? -2 : t0 == 0 ? -1 : table[(t0 - 1) / PAGE_TOKENS]);
                    }
                    slots.copyFromHost(hostSlots);
                    prevPages.copyFromHost(hostPrev);
                    writer.fillNormal(k, n, 2 * (s * 64 + t0 / CHUNK), 1f, stream);
                    writer.fillNormal(v, n, 2 * (s * 64 + t0 / CHUNK) + 1, 1f, stream);
                    if (writeTimes == null) {
                        writeTimes = time(context, stream, 3, 10,
                                () -> writer.quantizeRows(kv, 0, k, v, slots, prevPages, CHUNK, stream));
                    } else {
                        writer.quantizeRows(kv, 0, k, v, slots, prevPages, CHUNK, stream);
                    }
                }
            }
            batch.upload();
            stream.synchronize();
            double wUs = median(writeTimes) * 1e3;
            double rowsPerS = 2.0 * CHUNK * KV_HEADS / (wUs * 1e-6);
            writeRows.add(String.format(Locale.ROOT, "| %s | %.1f | %.2e | %.2f |", f.name(), wUs, rowsPerS,
                    32.0 * 2 * KV_HEADS / rowsPerS * 1e6));
            System.out.printf(Locale.ROOT, "%s: cache filled (%d MiB); %s%n", f.name(), kv.byteSize() >> 20,
                    writer.launchSummary());

            // ---- decode
            try (DeviceBuffer q = context.allocate(4L * MAX_BATCH * HEADS * D);
                 DeviceBuffer out = context.allocate(4L * MAX_BATCH * HEADS * D)) {
                writer.fillNormal(q, (long) MAX_BATCH * HEADS * D, 7, 1f, stream);
                for (int len : sizes.lengths()) {
                    try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                            AttentionPlan.of(MAX_BATCH, 1, len, 0))) {
                        for (int s = 0; s < MAX_BATCH; s++) {
                            batch.setLength(s, len);
                        }
                        batch.upload();
                        for (int b : sizes.batches()) {
                            Runnable decode = () -> attention.decode(kv, 0, q, batch, b, out, stream);
                            double launched = median(time(context, stream, 3, 20, decode)) * 1e3;
                            double us = graphTime(context, stream, 1, 10, decode) * 1e3;
                            // as a decode step calls it: the queries rotated by the step's RoPE write (not timed)
                            double usModel = graphTime(context, stream, 1, 10, () -> attention.decode(kv, 0, q, batch,
                                    b, out, null, null, true, stream)) * 1e3;
                            double bytes = (double) b * len * KV_HEADS * (shape.kRowBytes() + shape.vRowBytes());
                            double gbps = bytes / (us * 1e-6) / 1e9;
                            double gbpsModel = bytes / (usModel * 1e-6) / 1e9;
                            decodeRows.add(String.format(Locale.ROOT,
                                    "| %s | %d | %d | %.1f | %.0f | %.0f%% | %.1f | %.1f | %.0f%% |", f.name(), len,
                                    b, us, gbps, 100 * gbps / copy, launched, usModel, 100 * gbpsModel / copy));
                            System.out.printf(Locale.ROOT, "decode %s L=%d B=%d split=%d: %.1f µs, %.0f GB/s "
                                    + "(launched one at a time: %.1f µs; in the model's basis %.1f µs)%n", f.name(),
                                    len, b, attention.decodeSplit(len), us, gbps, launched, usModel);
                        }
                    }
                }
            }

            // ---- prefill
            if (prefill) {
                for (int len : sizes.prefill()) {
                    try (DeviceBuffer q = context.allocate(4L * len * HEADS * D);
                         DeviceBuffer out = context.allocate(4L * len * HEADS * D)) {
                        writer.fillNormal(q, (long) len * HEADS * D, 11, 1f, stream);
                        int reps = len > 8192 ? 5 : 10;
                        double ms = median(time(context, stream, 2, reps,
                                () -> writer.prefill(kv, 0, q, batch, 0, 0, len, out, stream)));
                        // as the model calls it: queries rotated and the output turned back in its own passes
                        double msModel = median(time(context, stream, 2, reps,
                                () -> writer.prefill(kv, 0, q, batch, 0, 0, len, out, true, stream)));
                        double flops = 2.0 * len * (double) len * D * HEADS;
                        prefillRows.add(String.format(Locale.ROOT, "| %s | %d | %.2f | %.1f | %.2f | %.1f |", f.name(),
                                len, ms, flops / (ms * 1e-3) / 1e12, msModel, flops / (msModel * 1e-3) / 1e12));
                        System.out.printf(Locale.ROOT, "prefill %s L=%d: %.2f ms, in the model's basis %.2f ms%n",
                                f.name(), len, ms, msModel);
                    }
                }
            }
        }
    }

    /**
     * Milliseconds of one run of {@code work} as a decode step runs it: {@value #INNER} runs captured into one graph,
     * the median of {@code reps} replays (after {@code warmup}) divided by {@value #INNER}, so no host launch time is
     * inside the measurement. Kernel launches: {@value #INNER} x (warmup + reps).
     */
    static double graphTime(CudaContext context, CudaStream stream, int warmup, int reps, Runnable work) {
        try (CudaGraph graph = CudaGraph.capture(stream, () -> {
            for (int i = 0; i < INNER; i++) {
                work.run();
            }
        })) {
            return median(time(context, stream, warmup, reps, () -> graph.launch(stream))) / INNER;
        }
    }

    /** Milliseconds of each of {@code reps} runs (after {@code warmup} untimed ones), by CUDA events. */
    static double[] time(CudaContext context, CudaStream stream, int warmup, int reps, Runnable work) {
        for (int i = 0; i < warmup; i++) {
            work.run();
        }
        double[] ms = new double[reps];
        try (CudaEvent start = context.createEvent(); CudaEvent end = context.createEvent()) {
            for (int i = 0; i < reps; i++) {
                start.record(stream);
                work.run();
                end.record(stream);
                ms[i] = CudaEvent.elapsedMillis(start, end);
            }
        }
        return ms;
    }

    static double median(double[] x) {
        double[] s = x.clone();
        Arrays.sort(s);
        return s.length % 2 == 1 ? s[s.length / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
    }

    static double copyBandwidth(CudaContext context, KernelCache cache, CudaStream stream) {
        long bytes = 1L << 30;
        try (DeviceCopy copy = DeviceCopy.load(context, cache);
             DeviceBuffer src = context.allocate(bytes);
             DeviceBuffer dst = context.allocate(bytes)) {
            src.fillInts(0x3F800000);
            return copy.bandwidthGBps(src, dst, bytes, 20, stream);
        }
    }

    static int[] shuffled(int n, long seed) {
        int[] p = new int[n];
        for (int i = 0; i < n; i++) {
            p[i] = i;
        }
        SplittableRandom r = new SplittableRandom(seed);
        for (int i = n - 1; i > 0; i--) {
            int j = r.nextInt(i + 1);
            int t = p[i];
            p[i] = p[j];
            p[j] = t;
        }
        return p;
    }
}
