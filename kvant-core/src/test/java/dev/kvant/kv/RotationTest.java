package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Arrays;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class RotationTest {
    private static final int[] BLOCKS = {64, 128};

    private static float[] gaussian(SplittableRandom rnd, int n, int pad) {
        float[] x = new float[n + pad];
        for (int i = 0; i < n; i++) {
            x[i] = (float) (rnd.nextGaussian() * 3 + 0.5);
        }
        return x;
    }

    private static double norm(double[] x) {
        double s = 0;
        for (double v : x) {
            s += v * v;
        }
        return Math.sqrt(s);
    }

    @Test
    void signsComeFromSplitMix64WithTheDocumentedSeed() {
        // Published first output of SplitMix64 from state 0.
        assertEquals(0xE220A8397B1DCDAFL, KvFormatReference.splitMix64(0, 1)[0]);
        long[] state = {0};
        assertEquals(0xE220A8397B1DCDAFL, Rotation.splitMix64(state));
        for (int n : BLOCKS) {
            Rotation r = Rotation.ofBlock(n);
            for (int which = 1; which <= 2; which++) {
                double[] expected = KvFormatReference.signs(n, which);
                for (int i = 0; i < n; i++) {
                    assertEquals(expected[i], r.sign(which, i), "D" + which + "[" + i + "] of the " + n + "-block");
                }
            }
        }
    }

    @Test
    void rotationMatchesFloat64HadamardProduct() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        for (int n : BLOCKS) {
            for (int t = 0; t < 20; t++) {
                float[] x = gaussian(rnd, n, 5);
                int off = 5 - (t % 5);
                float[] buf = new float[n + 10];
                Arrays.fill(buf, Float.NaN);
                System.arraycopy(x, 0, buf, off, n);
                double[] xd = new double[n];
                for (int i = 0; i < n; i++) {
                    xd[i] = x[i];
                }
                double[] expected = KvFormatReference.rotateBlock(xd, false);
                Rotation.ofBlock(n).forward(buf, off);
                double scale = norm(xd);
                for (int i = 0; i < n; i++) {
                    assertEquals(expected[i], buf[off + i], 1e-6 * scale, "seed " + seed + " n " + n + " i " + i);
                }
                assertTrue(Float.isNaN(buf[off - 1]) && Float.isNaN(buf[off + n]), "writes stay in the block");
            }
        }
    }

    /** The vector kernel performs the float operations of the in-place radix-2 transform, in the same order. */
    @Test
    void rotationIsBitIdenticalToScalarRadix2Transform() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        for (int n : BLOCKS) {
            Rotation r = Rotation.ofBlock(n);
            float scale = (float) (1.0 / Math.sqrt(n));
            for (int t = 0; t < 50; t++) {
                float[] x = gaussian(rnd, n, 0);
                float[] s = x.clone();
                for (int i = 0; i < n; i++) {
                    s[i] *= r.sign(1, i);
                }
                for (int h = 1; h < n; h <<= 1) {
                    for (int i = 0; i < n; i += 2 * h) {
                        for (int j = i; j < i + h; j++) {
                            float a = s[j];
                            float b = s[j + h];
                            s[j] = a + b;
                            s[j + h] = a - b;
                        }
                    }
                }
                for (int i = 0; i < n; i++) {
                    s[i] *= r.sign(2, i) * scale;
                }
                r.forward(x, 0);
                for (int i = 0; i < n; i++) {
                    assertEquals(Float.floatToRawIntBits(s[i]), Float.floatToRawIntBits(x[i]),
                            "seed " + seed + " n " + n + " element " + i);
                }
            }
        }
    }

    @Test
    void rotationPreservesNormAndIsUndoneBySwappingTheSigns() {
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        for (int n : BLOCKS) {
            Rotation r = Rotation.ofBlock(n);
            for (int t = 0; t < 50; t++) {
                float[] x = gaussian(rnd, n, 0);
                float[] y = x.clone();
                r.forward(y, 0);
                double nx = 0;
                double ny = 0;
                for (int i = 0; i < n; i++) {
                    nx += (double) x[i] * x[i];
                    ny += (double) y[i] * y[i];
                }
                assertEquals(1.0, Math.sqrt(ny / nx), 1e-6, "seed " + seed + ": norm ratio");
                double[] yd = new double[n];
                for (int i = 0; i < n; i++) {
                    yd[i] = y[i];
                }
                double[] back = KvFormatReference.rotateBlock(yd, true);
                r.inverse(y, 0);
                for (int i = 0; i < n; i++) {
                    assertEquals(x[i], y[i], 1e-6 * Math.sqrt(nx), "seed " + seed + ": inverse(forward(x)) at " + i);
                    assertEquals(back[i], y[i], 1e-6 * Math.sqrt(nx), "seed " + seed + ": D1·H·D2/n product at " + i);
                }
            }
        }
    }

    @Test
    void rowsAreZeroPaddedToMultiplesOf64AndCutInto128BlocksWhenPossible() {
        assertEquals(128, Rotation.paddedDim(80));
        assertEquals(128, Rotation.blockSize(80));
        assertEquals(128, Rotation.paddedDim(96));
        assertEquals(64, Rotation.paddedDim(40));
        assertEquals(64, Rotation.blockSize(40));
        assertEquals(192, Rotation.paddedDim(192));
        assertEquals(64, Rotation.blockSize(192));
        assertEquals(256, Rotation.paddedDim(256));
        assertEquals(128, Rotation.blockSize(256));
        long seed = System.nanoTime();
        SplittableRandom rnd = new SplittableRandom(seed);
        for (int headDim : new int[] {40, 64, 80, 96, 128, 192, 256}) {
            int padded = Rotation.paddedDim(headDim);
            float[] x = gaussian(rnd, headDim, padded - headDim);
            Arrays.fill(x, headDim, padded, Float.NaN);
            double[] expected = KvFormatReference.rotateRow(x, 0, headDim);
            float[] y = x.clone();
            Rotation.forwardRow(y, 0, headDim);
            for (int i = 0; i < padded; i++) {
                assertEquals(expected[i], y[i], 1e-5, "seed " + seed + " headDim " + headDim + " element " + i);
            }
            Rotation.inverseRow(y, 0, headDim);
            for (int i = 0; i < headDim; i++) {
                assertEquals(x[i], y[i], 1e-5, "seed " + seed + " headDim " + headDim + " element " + i);
            }
            for (int i = headDim; i < padded; i++) {
                assertEquals(0, y[i], 1e-5, "padding returns to zero");
            }
        }
    }
}
