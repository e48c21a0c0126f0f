package dev.kvant.server;

import com.fasterxml.jackson.databind.JsonNode;
import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.kv.KvFormat;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Raw HTTP against the error paths: each bad request gets its status and an OpenAI-style error naming the fault. */
class ServerErrorsTest {

    private static final long SEED = new Random().nextLong();
    private static final String KEY = "test-key-" + SEED;
    private static final int CTX = 256;
    private static TestServers models;
    private static SequencePool pool;
    private static Engine engine;
    private static KvantServer server;
    private static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

    @BeforeAll
    static void start() {
        models = TestServers.tiny(SEED);
        KvFormat f16 = KvFormat.parse("f16");
        pool = models.backend.newSequencePool(2 * CTX, f16, f16);
        engine = new Engine(models.backend, pool, new EngineConfig(1, CTX, 32, 1, true));
        server = KvantServer.start(ServerConfig.local(0, "tiny").withApiKey(KEY), engine, TextCodec.of(models.model,
                null));
    }

    @AfterAll
    static void stop() {
        server.shutdown(Duration.ofSeconds(2));
        engine.close();
        pool.close();
        models.close();
    }

    record Reply(int status, JsonNode json, HttpResponse<String> raw) {
        String message() {
            return json.path("error").path("message").asText();
        }
    }

    private static Reply send(String method, String path, String body, String key) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port() + path))
                .timeout(Duration.ofSeconds(60))
                .method(method, body == null ? HttpRequest.BodyPublishers.noBody()
                        : HttpRequest.BodyPublishers.ofString(body));
        if (key != null) {
            b.header("Authorization", "Bearer " + key);
        }
        HttpResponse<String> r = HTTP.send(b.build(), HttpResponse.BodyHandlers.ofString());
        boolean isJson = r.headers().firstValue("Content-Type").orElse("").startsWith("application/json");
        JsonNode json = isJson ? Json.MAPPER.readTree(r.body()) : null;
        return new Reply(r.statusCode(), json, r);
    }

    private static Reply post(String path, String body) throws Exception {
        return send("POST", path, body, KEY);
    }

    private static void assertError(Reply r, int status, String param, String messagePart) {
        assertEquals(status, r.status(), r.raw().body());
        JsonNode e = r.json().path("error");
        assertTrue(e.isObject(), "an OpenAI-style error object: " + r.raw().body());
        if (param != null) {
            assertEquals(param, e.path("param").asText(), r.raw().body());
        }
        assertTrue(r.message().contains(messagePart), "'" + messagePart + "' in: " + r.message());
    }

    @Test
    void malformedJsonIs400AndSaysWhere() throws Exception {
        assertError(post("/v1/chat/completions", "{\"messages\": [}"), 400, null, "not valid JSON at line 1");
        assertError(post("/v1/chat/completions", "[1, 2]"), 400, null, "must be a JSON object");
        assertError(post("/v1/chat/completions", ""), 400, null, "empty");
        assertError(post("/v1/completions", "{\"prompt\": \"a\", \"prompt\": \"b\"}"), 400, null, "Duplicate field");
    }

    @Test
    void fieldsOfTheWrongTypeAndUnknownFieldsAre400NamingTheField() throws Exception {
        String msgs = "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"temperature\": \"hot\"}"), 400, "temperature",
                "must be a number between 0 and 2, got a string");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"max_tokens\": 1.5}"), 400, "max_tokens",
                "must be an integer");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"stream\": \"yes\"}"), 400, "stream",
                "must be a boolean");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"stop\": [1]}"), 400, "stop", "array of up to 4");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"colour\": \"blue\"}"), 400, "colour",
                "Unrecognized request argument supplied: colour");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"n\": 2}"), 400, "n", "n must be 1");
        // logprobs are refused, not answered with null: 0 too asks for the chosen tokens' own
        for (String lp : new String[] {"0", "3"}) {
            assertError(post("/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": " + lp + "}"), 400, "logprobs",
                    "logprobs are not supported");
        }
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"logprobs\": true}"), 400, "logprobs",
                "logprobs are not supported");
        // inside objects too: a stream option or a message field kvant does not know is named, not ignored
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"stream\": true, \"stream_options\": {\"foo\": 1}}"),
                400, "stream_options.foo", "Unrecognized request argument supplied: stream_options.foo");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"stream_options\": {\"include_usage\": true}}"),
                400, "stream_options", "only allowed when 'stream' is enabled");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"stream\": true, \"stream_options\": "
                + "{\"include_usage\": 1}}"), 400, "stream_options.include_usage", "must be a boolean");
        assertError(post("/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"colour\": 1}]}"), 400,
                "messages[0].colour", "Unrecognized request argument supplied: messages[0].colour");
        assertError(post("/v1/chat/completions", "{\"messages\": []}"), 400, "messages", "non-empty array");
        assertError(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}"), 400,
                "messages[0].role", "'robot'");
        assertError(post("/v1/completions", "{\"prompt\": [1, 2, 300]}"), 400, "prompt", "outside the vocabulary");
        assertError(post("/v1/completions", "{\"prompt\": {\"a\": 1}}"), 400, "prompt", "must be a string");
        // OpenAI's hints about the caller and its prompt cache are taken (and ignored); its features kvant lacks and
        // tool results are refused by name
        Reply hints = post("/v1/chat/completions", "{" + msgs + ", \"max_tokens\": 1, \"safety_identifier\": \"u1\","
                + " \"prompt_cache_key\": \"k\", \"prompt_cache_retention\": \"in-memory\", \"verbosity\": \"low\"}");
        assertEquals(200, hints.status(), hints.raw().body());
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"safety_identifier\": 5}"), 400, "safety_identifier",
                "must be a string");
        assertError(post("/v1/chat/completions", "{" + msgs + ", \"prediction\": {\"type\": \"content\","
                + " \"content\": \"x\"}}"), 400, "prediction", "prediction is not supported");
        assertError(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"},"
                + " {\"role\": \"tool\", \"content\": \"y\", \"tool_call_id\": \"1\"}]}"), 400, "messages[1].role",
                "tool and function results are not supported");
        // above 0 as a double, 0 as the float the sampler takes: it used to be a 500 from the sampler's settings
        assertError(post("/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"repeat_penalty\": 1e-50}"),
                400, "repeat_penalty", "must be above 0");
        // llama.cpp's repetition window: taken (-1 the whole context), refused below -1
        Reply window = post("/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"repeat_penalty\": 1.1,"
                + " \"repeat_last_n\": -1}");
        assertEquals(200, window.status(), window.raw().body());
        assertError(post("/v1/completions", "{\"prompt\": \"hi\", \"repeat_last_n\": -2}"), 400, "repeat_last_n",
                "repeat_last_n");
        assertEquals(-1, CompletionRequest.parse(CompletionRequest.Kind.TEXT, Json.MAPPER.readTree(
                "{\"prompt\": \"hi\", \"repeat_last_n\": -1}")).repeatLastN());
        assertEquals(CompletionRequest.DEFAULT_REPEAT_LAST_N, CompletionRequest.parse(CompletionRequest.Kind.TEXT,
                Json.MAPPER.readTree("{\"prompt\": \"hi\"}")).repeatLastN());
        // OpenAI's penalties are applied (they were accepted and ignored), in OpenAI's range
        CompletionRequest penalties = CompletionRequest.parse(CompletionRequest.Kind.TEXT, Json.MAPPER.readTree(
                "{\"prompt\": \"hi\", \"frequency_penalty\": 0.5, \"presence_penalty\": -1}"));
        assertEquals(0.5f, penalties.frequencyPenalty());
        assertEquals(-1f, penalties.presencePenalty());
        assertError(post("/v1/completions", "{\"prompt\": \"hi\", \"presence_penalty\": 3}"), 400, "presence_penalty",
                "presence_penalty");
        Reply penalized = post("/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"frequency_penalty\": 1}");
        assertEquals(200, penalized.status(), penalized.raw().body());
    }

    /** A message's text parts are one text, a line each (as vLLM and llama.cpp join them), not run together. */
    @Test
    void textPartsAreJoinedALineEach() throws Exception {
        Reply parts = post("/v1/chat/completions", "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", "
                + "\"content\": [{\"type\": \"text\", \"text\": \"def\"}, {\"type\": \"text\", \"text\": \"fib\"}]}]}");
        Reply lines = post("/v1/chat/completions", "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", "
                + "\"content\": \"def\\nfib\"}]}");
        assertEquals(200, parts.status(), parts.raw().body());
        assertEquals(200, lines.status(), lines.raw().body());
        assertEquals(lines.json().path("usage").path("prompt_tokens").asInt(),
                parts.json().path("usage").path("prompt_tokens").asInt(), parts.raw().body());
        assertEquals("a\nb", CompletionRequest.parse(CompletionRequest.Kind.CHAT, Json.MAPPER.readTree("{\"messages\":"
                + " [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\","
                + " \"text\": \"b\"}]}]}")).messages().get(0).content());
    }

    @Test
    void promptLongerThanTheContextIs400WithBothLengths() throws Exception {
        Reply r = post("/v1/completions", "{\"prompt\": \"" + "x".repeat(CTX + 10) + "\"}");
        assertError(r, 400, "prompt", "maximum context length is " + CTX + " tokens");
        assertTrue(r.message().contains((CTX + 10) + " tokens"), r.message());
        assertEquals("context_length_exceeded", r.json().path("error").path("code").asText());
    }

    /** A prompt whose text alone is more tokens than the context holds is refused before it is tokenized. */
    @Test
    void aPromptFarPastTheContextIsRefusedByItsBytes() throws Exception {
        String big = "é".repeat(1 << 20);   // 2 MiB of UTF-8
        Reply r = post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"" + big + "\"}]}");
        assertError(r, 400, "messages", "maximum context length is " + CTX + " tokens");
        assertTrue(r.message().contains("bytes of text once rendered"), r.message());
        assertEquals("context_length_exceeded", r.json().path("error").path("code").asText());
        assertEquals(2L << 20, TextCodec.utf8Length(big));
        // what the messages' stripped text alone did not count: whitespace a template keeps, and its own text for
        // each of many empty messages — both refused by the rendered text's bytes, before tokenizing
        Reply spaces = post("/v1/chat/completions",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"" + " ".repeat(1 << 20) + "\"}]}");
        assertError(spaces, 400, "messages", "bytes of text once rendered");
        String empty = "{\"role\": \"user\", \"content\": \"\"},";
        String many = "{\"messages\": [" + empty.repeat(50_000) + "{\"role\": \"user\", \"content\": \"x\"}]}";
        assertError(post("/v1/chat/completions", many), 400, "messages", "bytes of text once rendered");
        assertEquals(4, TextCodec.utf8Length("\uD83D\uDE00"));   // one character outside the BMP
        assertEquals(2, TextCodec.utf8Length("\uD800\uD800"), "lone surrogates: '?' each");
    }

    @Test
    void withAnApiKeySetRequestsWithoutItAre401ButHealthIsOpen() throws Exception {
        assertError(send("POST", "/v1/completions", "{\"prompt\": \"a\"}", null), 401, null, "API key");
        assertError(send("GET", "/v1/models", null, "wrong"), 401, null, "API key");
        assertEquals(200, send("GET", "/health", null, null).status());
        Reply models = send("GET", "/v1/models", null, KEY);
        assertEquals("tiny", models.json().path("data").path(0).path("id").asText());
        // the SDKs' models.retrieve: the model by its name, OpenAI's 404 for another
        Reply one = send("GET", "/v1/models/tiny", null, KEY);
        assertEquals(200, one.status(), one.raw().body());
        assertEquals(models.json().path("data").path(0), one.json());
        assertError(send("GET", "/v1/models/gpt-4o", null, KEY), 404, "model", "'gpt-4o' does not exist");
        assertError(send("GET", "/v1/models/tiny", null, "wrong"), 401, null, "API key");
    }

    @Test
    void unknownPathIs404AndWrongMethodIs405() throws Exception {
        assertError(send("GET", "/v1/embeddings", null, KEY), 404, null, "Unknown request URL");
        Reply wrong = send("GET", "/v1/chat/completions", null, KEY);
        assertError(wrong, 405, null, "takes POST");
        assertEquals("POST", wrong.raw().headers().firstValue("Allow").orElse(""), "405 names the method");
        // /v1/models/{model} exists for GET: another method is 405 there too, not an unknown URL
        Reply deleted = send("DELETE", "/v1/models/tiny", null, KEY);
        assertError(deleted, 405, null, "takes GET");
        assertEquals("GET", deleted.raw().headers().firstValue("Allow").orElse(""), "405 names the method");
        assertError(send("POST", "/v1/models/", null, KEY), 405, null, "takes GET");
    }

    @Test
    void aUserMessageWithoutContentAndToolCallsNotAnArrayAre400() throws Exception {
        assertError(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}"), 400,
                "messages[0].content", "is required for a user message");
        assertError(post("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\","
                + " \"tool_calls\": \"x\"}]}"), 400, "messages[0].tool_calls", "must be an array");
        // an assistant turn may come without content
        Reply ok = post("/v1/chat/completions", "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", "
                + "\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": null}, {\"role\": \"user\", "
                + "\"content\": \"again\"}]}");
        assertEquals(200, ok.status(), ok.raw().body());
    }

    @Test
    void theBearerSchemeNameIsCaseInsensitive() throws Exception {
        HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + server.port()
                        + "/v1/models")).header("Authorization", "bearer " + KEY).build(),
                HttpResponse.BodyHandlers.ofString());
        assertEquals(200, r.statusCode(), r.body());
    }

    @Test
    void aStopStringLongerThan256CharactersIs400() throws Exception {
        assertError(post("/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"stop\": \""
                + "x".repeat(257) + "\"}"), 400, "stop", "at most 256 characters");
    }

    @Test
    void aFullQueueIs503WithRetryAfterAndTheServerGoesOn() throws Exception {
        // One slot and one queue place: two long requests fill them, the third is refused.
        SseClient client = new SseClient(URI.create("http://127.0.0.1:" + server.port() + "/"), KEY);
        Thread[] holders = new Thread[2];
        for (int i = 0; i < 2; i++) {
            holders[i] = Thread.ofVirtual().start(() -> client.stream("v1/completions",
                    ServeBench.textRequest(new int[] {97, 97, 97, 97}, 200, true), 3, Duration.ofSeconds(60)));
        }
        long deadline = System.nanoTime() + 30_000_000_000L;
        while (engine.stats().running() + engine.stats().waiting() < 2 && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        Reply r = post("/v1/completions", "{\"prompt\": \"b\", \"max_tokens\": 1}");
        assertError(r, 503, null, "retry later");
        assertEquals("1", r.raw().headers().firstValue("Retry-After").orElse(""));
        for (Thread t : holders) {
            t.join();
        }
        Reply ok = post("/v1/completions", "{\"prompt\": \"hello\", \"max_tokens\": 3, \"ignore_eos\": true}");
        assertEquals(200, ok.status(), ok.raw().body());
        assertEquals(3, ok.json().path("usage").path("completion_tokens").asInt());
        // max_tokens omitted fills the context, as many tokens as any larger max_tokens gives: the prompt's 5 rows and
        // every generated token but the last are written, the last drawn from the context's last row
        String fill = "{\"prompt\": \"hello\", \"ignore_eos\": true, \"temperature\": 0";
        Reply omitted = post("/v1/completions", fill + "}");
        Reply past = post("/v1/completions", fill + ", \"max_tokens\": " + 10 * CTX + "}");
        for (Reply full : new Reply[] {omitted, past}) {
            assertEquals(200, full.status(), full.raw().body());
            assertEquals(CTX - 5 + 1, full.json().path("usage").path("completion_tokens").asInt(), full.raw().body());
            assertEquals("length", full.json().path("choices").path(0).path("finish_reason").asText());
        }
        assertEquals(past.json().path("choices").path(0).path("text").asText(),
                omitted.json().path("choices").path(0).path("text").asText());
        String metrics = send("GET", "/metrics", null, KEY).raw().body();
        assertTrue(metrics.contains("kvant_requests_total{endpoint=\"/v1/completions\",code=\"503\"} "), metrics);
        assertTrue(metrics.contains("kvant_kv_pages_capacity " + pool.totalPages()), metrics);
    }
}
