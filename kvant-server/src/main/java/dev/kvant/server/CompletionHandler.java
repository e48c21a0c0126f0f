package dev.kvant.server;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.kvant.engine.ContextFullException;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineBusyException;
import dev.kvant.engine.FinishReason;
import dev.kvant.engine.Generation;
import dev.kvant.engine.GenerationEvent;
import dev.kvant.engine.GenerationRequest;
import dev.kvant.sample.SamplerConfig;
import io.helidon.http.HeaderNames;
import io.helidon.webserver.http.ServerRequest;
import io.helidon.webserver.http.ServerResponse;

import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.HexFormat;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * {@code POST /v1/chat/completions} and {@code POST /v1/completions}: validates the request, queues it on the
 * engine, and answers either with one JSON object or as server-sent events ending in {@code data: [DONE]}. Runs on
 * the request's virtual thread, which waits on the generation's event queue; the engine thread never blocks on a
 * client. A write that fails (the client went away) cancels the generation, which frees its sequence at the next step.
 */
final class CompletionHandler {

    /** The most bytes one write to a client carries (its deadline: {@link WriteDeadline}). */
    private static final int SLICE = 64 * 1024;

    private final Engine engine;
    private final TextCodec codec;
    private final Metrics metrics;
    private final ServerConfig config;
    private final String idPrefix = HexFormat.of().formatHex(new SecureRandom().generateSeed(4));

    CompletionHandler(Engine engine, TextCodec codec, Metrics metrics, ServerConfig config) {
        this.engine = engine;
        this.codec = codec;
        this.metrics = metrics;
        this.config = config;
    }

    /** How a generation ended, as the response reports it. */
    private record Outcome(String finishReason, int promptTokens, int cachedTokens, int completionTokens,
                           GenerationEvent.Failed failure) {
    }

    void handle(ServerRequest req, ServerResponse res, CompletionRequest.Kind kind, long arrivalNanos) {
        byte[] bytes = req.content().hasEntity() ? req.content().as(byte[].class) : new byte[0];
        CompletionRequest r = CompletionRequest.parse(kind, Json.parseObject(bytes));
        boolean chat = kind == CompletionRequest.Kind.CHAT;
        String what = chat ? "messages" : "prompt";
        int ctx = engine.config().contextLength();
        int[] prompt;
        try {
            // a text certain to be too long is refused before it is tokenized (the chat once rendered)
            if (!chat && r.prompt() != null) {
                codec.checkLength(r.prompt(), ctx);
            }
            prompt = chat ? codec.chat(r.messages(), ctx) : r.prompt() != null ? codec.text(r.prompt()) : r.promptTokens();
        } catch (TextCodec.TooLong e) {
            throw new ApiException(400, "invalid_request_error", what, "context_length_exceeded",
                    "This model's maximum context length is " + ctx + " tokens, but the " + what + (chat ? " hold " : " holds ")
                            + e.bytes + " bytes of text" + (chat ? " once rendered" : "") + ", at least " + e.least
                            + " tokens. Shorten the " + what + " (or start the server with a larger -c).", 0);
        } catch (IllegalArgumentException e) {
            throw ApiException.invalid(chat ? "messages" : "prompt", e.getMessage());
        }
        if (prompt.length == 0) {
            throw ApiException.invalid(what, "the " + what + " came to no tokens");
        }
        if (prompt.length >= ctx) {
            throw new ApiException(400, "invalid_request_error", what, "context_length_exceeded",
                    "This model's maximum context length is " + ctx + " tokens, but the " + what + " came to "
                            + prompt.length + " tokens, which leaves no room for a reply. Shorten the " + what
                            + " (or start the server with a larger -c).",
                    0);
        }
        // omitted: until the context is full, which the engine says (finish "length"); the last token is drawn from
        // the logits of the context's last row and never written, so a context of ctx holds ctx - prompt + 1 of them
        int maxTokens = r.maxTokens() != null ? r.maxTokens() : ctx - prompt.length + 1;
        long seed = r.seed() != null ? r.seed() : new SecureRandom().nextLong();
        SamplerConfig sampling;
        try {
            int window = r.repeatLastN() == -1 ? ctx : Math.min(r.repeatLastN(), ctx);
            sampling = new SamplerConfig(r.temperature(), r.topK(), r.topP(), r.minP(), r.repeatPenalty(), window,
                    r.frequencyPenalty(), r.presencePenalty(), seed);
        } catch (IllegalArgumentException e) {   // CompletionRequest checks each field; this is the last word
            throw ApiException.invalid(null, e.getMessage());
        }
        LinkedBlockingQueue<GenerationEvent> events = new LinkedBlockingQueue<>();
        Generation g;
        try {
            g = engine.submit(new GenerationRequest(prompt, maxTokens, sampling,
                    r.ignoreEos() ? null : codec::isEndOfGeneration, r.ignoreEos() ? codec::isEndOfGeneration : null),
                    events::add);
        } catch (EngineBusyException e) {
            metrics.rejected();
            throw new ApiException(503, "server_error", null, e.shuttingDown() ? "shutting_down" : "overloaded",
                    e.getMessage(), e.shuttingDown() ? 0 : 1);
        } catch (ContextFullException e) {
            throw new ApiException(400, "invalid_request_error", what, "context_length_exceeded", e.getMessage(), 0);
        } catch (IllegalArgumentException e) {
            throw ApiException.invalid(what, e.getMessage());
        }
        String id = (chat ? "chatcmpl-" : "cmpl-") + idPrefix + Long.toHexString(g.id());
        long created = System.currentTimeMillis() / 1000;
        try (WriteDeadline deadline = new WriteDeadline(config.writeTimeout())) {
            if (r.stream()) {
                stream(deadline, res, r, g, events, id, created, arrivalNanos);
            } else {
                respond(deadline, res, r, g, events, id, created, arrivalNanos);
            }
        } catch (UncheckedIOException e) {
            metrics.disconnect();
        } finally {
            g.cancel();
        }
    }

    private void stream(WriteDeadline d, ServerResponse res, CompletionRequest r, Generation g,
                        LinkedBlockingQueue<GenerationEvent> events, String id, long created, long arrival) {
        boolean chat = r.kind() == CompletionRequest.Kind.CHAT;
        // The headers go out with the first write, the first text or heartbeat (a chat's role chunk just before it):
        // a stream that fails before either, at admission say, gets the status of the failure instead of 200.
        OutputStream[] opened = {null};
        java.util.function.Supplier<OutputStream> out = () -> {
            if (opened[0] == null) {
                res.status(200);
                res.header(HeaderNames.CONTENT_TYPE, "text/event-stream; charset=utf-8");
                res.header(HeaderNames.CACHE_CONTROL, "no-cache");
                opened[0] = res.outputStream();
                if (chat) {
                    ObjectNode delta = Json.MAPPER.createObjectNode().put("role", "assistant").put("content", "");
                    event(d, opened[0], chunk(id, created, r, delta, null, null));
                }
            }
            return opened[0];
        };
        Outcome o = consume(r, g, events, arrival, true,
                text -> event(d, out.get(), chunk(id, created, r, null, text, null)),
                () -> write(d, out.get(), ": keep-alive\n\n"));
        if (o.failure() != null) {
            if (opened[0] == null) {
                GenerationEvent.Failed f = o.failure();
                throw new ApiException(f.shuttingDown() ? 503 : 500, "server_error", null,
                        f.shuttingDown() ? "shutting_down" : "generation_failed", f.message(), 0);
            }
            metrics.failedAfterStatus();
            event(d, out.get(), ApiException.body(o.failure().message(), "server_error", null,
                    o.failure().shuttingDown() ? "shutting_down" : "generation_failed"));
        } else {
            event(d, out.get(), chunk(id, created, r, chat ? Json.MAPPER.createObjectNode() : null, chat ? null : "",
                    o.finishReason()));
            if (r.includeUsage()) {
                ObjectNode u = envelope(id, created, r);
                u.putArray("choices");
                u.set("usage", usage(o));
                event(d, out.get(), u);
            }
        }
        write(d, out.get(), "data: [DONE]\n\n");
        close(d, out.get());
    }

    private void respond(WriteDeadline d, ServerResponse res, CompletionRequest r, Generation g,
                         LinkedBlockingQueue<GenerationEvent> events, String id, long created, long arrival) {
        StringBuilder text = new StringBuilder();
        OutputStream[] committed = {null};
        Outcome o = consume(r, g, events, arrival, false, text::append, () -> {
            // A generation running past a heartbeat period: send the headers and a space (JSON allows leading blanks)
            // so that a write fails, and the generation is cancelled, once the client has gone. This commits the
            // status (200); consume calls it only once the request holds a sequence, so that every failure up to
            // then gets a status of its own.
            if (committed[0] == null) {
                res.status(200);
                res.header(HeaderNames.CONTENT_TYPE, "application/json");
                committed[0] = res.outputStream();
            }
            write(d, committed[0], " ");
        });
        ObjectNode body;
        if (o.failure() != null) {
            if (committed[0] == null) {
                GenerationEvent.Failed f = o.failure();
                throw new ApiException(f.shuttingDown() ? 503 : 500, "server_error", null,
                        f.shuttingDown() ? "shutting_down" : "generation_failed", f.message(), 0);
            }
            // the status (200) went out with the first heartbeat: the body alone can say what happened, as the
            // OpenAI error object after the heartbeats' blanks (docs/SERVER.md, Errors)
            metrics.failedAfterStatus();
            body = ApiException.body(o.failure().message(), "server_error", null,
                    o.failure().shuttingDown() ? "shutting_down" : "generation_failed");
        } else {
            body = envelope(id, created, r);
            ObjectNode choice = body.putArray("choices").addObject();
            choice.put("index", 0);
            if (r.kind() == CompletionRequest.Kind.CHAT) {
                choice.putObject("message").put("role", "assistant").put("content", text.toString())
                        .putNull("refusal");
            } else {
                choice.put("text", text.toString());
            }
            choice.putNull("logprobs");
            choice.put("finish_reason", o.finishReason());
            body.set("usage", usage(o));
        }
        byte[] bytes = Json.write(body).getBytes(StandardCharsets.UTF_8);
        if (committed[0] == null && bytes.length <= SLICE) {
            res.header(HeaderNames.CONTENT_TYPE, "application/json");
            try {
                d.run(() -> res.send(bytes));
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        } else {
            if (committed[0] == null) {   // a long body: streamed a slice at a time, each within the deadline
                res.status(200);
                res.header(HeaderNames.CONTENT_TYPE, "application/json");
                committed[0] = res.outputStream();
            }
            write(d, committed[0], new String(bytes, StandardCharsets.UTF_8));
            close(d, committed[0]);
        }
    }

    /**
     * Reads the generation's events until it ends, handing text to sink as soon as no stop string can claim it, and
     * calling idle whenever a heartbeat period has passed with nothing written to the client: since the request got
     * its sequence, the last idle call or, when sinkWrites (a stream), the last text handed to sink. So a response
     * held back until the end (not streamed) writes its heartbeat every period while tokens flow, and a client that
     * has gone is noticed within a period either way.
     *
     * <p>No heartbeat is written while the request waits in the queue: the first one commits the response's status
     * (200), and a request that fails before it holds a sequence (the server shutting down while it waits, a
     * sequence that cannot be made) or in its first period (its first prompt chunks, a backend that refuses its
     * shape) then gets the status of its failure instead. The cost: a client that leaves while its request is queued
     * is noticed only once the request is admitted, by the heartbeats after it.
     */
    private Outcome consume(CompletionRequest r, Generation g, LinkedBlockingQueue<GenerationEvent> events,
                            long arrival, boolean sinkWrites, Consumer<String> sink, Runnable idle) {
        TextCodec.Detokenizer decoder = codec.detokenizer();
        StopStrings stops = new StopStrings(r.stop());
        int promptTokens = 0;
        int cachedTokens = 0;
        int generated = 0;
        long last = 0;
        long period = config.heartbeat().toNanos();
        boolean admitted = false;
        long quietSince = 0;
        while (true) {
            GenerationEvent e;
            try {
                e = admitted ? events.poll(Math.max(0, quietSince + period - System.nanoTime()), TimeUnit.NANOSECONDS)
                        : events.take();
            } catch (InterruptedException ex) {
                Thread.currentThread().interrupt();
                g.cancel();
                throw new UncheckedIOException(new IOException("interrupted while waiting for tokens"));
            }
            if (admitted && System.nanoTime() - quietSince >= period) {
                idle.run();
                quietSince = System.nanoTime();
            }
            if (e == null) {
                continue;
            }
            switch (e) {
                case GenerationEvent.Started s -> {
                    promptTokens = s.promptTokens();
                    cachedTokens = s.cachedTokens();
                    admitted = true;
                    quietSince = System.nanoTime();
                }
                case GenerationEvent.Token t -> {
                    long now = System.nanoTime();
                    if (generated == 0) {
                        metrics.timeToFirstToken.observe((now - arrival) / 1e9);
                    } else {
                        metrics.interTokenLatency.observe((now - last) / 1e9);
                    }
                    last = now;
                    generated++;
                    String text = stops.push(decoder.feed(t.id()));
                    if (!text.isEmpty()) {
                        sink.accept(text);
                        if (sinkWrites) {
                            quietSince = System.nanoTime();
                        }
                    }
                    if (stops.matched()) {
                        g.cancel();
                        return new Outcome("stop", promptTokens, cachedTokens, generated, null);
                    }
                }
                case GenerationEvent.Finished f -> {
                    String text = stops.push(decoder.flush());
                    text += stops.finish();
                    if (!text.isEmpty()) {
                        sink.accept(text);
                    }
                    String reason = stops.matched() || f.reason() == FinishReason.STOP
                            || f.reason() == FinishReason.CANCELLED ? "stop" : "length";
                    return new Outcome(reason, f.promptTokens(), f.cachedTokens(), generated, null);
                }
                case GenerationEvent.Failed f -> {
                    return new Outcome(null, promptTokens, cachedTokens, generated, f);
                }
            }
        }
    }

    private ObjectNode envelope(String id, long created, CompletionRequest r) {
        ObjectNode o = Json.MAPPER.createObjectNode();
        o.put("id", id);
        boolean chat = r.kind() == CompletionRequest.Kind.CHAT;
        o.put("object", chat ? (r.stream() ? "chat.completion.chunk" : "chat.completion") : "text_completion");
        o.put("created", created);
        o.put("model", config.modelId());
        o.putNull("system_fingerprint");
        return o;
    }

    /** One streamed piece: a chat delta or a text, and the finish reason on the last. */
    private ObjectNode chunk(String id, long created, CompletionRequest r, ObjectNode delta, String text,
                             String finishReason) {
        ObjectNode o = envelope(id, created, r);
        ArrayNode choices = o.putArray("choices");
        ObjectNode c = choices.addObject();
        c.put("index", 0);
        if (r.kind() == CompletionRequest.Kind.CHAT) {
            c.set("delta", delta != null ? delta : Json.MAPPER.createObjectNode().put("content", text));
        } else {
            c.put("text", text);
        }
        c.putNull("logprobs");
        c.put("finish_reason", finishReason);
        return o;
    }

    private static ObjectNode usage(Outcome o) {
        ObjectNode u = Json.MAPPER.createObjectNode();
        u.put("prompt_tokens", o.promptTokens());
        u.put("completion_tokens", o.completionTokens());
        u.put("total_tokens", o.promptTokens() + o.completionTokens());
        u.putObject("prompt_tokens_details").put("cached_tokens", o.cachedTokens());
        return u;
    }

    private static void event(WriteDeadline d, OutputStream out, ObjectNode data) {
        write(d, out, "data: " + Json.write(data) + "\n\n");
    }

    /**
     * Writes and flushes within the write deadline, SLICE bytes at a time (so that the deadline measures a client
     * that stopped reading, not a long body read slowly); any failure means the client is gone (or reads nothing)
     * and surfaces as UncheckedIOException.
     */
    private static void write(WriteDeadline d, OutputStream out, String s) {
        byte[] bytes = s.getBytes(StandardCharsets.UTF_8);
        try {
            for (int off = 0; off < bytes.length || off == 0; off += SLICE) {
                int from = off, n = Math.min(SLICE, bytes.length - off);
                d.run(() -> {
                    out.write(bytes, from, n);
                    out.flush();
                });
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (UncheckedIOException e) {
            throw e;
        } catch (RuntimeException e) {
            throw new UncheckedIOException(new IOException("writing to the client failed", e));
        }
    }

    private static void close(WriteDeadline d, OutputStream out) {
        try {
            d.run(out::close);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (UncheckedIOException e) {
            throw e;
        } catch (RuntimeException e) {
            throw new UncheckedIOException(new IOException("closing the response failed", e));
        }
    }
}
