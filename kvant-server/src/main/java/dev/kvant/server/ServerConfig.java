package dev.kvant.server;

import java.time.Duration;

/**
 * How the HTTP side of {@link KvantServer} listens.
 *
 * @param host            address to bind (127.0.0.1: this machine only)
 * @param port            TCP port; 0 picks a free one ({@link KvantServer#port()} says which)
 * @param apiKey          the bearer token every request but {@code /health} must carry; null for none
 * @param modelId         the name {@code /v1/models} and every response give the model
 * @param maxRequestBytes the largest request body accepted
 * @param heartbeat       how often a waiting response writes a keep-alive (an SSE comment, or a space before a JSON
 *                        body that takes long), which is how a client that went away is noticed; the first one, which
 *                        commits the status (200), comes a period after the request got its sequence, never while it
 *                        waits in the queue, so that a failure up to then gets a status of its own
 * @param writeTimeout    how long one write to a client may take before the response is cut (its generation
 *                        cancelled): a client that stops reading would otherwise hold its connection as long as it
 *                        stays connected ({@link WriteDeadline})
 */
public record ServerConfig(String host, int port, String apiKey, String modelId, long maxRequestBytes,
                           Duration heartbeat, Duration writeTimeout) {

    /** The write timeout of {@link #local} and of {@code kvant serve}. */
    public static final Duration DEFAULT_WRITE_TIMEOUT = Duration.ofSeconds(60);

    public ServerConfig {
        if (port < 0 || port > 65535) {
            throw new IllegalArgumentException("--port must be between 0 and 65535, got " + port);
        }
        if (apiKey != null && apiKey.isBlank()) {
            throw new IllegalArgumentException("--api-key must not be blank");
        }
        if (maxRequestBytes < 1024) {
            throw new IllegalArgumentException("the request size limit must be at least 1 KiB, got " + maxRequestBytes);
        }
        if (heartbeat.isNegative() || heartbeat.isZero()) {
            throw new IllegalArgumentException("the heartbeat must be positive, got " + heartbeat);
        }
        if (writeTimeout.isNegative() || writeTimeout.isZero()) {
            throw new IllegalArgumentException("the write timeout must be positive, got " + writeTimeout);
        }
    }

    /** Loopback, no key, 32 MiB requests, a heartbeat a second. */
    public static ServerConfig local(int port, String modelId) {
        return new ServerConfig("127.0.0.1", port, null, modelId, 32L << 20, Duration.ofSeconds(1),
                DEFAULT_WRITE_TIMEOUT);
    }

    public ServerConfig withApiKey(String key) {
        return new ServerConfig(host, port, key, modelId, maxRequestBytes, heartbeat, writeTimeout);
    }

    public ServerConfig withHeartbeat(Duration every) {
        return new ServerConfig(host, port, apiKey, modelId, maxRequestBytes, every, writeTimeout);
    }

    public ServerConfig withWriteTimeout(Duration limit) {
        return new ServerConfig(host, port, apiKey, modelId, maxRequestBytes, heartbeat, limit);
    }
}
