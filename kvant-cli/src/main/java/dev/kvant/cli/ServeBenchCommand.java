package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.model.LlamaModel;
import dev.kvant.server.ServeBench;
import dev.kvant.server.TextCodec;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

import java.nio.file.Path;
import java.time.Duration;
import java.time.LocalDate;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * {@code kvant bench-serve}: the server measured from its clients' side on a loopback port (docs/SERVER.md):
 * batching throughput at --parallel 1 against N, a conversation's second-turn time to first token against its
 * first, and the load test.
 */
@Command(name = "bench-serve", mixinStandardHelpOptions = true,
        description = {"Benchmark kvant serve in-process over loopback HTTP.",
                "batching: aggregate generated tokens/s at --parallel 1 and N (same requests, same clients);",
                "prefix: time to first token of a conversation's 2nd turn vs its 1st;",
                "load: concurrent streaming clients with random cancellations; checks every request ends cleanly"
                        + " and no KV page leaks; TTFT and inter-token latency percentiles."})
final class ServeBenchCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Mixin
    SelectOptions selectOpts;

    @Option(names = "--synthetic", paramLabel = "SHAPE",
            description = "synthetic model instead of -m: llama3-8b, llama3.2-1b, qwen2.5-7b, tiny")
    String synthetic;

    @Option(names = "--weights", paramLabel = "TYPE", defaultValue = "q8_0",
            description = "weight format of a synthetic model (default ${DEFAULT-VALUE})")
    String weights;

    @Option(names = "--mode", paramLabel = "MODE", defaultValue = "batching",
            description = "batching, prefix or load (default ${DEFAULT-VALUE})")
    String mode;

    @Option(names = {"-c", "--ctx-size"}, paramLabel = "N", defaultValue = "4096",
            description = "context of one sequence (default ${DEFAULT-VALUE})")
    int ctx;

    @Option(names = {"-np", "--parallel"}, paramLabel = "N", defaultValue = "8",
            description = "parallel sequences (batching compares 1 with this; default ${DEFAULT-VALUE})")
    int parallel;

    @Option(names = "--clients", paramLabel = "N", defaultValue = "8",
            description = "concurrent clients (default ${DEFAULT-VALUE}; load: 32 is the issue's figure)")
    int clients;

    @Option(names = "--requests", paramLabel = "N", defaultValue = "32", description = "requests (default ${DEFAULT-VALUE})")
    int requests;

    @Option(names = {"-p", "--prompt-tokens"}, paramLabel = "N", defaultValue = "32",
            description = "batching: prompt tokens; load: longest prompt (default ${DEFAULT-VALUE})")
    int promptTokens;

    @Option(names = {"-n", "--gen-tokens"}, paramLabel = "N", defaultValue = "64",
            description = "batching: tokens per request; load: the most per request (default ${DEFAULT-VALUE})")
    int genTokens;

    @Option(names = "--temp", paramLabel = "T", defaultValue = "0",
            description = "batching: each request sampled at temperature T with a seed of its own (0: greedy; default"
                    + " ${DEFAULT-VALUE})")
    float temperature;

    @Option(names = "--top-k", paramLabel = "K", defaultValue = "0",
            description = "batching, with --temp: each request's top-k (0: off; default ${DEFAULT-VALUE})")
    int topK;

    @Option(names = "--top-p", paramLabel = "P", defaultValue = "1",
            description = "batching, with --temp: each request's top-p (1: off; default ${DEFAULT-VALUE})")
    float topP;

    @Option(names = "--min-p", paramLabel = "P", defaultValue = "0",
            description = "batching, with --temp: each request's min-p (0: off; default ${DEFAULT-VALUE})")
    float minP;

    @Option(names = "--repeat-penalty", paramLabel = "R", defaultValue = "1",
            description = "batching: each request's repeat penalty over its last 64 tokens (1: off; default"
                    + " ${DEFAULT-VALUE})")
    float repeatPenalty;

    @Option(names = "--conversation", paramLabel = "N", defaultValue = "16384",
            description = "prefix: tokens of the first turn (default ${DEFAULT-VALUE})")
    int conversation;

    @Option(names = {"-f", "--file"}, paramLabel = "TEXT", description = "prefix: text to fill the conversation with")
    Path file;

    @Option(names = "--cancel", paramLabel = "FRACTION", defaultValue = "0.15",
            description = "load: share of requests the client walks away from (default ${DEFAULT-VALUE})")
    double cancel;

    @Option(names = "--pipeline", paramLabel = "N", defaultValue = "0",
            description = "decode steps of different sequences in flight at once: 0 = one per GPU of a layer split"
                    + " (default), 1 = one step at a time, N = at most N")
    int pipeline;

    @Option(names = "--seed", paramLabel = "S", description = "random seed (default: random, printed)")
    Long seed;

    @Spec
    CommandSpec spec;

    /**
     * The model, the server's pool checked against --kv-mem before a backend opens: --parallel caches of -c (the
     * prefix mode's server holds two).
     */
    private LlamaModel budgeted(LlamaModel model) {
        int caches = mode.equals("prefix") ? ServeBench.PREFIX_PARALLEL : parallel;
        opts.checkBudget(model, opts.kvFormats(), ctx, caches, (mode.equals("prefix") ? "--mode prefix's "
                + caches : "--parallel " + caches) + " x -c " + ctx);
        return model;
    }

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        ModelOptions.checkModelChoice(spec, opts.model, synthetic);
        if (opts.model == null && synthetic == null) {
            throw new UsageException("no model given: pass -m path/to/model.gguf or --synthetic SHAPE");
        }
        ModelOptions.checkServing(parallel, ctx, pipeline);
        if (!List.of("batching", "prefix", "load").contains(mode)) {
            throw new UsageException("--mode must be batching, prefix or load, got " + mode);
        }
        checkRun();
        long s = seed != null ? seed : new SplittableRandom().nextLong();
        if (selectOpts.dump != null) {
            throw new UsageException("--dump-selection records the selections of one run (perplexity,"
                    + " needle, bench on the CPU), not of a server");
        }
        if (synthetic != null) {   // a model file's load checks them itself
            opts.checkOptions();
        }
        try (LlamaModel model = synthetic != null ? opts.fitted(ModelOptions.synthetic(synthetic, weights))
                : opts.load();
             Parallel threads = new Parallel(opts.threads);
             var dump = selectOpts.apply(model);
             Backend backend = opts.openBackend(budgeted(model), threads,
                     Math.min(parallel, ModelOptions.MAX_DEVICE_BATCH))) {
            String name = synthetic != null ? "synthetic " + synthetic + " " + weights : opts.model.getFileName().toString();
            ServeBench.Setup setup = new ServeBench.Setup(backend, TextCodec.of(model, null), opts.kvFormats(), ctx,
                    opts.prefillChunk(backend), name, pipeline);
            System.out.printf(Locale.ROOT, "# kvant bench-serve --mode %s: %s, backend %s, %d threads, KV %s,"
                            + " context %d, prefill chunk %d, decode steps in flight %d, seed %d, %s, nproc %d%n",
                    mode, name, backend.name(), backend.threads(), opts.kvFormats().name(), ctx,
                    opts.prefillChunk(backend),
                    pipeline > 0 ? Math.min(pipeline, backend.pipelineDepth()) : backend.pipelineDepth(), s, LocalDate.now(),
                    Runtime.getRuntime().availableProcessors());
            switch (mode) {
                case "batching" -> batching(setup, s);
                case "prefix" -> prefix(setup, model);
                case "load" -> load(setup, s);
                default -> throw new UsageException("--mode must be batching, prefix or load, got " + mode);
            }
        }
    }

    /** The run's own options, before a model is read: each mode's requests must be possible in its context. */
    private void checkRun() {
        if ((long) parallel * ctx > Integer.MAX_VALUE) {
            throw new UsageException("--parallel " + parallel + " x -c " + ctx + " is more tokens of KV cache than one"
                    + " pool holds (" + Integer.MAX_VALUE + ")");
        }
        if (clients < 1 || requests < 1) {
            throw new UsageException("--clients and --requests must be at least 1, got " + clients + " and "
                    + requests);
        }
        if (promptTokens < 1 || genTokens < 1) {
            throw new UsageException("-p and -n must be at least 1, got " + promptTokens + " and " + genTokens);
        }
        if (!(temperature >= 0) || Float.isInfinite(temperature)) {
            throw new UsageException("--temp must be a finite number of at least 0, got " + temperature);
        }
        if (topK < 0 || !(topP > 0 && topP <= 1) || !(minP >= 0 && minP <= 1)) {
            throw new UsageException("--top-k must be at least 0, --top-p above 0 and at most 1, --min-p between 0 and"
                    + " 1; got " + topK + ", " + topP + " and " + minP);
        }
        if (!(repeatPenalty > 0 && repeatPenalty <= 10)) {   // the server's range for repeat_penalty
            throw new UsageException("--repeat-penalty must be above 0 and at most 10 (1 is off), got "
                    + repeatPenalty);
        }
        if (!(cancel >= 0 && cancel <= 1)) {
            throw new UsageException("--cancel must be a fraction from 0 to 1, got " + cancel);
        }
        if (mode.equals("batching") && (long) promptTokens + genTokens > ctx) {
            throw new UsageException("-p " + promptTokens + " + -n " + genTokens + " tokens a request do not fit in"
                    + " -c " + ctx);
        }
        if (mode.equals("load") && Math.min(promptTokens, ctx - genTokens - 1) < 8) {
            throw new UsageException("--mode load's prompts run from 8 tokens to -p (" + promptTokens + "), within"
                    + " what -c " + ctx + " leaves after -n " + genTokens + ": raise -p or -c, or lower -n");
        }
    }

    private ServeBench.Sampling sampling() {
        return temperature > 0 || repeatPenalty != 1f
                ? new ServeBench.Sampling(temperature, topK, topP, minP, repeatPenalty) : ServeBench.Sampling.GREEDY;
    }

    private void batching(ServeBench.Setup setup, long s) {
        System.out.printf(Locale.ROOT, "%d requests from %d clients, prompt %d tokens, %d generated each (%s, end of"
                + " generation ignored)%n%n", requests, clients, promptTokens, genTokens, sampling());
        System.out.println("| --parallel | mean batch | tokens | seconds | generated t/s | vs 1 |");
        System.out.println("| ---: | ---: | ---: | ---: | ---: | ---: |");
        double base = 0;
        for (int p : parallel == 1 ? new int[] {1} : new int[] {1, parallel}) {
            ServeBench.Throughput t = ServeBench.batching(setup, p, clients, requests, promptTokens, genTokens,
                    sampling(), s);
            if (p == 1) {
                base = t.tokensPerSecond();
            }
            System.out.printf(Locale.ROOT, "| %d | %.2f | %d | %.2f | %.1f | %.2fx |%n", p, t.meanBatch(), t.tokens(),
                    t.seconds(), t.tokensPerSecond(), t.tokensPerSecond() / base);
        }
    }

    private void prefix(ServeBench.Setup setup, LlamaModel model) {
        String corpus;
        if (file != null) {
            corpus = TextFiles.read(file);
        } else {
            StringBuilder sb = new StringBuilder();
            SplittableRandom r = new SplittableRandom(7);
            while (sb.length() < 200_000) {
                sb.append("def f").append(r.nextInt(1000)).append("(x):\n    return x * ").append(r.nextInt(100))
                        .append('\n');
            }
            corpus = sb.toString();
        }
        if (conversation + 64 >= setup.contextLength()) {
            throw new UsageException("--conversation " + conversation + " needs a context above it: raise -c");
        }
        ServeBench.PrefixReuse p = ServeBench.prefixReuse(setup, corpus, conversation);
        System.out.println("| turn | prompt tokens | cached | time to first token |");
        System.out.println("| --- | ---: | ---: | ---: |");
        // the first turn's cache hit too (a template's fixed system header can be one), not a constant 0
        System.out.printf(Locale.ROOT, "| 1 | %d | %d | %.3f s |%n", p.firstPromptTokens(), p.firstCachedTokens(),
                p.firstSeconds());
        System.out.printf(Locale.ROOT, "| 2 | %d | %d | %.3f s |%n", p.secondPromptTokens(), p.secondCachedTokens(),
                p.secondSeconds());
        System.out.printf(Locale.ROOT, "%nsecond turn reaches its first token %.1fx sooner%n", p.speedup());
    }

    private void load(ServeBench.Setup setup, long s) {
        ServeBench.LoadPlan plan = new ServeBench.LoadPlan(clients, requests, 8, promptTokens, genTokens, cancel, s,
                Duration.ofMinutes(30));
        // the prompts the run uses: at most what the context leaves after the tokens generated
        int longest = Math.min(promptTokens, setup.contextLength() - genTokens - 1);
        System.out.printf(Locale.ROOT, "%d streaming clients, %d requests, prompts 8..%d tokens, up to %d generated,"
                + " %.0f%% cancelled by the client, --parallel %d%n%n", clients, requests, longest, genTokens,
                cancel * 100, parallel);
        ServeBench.LoadReport r = ServeBench.load(setup, parallel, plan);
        System.out.printf(Locale.ROOT, "completed %d, cancelled by client %d, rejected (503) %d, failed %d in %.1f s;"
                        + " %d tokens generated, %d prompt tokens from the prefix cache%n", r.completed(),
                r.cancelled(), r.rejected(), r.failures().size(), r.seconds(), r.generatedTokens(), r.cachedTokens());
        System.out.println("time to first token: " + r.ttft().millis());
        System.out.println("inter-token latency: " + r.itl().millis());
        System.out.printf(Locale.ROOT, "KV pages free: %d of %d before, %d after (prefix cache dropped)%s%n",
                r.freePagesBefore(), r.totalPages(), r.freePagesAfter(), r.clean() ? "" : "  <-- NOT CLEAN");
        r.failures().stream().limit(10).forEach(f -> System.out.println("  failure: " + f));
        if (!r.clean()) {
            throw new IllegalStateException("the load test did not end cleanly");
        }
    }
}
