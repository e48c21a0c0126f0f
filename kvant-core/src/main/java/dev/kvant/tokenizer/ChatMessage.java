package dev.kvant.tokenizer;

import java.util.Objects;

/**
 * One turn of a conversation.
 *
 * @param role    {@code "system"}, {@code "user"} or {@code "assistant"} (the chatml, qwen and llama3 formats pass other roles through)
 * @param content the text of the turn
 */
public record ChatMessage(String role, String content) {
    public ChatMessage {
        Objects.requireNonNull(role, "role");
        Objects.requireNonNull(content, "content");
    }

    public static ChatMessage system(String content) {
        return new ChatMessage("system", content);
    }

    public static ChatMessage user(String content) {
        return new ChatMessage("user", content);
    }

    public static ChatMessage assistant(String content) {
        return new ChatMessage("assistant", content);
    }
}
