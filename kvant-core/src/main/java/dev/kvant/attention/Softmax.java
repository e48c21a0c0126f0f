package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.tensor.Exp.C2;
import static dev.kvant.tensor.Exp.C3;
import static dev.kvant.tensor.Exp.C4;
import static dev.kvant.tensor.Exp.C5;
import static dev.kvant.tensor.Exp.C6;
import static dev.kvant.tensor.Exp.C7;
import static dev.kvant.tensor.Exp.LN2_HI;
import static dev.kvant.tensor.Exp.LN2_LO;
import static dev.kvant.tensor.Exp.LOG2E;
import static dev.kvant.tensor.Exp.OVERFLOW;
import static dev.kvant.tensor.Exp.RINT;

import dev.kvant.tensor.Exp;

import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;

/**
 * The softmax weights and soft-cap of the kernels, and the merge of partition partials, on {@link Exp}'s
 * exponential (written out in lanes here with the same operations, so a lane computes what {@link Exp#exp}
 * computes for a scalar).
 */
final class Softmax {
    static final float UNDERFLOW = Exp.UNDERFLOW;

    private Softmax() {
    }

    /** No shift, and no lane masked: {@link #expInPlace}'s arguments to {@link #weights} (read only). */
    private static final float[] NO_SHIFT = new float[Lanes.L];
    private static final int[] NO_LIMIT = filled(Integer.MAX_VALUE);

    private static int[] filled(int v) {
        int[] a = new int[Lanes.L];
        java.util.Arrays.fill(a, v);
        return a;
    }

    /**
     * a[at] = exp(a[at]) for L floats at each of count places from {@code from}, stride apart; {@code sums}, L floats,
     * takes the lane sums (scratch: a call allocates nothing).
     */
    static void expInPlace(float[] a, int from, int stride, int count, float[] sums) {
        weights(a, from, stride, count, NO_SHIFT, NO_LIMIT, 0, sums);
    }

    /**
     * The softmax weights of a run of blocked scores, in one pass: for i in [0, count), the L floats at
     * {@code at = from + i·stride} become {@code exp(a[at] - shift)}, except lanes whose row, 4i + j % 4 for lane j
     * (the blocked layout of {@link TileKernels}), is at or past {@code limit[limitOff + j]}: those become 0. The
     * lane-wise sums of the weights, in block order, go to {@code sums[0 .. L)}.
     */
    static void weights(float[] a, int from, int stride, int count, float[] shift, int[] limit, int limitOff,
                        float[] sums) {
        weights(a, from, stride, count, 0, shift, limit, limitOff, sums, false);
    }

    /**
     * As above for a run of blocks whose first is row0 / 4 of the region (row0 a multiple of 4: the limits compare
     * against rows row0 + 4i + j % 4), adding to {@code sums} when accumulate is set. A selection computes the
     * weights of its runs of selected blocks this way: the rows it skips weigh exactly +0, and adding +0 to a sum
     * of non-negative weights changes no bit, so the sums equal those of one pass over every block.
     */
    static void weights(float[] a, int from, int stride, int count, int row0, float[] shift, int[] limit,
                        int limitOff, float[] sums, boolean accumulate) {
        FloatVector c7 = FloatVector.broadcast(F, C7);
        FloatVector c6 = FloatVector.broadcast(F, C6);
        FloatVector c5 = FloatVector.broadcast(F, C5);
        FloatVector c4 = FloatVector.broadcast(F, C4);
        FloatVector c3 = FloatVector.broadcast(F, C3);
        FloatVector c2 = FloatVector.broadcast(F, C2);
        FloatVector one = FloatVector.broadcast(F, 1f);
        FloatVector hi = FloatVector.broadcast(F, -LN2_HI);
        FloatVector lo = FloatVector.broadcast(F, -LN2_LO);
        FloatVector m = FloatVector.fromArray(F, shift, 0);
        IntVector lim = IntVector.fromArray(I, limit, limitOff);
        IntVector row = IntVector.fromArray(I, ROW_IN_BLOCK, 0).add(row0);
        FloatVector total = accumulate ? FloatVector.fromArray(F, sums, 0) : FloatVector.zero(F);
        for (int i = 0, at = from; i < count; i++, at += stride) {
            FloatVector x = FloatVector.fromArray(F, a, at).sub(m);
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
            VectorMask<Float> zero = x.compare(VectorOperators.LT, UNDERFLOW)
                    .or(row.add(4 * i).compare(VectorOperators.GE, lim).cast(F));
            FloatVector w = p.reinterpretAsInts().add(n.lanewise(VectorOperators.LSHL, 23)).reinterpretAsFloats()
                    .blend(0f, zero);
            w.intoArray(a, at);
            total = total.add(w);
        }
        total.intoArray(sums, 0);
    }

    /** Lane j of a blocked scores vector holds row j % 4 of its 4-row block. */
    private static final int[] ROW_IN_BLOCK = new int[Lanes.L];

    static {
        for (int j = 0; j < Lanes.L; j++) {
            ROW_IN_BLOCK[j] = j & 3;
        }
    }

    static float exp(float x) {
        return Exp.exp(x);
    }

    /**
     * a[i] = cap·tanh(a[i]/cap) for i in [from, to) (a multiple of L long), through {@code tanh|x| = (1 - e)/(1 + e)}
     * with {@code e = exp(-2|x|)}, which cannot overflow. Near 0 the subtraction loses relative precision (about
     * 1e-7/|x|), far below a score's own rounding. tmp: scratch of {@link #SOFT_CAP_CHUNK} floats; sums: of L.
     */
    static void softCapInPlace(float[] a, int from, int to, float cap, float[] tmp, float[] sums) {
        float inv = 1f / cap;
        for (int c = from; c < to; c += SOFT_CAP_CHUNK) {
            int n = Math.min(SOFT_CAP_CHUNK, to - c);
            for (int i = 0; i < n; i += Lanes.L) {
                FloatVector.fromArray(F, a, c + i).mul(inv).abs().mul(-2f).intoArray(tmp, i);
            }
            expInPlace(tmp, 0, Lanes.L, n / Lanes.L, sums);
            for (int i = 0; i < n; i += Lanes.L) {
                FloatVector e = FloatVector.fromArray(F, tmp, i);
                FloatVector t = FloatVector.broadcast(F, 1f).sub(e).div(e.add(1f));
                FloatVector x = FloatVector.fromArray(F, a, c + i);
                t.blend(t.neg(), x.compare(VectorOperators.LT, 0f)).mul(cap).intoArray(a, c + i);
            }
        }
    }

    static final int SOFT_CAP_CHUNK = 16 * Lanes.L;

    /**
     * Merges one partition's partial (max m, sum l of exp(s - m), unnormalized acc) into a running state with the
     * same layout, in place: the online-softmax step. Every kernel variant merges a query's partitions in ascending
     * order through this one method, which is why they agree bit for bit. An empty partial (m = -inf) changes nothing.
     */
    static void merge(float[] sm, float[] sl, int s, float[] sacc, int sa,
                      float[] pm, float[] pl, int p, float[] pacc, int pa, int dim) {
        float m = pm[p];
        if (m == Float.NEGATIVE_INFINITY) {
            return;
        }
        float cur = sm[s];
        if (cur == Float.NEGATIVE_INFINITY) {
            sm[s] = m;
            sl[s] = pl[p];
            System.arraycopy(pacc, pa, sacc, sa, dim);
            return;
        }
        float mx = Math.max(cur, m);
        float a = exp(cur - mx);
        float b = exp(m - mx);
        sm[s] = mx;
        sl[s] = sl[s] * a + pl[p] * b;
        for (int d = 0; d < dim; d += Lanes.L) {
            FloatVector acc = FloatVector.fromArray(F, sacc, sa + d).mul(a);
            FloatVector.fromArray(F, pacc, pa + d).fma(FloatVector.broadcast(F, b), acc).intoArray(sacc, sa + d);
        }
    }
}
