package dev.kvant.sample;

import dev.kvant.tensor.Exp;

import java.util.Arrays;
import java.util.SplittableRandom;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorSpecies;

/** Picks the next token from logits under a {@link SamplerConfig}; deterministic for a given seed. */
public final class Sampler {

    private final SamplerConfig config;
    private final SplittableRandom random;
    private final int[] recent;
    private int recentCount;
    private int recentHead;
    /** The weights of a draw over the whole vocabulary, reused. */
    private float[] weights = new float[0];

    public Sampler(SamplerConfig config) {
        this.config = config;
        this.random = new SplittableRandom(config.seed());
        this.recent = new int[Math.max(1, config.repeatLastN())];
    }

    /**
     * Whether this sampler always takes the largest logit (greedy, no repetition penalty): then the choice can be made
     * where the model runs and the logits need not be copied out.
     */
    public boolean argmaxSuffices() {
        return config.isGreedy() && !config.penalizes();
    }

    /**
     * Whether this sampler's draw can be made where the model runs ({@link #nextDraw}), so that the logits need not
     * be copied out: a draw at a temperature of at least {@link #LEAST_DRAWN_TEMPERATURE}, and a top-k of at most
     * {@link dev.kvant.backend.Draws#MAX_TOP_K} or none (then no top-p: ranking the whole vocabulary for it stays on
     * the host); min-p either way; or greedy with a penalty. A penalty goes along where its window is at most {@link
     * dev.kvant.backend.Draws#MAX_PENALIZED} tokens.
     */
    public boolean drawsWhereTheModelRuns(int vocab) {
        if (config.penalizes() && config.repeatLastN() > dev.kvant.backend.Draws.MAX_PENALIZED) {
            return false;
        }
        if (config.isGreedy()) {
            return config.penalizes();   // greedy without one: the argmax (argmaxSuffices)
        }
        if (config.temperature() < LEAST_DRAWN_TEMPERATURE) {
            return false;
        }
        int k = drawTopK(vocab);
        return k > 0 ? k <= dev.kvant.backend.Draws.MAX_TOP_K : config.topP() >= 1f;
    }

    /** The top-k a draw made where the model runs takes ({@link #drawsWhereTheModelRuns}): 0 where it is off. */
    public int drawTopK(int vocab) {
        return config.topK() > 0 && config.topK() < vocab ? config.topK() : 0;
    }

    /**
     * Below this temperature a draw stays on the host, which takes the logits less their maximum before dividing: a
     * device draw scales them as they are (l / T), which overflows as T nears 0.
     */
    public static final float LEAST_DRAWN_TEMPERATURE = 1e-3f;

    /**
     * The key of a draw made elsewhere ({@link dev.kvant.backend.Draws}): the next number of this sampler's seeded
     * generator, so a seed gives the same keys, and the same tokens, every time.
     */
    public long nextDrawKey() {
        return random.nextLong();
    }

    /**
     * The draw of one sequence's next token where the model runs ({@link #drawsWhereTheModelRuns} must hold): this
     * sampler's temperature, filters and penalty, and its next key ({@link #nextDrawKey}; greedy with a penalty takes
     * none: the key is 0 and the generator does not move, as on the host).
     */
    public dev.kvant.backend.Draws nextDraw(int vocab) {
        if (!drawsWhereTheModelRuns(vocab)) {
            throw new IllegalStateException("this sampler draws on the host: " + config);
        }
        boolean greedy = config.isGreedy();
        int k = greedy ? 0 : drawTopK(vocab);
        return new dev.kvant.backend.Draws(new float[] {config.temperature()}, new long[] {greedy ? 0L : nextDrawKey()},
                new int[][] {null}, new int[] {k}, new float[] {k > 0 ? config.topP() : 1f},
                new float[] {greedy ? 0f : config.minP()},
                new dev.kvant.backend.Draws.Penalty[] {config.penalizes() ? penalty() : null});
    }

    /**
     * The repetition penalties of the next token as a draw made elsewhere applies them: this sampler's settings and
     * the distinct ids of its window, ascending, with how often each is there (what {@link #sample} penalizes).
     */
    public dev.kvant.backend.Draws.Penalty penalty() {
        int[] window = Arrays.copyOf(recent, recentCount);
        Arrays.sort(window);
        int[] ids = new int[window.length];
        int[] counts = new int[window.length];
        int n = 0;
        for (int i = 0; i < window.length; ) {
            int j = i + 1;
            while (j < window.length && window[j] == window[i]) {
                j++;
            }
            if (window[i] >= 0) {
                ids[n] = window[i];
                counts[n++] = j - i;
            }
            i = j;
        }
        return new dev.kvant.backend.Draws.Penalty(config.repeatPenalty(), config.frequencyPenalty(),
                config.presencePenalty(), Arrays.copyOf(ids, n), Arrays.copyOf(counts, n));
    }

    /** Records a token of the context (prompt or generated) for the repetition penalty. */
    public void accept(int token) {
        recent[recentHead] = token;
        recentHead = (recentHead + 1) % recent.length;
        recentCount = Math.min(recentCount + 1, recent.length);
    }

    /**
     * Makes the repetition window the last tokens of {@code context[0..length)}, as if this sampler had accepted only
     * those: a conversation that dropped or re-rendered its earlier turns penalizes what its context now holds, not
     * tokens it no longer has. The random draws go on where they were.
     */
    public void restartWindow(int[] context, int length) {
        if (length < 0 || length > context.length) {
            throw new IllegalArgumentException("window of " + length + " tokens out of " + context.length);
        }
        recentCount = 0;
        recentHead = 0;
        for (int i = Math.max(0, length - recent.length); i < length; i++) {
            accept(context[i]);
        }
    }

    /**
     * Chooses a token; the logits array may be modified. The kept candidates are ranked by logit (ties to the lower
     * id) and drawn from in that order, as llama.cpp's chain does; without top-k the whole vocabulary is not sorted:
     * top-p needs only the candidates that reach it and min-p only those above its cut, and with neither the draw
     * walks the ids in order (the same distribution; one pass, no ranking).
     */
    public int sample(float[] logits, int vocab) {
        if (config.penalizes()) {
            penalize(logits);
        }
        if (config.isGreedy()) {
            return argmax(logits, vocab);
        }
        if (config.topK() > 0 && config.topK() < vocab) {
            return draw(logits, best(logits, vocab, config.topK()), -1);
        }
        int top = argmax(logits, vocab);
        float max = logits[top];
        if (max == Float.POSITIVE_INFINITY || !(max > Float.NEGATIVE_INFINITY)) {
            return top;   // an infinite logit wins (the lowest id of them); all -inf or NaN: greedy's choice
        }
        if (config.topP() >= 1f && config.minP() <= 0f) {
            return drawInIdOrder(logits, vocab, max);
        }
        // The candidates that can be kept: those above min-p's cut (exp(l - max) >= minP), and of them the largest
        // until their probability reaches top-p — found by lowering a floor until the candidates above it hold
        // that much (every one below it is smaller than every one above).
        double sum = 0;   // the probability mass of the whole vocabulary, in id order
        if (config.topP() < 1f) {
            if (weights.length < vocab) {
                weights = new float[vocab];
            }
            Exp.expScaled(logits, max, 1f, weights, vocab);
            for (int i = 0; i < vocab; i++) {
                float w = weights[i];
                if (w > 0) {
                    sum += w;
                }
            }
        }
        double minCut = config.minP() > 0f ? max + Math.log(config.minP()) : Double.NEGATIVE_INFINITY;
        int[] order = null;
        for (double gap = 4; ; gap *= 2) {
            // without top-p, min-p's cut is the floor at once (a min-p below e^-4 was cut at max - 4: min-p 0.01
            // kept only the logits within 4 of the largest)
            double floor = config.topP() >= 1f ? minCut : Math.max(max - gap, minCut);
            order = above(logits, vocab, floor);
            if (floor == minCut || floor == Double.NEGATIVE_INFINITY
                    || order.length == vocab || reaches(order, weights, config.topP() * sum)) {
                break;
            }
            if (gap > 1e6) {
                order = above(logits, vocab, Double.NEGATIVE_INFINITY);
                break;
            }
        }
        return draw(logits, order, sum);
    }

    /**
     * Whether the probability mass of {@code order} reaches {@code target}: its weights (exp(l - max), as the
     * vocabulary's total was summed) added up.
     */
    private static boolean reaches(int[] order, float[] weights, double target) {
        double mass = 0;
        for (int id : order) {
            mass += weights[id];
        }
        return mass >= target;
    }

    /** The ids whose logit is at least {@code floor} (NaN never), ranked as {@link #best} ranks them. */
    private static int[] above(float[] logits, int vocab, double floor) {
        long[] keys = new long[16];
        int n = 0;
        for (int i = 0; i < vocab; i++) {
            float l = logits[i];
            if (l >= floor) {
                if (n == keys.length) {
                    keys = Arrays.copyOf(keys, 2 * n);
                }
                keys[n++] = key(l, i);
            }
        }
        Arrays.sort(keys, 0, n);
        int[] ids = new int[n];
        for (int i = 0; i < n; i++) {
            ids[i] = (int) (0xFFFFFFFFL - (keys[n - 1 - i] & 0xFFFFFFFFL));
        }
        return ids;
    }

    /**
     * Temperature alone: the weights of all ids in one vector pass (the kernels' float exponential, kept for the
     * draw), their total in id order (in double), then a walk to the draw.
     */
    private int drawInIdOrder(float[] logits, int vocab, float max) {
        if (weights.length < vocab) {
            weights = new float[vocab];
        }
        Exp.expScaled(logits, max, (float) (1.0 / config.temperature()), weights, vocab);
        double total = 0;
        for (int i = 0; i < vocab; i++) {
            float w = weights[i];
            if (w > 0) {   // a NaN logit's NaN weight is no weight
                total += w;
            }
        }
        double r = random.nextDouble() * total;
        int last = 0;
        for (int i = 0; i < vocab; i++) {
            float w = weights[i];
            if (w > 0) {
                last = i;
                r -= w;
                if (r < 0) {
                    return i;
                }
            }
        }
        return last;
    }

    /**
     * Top-p (over {@code sum}, the mass of the whole vocabulary, or of {@code order} when negative), then min-p, then
     * a draw at the temperature from the candidates of {@code order}, largest first.
     */
    private int draw(float[] logits, int[] order, double sum) {
        int keep = order.length;
        double max = logits[order[0]];
        if (max == Double.POSITIVE_INFINITY || !(max > Double.NEGATIVE_INFINITY)) {
            // an infinite logit outweighs every finite one (the lowest id of them wins); all -inf or NaN: no
            // distribution to draw from — the first in order, as greedy would take
            return order[0];
        }
        double[] p = new double[keep];
        double mass = 0;
        for (int i = 0; i < keep; i++) {
            float l = logits[order[i]];
            p[i] = Float.isNaN(l) ? 0 : Math.exp(l - max);   // a NaN logit carries no weight
            mass += p[i];
        }
        if (sum < 0) {
            sum = mass;
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
            int i = 0;
            for (; i < vocab && size < keep; i++) {
                heap[size] = key(logits[i], i);
                siftUp(heap, size++);
            }
            // Past the first keep ids, only a logit above the heap's least can enter (an equal one comes with a
            // higher id, which ranks below it; a NaN ranks below every number): whole vectors of smaller logits are
            // passed over with one comparison, and the keys decide for the lanes that pass.
            int least = leastId(heap);
            for (; i + LANES <= vocab; i += LANES) {
                FloatVector v = FloatVector.fromArray(SPECIES, logits, i);
                float thr = logits[least];
                VectorMask<Float> pass = Float.isNaN(thr) ? v.compare(VectorOperators.EQ, v)
                        : v.compare(VectorOperators.GT, thr);
                if (pass.anyTrue()) {
                    for (int j = i; j < i + LANES; j++) {
                        long key = key(logits[j], j);
                        if (key > heap[0]) {
                            heap[0] = key;
                            siftDown(heap, keep);
                            least = leastId(heap);
                        }
                    }
                }
            }
            for (; i < vocab; i++) {
                long key = key(logits[i], i);
                if (key > heap[0]) {
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

    private static final VectorSpecies<Float> SPECIES = FloatVector.SPECIES_PREFERRED;
    private static final int LANES = SPECIES.length();

    /** The id of the least of a heap of keys ({@link #key}). */
    private static int leastId(long[] heap) {
        return (int) (0xFFFFFFFFL - (heap[0] & 0xFFFFFFFFL));
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

    /**
     * Each token of the window once, as llama.cpp's penalties sampler: the repeat penalty, then the frequency penalty
     * times its count and the presence penalty subtracted (the window sorted, so no vocabulary-sized scratch).
     */
    private void penalize(float[] logits) {
        penalize(penalty(), logits, 0, logits.length);
    }

    /**
     * Applies a penalty to the logits of one row, {@code logits[off .. off + vocab)}: each of its ids' l becomes
     * (l > 0 ? l / repeat : l · repeat) − (count · frequency + presence), in float, as a device draw does.
     */
    public static void penalize(dev.kvant.backend.Draws.Penalty p, float[] logits, int off, int vocab) {
        for (int i = 0; i < p.ids().length; i++) {
            int t = p.ids()[i];
            if (t < vocab) {
                float v = logits[off + t];
                v = v > 0 ? v / p.repeat() : v * p.repeat();
                logits[off + t] = v - (p.counts()[i] * p.frequency() + p.presence());
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
