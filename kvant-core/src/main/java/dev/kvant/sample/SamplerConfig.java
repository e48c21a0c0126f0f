package dev.kvant.sample;

/**
 * How the next token is chosen. Temperature 0 is greedy. The filters apply in llama.cpp's default order: repetition
 * penalty, top-k, top-p, min-p, temperature, then a draw from the seeded generator.
 *
 * @param topK          keep the k most likely tokens (0 = off)
 * @param topP          keep the smallest set whose probability reaches p (1 = off)
 * @param minP          drop tokens less likely than minP times the most likely one (0 = off)
 * @param repeatPenalty divide positive (multiply negative) logits of recently seen tokens (1 = off)
 * @param repeatLastN   how many recent tokens the penalties look at
 * @param frequencyPenalty subtracted from a recent token's logit once for each time it occurs (0 = off)
 * @param presencePenalty  subtracted from a recent token's logit once (0 = off); both after the repeat penalty, as
 *                         llama.cpp's penalties sampler applies them: {@code l - (count·frequency + presence)}
 */
public record SamplerConfig(float temperature, int topK, float topP, float minP, float repeatPenalty, int repeatLastN,
                            float frequencyPenalty, float presencePenalty, long seed) {

    /** No frequency or presence penalty. */
    public SamplerConfig(float temperature, int topK, float topP, float minP, float repeatPenalty, int repeatLastN,
                         long seed) {
        this(temperature, topK, topP, minP, repeatPenalty, repeatLastN, 0f, 0f, seed);
    }

    public SamplerConfig {
        // each test is written so that NaN fails it
        if (!(temperature >= 0) || Float.isInfinite(temperature)) {
            throw invalid("temperature", "a finite number of at least 0", temperature);
        }
        if (topK < 0) {
            throw invalid("top-k", "at least 0 (0 is off)", topK);
        }
        if (!(topP > 0 && topP <= 1)) {
            throw invalid("top-p", "above 0 and at most 1 (1 is off)", topP);
        }
        if (!(minP >= 0 && minP <= 1)) {
            throw invalid("min-p", "between 0 and 1 (0 is off)", minP);
        }
        if (!(repeatPenalty > 0) || Float.isInfinite(repeatPenalty)) {
            throw invalid("repeat penalty", "a finite number above 0 (1 is off)", repeatPenalty);
        }
        if (repeatLastN < 0) {
            throw invalid("repeat-last-n", "at least 0", repeatLastN);
        }
        if (!Float.isFinite(frequencyPenalty)) {
            throw invalid("frequency penalty", "a finite number (0 is off)", frequencyPenalty);
        }
        if (!Float.isFinite(presencePenalty)) {
            throw invalid("presence penalty", "a finite number (0 is off)", presencePenalty);
        }
    }

    /** Whether any penalty changes the logits of recent tokens. */
    public boolean penalizes() {
        return repeatLastN > 0 && (repeatPenalty != 1f || frequencyPenalty != 0f || presencePenalty != 0f);
    }

    private static IllegalArgumentException invalid(String setting, String must, Object got) {
        return new IllegalArgumentException("the sampler's " + setting + " must be " + must + ", got " + got);
    }

    public static SamplerConfig greedy() {
        return new SamplerConfig(0f, 0, 1f, 0f, 1f, 64, 0);
    }

    /** llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no repetition penalty. */
    public static SamplerConfig defaults(long seed) {
        return new SamplerConfig(0.8f, 40, 0.95f, 0.05f, 1f, 64, seed);
    }

    public boolean isGreedy() {
        return temperature == 0f;
    }
}
