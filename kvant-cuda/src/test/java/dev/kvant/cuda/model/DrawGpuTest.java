package dev.kvant.cuda.model;

import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.TestSeed;
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
        long[] draws = new long[4 * rows];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            System.arraycopy(row, 0, logits, r * vocab, vocab);
            boolean greedy = r % 16 == 15;
            draws[4 * r] = greedy ? 0 : Float.floatToRawIntBits(1f / temperature) & 0xFFFFFFFFL;
            draws[4 * r + 1] = random.nextLong();
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
        long[] draws = new long[8];
        for (int r = 0; r < 2; r++) {
            draws[4 * r] = Float.floatToRawIntBits(1f / 1.5f) & 0xFFFFFFFFL;
            draws[4 * r + 1] = 99 + r;
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
        long[] draws = new long[4 * rows];
        long[] best = new long[rows];
        for (int r = 0; r < rows; r++) {
            logits[r * vocab + 3] = 9f;     // banned
            logits[r * vocab + 400] = 9f;   // banned
            logits[r * vocab + 42] = 5f;
            logits[r * vocab + 41] = 5f;
            boolean greedy = r % 2 == 0;
            draws[4 * r] = (greedy ? 0 : Float.floatToRawIntBits(1f / 2f) & 0xFFFFFFFFL) | 2L << 32;
            draws[4 * r + 1] = 1000 + r;
            draws[4 * r + 2] = 3L | 400L << 32;
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
        long[] draws = new long[4 * rows];
        long[] best = new long[rows];
        SplittableRandom random = new SplittableRandom(TestSeed.next());
        for (int r = 0; r < rows; r++) {
            logits[r * vocab + 4321] = 0f;
            draws[4 * r] = Float.floatToRawIntBits(1f) & 0xFFFFFFFFL;
            draws[4 * r + 1] = random.nextLong();
        }
        int[] ids = drawAll(logits, vocab, draws, best);
        for (int r = 0; r < rows; r++) {
            assertEquals(4321, ids[r], "row " + r);
        }
    }

    /** Runs the draw over rows of logits with best preset; the ids of the keys it leaves. */
    private static int[] drawAll(float[] logits, int vocab, long[] draws, long[] best) {
        int rows = best.length;
        try (DeviceBuffer l = upload(MemorySegment.ofArray(logits));
             DeviceBuffer d = upload(MemorySegment.ofArray(draws));
             DeviceBuffer b = upload(MemorySegment.ofArray(best))) {
            kernels.draw(l, vocab, rows, d, b, stream);
            stream.synchronize();
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
