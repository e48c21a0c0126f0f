package dev.kvant.sample;

import java.util.Arrays;
import java.util.SplittableRandom;

/** Picks the next token from logits under a {@link SamplerConfig}; deterministic for a given seed. */
public final class Sampler {

    private final SamplerConfig config;
    private final SplittableRandom random;
    private final int[] recent;
    private int recentCount;
    private int recentHead;

    public Sampler(SamplerConfig config) {
        this.config = config;
        this.random = new SplittableRandom(config.seed());
        this.recent = new int[Math.max(1, config.repeatLastN())];
    }

    /** Records a token of the context (prompt or generated) for the repetition penalty. */
    /**
     * Whether this sampler always takes the largest logit (greedy, no repetition penalty): then the choice can be made
     * where the model runs and the logits need not be copied out.
     */
    public boolean argmaxSuffices() {
        return config.isGreedy() && (config.repeatPenalty() == 1f || config.repeatLastN() == 0);
    }

    public void accept(int token) {
        recent[recentHead] = token;
        recentHead = (recentHead + 1) % recent.length;
        recentCount = Math.min(recentCount + 1, recent.length);
    }

    /** Chooses a token; the logits array may be modified. */
    public int sample(float[] logits, int vocab) {
        if (config.repeatPenalty() != 1f && config.repeatLastN() > 0) {
            penalize(logits);
        }
        if (config.isGreedy()) {
            return argmax(logits, vocab);
        }
        Integer[] order = new Integer[vocab];
        for (int i = 0; i < vocab; i++) {
            order[i] = i;
        }
        // Ties break towards the lower id, so the order never depends on the sort's stability.
        Arrays.sort(order, (a, b) -> logits[a] != logits[b] ? Float.compare(logits[b], logits[a]) : a - b);
        int keep = config.topK() > 0 ? Math.min(config.topK(), vocab) : vocab;
        double max = logits[order[0]];
        double[] p = new double[keep];
        double sum = 0;
        for (int i = 0; i < keep; i++) {
            p[i] = Math.exp(logits[order[i]] - max);
            sum += p[i];
        }
        if (config.topP() < 1f) {
            double cum = 0;
            for (int i = 0; i < keep; i++) {
                cum += p[i] / sum;
                if (cum >= config.topP()) {
                    keep = i + 1;
                    break;
                }
            }
        }
        if (config.minP() > 0f) {
            int k = 1;
            while (k < keep && p[k] >= config.minP() * p[0]) {
                k++;
            }
            keep = k;
        }
        double total = 0;
        double[] w = new double[keep];
        for (int i = 0; i < keep; i++) {
            w[i] = Math.exp((logits[order[i]] - max) / config.temperature());
            total += w[i];
        }
        double r = random.nextDouble() * total;
        for (int i = 0; i < keep; i++) {
            r -= w[i];
            if (r < 0) {
                return order[i];
            }
        }
        return order[keep - 1];
    }

    private void penalize(float[] logits) {
        boolean[] seen = new boolean[logits.length];
        for (int i = 0; i < recentCount; i++) {
            int t = recent[i];
            if (t >= 0 && t < logits.length && !seen[t]) {
                seen[t] = true;
                float v = logits[t];
                logits[t] = v > 0 ? v / config.repeatPenalty() : v * config.repeatPenalty();
            }
        }
    }

    public static int argmax(float[] logits, int vocab) {
        int best = 0;
        for (int i = 1; i < vocab; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        return best;
    }
}
