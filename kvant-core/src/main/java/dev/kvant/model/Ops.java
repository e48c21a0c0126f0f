package dev.kvant.model;

/** The small row operations of the forward pass; each loops in a fixed order, so results never depend on threads. */
final class Ops {

    private Ops() {
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
        for (int i = 0; i < len; i++) {
            x[i] += y[i];
        }
    }

    /** gate = silu(gate) * up. */
    static void swiglu(float[] gate, float[] up, int len) {
        for (int i = 0; i < len; i++) {
            float g = gate[i];
            gate[i] = g / (1f + (float) Math.exp(-g)) * up[i];
        }
    }
}
