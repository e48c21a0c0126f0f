package dev.kvant.sample;

import org.junit.jupiter.api.Test;

import java.util.Arrays;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class SamplerTest {

    /** The order the sampler's candidates must come in: every id sorted by logit descending, then id ascending. */
    private static int[] referenceOrder(float[] logits, int vocab, int keep) {
        Integer[] order = new Integer[vocab];
        for (int i = 0; i < vocab; i++) {
            order[i] = i;
        }
        // larger first, -0 equal to +0, a NaN below every number, then the lower id
        Arrays.sort(order, (a, b) -> {
            float x = logits[a];
            float y = logits[b];
            if (Float.isNaN(x) || Float.isNaN(y)) {
                return Float.isNaN(x) == Float.isNaN(y) ? a - b : Float.isNaN(x) ? 1 : -1;
            }
            return x != y ? Float.compare(y, x) : a - b;
        });
        int[] r = new int[keep];
        for (int i = 0; i < keep; i++) {
            r[i] = order[i];
        }
        return r;
    }

    /** An infinite logit wins, a NaN logit never does, and neither turns the draw into the least likely token. */
    @Test
    void infiniteAndNanLogitsDoNotPickTheLeastLikelyToken() {
        float negNan = Float.intBitsToFloat(0xFFC00000);
        for (long seed = 1; seed <= 20; seed++) {
            Sampler s = new Sampler(new SamplerConfig(1f, 0, 1f, 0f, 1f, 64, seed));
            assertEquals(0, s.sample(new float[] {Float.POSITIVE_INFINITY, 5, 1, -3}, 4));
            assertEquals(2, s.sample(new float[] {1, 5, Float.POSITIVE_INFINITY, Float.POSITIVE_INFINITY}, 4),
                    "the lowest id of the infinite ones");
            int nan = s.sample(new float[] {Float.NaN, 5, 1, -3}, 4);
            assertTrue(nan != 0, "a NaN is never chosen: " + nan);
            int nan2 = s.sample(new float[] {negNan, 5, 1, -3}, 4);
            assertTrue(nan2 != 0, "nor a NaN with its sign bit set: " + nan2);
            Sampler minP = new Sampler(new SamplerConfig(1f, 0, 1f, 0.5f, 1f, 64, seed));
            assertEquals(1, minP.sample(new float[] {Float.NaN, 5, 1, -3}, 4));
        }
        assertEquals(1, Sampler.argmax(new float[] {Float.NaN, 5, 1, -3}, 4));
        assertEquals(1, Sampler.argmax(new float[] {Float.NaN, Float.NEGATIVE_INFINITY}, 2), "NaN below -inf");
        // a NaN among the candidates carries no weight: the others are still drawn from, not always the first
        java.util.Set<Integer> drawn = new java.util.HashSet<>();
        for (long seed = 1; seed <= 64; seed++) {
            drawn.add(new Sampler(new SamplerConfig(1f, 0, 1f, 0f, 1f, 64, seed)).sample(new float[] {0f, 0f,
                    Float.NaN}, 3));
        }
        assertEquals(java.util.Set.of(0, 1), drawn);
        assertEquals(0, Sampler.argmax(new float[] {Float.NaN, Float.NaN}, 2), "all NaN: id 0");
        Sampler any = new Sampler(new SamplerConfig(1f, 0, 1f, 0f, 1f, 64, 3));
        assertEquals(2, any.sample(new float[] {Float.NaN, Float.NaN, Float.NEGATIVE_INFINITY}, 3),
                "nothing to draw from: the first in order, a number (-inf) before a NaN");
    }

    @Test
    void candidatesAreTheLargestLogitsInOrderWithTiesToTheLowerId() {
        long seed = new SplittableRandom().nextLong();
        SplittableRandom r = new SplittableRandom(seed);
        for (int vocab : new int[] {1, 7, 300, 5000, 100_003}) {
            float[] logits = new float[vocab];
            for (int i = 0; i < vocab; i++) {
                // few distinct values (many ties), both signs, both zeros, now and then a NaN or an infinity
                logits[i] = switch (r.nextInt(40)) {
                    case 0, 1, 2, 3, 4 -> 0f;
                    case 5, 6, 7, 8, 9 -> -0f;
                    case 10 -> Float.NaN;
                    case 11 -> Float.NEGATIVE_INFINITY;
                    case 12 -> r.nextInt(20) == 0 ? Float.POSITIVE_INFINITY : 1f;
                    default -> (float) Math.round(r.nextGaussian() * 4) / 2;
                };
            }
            for (int keep : new int[] {1, 5, 40, vocab}) {
                if (keep > vocab) {
                    continue;
                }
                assertArrayEquals(referenceOrder(logits, vocab, keep), Sampler.best(logits, vocab, keep),
                        "vocab " + vocab + " keep " + keep + " (seed " + seed + ")");
            }
        }
    }

    @Test
    void greedyAndTopOneTakeTheArgmaxAndTheSameSeedTheSameTokens() {
        long seed = new SplittableRandom().nextLong();
        SplittableRandom r = new SplittableRandom(seed);
        float[] logits = new float[1000];
        for (int i = 0; i < logits.length; i++) {
            logits[i] = (float) r.nextGaussian();
        }
        int argmax = Sampler.argmax(logits, logits.length);
        assertEquals(argmax, new Sampler(SamplerConfig.greedy()).sample(logits.clone(), logits.length));
        assertEquals(argmax, new Sampler(new SamplerConfig(0.8f, 1, 1f, 0f, 1f, 0, seed)).sample(logits.clone(),
                logits.length));
        Sampler a = new Sampler(SamplerConfig.defaults(seed));
        Sampler b = new Sampler(SamplerConfig.defaults(seed));
        for (int i = 0; i < 50; i++) {
            int ta = a.sample(logits.clone(), logits.length);
            assertEquals(ta, b.sample(logits.clone(), logits.length), "step " + i + " (seed " + seed + ")");
            a.accept(ta);
            b.accept(ta);
        }
    }

    /** Top-k 3 only ever picks the three largest; at temperature 1 their frequencies follow the softmax. */
    @Test
    void topKSamplesFollowTheSoftmaxOfTheKeptTokens() {
        long seed = new SplittableRandom().nextLong();
        float[] logits = new float[500];
        Arrays.fill(logits, -5f);
        logits[17] = 2f;
        logits[300] = 1f;
        logits[42] = 0f;
        Sampler s = new Sampler(new SamplerConfig(1f, 3, 1f, 0f, 1f, 0, seed));
        int[] counts = new int[logits.length];
        int n = 20000;
        for (int i = 0; i < n; i++) {
            counts[s.sample(logits.clone(), logits.length)]++;
        }
        assertEquals(n, counts[17] + counts[300] + counts[42], "only the top 3 (seed " + seed + ")");
        double z = Math.exp(2) + Math.exp(1) + 1;
        for (int[] c : new int[][] {{17, 2}, {300, 1}, {42, 0}}) {
            double expected = Math.exp(c[1]) / z;
            double got = counts[c[0]] / (double) n;
            assertTrue(Math.abs(got - expected) < 0.015, "token " + c[0] + ": " + got + " vs " + expected
                    + " (seed " + seed + ")");
        }
    }

    /**
     * Without top-k the vocabulary is not ranked as a whole (temperature alone draws in id order; top-p and min-p rank
     * only the candidates they can keep): the frequencies still follow the softmax of what each setting keeps.
     */
    @Test
    void withoutTopKTheKeptTokensAndTheirFrequenciesAreThoseOfTheSettings() {
        long seed = new SplittableRandom().nextLong();
        float[] logits = new float[5000];
        Arrays.fill(logits, -30f);   // a long tail of negligible weight
        logits[4000] = 3f;
        logits[7] = 2f;
        logits[2500] = 1f;
        logits[3] = Float.NaN;       // never drawn
        int n = 20000;
        // temperature 2 alone: all three, in proportion exp(l / 2)
        int[] c = counts(new SamplerConfig(2f, 0, 1f, 0f, 1f, 0, seed), logits, n);
        double z = Math.exp(1.5) + Math.exp(1) + Math.exp(0.5);
        assertClose(c[4000] / (double) n, Math.exp(1.5) / z, "temperature 2, token 4000, seed " + seed);
        assertClose(c[2500] / (double) n, Math.exp(0.5) / z, "temperature 2, token 2500, seed " + seed);
        assertEquals(0, c[3], "NaN, seed " + seed);
        // top-p 0.8: the largest two reach it (e^3 / (e^3 + e^2 + e) = 0.665, then 0.910)
        c = counts(new SamplerConfig(1f, 0, 0.8f, 0f, 1f, 0, seed), logits, n);
        assertEquals(n, c[4000] + c[7], "top-p keeps two, seed " + seed);
        assertClose(c[4000] / (double) n, Math.exp(3) / (Math.exp(3) + Math.exp(2)), "top-p, seed " + seed);
        // min-p 0.3: e^(l - 3) >= 0.3 keeps 4000 and 7 (0.37), not 2500 (0.14)
        c = counts(new SamplerConfig(1f, 0, 1f, 0.3f, 1f, 0, seed), logits, n);
        assertEquals(n, c[4000] + c[7], "min-p keeps two, seed " + seed);
        // min-p below e^-4 without top-k or top-p: its own cut (was max - 4, which kept the largest alone here)
        float[] far = new float[3000];
        Arrays.fill(far, -50f);
        far[0] = 0f;
        far[1] = -4.5f;   // 0.011 of the largest: kept by min-p 0.01 (cut at ln 0.01 = -4.6)
        far[2] = -4.2f;   // 0.015
        c = counts(new SamplerConfig(1f, 0, 1f, 0.01f, 1f, 0, seed), far, n);
        double zf = 1 + Math.exp(-4.5) + Math.exp(-4.2);
        assertEquals(n, c[0] + c[1] + c[2], "min-p 0.01 keeps three, seed " + seed);
        assertClose(c[2] / (double) n, Math.exp(-4.2) / zf, "min-p 0.01, token 2, seed " + seed);
        assertTrue(c[1] > 0, "min-p 0.01 keeps token 1 (" + c[1] + " of " + n + "), seed " + seed);
    }

    /**
     * The frequency and presence penalties as llama.cpp's penalties sampler applies them, after the repeat penalty,
     * each token of the window once: l - (count·frequency + presence); zero penalties leave the logits' bits alone.
     */
    @Test
    void frequencyAndPresencePenaltiesFollowTheRepeatPenaltyOverTheWindow() {
        // greedy, so the penalized logits decide: token 0 (logit 3) seen 3 times, token 1 (2.5) once, token 2 (2) never
        Sampler s = new Sampler(new SamplerConfig(0f, 0, 1f, 0f, 1.25f, 8, 0.25f, 0.5f, 1));
        for (int t : new int[] {0, 1, 0, 0}) {
            s.accept(t);
        }
        // token 0: 3 / 1.25 - (3·0.25 + 0.5) = 1.15; token 1: 2.5 / 1.25 - (0.25 + 0.5) = 1.25; token 2: 2
        assertEquals(2, s.sample(new float[] {3f, 2.5f, 2f}, 3));
        assertFalse(s.argmaxSuffices(), "penalties need the logits");
        Sampler none = new Sampler(new SamplerConfig(0f, 0, 1f, 0f, 1f, 8, 0f, 0f, 1));
        none.accept(0);
        assertTrue(none.argmaxSuffices());
        assertEquals(0, none.sample(new float[] {3f, 2.5f, 2f}, 3));
        // presence alone moves a seen token below an unseen one; the window bounds it
        Sampler presence = new Sampler(new SamplerConfig(0f, 0, 1f, 0f, 1f, 1, 0f, 1f, 1));
        presence.accept(0);
        presence.accept(1);   // the window of 1 holds token 1 only
        assertEquals(0, presence.sample(new float[] {3f, 3.5f, 2f}, 3));
        assertThrows(IllegalArgumentException.class, () -> new SamplerConfig(1f, 0, 1f, 0f, 1f, 8, Float.NaN, 0f, 1));
    }

    /**
     * A restarted window holds the last tokens of the context it is given and nothing it held before: token 0, seen
     * three times before the restart, is no longer penalized; token 1, the last of the new context, is.
     */
    @Test
    void aRestartedWindowPenalizesTheNewContextOnly() {
        SamplerConfig config = new SamplerConfig(0f, 0, 1f, 0f, 2f, 2, 1);
        Sampler s = new Sampler(config);
        for (int t : new int[] {0, 0, 0}) {
            s.accept(t);
        }
        assertEquals(1, s.sample(new float[] {3f, 2f, 1f}, 3), "token 0 penalized: 3 / 2 < 2");
        s.restartWindow(new int[] {0, 2, 1, 9, 9}, 3);   // the window of 2: tokens 2 and 1
        assertEquals(0, s.sample(new float[] {3f, 2f, 1f}, 3), "token 0 left the window");
        assertEquals(0, s.sample(new float[] {1f, 1.2f, 1.9f}, 3), "tokens 1 and 2 penalized: 0.6 and 0.95 < 1");
        Sampler fresh = new Sampler(config);
        fresh.accept(2);
        fresh.accept(1);
        float[] a = {1f, 3f, 1.9f}, b = a.clone();
        s.restartWindow(new int[] {2, 1}, 2);
        assertEquals(fresh.sample(a, 3), s.sample(b, 3));
        assertArrayEquals(a, b, "the same penalties as a sampler that accepted the window's tokens alone");
        assertThrows(IllegalArgumentException.class, () -> s.restartWindow(new int[] {1}, 2));
    }

    private static int[] counts(SamplerConfig config, float[] logits, int n) {
        Sampler s = new Sampler(config);
        int[] counts = new int[logits.length];
        for (int i = 0; i < n; i++) {
            counts[s.sample(logits.clone(), logits.length)]++;
        }
        return counts;
    }

    private static void assertClose(double got, double expected, String what) {
        assertTrue(Math.abs(got - expected) < 0.015, what + ": " + got + " vs " + expected);
    }

    /**
     * Settings outside their ranges, NaN and infinities included (every test used to be a comparison that NaN passes),
     * are refused with the setting's name and the value given.
     */
    @Test
    void settingsOutsideTheirRangesAreRefusedByName() {
        Object[][] cases = {
                {"temperature", (Runnable) () -> new SamplerConfig(Float.NaN, 0, 1f, 0f, 1f, 64, 1), "NaN"},
                {"temperature", (Runnable) () -> new SamplerConfig(-1f, 0, 1f, 0f, 1f, 64, 1), "-1.0"},
                {"temperature", (Runnable) () -> new SamplerConfig(Float.POSITIVE_INFINITY, 0, 1f, 0f, 1f, 64, 1),
                        "Infinity"},
                {"top-k", (Runnable) () -> new SamplerConfig(1f, -1, 1f, 0f, 1f, 64, 1), "-1"},
                {"top-p", (Runnable) () -> new SamplerConfig(1f, 0, Float.NaN, 0f, 1f, 64, 1), "NaN"},
                {"top-p", (Runnable) () -> new SamplerConfig(1f, 0, 1.5f, 0f, 1f, 64, 1), "1.5"},
                {"min-p", (Runnable) () -> new SamplerConfig(1f, 0, 1f, Float.NaN, 1f, 64, 1), "NaN"},
                {"repeat penalty", (Runnable) () -> new SamplerConfig(1f, 0, 1f, 0f, Float.NaN, 64, 1), "NaN"},
                {"repeat penalty", (Runnable) () -> new SamplerConfig(1f, 0, 1f, 0f, 0f, 64, 1), "0.0"},
                {"repeat-last-n", (Runnable) () -> new SamplerConfig(1f, 0, 1f, 0f, 1f, -1, 1), "-1"},
        };
        for (Object[] c : cases) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, ((Runnable) c[1])::run);
            assertTrue(e.getMessage().contains("sampler's " + c[0] + " must be") && e.getMessage().endsWith(
                    "got " + c[2]), e.getMessage());
        }
    }
    /**
     * A draw made where the model runs carries the sampler's penalty: the distinct ids of its window, ascending, with
     * their counts, and its settings; applied to logits ({@link Sampler#penalize}) it gives what the sampler's own
     * penalized draw sees (greedy: the same token). Greedy with a penalty draws there (at temperature 0, no key
     * used); a window longer than {@link dev.kvant.backend.Draws#MAX_PENALIZED} keeps the draw on the host.
     */
    @Test
    void aDrawCarriesThePenaltyOfTheSamplersWindow() {
        int vocab = 50;
        SamplerConfig config = new SamplerConfig(0f, 0, 1f, 0f, 1.5f, 6, 0.25f, 0.5f, 3);
        Sampler s = new Sampler(config);
        for (int t : new int[] {9, 4, 9, 7, 4, 9, 30, 4}) {   // the window: the last six, 9 7 4 9 30 4
            s.accept(t);
        }
        assertTrue(s.drawsWhereTheModelRuns(vocab), "greedy with a penalty draws where the model runs");
        dev.kvant.backend.Draws d = s.nextDraw(vocab);
        dev.kvant.backend.Draws.Penalty p = d.penalty()[0];
        assertArrayEquals(new int[] {4, 7, 9, 30}, p.ids());
        assertArrayEquals(new int[] {2, 1, 2, 1}, p.counts());
        assertEquals(1.5f, p.repeat());
        assertEquals(0.25f, p.frequency());
        assertEquals(0.5f, p.presence());
        assertEquals(0f, d.temperature()[0]);
        float[] logits = new float[vocab];
        for (int i = 0; i < vocab; i++) {
            logits[i] = (float) Math.sin(i * 1.7) * 3;
        }
        logits[9] = 5f;   // the largest, but penalized below id 40's 4.5
        logits[40] = 4.5f;
        float[] applied = logits.clone();
        Sampler.penalize(p, applied, 0, vocab);
        assertEquals(5f / 1.5f - (2 * 0.25f + 0.5f), applied[9]);
        assertEquals(40, Sampler.argmax(applied, vocab));
        assertEquals(40, s.sample(logits.clone(), vocab), "the sampler's own greedy draw, penalized");
        Sampler longWindow = new Sampler(new SamplerConfig(0.8f, 40, 1f, 0f, 1.1f,
                dev.kvant.backend.Draws.MAX_PENALIZED + 1, 0f, 0f, 3));
        assertFalse(longWindow.drawsWhereTheModelRuns(vocab), "a longer window draws on the host");
    }
}
