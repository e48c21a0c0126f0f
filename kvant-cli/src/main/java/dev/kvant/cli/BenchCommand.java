package dev.kvant.cli;

import dev.kvant.engine.Benchmark;
import dev.kvant.model.LlamaModel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.util.List;

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
            description = "weight format of a synthetic model: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k")
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

    @Option(names = {"-r", "--repetitions"}, paramLabel = "N", defaultValue = "5",
            description = "timed repetitions per test (default ${DEFAULT-VALUE})")
    int reps;

    @Option(names = "--json", description = "print a JSON array, one object per row")
    boolean json;

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if (reps < 1) {
            throw new IllegalArgumentException("-r must be at least 1");
        }
        for (int[] list : new int[][] {prompt, gen, depth}) {
            for (int v : list) {
                if (v < 0) {
                    throw new IllegalArgumentException("sizes and depths must not be negative");
                }
            }
        }
        if (opts.model != null && synthetic != null) {
            throw new IllegalArgumentException("give either -m or --synthetic, not both");
        }
        Progress progress = new Progress(json);
        if (opts.model == null && synthetic == null) {
            synthetic = "tiny";
            if (!json) {
                System.err.println("no model given: benchmarking a synthetic '" + synthetic + "' model with random "
                        + weights + " weights (use -m path/to/model.gguf for a real one)");
            }
        }
        progress.update("loading model");
        try (LlamaModel model = synthetic != null ? ModelOptions.synthetic(synthetic, weights) : opts.load()) {
            Benchmark.Settings s = new Benchmark.Settings(prompt, gen, depth, reps, opts.threads, opts.kFormat(),
                    opts.vFormat(), opts.prefillChunk);
            List<Benchmark.Row> rows = Benchmark.run(model, s, progress::update);
            progress.done();
            System.out.println(json ? Benchmark.json(rows) : Benchmark.markdown(rows));
        }
    }
}
