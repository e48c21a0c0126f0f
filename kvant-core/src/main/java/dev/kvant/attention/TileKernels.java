package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.combine;

import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
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

    private TileKernels() {
    }

    /** The blocked-layout index of (row, query slot). */
    /** The first 8 and 4 lanes (16-lane reductions of 8 or 4 accumulators leave their sums there). */
    private static final VectorMask<Float> FIRST_8 = VectorMask.fromLong(F, 0xFFL);
    private static final VectorMask<Float> FIRST_4 = VectorMask.fromLong(F, 0xFL);

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
        // Blocks of 4 rows are slots·4 floats apart in s.
        int step = 4 * slots;
        int s0 = sOff + (row0 >> 2) * step;
        int blocks = rows4 / 4;
        int i = 0;
        for (; i + 4 <= queries; i += 4) {
            dots4(q, qOff[i], qOff[i + 1], qOff[i + 2], qOff[i + 3], kt, ktOff, stride, blocks, dp, s, s0 + 4 * i,
                    step, red);
        }
        if (i + 2 <= queries) {
            dots2(q, qOff[i], qOff[i + 1], kt, ktOff, stride, blocks, dp, s, s0 + 4 * i, step, red);
            i += 2;
        }
        if (i < queries) {
            dots1(q, qOff[i], kt, ktOff, stride, blocks, dp, s, s0 + 4 * i, step, red);
        }
    }

    /**
     * 4 queries against blocks of 4 rows from kt[k0]: per block, 16 accumulators, summed across lanes into
     * s[so + b·step ..+16). The rows loop is inside so the queries' bounds checks are paid once per call.
     */
    private static void dots4(float[] q, int q0, int q1, int q2, int q3, float[] kt, int k0, int stride, int blocks,
                              int dp, float[] s, int so, int step, float[] red) {
        IntVector l0 = IntVector.fromArray(I, Lanes.low(0), 0), h0 = IntVector.fromArray(I, Lanes.high(0), 0);
        IntVector l1 = IntVector.fromArray(I, Lanes.low(1), 0), h1 = IntVector.fromArray(I, Lanes.high(1), 0);
        IntVector l2 = IntVector.fromArray(I, Lanes.low(2), 0), h2 = IntVector.fromArray(I, Lanes.high(2), 0);
        IntVector l3 = IntVector.fromArray(I, Lanes.low(Math.min(3, Lanes.STAGES - 1)), 0);
        IntVector h3 = IntVector.fromArray(I, Lanes.high(Math.min(3, Lanes.STAGES - 1)), 0);
        for (int b = 0; b < blocks; b++) {
            FloatVector a00 = FloatVector.zero(F), a01 = a00, a02 = a00, a03 = a00;
            FloatVector a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            FloatVector a20 = a00, a21 = a00, a22 = a00, a23 = a00;
            FloatVector a30 = a00, a31 = a00, a32 = a00, a33 = a00;
            int r0 = k0 + 4 * b * stride, r1 = r0 + stride, r2 = r1 + stride, r3 = r2 + stride;
            for (int c = 0; c < dp; c += L) {
                FloatVector x0 = FloatVector.fromArray(F, kt, r0 + c);
                FloatVector x1 = FloatVector.fromArray(F, kt, r1 + c);
                FloatVector x2 = FloatVector.fromArray(F, kt, r2 + c);
                FloatVector x3 = FloatVector.fromArray(F, kt, r3 + c);
                FloatVector v = FloatVector.fromArray(F, q, q0 + c);
                a00 = v.fma(x0, a00);
                a01 = v.fma(x1, a01);
                a02 = v.fma(x2, a02);
                a03 = v.fma(x3, a03);
                v = FloatVector.fromArray(F, q, q1 + c);
                a10 = v.fma(x0, a10);
                a11 = v.fma(x1, a11);
                a12 = v.fma(x2, a12);
                a13 = v.fma(x3, a13);
                v = FloatVector.fromArray(F, q, q2 + c);
                a20 = v.fma(x0, a20);
                a21 = v.fma(x1, a21);
                a22 = v.fma(x2, a22);
                a23 = v.fma(x3, a23);
                v = FloatVector.fromArray(F, q, q3 + c);
                a30 = v.fma(x0, a30);
                a31 = v.fma(x1, a31);
                a32 = v.fma(x2, a32);
                a33 = v.fma(x3, a33);
            }
            if (L == 16) {
                // The tree of reduce(), in registers: 15 pair steps, no stores.
                IntVector c0 = l0.selectFrom(a00.reinterpretAsInts(), a01.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a00.reinterpretAsInts(), a01.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c1 = l0.selectFrom(a02.reinterpretAsInts(), a03.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a02.reinterpretAsInts(), a03.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c2 = l0.selectFrom(a10.reinterpretAsInts(), a11.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a10.reinterpretAsInts(), a11.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c3 = l0.selectFrom(a12.reinterpretAsInts(), a13.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a12.reinterpretAsInts(), a13.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c4 = l0.selectFrom(a20.reinterpretAsInts(), a21.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a20.reinterpretAsInts(), a21.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c5 = l0.selectFrom(a22.reinterpretAsInts(), a23.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a22.reinterpretAsInts(), a23.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c6 = l0.selectFrom(a30.reinterpretAsInts(), a31.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a30.reinterpretAsInts(), a31.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c7 = l0.selectFrom(a32.reinterpretAsInts(), a33.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a32.reinterpretAsInts(), a33.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d0 = l1.selectFrom(c0, c1).reinterpretAsFloats().add(h1.selectFrom(c0, c1).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d1 = l1.selectFrom(c2, c3).reinterpretAsFloats().add(h1.selectFrom(c2, c3).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d2 = l1.selectFrom(c4, c5).reinterpretAsFloats().add(h1.selectFrom(c4, c5).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d3 = l1.selectFrom(c6, c7).reinterpretAsFloats().add(h1.selectFrom(c6, c7).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector e0 = l2.selectFrom(d0, d1).reinterpretAsFloats().add(h2.selectFrom(d0, d1).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector e1 = l2.selectFrom(d2, d3).reinterpretAsFloats().add(h2.selectFrom(d2, d3).reinterpretAsFloats())
                        .reinterpretAsInts();
                l3.selectFrom(e0, e1).reinterpretAsFloats().add(h3.selectFrom(e0, e1).reinterpretAsFloats())
                        .intoArray(s, so + b * step);
                continue;
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
            reduce(red, 16, s, so + b * step);
        }
    }

    private static void dots2(float[] q, int q0, int q1, float[] kt, int k0, int stride, int blocks, int dp,
                              float[] s, int so, int step, float[] red) {
        IntVector l0 = IntVector.fromArray(I, Lanes.low(0), 0), h0 = IntVector.fromArray(I, Lanes.high(0), 0);
        IntVector l1 = IntVector.fromArray(I, Lanes.low(1), 0), h1 = IntVector.fromArray(I, Lanes.high(1), 0);
        IntVector l2 = IntVector.fromArray(I, Lanes.low(2), 0), h2 = IntVector.fromArray(I, Lanes.high(2), 0);
        IntVector l3 = IntVector.fromArray(I, Lanes.low(Math.min(3, Lanes.STAGES - 1)), 0);
        IntVector h3 = IntVector.fromArray(I, Lanes.high(Math.min(3, Lanes.STAGES - 1)), 0);
        for (int b = 0; b < blocks; b++) {
            FloatVector a00 = FloatVector.zero(F), a01 = a00, a02 = a00, a03 = a00;
            FloatVector a10 = a00, a11 = a00, a12 = a00, a13 = a00;
            int r0 = k0 + 4 * b * stride, r1 = r0 + stride, r2 = r1 + stride, r3 = r2 + stride;
            for (int c = 0; c < dp; c += L) {
                FloatVector x0 = FloatVector.fromArray(F, kt, r0 + c);
                FloatVector x1 = FloatVector.fromArray(F, kt, r1 + c);
                FloatVector x2 = FloatVector.fromArray(F, kt, r2 + c);
                FloatVector x3 = FloatVector.fromArray(F, kt, r3 + c);
                FloatVector v = FloatVector.fromArray(F, q, q0 + c);
                a00 = v.fma(x0, a00);
                a01 = v.fma(x1, a01);
                a02 = v.fma(x2, a02);
                a03 = v.fma(x3, a03);
                v = FloatVector.fromArray(F, q, q1 + c);
                a10 = v.fma(x0, a10);
                a11 = v.fma(x1, a11);
                a12 = v.fma(x2, a12);
                a13 = v.fma(x3, a13);
            }
            if (L == 16) {
                // reduce(red, 8, ...)'s operations in registers: the same pairs, no stores and reloads
                IntVector c0 = l0.selectFrom(a00.reinterpretAsInts(), a01.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a00.reinterpretAsInts(), a01.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c1 = l0.selectFrom(a02.reinterpretAsInts(), a03.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a02.reinterpretAsInts(), a03.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c2 = l0.selectFrom(a10.reinterpretAsInts(), a11.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a10.reinterpretAsInts(), a11.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c3 = l0.selectFrom(a12.reinterpretAsInts(), a13.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a12.reinterpretAsInts(), a13.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d0 = l1.selectFrom(c0, c1).reinterpretAsFloats().add(h1.selectFrom(c0, c1).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d1 = l1.selectFrom(c2, c3).reinterpretAsFloats().add(h1.selectFrom(c2, c3).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector e0 = l2.selectFrom(d0, d1).reinterpretAsFloats().add(h2.selectFrom(d0, d1).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector e1 = l2.selectFrom(d0, d0).reinterpretAsFloats().add(h2.selectFrom(d0, d0).reinterpretAsFloats())
                        .reinterpretAsInts();
                l3.selectFrom(e0, e1).reinterpretAsFloats().add(h3.selectFrom(e0, e1).reinterpretAsFloats())
                        .intoArray(s, so + b * step, FIRST_8);
                continue;
            }
            a00.intoArray(red, 0);
            a01.intoArray(red, L);
            a02.intoArray(red, 2 * L);
            a03.intoArray(red, 3 * L);
            a10.intoArray(red, 4 * L);
            a11.intoArray(red, 5 * L);
            a12.intoArray(red, 6 * L);
            a13.intoArray(red, 7 * L);
            reduce(red, 8, s, so + b * step);
        }
    }

    private static void dots1(float[] q, int q0, float[] kt, int k0, int stride, int blocks, int dp, float[] s,
                              int so, int step, float[] red) {
        IntVector l0 = IntVector.fromArray(I, Lanes.low(0), 0), h0 = IntVector.fromArray(I, Lanes.high(0), 0);
        IntVector l1 = IntVector.fromArray(I, Lanes.low(1), 0), h1 = IntVector.fromArray(I, Lanes.high(1), 0);
        IntVector l2 = IntVector.fromArray(I, Lanes.low(2), 0), h2 = IntVector.fromArray(I, Lanes.high(2), 0);
        IntVector l3 = IntVector.fromArray(I, Lanes.low(Math.min(3, Lanes.STAGES - 1)), 0);
        IntVector h3 = IntVector.fromArray(I, Lanes.high(Math.min(3, Lanes.STAGES - 1)), 0);
        for (int b = 0; b < blocks; b++) {
            FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
            int r0 = k0 + 4 * b * stride, r1 = r0 + stride, r2 = r1 + stride, r3 = r2 + stride;
            for (int c = 0; c < dp; c += L) {
                FloatVector v = FloatVector.fromArray(F, q, q0 + c);
                a0 = v.fma(FloatVector.fromArray(F, kt, r0 + c), a0);
                a1 = v.fma(FloatVector.fromArray(F, kt, r1 + c), a1);
                a2 = v.fma(FloatVector.fromArray(F, kt, r2 + c), a2);
                a3 = v.fma(FloatVector.fromArray(F, kt, r3 + c), a3);
            }
            if (L == 16) {
                // reduce(red, 4, ...)'s operations in registers (its later stages pair d0 with itself)
                IntVector c0 = l0.selectFrom(a0.reinterpretAsInts(), a1.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a0.reinterpretAsInts(), a1.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector c1 = l0.selectFrom(a2.reinterpretAsInts(), a3.reinterpretAsInts()).reinterpretAsFloats()
                        .add(h0.selectFrom(a2.reinterpretAsInts(), a3.reinterpretAsInts()).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector d0 = l1.selectFrom(c0, c1).reinterpretAsFloats().add(h1.selectFrom(c0, c1).reinterpretAsFloats())
                        .reinterpretAsInts();
                IntVector e0 = l2.selectFrom(d0, d0).reinterpretAsFloats().add(h2.selectFrom(d0, d0).reinterpretAsFloats())
                        .reinterpretAsInts();
                l3.selectFrom(e0, e0).reinterpretAsFloats().add(h3.selectFrom(e0, e0).reinterpretAsFloats())
                        .intoArray(s, so + b * step, FIRST_4);
                continue;
            }
            a0.intoArray(red, 0);
            a1.intoArray(red, L);
            a2.intoArray(red, 2 * L);
            a3.intoArray(red, 3 * L);
            reduce(red, 4, s, so + b * step);
        }
    }

    /**
     * The lane sums of the n (16, 8 or 4) accumulators at red into s[so .. so+n), lane j of the result being
     * accumulator j's sum, by the tree of {@link Lanes#combine} (a vector left without a partner pairs with itself).
     * The kernels call it below 16 lanes only: with 16 they write the same tree out in registers (dots4, dots2,
     * dots1), since left to calls C2 did not inline it and the reduction cost as much as the dot products.
     */
    static void reduce(float[] red, int n, float[] s, int so) {
        int v = n;
        for (int stage = 0; stage < Lanes.STAGES; stage++) {
            int pairs = Math.max(1, v / 2);
            for (int k = 0; k < pairs; k++) {
                combine(red, Math.min(2 * k, v - 1), Math.min(2 * k + 1, v - 1), k, stage);
            }
            v = pairs;
        }
        // The sums now lie in order at red[0 .. n), L to a vector.
        System.arraycopy(red, 0, s, so, n);
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
