package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
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
    public record Settings(List<KvFormat> formats, int[] contexts, int[] threads, int heads, int kvHeads, int headDim,
                           int reps, int prefillTokens, AttentionOptions options, long copyBytes) {
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
                try (AttentionProblem p = AttentionProblem.random(f, f, s.kvHeads(), group, s.headDim(), s.headDim(),
                        ctx, Math.max(1, pp), 64, ctx, DISTINCT_POSITIONS)) {
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
            try (AttentionProblem p = AttentionProblem.random(f, f, s.kvHeads(), group, s.headDim(), s.headDim(),
                    2 * CpuAttention.PARTITION, 16, 64, 1, DISTINCT_POSITIONS);
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
