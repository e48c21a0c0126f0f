package dev.kvant.engine;

import dev.kvant.sample.SamplerConfig;

import java.util.Objects;
import java.util.function.IntPredicate;

/**
 * What one client asks the {@link Engine} for: a prompt of token ids, how many tokens at most to generate, how to
 * sample them, and which tokens end the generation (the tokenizer's end-of-generation tokens; never any when
 * stopToken is null, as benchmarks that must generate exactly maxTokens want).
 */
public record GenerationRequest(int[] prompt, int maxTokens, SamplerConfig sampling, IntPredicate stopToken) {

    public GenerationRequest {
        Objects.requireNonNull(prompt, "prompt");
        Objects.requireNonNull(sampling, "sampling");
        if (prompt.length == 0) {
            throw new IllegalArgumentException("the prompt is empty");
        }
        if (maxTokens < 1) {
            throw new IllegalArgumentException("maxTokens must be at least 1, got " + maxTokens);
        }
        prompt = prompt.clone();
    }

    boolean stopsAt(int token) {
        return stopToken != null && stopToken.test(token);
    }
}
