package dev.kvant.server;

import dev.kvant.engine.EngineStats;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;

/** What {@code GET /metrics} reports, in the Prometheus text format: the server's counters and the engine's state. */
public final class Metrics {
    private static final double[] LATENCY_BOUNDS = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
            120, 300};

    private final ConcurrentHashMap<String, LongAdder> requests = new ConcurrentHashMap<>();
    private final LongAdder disconnects = new LongAdder();
    private final LongAdder rejected = new LongAdder();
    private final LongAdder failedAfterStatus = new LongAdder();
    final Histogram timeToFirstToken = new Histogram("kvant_time_to_first_token_seconds",
            "From a completion request's arrival to its first generated token.", LATENCY_BOUNDS);
    /** A decode step takes milliseconds (2.4-3.2 ms at batch 1 on an H200): bounds from half a millisecond. */
    private static final double[] TOKEN_GAP_BOUNDS = {0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.125,
            0.25, 0.5, 1, 2.5};
    final Histogram interTokenLatency = new Histogram("kvant_inter_token_latency_seconds",
            "Between consecutive generated tokens of one request.", TOKEN_GAP_BOUNDS);
    final Histogram requestDuration = new Histogram("kvant_request_duration_seconds",
            "From a request's arrival to its last byte, every endpoint.", LATENCY_BOUNDS);

    void request(String endpoint, int status) {
        requests.computeIfAbsent(endpoint + "\u0000" + status, k -> new LongAdder()).increment();
    }

    void disconnect() {
        disconnects.increment();
    }

    void rejected() {
        rejected.increment();
    }

    void failedAfterStatus() {
        failedAfterStatus.increment();
    }

    /** Completions that failed after their status (200) had gone out, the error written in the body. */
    public long failuresAfterStatus() {
        return failedAfterStatus.sum();
    }

    /** Requests answered so far with this endpoint and status. */
    public long requests(String endpoint, int status) {
        LongAdder a = requests.get(endpoint + "\u0000" + status);
        return a == null ? 0 : a.sum();
    }

    public long disconnects() {
        return disconnects.sum();
    }

    /** The exposition text. */
    String render(EngineStats s) {
        StringBuilder sb = new StringBuilder(4096);
        sb.append("# HELP kvant_requests_total HTTP requests answered, by endpoint and status.\n");
        sb.append("# TYPE kvant_requests_total counter\n");
        Map<String, Long> sorted = new TreeMap<>();
        requests.forEach((k, v) -> sorted.put(k, v.sum()));
        sorted.forEach((k, v) -> {
            int z = k.indexOf('\u0000');
            sb.append("kvant_requests_total{endpoint=\"").append(k, 0, z).append("\",code=\"").append(k.substring(z + 1))
                    .append("\"} ").append(v).append('\n');
        });
        counter(sb, "kvant_client_disconnects_total", "Requests whose client went away before the end.",
                disconnects.sum());
        counter(sb, "kvant_requests_failed_after_status_total", "Completions that failed after their status (200)"
                + " had gone out: counted under 200 above, the error written in the body.", failedAfterStatus.sum());
        counter(sb, "kvant_requests_rejected_total", "Requests refused because the queue was full or the server was"
                + " shutting down.", rejected.sum());
        counter(sb, "kvant_prompt_tokens_total", "Prompt tokens of started requests.", s.promptTokens());
        counter(sb, "kvant_prompt_cached_tokens_total", "Prompt tokens taken from the prefix cache, not computed.",
                s.cachedTokens());
        counter(sb, "kvant_generated_tokens_total", "Tokens generated.", s.generatedTokens());
        counter(sb, "kvant_prefix_cache_hits_total", "Requests that reused a cached prefix.", s.prefixHits());
        counter(sb, "kvant_prefix_cache_misses_total", "Requests that found no cached prefix.", s.prefixMisses());
        counter(sb, "kvant_engine_steps_total", "Engine steps run.", s.steps());
        counter(sb, "kvant_engine_decode_steps_total", "Engine steps that decoded at least one sequence.",
                s.decodeSteps());
        counter(sb, "kvant_engine_decode_rows_total", "Sequences decoded, summed over steps.", s.decodeRows());
        gauge(sb, "kvant_queue_depth", "Requests waiting for a slot.", s.waiting());
        gauge(sb, "kvant_running_sequences", "Sequences reading their prompt or generating.", s.running());
        gauge(sb, "kvant_prefix_cache_entries", "Sequences kept for prefix reuse.", s.cachedPrefixes());
        gauge(sb, "kvant_kv_pages_capacity", "Pages of the KV pool.", s.totalPages());
        gauge(sb, "kvant_kv_pages_used", "Pages held by sequences or cached prefixes.", s.usedPages());
        gauge(sb, "kvant_kv_pages_free", "Pages free.", s.freePages());
        timeToFirstToken.write(sb);
        interTokenLatency.write(sb);
        requestDuration.write(sb);
        return sb.toString();
    }

    private static void counter(StringBuilder sb, String name, String help, long v) {
        sb.append("# HELP ").append(name).append(' ').append(help).append('\n');
        sb.append("# TYPE ").append(name).append(" counter\n");
        sb.append(name).append(' ').append(v).append('\n');
    }

    private static void gauge(StringBuilder sb, String name, String help, long v) {
        sb.append("# HELP ").append(name).append(' ').append(help).append('\n');
        sb.append("# TYPE ").append(name).append(" gauge\n");
        sb.append(name).append(' ').append(v).append('\n');
    }
}
