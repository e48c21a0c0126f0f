package dev.kvant.server;

import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * A request the server refuses, with the HTTP status and the OpenAI-style error body
 * ({@code {"error": {"message", "type", "param", "code"}}}) that says what to change.
 */
public final class ApiException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final int status;
    private final String type;
    private final String param;
    private final String code;
    private final int retryAfterSeconds;

    public ApiException(int status, String type, String param, String code, String message, int retryAfterSeconds) {
        super(message);
        this.status = status;
        this.type = type;
        this.param = param;
        this.code = code;
        this.retryAfterSeconds = retryAfterSeconds;
    }

    /** 400: the request names param wrongly. */
    public static ApiException invalid(String param, String message) {
        return new ApiException(400, "invalid_request_error", param, null, message, 0);
    }

    /** 400: a feature of the API that kvant does not offer. */
    public static ApiException unsupported(String param, String message) {
        return new ApiException(400, "invalid_request_error", param, "unsupported_parameter", message, 0);
    }

    public int status() {
        return status;
    }

    /** Seconds a client should wait before retrying; 0 when retrying will not help. */
    public int retryAfterSeconds() {
        return retryAfterSeconds;
    }

    public ObjectNode toJson() {
        return body(getMessage(), type, param, code);
    }

    static ObjectNode body(String message, String type, String param, String code) {
        ObjectNode root = Json.MAPPER.createObjectNode();
        ObjectNode e = root.putObject("error");
        e.put("message", message);
        e.put("type", type);
        e.put("param", param);
        e.put("code", code);
        return root;
    }
}
