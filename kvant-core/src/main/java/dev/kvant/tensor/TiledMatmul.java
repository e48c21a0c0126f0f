package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.Lanes.ODD_EIGHTHS;
import static dev.kvant.tensor.Lanes.ODD_LANES;
import static dev.kvant.tensor.Lanes.ODD_QUARTERS;
import static dev.kvant.tensor.Lanes.SWAP_EIGHTHS;
import static dev.kvant.tensor.Lanes.SWAP_HALVES;
import static dev.kvant.tensor.Lanes.SWAP_QUARTERS;
import static dev.kvant.tensor.Lanes.SWAP_SIXTEENTHS;
import static dev.kvant.tensor.Lanes.UPPER_HALF;

import java.util.Arrays;
import jdk.incubator.vector.FloatVector;

/**
 * Weights times many vectors (prompt processing): each task decodes a tile of weight rows into a per-thread float
 * scratch once and multiplies it with all vectors, so decoding is paid once per tile, not once per vector.
 *
 * <p>Inner kernel: 4 rows x 4 vectors, 16 accumulators (plus 4 weight and 4 x registers, 24 of the 32 AVX-512
 * registers), each a dot product in the one order of {@link WeightFormat}: chunk by chunk, fma into its own
 * accumulator, then the lane tree of {@link Lanes#sum} (at 16 lanes all sixteen sums at once in registers, else
 * {@link Lanes#sum4}). So every output is bitwise what {@link WeightMatrix#matvec} gives (the
 * tile holds exactly the values the fused kernels decode on the fly, zero-padded alike, and tile and x rows are
 * arranged in the chunk order of {@link FusedRows#chunkOrder}).
 * Loop order: vectors outer, rows inner, so a quad of x rows stays in L1 while the tile streams from L2 (blocking
 * the rows so that some stay in L1 was slower, docs/BENCHMARKS.md).
 *
 * <p>Tasks are tiles of rows; a tile's size depends only on the matrix width, never on the thread count.
 */
final class TiledMatmul {
    /**
     * Bytes of decoded weights per tile: small enough to stay in L2 (1 MiB per core on Zen 4/5, 2 MiB on recent
     * Intel) beside the x rows streaming through.
     */
    private static final int TILE_BYTES = 256 << 10;
    private static final int MAX_TILE_ROWS = 64;
    private static final ThreadLocal<float[]> SCRATCH = ThreadLocal.withInitial(() -> new float[0]);

    private TiledMatmul() {
    }

    static void run(WeightMatrix m, WeightMatrix.Rows v, float[] x, int n, float[] out, Parallel pool) {
        int rows = m.rows();
        int cols = m.cols();
        int stride = roundUp(cols, L);
        int[] order = v.kernels().chunkOrder();
        // x rows in the kernels' chunk order, zero-padded to whole chunks like the weight rows, so the inner
        // kernel runs whole chunks in the order the fused kernels take them.
        float[] xs = x;
        if (order != null || stride != cols) {
            xs = new float[n * stride];
            for (int i = 0; i < n; i++) {
                arrange(x, i * cols, xs, i * stride, cols, m.format().blockSize(), order);
            }
        }
        float[] xp = xs;
        int tileRows = Math.clamp((TILE_BYTES / 4 / stride) & ~3, 4, MAX_TILE_ROWS);
        int tiles = (rows + tileRows - 1) / tileRows;
        pool.forEach(tiles, t -> tile(m, v, order, xp, n, out, t * tileRows, Math.min(rows, (t + 1) * tileRows),
                stride));
    }

    /** Copies {@code n} values, each block's chunks in {@code order} (or as they are, when null). */
    private static void arrange(float[] src, int from, float[] dst, int to, int n, int blockSize, int[] order) {
        if (order == null) {
            System.arraycopy(src, from, dst, to, n);
            return;
        }
        for (int b = 0; b < n; b += blockSize) {
            for (int c = 0; c < order.length; c++) {
                System.arraycopy(src, from + b + order[c], dst, to + b + c * L, L);
            }
        }
    }

    /** Rows r0..r1-1 against all n vectors (x rows {@code stride} apart). */
    private static void tile(WeightMatrix m, WeightMatrix.Rows v, int[] order, float[] x, int n, float[] out, int r0, int r1,
                             int stride) {
        int cols = m.cols();
        int rows = m.rows();
        int count = r1 - r0;
        int padded = roundUp(count, 4);
        float[] w = scratch(padded * stride);
        float[] row = order == null ? null : new float[cols];
        for (int r = 0; r < count; r++) {
            if (order == null) {
                m.decodeRow(v, r0 + r, w, r * stride);
            } else {
                m.decodeRow(v, r0 + r, row, 0);
                arrange(row, 0, w, r * stride, cols, m.format().blockSize(), order);
            }
            Arrays.fill(w, r * stride + cols, (r + 1) * stride, 0f);
        }
        Arrays.fill(w, count * stride, padded * stride, 0f);
        float[] t = new float[4 * L];
        float[] spill = new float[16];
        int i = 0;
        for (; i + 4 <= n; i += 4) {
            for (int r = 0; r < padded; r += 4) {
                int valid = Math.min(4, count - r);
                if (valid == 4) {
                    kernel4x4(w, r * stride, x, i * stride, stride, t, out, i * rows + r0 + r, rows);
                } else {
                    kernel4x4(w, r * stride, x, i * stride, stride, t, spill, 0, 4);
                    for (int c = 0; c < 4; c++) {
                        System.arraycopy(spill, 4 * c, out, (i + c) * rows + r0 + r, valid);
                    }
                }
            }
        }
        for (; i < n; i++) {
            for (int r = 0; r < padded; r += 4) {
                int valid = Math.min(4, count - r);
                if (valid == 4) {
                    kernel4x1(w, r * stride, x, i * stride, stride, t, out, i * rows + r0 + r);
                } else {
                    kernel4x1(w, r * stride, x, i * stride, stride, t, spill, 0);
                    System.arraycopy(spill, 0, out, i * rows + r0 + r, valid);
                }
            }
        }
    }

    private static float[] scratch(int size) {
        float[] s = SCRATCH.get();
        if (s.length < size) {
            s = new float[size];
            SCRATCH.set(s);
        }
        return s;
    }

    /**
     * Weight rows at w0, w0+len, w0+2len, w0+3len against x rows at x0, x0+len, ... ({@code len} a multiple
     * of L); the result for row r and vector c goes to {@code out[o + c*os + r]}. {@code t}: 4L floats of scratch.
     */
    private static void kernel4x4(float[] w, int w0, float[] x, int x0, int len, float[] t,
                                  float[] out, int o, int os) {
        FloatVector c00 = FloatVector.zero(F), c01 = c00, c02 = c00, c03 = c00;
        FloatVector c10 = c00, c11 = c00, c12 = c00, c13 = c00;
        FloatVector c20 = c00, c21 = c00, c22 = c00, c23 = c00;
        FloatVector c30 = c00, c31 = c00, c32 = c00, c33 = c00;
        int w1 = w0 + len, w2 = w1 + len, w3 = w2 + len;
        int x1 = x0 + len, x2 = x1 + len, x3 = x2 + len;
        for (int k = 0; k < len; k += L) {
            FloatVector v0 = FloatVector.fromArray(F, w, w0 + k);
            FloatVector v1 = FloatVector.fromArray(F, w, w1 + k);
            FloatVector v2 = FloatVector.fromArray(F, w, w2 + k);
            FloatVector v3 = FloatVector.fromArray(F, w, w3 + k);
            FloatVector y = FloatVector.fromArray(F, x, x0 + k);
            c00 = v0.fma(y, c00);
            c10 = v1.fma(y, c10);
            c20 = v2.fma(y, c20);
            c30 = v3.fma(y, c30);
            y = FloatVector.fromArray(F, x, x1 + k);
            c01 = v0.fma(y, c01);
            c11 = v1.fma(y, c11);
            c21 = v2.fma(y, c21);
            c31 = v3.fma(y, c31);
            y = FloatVector.fromArray(F, x, x2 + k);
            c02 = v0.fma(y, c02);
            c12 = v1.fma(y, c12);
            c22 = v2.fma(y, c22);
            c32 = v3.fma(y, c32);
            y = FloatVector.fromArray(F, x, x3 + k);
            c03 = v0.fma(y, c03);
            c13 = v1.fma(y, c13);
            c23 = v2.fma(y, c23);
            c33 = v3.fma(y, c33);
        }
        if (L == 16) {
            // The 16 sums by Lanes.sum's tree on whole vectors: each level pairs two accumulators' partial sums per
            // vector (lane j with j + 8, then + 4, + 2, + 1, the adds of sum), halving the vectors, so the last
            // holds every result: lanes 4c..4c+3 are rows 0..3 of vector c. Half the operations of four sum4.
            FloatVector p0 = c00.blend(c02, UPPER_HALF).add(c02.blend(c00, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p1 = c01.blend(c03, UPPER_HALF).add(c03.blend(c01, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p2 = c20.blend(c22, UPPER_HALF).add(c22.blend(c20, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p3 = c21.blend(c23, UPPER_HALF).add(c23.blend(c21, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p4 = c10.blend(c12, UPPER_HALF).add(c12.blend(c10, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p5 = c11.blend(c13, UPPER_HALF).add(c13.blend(c11, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p6 = c30.blend(c32, UPPER_HALF).add(c32.blend(c30, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector p7 = c31.blend(c33, UPPER_HALF).add(c33.blend(c31, UPPER_HALF).rearrange(SWAP_HALVES));
            FloatVector q0 = p0.blend(p1, ODD_QUARTERS).add(p1.blend(p0, ODD_QUARTERS).rearrange(SWAP_QUARTERS));
            FloatVector q1 = p2.blend(p3, ODD_QUARTERS).add(p3.blend(p2, ODD_QUARTERS).rearrange(SWAP_QUARTERS));
            FloatVector q2 = p4.blend(p5, ODD_QUARTERS).add(p5.blend(p4, ODD_QUARTERS).rearrange(SWAP_QUARTERS));
            FloatVector q3 = p6.blend(p7, ODD_QUARTERS).add(p7.blend(p6, ODD_QUARTERS).rearrange(SWAP_QUARTERS));
            FloatVector r0 = q0.blend(q1, ODD_EIGHTHS).add(q1.blend(q0, ODD_EIGHTHS).rearrange(SWAP_EIGHTHS));
            FloatVector r1 = q2.blend(q3, ODD_EIGHTHS).add(q3.blend(q2, ODD_EIGHTHS).rearrange(SWAP_EIGHTHS));
            r0.blend(r1, ODD_LANES).add(r1.blend(r0, ODD_LANES).rearrange(SWAP_SIXTEENTHS)).intoArray(t, 0);
            for (int c = 0; c < 4; c++) {
                System.arraycopy(t, 4 * c, out, o + c * os, 4);
            }
            return;
        }
        c00.intoArray(t, 0);
        c10.intoArray(t, L);
        c20.intoArray(t, 2 * L);
        c30.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, o, 1);
        c01.intoArray(t, 0);
        c11.intoArray(t, L);
        c21.intoArray(t, 2 * L);
        c31.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, o + os, 1);
        c02.intoArray(t, 0);
        c12.intoArray(t, L);
        c22.intoArray(t, 2 * L);
        c32.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, o + 2 * os, 1);
        c03.intoArray(t, 0);
        c13.intoArray(t, L);
        c23.intoArray(t, 2 * L);
        c33.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, o + 3 * os, 1);
    }

    /** Weight rows at w0, w0+len, ... against the one x row at x0; results to out[o..o+3]. */
    private static void kernel4x1(float[] w, int w0, float[] x, int x0, int len, float[] t, float[] out, int o) {
        FloatVector c0 = FloatVector.zero(F), c1 = c0, c2 = c0, c3 = c0;
        int w1 = w0 + len, w2 = w1 + len, w3 = w2 + len;
        for (int k = 0; k < len; k += L) {
            FloatVector y = FloatVector.fromArray(F, x, x0 + k);
            c0 = FloatVector.fromArray(F, w, w0 + k).fma(y, c0);
            c1 = FloatVector.fromArray(F, w, w1 + k).fma(y, c1);
            c2 = FloatVector.fromArray(F, w, w2 + k).fma(y, c2);
            c3 = FloatVector.fromArray(F, w, w3 + k).fma(y, c3);
        }
        c0.intoArray(t, 0);
        c1.intoArray(t, L);
        c2.intoArray(t, 2 * L);
        c3.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, o, 1);
    }

    private static int roundUp(int a, int multiple) {
        return (a + multiple - 1) / multiple * multiple;
    }
}
