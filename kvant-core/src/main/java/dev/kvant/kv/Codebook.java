package dev.kvant.kv;

import java.util.Arrays;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.DoubleUnaryOperator;

/**
 * A Lloyd-Max scalar quantizer: 2^bits centroids minimizing the mean squared error for one coordinate
 * distribution, computed here from the density (never a pasted table).
 *
 * <p>The turbo formats quantize the coordinates of a rotated unit vector in dimension n. Such a coordinate t of a
 * uniform point on the sphere S^(n-1) has the exact density {@code f(t) ∝ (1 - t²)^((n-3)/2)} on [-1, 1]; kvant
 * uses this exact marginal rather than its Gaussian limit N(0, 1/n) because n is small and known (64 or 128); the
 * centroids differ from the Gaussian ones by about 1%. {@link #gaussian} gives the limit codebook, against which
 * the TurboQuant paper's figures are checked.
 *
 * <p>Lloyd iteration: boundaries are the midpoints of neighbouring centroids, each centroid is the conditional mean
 * of its cell, repeated until no centroid moves by more than 1e-14 σ. Only the positive half is iterated; the
 * negative half is its mirror, so the codebook is exactly symmetric and the middle boundary is exactly 0. Cell
 * integrals use composite 16-point Gauss-Legendre with panels no wider than σ/4. Everything is computed with
 * StrictMath in Java's IEEE double arithmetic, so every platform derives the same float centroids: they are
 * constants of kv-format v1 (docs/KV_FORMATS.md lists them).
 */
public final class Codebook {
    private static final int GL_POINTS = 16;
    private static final double[] GL_X = new double[GL_POINTS];
    private static final double[] GL_W = new double[GL_POINTS];
    private static final ConcurrentHashMap<Long, Codebook> CACHE = new ConcurrentHashMap<>();

    static {
        gaussLegendre(GL_X, GL_W);
    }

    private final int bits;
    private final int dim;
    private final Distribution distribution;
    private final double[] centroids;
    private final float[] centroidsF;
    private final float[] boundariesF;
    private final double coordinateMse;
    private final int iterations;

    /** The coordinate distribution a codebook is fitted to. */
    private record Distribution(DoubleUnaryOperator pdf, double sigma, double hi, String description) {
        static Distribution sphere(int n) {
            double k = (n - 3) / 2.0;
            return new Distribution(t -> StrictMath.exp(k * StrictMath.log1p(-t * t)), 1 / Math.sqrt(n), 1.0,
                    "coordinate of a uniform point on S^" + (n - 1) + ": f(t) ∝ (1-t²)^" + k + " on [-1,1]");
        }

        static Distribution standardNormal() {
            return new Distribution(t -> StrictMath.exp(-0.5 * t * t), 1.0, 12.0, "standard normal N(0,1)");
        }
    }

    private Codebook(int bits, int dim, Distribution distribution) {
        if (bits < 1 || bits > 8) {
            throw new IllegalArgumentException("codebooks have 1 to 8 bits, not " + bits);
        }
        this.bits = bits;
        this.dim = dim;
        this.distribution = distribution;
        int half = 1 << (bits - 1);
        double[] c = new double[half];
        for (int i = 0; i < half; i++) {
            c[i] = distribution.sigma * 3.0 * (i + 0.5) / half;
        }
        int it = 0;
        double tol = 1e-14 * distribution.sigma;
        while (it < 100_000) {
            double[] next = lloydStepHalf(c);
            double moved = 0;
            for (int i = 0; i < half; i++) {
                moved = Math.max(moved, Math.abs(next[i] - c[i]));
            }
            c = next;
            it++;
            if (moved <= tol) {
                break;
            }
        }
        iterations = it;
        centroids = mirror(c);
        centroidsF = new float[centroids.length];
        for (int i = 0; i < centroids.length; i++) {
            centroidsF[i] = (float) centroids[i];
        }
        boundariesF = new float[centroids.length - 1];
        for (int i = 0; i < boundariesF.length; i++) {
            boundariesF[i] = (float) ((centroids[i] + centroids[i + 1]) / 2);
        }
        coordinateMse = mse(c);
    }

    /** The codebook for coordinates of a rotated unit vector of dimension n (the turbo formats' codebook). */
    public static Codebook sphere(int bits, int n) {
        if (n < 4) {
            throw new IllegalArgumentException("sphere codebooks need dimension >= 4, got " + n);
        }
        return CACHE.computeIfAbsent(((long) bits << 32) | n, key -> new Codebook(bits, n, Distribution.sphere(n)));
    }

    /** The Lloyd-Max codebook of the standard normal distribution, the n → ∞ limit of {@link #sphere} × √n. */
    public static Codebook gaussian(int bits) {
        return CACHE.computeIfAbsent(((long) bits << 32), key -> new Codebook(bits, 0, Distribution.standardNormal()));
    }

    public int bits() {
        return bits;
    }

    /** The vector dimension the codebook is for; 0 for the Gaussian codebook. */
    public int dim() {
        return dim;
    }

    public String distribution() {
        return distribution.description;
    }

    /** The 2^bits centroids in ascending order, in coordinate units (about ±1/√n for the sphere). */
    public double[] centroids() {
        return centroids.clone();
    }

    /** The centroids as the float values the kernels multiply with. */
    public float[] centroidsAsFloat() {
        return centroidsF.clone();
    }

    /**
     * The 2^bits - 1 decision boundaries as floats, ascending: a value's code is the number of boundaries strictly
     * below it.
     */
    public float[] boundaries() {
        return boundariesF.clone();
    }

    /** Mean squared error per coordinate, in coordinate units. */
    public double coordinateMse() {
        return coordinateMse;
    }

    /**
     * Expected squared error of a quantized unit vector, E‖u - û‖² = n × {@link #coordinateMse()}; for the
     * Gaussian codebook, the per-coordinate error of a unit-variance value (the paper's D_mse figures).
     */
    public double unitVectorMse() {
        return dim == 0 ? coordinateMse : coordinateMse * dim;
    }

    /** Lloyd iterations taken to reach the fixed point. */
    public int iterations() {
        return iterations;
    }

    /** One more Lloyd iteration applied to the full (mirrored) codebook: the fixed-point check. */
    double[] lloydStep() {
        int half = centroids.length / 2;
        return mirror(lloydStepHalf(Arrays.copyOfRange(centroids, half, centroids.length)));
    }

    private double[] lloydStepHalf(double[] c) {
        int half = c.length;
        double[] next = new double[half];
        for (int i = 0; i < half; i++) {
            double lo = i == 0 ? 0 : (c[i - 1] + c[i]) / 2;
            double hi = i == half - 1 ? distribution.hi : (c[i] + c[i + 1]) / 2;
            double[] m = moments(lo, hi);
            next[i] = m[1] / m[0];
        }
        return next;
    }

    private double mse(double[] c) {
        int half = c.length;
        double err = 0;
        for (int i = 0; i < half; i++) {
            double lo = i == 0 ? 0 : (c[i - 1] + c[i]) / 2;
            double hi = i == half - 1 ? distribution.hi : (c[i] + c[i + 1]) / 2;
            double[] m = moments(lo, hi);
            err += m[2] - 2 * c[i] * m[1] + c[i] * c[i] * m[0];
        }
        return err / moments(0, distribution.hi)[0];
    }

    /** ∫ f, ∫ t f, ∫ t² f over [lo, hi] by composite Gauss-Legendre. */
    private double[] moments(double lo, double hi) {
        int panels = Math.max(1, (int) Math.ceil((hi - lo) / (distribution.sigma / 4)));
        double w = (hi - lo) / panels;
        double m0 = 0;
        double m1 = 0;
        double m2 = 0;
        for (int p = 0; p < panels; p++) {
            double mid = lo + (p + 0.5) * w;
            for (int i = 0; i < GL_POINTS; i++) {
                double t = mid + 0.5 * w * GL_X[i];
                double f = 0.5 * w * GL_W[i] * distribution.pdf.applyAsDouble(t);
                m0 += f;
                m1 += f * t;
                m2 += f * t * t;
            }
        }
        return new double[] {m0, m1, m2};
    }

    private static double[] mirror(double[] positive) {
        int half = positive.length;
        double[] full = new double[2 * half];
        for (int i = 0; i < half; i++) {
            full[half + i] = positive[i];
            full[half - 1 - i] = -positive[i];
        }
        return full;
    }

    /** Nodes and weights of m-point Gauss-Legendre on [-1, 1]: roots of P_m by Newton's method. */
    private static void gaussLegendre(double[] x, double[] w) {
        int m = x.length;
        for (int i = 0; i < m; i++) {
            double r = StrictMath.cos(Math.PI * (i + 0.75) / (m + 0.5));
            double dp = 0;
            for (int it = 0; it < 100; it++) {
                double p0 = 1;
                double p1 = r;
                for (int k = 2; k <= m; k++) {
                    double p2 = ((2 * k - 1) * r * p1 - (k - 1) * p0) / k;
                    p0 = p1;
                    p1 = p2;
                }
                dp = m * (r * p1 - p0) / (r * r - 1);
                double step = p1 / dp;
                r -= step;
                if (Math.abs(step) < 1e-16) {
                    break;
                }
            }
            x[i] = r;
            w[i] = 2 / ((1 - r * r) * dp * dp);
        }
    }

    @Override
    public String toString() {
        return "Codebook[" + bits + " bits, " + distribution.description + "]";
    }
}
