package dev.kvant.server;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.kvant.backend.Backend;
import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.engine.EngineStats;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.tokenizer.ChatMessage;

import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Measurements of the server as its clients see it, each on a fresh in-process server on a free loopback port:
 * aggregate generation throughput at a given {@code --parallel}, time to first token of a conversation's second turn
 * against its first (prefix reuse), and a bounded load test with cancellations that checks every request ends
 * cleanly and no KV page leaks. {@code kvant bench-serve} runs them from the command line; the tests run small ones.
 */
public final class ServeBench {
    /** Sequences the prefix-reuse run's server holds (its pool: this many full contexts). */
    public static final int PREFIX_PARALLEL = 2;


    private ServeBench() {
    }

    /** The model side shared by every run: backend, text codec, KV formats, per-sequence context, prefill chunk. */
    public record Setup(Backend backend, TextCodec codec, KvLayerFormats kv, int contextLength, int prefillChunk,
                        String modelId, int pipeline) {

        /** One K and one V format in every layer. */
        public Setup(Backend backend, TextCodec codec, KvFormat kFormat, KvFormat vFormat, int contextLength,
                     int prefillChunk, String modelId, int pipeline) {
            this(backend, codec, KvLayerFormats.of(kFormat, vFormat), contextLength, prefillChunk, modelId, pipeline);
        }

        /** With the backend's pipeline depth ({@link EngineConfig#pipeline}). */
        public Setup(Backend backend, TextCodec codec, KvFormat kFormat, KvFormat vFormat, int contextLength,
                     int prefillChunk, String modelId) {
            this(backend, codec, kFormat, vFormat, contextLength, prefillChunk, modelId, 0);
        }
    }

    /** A started server over its own engine and KV pool (sized for parallel full contexts). */
    public static final class Instance implements AutoCloseable {
        public final SequencePool pool;
        public final Engine engine;
        public final KvantServer server;
        public final SseClient client;

        public Instance(Setup s, int parallel, int maxQueue, boolean prefixCache) {
            int pageTokens = dev.kvant.backend.CpuBackend.PAGE_TOKENS;
            int perSequence = (s.contextLength() + pageTokens - 1) / pageTokens * pageTokens;
            this.pool = s.backend().newSequencePool(parallel * perSequence, s.kv());
            this.engine = new Engine(s.backend(), pool,
                    new EngineConfig(parallel, s.contextLength(), s.prefillChunk(), maxQueue, prefixCache,
                            s.pipeline()));
            this.server = KvantServer.start(ServerConfig.local(0, s.modelId()), engine, s.codec());
            this.client = new SseClient(uri(), null);
        }

        public URI uri() {
            return URI.create("http://127.0.0.1:" + server.port() + "/");
        }

        @Override
        public void close() {
            server.shutdown(Duration.ofSeconds(5));
            engine.close();
            pool.close();
        }
    }

    /** Median, 99th percentile and mean of a sample (nearest rank), in seconds. */
    public record Percentiles(int n, double p50, double p99, double mean) {
        public static Percentiles of(double[] v) {
            double[] s = Arrays.stream(v).filter(x -> !Double.isNaN(x)).sorted().toArray();
            if (s.length == 0) {
                return new Percentiles(0, Double.NaN, Double.NaN, Double.NaN);
            }
            return new Percentiles(s.length, rank(s, 0.50), rank(s, 0.99), Arrays.stream(s).average().orElse(0));
        }

        private static double rank(double[] sorted, double q) {
            return sorted[Math.max(0, (int) Math.ceil(q * sorted.length) - 1)];
        }

        public String millis() {
            return String.format(Locale.ROOT, "p50 %.1f ms, p99 %.1f ms (n %d)", p50 * 1e3, p99 * 1e3, n);
        }
    }

    /** Aggregate generated tokens per second over a batch of identical-shape requests. */
    public record Throughput(int parallel, int requests, long tokens, double seconds, double meanBatch) {
        public double tokensPerSecond() {
            return tokens / seconds;
        }
    }

    /**
     * requests streamed text completions from clients concurrent clients, each a random prompt of promptTokens ids
     * and exactly genTokens generated (end of generation ignored), greedy (temperature 0) or sampled as sampling
     * says, with a seed a request.
     */
    public static Throughput batching(Setup s, int parallel, int clients, int requests, int promptTokens,
                                      int genTokens, Sampling sampling, long seed) {
        try (Instance in = new Instance(s, parallel, clients + requests, false)) {
            SplittableRandom r = new SplittableRandom(seed);
            int vocab = s.backend().model().config().vocabSize();
            // Warm-up: the JIT compiles the step before the clock starts.
            SplittableRandom draws = new SplittableRandom(~seed);   // the requests' seeds (the prompts as before)
            check(in.client.stream("v1/completions", sampling.apply(textRequest(randomIds(r, promptTokens,
                    vocab), genTokens, true), draws.nextLong()), -1, Duration.ofMinutes(5)));
            EngineStats before = in.engine.stats();
            int[][] prompts = new int[requests][];
            long[] seeds = new long[requests];
            for (int i = 0; i < requests; i++) {
                prompts[i] = randomIds(r, promptTokens, vocab);
                seeds[i] = draws.nextLong();
            }
            AtomicInteger next = new AtomicInteger();
            AtomicLong tokens = new AtomicLong();
            List<String> failures = Collections.synchronizedList(new ArrayList<>());
            long t0 = System.nanoTime();
            runClients(clients, Duration.ofMinutes(30), () -> {
                for (int i = next.getAndIncrement(); i < requests; i = next.getAndIncrement()) {
                    SseClient.Trace t = in.client.stream("v1/completions",
                            sampling.apply(textRequest(prompts[i], genTokens, true), seeds[i]), -1,
                            Duration.ofMinutes(10));
                    if (t.status() != 200 || !t.done() || t.completionTokens() != genTokens) {
                        failures.add("request " + i + ": " + t);
                    }
                    tokens.addAndGet(Math.max(0, t.completionTokens()));
                }
            });
            double seconds = (System.nanoTime() - t0) / 1e9;
            if (!failures.isEmpty()) {
                throw new IllegalStateException(failures.size() + " requests failed, first: " + failures.get(0));
            }
            EngineStats after = in.engine.stats();
            double meanBatch = (double) (after.decodeRows() - before.decodeRows())
                    / Math.max(1, after.decodeSteps() - before.decodeSteps());
            return new Throughput(parallel, requests, tokens.get(), seconds, meanBatch);
        }
    }

    /** Time to first token of a conversation's first turn (computed whole) and second turn (prefix reused). */
    public record PrefixReuse(int firstPromptTokens, int firstCachedTokens, double firstSeconds, int secondPromptTokens,
                              int secondCachedTokens, double secondSeconds) {
        public double speedup() {
            return firstSeconds / secondSeconds;
        }
    }

    /**
     * A chat whose first user message is about conversationTokens tokens of corpus text; the second turn repeats it
     * with the assistant's answer and asks a short question.
     */
    public static PrefixReuse prefixReuse(Setup s, String corpus, int conversationTokens) {
        try (Instance in = new Instance(s, PREFIX_PARALLEL, 4, true)) {
            // Warm-up on other text, so that the first turn is not paying for the JIT.
            String warm = fit(s.codec(), new StringBuilder(corpus).reverse().toString(), Math.min(1024,
                    conversationTokens / 4));
            check(in.client.stream("v1/chat/completions", chatRequest(List.of(ChatMessage.user(warm)), 4),
                    -1, Duration.ofMinutes(10)));
            String text = fit(s.codec(), corpus, conversationTokens);
            List<ChatMessage> turn1 = List.of(ChatMessage.system("You answer questions about the text."),
                    ChatMessage.user(text));
            SseClient.Trace first = check(in.client.stream("v1/chat/completions", chatRequest(turn1, 16), -1,
                    Duration.ofMinutes(30)));
            String reply = replyOf(in, turn1);
            List<ChatMessage> turn2 = new ArrayList<>(turn1);
            turn2.add(ChatMessage.assistant(reply));
            turn2.add(ChatMessage.user("Which function above is the longest?"));
            SseClient.Trace second = check(in.client.stream("v1/chat/completions", chatRequest(turn2, 16), -1,
                    Duration.ofMinutes(30)));
            return new PrefixReuse(first.usage().path("prompt_tokens").asInt(), first.cachedTokens(),
                    first.ttftSeconds(), second.usage().path("prompt_tokens").asInt(), second.cachedTokens(),
                    second.ttftSeconds());
        }
    }

    /** The first turn's answer, as the client would have kept it (the greedy request repeated, served from cache). */
    private static String replyOf(Instance in, List<ChatMessage> turn) {
        java.net.http.HttpClient http = java.net.http.HttpClient.newBuilder()
                .version(java.net.http.HttpClient.Version.HTTP_1_1).build();
        ObjectNode body = chatRequest(turn, 16);
        body.put("stream", false);
        try {
            var res = http.send(java.net.http.HttpRequest.newBuilder(in.uri().resolve("v1/chat/completions"))
                            .header("Content-Type", "application/json")
                            .POST(java.net.http.HttpRequest.BodyPublishers.ofString(Json.write(body))).build(),
                    java.net.http.HttpResponse.BodyHandlers.ofString());
            return Json.MAPPER.readTree(res.body()).path("choices").path(0).path("message").path("content").asText();
        } catch (java.io.IOException e) {
            throw new IllegalStateException("asking for the first turn's answer failed", e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted", e);
        }
    }

    /**
     * A bounded load: requests requests from clients concurrent streaming clients, prompt lengths spread evenly in
     * log scale between minPrompt and maxPrompt tokens (a quarter of them after a shared 256-token prefix), up to
     * maxTokens generated, a cancelFraction of them walked away from after 0 to 4 text events.
     */
    public record LoadPlan(int clients, int requests, int minPrompt, int maxPrompt, int maxTokens,
                           double cancelFraction, long seed, Duration limit) {
    }

    /**
     * What the load test saw. Every request is completed (200, [DONE], a finish reason), cancelled by the client,
     * rejected cleanly (503 with an error body), or a failure (listed).
     */
    public record LoadReport(int completed, int cancelled, int rejected, List<String> failures, Percentiles ttft,
                             Percentiles itl, int totalPages, int freePagesBefore, int freePagesAfter,
                             long generatedTokens, long cachedTokens, double seconds, boolean drained) {
        public boolean clean() {
            return failures.isEmpty() && drained && freePagesAfter == freePagesBefore;
        }
    }

    public static LoadReport load(Setup s, int parallel, LoadPlan plan) {
        try (Instance in = new Instance(s, parallel, plan.clients(), true)) {
            return load(in, s, plan);
        }
    }

    /** The load test on a running instance (whose engine is idle at the start), after a warm-up of four requests. */
    public static LoadReport load(Instance in, Setup s, LoadPlan plan) {
        SplittableRandom r = new SplittableRandom(plan.seed());
        int vocab = s.backend().model().config().vocabSize();
        int maxPrompt = Math.min(plan.maxPrompt(), s.contextLength() - plan.maxTokens() - 1);
        int[] shared = randomIds(r, Math.min(256, Math.max(1, maxPrompt / 2)), vocab);
        int n = plan.requests();
        ObjectNode[] bodies = new ObjectNode[n];
        int[] cancelAfter = new int[n];
        for (int i = 0; i < n; i++) {
            double u = r.nextDouble();
            int len = (int) Math.round(plan.minPrompt() * Math.pow((double) maxPrompt / plan.minPrompt(), u));
            int[] prompt = randomIds(r, Math.max(1, len), vocab);
            if (i % 4 == 0 && prompt.length > shared.length) {
                System.arraycopy(shared, 0, prompt, 0, shared.length);
            }
            ObjectNode body = textRequest(prompt, 1 + r.nextInt(plan.maxTokens()), r.nextBoolean());
            if (r.nextBoolean()) {
                body.put("temperature", 0.8).put("seed", r.nextLong());
            }
            bodies[i] = body;
            cancelAfter[i] = r.nextDouble() < plan.cancelFraction() ? r.nextInt(5) : -1;
        }
        // Warm-up before the clock and the counters (the batching and prefix modes have theirs): a cold JVM's first
        // requests put seconds of compilation into the latency tails. Prompts from the shortest length to the
        // longest, from a stream of their own (the plan's draws stay the same); the cache they leave is dropped.
        SplittableRandom w = new SplittableRandom(plan.seed() + 1);
        for (int k = 0; k < 4; k++) {
            int len = (int) Math.round(plan.minPrompt() * Math.pow((double) maxPrompt / plan.minPrompt(), k / 3.0));
            check(in.client.stream("v1/completions", textRequest(randomIds(w, Math.max(1, len), vocab),
                    plan.maxTokens(), true), -1, Duration.ofMinutes(5)));
        }
        waitIdle(in.engine, Duration.ofSeconds(30));
        in.engine.clearPrefixCache();
        EngineStats start = in.engine.stats();
        AtomicInteger next = new AtomicInteger();
        AtomicInteger completed = new AtomicInteger();
        AtomicInteger cancelled = new AtomicInteger();
        AtomicInteger rejected = new AtomicInteger();
        List<String> failures = Collections.synchronizedList(new ArrayList<>());
        List<Double> ttfts = Collections.synchronizedList(new ArrayList<>());
        List<Double> gaps = Collections.synchronizedList(new ArrayList<>());
        long t0 = System.nanoTime();
        boolean inTime = runClients(plan.clients(), plan.limit(), () -> {
            for (int i = next.getAndIncrement(); i < n; i = next.getAndIncrement()) {
                int max = bodies[i].path("max_tokens").asInt();
                SseClient.Trace t = in.client.stream("v1/completions", bodies[i], cancelAfter[i],
                        Duration.ofMinutes(5));
                if (t.cancelled()) {
                    cancelled.incrementAndGet();
                } else if (t.status() == 503 && t.error() != null) {
                    rejected.incrementAndGet();
                } else if (t.status() == 200 && t.done() && t.error() == null && t.finishReason() != null
                        && t.chunks() <= max && (t.completionTokens() < 0 || t.completionTokens() <= max)) {
                    completed.incrementAndGet();
                } else {
                    failures.add("request " + i + ": " + t);
                    continue;
                }
                if (!Double.isNaN(t.ttftSeconds())) {
                    ttfts.add(t.ttftSeconds());
                }
                for (double g : t.gapsSeconds()) {
                    gaps.add(g);
                }
            }
        });
        double seconds = (System.nanoTime() - t0) / 1e9;
        if (!inTime) {
            failures.add("the load did not finish within " + plan.limit());
        }
        // Cancelled requests are freed at the engine's next step: wait for it to go idle, then drop the cache.
        boolean drained = waitIdle(in.engine, Duration.ofSeconds(30));
        in.engine.clearPrefixCache();
        EngineStats end = in.engine.stats();
        return new LoadReport(completed.get(), cancelled.get(), rejected.get(), List.copyOf(failures),
                Percentiles.of(ttfts.stream().mapToDouble(Double::doubleValue).toArray()),
                Percentiles.of(gaps.stream().mapToDouble(Double::doubleValue).toArray()), end.totalPages(),
                start.freePages(), end.freePages(), end.generatedTokens() - start.generatedTokens(),
                end.cachedTokens() - start.cachedTokens(), seconds, drained);
    }

    private static boolean waitIdle(Engine engine, Duration limit) {
        long deadline = System.nanoTime() + limit.toNanos();
        while (System.nanoTime() < deadline) {
            EngineStats s = engine.stats();
            if (s.running() == 0 && s.waiting() == 0) {
                return true;
            }
            try {
                Thread.sleep(20);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
        }
        return false;
    }

    /** Runs body on n threads and waits at most limit; false when they were still running then (they are stopped). */
    private static boolean runClients(int n, Duration limit, Runnable body) {
        ExecutorService pool = Executors.newFixedThreadPool(n, Thread.ofVirtual().name("client-", 0).factory());
        for (int i = 0; i < n; i++) {
            pool.execute(body);
        }
        pool.shutdown();
        try {
            if (pool.awaitTermination(limit.toMillis(), TimeUnit.MILLISECONDS)) {
                return true;
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        pool.shutdownNow();
        return false;
    }

    private static SseClient.Trace check(SseClient.Trace t) {
        if (t.status() != 200 || !t.done() || t.error() != null) {
            throw new IllegalStateException("a benchmark request failed: " + t);
        }
        return t;
    }

    static int[] randomIds(SplittableRandom r, int n, int vocab) {
        int[] ids = new int[n];
        for (int i = 0; i < n; i++) {
            ids[i] = r.nextInt(vocab);
        }
        return ids;
    }

    /**
     * How the batching mode's requests choose their tokens: greedy at temperature 0, else sampled with a seed a request
     * and the filters asked for (top-k 0, top-p 1, min-p 0: the server's defaults, off).
     */
    public record Sampling(float temperature, int topK, float topP, float minP, float repeatPenalty) {
        public static final Sampling GREEDY = new Sampling(0f, 0, 1f, 0f, 1f);

        ObjectNode apply(ObjectNode request, long seed) {
            if (temperature > 0) {
                request.put("temperature", temperature).put("seed", seed).put("top_k", topK).put("top_p", topP)
                        .put("min_p", minP);
            }
            if (repeatPenalty != 1f) {
                request.put("repeat_penalty", repeatPenalty);
            }
            return request;
        }

        @Override
        public String toString() {
            String penalty = repeatPenalty != 1f ? ", repeat penalty " + repeatPenalty : "";
            return (temperature > 0 ? String.format(java.util.Locale.ROOT, "sampled at temperature %s, top-k %d, top-p"
                    + " %s, min-p %s", temperature, topK, topP, minP) : "greedy") + penalty;
        }
    }

    static ObjectNode textRequest(int[] prompt, int maxTokens, boolean ignoreEos) {
        ObjectNode b = Json.MAPPER.createObjectNode();
        b.put("model", "kvant");
        ArrayNode p = b.putArray("prompt");
        for (int t : prompt) {
            p.add(t);
        }
        b.put("max_tokens", maxTokens);
        b.put("temperature", 0);
        b.put("stream", true);
        b.putObject("stream_options").put("include_usage", true);
        b.put("ignore_eos", ignoreEos);
        return b;
    }

    static ObjectNode chatRequest(List<ChatMessage> messages, int maxTokens) {
        ObjectNode b = Json.MAPPER.createObjectNode();
        b.put("model", "kvant");
        ArrayNode m = b.putArray("messages");
        for (ChatMessage c : messages) {
            m.addObject().put("role", c.role()).put("content", c.content());
        }
        b.put("max_tokens", maxTokens);
        b.put("temperature", 0);
        b.put("ignore_eos", true);
        b.put("stream", true);
        b.putObject("stream_options").put("include_usage", true);
        return b;
    }

    /** A prefix of text (repeated as needed) that the codec turns into about tokens tokens as one user message. */
    static String fit(TextCodec codec, String text, int tokens) {
        StringBuilder sb = new StringBuilder(text);
        while (sb.length() < tokens * 8) {
            sb.append('\n').append(text);
        }
        String all = sb.toString();
        int chars = Math.min(all.length(), tokens * 3);
        for (int i = 0; i < 6; i++) {
            int got = codec.chat(List.of(ChatMessage.user(all.substring(0, chars))), Integer.MAX_VALUE).length;
            if (Math.abs(got - tokens) <= tokens / 100 + 1) {
                break;
            }
            chars = (int) Math.min(all.length(), Math.max(1, (long) chars * tokens / Math.max(1, got)));
        }
        return all.substring(0, chars);
    }
}
