package dev.kvant.engine;

import dev.kvant.sample.SamplerConfig;

import java.util.Objects;
import java.util.function.IntPredicate;

/**
 * What one client asks the {@link Engine} for: a prompt of token ids, how many tokens at most to generate, how to
 * sample them, which tokens end the generation (the tokenizer's end-of-generation tokens; never any when
 * stopToken is null, as benchmarks that must generate exactly maxTokens want), and which tokens are never to be
 * generated (bannedToken, or none when null: a request that ignores end-of-generation tokens bans them, as
 * llama.cpp's ignore_eos makes them impossible to sample instead of printing their text).
 */
public record GenerationRequest(int[] prompt, int maxTokens, SamplerConfig sampling, IntPredicate stopToken,
                                IntPredicate bannedToken) {

    /** A request that bans no token. */
    public GenerationRequest(int[] prompt, int maxTokens, SamplerConfig sampling, IntPredicate stopToken) {
        this(prompt, maxTokens, sampling, stopToken, null);
    }

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

    /** The same request with a prompt array of its own. */
    GenerationRequest copy() {
        return new GenerationRequest(prompt, maxTokens, sampling, stopToken, bannedToken);
    }

    boolean stopsAt(int token) {
        return stopToken != null && stopToken.test(token);
    }
}
