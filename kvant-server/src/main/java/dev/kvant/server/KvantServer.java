package dev.kvant.server;

import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineStats;
import io.helidon.http.HeaderNames;
import io.helidon.http.Method;
import io.helidon.webserver.WebServer;
import io.helidon.webserver.http.HttpRouting;
import io.helidon.webserver.http.ServerRequest;
import io.helidon.webserver.http.ServerResponse;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The OpenAI-compatible HTTP server over an {@link Engine}: {@code POST /v1/chat/completions},
 * {@code POST /v1/completions}, {@code GET /v1/models}, {@code GET /v1/models/{model}}, {@code GET /health},
 * {@code GET /metrics}. Every request runs on a virtual thread of Helidon SE's web server. Errors are OpenAI-style
 * JSON with the status that fits (400 for a bad request, 401 without the API key, 404 for an unknown path or model,
 * 503 with Retry-After when the queue is full).
 */
public final class KvantServer implements AutoCloseable {

    /** Where GET /v1/models/{model} starts. */
    private static final String MODEL_PREFIX = "/v1/models/";
    /** The endpoints, as metrics label them (and /v1/models/{model}). */
    private static final Map<String, Method> ROUTES = Map.of("/v1/chat/completions", Method.POST,
            "/v1/completions", Method.POST, "/v1/models", Method.GET, "/health", Method.GET, "/metrics", Method.GET);

    private final ServerConfig config;
    private final Engine engine;
    private final Metrics metrics = new Metrics();
    private final AtomicInteger handling = new AtomicInteger();
    private final long started = System.currentTimeMillis() / 1000;
    private final WebServer web;
    private volatile boolean draining;

    private KvantServer(ServerConfig config, Engine engine, TextCodec codec, int sendBufferBytes) {
        this.config = Objects.requireNonNull(config, "config");
        this.engine = Objects.requireNonNull(engine, "engine");
        CompletionHandler completions = new CompletionHandler(engine, codec, metrics, config);
        HttpRouting.Builder routing = HttpRouting.builder()
                .addFilter((chain, req, res) -> {
                    long t0 = System.nanoTime();
                    handling.incrementAndGet();
                    req.context().register("kvant.arrival", t0);
                    String path = req.path().path();
                    try {
                        if (config.apiKey() != null && !path.equals("/health") && !authorized(req)) {
                            error(res, new ApiException(401, "invalid_request_error", null, "invalid_api_key",
                                    "Missing or incorrect API key: send the header 'Authorization: Bearer <key>' with"
                                            + " the key the server was started with (--api-key).", 0));
                            return;
                        }
                        if (draining && path.endsWith("/completions")) {   // new work only: /v1/models still answers
                            metrics.rejected();
                            error(res, new ApiException(503, "server_error", null, "shutting_down",
                                    "the server is shutting down", 0));
                            return;
                        }
                        chain.proceed();
                    } finally {
                        metrics.request(ROUTES.containsKey(path) ? path
                                : path.startsWith(MODEL_PREFIX) ? MODEL_PREFIX + "{model}" : "other",
                                res.status().code());
                        metrics.requestDuration.observe((System.nanoTime() - t0) / 1e9);
                        handling.decrementAndGet();
                    }
                })
                .post("/v1/chat/completions", (req, res) ->
                        completions.handle(req, res, CompletionRequest.Kind.CHAT, arrival(req)))
                .post("/v1/completions", (req, res) ->
                        completions.handle(req, res, CompletionRequest.Kind.TEXT, arrival(req)))
                .get("/v1/models", (req, res) -> json(res, 200, models()))
                .get(MODEL_PREFIX + "*", (req, res) -> model(res, req.path().path().substring(MODEL_PREFIX.length())))
                .get("/health", this::health)
                .get("/metrics", (req, res) -> {
                    res.header(HeaderNames.CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
                    res.send(metrics.render(engine.stats()).getBytes(StandardCharsets.UTF_8));
                })
                .any((req, res) -> {
                    String path = req.path().path();
                    Method expected = ROUTES.get(path);
                    if (expected == null && path.startsWith(MODEL_PREFIX)) {
                        expected = Method.GET;   // /v1/models/{model}
                    }
                    if (expected != null) {
                        res.header(HeaderNames.ALLOW, expected.text());
                        error(res, new ApiException(405, "invalid_request_error", null, "method_not_allowed",
                                path + " takes " + expected.text() + ", not " + req.prologue().method().text(), 0));
                    } else {
                        error(res, new ApiException(404, "invalid_request_error", null, "unknown_url",
                                "Unknown request URL: " + req.prologue().method().text() + " " + path
                                        + " (kvant serves /v1/chat/completions, /v1/completions, /v1/models, /health,"
                                        + " /metrics)", 0));
                    }
                })
                .error(ApiException.class, (req, res, e) -> error(res, e))
                .error(io.helidon.http.RequestException.class, (req, res, e) -> error(res, new ApiException(
                        e.status().code(), "invalid_request_error", null, null, "the request could not be read: "
                        + e.getMessage(), 0)))
                .error(Throwable.class, (req, res, e) -> error(res, new ApiException(500, "server_error", null, null,
                        "internal error: " + e, 0)));
        requireFreePort(config);
        var builder = WebServer.builder();
        if (sendBufferBytes > 0) {
            builder.connectionOptions(o -> o.socketSendBufferSize(sendBufferBytes));
        }
        this.web = builder
                .host(config.host())
                .port(config.port())
                .maxPayloadSize(config.maxRequestBytes())
                .shutdownGracePeriod(Duration.ofSeconds(2))
                // The owner drains the engine first (shutdown), so Helidon must not close connections on its own.
                .shutdownHook(false)
                .routing(routing)
                .build()
                .start();
        if (!web.isRunning() || web.port() < 0) {   // taken between the check and the bind
            web.stop();
            throw new IllegalStateException(cannotListen(config, "the server did not start"));
        }
    }

    /**
     * Fails with one clear line where the address cannot be bound (a port in use, a host that is not this machine's),
     * before the web server starts: it would log a stack trace and go on listening nowhere.
     */
    private static void requireFreePort(ServerConfig config) {
        // port 0 is always free, but the probe still checks the host
        try (ServerSocket probe = new ServerSocket()) {
            probe.setReuseAddress(true);
            probe.bind(new InetSocketAddress(config.host(), config.port()));
        } catch (IOException e) {
            // only a port in use is the port's fault: a host that does not resolve, or is another machine's
            // ("Cannot assign requested address"), is the host's
            if (e instanceof java.net.BindException && String.valueOf(e.getMessage()).contains("in use")) {
                throw new IllegalStateException(cannotListen(config, e.getMessage()));
            }
            throw new IllegalStateException("cannot listen on " + config.host() + ":" + config.port() + " ("
                    + e.getMessage() + "): is " + config.host() + " an address of this machine? Pick one with --host"
                    + " (127.0.0.1: this machine only; 0.0.0.0: every interface)");
        }
    }

    private static String cannotListen(ServerConfig config, String why) {
        return "cannot listen on " + config.host() + ":" + config.port() + " (" + why + "): is another server using "
                + "the port? Pick another with --port";
    }

    /** Starts listening; the engine and the codec stay the caller's to close, after {@link #shutdown}. */
    public static KvantServer start(ServerConfig config, Engine engine, TextCodec codec) {
        return new KvantServer(config, engine, codec, 0);
    }

    /**
     * As above with each connection's socket send buffer of that many bytes (the system's choice by default, which
     * Linux grows to megabytes): for tests of a client that stops reading, whose writes block once it is full.
     */
    static KvantServer start(ServerConfig config, Engine engine, TextCodec codec, int sendBufferBytes) {
        return new KvantServer(config, engine, codec, sendBufferBytes);
    }

    /** The port listened on (the one picked when the config asked for 0). */
    public int port() {
        return web.port();
    }

    public Metrics metrics() {
        return metrics;
    }

    public Engine engine() {
        return engine;
    }

    /**
     * Graceful stop: new completion requests are refused with 503, the engine finishes what it has within grace
     * (and fails the rest), responses in progress are written out, then the listener closes. Returns whether
     * everything ended within the grace period.
     */
    public boolean shutdown(Duration grace) {
        long deadline = System.nanoTime() + grace.toNanos();
        draining = true;
        boolean clean = engine.shutdown(grace);
        while (handling.get() > 0 && System.nanoTime() - deadline < 2_000_000_000L) {
            try {
                Thread.sleep(10);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            }
        }
        clean &= handling.get() == 0;
        web.stop();
        return clean;
    }

    @Override
    public void close() {
        if (web.isRunning()) {
            shutdown(Duration.ofSeconds(5));
        }
    }

    private static long arrival(ServerRequest req) {
        return req.context().get("kvant.arrival", Long.class).orElseGet(System::nanoTime);
    }

    private boolean authorized(ServerRequest req) {
        String h = req.headers().first(HeaderNames.AUTHORIZATION).orElse("");
        // the scheme's name is case-insensitive (RFC 9110, 11.1)
        boolean bearer = h.regionMatches(true, 0, "Bearer ", 0, 7);
        byte[] given = bearer ? h.substring(7).strip().getBytes(StandardCharsets.UTF_8) : new byte[0];
        return MessageDigest.isEqual(given, config.apiKey().getBytes(StandardCharsets.UTF_8));
    }

    private void health(ServerRequest req, ServerResponse res) {
        ObjectNode o = Json.MAPPER.createObjectNode();
        Throwable failure = engine.failure();
        if (failure != null) {   // the engine thread is gone: nothing will be served again
            o.put("status", "failed");
            o.put("error", "the engine stopped on an internal error: " + failure);
            json(res, 500, o);
            return;
        }
        if (draining || engine.isShuttingDown()) {
            o.put("status", "shutting down");
            json(res, 503, o);
            return;
        }
        EngineStats s = engine.stats();
        o.put("status", "ok");
        o.put("model", config.modelId());
        o.put("running", s.running());
        o.put("waiting", s.waiting());
        o.put("kv_pages_free", s.freePages());
        o.put("kv_pages_total", s.totalPages());
        json(res, 200, o);
    }

    private ObjectNode models() {
        ObjectNode root = Json.MAPPER.createObjectNode();
        root.put("object", "list");
        root.putArray("data").add(modelObject());
        return root;
    }

    private ObjectNode modelObject() {
        ObjectNode m = Json.MAPPER.createObjectNode();
        m.put("id", config.modelId());
        m.put("object", "model");
        m.put("created", started);
        m.put("owned_by", "kvant");
        return m;
    }

    /** GET /v1/models/{model} (the SDKs' models.retrieve): the served model, or OpenAI's 404 for another name. */
    private void model(ServerResponse res, String id) {
        if (id.equals(config.modelId())) {
            json(res, 200, modelObject());
        } else {
            error(res, new ApiException(404, "invalid_request_error", "model", "model_not_found", "The model '" + id
                    + "' does not exist: this server serves '" + config.modelId() + "'", 0));
        }
    }

    private static void json(ServerResponse res, int status, ObjectNode body) {
        res.status(status);
        res.header(HeaderNames.CONTENT_TYPE, "application/json");
        res.send(Json.write(body).getBytes(StandardCharsets.UTF_8));
    }

    private static void error(ServerResponse res, ApiException e) {
        if (res.isSent()) {
            return;
        }
        if (e.retryAfterSeconds() > 0) {
            res.header(HeaderNames.RETRY_AFTER, String.valueOf(e.retryAfterSeconds()));
        }
        json(res, e.status(), e.toJson());
    }
}
