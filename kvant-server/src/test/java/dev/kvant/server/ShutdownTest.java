package dev.kvant.server;

import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.kv.KvFormat;
import org.junit.jupiter.api.Test;

import java.net.ConnectException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.Random;
import java.util.concurrent.CompletableFuture;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class ShutdownTest {

    @Test
    void shutdownLetsInFlightStreamsFinishThenStopsListeningAndReturnsEveryPage() throws Exception {
        long seed = new Random().nextLong();
        KvFormat f16 = KvFormat.parse("f16");
        try (TestServers m = TestServers.tiny(seed);
             SequencePool pool = m.backend.newSequencePool(512, f16, f16)) {
            Engine engine = new Engine(m.backend, pool, new EngineConfig(2, 256, 32, 4, true));
            KvantServer server = KvantServer.start(ServerConfig.local(0, "tiny"), engine, TextCodec.of(m.model, null));
            URI base = URI.create("http://127.0.0.1:" + server.port() + "/");
            SseClient client = new SseClient(base, null);
            CompletableFuture<SseClient.Trace> inFlight = CompletableFuture.supplyAsync(() -> client.stream(
                    "v1/completions", ServeBench.textRequest(new int[] {1, 2, 3, 4}, 240, true), -1,
                    Duration.ofSeconds(60)));
            while (engine.stats().generatedTokens() < 2) {
                Thread.sleep(2);
            }
            CompletableFuture<Boolean> drained = CompletableFuture.supplyAsync(() -> server.shutdown(
                    Duration.ofSeconds(30)));
            HttpClient probe = HttpClient.newHttpClient();
            while (probe.send(HttpRequest.newBuilder(base.resolve("health")).build(),
                    HttpResponse.BodyHandlers.ofString()).statusCode() != 503) {
                Thread.sleep(2);
            }
            // draining: new completions are refused, the model list still answers
            HttpResponse<String> refused = probe.send(HttpRequest.newBuilder(base.resolve("v1/completions"))
                    .POST(HttpRequest.BodyPublishers.ofString("{\"prompt\": [1, 2], \"max_tokens\": 2}"))
                    .header("Content-Type", "application/json").build(), HttpResponse.BodyHandlers.ofString());
            assertEquals(503, refused.statusCode(), refused.body());
            assertTrue(refused.body().contains("shutting_down"), refused.body());
            assertEquals(200, probe.send(HttpRequest.newBuilder(base.resolve("v1/models")).build(),
                    HttpResponse.BodyHandlers.ofString()).statusCode());
            assertTrue(drained.get(), "drained within the grace period");
            SseClient.Trace t = inFlight.get();
            assertTrue(t.done(), "seed " + seed + ": " + t);
            assertEquals(240, t.completionTokens(), "seed " + seed + ": " + t);
            HttpClient http = HttpClient.newHttpClient();
            assertThrows(ConnectException.class, () -> http.send(HttpRequest.newBuilder(base.resolve("health")).build(),
                    HttpResponse.BodyHandlers.ofString()));
            engine.close();
            assertEquals(pool.totalPages(), pool.freePages(), "seed " + seed);
        }
    }

    /**
     * An engine thread stopped by an error of the JVM (here an out-of-memory error when a sequence is made) fails the
     * request as an internal error (500, not a shutdown), and /health then says the server failed and why.
     */
    @Test
    void anEngineStoppedByAnErrorIsReportedByHealth() throws Exception {
        long seed = new Random().nextLong();
        KvFormat f16 = KvFormat.parse("f16");
        try (TestServers m = TestServers.tiny(seed);
             SequencePool inner = m.backend.newSequencePool(512, f16, f16)) {
            SequencePool failing = new SequencePool() {
                @Override public int pageTokens() { return inner.pageTokens(); }
                @Override public int totalPages() { return inner.totalPages(); }
                @Override public int freePages() { return inner.freePages(); }
                @Override public dev.kvant.backend.BackendSequence newSequence(int capacity) {
                    throw new OutOfMemoryError("injected");
                }
                @Override public dev.kvant.backend.BackendSequence fork(dev.kvant.backend.BackendSequence parent,
                                                                       int prefix, int capacity) {
                    throw new OutOfMemoryError("injected");
                }
                @Override public void close() { }
            };
            try (Engine engine = new Engine(m.backend, failing, new EngineConfig(2, 256, 32, 4, true))) {
                KvantServer server = KvantServer.start(ServerConfig.local(0, "tiny"), engine,
                        TextCodec.of(m.model, null));
                try {
                    URI base = URI.create("http://127.0.0.1:" + server.port() + "/");
                    HttpClient http = HttpClient.newHttpClient();
                    HttpResponse<String> r = http.send(HttpRequest.newBuilder(base.resolve("v1/completions"))
                            .POST(HttpRequest.BodyPublishers.ofString("{\"prompt\": [1, 2, 3], \"max_tokens\": 4}"))
                            .header("Content-Type", "application/json").build(), HttpResponse.BodyHandlers.ofString());
                    assertEquals(500, r.statusCode(), r.body());
                    assertTrue(r.body().contains("internal error"), r.body());
                    HttpResponse<String> h = http.send(HttpRequest.newBuilder(base.resolve("health")).build(),
                            HttpResponse.BodyHandlers.ofString());
                    assertEquals(500, h.statusCode(), h.body());
                    assertTrue(h.body().contains("\"failed\"") && h.body().contains("OutOfMemoryError"), h.body());
                } finally {
                    server.shutdown(Duration.ZERO);
                }
            }
        }
    }

    /** A port already in use is one clear error at start, not a logged stack trace and a server listening nowhere. */
    @Test
    void aPortInUseIsRefusedAtStart() throws Exception {
        KvFormat f16 = KvFormat.parse("f16");
        try (java.net.ServerSocket taken = new java.net.ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
             TestServers m = TestServers.tiny(1);
             SequencePool pool = m.backend.newSequencePool(512, f16, f16)) {
            Engine engine = new Engine(m.backend, pool, new EngineConfig(1, 256, 32, 4, true));
            try {
                IllegalStateException e = assertThrows(IllegalStateException.class, () -> KvantServer.start(
                        ServerConfig.local(taken.getLocalPort(), "tiny"), engine, TextCodec.of(m.model, null)));
                assertTrue(e.getMessage().startsWith("cannot listen on 127.0.0.1:" + taken.getLocalPort()),
                        e.getMessage());
                assertTrue(e.getMessage().contains("--port"), e.getMessage());
            } finally {
                engine.close();
            }
        }
    }

    /**
     * A --host that is not this machine's (an unresolvable name, an address of another machine) is said to be that,
     * not a port in use: the hint was "is another server using the port? Pick another with --port" for every cause.
     */
    @Test
    void aHostThatIsNotThisMachinesIsNamedAtStart() throws Exception {
        KvFormat f16 = KvFormat.parse("f16");
        try (TestServers m = TestServers.tiny(1);
             SequencePool pool = m.backend.newSequencePool(512, f16, f16)) {
            Engine engine = new Engine(m.backend, pool, new EngineConfig(1, 256, 32, 4, true));
            try {
                // 192.0.2.1 is TEST-NET-1 (RFC 5737), never a local address; .invalid never resolves (RFC 6761)
                for (String host : new String[] {"192.0.2.1", "kvant.invalid"}) {
                    for (int port : new int[] {18080, 0}) {
                        ServerConfig config = new ServerConfig(host, port, null, "tiny", 32L << 20,
                                Duration.ofSeconds(1), ServerConfig.DEFAULT_WRITE_TIMEOUT);
                        IllegalStateException e = assertThrows(IllegalStateException.class,
                                () -> KvantServer.start(config, engine, TextCodec.of(m.model, null)));
                        assertTrue(e.getMessage().startsWith("cannot listen on " + host + ":" + port),
                                e.getMessage());
                        assertTrue(e.getMessage().contains("--host") && !e.getMessage().contains("--port"),
                                e.getMessage());
                    }
                }
            } finally {
                engine.close();
            }
        }
    }
}
