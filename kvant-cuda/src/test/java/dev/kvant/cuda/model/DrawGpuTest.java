package dev.kvant.cuda.model;

import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.TestSeed;
import dev.kvant.sample.Sampler;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.lang.foreign.MemorySegment;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The device's draws at a temperature ({@link ModelKernels#draw}) against the distribution they stand for: token t
 * with probability exp(l_t/T) / Σ exp(l/T). Many rows of the same logits, each with its own key, give the tokens'
 * frequencies; rows at temperature 0 keep their argmax key; the same keys give the same tokens again; a NaN logit is
 * never drawn and an infinite one always is.
 */
@Tag("gpu")
class DrawGpuTest extends ModelKernelsGpuFixture {
    /**
     * 64-bit words of a row's draw (kvant_draw): 1/T | banned count, key, 4 banned ids, top-k | top-p, min-p |
     * penalized count, repeat | frequency, presence.
     */
    private static final int DRAW_WORDS = ModelKernels.DRAW_BYTES / 8;
    /** Ints of a row's penalized ids: (id, count) pairs. */
    private static final int PENALTY_INTS = ModelKernels.PENALTY_BYTES / 4;

    @Test
    void drawsFollowTheTemperaturesDistributionAndRepeatForTheSameKeys() {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        int vocab = 3000;
        int rows = 16384;
        float temperature = 0.7f;
        float[] row = new float[vocab];
        for (int i = 0; i < vocab; i++) {
            row[i] = -7f + (float) random.nextDouble();   // a long tail, about 3% of the mass together
        }
        int[] heads = {5, 17, 1000, 2999, 1234, 42};
        for (int h = 0; h < heads.length; h++) {
            row[heads[h]] = (float) (h * 0.4 - 1.0);
        }
        row[77] = Float.NaN;
        double[] p = probabilities(row, temperature);
        float[] logits = new float[rows * vocab];
        long[] draws = new long[DRAW_WORDS * rows];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            System.arraycopy(row, 0, logits, r * vocab, vocab);
            boolean greedy = r % 16 == 15;
            draws[DRAW_WORDS * r] = greedy ? 0 : Float.floatToRawIntBits(1f / temperature) & 0xFFFFFFFFL;
            draws[DRAW_WORDS * r + 1] = random.nextLong();
            best[r] = 0x1234_5678_0000_0000L | r;   // a greedy row keeps whatever key it has
        }
        int[] first = drawAll(logits, vocab, draws, best);
        int[] again = drawAll(logits, vocab, draws, best);
        assertArrayEquals(first, again, "the same keys, the same tokens (seed " + seed + ")");
        int[] counts = new int[vocab];
        int sampled = 0;
        for (int r = 0; r < rows; r++) {
            if (r % 16 == 15) {
                assertEquals(ModelKernels.argmaxIndex(best[r]), first[r], "a greedy row's key is left alone");
                continue;
            }
            assertTrue(first[r] >= 0 && first[r] < vocab && first[r] != 77, "token " + first[r] + " (NaN: 77)");
            counts[first[r]]++;
            sampled++;
        }
        double tail = 1;
        for (int t : heads) {
            double expected = sampled * p[t];
            double sd = Math.sqrt(sampled * p[t] * (1 - p[t]));
            assertTrue(Math.abs(counts[t] - expected) <= 5 * sd + 2, "token " + t + ": " + counts[t]
                    + " draws, expected " + Math.round(expected) + " ± " + Math.round(sd) + " (seed " + seed + ")");
            tail -= p[t];
        }
        int tailCount = sampled;
        for (int t : heads) {
            tailCount -= counts[t];
        }
        double sd = Math.sqrt(sampled * tail * (1 - tail));
        assertTrue(Math.abs(tailCount - sampled * tail) <= 5 * sd + 2, "the tail: " + tailCount + " draws, expected "
                + Math.round(sampled * tail) + " (seed " + seed + ")");
    }

    @Test
    void anInfiniteLogitIsAlwaysDrawnAndANaNRowKeepsItsKey() {
        int vocab = 1000;
        float[] logits = new float[2 * vocab];
        logits[vocab + 10] = Float.POSITIVE_INFINITY;
        logits[vocab + 20] = Float.POSITIVE_INFINITY;
        java.util.Arrays.fill(logits, 0, vocab, Float.NaN);
        long[] draws = new long[DRAW_WORDS * 2];
        for (int r = 0; r < 2; r++) {
            draws[DRAW_WORDS * r] = Float.floatToRawIntBits(1f / 1.5f) & 0xFFFFFFFFL;
            draws[DRAW_WORDS * r + 1] = 99 + r;
        }
        long[] best = {7L, 7L};
        int[] ids = drawAll(logits, vocab, draws, best);
        assertEquals(ModelKernels.argmaxIndex(7L), ids[0], "all NaN: the row keeps its argmax key");
        assertEquals(10, ids[1], "the lowest id of the infinite logits");
    }

    /**
     * Banned ids are never chosen: at temperature 0 (greedy with ignore_eos) the largest other logit, the lowest id
     * among equal ones; drawn at a temperature, never one of them, however likely.
     */
    @Test
    void bannedIdsAreNeverChosen() {
        int vocab = 500;
        int rows = 256;
        float[] logits = new float[rows * vocab];
        long[] draws = new long[DRAW_WORDS * rows];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            logits[r * vocab + 3] = 9f;     // banned
            logits[r * vocab + 400] = 9f;   // banned
            logits[r * vocab + 42] = 5f;
            logits[r * vocab + 41] = 5f;
            boolean greedy = r % 2 == 0;
            draws[DRAW_WORDS * r] = (greedy ? 0 : Float.floatToRawIntBits(1f / 2f) & 0xFFFFFFFFL) | 2L << 32;
            draws[DRAW_WORDS * r + 1] = 1000 + r;
            draws[DRAW_WORDS * r + 2] = 3L | 400L << 32;
            best[r] = 0L;
        }
        int[] ids = drawAll(logits, vocab, draws, best);
        for (int r = 0; r < rows; r++) {
            if (r % 2 == 0) {
                assertEquals(41, ids[r], "greedy row " + r + ": the largest other logit, the lower id of two");
            } else {
                assertTrue(ids[r] != 3 && ids[r] != 400, "drawn row " + r + " took banned id " + ids[r]);
            }
        }
    }

    /**
     * Over a vocabulary of 131,072 ids with one token far above the rest (every other one e^-30 as likely: all of them
     * together about 1e-8), every draw takes that token. The Gumbel variate must be finite: with u reaching 1 it was
     * +inf for one id in 2^24, which made about one draw in 128 here a token at random.
     */
    @Test
    void noTokenComesAtRandomFromALargeVocabulary() {
        int vocab = 131072;
        int rows = 1024;
        float[] logits = new float[rows * vocab];
        java.util.Arrays.fill(logits, -30f);
        long[] draws = new long[DRAW_WORDS * rows];
        long[] best = new long[rows];
        SplittableRandom random = new SplittableRandom(TestSeed.next());
        for (int r = 0; r < rows; r++) {
            logits[r * vocab + 4321] = 0f;
            draws[DRAW_WORDS * r] = Float.floatToRawIntBits(1f) & 0xFFFFFFFFL;
            draws[DRAW_WORDS * r + 1] = random.nextLong();
            draws[DRAW_WORDS * r + 4] = (long) Float.floatToRawIntBits(1f) << 32;   // no top-k, top-p 1
        }
        int[] ids = drawAll(logits, vocab, draws, best);
        for (int r = 0; r < rows; r++) {
            assertEquals(4321, ids[r], "row " + r);
        }
    }

    /**
     * The host sampler's candidates, drawn on the device: with top-k 8, top-p 0.9 and min-p 0.05 over logits whose
     * weights put those cuts well clear of any candidate, the tokens drawn are exactly those the host keeps (every
     * one of them, at its probability exp(l/T) over the kept ones' sum) and no other; and with min-p alone, the same.
     */
    @Test
    void topKTopPAndMinPKeepTheHostSamplersCandidates() {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        int vocab = 4000;
        int rows = 12288;
        float temperature = 0.8f;
        float[] row = new float[vocab];
        for (int i = 0; i < vocab; i++) {
            row[i] = (float) (random.nextDouble() * 4 - 12);
        }
        // ranked: 0.0 (id 900), -0.3, -0.6, -0.9, -1.2, -1.5 (weights 1, .74, .55, .41, .30, .22), then -4.0, -4.1
        // (.018, .017) and more: top-k 8 keeps these eight; top-p 0.9 of their mass (3.25) stops at the fifth (cum
        // .92); min-p 0.05 keeps all five of those
        int[] ranked = {900, 17, 3333, 5, 1234, 2500, 77, 78};
        float[] values = {0f, -0.3f, -0.6f, -0.9f, -1.2f, -1.5f, -4.0f, -4.1f};
        for (int j = 0; j < ranked.length; j++) {
            row[ranked[j]] = values[j];
        }
        double[] w = new double[6];
        double[] p = new double[6];
        double mass = 0, kept = 0;
        for (int j = 0; j < 8; j++) {
            mass += Math.exp(values[j]);
        }
        double cum = 0;
        int keep = 0;
        while (keep < 8 && (cum += Math.exp(values[keep]) / mass) < 0.9) {
            keep++;
        }
        keep++;
        assertEquals(5, keep, "the test's own cut");
        for (int j = 0; j < keep; j++) {
            w[j] = Math.exp(values[j] / temperature);
            kept += w[j];
        }
        for (int j = 0; j < keep; j++) {
            p[j] = w[j] / kept;
        }
        float[] logits = new float[rows * vocab];
        long[] draws = new long[DRAW_WORDS * rows];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            System.arraycopy(row, 0, logits, r * vocab, vocab);
            boolean minPOnly = r % 3 == 2;
            draws[DRAW_WORDS * r] = Float.floatToRawIntBits(1f / temperature) & 0xFFFFFFFFL;
            draws[DRAW_WORDS * r + 1] = random.nextLong();
            draws[DRAW_WORDS * r + 4] = minPOnly ? (long) Float.floatToRawIntBits(1f) << 32
                    : 8L | (long) Float.floatToRawIntBits(0.9f) << 32;
            draws[DRAW_WORDS * r + 5] = Float.floatToRawIntBits(minPOnly ? 0.2f : 0.05f) & 0xFFFFFFFFL;
            // a third of the rows with the output product's argmax key (the two-pass top-k), a third without (the
            // radix selection)
            best[r] = r % 3 == 0 ? argmaxKey(0f, 900) : 0L;
        }
        int[] ids = drawAll(logits, vocab, draws, best);
        int[] counts = new int[keep];
        int drawn = 0;
        int[] minPCounts = new int[5];
        for (int r = 0; r < rows; r++) {
            int at = -1;
            for (int j = 0; j < ranked.length; j++) {
                at = ranked[j] == ids[r] ? j : at;
            }
            if (r % 3 == 2) {   // min-p 0.2 alone: weights 1, .74, .55, .41, .30 (the fifth, .22, too)
                assertTrue(at >= 0 && at < 6, "min-p row " + r + " drew " + ids[r] + " (seed " + seed + ")");
                continue;
            }
            assertTrue(at >= 0 && at < keep, "row " + r + " drew " + ids[r] + ", not one of the kept " + keep
                    + " (seed " + seed + ")");
            counts[at]++;
            drawn++;
        }
        for (int j = 0; j < keep; j++) {
            double expected = drawn * p[j];
            double sd = Math.sqrt(drawn * p[j] * (1 - p[j]));
            assertTrue(Math.abs(counts[j] - expected) <= 5 * sd + 2, "candidate " + j + ": " + counts[j]
                    + " draws, expected " + Math.round(expected) + " (seed " + seed + ")");
        }
    }

    /**
     * Top-k over ties: one logit 0 above many equal ones (-1), top-k 8 at temperature 1 and no other cut takes the
     * largest and the seven lowest ids of the tied ones, at weights 1 : e^-1 each — whether the ties fit the two-pass
     * top-k's candidate buffer (1,000 of them) or not (3,000: the radix selection then), with the product's argmax key
     * given or not.
     */
    @Test
    void topKOverTiesTakesTheLowestTiedIds() {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        int vocab = 4096;
        int rows = 4096;
        float[] logits = new float[rows * vocab];
        long[] draws = new long[DRAW_WORDS * rows];
        long[] best = new long[rows];
        int top = 3000;
        for (int r = 0; r < rows; r++) {
            int ties = r % 2 == 0 ? 1000 : 3000;
            java.util.Arrays.fill(logits, r * vocab, (r + 1) * vocab, -20f);
            java.util.Arrays.fill(logits, r * vocab + 10, r * vocab + 10 + ties, -1f);
            logits[r * vocab + top] = 0f;   // inside the second row kind's ties: one of them raised
            draws[DRAW_WORDS * r] = Float.floatToRawIntBits(1f) & 0xFFFFFFFFL;
            draws[DRAW_WORDS * r + 1] = random.nextLong();
            draws[DRAW_WORDS * r + 4] = 8L | (long) Float.floatToRawIntBits(1f) << 32;
            best[r] = (r / 2) % 2 == 0 ? argmaxKey(0f, top) : 0L;
        }
        int[] ids = drawAll(logits, vocab, draws, best);
        int[] counts = new int[8];
        for (int r = 0; r < rows; r++) {
            int at = ids[r] == top ? 0 : ids[r] >= 10 && ids[r] < 17 ? ids[r] - 9 : -1;
            assertTrue(at >= 0, "row " + r + " (" + (r % 2 == 0 ? 1000 : 3000) + " ties, argmax key "
                    + ((r / 2) % 2 == 0) + ") drew " + ids[r] + " (seed " + seed + ")");
            counts[at]++;
        }
        double p0 = 1 / (1 + 7 * Math.exp(-1));
        double expected = rows * p0;
        double sd = Math.sqrt(rows * p0 * (1 - p0));
        assertTrue(Math.abs(counts[0] - expected) <= 5 * sd, "the largest drawn " + counts[0] + " times, expected "
                + Math.round(expected) + " (seed " + seed + ")");
    }

    /**
     * -0 and +0 are equal logits, as the host sampler has them: the lower id wins between them, greedy (with a banned
     * id, so the draw kernel chooses) and in a top-k's candidates — a top-k of 2 over -0 at id 3 and +0 at ids 5 and
     * 7 keeps 3 and 5, never 7.
     */
    @Test
    void signedZerosAreEqualLogits() {
        int vocab = 300;
        int rows = 512;
        float[] logits = new float[rows * vocab];
        long[] draws = new long[DRAW_WORDS * rows];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            java.util.Arrays.fill(logits, r * vocab, (r + 1) * vocab, -30f);
            logits[r * vocab + 3] = -0f;
            logits[r * vocab + 5] = 0f;
            logits[r * vocab + 7] = 0f;
            boolean greedy = r % 2 == 0;
            draws[DRAW_WORDS * r] = (greedy ? 0 : Float.floatToRawIntBits(1f) & 0xFFFFFFFFL) | 1L << 32;
            draws[DRAW_WORDS * r + 1] = 5000 + r;
            draws[DRAW_WORDS * r + 2] = 299L;   // one banned id (not a candidate): greedy goes through the draw
            draws[DRAW_WORDS * r + 4] = greedy ? 0L : 2L | (long) Float.floatToRawIntBits(1f) << 32;
            best[r] = r % 4 == 1 ? argmaxKey(-0f, 3) : 0L;   // the two-pass top-k and the radix selection
        }
        int[] ids = drawAll(logits, vocab, draws, best);
        int threes = 0;
        for (int r = 0; r < rows; r++) {
            if (r % 2 == 0) {
                assertEquals(3, ids[r], "greedy row " + r + ": -0 at id 3 ties +0 at 5 and 7, the lowest id wins");
            } else {
                assertTrue(ids[r] == 3 || ids[r] == 5, "top-k 2 row " + r + " drew " + ids[r] + ", not 3 or 5");
                threes += ids[r] == 3 ? 1 : 0;
            }
        }
        assertTrue(threes > 64 && threes < 192, "id 3 drawn " + threes + " times of 256 at weight 1/2");
    }

    /**
     * Repetition penalties as the host sampler applies them ({@link Sampler#penalize}, float for float: every row's
     * logits read back equal the host's penalized row bit for bit, the rest of the row untouched): greedy rows take the
     * largest penalized logit — here the fourth largest before the penalties, which push the three above it down
     * (repeat 1.3 on a positive logit, frequency 0.4 a sighting and presence 0.5 on the others) — and rows drawn with
     * top-k 2 draw only the host's two candidates after the penalties, at their weights; a penalized id past the
     * vocabulary (5000: the next rows' logits, or past the buffer for the last) is ignored, as on the host.
     */
    @Test
    void penaltiesChangeTheLogitsAsTheHostSamplers() {
        int vocab = 1000;
        int rows = 2048;
        float[] row = new float[vocab];
        java.util.Arrays.fill(row, -8f);
        row[10] = 3.0f;    // seen twice: 3.0 / 1.3 - (2 · 0.4 + 0.5) = 1.0077
        row[20] = 2.6f;    // seen once: 2.6 / 1.3 - (0.4 + 0.5) = 1.1
        row[30] = -0.5f;   // seen once: -0.5 · 1.3 - 0.9 = -1.55
        row[40] = 1.9f;    // not seen: the largest after the penalties
        row[50] = 1.2f;    // not seen: the second
        dev.kvant.backend.Draws.Penalty penalty = new dev.kvant.backend.Draws.Penalty(1.3f, 0.4f, 0.5f,
                new int[] {10, 20, 30, 5000}, new int[] {2, 1, 1, 3});
        float[] host = row.clone();
        Sampler.penalize(penalty, host, 0, vocab);
        for (int i = 0; i < vocab; i++) {
            assertTrue(i == 40 || i == 50 || host[i] < host[50], "the test's own ranking after the penalties: " + i);
        }
        assertTrue(host[40] > host[50], "the test's own ranking after the penalties");
        float[] logits = new float[rows * vocab];
        long[] draws = new long[DRAW_WORDS * rows];
        int[] penalized = new int[rows * PENALTY_INTS];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            System.arraycopy(row, 0, logits, r * vocab, vocab);
            boolean greedy = r % 2 == 0;
            draws[DRAW_WORDS * r] = greedy ? 0L : Float.floatToRawIntBits(1f) & 0xFFFFFFFFL;
            draws[DRAW_WORDS * r + 1] = 7000 + r;
            draws[DRAW_WORDS * r + 4] = greedy ? 0L : 2L | (long) Float.floatToRawIntBits(1f) << 32;
            draws[DRAW_WORDS * r + 5] = (long) penalty.ids().length << 32;
            draws[DRAW_WORDS * r + 6] = Float.floatToRawIntBits(penalty.repeat()) & 0xFFFFFFFFL
                    | (long) Float.floatToRawIntBits(penalty.frequency()) << 32;
            draws[DRAW_WORDS * r + 7] = Float.floatToRawIntBits(penalty.presence()) & 0xFFFFFFFFL;
            for (int j = 0; j < penalty.ids().length; j++) {
                penalized[r * PENALTY_INTS + 2 * j] = penalty.ids()[j];
                penalized[r * PENALTY_INTS + 2 * j + 1] = penalty.counts()[j];
            }
            best[r] = r % 4 < 2 ? argmaxKey(3.0f, 10) : 0L;   // the product's (unpenalized) key, or none
        }
        float[] after = new float[rows * vocab];
        int[] ids = drawAll(logits, vocab, draws, penalized, best, after);
        for (int r = 0; r < rows; r++) {
            assertArrayEquals(host, java.util.Arrays.copyOfRange(after, r * vocab, (r + 1) * vocab),
                    "row " + r + "'s logits after the penalties");
        }
        int first = 0;
        for (int r = 0; r < rows; r++) {
            if (r % 2 == 0) {
                assertEquals(40, ids[r], "greedy row " + r + ": the largest logit after the penalties");
            } else {
                assertTrue(ids[r] == 40 || ids[r] == 50, "top-k 2 row " + r + " drew " + ids[r]);
                first += ids[r] == 40 ? 1 : 0;
            }
        }
        double p = 1 / (1 + Math.exp(host[50] - host[40]));
        double expected = rows / 2.0 * p;
        double sd = Math.sqrt(rows / 2.0 * p * (1 - p));
        assertTrue(Math.abs(first - expected) <= 5 * sd, "id 40 drawn " + first + " times, expected "
                + Math.round(expected));
    }

    /** The output product's argmax key of a logit at an id (model.cu argmax_key). */
    private static long argmaxKey(float logit, int id) {
        int b = Float.floatToRawIntBits(logit == 0f ? 0f : logit);
        long ordered = Float.isNaN(logit) ? 0 : (b < 0 ? ~b : b | 0x80000000) & 0xFFFFFFFFL;
        return ordered << 32 | (0xFFFFFFFFL - id);
    }

    /** Runs the draw over rows of logits with best preset; the ids of the keys it leaves. */
    private static int[] drawAll(float[] logits, int vocab, long[] draws, long[] best) {
        return drawAll(logits, vocab, draws, new int[best.length * PENALTY_INTS], best, null);
    }

    /**
     * As above with each row's penalized (id, count) pairs ({@link #PENALTY_INTS} ints a row); the logits as the draw
     * leaves them (penalized in place) into after, where given.
     */
    private static int[] drawAll(float[] logits, int vocab, long[] draws, int[] penalized, long[] best,
                                 float[] after) {
        int rows = best.length;
        assertEquals(DRAW_WORDS * rows, draws.length, "a draw is " + DRAW_WORDS + " words a row");
        try (DeviceBuffer l = upload(MemorySegment.ofArray(logits));
             DeviceBuffer d = upload(MemorySegment.ofArray(draws));
             DeviceBuffer p = upload(MemorySegment.ofArray(penalized));
             DeviceBuffer b = upload(MemorySegment.ofArray(best))) {
            kernels.draw(l, vocab, rows, d, p, b, stream);
            stream.synchronize();
            if (after != null) {
                MemorySegment.copy(download(l), java.lang.foreign.ValueLayout.JAVA_FLOAT, 0, after, 0, after.length);
            }
            long[] keys = download(b).toArray(java.lang.foreign.ValueLayout.JAVA_LONG);
            int[] ids = new int[rows];
            for (int r = 0; r < rows; r++) {
                ids[r] = ModelKernels.argmaxIndex(keys[r]);
            }
            return ids;
        }
    }

    /** exp(l/T) normalized, NaN as no weight. */
    private static double[] probabilities(float[] row, float temperature) {
        double max = Double.NEGATIVE_INFINITY;
        for (float l : row) {
            if (!Float.isNaN(l)) {
                max = Math.max(max, l);
            }
        }
        double[] p = new double[row.length];
        double sum = 0;
        for (int i = 0; i < row.length; i++) {
            p[i] = Float.isNaN(row[i]) ? 0 : Math.exp((row[i] - max) / temperature);
            sum += p[i];
        }
        for (int i = 0; i < row.length; i++) {
            p[i] /= sum;
        }
        return p;
    }
}
