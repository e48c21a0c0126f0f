package dev.kvant.cli;

import dev.kvant.sample.SamplerConfig;
import picocli.CommandLine.Option;

/** Sampler options; llama.cpp's names and defaults. */
final class SamplingOptions {

    @Option(names = "--temp", paramLabel = "T", defaultValue = "0.8",
            description = "temperature, 0 or below = greedy (default ${DEFAULT-VALUE})")
    float temperature;

    @Option(names = "--top-k", paramLabel = "K", defaultValue = "40", description = "top-k, 0 = off (default ${DEFAULT-VALUE})")
    int topK;

    @Option(names = "--top-p", paramLabel = "P", defaultValue = "0.95", description = "top-p, 1 = off, 0 = greedy (default ${DEFAULT-VALUE})")
    float topP;

    @Option(names = "--min-p", paramLabel = "P", defaultValue = "0.05", description = "min-p, 0 = off (default ${DEFAULT-VALUE})")
    float minP;

    @Option(names = "--repeat-penalty", paramLabel = "R", defaultValue = "1.0",
            description = "repetition penalty, 1 = off (default ${DEFAULT-VALUE})")
    float repeatPenalty;

    @Option(names = "--repeat-last-n", paramLabel = "N", defaultValue = "64",
            description = "tokens the penalties look back, -1 = the whole context (default ${DEFAULT-VALUE})")
    int repeatLastN;

    @Option(names = "--frequency-penalty", paramLabel = "F", defaultValue = "0.0",
            description = "subtracted from a recent token's logit for each time it occurs, 0 = off"
                    + " (default ${DEFAULT-VALUE})")
    float frequencyPenalty;

    @Option(names = "--presence-penalty", paramLabel = "P", defaultValue = "0.0",
            description = "subtracted once from the logit of a token in the window, 0 = off (default ${DEFAULT-VALUE})")
    float presencePenalty;

    @Option(names = {"-s", "--seed"}, paramLabel = "S", description = "random seed (default: random)")
    Long seed;

    /** The sampling options checked before a model is loaded: a value out of range is a usage error. */
    void check() {
        UsageException.parsing(() -> config(1 << 20));
    }

    /**
     * The settings for a context of {@code contextLength} tokens, read as llama.cpp reads them: a temperature of 0 or
     * below, or top-p 0, is greedy; a repetition window of -1 is the whole context, and none is longer than it.
     */
    SamplerConfig config(int contextLength) {
        // checked as given, before a greedy run replaces them (a top-p of 5 is a mistake whatever the temperature)
        if (Float.isNaN(temperature)) {
            throw new IllegalArgumentException("--temp must be a number, got NaN");
        }
        if (!(topP >= 0f && topP <= 1f)) {
            throw new IllegalArgumentException("--top-p must be in [0, 1], got " + topP);
        }
        // named by their options here: SamplerConfig's own checks name its settings ("the sampler's top-k")
        if (topK < 0) {
            throw new IllegalArgumentException("--top-k must be at least 0 (0 is off), got " + topK);
        }
        if (!(minP >= 0f && minP <= 1f)) {
            throw new IllegalArgumentException("--min-p must be in [0, 1] (0 is off), got " + minP);
        }
        if (!(repeatPenalty > 0f) || Float.isInfinite(repeatPenalty)) {
            throw new IllegalArgumentException("--repeat-penalty must be a finite number above 0 (1 is off), got "
                    + repeatPenalty);
        }
        if (!Float.isFinite(frequencyPenalty)) {
            throw new IllegalArgumentException("--frequency-penalty must be a finite number (0 is off), got "
                    + frequencyPenalty);
        }
        if (!Float.isFinite(presencePenalty)) {
            throw new IllegalArgumentException("--presence-penalty must be a finite number (0 is off), got "
                    + presencePenalty);
        }
        if (repeatLastN < -1) {
            throw new IllegalArgumentException("--repeat-last-n must be -1 (the whole context) or at least 0, got "
                    + repeatLastN);
        }
        long s = seed != null ? seed : new java.security.SecureRandom().nextLong();
        boolean greedy = temperature <= 0 || topP == 0;
        int window = repeatLastN == -1 ? contextLength : Math.min(repeatLastN, contextLength);
        return new SamplerConfig(greedy ? 0f : temperature, topK, greedy ? 1f : topP, minP, repeatPenalty, window,
                frequencyPenalty, presencePenalty, s);
    }
}
