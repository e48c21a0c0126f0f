package dev.kvant.engine;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.CpuBackend;
import dev.kvant.backend.SequencePool;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.LlamaModel;
import dev.kvant.tensor.Parallel;

import java.lang.management.CompilationMXBean;
import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.function.Consumer;
import java.util.function.LongSupplier;

/**
 * llama-bench's tests: {@code pp N} times a prompt of N tokens, {@code tg N} times N tokens generated one by one;
 * both run after the cache already holds {@code depth} tokens (filled untimed). Each test is warmed up untimed,
 * then runs {@code reps} times; tokens are random ids, as llama-bench's are.
 *
 * <p>The warm-up repeats the test until the JIT has settled: until, for {@link #PLATEAU_RUNS} runs and {@link
 * #PLATEAU_NANOS}, the test's fastest run has not improved by more than {@link #PLATEAU} and the JIT has compiled
 * nothing, after at least {@link #MIN_WARMUP_NANOS}, and at most {@link #MAX_WARMUP_RUNS} times or {@link
 * #MAX_WARMUP_NANOS} of warm-up.
 * One untimed run was not enough on the CPU: the compiler was still replacing the vector kernels during the first
 * timed repetitions (tinycode pp512 ran at 1,824, 1,964, 2,162, then 2,300-2,400 t/s), so the mean mixed
 * warm-up into the steady state that llama-bench, with no JIT, measures from the start.
 */
public final class Benchmark {

    /**
     * One row of results: tokens per second, mean and sample standard deviation over the repetitions, and each
     * repetition's own rate ({@code samples}).
     */
    public record Row(String model, String backend, int threads, String kv, String test, int depth, int reps,
                      double tpsMean, double tpsSd, double[] samples) {
        public String toJson() {
            return toJson(false);
        }

        /** One JSON object; with {@code quartiles} also {@code tps_median}, {@code tps_q1} and {@code tps_q3}. */
        public String toJson(boolean quartiles) {
            String base = String.format(Locale.ROOT,
                    "{\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"kv\":\"%s\",\"test\":\"%s\","
                            + "\"depth\":%d,\"reps\":%d,\"tps_mean\":%s,\"tps_sd\":%s",
                    escape(model), backend, threads, kv, test, depth, reps, Perplexity.number(tpsMean, 3),
                    Perplexity.number(tpsSd, 3));
            return quartiles ? base + ",\"tps_median\":" + Perplexity.number(quantile(0.5), 3) + ",\"tps_q1\":"
                    + Perplexity.number(quantile(0.25), 3) + ",\"tps_q3\":" + Perplexity.number(quantile(0.75), 3)
                    + "}" : base + "}";
        }

        /**
         * The q-quantile of the repetitions' rates (linear between order statistics): the median (q = 0.5) of many
         * short repetitions shrugs off a shared machine's slow phases, which the mean does not.
         */
        public double quantile(double q) {
            double[] v = samples.clone();
            Arrays.sort(v);
            double at = q * (v.length - 1);
            int lo = (int) Math.floor(at);
            int hi = Math.min(v.length - 1, lo + 1);
            return v[lo] + (at - lo) * (v[hi] - v[lo]);
        }
    }

    /**
     * @param randomDepth fill the depth with random K/V rows ({@link Session#fillRandom}) instead of a prefill of
     *                    random tokens: for depths a prefill would take minutes to reach
     * @param sequences   sequences a generation test decodes together ({@link Backend#decodeBatchGreedy}, each at
     *                    the same depth; its t/s counts the tokens of all of them): test {@code tgN xS}
     */
    public record Settings(int[] promptSizes, int[] genSizes, int[] depths, int reps, int threads, KvLayerFormats kv,
                           int prefillChunk, boolean randomDepth, int sequences) {
        public Settings {
            if (sequences < 1) {
                throw new IllegalArgumentException("a generation test of " + sequences + " sequences");
            }
        }

        public Settings(int[] promptSizes, int[] genSizes, int[] depths, int reps, int threads, KvFormat kFormat,
                        KvFormat vFormat, int prefillChunk, boolean randomDepth, int sequences) {
            this(promptSizes, genSizes, depths, reps, threads, KvLayerFormats.of(kFormat, vFormat), prefillChunk,
                    randomDepth, sequences);
        }

        public Settings(int[] promptSizes, int[] genSizes, int[] depths, int reps, int threads, KvFormat kFormat,
                        KvFormat vFormat, int prefillChunk, boolean randomDepth) {
            this(promptSizes, genSizes, depths, reps, threads, kFormat, vFormat, prefillChunk, randomDepth, 1);
        }

        public Settings(int[] promptSizes, int[] genSizes, int[] depths, int reps, int threads, KvFormat kFormat,
                        KvFormat vFormat, int prefillChunk) {
            this(promptSizes, genSizes, depths, reps, threads, kFormat, vFormat, prefillChunk, false);
        }

        /** The K format of the layers without one of their own. */
        public KvFormat kFormat() {
            return kv.k();
        }

        /** The V format of the layers without one of their own. */
        public KvFormat vFormat() {
            return kv.v();
        }
    }

    /**
     * Improvement of the fastest warm-up run below which it counts as no improvement. Two consecutive runs agreeing
     * (within 5%, the rule before) ended warm-ups while the JIT still made each run a few percent faster than the
     * last: the same pp32 measured 1,503 t/s as a run's first test and 2,862, then 2,993, repeated after it.
     */
    static final double PLATEAU = 0.01;
    /**
     * Runs in a row without such an improvement, and without the JIT compiling meanwhile, after which it counts as
     * settled (and {@link #PLATEAU_NANOS} of them). The fastest run alone stood still for five runs while
     * compilations were still landing (on two cores the compiler threads share them with the test's workers): a
     * first pp32 still read 1,273 t/s against 2,554 when repeated.
     */
    static final int PLATEAU_RUNS = 3;
    /**
     * Time the plateau must also last: a compilation counts only when it ends, and a long one, its threads sharing
     * two cores with the test's workers, outlasts a few short runs (pp32 runs take ~10 ms).
     */
    static final long PLATEAU_NANOS = 1_000_000_000L;
    /**
     * Warm-up time before a plateau counts: a short test (pp32) repeats itself long before the JIT is done with the
     * code it runs (a first test measured 5x slower than the same test after others).
     */
    static final long MIN_WARMUP_NANOS = 1_500_000_000L;
    static final int MAX_WARMUP_RUNS = 10_000;
    static final long MAX_WARMUP_NANOS = 30_000_000_000L;

    private Benchmark() {
    }

    /**
     * Runs {@code once} (which returns the nanoseconds it timed) untimed until, after {@link #MIN_WARMUP_NANOS} of
     * warm-up past the first run, the fastest run has not improved by more than {@link #PLATEAU} for {@link
     * #PLATEAU_RUNS} runs, or the run or time cap is reached.
     */
    static void warmUp(LongSupplier once) {
        warmUp(once, System::nanoTime, Benchmark::compileMillis);
    }

    /** The JIT's compilation time so far (ms), or 0 where the JVM does not say. */
    static long compileMillis() {
        CompilationMXBean jit = ManagementFactory.getCompilationMXBean();
        return jit != null && jit.isCompilationTimeMonitoringSupported() ? jit.getTotalCompilationTime() : 0;
    }

    /**
     * {@link #warmUp(LongSupplier)} against the clock {@code now} (nanoseconds) and the JIT's compilation time so far
     * {@code compiled} (any unit: a change says it compiled).
     */
    static void warmUp(LongSupplier once, LongSupplier now, LongSupplier compiled) {
        long best = once.getAsLong();
        // from the end of the first run, which also compiles, captures and fills (seconds that warm nothing up)
        long start = now.getAsLong();
        long jit = compiled.getAsLong();
        int flat = 0;   // runs since the fastest improved by more than PLATEAU or the JIT compiled
        long flatSince = start;
        for (int run = 1; run < MAX_WARMUP_RUNS && now.getAsLong() - start < MAX_WARMUP_NANOS; run++) {
            long t = once.getAsLong();
            long j = compiled.getAsLong();
            if (t < (1 - PLATEAU) * best || j != jit) {
                flat = 0;
                flatSince = now.getAsLong();
            } else {
                flat++;
            }
            jit = j;
            best = Math.min(best, t);
            long at = now.getAsLong();
            if (flat >= PLATEAU_RUNS && at - flatSince >= PLATEAU_NANOS && at - start >= MIN_WARMUP_NANOS) {
                return;
            }
        }
    }

    /** Runs the tests on the CPU backend with a pool of {@code s.threads()} workers. */
    public static List<Row> run(LlamaModel model, Settings s, Consumer<String> progress) {
        try (Parallel pool = new Parallel(s.threads())) {
            return run(new CpuBackend(model, pool), s, progress);
        }
    }

    /**
     * Runs the tests on a backend. Generation feeds each step the greedy token of the step before (computed where
     * the model runs, as a real generation does), so a device backend copies back one id per token.
     */
    public static List<Row> run(Backend backend, Settings s, Consumer<String> progress) {
        List<Row> rows = new ArrayList<>();
        int maxDepth = 0;
        for (int d : s.depths()) {
            maxDepth = Math.max(maxDepth, d);
        }
        int maxTest = 0;
        for (int p : s.promptSizes()) {
            maxTest = Math.max(maxTest, p);
        }
        for (int g : s.genSizes()) {
            maxTest = Math.max(maxTest, g);
        }
        int ctx = maxDepth + maxTest;
        String kv = s.kv().name();
        Session[] others = new Session[s.sequences() - 1];
        // several sequences share one pool with room for all of them
        int perSequence = (ctx + Session.PAGE_TOKENS - 1) / Session.PAGE_TOKENS * Session.PAGE_TOKENS;
        SequencePool shared = others.length == 0 ? null
                : backend.newSequencePool(s.sequences() * perSequence, s.kv());
        try (shared; Session session = shared == null
                ? new Session(backend, ctx, s.kv(), s.prefillChunk())
                : new Session(backend, shared.newSequence(ctx), ctx, s.prefillChunk())) {
            try {
                for (int i = 0; i < others.length; i++) {
                    others[i] = new Session(backend, shared.newSequence(ctx), ctx, s.prefillChunk());
                }
                tests(backend, s, session, others, kv, rows, progress);
            } finally {
                for (Session o : others) {
                    if (o != null) {
                        o.close();   // before the pool they came from
                    }
                }
            }
        }
        return rows;
    }

    /** The pp and tg tests at each depth; a tg test decodes the session and the others together. */
    private static void tests(Backend backend, Settings s, Session session, Session[] others, String kv,
                              List<Row> rows, Consumer<String> progress) {
        SplittableRandom random = new SplittableRandom(1234);
        int vocab = backend.model().config().vocabSize();
        for (int depth : s.depths()) {
            int[] fill = randomTokens(random, depth, vocab);
            // the sessions that hold this depth's fill: a shallower depth after a deeper one would otherwise keep,
            // below it, the rows the deeper depth's fill and tests wrote
            Set<Session> filled = Collections.newSetFromMap(new IdentityHashMap<>());
            for (int p : s.promptSizes()) {
                if (p <= 0) {
                    continue;
                }
                String test = "pp" + p;
                progress.accept(test + " @ d" + depth);
                int[] prompt = randomTokens(random, p, vocab);
                LongSupplier once = () -> {
                    resetTo(session, fill, depth, s.randomDepth(), filled);
                    long t0 = System.nanoTime();
                    session.prefillGreedy(prompt);
                    return System.nanoTime() - t0;
                };
                warmUp(once);
                double[] tps = new double[s.reps()];
                for (int r = 0; r < s.reps(); r++) {
                    tps[r] = p / (once.getAsLong() / 1e9);
                }
                rows.add(row(backend, s, kv, test, depth, tps));
            }
            for (int g : s.genSizes()) {
                if (g <= 0) {
                    continue;
                }
                String test = "tg" + g + (others.length > 0 ? " x" + s.sequences() : "");
                progress.accept(test + " @ d" + depth);
                LongSupplier once = others.length == 0 ? () -> {
                    resetTo(session, fill, depth, s.randomDepth(), filled);
                    int token = random.nextInt(vocab);
                    long t0 = System.nanoTime();
                    for (int i = 0; i < g; i++) {
                        token = session.decodeGreedy(token);
                    }
                    return System.nanoTime() - t0;
                } : () -> {
                    BackendSequence[] seqs = new BackendSequence[s.sequences()];
                    seqs[0] = session.backendSequence();
                    resetTo(session, fill, depth, s.randomDepth(), filled);
                    for (int i = 0; i < others.length; i++) {
                        resetTo(others[i], fill, depth, s.randomDepth(), filled);
                        seqs[i + 1] = others[i].backendSequence();
                    }
                    int[] tokens = randomTokens(random, seqs.length, vocab);
                    long t0 = System.nanoTime();
                    for (int i = 0; i < g; i++) {
                        tokens = backend.decodeBatchGreedy(seqs, tokens);
                    }
                    return System.nanoTime() - t0;
                };
                warmUp(once);
                double[] tps = new double[s.reps()];
                for (int r = 0; r < s.reps(); r++) {
                    tps[r] = (double) g * s.sequences() / (once.getAsLong() / 1e9);
                }
                rows.add(row(backend, s, kv, test, depth, tps));
            }
        }
    }

    /**
     * Brings the cache to exactly the depth: filled once per depth (a prefill of the fill tokens, or random rows),
     * then truncated back before each repetition.
     */
    private static void resetTo(Session session, int[] fill, int depth, boolean random, Set<Session> filled) {
        if (depth > 0 && (filled.add(session) || session.position() < depth)) {
            session.truncate(0);
            if (random) {
                session.fillRandom(depth, 1234);
            } else {
                session.prefill(fill);
            }
        }
        session.truncate(depth);
    }

    private static Row row(Backend backend, Settings s, String kv, String test, int depth, double[] tps) {
        double mean = 0;
        for (double v : tps) {
            mean += v;
        }
        mean /= tps.length;
        double var = 0;
        for (double v : tps) {
            var += (v - mean) * (v - mean);
        }
        double sd = tps.length > 1 ? Math.sqrt(var / (tps.length - 1)) : 0;
        return new Row(displayName(backend.model().name()), backend.name(), backend.threads(), kv, test, depth, tps.length, mean, sd, tps);
    }

    /** A file's name without its folders; synthetic names unchanged. */
    static String displayName(String name) {
        int slash = name.lastIndexOf('/');
        return slash >= 0 && !name.startsWith("synthetic") ? name.substring(slash + 1) : name;
    }

    private static int[] randomTokens(SplittableRandom random, int n, int vocab) {
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = random.nextInt(vocab);
        }
        return t;
    }

    /** A Markdown table in llama-bench's layout. */
    public static String markdown(List<Row> rows) {
        return markdown(rows, false);
    }

    /** The table; with {@code quartiles} the t/s column is the median and quartiles of the repetitions instead. */
    public static String markdown(List<Row> rows, boolean quartiles) {
        StringBuilder sb = new StringBuilder();
        sb.append(quartiles ? "| model | backend | threads | kv | test | t/s median (q1 - q3) |\n"
                : "| model | backend | threads | kv | test | t/s |\n");
        sb.append("| --- | --- | ---: | --- | ---: | ---: |\n");
        for (Row r : rows) {
            String test = r.depth() > 0 ? r.test() + " @ d" + r.depth() : r.test();
            String tps = quartiles
                    ? String.format(Locale.ROOT, "%.2f (%.2f - %.2f)", r.quantile(0.5), r.quantile(0.25),
                    r.quantile(0.75))
                    : String.format(Locale.ROOT, "%.2f ± %.2f", r.tpsMean(), r.tpsSd());
            sb.append(String.format(Locale.ROOT, "| %s | %s | %d | %s | %s | %s |%n", r.model(), r.backend(),
                    r.threads(), r.kv(), test, tps));
        }
        return sb.toString();
    }

    public static String json(List<Row> rows) {
        return json(rows, false);
    }

    /** A JSON array, one object per row; with {@code quartiles} each also has the repetitions' median and quartiles. */
    public static String json(List<Row> rows, boolean quartiles) {
        StringBuilder sb = new StringBuilder("[");
        for (int i = 0; i < rows.size(); i++) {
            sb.append(i == 0 ? "\n  " : ",\n  ").append(rows.get(i).toJson(quartiles));
        }
        return sb.append("\n]").toString();
    }

    static String escape(String s) {
        StringBuilder sb = new StringBuilder();
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                default -> {
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        return sb.toString();
    }
}
