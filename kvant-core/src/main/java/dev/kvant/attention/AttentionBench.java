package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.select.PageTopK;
import dev.kvant.select.Selection;
import dev.kvant.select.SelectionConfig;
import dev.kvant.select.SelectionLog;
import dev.kvant.tensor.Parallel;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.function.Consumer;

/**
 * {@code kvant bench-attention}: one layer's attention over a cache of random rows of a real geometry (default
 * Llama-3-8B: 32 query heads, 8 kv heads, head size 128), per format, cache length and thread count.
 *
 * <p>Decode: the time of one query token's attention (all heads of one layer), the median of repetitions, and the
 * rate it reads the cache at (K and V bytes of every cached position / time). Beside it, in the same run, the
 * machine's copy bandwidth: {@link MemorySegment#copy} of a buffer far larger than the caches, split over the same
 * number of threads, counting bytes read plus bytes written. Prefill (optional): the time of a chunk of tokens
 * attending to the cache before them and to themselves.
 */
public final class AttentionBench {
    private static final int DISTINCT_POSITIONS = 4096;

    /** @param copyBytes size of the buffer the copy bandwidth is measured on; far larger than the caches' L3 share */
    /** @param select when not null, also time decode through a {@link PageTopK} selection (selector included) */
    public record Settings(List<KvFormat> formats, int[] contexts, int[] threads, int heads, int kvHeads, int headDim,
                           int reps, int prefillTokens, AttentionOptions options, long copyBytes,
                           SelectionConfig select) {
        public Settings(List<KvFormat> formats, int[] contexts, int[] threads, int heads, int kvHeads, int headDim,
                        int reps, int prefillTokens, AttentionOptions options, long copyBytes) {
            this(formats, contexts, threads, heads, kvHeads, headDim, reps, prefillTokens, options, copyBytes, null);
        }
    }

    /** One measurement: {@code test} is "decode" or "pp" + tokens. */
    public record Row(String format, String test, int ctx, int threads, long cacheBytes, double ms, double gbPerS,
                      double copyGbPerS) {
        public String toJson() {
            return String.format(Locale.ROOT, "{\"kv\":\"%s\",\"test\":\"%s\",\"ctx\":%d,\"threads\":%d,"
                            + "\"cache_bytes\":%d,\"ms\":%.4f,\"gb_per_s\":%.2f,\"copy_gb_per_s\":%.2f}", format, test,
                    ctx, threads, cacheBytes, ms, gbPerS, copyGbPerS);
        }
    }

    private AttentionBench() {
    }

    /**
     * A replay of recorded selections: per recorded (layer, query block), attention of its queries through its
     * selection over a cache of random rows of the recorded geometry (one layer; every record runs on it).
     *
     * @param calls      records replayed
     * @param ctx        cache length: the furthest recorded position + 1
     * @param ms         median over the records of each record's median time through its selection
     * @param denseMs    the same for dense attention of the same queries
     * @param meanTokens positions a (record, kv head) list selects, on average
     * @param checksum   a hash of the bits of every record's output: equal runs print equal checksums
     */
    public record Replay(String format, int threads, int calls, int ctx, double ms, double denseMs, double meanTokens,
                         String checksum) {
        public String toJson() {
            return String.format(Locale.ROOT, "{\"kv\":\"%s\",\"threads\":%d,\"calls\":%d,\"ctx\":%d,\"ms\":%.4f,"
                            + "\"dense_ms\":%.4f,\"mean_selected_tokens\":%.1f,\"checksum\":\"%s\"}", format, threads,
                    calls, ctx, ms, denseMs, meanTokens, checksum);
        }
    }

    /**
     * Replays up to limit records (0: all) of a selection dump over random K/V of format f, each timed reps times
     * through its selection and densely, both with the attention options o; with decodeOnly, only the records of
     * decode calls (at most {@value CpuAttention#MAX_MULTI_QUERY} tokens).
     */
    public static Replay replay(SelectionLog log, KvFormat f, Parallel pool, int limit, boolean decodeOnly, int reps,
                                long seed, AttentionOptions o, Consumer<String> progress) {
        SelectionLog.Header h = log.header();
        List<SelectionLog.Entry> entries = log.entries().stream()
                .filter(e -> !decodeOnly || e.tokens() <= CpuAttention.MAX_MULTI_QUERY)
                .limit(limit > 0 ? limit : Long.MAX_VALUE).toList();
        if (entries.isEmpty()) {
            throw new IllegalArgumentException("the selection dump holds no records to replay");
        }
        if (h.heads() % h.kvHeads() != 0) {
            throw new IllegalArgumentException("selection dump header: " + h.heads() + " heads are not a multiple of "
                    + h.kvHeads() + " kv heads");
        }
        int ctx = 0;
        for (SelectionLog.Entry e : entries) {
            ctx = Math.max(ctx, e.position() + e.tokens());
        }
        int q = Selection.QUERY_BLOCK;
        progress.accept(f.name() + ": writing a cache of " + ctx + " random positions");
        try (AttentionProblem p = AttentionProblem.random(f, PageMeanFormat.rows(f), h.kvHeads(),
                h.heads() / h.kvHeads(), h.headDimK(), h.headDimV(), Math.max(0, ctx - q), Math.min(q, ctx), 64, seed,
                DISTINCT_POSITIONS)) {
            Selection[] sels = new Selection[entries.size()];
            double tokens = 0;
            for (int i = 0; i < sels.length; i++) {
                SelectionLog.Entry e = entries.get(i);
                sels[i] = e.toSelection(h.blockTokens());
                for (int g = 0; g < h.kvHeads(); g++) {
                    tokens += sels[i].tokens(0, g);
                }
            }
            float[] out = new float[p.outputSize()];
            long hash = 0xcbf29ce484222325L;
            progress.accept(f.name() + ": warming up, checksum");
            for (int i = 0; i < sels.length; i++) {
                SelectionLog.Entry e = entries.get(i);
                Arrays.fill(out, Float.NaN);
                CpuAttention.attend(p.seq(), 0, p.queries(), e.tokens(), e.position(), p.heads(), p.scale(),
                        o, sels[i], out, pool);
                for (int j = 0; j < e.tokens() * p.heads() * h.headDimV(); j++) {
                    hash = (hash ^ Float.floatToRawIntBits(out[j])) * 0x100000001b3L;
                }
            }
            double[] sel = new double[sels.length];
            double[] dense = new double[sels.length];
            double[] t = new double[Math.max(1, reps)];
            for (int i = 0; i < sels.length; i++) {
                if (i % 64 == 0) {
                    progress.accept(f.name() + ": record " + i + "/" + sels.length);
                }
                SelectionLog.Entry e = entries.get(i);
                for (int r = 0; r < t.length; r++) {
                    long t0 = System.nanoTime();
                    CpuAttention.attend(p.seq(), 0, p.queries(), e.tokens(), e.position(), p.heads(), p.scale(),
                            o, sels[i], out, pool);
                    t[r] = (System.nanoTime() - t0) / 1e6;
                }
                sel[i] = median(t);
                for (int r = 0; r < t.length; r++) {
                    long t0 = System.nanoTime();
                    CpuAttention.attend(p.seq(), 0, p.queries(), e.tokens(), e.position(), p.heads(), p.scale(), o,
                            out, pool);
                    t[r] = (System.nanoTime() - t0) / 1e6;
                }
                dense[i] = median(t);
            }
            return new Replay(f.name(), pool.threads(), sels.length, ctx, median(sel), median(dense),
                    tokens / sels.length / h.kvHeads(), String.format("%016x", hash));
        }
    }

    public static String replayMarkdown(List<Replay> rows) {
        StringBuilder sb = new StringBuilder();
        sb.append("| kv | threads | records | cache | selected tokens (mean) | ms selected | ms dense | checksum |\n");
        sb.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
        for (Replay r : rows) {
            sb.append(String.format(Locale.ROOT, "| %s | %d | %d | %d | %.0f | %.3f | %.3f | %s |%n", r.format(),
                    r.threads(), r.calls(), r.ctx(), r.meanTokens(), r.ms(), r.denseMs(), r.checksum()));
        }
        return sb.toString();
    }

    /** Copy bandwidth (read + write) with this many threads, in GB/s: the median of 5 copies. */
    public static double copyBandwidth(Parallel pool, long bytes) {
        try (Arena arena = Arena.ofShared()) {
            MemorySegment a = arena.allocate(bytes, 4096);
            MemorySegment b = arena.allocate(bytes, 4096);
            a.fill((byte) 1);
            b.fill((byte) 2);
            int parts = pool.threads();
            long part = bytes / parts;
            double[] t = new double[7];
            for (int r = 0; r < t.length; r++) {
                long t0 = System.nanoTime();
                pool.forEach(parts, i -> MemorySegment.copy(a, i * part, b, i * part, part));
                t[r] = (System.nanoTime() - t0) / 1e9;
            }
            return 2.0 * part * parts / median(Arrays.copyOfRange(t, 2, t.length)) / 1e9;
        }
    }

    public static List<Row> run(Settings s, Consumer<String> progress) {
        List<Row> rows = new ArrayList<>();
        int maxThreads = Arrays.stream(s.threads()).max().orElse(1);
        double[] copy = new double[maxThreads + 1];
        for (int t : s.threads()) {
            try (Parallel pool = new Parallel(t)) {
                progress.accept("copy bandwidth, " + t + " thread(s)");
                copy[t] = copyBandwidth(pool, s.copyBytes());
            }
        }
        int group = s.heads() / s.kvHeads();
        progress.accept("warming up");
        warmUp(s, group);
        for (KvFormat f : s.formats()) {
            for (int ctx : s.contexts()) {
                progress.accept(f.name() + " ctx " + ctx + ": writing the cache");
                int pp = s.prefillTokens();
                try (AttentionProblem p = AttentionProblem.random(f, PageMeanFormat.rows(f), s.kvHeads(), group,
                        s.headDim(), s.headDim(), ctx, Math.max(1, pp), 64, ctx, DISTINCT_POSITIONS)) {
                    KvCache c = p.cache();
                    float[] out = new float[p.outputSize()];
                    for (int t : s.threads()) {
                        try (Parallel pool = new Parallel(t)) {
                            progress.accept(f.name() + " ctx " + ctx + " decode, " + t + " thread(s)");
                            long bytes = (long) (ctx + 1) * s.kvHeads() * (c.kRowBytes() + c.vRowBytes());
                            int reps = Math.max(3, (int) Math.min(s.reps(), 2e9 / bytes * s.reps() / 20));
                            double ms = time(reps, () -> CpuAttention.decode(p.seq(), 0, p.queries(), 1, ctx,
                                    p.heads(), p.scale(), s.options(), out, pool));
                            rows.add(new Row(f.name(), "decode", ctx, t, bytes, ms, bytes / ms / 1e6, copy[t]));
                            if (s.select() != null) {
                                progress.accept(f.name() + " ctx " + ctx + " decode top-k, " + t + " thread(s)");
                                p.seq().enableKeySummaries(s.select().blockTokens(), s.select().coarseTokens());
                                PageTopK topK = new PageTopK(s.select());
                                Selection sel = new Selection();
                                // the rows the selection attends (whole blocks within the budget, up to the
                                // query), not the budget: a budget between block multiples reads fewer
                                topK.select(p.seq(), 0, p.queries(), 1, ctx, p.heads(), sel, pool);
                                long selTokens = 0;
                                for (int g = 0; g < s.kvHeads(); g++) {
                                    selTokens += sel.tokens(0, g);
                                }
                                long selBytes = selTokens * (c.kRowBytes() + c.vRowBytes());
                                double sms = time(reps, () -> {
                                    topK.select(p.seq(), 0, p.queries(), 1, ctx, p.heads(), sel, pool);
                                    CpuAttention.decode(p.seq(), 0, p.queries(), 1, ctx, p.heads(), p.scale(),
                                            s.options(), sel, out, pool);
                                });
                                String label = "decode topk" + s.select().budget() + (s.select().coarseTokens() == 0
                                        ? "" : " coarse" + s.select().coarseTokens());
                                rows.add(new Row(f.name(), label, ctx, t, selBytes, sms,
                                        selBytes / sms / 1e6, copy[t]));
                            }
                            if (pp > 0) {
                                progress.accept(f.name() + " ctx " + ctx + " pp" + pp + ", " + t + " thread(s)");
                                long ppBytes = (long) (ctx + pp) * s.kvHeads() * (c.kRowBytes() + c.vRowBytes());
                                double pms = time(Math.max(2, s.reps() / 10), () -> CpuAttention.prefill(p.seq(), 0,
                                        p.queries(), pp, ctx, p.heads(), p.scale(), s.options(), out, pool));
                                rows.add(new Row(f.name(), "pp" + pp, ctx, t, ppBytes, pms, ppBytes / pms / 1e6, copy[t]));
                            }
                        }
                    }
                }
            }
        }
        return rows;
    }

    /**
     * Runs every format's kernels on a small cache for a while first: the first format measured otherwise paid for
     * compiling the code all formats share (measured 5x slower than the same run later).
     */
    private static void warmUp(Settings s, int group) {
        for (KvFormat f : s.formats()) {
            try (AttentionProblem p = AttentionProblem.random(f, PageMeanFormat.rows(f), s.kvHeads(), group,
                    s.headDim(), s.headDim(), 2 * CpuAttention.PARTITION, 16, 64, 1, DISTINCT_POSITIONS);
                 Parallel pool = new Parallel(Arrays.stream(s.threads()).max().orElse(1))) {
                float[] out = new float[p.outputSize()];
                long t0 = System.nanoTime();
                while (System.nanoTime() - t0 < 700_000_000L) {
                    CpuAttention.decode(p.seq(), 0, p.queries(), 1, p.start(), p.heads(), p.scale(), s.options(), out,
                            pool);
                    CpuAttention.prefill(p.seq(), 0, p.queries(), 16, p.start(), p.heads(), p.scale(), s.options(),
                            out, pool);
                }
            }
        }
    }

    /**
     * Median milliseconds of reps runs, after warm-up: batches of runs (each at least 100 ms) until a batch's time
     * per run is within 10% of the previous one's, at least a second and at most 30 s. C2 can take several seconds to
     * compile the kernels on a busy machine; a fixed short warm-up measured the first case 10x too slow.
     */
    private static double time(int reps, Runnable r) {
        long start = System.nanoTime();
        double last = Double.MAX_VALUE;
        while (true) {
            long t0 = System.nanoTime();
            int runs = 0;
            do {
                r.run();
                runs++;
            } while (System.nanoTime() - t0 < 100_000_000L);
            double per = (System.nanoTime() - t0) / (double) runs;
            long elapsed = System.nanoTime() - start;
            if (elapsed > 30_000_000_000L || elapsed > 1_000_000_000L && Math.abs(per - last) < 0.1 * last) {
                break;
            }
            last = per;
        }
        double[] t = new double[reps];
        for (int i = 0; i < reps; i++) {
            long t0 = System.nanoTime();
            r.run();
            t[i] = (System.nanoTime() - t0) / 1e6;
        }
        return median(t);
    }

    private static double median(double[] x) {
        double[] s = x.clone();
        Arrays.sort(s);
        return s.length % 2 == 1 ? s[s.length / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
    }

    /** The machine line of the table: CPU model, core count, load average at the time. */
    public static String machine() {
        String model = "unknown CPU";
        try {
            for (String line : Files.readAllLines(Path.of("/proc/cpuinfo"))) {
                if (line.startsWith("model name")) {
                    model = line.substring(line.indexOf(':') + 1).trim();
                    break;
                }
            }
        } catch (IOException | RuntimeException e) {
            // not Linux: the model stays unknown
        }
        String load = "";
        try {
            String[] l = Files.readString(Path.of("/proc/loadavg")).split(" ");
            load = ", load average " + l[0] + " " + l[1] + " " + l[2];
        } catch (IOException | RuntimeException e) {
            // no load figure
        }
        return model + ", " + Runtime.getRuntime().availableProcessors() + " cores, " + Lanes.L + " float lanes" + load;
    }

    public static String markdown(List<Row> rows) {
        StringBuilder sb = new StringBuilder();
        sb.append("| kv | test | cached tokens | threads | ms | GB/s | copy GB/s | % of copy |\n");
        sb.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (Row r : rows) {
            sb.append(String.format(Locale.ROOT, "| %s | %s | %d | %d | %.3f | %.1f | %.1f | %.0f%% |%n", r.format(),
                    r.test(), r.ctx(), r.threads(), r.ms(), r.gbPerS(), r.copyGbPerS(),
                    100 * r.gbPerS() / r.copyGbPerS()));
        }
        return sb.toString();
    }

    public static String json(List<Row> rows) {
        StringBuilder sb = new StringBuilder("[");
        for (int i = 0; i < rows.size(); i++) {
            sb.append(i == 0 ? "\n  " : ",\n  ").append(rows.get(i).toJson());
        }
        return sb.append("\n]").toString();
    }
}
