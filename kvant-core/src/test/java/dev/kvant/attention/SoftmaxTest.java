package dev.kvant.attention;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class SoftmaxTest {
    private static final long SEED = new SplittableRandom().nextLong();

    @Test
    void expIsWithinTwoUlpOfMathExpAndVectorEqualsScalar() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        float[] x = new float[Lanes.L];
        float[] v = new float[Lanes.L];
        for (int trial = 0; trial < 20000; trial++) {
            for (int j = 0; j < x.length; j++) {
                x[j] = (float) (-90 + rnd.nextDouble() * 100);
            }
            System.arraycopy(x, 0, v, 0, x.length);
            Softmax.expInPlace(v, 0, Lanes.L, 1, new float[Lanes.L]);
            for (int j = 0; j < x.length; j++) {
                float s = Softmax.exp(x[j]);
                assertEquals(Float.floatToRawIntBits(s), Float.floatToRawIntBits(v[j]), "exp(" + x[j] + ") seed " + SEED);
                if (x[j] < Softmax.UNDERFLOW) {
                    assertEquals(0f, s);
                } else {
                    double e = Math.exp(x[j]);
                    assertTrue(Math.abs(s - e) <= 2 * Math.ulp((float) e), "exp(" + x[j] + ") = " + s + " vs " + e);
                }
            }
        }
        assertEquals(0f, Softmax.exp(Float.NEGATIVE_INFINITY));
        assertEquals(1f, Softmax.exp(0f));
    }

    @Test
    void softCapFollowsTanh() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        float[] x = new float[Lanes.L];
        float[] y = new float[Lanes.L];
        for (int trial = 0; trial < 2000; trial++) {
            for (int j = 0; j < x.length; j++) {
                x[j] = (float) (rnd.nextGaussian() * 40);
            }
            System.arraycopy(x, 0, y, 0, x.length);
            Softmax.softCapInPlace(y, 0, y.length, 30f, new float[Softmax.SOFT_CAP_CHUNK], new float[Lanes.L]);
            for (int j = 0; j < x.length; j++) {
                double want = 30 * Math.tanh(x[j] / 30.0);
                assertEquals(want, y[j], 1e-5 * 30, "softcap(" + x[j] + ") seed " + SEED);
            }
        }
    }

    @Test
    void treeCombineSumsEachAccumulatorLikeSumLanes() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        float[] buf = new float[3 * Lanes.L];
        for (int i = 0; i < 2 * Lanes.L; i++) {
            buf[i] = (float) rnd.nextGaussian() * (i < Lanes.L ? 1e3f : 1f);
        }
        float a = Lanes.sumLanes(buf, 0);
        float b = Lanes.sumLanes(buf, Lanes.L);
        Lanes.combine(buf, 0, 1, 2, 0);
        for (int k = 1; k < Lanes.STAGES; k++) {
            Lanes.combine(buf, 2, 2, 2, k);
        }
        assertEquals(Float.floatToRawIntBits(a), Float.floatToRawIntBits(buf[2 * Lanes.L]), "seed " + SEED);
        assertEquals(Float.floatToRawIntBits(b), Float.floatToRawIntBits(buf[2 * Lanes.L + 1]), "seed " + SEED);
    }
}
