package dev.kvant.tensor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class ExpTest {
    private static final long SEED = new SplittableRandom().nextLong();

    @Test
    void expIsWithinTwoUlpOfTheDoubleExponentialAndZeroBelowTheUnderflow() {
        for (float x = -86.9f; x < 88f; x += 0.0137f) {
            double want = Math.exp(x);
            float got = Exp.exp(x);
            assertTrue(Math.abs(got - want) <= 2 * Math.ulp((float) want), x + ": " + got + " vs " + want);
        }
        assertEquals(1f, Exp.exp(0f));
        assertEquals(0f, Exp.exp(-100f));
        assertEquals(Exp.exp(88f), Exp.exp(1000f));
        assertTrue(Float.isNaN(Exp.exp(Float.NaN)));
    }

    @Test
    void swigluLanesGiveTheScalarTailsBitsAndFollowTheDoubleFormula() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        int n = 7 * Lanes.L + 5;
        float[] gate = new float[n];
        float[] up = new float[n];
        for (int i = 0; i < n; i++) {
            gate[i] = (float) (rnd.nextGaussian() * (i % 3 == 0 ? 30 : 3));
            up[i] = (float) rnd.nextGaussian();
        }
        gate[1] = -95f;   // exp(95) clamps at exp(88)
        gate[2] = 95f;    // exp(-95) underflows to 0: silu = g
        float[] vector = gate.clone();
        Exp.swiglu(vector, up, 0, n);
        for (int i = 0; i < n; i++) {
            // one element at a time: always the scalar tail
            float[] one = {gate[i]};
            Exp.swiglu(one, new float[] {up[i]}, 0, 1);
            assertEquals(Float.floatToRawIntBits(one[0]), Float.floatToRawIntBits(vector[i]),
                    "element " + i + ", seed " + SEED);
            double g = gate[i];
            double want = g / (1 + Math.exp(-g)) * up[i];
            assertEquals(want, vector[i], 1e-6 * Math.max(1, Math.abs(want)), "element " + i + ", seed " + SEED);
        }
        assertEquals(95f * up[2], vector[2]);
    }

    /** The sampler's weights: every lane gives the scalar's bits, a NaN stays NaN, -inf and far below give 0. */
    @Test
    void expScaledLanesGiveTheScalarsBits() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        int n = 9 * Lanes.L + 3;
        float[] src = new float[n];
        for (int i = 0; i < n; i++) {
            src[i] = (float) (rnd.nextGaussian() * 40);
        }
        src[1] = Float.NaN;
        src[2] = Float.NEGATIVE_INFINITY;
        src[3] = -1e30f;
        src[4] = 1e30f;
        src[n - 1] = Float.NaN;
        float shift = 12.5f;
        float scale = 0.7f;
        float[] dst = new float[n];
        Exp.expScaled(src, shift, scale, dst, n);
        for (int i = 0; i < n; i++) {
            float want = Exp.exp((src[i] - shift) * scale);
            assertEquals(Float.floatToIntBits(want), Float.floatToIntBits(dst[i]), "element " + i + ": " + src[i]);
        }
        assertEquals(0f, dst[2]);
        assertEquals(0f, dst[3]);
    }
}
