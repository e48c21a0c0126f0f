package dev.kvant.server;

import com.fasterxml.jackson.databind.JsonNode;
import com.openai.client.OpenAIClient;
import com.openai.client.okhttp.OpenAIOkHttpClient;
import com.openai.errors.InternalServerException;
import com.openai.errors.OpenAIInvalidDataException;
import com.openai.models.completions.Completion;
import com.openai.models.completions.CompletionCreateParams;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.kv.KvFormat;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A response's first heartbeat (a blank before a JSON body, an SSE comment in a stream) commits its status, 200, after
 * which a failure can only be told in the body. So the first heartbeat waits until the request holds a sequence and a
 * period has passed since: a request that fails while it waits in the queue, as it is admitted or on its first prompt
 * chunk gets the status of its failure however many periods it waited (it used to get 200 and an error body once a
 * period had passed in the queue, and a chat stream 200 at once, with its role chunk). A failure after the first
 * heartbeat ends the body with the OpenAI error object, which JSON lets follow the blanks.
 */
class HeartbeatStatusTest {
    private static final int CTX = 256;
    /** Long enough that a prompt chunk that fails at once does so within it on a busy machine. */
    private static final Duration PERIOD = Duration.ofMillis(100);
    private static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    private static final String HOLDER = "{\"prompt\": [1, 2, 3], \"max_tokens\": 1}";

    /** Where a queued request fails once admitted: no sequence can be made for it, or its first prompt chunk throws. */
    enum Failure { SEQUENCE, PROMPT }

    @ParameterizedTest(name = "stream {0}, fails at its {1}")
    @CsvSource({"false, SEQUENCE", "false, PROMPT", "true, SEQUENCE", "true, PROMPT"})
    void aRequestThatWaitedPeriodsInTheQueueAndFailsWhenAdmittedGetsTheStatusOfItsFailure(boolean stream, Failure at)
            throws Exception {
        try (Rig rig = new Rig()) {
            CompletableFuture<HttpResponse<String>> holder = rig.post("/v1/completions", HOLDER);
            rig.await(() -> rig.engine.stats().running() == 1, "the first request runs");
            if (at == Failure.SEQUENCE) {
                rig.pool.refuseFrom = 1;
            } else {
                rig.pool.failPromptFrom = 1;
            }
            CompletableFuture<HttpResponse<String>> queued = rig.post("/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4, \"stream\": "
                            + stream + "}");
            rig.await(() -> rig.engine.stats().waiting() == 1, "the second request waits");
            Thread.sleep(3 * PERIOD.toMillis());   // its heartbeats would have been due
            rig.pool.gate.countDown();

            HttpResponse<String> r = queued.get(10, TimeUnit.SECONDS);
            assertEquals(500, r.statusCode(), r.body());
            JsonNode e = Json.MAPPER.readTree(r.body()).path("error");
            assertEquals("server_error", e.path("type").asText(), r.body());
            assertEquals("generation_failed", e.path("code").asText(), r.body());
            assertTrue(e.path("message").asText().startsWith(at == Failure.SEQUENCE ? "could not start the sequence"
                    : "reading the prompt failed"), r.body());
            // the first request, held in its prompt past a heartbeat, answers 200: blanks, then its completion
            HttpResponse<String> h = holder.get(10, TimeUnit.SECONDS);
            assertEquals(200, h.statusCode(), h.body());
            assertTrue(h.body().startsWith(" "), "a heartbeat before the body: '" + h.body() + "'");
            assertEquals(1, Json.MAPPER.readTree(h.body()).path("usage").path("completion_tokens").asInt(), h.body());
        }
    }

    @ParameterizedTest(name = "the queued request streams: {0}")
    @ValueSource(booleans = {false, true})
    void aShutdownFailsARunningResponseInItsBodyAndAQueuedOneWith503(boolean stream) throws Exception {
        try (Rig rig = new Rig()) {
            CompletableFuture<HttpResponse<InputStream>> running = HTTP.sendAsync(rig.request("/v1/completions",
                    "{\"prompt\": [1, 2, 3], \"max_tokens\": 50}"), HttpResponse.BodyHandlers.ofInputStream());
            // the headers come with the first heartbeat, a period after the request got its sequence
            HttpResponse<InputStream> a = running.get(10, TimeUnit.SECONDS);
            assertEquals(200, a.statusCode());
            CompletableFuture<HttpResponse<String>> queued = rig.post("/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4, \"stream\": "
                            + stream + "}");
            rig.await(() -> rig.engine.stats().waiting() == 1, "the second request waits");
            Thread.sleep(3 * PERIOD.toMillis());
            CompletableFuture<Boolean> stopped = CompletableFuture.supplyAsync(() -> rig.server.shutdown(
                    Duration.ZERO), rig.threads);
            rig.await(rig.engine::isShuttingDown, "the engine is told to stop");
            rig.pool.gate.countDown();

            String body = new String(a.body().readAllBytes(), StandardCharsets.UTF_8);
            assertTrue(body.startsWith(" ") && body.strip().startsWith("{\"error\":"), "blanks, then the error: '"
                    + body + "'");
            JsonNode e = Json.MAPPER.readTree(body);
            assertFalse(e.has("choices"), body);
            assertEquals("server_error", e.path("error").path("type").asText(), body);
            assertEquals("shutting_down", e.path("error").path("code").asText(), body);
            assertEquals("the server is shutting down", e.path("error").path("message").asText(), body);
            assertEquals(1, rig.server.metrics().failuresAfterStatus(), "counted as a failure after its 200");

            HttpResponse<String> q = queued.get(10, TimeUnit.SECONDS);
            assertEquals(503, q.statusCode(), q.body());
            assertEquals("shutting_down", Json.MAPPER.readTree(q.body()).path("error").path("code").asText(),
                    q.body());
            stopped.get(10, TimeUnit.SECONDS);
        }
    }

    /**
     * What docs/SERVER.md tells an SDK user: a failure before the first heartbeat is the SDK's typed error, one after
     * it a completion without its fields, whose error is in the body's {@code error}.
     */
    @Test
    void theSdkRaisesAFailureAtAdmissionAndReadsOneAfterTheHeartbeatAsACompletionWithoutChoices() throws Exception {
        try (Rig rig = new Rig()) {
            OpenAIClient client = OpenAIOkHttpClient.builder().baseUrl("http://127.0.0.1:" + rig.server.port() + "/v1")
                    .apiKey("unused").maxRetries(0).timeout(Duration.ofSeconds(30)).build();
            try {
                CompletionCreateParams p = CompletionCreateParams.builder().model("tiny")
                        .prompt(CompletionCreateParams.Prompt.ofArrayOfTokens(List.of(1L, 2L, 3L))).maxTokens(4)
                        .build();
                CompletableFuture<Completion> late = CompletableFuture.supplyAsync(
                        () -> client.completions().create(p), rig.threads);
                rig.await(() -> rig.engine.stats().running() == 1, "the first request runs");
                CompletableFuture<Completion> early = CompletableFuture.supplyAsync(
                        () -> client.completions().create(p), rig.threads);
                rig.await(() -> rig.engine.stats().waiting() == 1, "the second request waits");
                Thread.sleep(3 * PERIOD.toMillis());   // the first one's heartbeat is out
                rig.pool.failPromptFrom = 0;
                rig.pool.refuseFrom = 1;
                rig.pool.gate.countDown();

                Completion c = late.get(10, TimeUnit.SECONDS);
                assertThrows(OpenAIInvalidDataException.class, c::choices);
                assertTrue(c._additionalProperties().get("error").toString().contains("generation_failed"),
                        c._additionalProperties().toString());
                Exception e = assertThrows(Exception.class, () -> early.get(10, TimeUnit.SECONDS));
                assertTrue(e.getCause() instanceof InternalServerException ise && ise.statusCode() == 500,
                        String.valueOf(e.getCause()));
            } finally {
                client.close();   // its idle connections would hold the server's stop for its grace period
            }
        }
    }

    /** A server of the tiny model over a {@link HookedPool}, one slot, a heartbeat every PERIOD. */
    private static final class Rig implements AutoCloseable {
        final long seed = new Random().nextLong();
        final TestServers models = TestServers.tiny(seed);
        final SequencePool inner;
        final HookedPool pool;
        final Engine engine;
        final KvantServer server;
        /** For the calls that block: the common pool may have a single thread. */
        final ExecutorService threads = Executors.newVirtualThreadPerTaskExecutor();

        Rig() {
            KvFormat f16 = KvFormat.parse("f16");
            inner = models.backend.newSequencePool(2 * CTX, f16, f16);
            pool = new HookedPool(inner);
            engine = new Engine(models.backend, pool, new EngineConfig(1, CTX, 32, 4, false));
            server = KvantServer.start(ServerConfig.local(0, "tiny").withHeartbeat(PERIOD), engine,
                    TextCodec.of(models.model, null));
        }

        HttpRequest request(String path, String body) {
            return HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + path))
                    .timeout(Duration.ofSeconds(30)).header("Content-Type", "application/json")
                    .POST(HttpRequest.BodyPublishers.ofString(body)).build();
        }

        CompletableFuture<HttpResponse<String>> post(String path, String body) {
            return HTTP.sendAsync(request(path, body), HttpResponse.BodyHandlers.ofString());
        }

        void await(BooleanSupplier condition, String what) throws InterruptedException {
            long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
            while (!condition.getAsBoolean()) {
                assertTrue(System.nanoTime() < deadline, "seed " + seed + ": waited 10 s for this: " + what);
                Thread.sleep(1);
            }
        }

        @Override
        public void close() {
            pool.gate.countDown();
            server.close();
            threads.close();
            engine.close();
            inner.close();
            models.close();
        }
    }

    /**
     * The tiny model's pool with a say over its sequences, counted from 0 in the order they are made: the first one's
     * prompt waits for the gate (holding the engine thread, so that what comes next waits in the queue), those from
     * refuseFrom on are refused, those from failPromptFrom on throw on their prompt. Its sequences cannot decode (the
     * CPU backend's decode takes its own sequences): requests here end in their prompt or at their first token.
     */
    private static final class HookedPool implements SequencePool {
        final SequencePool inner;
        final CountDownLatch gate = new CountDownLatch(1);
        volatile int refuseFrom = Integer.MAX_VALUE;
        volatile int failPromptFrom = Integer.MAX_VALUE;
        private final AtomicInteger made = new AtomicInteger();

        HookedPool(SequencePool inner) {
            this.inner = inner;
        }

        @Override
        public int pageTokens() {
            return inner.pageTokens();
        }

        @Override
        public int totalPages() {
            return inner.totalPages();
        }

        @Override
        public int freePages() {
            return inner.freePages();
        }

        @Override
        public BackendSequence newSequence(int capacity) {
            int n = made.getAndIncrement();
            if (n >= refuseFrom) {
                throw new IllegalStateException("injected: no room on the device for sequence " + n);
            }
            BackendSequence s = inner.newSequence(capacity);
            return new BackendSequence() {
                @Override
                public int length() {
                    return s.length();
                }

                @Override
                public int capacity() {
                    return s.capacity();
                }

                @Override
                public void forward(int[] tokens, int off, int n2, boolean allLogits, float[] logits) {
                    if (n == 0) {
                        try {
                            assertTrue(gate.await(10, TimeUnit.SECONDS), "the test never opened the gate");
                        } catch (InterruptedException e) {
                            Thread.currentThread().interrupt();
                        }
                    }
                    if (n >= failPromptFrom) {
                        throw new IllegalStateException("injected: the kernel refused sequence " + n);
                    }
                    s.forward(tokens, off, n2, allLogits, logits);
                }

                @Override
                public int forwardGreedy(int[] tokens, int off, int n2) {
                    return s.forwardGreedy(tokens, off, n2);
                }

                @Override
                public void fillRandom(int tokens, long seed) {
                    s.fillRandom(tokens, seed);
                }

                @Override
                public void truncate(int length) {
                    s.truncate(length);
                }

                @Override
                public void close() {
                    s.close();
                }
            };
        }

        @Override
        public BackendSequence fork(BackendSequence parent, int prefixTokens, int capacity) {
            throw new UnsupportedOperationException("no prefix reuse here");
        }

        @Override
        public void close() {
            inner.close();
        }
    }
}
