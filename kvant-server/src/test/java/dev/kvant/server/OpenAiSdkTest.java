package dev.kvant.server;

import com.openai.client.OpenAIClient;
import com.openai.client.okhttp.OpenAIOkHttpClient;
import com.openai.core.http.StreamResponse;
import com.openai.errors.BadRequestException;
import com.openai.errors.UnauthorizedException;
import com.openai.models.chat.completions.ChatCompletion;
import com.openai.models.chat.completions.ChatCompletionChunk;
import com.openai.models.chat.completions.ChatCompletionCreateParams;
import com.openai.models.chat.completions.ChatCompletionStreamOptions;
import com.openai.models.completions.Completion;
import com.openai.models.completions.CompletionCreateParams;
import dev.kvant.Fixtures;
import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.kv.KvFormat;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The official OpenAI Java SDK against kvant serving tinycode: chat and text, whole and streamed, and its errors. */
class OpenAiSdkTest {

    private static final String KEY = "sdk-test-key";
    private static TestServers models;
    private static SequencePool pool;
    private static Engine engine;
    private static KvantServer server;
    private static OpenAIClient client;

    @BeforeAll
    static void start() {
        models = TestServers.load(Fixtures.requireTinycode("tinycode-q8_0.gguf"));
        KvFormat f16 = KvFormat.parse("f16");
        pool = models.backend.newSequencePool(4 * 1024, f16, f16);
        engine = new Engine(models.backend, pool, new EngineConfig(4, 1024, 256, 8, true));
        server = KvantServer.start(ServerConfig.local(0, "tinycode").withApiKey(KEY), engine,
                TextCodec.of(models.model, null));
        client = OpenAIOkHttpClient.builder().baseUrl("http://127.0.0.1:" + server.port() + "/v1").apiKey(KEY)
                .maxRetries(0).timeout(Duration.ofSeconds(120)).build();
    }

    @AfterAll
    static void stop() {
        if (server != null) {
            server.shutdown(Duration.ofSeconds(2));
            engine.close();
            pool.close();
        }
        if (models != null) {
            models.close();
        }
    }

    private static ChatCompletionCreateParams.Builder chat(String user, long maxTokens) {
        return ChatCompletionCreateParams.builder().model("tinycode").addUserMessage(user)
                .maxCompletionTokens(maxTokens).temperature(0.0);
    }

    @Test
    void chatCompletionAndItsStreamGiveTheSameGreedyText() {
        ChatCompletion whole = client.chat().completions().create(chat("def fibonacci(n):", 24).build());
        String text = whole.choices().get(0).message().content().orElseThrow();
        assertFalse(text.isEmpty());
        assertEquals("tinycode", whole.model());
        long completion = whole.usage().orElseThrow().completionTokens();
        assertTrue(completion > 0 && completion <= 24, "completion tokens " + completion);

        StringBuilder streamed = new StringBuilder();
        List<String> finish = new ArrayList<>();
        long[] usageTokens = {-1};
        try (StreamResponse<ChatCompletionChunk> s = client.chat().completions().createStreaming(
                chat("def fibonacci(n):", 24).streamOptions(ChatCompletionStreamOptions.builder().includeUsage(true)
                        .build()).build())) {
            s.stream().forEach(c -> {
                c.choices().forEach(ch -> {
                    ch.delta().content().ifPresent(streamed::append);
                    ch.finishReason().ifPresent(f -> finish.add(f.asString()));
                });
                c.usage().ifPresent(u -> usageTokens[0] = u.completionTokens());
            });
        }
        assertEquals(text, streamed.toString());
        assertEquals(List.of(whole.choices().get(0).finishReason().asString()), finish);
        assertEquals(completion, usageTokens[0]);
    }

    @Test
    void secondTurnReportsItsCachedPromptTokens() {
        String question = "import os\n\n\ndef list_files(path):\n    \"\"\"Return the files under path.\"\"\"\n";
        ChatCompletion first = client.chat().completions().create(chat(question, 12).build());
        String answer = first.choices().get(0).message().content().orElseThrow();
        ChatCompletion second = client.chat().completions().create(chat(question, 12).addAssistantMessage(answer)
                .addUserMessage("def count_files(path):").build());
        long cached = second.usage().orElseThrow().promptTokensDetails().orElseThrow().cachedTokens().orElse(0L);
        long prompt = second.usage().orElseThrow().promptTokens();
        assertTrue(cached >= first.usage().orElseThrow().promptTokens() - 1 && cached < prompt,
                "cached " + cached + " of " + prompt + " prompt tokens; first turn had "
                        + first.usage().orElseThrow().promptTokens());
    }

    @Test
    void textCompletionWholeAndStreamed() {
        CompletionCreateParams p = CompletionCreateParams.builder().model("tinycode").prompt("import numpy as np\n")
                .maxTokens(16).temperature(0.0).build();
        Completion whole = client.completions().create(p);
        String text = whole.choices().get(0).text();
        StringBuilder streamed = new StringBuilder();
        try (StreamResponse<Completion> s = client.completions().createStreaming(p)) {
            s.stream().forEach(c -> c.choices().forEach(ch -> streamed.append(ch.text())));
        }
        assertEquals(text, streamed.toString());
        assertTrue(whole.usage().orElseThrow().completionTokens() <= 16);
    }

    @Test
    void sdkSurfacesBadRequestsAndAWrongKeyAsItsTypedErrors() {
        BadRequestException tooLong = assertThrows(BadRequestException.class,
                () -> client.completions().create(CompletionCreateParams.builder().model("tinycode")
                        .prompt("x = 1\n".repeat(2000)).maxTokens(4).build()));
        assertTrue(tooLong.getMessage().contains("maximum context length is 1024 tokens"), tooLong.getMessage());
        OpenAIClient wrong = OpenAIOkHttpClient.builder().baseUrl("http://127.0.0.1:" + server.port() + "/v1")
                .apiKey("not-the-key").maxRetries(0).build();
        assertThrows(UnauthorizedException.class, () -> wrong.chat().completions().create(chat("x", 2).build()));
    }
}
