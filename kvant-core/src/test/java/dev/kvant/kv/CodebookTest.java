package dev.kvant.kv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class CodebookTest {
    /** Max's (1960) Lloyd-Max mean squared errors for a unit Gaussian, the TurboQuant paper's D_mse figures. */
    private static final double[] GAUSSIAN_MSE = {0, 0.3634, 0.1175, 0.03454, 0.009497};

    @Test
    void codebooksAreFixedPointsOfLloydIteration() {
        for (int bits = 2; bits <= 4; bits++) {
            for (Codebook cb : new Codebook[] {Codebook.sphere(bits, 64), Codebook.sphere(bits, 128), Codebook.gaussian(bits)}) {
                double[] c = cb.centroids();
                double[] next = cb.lloydStep();
                for (int i = 0; i < c.length; i++) {
                    assertEquals(c[i], next[i], 1e-12, cb + ": centroid " + i + " moves under one more Lloyd step");
                }
            }
        }
    }

    @Test
    void codebooksAreSymmetricAndSorted() {
        for (int bits = 2; bits <= 4; bits++) {
            for (Codebook cb : new Codebook[] {Codebook.sphere(bits, 64), Codebook.sphere(bits, 128), Codebook.gaussian(bits)}) {
                double[] c = cb.centroids();
                float[] b = cb.boundaries();
                assertEquals(1 << bits, c.length);
                for (int i = 0; i < c.length; i++) {
                    assertEquals(-c[c.length - 1 - i], c[i], 0.0, cb + ": symmetry at " + i);
                }
                for (int i = 0; i + 1 < c.length; i++) {
                    assertTrue(c[i] < b[i] && b[i] < c[i + 1], cb + ": boundary " + i + " between its centroids");
                }
                assertEquals(0f, b[c.length / 2 - 1], 0f, cb + ": middle boundary");
            }
        }
    }

    @Test
    void gaussianCodebookReproducesLloydMaxFigures() {
        for (int bits = 1; bits <= 4; bits++) {
            Codebook cb = Codebook.gaussian(bits);
            assertEquals(GAUSSIAN_MSE[bits], cb.unitVectorMse(), GAUSSIAN_MSE[bits] * 1e-3, cb.toString());
        }
        // Max's 4-level quantizer: ±0.4528, ±1.510.
        double[] c = Codebook.gaussian(2).centroids();
        assertEquals(0.4528, c[2], 1e-4);
        assertEquals(1.5104, c[3], 1e-4);
    }

    /**
     * A rotated unit vector's coordinates approach N(0, 1/n): the sphere codebooks, scaled by √n, sit within 3/n
     * (relative) of the Gaussian ones (the gap is O(1/n) and largest at the outermost centroid), with an error slightly below the Gaussian figure (the exact marginal has lighter tails)
     * and below the paper's bound √3·π/2·4^-b.
     */
    @Test
    void sphereCodebooksApproachTheGaussianLimit() {
        for (int bits = 2; bits <= 4; bits++) {
            double[] g = Codebook.gaussian(bits).centroids();
            for (int n : new int[] {64, 128}) {
                Codebook cb = Codebook.sphere(bits, n);
                double[] c = cb.centroids();
                for (int i = 0; i < c.length; i++) {
                    assertEquals(g[i], c[i] * Math.sqrt(n), 3.0 / n * Math.abs(g[i]), cb + ": centroid " + i);
                }
                double mse = cb.unitVectorMse();
                assertTrue(mse < GAUSSIAN_MSE[bits] && mse > 0.95 * GAUSSIAN_MSE[bits], cb + ": mse " + mse);
                assertTrue(mse < Math.sqrt(3) * Math.PI / 2 * Math.pow(4, -bits), cb + ": paper bound");
            }
        }
    }
}
