package dev.kvant.server;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;

import java.io.IOException;

/** The server's one JSON mapper: strict about what it reads (one value, no duplicate keys). */
final class Json {
    static final ObjectMapper MAPPER = JsonMapper.builder()
            .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS)
            .enable(JsonParser.Feature.STRICT_DUPLICATE_DETECTION)
            .build();

    private Json() {
    }

    /** The request body as a JSON object, or a 400 saying where it is malformed. */
    static JsonNode parseObject(byte[] body) {
        if (body.length == 0) {
            throw ApiException.invalid(null, "the request body is empty; send a JSON object");
        }
        JsonNode node;
        try {
            node = MAPPER.readTree(body);
        } catch (JsonProcessingException e) {
            String where = e.getLocation() != null
                    ? " at line " + e.getLocation().getLineNr() + ", column " + e.getLocation().getColumnNr() : "";
            throw ApiException.invalid(null, "the request body is not valid JSON" + where + ": " + e.getOriginalMessage());
        } catch (IOException e) {
            throw ApiException.invalid(null, "the request body could not be read: " + e.getMessage());
        }
        if (node == null || !node.isObject()) {
            throw ApiException.invalid(null, "the request body must be a JSON object");
        }
        return node;
    }

    static String write(Object value) {
        try {
            return MAPPER.writeValueAsString(value);
        } catch (JsonProcessingException e) {
            throw new IllegalStateException("cannot write JSON", e);
        }
    }
}
