package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.cuda.CudaException;
import dev.kvant.cuda.model.CudaBackend;
import dev.kvant.engine.Benchmark;
import dev.kvant.engine.Session;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.LlamaModel;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

/** llama-bench's prompt-processing and generation tests. */
@Command(name = "bench", mixinStandardHelpOptions = true,
        description = {"Benchmark prompt processing (pp) and generation (tg), llama-bench style.",
                "Without -m a synthetic model of a real shape with random weights is used (--synthetic)."})
final class BenchCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Option(names = "--synthetic", paramLabel = "SHAPE",
            description = "synthetic model: llama3-8b, llama3.2-1b, qwen2.5-7b, tiny (default tiny when no -m)")
    String synthetic;

    @Option(names = "--weights", paramLabel = "TYPE", defaultValue = "f16",
            description = "weight format of a synthetic model: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k (its output"
                    + " head in q6_k with q4_0, q4_k and q5_k, as llama.cpp quantizes a model file)")
    String weights;

    @Option(names = {"-p", "--n-prompt"}, paramLabel = "N", split = ",", defaultValue = "512",
            description = "prompt sizes (default ${DEFAULT-VALUE})")
    int[] prompt;

    @Option(names = {"-n", "--n-gen"}, paramLabel = "N", split = ",", defaultValue = "128",
            description = "generation lengths (default ${DEFAULT-VALUE})")
    int[] gen;

    @Option(names = {"-d", "--n-depth"}, paramLabel = "N", split = ",", defaultValue = "0",
            description = "cache depths to test at (default ${DEFAULT-VALUE})")
    int[] depth;

    @Option(names = "--depth-fill", paramLabel = "HOW", defaultValue = "prefill",
            description = "how the depth is filled: prefill (random tokens through the model, as llama-bench) or "
                    + "random (random K/V rows written straight into the cache: seconds at 512K; default ${DEFAULT-VALUE})")
    String depthFill;

    @Mixin
    SelectOptions selectOpts;

    @Option(names = "--kv", paramLabel = "FORMAT", split = ",",
            description = "cache formats to test one after another, each for K and V (e.g. f16,q8_0,turbo3); "
                    + "overrides --ctk/--ctv")
    String[] kvList;

    @Option(names = {"-np", "--parallel"}, paramLabel = "N", defaultValue = "1",
            description = "sequences the generation tests decode together, each at the test's depth; t/s counts all"
                    + " their tokens (test tgN xN; default ${DEFAULT-VALUE})")
    int sequences;

    @Option(names = {"-r", "--repetitions"}, paramLabel = "N", defaultValue = "5",
            description = "timed repetitions per test (default ${DEFAULT-VALUE})")
    int reps;

    @Option(names = "--json", description = "print a JSON array, one object per row")
    boolean json;

    @Option(names = "--median", description = "report the median and quartiles of the repetitions instead of their"
            + " mean and deviation (JSON: also tps_median, tps_q1, tps_q3): on a shared or throttling machine, many"
            + " short repetitions (e.g. -n 16 -r 41) and their median show what the code does between slow phases")
    boolean median;

    /**
     * Each row as a fraction of what the device allows, both measured in this run: generation against copy bandwidth
     * / the bytes a step reads (the weights once per launch of up to maxBatch sequences, and each sequence's cache at
     * that depth); prompt processing against the bf16 GEMM rate / its flops per token (2 per weight element, the
     * output head once per prefill chunk, and the causal attention over the depth and the prompt before it). With a
     * page selection or sparse V the cache is not read whole, so there is no such limit: none is printed.
     */
    static String limitsTable(CudaBackend cuda, CudaBackend.Limits limits, List<Benchmark.Row> rows,
                              Benchmark.Settings s, boolean median) {
        StringBuilder sb = new StringBuilder();
        dev.kvant.model.ModelConfig c = cuda.model().config();
        long kvPerToken = Session.kvBytesPerToken(c, s.kv());
        sb.append(String.format(Locale.ROOT, "%ndevice %s: copy %.0f GB/s (read + written), bf16 GEMM %.0f TFLOP/s; "
                        + "weights %.3f GB read per token, KV %s %d bytes per cached token%n%n", cuda.deviceName(),
                limits.copyGBps(), limits.bf16Tflops(), cuda.weightBytesPerToken() / 1e9, s.kv().name(),
                kvPerToken));
        if (cuda.model().selection() != null || cuda.model().attentionOptions().sparseV() > 0) {
            return sb.append("(no limits: a page selection or sparse V reads less than the whole cache)\n").toString();
        }
        sb.append("| kv | test | depth | t/s | limit t/s | of limit |\n| --- | --- | ---: | ---: | ---: | ---: |\n");
        int launches = (s.sequences() + cuda.maxBatch() - 1) / cuda.maxBatch();
        long head = (long) c.vocabSize() * c.dim();
        for (Benchmark.Row r : rows) {
            double limit;
            if (r.test().startsWith("tg")) {
                // step i of a tg g test reads depth + i + 1 rows of each sequence: on average depth + (g + 1) / 2
                int g = Integer.parseInt(r.test().substring(2).replaceAll("\\D.*", ""));
                double bytes = (double) launches * cuda.weightBytesPerToken()
                        + (double) s.sequences() * kvPerToken * (r.depth() + (g + 1) / 2.0);
                limit = s.sequences() * limits.copyGBps() * 1e9 / bytes;
            } else {
                int n = Integer.parseInt(r.test().substring(2).replaceAll("\\D.*", ""));
                int chunks = (n + s.prefillChunk() - 1) / s.prefillChunk();
                double weights = 2.0 * (cuda.weightElementsPerToken() - head + (double) head * chunks / n);
                // QK^T and PV, 2 flops a multiply-add, over the depth and on average half the prompt
                double attention = 2.0 * c.layers() * c.heads() * (c.headDimK() + c.headDimV())
                        * (r.depth() + (n + 1) / 2.0);
                limit = limits.bf16Tflops() * 1e12 / (weights + attention);
            }
            double tps = median ? r.quantile(0.5) : r.tpsMean();   // the figure the main table shows
            sb.append(String.format(Locale.ROOT, "| %s | %s | %d | %.1f | %.1f | %.0f%% |%n", r.kv(), r.test(),
                    r.depth(), tps, limit, 100 * tps / limit));
        }
        return sb.toString();
    }

    @Spec
    CommandSpec spec;

    /** The model, the run's caches checked against --kv-mem before a backend is opened for it. */
    private LlamaModel budgeted(LlamaModel model, long context, String what) {
        opts.checkBudget(model, opts.kvFormats(), context, sequences, what);
        return model;
    }

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if (reps < 1) {
            throw new UsageException("-r must be at least 1");
        }
        if (sequences < 1 || sequences > 256) {
            throw new UsageException("-np must be between 1 and 256, got " + sequences);
        }
        for (int[] list : new int[][] {prompt, gen, depth}) {
            for (int v : list) {
                if (v < 0) {
                    throw new UsageException("sizes and depths must not be negative");
                }
            }
        }
        if (Arrays.stream(prompt).allMatch(p -> p == 0) && Arrays.stream(gen).allMatch(n -> n == 0)) {
            throw new UsageException("nothing to run: every -p and -n is 0");
        }
        // a context of the deepest -d and the longest -p or -n, for each of -np sequences, must fit an int
        long longest = Math.max(Arrays.stream(prompt).max().orElse(0), Arrays.stream(gen).max().orElse(0));
        long context = Arrays.stream(depth).max().orElse(0) + longest;
        if (context * sequences > Integer.MAX_VALUE / 2) {
            throw new UsageException("-d " + Arrays.stream(depth).max().orElse(0) + " plus -p/-n " + longest
                    + " for -np " + sequences + " sequences is " + context * sequences + " tokens of cache: too many");
        }
        ModelOptions.checkModelChoice(spec, opts.model, synthetic);
        boolean randomDepth = switch (depthFill.toLowerCase(java.util.Locale.ROOT)) {
            case "prefill" -> false;
            case "random" -> true;
            default -> throw new UsageException("--depth-fill: prefill or random, not '" + depthFill + "'");
        };
        if (randomDepth && !json) {
            System.err.println("--depth-fill random: the cache depth holds random K/V rows, not a prefill's");
        }
        Progress progress = new Progress(json);
        if (opts.model == null && synthetic == null) {
            synthetic = "tiny";
            if (!json) {
                System.err.println("no model given: benchmarking a synthetic '" + synthetic + "' model with random "
                        + weights + " weights (use -m path/to/model.gguf for a real one)");
            }
        }
        if (kvList != null && opts.kvMem != null) {
            throw new UsageException("--kv-mem budgets the --ctk/--ctv cache; --kv benchmarks several caches in one run:"
                    + " give one format at a time by --ctk/--ctv with --kv-mem");
        }
        String deepest = "-d " + Arrays.stream(depth).max().orElse(0) + " plus -p/-n " + longest
                + (sequences > 1 ? " for -np " + sequences + " sequences" : "");
        if (synthetic != null) {   // a model file's load checks them itself
            opts.checkOptions();
        }
        // each --kv format is K's and V's: parsed and checked before the model is read
        List<KvFormat> kvFormats = new ArrayList<>();
        for (String f : kvList != null ? kvList : new String[0]) {
            KvFormat kf = UsageException.parsing(() -> KvFormat.parse(f));
            if (kf instanceof dev.kvant.kv.PageMeanFormat) {
                throw new UsageException("--kv " + kf.name() + ": each --kv format serves K and V, and only keys are"
                        + " centered on their page's mean; give --ctk " + kf.name() + " --ctv "
                        + dev.kvant.kv.PageMeanFormat.rows(kf).name() + " instead");
            }
            kvFormats.add(kf);
        }
        progress.update("loading model");
        try (LlamaModel model = synthetic != null ? opts.fitted(ModelOptions.synthetic(synthetic, weights))
                : opts.load();
             Parallel pool = new Parallel(opts.threads);
             var dump = selectOpts.apply(model, opts.model);
             Backend backend = opts.openBackend(budgeted(model, context, deepest), pool,
                     Math.min(sequences, ModelOptions.MAX_DEVICE_BATCH))) {
            if (synthetic == null) {   // (a synthetic model's random weights attend nowhere in particular)
                ModelOptions.warnPastTraining(model, context, "the deepest test's context");
            }
            if (selectOpts.config() != null && !backend.name().equals("cpu")) {
                if (selectOpts.dump != null) {
                    throw new UsageException("--dump-selection records the CPU backend's selections only"
                            + " (use --backend cpu)");
                }
            }
            // each --kv format (or --ctk/--ctv), with the layers --ctk-layer/--ctv-layer give formats of their own
            List<KvLayerFormats> pairs = new ArrayList<>();
            if (kvList != null) {
                for (KvFormat kf : kvFormats) {
                    pairs.add(opts.withLayers(KvLayerFormats.of(kf, kf)));
                }
            } else {
                pairs.add(opts.kvFormats());
            }
            CudaBackend.Limits limits = null;
            if (backend instanceof CudaBackend cuda) {
                progress.update("measuring the device's copy bandwidth and bf16 GEMM rate");
                try {
                    limits = cuda.measureLimits();
                } catch (CudaException e) {   // its 2 + 0.5 GiB of buffers past what the run planned
                    System.err.println("kvant bench: the device's copy bandwidth and GEMM rate were not measured ("
                            + e.getMessage() + "); the rows come without their fraction of those limits");
                }
            }
            List<Benchmark.Row> rows = new ArrayList<>();
            StringBuilder ratios = new StringBuilder();
            for (KvLayerFormats pair : pairs) {
                Benchmark.Settings s = new Benchmark.Settings(prompt, gen, depth, reps, opts.threads, pair,
                        opts.prefillChunk(backend), randomDepth, sequences);
                List<Benchmark.Row> some = Benchmark.run(backend, s, progress::update);
                rows.addAll(some);
                if (limits != null) {
                    ratios.append(limitsTable((CudaBackend) backend, limits, some, s, median));
                }
            }
            progress.done();
            if (!json && selectOpts.config() != null) {
                System.out.println("attention through a block selection: " + selectOpts.describe() + "\n");
            }
            System.out.println(json ? Benchmark.json(rows, median) : Benchmark.markdown(rows, median));
            if (limits != null) {
                // with --json the limits go to stderr: stdout stays one JSON array
                (json ? System.err : System.out).println(ratios);
            }
            if (dump != null) {
                dump.commit();
            }
        }
    }
}
