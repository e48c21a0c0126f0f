package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.combine;

import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorMask;

/**
 * The float micro-kernels over a decoded tile: scores (queries · K rows) and weighted sums (weights × V rows).
 *
 * <p><b>Scores</b> are computed for 4 rows × 4 (or 2, or 1) queries at once: 16 accumulators in registers, fed
 * by 4 row loads and 4 query loads per L values. Each accumulator is a chain of fmas over the row in order, and
 * the 16 are summed across lanes together by {@link Lanes#combine} (15 pair steps instead of 16 separate
 * reductions of 4 steps), which sums each lane set in the order of {@link Lanes#sumLanes}. So a score's bits do
 * not depend on which kernel shape computed it, nor on the other queries or rows of the block.
 *
 * <p>Scores are stored in a blocked layout: for partition row r and query slot i (query slots padded to a multiple
 * of 4), {@code s[((r/4)·slots + i)·4 + r%4]}, so a 4×4 block is one vector store and a vector of scores holds
 * L/4 queries × 4 rows.
 *
 * <p><b>Weighted sums</b> keep a 4 (or 2, 1) queries × 4·L output values in registers over a run of rows; per row
 * and query a weight is broadcast. Each output lane is a chain of fmas in row order, the same whatever the blocking.
 */
final class TileKernels {
    private static final VectorMask<Float> FIRST4 = F.indexInRange(0, 4);
    private static final VectorMask<Float> FIRST8 = F.indexInRange(0, 8);

    private TileKernels() {
    }

    /** The blocked-layout index of (row, query slot). */
    static int at(int row, int slot, int slots) {
        return (((row >> 2) * slots + slot) << 2) + (row & 3);
    }

    /**
     * Scores of query slots [0, slots) against tile rows [0, rows4) (rows4 a multiple of 4; row k at
     * kt[ktOff + k·stride]), for partition rows from row0 (a multiple of 4), into the blocked layout at s[sOff]
     * (sOff a multiple of 4). Query slot i is the dp floats at q[qOff[i]]. red: scratch of 16·L floats.
     */
    static void scores(float[] q, int[] qOff, int queries, int slots, float[] kt, int ktOff, int stride, int rows4,
                       int dp, float[] s, int sOff, int row0, float[] red) {
        for (int r = 0; r < rows4; r += 4) {
            int k0 = ktOff + r * stride;
            int base = ((row0 + r) >> 2) * slots + (sOff >> 2);
            int i = 0;
            for (; i + 4 <= queries; i += 4) {
                dots4(q, qOff[i], qOff[i + 1], qOff[i + 2], qOff[i + 3], kt, k0, stride, dp, s, (base + i) << 2, red);
            }
            if (i + 2 <= queries) {
                dots2(q, qOff[i], qOff[i + 1], kt, k0, stride, dp, s, (base + i) << 2, red);
                i += 2;
            }
            if (i < queries) {
                dots1(q, qOff[i], kt, k0, stride, dp, s, (base + i) << 2, red);
            }
        }
    }

    private static void dots4(float[] q, int q0, int q1, int q2, int q3, float[] kt, int k0, int stride, int dp,
                              float[] s, int so, float[] red) {
        FloatVector a00 = FloatVector.zero(F), a01 = a00, a02 = a00, a03 = a00;
        FloatVector a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        FloatVector a20 = a00, a21 = a00, a22 = a00, a23 = a00;
        FloatVector a30 = a00, a31 = a00, a32 = a00, a33 = a00;
        int k1 = k0 + stride, k2 = k1 + stride, k3 = k2 + stride;
        for (int c = 0; c < dp; c += L) {
            FloatVector r0 = FloatVector.fromArray(F, kt, k0 + c);
            FloatVector r1 = FloatVector.fromArray(F, kt, k1 + c);
            FloatVector r2 = FloatVector.fromArray(F, kt, k2 + c);
            FloatVector r3 = FloatVector.fromArray(F, kt, k3 + c);
            FloatVector v = FloatVector.fromArray(F, q, q0 + c);
            a00 = v.fma(r0, a00);
            a01 = v.fma(r1, a01);
            a02 = v.fma(r2, a02);
            a03 = v.fma(r3, a03);
            v = FloatVector.fromArray(F, q, q1 + c);
            a10 = v.fma(r0, a10);
            a11 = v.fma(r1, a11);
            a12 = v.fma(r2, a12);
            a13 = v.fma(r3, a13);
            v = FloatVector.fromArray(F, q, q2 + c);
            a20 = v.fma(r0, a20);
            a21 = v.fma(r1, a21);
            a22 = v.fma(r2, a22);
            a23 = v.fma(r3, a23);
            v = FloatVector.fromArray(F, q, q3 + c);
            a30 = v.fma(r0, a30);
            a31 = v.fma(r1, a31);
            a32 = v.fma(r2, a32);
            a33 = v.fma(r3, a33);
        }
        a00.intoArray(red, 0);
        a01.intoArray(red, L);
        a02.intoArray(red, 2 * L);
        a03.intoArray(red, 3 * L);
        a10.intoArray(red, 4 * L);
        a11.intoArray(red, 5 * L);
        a12.intoArray(red, 6 * L);
        a13.intoArray(red, 7 * L);
        a20.intoArray(red, 8 * L);
        a21.intoArray(red, 9 * L);
        a22.intoArray(red, 10 * L);
        a23.intoArray(red, 11 * L);
        a30.intoArray(red, 12 * L);
        a31.intoArray(red, 13 * L);
        a32.intoArray(red, 14 * L);
        a33.intoArray(red, 15 * L);
        reduce16(red, s, so);
    }

    private static void dots2(float[] q, int q0, int q1, float[] kt, int k0, int stride, int dp, float[] s, int so,
                              float[] red) {
        FloatVector a00 = FloatVector.zero(F), a01 = a00, a02 = a00, a03 = a00;
        FloatVector a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        int k1 = k0 + stride, k2 = k1 + stride, k3 = k2 + stride;
        for (int c = 0; c < dp; c += L) {
            FloatVector r0 = FloatVector.fromArray(F, kt, k0 + c);
            FloatVector r1 = FloatVector.fromArray(F, kt, k1 + c);
            FloatVector r2 = FloatVector.fromArray(F, kt, k2 + c);
            FloatVector r3 = FloatVector.fromArray(F, kt, k3 + c);
            FloatVector v = FloatVector.fromArray(F, q, q0 + c);
            a00 = v.fma(r0, a00);
            a01 = v.fma(r1, a01);
            a02 = v.fma(r2, a02);
            a03 = v.fma(r3, a03);
            v = FloatVector.fromArray(F, q, q1 + c);
            a10 = v.fma(r0, a10);
            a11 = v.fma(r1, a11);
            a12 = v.fma(r2, a12);
            a13 = v.fma(r3, a13);
        }
        a00.intoArray(red, 0);
        a01.intoArray(red, L);
        a02.intoArray(red, 2 * L);
        a03.intoArray(red, 3 * L);
        a10.intoArray(red, 4 * L);
        a11.intoArray(red, 5 * L);
        a12.intoArray(red, 6 * L);
        a13.intoArray(red, 7 * L);
        reduce8(red, s, so);
    }

    private static void dots1(float[] q, int q0, float[] kt, int k0, int stride, int dp, float[] s, int so,
                              float[] red) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        int k1 = k0 + stride, k2 = k1 + stride, k3 = k2 + stride;
        for (int c = 0; c < dp; c += L) {
            FloatVector v = FloatVector.fromArray(F, q, q0 + c);
            a0 = v.fma(FloatVector.fromArray(F, kt, k0 + c), a0);
            a1 = v.fma(FloatVector.fromArray(F, kt, k1 + c), a1);
            a2 = v.fma(FloatVector.fromArray(F, kt, k2 + c), a2);
            a3 = v.fma(FloatVector.fromArray(F, kt, k3 + c), a3);
        }
        a0.intoArray(red, 0);
        a1.intoArray(red, L);
        a2.intoArray(red, 2 * L);
        a3.intoArray(red, 3 * L);
        reduce4(red, s, so);
    }

    /**
     * The lane sums of the 16 accumulators at red (query-major) into s[so .. so+16), by the tree, in place in red.
     * Kept apart from the dot loops: inlined into them, the tree pushed C2 past its inlining budget.
     */
    private static void reduce16(float[] red, float[] s, int so) {
        for (int k = 0; k < 8; k++) {
            combine(red, 2 * k, 2 * k + 1, k, 0);
        }
        for (int k = 0; k < 4; k++) {
            combine(red, 2 * k, 2 * k + 1, k, 1);
        }
        combine(red, 0, 1, 0, 2);
        combine(red, 2, 3, 1, 2);
        if (L == 16) {
            combine(red, 0, 1, 0, 3);
            FloatVector.fromArray(F, red, 0).intoArray(s, so);
        } else {
            FloatVector.fromArray(F, red, 0).intoArray(s, so);
            FloatVector.fromArray(F, red, L).intoArray(s, so + 8);
        }
    }

    private static void reduce8(float[] red, float[] s, int so) {
        for (int k = 0; k < 4; k++) {
            combine(red, 2 * k, 2 * k + 1, k, 0);
        }
        combine(red, 0, 1, 0, 1);
        combine(red, 2, 3, 1, 1);
        combine(red, 0, 1, 0, 2);
        if (L == 16) {
            combine(red, 0, 0, 0, 3);
            FloatVector.fromArray(F, red, 0).intoArray(s, so, FIRST8);
        } else {
            FloatVector.fromArray(F, red, 0).intoArray(s, so);
        }
    }

    private static void reduce4(float[] red, float[] s, int so) {
        combine(red, 0, 1, 0, 0);
        combine(red, 2, 3, 1, 0);
        combine(red, 0, 1, 0, 1);
        combine(red, 0, 0, 0, 2);
        if (L == 16) {
            combine(red, 0, 0, 0, 3);
        }
        FloatVector.fromArray(F, red, 0).intoArray(s, so, FIRST4);
    }

    /**
     * acc[accOff[i] + d] += Σ_k w(i, rows[from + k]) · vt[vtOff + k·stride + d] for query slots [0, queries), d in
     * [0, dp), rows in the given order; w(i, r) is the blocked-layout weight {@code w[wOff + at(r, i, slots)]}.
     */
    static void weightedSum(float[] w, int wOff, int slots, int[] rows, int from, int count, float[] vt, int vtOff,
                            int stride, int dp, float[] acc, int[] accOff, int queries) {
        int i = 0;
        for (; i + 4 <= queries; i += 4) {
            sum4(w, wOff, slots, i, rows, from, count, vt, vtOff, stride, dp, acc, accOff[i], accOff[i + 1],
                    accOff[i + 2], accOff[i + 3]);
        }
        if (i + 2 <= queries) {
            sum2(w, wOff, slots, i, rows, from, count, vt, vtOff, stride, dp, acc, accOff[i], accOff[i + 1]);
            i += 2;
        }
        if (i < queries) {
            sum1(w, wOff, slots, i, rows, from, count, vt, vtOff, stride, dp, acc, accOff[i]);
        }
    }

    private static void sum4(float[] w, int wOff, int slots, int i, int[] rows, int from, int count, float[] vt,
                             int vtOff, int stride, int dp,
                             float[] acc, int o0, int o1, int o2, int o3) {
        int c = 0;
        for (; c + 4 * L <= dp; c += 4 * L) {
            int c1 = c + L, c2 = c + 2 * L, c3 = c + 3 * L;
            FloatVector a00 = FloatVector.fromArray(F, acc, o0 + c), a01 = FloatVector.fromArray(F, acc, o0 + c1);
            FloatVector a02 = FloatVector.fromArray(F, acc, o0 + c2), a03 = FloatVector.fromArray(F, acc, o0 + c3);
            FloatVector a10 = FloatVector.fromArray(F, acc, o1 + c), a11 = FloatVector.fromArray(F, acc, o1 + c1);
            FloatVector a12 = FloatVector.fromArray(F, acc, o1 + c2), a13 = FloatVector.fromArray(F, acc, o1 + c3);
            FloatVector a20 = FloatVector.fromArray(F, acc, o2 + c), a21 = FloatVector.fromArray(F, acc, o2 + c1);
            FloatVector a22 = FloatVector.fromArray(F, acc, o2 + c2), a23 = FloatVector.fromArray(F, acc, o2 + c3);
            FloatVector a30 = FloatVector.fromArray(F, acc, o3 + c), a31 = FloatVector.fromArray(F, acc, o3 + c1);
            FloatVector a32 = FloatVector.fromArray(F, acc, o3 + c2), a33 = FloatVector.fromArray(F, acc, o3 + c3);
            for (int k = 0; k < count; k++) {
                int wi = wOff + at(rows[from + k], i, slots);
                int vo = vtOff + k * stride + c;
                FloatVector v0 = FloatVector.fromArray(F, vt, vo);
                FloatVector v1 = FloatVector.fromArray(F, vt, vo + L);
                FloatVector v2 = FloatVector.fromArray(F, vt, vo + 2 * L);
                FloatVector v3 = FloatVector.fromArray(F, vt, vo + 3 * L);
                FloatVector b = FloatVector.broadcast(F, w[wi]);
                a00 = v0.fma(b, a00);
                a01 = v1.fma(b, a01);
                a02 = v2.fma(b, a02);
                a03 = v3.fma(b, a03);
                b = FloatVector.broadcast(F, w[wi + 4]);
                a10 = v0.fma(b, a10);
                a11 = v1.fma(b, a11);
                a12 = v2.fma(b, a12);
                a13 = v3.fma(b, a13);
                b = FloatVector.broadcast(F, w[wi + 8]);
                a20 = v0.fma(b, a20);
                a21 = v1.fma(b, a21);
                a22 = v2.fma(b, a22);
                a23 = v3.fma(b, a23);
                b = FloatVector.broadcast(F, w[wi + 12]);
                a30 = v0.fma(b, a30);
                a31 = v1.fma(b, a31);
                a32 = v2.fma(b, a32);
                a33 = v3.fma(b, a33);
            }
            a00.intoArray(acc, o0 + c);
            a01.intoArray(acc, o0 + c1);
            a02.intoArray(acc, o0 + c2);
            a03.intoArray(acc, o0 + c3);
            a10.intoArray(acc, o1 + c);
            a11.intoArray(acc, o1 + c1);
            a12.intoArray(acc, o1 + c2);
            a13.intoArray(acc, o1 + c3);
            a20.intoArray(acc, o2 + c);
            a21.intoArray(acc, o2 + c1);
            a22.intoArray(acc, o2 + c2);
            a23.intoArray(acc, o2 + c3);
            a30.intoArray(acc, o3 + c);
            a31.intoArray(acc, o3 + c1);
            a32.intoArray(acc, o3 + c2);
            a33.intoArray(acc, o3 + c3);
        }
        for (; c < dp; c += L) {
            FloatVector x0 = FloatVector.fromArray(F, acc, o0 + c);
            FloatVector x1 = FloatVector.fromArray(F, acc, o1 + c);
            FloatVector x2 = FloatVector.fromArray(F, acc, o2 + c);
            FloatVector x3 = FloatVector.fromArray(F, acc, o3 + c);
            for (int k = 0; k < count; k++) {
                int wi = wOff + at(rows[from + k], i, slots);
                FloatVector vx = FloatVector.fromArray(F, vt, vtOff + k * stride + c);
                x0 = vx.fma(FloatVector.broadcast(F, w[wi]), x0);
                x1 = vx.fma(FloatVector.broadcast(F, w[wi + 4]), x1);
                x2 = vx.fma(FloatVector.broadcast(F, w[wi + 8]), x2);
                x3 = vx.fma(FloatVector.broadcast(F, w[wi + 12]), x3);
            }
            x0.intoArray(acc, o0 + c);
            x1.intoArray(acc, o1 + c);
            x2.intoArray(acc, o2 + c);
            x3.intoArray(acc, o3 + c);
        }
    }

    private static void sum2(float[] w, int wOff, int slots, int i, int[] rows, int from, int count, float[] vt,
                             int vtOff, int stride, int dp,
                             float[] acc, int o0, int o1) {
        int c = 0;
        for (; c + 4 * L <= dp; c += 4 * L) {
            FloatVector x0 = FloatVector.fromArray(F, acc, o0 + c), y0 = FloatVector.fromArray(F, acc, o0 + c + L);
            FloatVector z0 = FloatVector.fromArray(F, acc, o0 + c + 2 * L);
            FloatVector u0 = FloatVector.fromArray(F, acc, o0 + c + 3 * L);
            FloatVector x1 = FloatVector.fromArray(F, acc, o1 + c), y1 = FloatVector.fromArray(F, acc, o1 + c + L);
            FloatVector z1 = FloatVector.fromArray(F, acc, o1 + c + 2 * L);
            FloatVector u1 = FloatVector.fromArray(F, acc, o1 + c + 3 * L);
            for (int k = 0; k < count; k++) {
                int wi = wOff + at(rows[from + k], i, slots);
                int vo = vtOff + k * stride + c;
                FloatVector vx = FloatVector.fromArray(F, vt, vo);
                FloatVector vy = FloatVector.fromArray(F, vt, vo + L);
                FloatVector vz = FloatVector.fromArray(F, vt, vo + 2 * L);
                FloatVector vu = FloatVector.fromArray(F, vt, vo + 3 * L);
                FloatVector b = FloatVector.broadcast(F, w[wi]);
                x0 = vx.fma(b, x0);
                y0 = vy.fma(b, y0);
                z0 = vz.fma(b, z0);
                u0 = vu.fma(b, u0);
                b = FloatVector.broadcast(F, w[wi + 4]);
                x1 = vx.fma(b, x1);
                y1 = vy.fma(b, y1);
                z1 = vz.fma(b, z1);
                u1 = vu.fma(b, u1);
            }
            x0.intoArray(acc, o0 + c);
            y0.intoArray(acc, o0 + c + L);
            z0.intoArray(acc, o0 + c + 2 * L);
            u0.intoArray(acc, o0 + c + 3 * L);
            x1.intoArray(acc, o1 + c);
            y1.intoArray(acc, o1 + c + L);
            z1.intoArray(acc, o1 + c + 2 * L);
            u1.intoArray(acc, o1 + c + 3 * L);
        }
        for (; c < dp; c += L) {
            FloatVector x0 = FloatVector.fromArray(F, acc, o0 + c);
            FloatVector x1 = FloatVector.fromArray(F, acc, o1 + c);
            for (int k = 0; k < count; k++) {
                int wi = wOff + at(rows[from + k], i, slots);
                FloatVector vx = FloatVector.fromArray(F, vt, vtOff + k * stride + c);
                x0 = vx.fma(FloatVector.broadcast(F, w[wi]), x0);
                x1 = vx.fma(FloatVector.broadcast(F, w[wi + 4]), x1);
            }
            x0.intoArray(acc, o0 + c);
            x1.intoArray(acc, o1 + c);
        }
    }

    private static void sum1(float[] w, int wOff, int slots, int i, int[] rows, int from, int count, float[] vt,
                             int vtOff, int stride, int dp,
                             float[] acc, int o0) {
        int c = 0;
        for (; c + 4 * L <= dp; c += 4 * L) {
            FloatVector x = FloatVector.fromArray(F, acc, o0 + c);
            FloatVector y = FloatVector.fromArray(F, acc, o0 + c + L);
            FloatVector z = FloatVector.fromArray(F, acc, o0 + c + 2 * L);
            FloatVector u = FloatVector.fromArray(F, acc, o0 + c + 3 * L);
            for (int k = 0; k < count; k++) {
                int vo = vtOff + k * stride + c;
                FloatVector b = FloatVector.broadcast(F, w[wOff + at(rows[from + k], i, slots)]);
                x = FloatVector.fromArray(F, vt, vo).fma(b, x);
                y = FloatVector.fromArray(F, vt, vo + L).fma(b, y);
                z = FloatVector.fromArray(F, vt, vo + 2 * L).fma(b, z);
                u = FloatVector.fromArray(F, vt, vo + 3 * L).fma(b, u);
            }
            x.intoArray(acc, o0 + c);
            y.intoArray(acc, o0 + c + L);
            z.intoArray(acc, o0 + c + 2 * L);
            u.intoArray(acc, o0 + c + 3 * L);
        }
        for (; c < dp; c += L) {
            FloatVector x = FloatVector.fromArray(F, acc, o0 + c);
            for (int k = 0; k < count; k++) {
                x = FloatVector.fromArray(F, vt, vtOff + k * stride + c).fma(FloatVector.broadcast(F, w[wOff + at(rows[from + k], i, slots)]), x);
            }
            x.intoArray(acc, o0 + c);
        }
    }
}
