package dev.kvant.server;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;

/**
 * A streaming client of the server's completion endpoints over the JDK's HTTP client, for benchmarks and load tests:
 * it times every server-sent event and can walk away in the middle, as a client that disconnects does.
 */
public final class SseClient {

    /**
     * One streamed request as the client saw it.
     *
     * @param status       HTTP status
     * @param finishReason the last chunk's finish_reason, null if none came
     * @param done         the stream ended with {@code data: [DONE]}
     * @param chunks       events that carried text
     * @param ttftSeconds  from sending to the first text event (NaN if none)
     * @param gapsSeconds  between consecutive text events
     * @param usage        the usage object, when asked for and sent
     * @param cancelled    the client closed the stream itself
     * @param error        the error message of an error body or event, null if none
     */
    public record Trace(int status, String finishReason, boolean done, int chunks, double ttftSeconds,
                        double[] gapsSeconds, JsonNode usage, boolean cancelled, String error, double totalSeconds) {
        public int completionTokens() {
            return usage == null ? -1 : usage.path("completion_tokens").asInt(-1);
        }

        public int cachedTokens() {
            return usage == null ? -1 : usage.path("prompt_tokens_details").path("cached_tokens").asInt(-1);
        }
    }

    private final HttpClient http;
    private final URI base;
    private final String apiKey;

    public SseClient(URI base, String apiKey) {
        this.base = base;
        this.apiKey = apiKey;
        this.http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(10)).build();
    }

    /**
     * Posts body (which should ask for "stream": true) to path and reads the events, closing the stream after
     * cancelAfterChunks text events (never when negative; 0 closes it as soon as the response starts).
     */
    public Trace stream(String path, ObjectNode body, int cancelAfterChunks, Duration timeout) {
        HttpRequest.Builder rb = HttpRequest.newBuilder(base.resolve(path)).timeout(timeout)
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(Json.write(body)));
        if (apiKey != null) {
            rb.header("Authorization", "Bearer " + apiKey);
        }
        long t0 = System.nanoTime();
        HttpResponse<InputStream> res;
        try {
            res = http.send(rb.build(), HttpResponse.BodyHandlers.ofInputStream());
        } catch (IOException e) {
            return failed(0, "request failed: " + e, t0);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return failed(0, "interrupted", t0);
        }
        try (InputStream in = res.body()) {
            if (res.statusCode() != 200) {
                String text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
                String message;
                try {
                    message = Json.MAPPER.readTree(text).path("error").path("message").asText(text);
                } catch (IOException e) {
                    message = "not JSON: " + text;
                }
                return new Trace(res.statusCode(), null, false, 0, Double.NaN, new double[0], null, false, message,
                        (System.nanoTime() - t0) / 1e9);
            }
            if (cancelAfterChunks == 0) {
                return new Trace(200, null, false, 0, Double.NaN, new double[0], null, true, null,
                        (System.nanoTime() - t0) / 1e9);
            }
            BufferedReader reader = new BufferedReader(new InputStreamReader(in, StandardCharsets.UTF_8));
            int chunks = 0;
            double ttft = Double.NaN;
            double[] gaps = new double[64];
            int gapCount = 0;
            long last = 0;
            String finish = null;
            JsonNode usage = null;
            String error = null;
            boolean done = false;
            for (String line = reader.readLine(); line != null; line = reader.readLine()) {
                if (!line.startsWith("data: ")) {
                    continue;
                }
                String data = line.substring(6);
                if (data.equals("[DONE]")) {
                    done = true;
                    break;
                }
                JsonNode ev = Json.MAPPER.readTree(data);
                if (ev.has("error")) {
                    error = ev.path("error").path("message").asText();
                    continue;
                }
                if (ev.hasNonNull("usage")) {
                    usage = ev.get("usage");
                }
                JsonNode choice = ev.path("choices").path(0);
                if (choice.isMissingNode()) {
                    continue;
                }
                String text = choice.has("delta") ? choice.path("delta").path("content").asText("")
                        : choice.path("text").asText("");
                if (!text.isEmpty()) {
                    long now = System.nanoTime();
                    if (chunks == 0) {
                        ttft = (now - t0) / 1e9;
                    } else {
                        if (gapCount == gaps.length) {
                            gaps = Arrays.copyOf(gaps, gapCount * 2);
                        }
                        gaps[gapCount++] = (now - last) / 1e9;
                    }
                    last = now;
                    chunks++;
                    if (cancelAfterChunks > 0 && chunks >= cancelAfterChunks) {
                        return new Trace(200, null, false, chunks, ttft, Arrays.copyOf(gaps, gapCount), null, true,
                                null, (now - t0) / 1e9);
                    }
                }
                if (choice.hasNonNull("finish_reason")) {
                    finish = choice.get("finish_reason").asText();
                }
            }
            return new Trace(200, finish, done, chunks, ttft, Arrays.copyOf(gaps, gapCount), usage, false, error,
                    (System.nanoTime() - t0) / 1e9);
        } catch (IOException e) {
            return failed(res.statusCode(), "reading the stream failed: " + e, t0);
        }
    }

    private static Trace failed(int status, String error, long t0) {
        return new Trace(status, null, false, 0, Double.NaN, new double[0], null, false, error,
                (System.nanoTime() - t0) / 1e9);
    }
}
