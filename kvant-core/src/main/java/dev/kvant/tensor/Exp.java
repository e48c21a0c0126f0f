package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.L;

import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;

/**
 * The float exponential of the CPU kernels (attention's softmax, the model's SwiGLU), written out: range reduction
 * by ln 2 (Cody and Waite), a degree-7 Taylor polynomial, the exponent by bit arithmetic. Not {@code Math.exp} (a
 * double routine, one element at a time) nor the Vector API's {@code EXP}, which runs a different algorithm
 * compiled than interpreted, so its bits would depend on JIT state. Every step is an IEEE add, multiply or fma, so
 * a vector lane computes exactly what {@link #exp} computes for a scalar tail. Relative error below 2 ulp;
 * arguments below {@value #UNDERFLOW} give 0, above {@value #OVERFLOW} exp(88).
 */
public final class Exp {
    public static final float UNDERFLOW = -87f;
    public static final float OVERFLOW = 88f;
    public static final float LOG2E = 1.44269504089f;
    /** ln 2 split so that k·LN2_HI is exact for |k| < 2^9. */
    public static final float LN2_HI = 0.693359375f;
    public static final float LN2_LO = -2.12194440e-4f;
    /** 1.5·2^23: adding and subtracting it rounds a float below 2^22 in magnitude to an integer, ties to even. */
    public static final float RINT = 12582912f;
    public static final float C2 = 1f / 2;
    public static final float C3 = 1f / 6;
    public static final float C4 = 1f / 24;
    public static final float C5 = 1f / 120;
    public static final float C6 = 1f / 720;
    public static final float C7 = 1f / 5040;

    private Exp() {
    }

    public static float exp(float x) {
        if (x < UNDERFLOW) {
            return 0f;
        }
        float xc = Math.min(x, OVERFLOW);
        float k = (xc * LOG2E + RINT) - RINT;
        float r = Math.fma(k, -LN2_HI, xc);
        r = Math.fma(k, -LN2_LO, r);
        float p = Math.fma(r, C7, C6);
        p = Math.fma(p, r, C5);
        p = Math.fma(p, r, C4);
        p = Math.fma(p, r, C3);
        p = Math.fma(p, r, C2);
        p = Math.fma(p, r, 1f);
        p = Math.fma(p, r, 1f);
        return Float.intBitsToFloat(Float.floatToRawIntBits(p) + ((int) k << 23));
    }

    /**
     * SwiGLU over [from, to): {@code gate[i] = gate[i] / (1 + exp(-gate[i])) * up[i]}, L lanes at a time with the
     * exponential above written out in lanes (the same operations, so a lane and the scalar tail agree). Written out
     * here as in {@code attention.Softmax.weights} rather than shared as a method taking a vector: kernels pass no
     * vectors to methods of their own (see {@code attention.Lanes}), and a shared vector exp, tried 2026-12-01, was
     * left not inlined ("callee is too large") in some of C2's compiles of its callers, where every vector boxes.
     */
    public static void swiglu(float[] gate, float[] up, int from, int to) {
        FloatVector one = FloatVector.broadcast(F, 1f);
        FloatVector hi = FloatVector.broadcast(F, -LN2_HI);
        FloatVector lo = FloatVector.broadcast(F, -LN2_LO);
        FloatVector c7 = FloatVector.broadcast(F, C7);
        FloatVector c6 = FloatVector.broadcast(F, C6);
        FloatVector c5 = FloatVector.broadcast(F, C5);
        FloatVector c4 = FloatVector.broadcast(F, C4);
        FloatVector c3 = FloatVector.broadcast(F, C3);
        FloatVector c2 = FloatVector.broadcast(F, C2);
        int i = from;
        for (; i + L <= to; i += L) {
            FloatVector g = FloatVector.fromArray(F, gate, i);
            FloatVector x = g.neg();
            FloatVector xc = x.max(UNDERFLOW).min(OVERFLOW);
            FloatVector k = xc.mul(LOG2E).add(RINT).sub(RINT);
            FloatVector r = k.fma(hi, xc);
            r = k.fma(lo, r);
            FloatVector p = r.fma(c7, c6);
            p = p.fma(r, c5);
            p = p.fma(r, c4);
            p = p.fma(r, c3);
            p = p.fma(r, c2);
            p = p.fma(r, one);
            p = p.fma(r, one);
            IntVector n = (IntVector) k.convert(VectorOperators.F2I, 0);
            VectorMask<Float> under = x.compare(VectorOperators.LT, UNDERFLOW);
            FloatVector e = p.reinterpretAsInts().add(n.lanewise(VectorOperators.LSHL, 23)).reinterpretAsFloats()
                    .blend(0f, under);
            g.div(one.add(e)).mul(FloatVector.fromArray(F, up, i)).intoArray(gate, i);
        }
        for (; i < to; i++) {
            float g = gate[i];
            gate[i] = g / (1f + exp(-g)) * up[i];
        }
    }

    /**
     * {@code dst[i] = exp((src[i] - shift) * scale)} for i in [0, n): {@link #exp}'s operations in lanes, so every
     * element gets the scalar's bits (a NaN source gives NaN). The sampler's weights over a whole vocabulary. The
     * polynomial is written out again, as in {@link #swiglu}, for the reason given there (a shared vector helper
     * was left un-inlined by C2 in some callers, boxing every vector).
     */
    public static void expScaled(float[] src, float shift, float scale, float[] dst, int n) {
        FloatVector one = FloatVector.broadcast(F, 1f);
        FloatVector hi = FloatVector.broadcast(F, -LN2_HI);
        FloatVector lo = FloatVector.broadcast(F, -LN2_LO);
        FloatVector c7 = FloatVector.broadcast(F, C7);
        FloatVector c6 = FloatVector.broadcast(F, C6);
        FloatVector c5 = FloatVector.broadcast(F, C5);
        FloatVector c4 = FloatVector.broadcast(F, C4);
        FloatVector c3 = FloatVector.broadcast(F, C3);
        FloatVector c2 = FloatVector.broadcast(F, C2);
        int i = 0;
        for (; i + L <= n; i += L) {
            FloatVector x = FloatVector.fromArray(F, src, i).sub(shift).mul(scale);
            FloatVector xc = x.min(OVERFLOW);
            FloatVector k = xc.mul(LOG2E).add(RINT).sub(RINT);
            FloatVector r = k.fma(hi, xc);
            r = k.fma(lo, r);
            FloatVector p = r.fma(c7, c6);
            p = p.fma(r, c5);
            p = p.fma(r, c4);
            p = p.fma(r, c3);
            p = p.fma(r, c2);
            p = p.fma(r, one);
            p = p.fma(r, one);
            IntVector e = (IntVector) k.convert(VectorOperators.F2I, 0);
            VectorMask<Float> under = x.compare(VectorOperators.LT, UNDERFLOW);
            p.reinterpretAsInts().add(e.lanewise(VectorOperators.LSHL, 23)).reinterpretAsFloats().blend(0f, under)
                    .intoArray(dst, i);
        }
        for (; i < n; i++) {
            dst[i] = exp((src[i] - shift) * scale);
        }
    }
}
