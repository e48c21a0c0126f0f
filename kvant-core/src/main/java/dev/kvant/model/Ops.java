package dev.kvant.model;

import dev.kvant.tensor.Exp;
import dev.kvant.tensor.Parallel;

/**
 * The small row operations of the forward pass. Each element (or row) is computed on its own in a fixed order, so
 * cutting the work into ranges for the pool ({@link #ranges}) never changes a bit.
 */
final class Ops {

    private Ops() {
    }

    /** A piece of elementwise work over [from, to). */
    interface Range {
        void run(int from, int to);
    }

    /**
     * {@code body} over [0, count) in contiguous ranges of at least {@code grain}, one pool task each (at most two a
     * thread): a prompt chunk's norms, RoPE, SwiGLU and residual adds ran on one thread while the products used
     * two, which capped prefill's scaling.
     */
    static void ranges(Parallel pool, int count, int grain, Range body) {
        int tasks = Math.min(2 * pool.threads(), Math.max(1, count / grain));
        if (tasks <= 1) {
            body.run(0, count);
            return;
        }
        pool.forEach(tasks, t -> body.run((int) ((long) count * t / tasks), (int) ((long) count * (t + 1) / tasks)));
    }

    /** out[r] = x[r] / rms(x[r]) * w for n rows of length dim (out may be x). */
    static void rmsNorm(float[] x, float[] w, float[] out, int n, int dim, float eps) {
        for (int r = 0; r < n; r++) {
            rmsNorm(x, r * dim, w, out, r * dim, dim, eps);
        }
    }

    static void rmsNorm(float[] x, int xOff, float[] w, float[] out, int outOff, int dim, float eps) {
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            float v = x[xOff + i];
            ss += v * v;
        }
        float inv = (float) (1.0 / Math.sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) {
            out[outOff + i] = x[xOff + i] * inv * w[i];
        }
    }

    static void addBias(float[] x, float[] bias, int n) {
        int d = bias.length;
        for (int r = 0; r < n; r++) {
            for (int i = 0; i < d; i++) {
                x[r * d + i] += bias[i];
            }
        }
    }

    static void add(float[] x, float[] y, int len) {
        add(x, y, 0, len);
    }

    static void add(float[] x, float[] y, int from, int to) {
        for (int i = from; i < to; i++) {
            x[i] += y[i];
        }
    }

    /** gate = silu(gate) * up. */
    static void swiglu(float[] gate, float[] up, int len) {
        swiglu(gate, up, 0, len);
    }

    /** gate = silu(gate) * up over [from, to), on {@link Exp}'s exponential in vector lanes. */
    static void swiglu(float[] gate, float[] up, int from, int to) {
        Exp.swiglu(gate, up, from, to);
    }
}
