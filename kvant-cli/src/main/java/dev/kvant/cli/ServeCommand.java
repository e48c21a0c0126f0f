package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.engine.Session;
import dev.kvant.model.LlamaModel;
import dev.kvant.server.KvantServer;
import dev.kvant.server.ServerConfig;
import dev.kvant.server.TextCodec;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * {@code kvant serve}: the OpenAI-compatible HTTP server (docs/SERVER.md). Runs until SIGINT or SIGTERM, then stops
 * taking requests, lets those in flight finish within --shutdown-grace, and exits 0.
 */
@Command(name = "serve", mixinStandardHelpOptions = true,
        description = {"Serve the model over an OpenAI-compatible HTTP API (chat/completions, completions, models,"
                + " health, metrics) with continuous batching and prefix reuse.",
                "Stops on Ctrl-C or SIGTERM: in-flight requests get --shutdown-grace seconds to finish."})
final class ServeCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Mixin
    SelectOptions selectOpts;

    @Option(names = "--synthetic", paramLabel = "SHAPE",
            description = "serve a synthetic model instead of -m (llama3-8b, llama3.2-1b, qwen2.5-7b, tiny): random"
                    + " weights, no tokenizer (text is taken byte by byte), for benchmarks")
    String synthetic;

    @Option(names = "--weights", paramLabel = "TYPE", defaultValue = "q8_0",
            description = "weight format of a synthetic model (default ${DEFAULT-VALUE})")
    String weights;

    @Option(names = {"-c", "--ctx-size"}, paramLabel = "N",
            description = "context of one sequence, prompt and answer (default 4096, or what --kv-mem holds)")
    Integer ctx;

    @Option(names = "--host", paramLabel = "ADDR", defaultValue = "127.0.0.1",
            description = "address to listen on (default ${DEFAULT-VALUE}: this machine only)")
    String host;

    @Option(names = "--port", paramLabel = "N", defaultValue = "8080", description = "port (default ${DEFAULT-VALUE})")
    int port;

    @Option(names = {"-np", "--parallel"}, paramLabel = "N", defaultValue = "4",
            description = "sequences decoded together in one step (default ${DEFAULT-VALUE})")
    int parallel;

    @Option(names = "--max-queue", paramLabel = "N", defaultValue = "64",
            description = "requests that may wait for a slot; more get 503 with Retry-After (default ${DEFAULT-VALUE})")
    int maxQueue;

    @Option(names = "--api-key", paramLabel = "KEY",
            description = "require 'Authorization: Bearer KEY' on every request but /health (default: $KVANT_API_KEY,"
                    + " else none)")
    String apiKey = System.getenv("KVANT_API_KEY");

    @Option(names = "--alias", paramLabel = "NAME", description = "model name in responses (default: the file name)")
    String alias;

    @Option(names = "--chat-template", paramLabel = "NAME",
            description = "override the template detected from the model: llama3, llama3.1, llama3.2, llama2,"
                    + " chatml, qwen2, qwen2.5, qwen3, qwen3-thinking, mistral, mistral-v1, mistral-v3,"
                    + " mistral-v3-tekken, mistral-v7, mistral-v7-tekken, gemma, raw")
    String template;

    @Option(names = "--no-prefix-cache", description = "do not keep finished sequences for prefix reuse")
    boolean noPrefixCache;

    @Option(names = "--prefix-cache-approximate",
            description = "reuse any cached prefix, also where only whole prompt chunks give the bits of the prompt"
                    + " computed afresh (the GPU backend, keys centered on page means, --select): a conversation's"
                    + " reply is reused too, outputs depend on what the cache held")
    boolean approximatePrefixes;

    @Option(names = "--pipeline", paramLabel = "N", defaultValue = "0",
            description = "decode steps of different sequences in flight at once: 0 = one per GPU of a layer split"
                    + " (default), 1 = one step at a time, N = at most N")
    int pipeline;

    @Option(names = "--shutdown-grace", paramLabel = "SECONDS", defaultValue = "30",
            description = "how long in-flight requests may take to finish on shutdown (default ${DEFAULT-VALUE})")
    int grace;

    @Option(names = "--write-timeout", paramLabel = "SECONDS", defaultValue = "60",
            description = "how long one write to a client may take before its response is cut and its generation"
                    + " cancelled: a client that stops reading (default ${DEFAULT-VALUE})")
    int writeTimeout;

    /** Tokens of a pool of whole pages for {@code parallel} sequences of {@code context} tokens. */
    private static long poolTokens(int parallel, int context) {
        int pageTokens = Session.PAGE_TOKENS;
        return (long) parallel * (((long) context + pageTokens - 1) / pageTokens * pageTokens);
    }

    @Spec
    CommandSpec spec;

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        ModelOptions.checkServing(parallel, ctx, pipeline);
        long wanted = poolTokens(parallel, ctx != null ? ctx : 4096);
        if (opts.kvMem == null && wanted > Integer.MAX_VALUE) {
            throw new UsageException("--parallel " + parallel + " x -c " + ctx + " is " + wanted
                    + " tokens of KV cache, more than one pool holds (" + Integer.MAX_VALUE + "); use fewer or"
                    + " shorter sequences, or --kv-mem");
        }
        if (writeTimeout < 1) {
            throw new UsageException("--write-timeout must be at least 1 second, got " + writeTimeout);
        }
        if (grace < 0) {
            throw new UsageException("--shutdown-grace must not be negative, got " + grace);
        }
        if (maxQueue < 0) {
            throw new UsageException("--max-queue must not be negative, got " + maxQueue);
        }
        if (noPrefixCache && approximatePrefixes) {
            throw new UsageException("--prefix-cache-approximate and --no-prefix-cache do not go together");
        }
        ModelOptions.checkModelChoice(spec, opts.model, synthetic);
        if (opts.model == null && synthetic == null) {
            throw new UsageException("no model given: pass -m path/to/model.gguf (or --synthetic SHAPE)");
        }
        if (selectOpts.dump != null) {
            throw new UsageException("--dump-selection records the selections of one run (perplexity,"
                    + " needle, bench on the CPU), not of a server");
        }
        if (synthetic != null) {   // a model file's load checks them itself
            opts.checkOptions();
        }
        // the server's own checks of its options (port, key, timeouts), as usage errors before the model loads
        UsageException.parsing(() -> serverConfig("check"));
        if (template != null) {
            UsageException.parsing(() -> ChatTemplate.named(template));
        }
        try (LlamaModel model = synthetic != null ? opts.fitted(ModelOptions.synthetic(synthetic, weights))
                : opts.load();
             Parallel threads = new Parallel(opts.threads);
             var dump = selectOpts.apply(model);
             Backend backend = opts.openBackend(model, threads, Math.min(parallel, ModelOptions.MAX_DEVICE_BATCH))) {
            int pageTokens = Session.PAGE_TOKENS;
            int context;
            int poolTokens;
            if (opts.kvMem != null) {
                poolTokens = ModelOptions.budgetTokens(model, opts.kvFormats(), ModelOptions.parseSize(opts.kvMem));
                if (ctx != null && ctx > poolTokens) {   // each sequence's context stays -c: never a smaller one
                    throw new UsageException("--kv-mem " + opts.kvMem + " holds " + poolTokens + " tokens of KV cache"
                            + " in these formats, less than one context of -c " + ctx + ": raise --kv-mem or lower -c");
                }
                context = Math.min(ctx != null ? ctx : Math.min(4096, poolTokens), poolTokens);
            } else {
                context = ctx != null ? ctx : 4096;
                poolTokens = (int) poolTokens(parallel, context);
            }
            if (synthetic == null) {
                ModelOptions.warnPastTraining(model, context, "the context");
            }
            String name = alias != null ? alias : synthetic != null ? "synthetic-" + synthetic
                    : stripGguf(opts.model.getFileName());
            ServerConfig config = serverConfig(name);
            try (SequencePool pool = backend.newSequencePool(poolTokens, opts.kvFormats());
                 Engine engine = new Engine(backend, pool,
                         new EngineConfig(parallel, context, opts.prefillChunk(backend), maxQueue, !noPrefixCache,
                                 pipeline, approximatePrefixes))) {
                KvantServer server = KvantServer.start(config, engine, TextCodec.of(model, template));
                CountDownLatch stop = new CountDownLatch(1);
                CountDownLatch stopped = new CountDownLatch(1);
                AtomicInteger status = new AtomicInteger();
                Thread hook = new Thread(() -> {
                    stop.countDown();
                    try {
                        stopped.await(grace + 10L, TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                    // A signal's exit status would be 128+signal; a drained server exits 0, a failed engine 1.
                    Runtime.getRuntime().halt(status.get());
                }, "kvant-serve-shutdown");
                Runtime.getRuntime().addShutdownHook(hook);
                System.err.printf(Locale.ROOT, "kvant serve: %s on http://%s:%d/v1 (backend %s, %d threads,"
                                + " parallel %d, decode steps in flight %d, context %d, KV pool %d pages of %d tokens,"
                                + " KV %s%s)%n", name, host, server.port(), backend.name(), backend.threads(),
                        parallel, engine.pipelineDepth(), context, pool.totalPages(), pool.pageTokens(),
                        opts.kvFormats().name(), apiKey != null ? ", API key required" : "");
                if (engine.reusesPrefixes() && engine.prefixReuseStep() > 1) {
                    System.err.printf(Locale.ROOT, "kvant serve: prefixes are reused in whole prompt chunks of %d"
                            + " tokens (--prefill-chunk): here only those give the bits of the prompt computed afresh"
                            + " (--prefix-cache-approximate reuses any prefix)%n", engine.prefixReuseStep());
                } else if (engine.reusesPrefixes() && !engine.prefixesKeepBits()) {
                    System.err.println("kvant serve: prefix reuse is approximate: a request's output may differ from"
                            + " the same request computed afresh");
                }
                // until a signal, or until the engine thread dies (an out-of-memory error, say): a server that can
                // serve nothing more exits non-zero for its supervisor to restart it
                while (!stop.await(1, TimeUnit.SECONDS)) {
                    if (engine.failure() != null) {
                        System.err.println("kvant serve: the engine stopped on an internal error: "
                                + engine.failure() + "; exiting");
                        status.set(1);
                        server.shutdown(Duration.ZERO);
                        stopped.countDown();
                        System.exit(1);
                    }
                }
                System.err.println("kvant serve: shutting down (in-flight requests get " + grace + " s)");
                boolean clean = server.shutdown(Duration.ofSeconds(grace));
                System.err.println("kvant serve: stopped" + (clean ? "" : " (requests still running at the deadline"
                        + " were cancelled)"));
                stopped.countDown();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static String stripGguf(Path file) {
        String n = file.toString();
        return n.toLowerCase(Locale.ROOT).endsWith(".gguf") ? n.substring(0, n.length() - 5) : n;
    }

    private ServerConfig serverConfig(String modelName) {
        return new ServerConfig(host, port, apiKey, modelName, 32L << 20, Duration.ofSeconds(1),
                Duration.ofSeconds(writeTimeout));
    }
}
