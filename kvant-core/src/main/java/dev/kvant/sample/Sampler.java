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
        int keep = config.topK() > 0 ? Math.min(config.topK(), vocab) : vocab;
        int[] order = best(logits, vocab, keep);   // a NaN logit ranks below every number
        double max = logits[order[0]];
        if (max == Double.POSITIVE_INFINITY || !(max > Double.NEGATIVE_INFINITY)) {
            // an infinite logit outweighs every finite one (the lowest id of them wins); all -inf or NaN: no
            // distribution to draw from — the first in order, as greedy would take
            return order[0];
        }
        double[] p = new double[keep];
        double sum = 0;
        for (int i = 0; i < keep; i++) {
            float l = logits[order[i]];
            p[i] = Float.isNaN(l) ? 0 : Math.exp(l - max);   // a NaN logit carries no weight
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
            float l = logits[order[i]];
            w[i] = Float.isNaN(l) ? 0 : Math.exp((l - max) / config.temperature());
            total += w[i];
        }
        if (!(total > 0) || Double.isInfinite(total)) {   // NaN among the kept: no draw, the most likely
            return order[0];
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

    /**
     * The ids of the {@code keep} largest logits, largest first, ties to the lower id: what sorting every id by
     * (logit descending, id ascending) and taking the first {@code keep} gives, without boxing or sorting the whole
     * vocabulary. Each candidate is one long whose order is that order (the logit's bits made monotonic above, the
     * complement of the id below); a min-heap of {@code keep} longs selects them when keep is small.
     */
    static int[] best(float[] logits, int vocab, int keep) {
        long[] top;
        if (keep * 8L < vocab) {
            long[] heap = new long[keep];
            int size = 0;
            for (int i = 0; i < vocab; i++) {
                long key = key(logits[i], i);
                if (size < keep) {
                    heap[size] = key;
                    siftUp(heap, size++);
                } else if (key > heap[0]) {
                    heap[0] = key;
                    siftDown(heap, keep);
                }
            }
            top = heap;
        } else {
            top = new long[vocab];
            for (int i = 0; i < vocab; i++) {
                top[i] = key(logits[i], i);
            }
        }
        Arrays.sort(top);
        int[] ids = new int[keep];
        for (int i = 0; i < keep; i++) {
            ids[i] = (int) (0xFFFFFFFFL - (top[top.length - 1 - i] & 0xFFFFFFFFL));
        }
        return ids;
    }

    /**
     * Larger for a larger logit, then for a lower id; -0 counts as +0, as {@code ==} on floats has it, and NaN below
     * every number (never chosen over one).
     */
    private static long key(float logit, int id) {
        int bits = Float.floatToRawIntBits(logit == 0f ? 0f : logit);
        // NaN below every number, -infinity included
        long ordered = Float.isNaN(logit) ? 0 : (bits < 0 ? ~bits : bits | 0x80000000) & 0xFFFFFFFFL;
        return (ordered << 32 ^ Long.MIN_VALUE) | (0xFFFFFFFFL - id);
    }

    private static void siftUp(long[] heap, int i) {
        long v = heap[i];
        while (i > 0) {
            int parent = (i - 1) >>> 1;
            if (heap[parent] <= v) {
                break;
            }
            heap[i] = heap[parent];
            i = parent;
        }
        heap[i] = v;
    }

    private static void siftDown(long[] heap, int size) {
        long v = heap[0];
        int i = 0;
        while (true) {
            int child = 2 * i + 1;
            if (child >= size) {
                break;
            }
            if (child + 1 < size && heap[child + 1] < heap[child]) {
                child++;
            }
            if (heap[child] >= v) {
                break;
            }
            heap[i] = heap[child];
            i = child;
        }
        heap[i] = v;
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

    /** The id of the largest logit, the lowest among equal ones; a NaN below every number (id 0 if all are NaN). */
    public static int argmax(float[] logits, int vocab) {
        int best = 0;
        for (int i = 1; i < vocab; i++) {
            float v = logits[i];
            if (v > logits[best] || Float.isNaN(logits[best]) && !Float.isNaN(v)) {
                best = i;
            }
        }
        return best;
    }
}
