package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.B;
import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.B2F;
import static jdk.incubator.vector.VectorOperators.I2F;
import static jdk.incubator.vector.VectorOperators.LSHL;
import static jdk.incubator.vector.VectorOperators.LSHR;
import static jdk.incubator.vector.VectorOperators.ZERO_EXTEND_B2I;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.util.Arrays;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;

/**
 * Q6_K: super-blocks of 256 values, 210 bytes: 128 bytes {@code ql} (low four bits), 64 bytes {@code qh} (high
 * two bits), 16 int8 scales (one per 16 values), fp16 {@code d} last. Each half of 128 values uses 64 ql bytes,
 * 32 qh bytes and 8 scales; within a half, value {@code 32*g + l} (quarter g = 0..3, l = 0..31) takes its low bits
 * from ql[l + 32*(g&1)] (low nibble for g < 2, high for g >= 2) and its high bits from bits 2g..2g+1 of qh[l].
 * Value = d * scale * (q - 32): exact in float (11 + 7 + 6 significant bits at most), so the kernels'
 * {@code fma(q, d*scale, -32*d*scale)} is the same value — but for its sign at q = 32 under a negative d·scale: +0
 * here, -0 in ggml's {@code d*sc*(q-32)} (no sum or product changes: -0 and +0 add alike to any sum begun at +0).
 *
 * <p>Kernels read a half in byte order: for each chunk position l, the four quarters' chunks at l, which share
 * their qh bytes and pairwise their ql bytes ({@link #chunkOrder}).
 */
final class Q6_KFormat implements WeightFormat, FusedRows {
    static final Q6_KFormat INSTANCE = new Q6_KFormat();
    private static final int QK = 256;
    private static final int BYTES = 210;
    private static final int QH = 128;
    private static final int SCALES = 192;
    private static final int D = 208;
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);
    /** Scratch {@code t[DS + 32*r ..]}: row r's 16 factors d*scale, then their -32 multiples. */
    private static final int DS = 4 * L;
    /** Runs of L bytes per half super-block, and per super-block. */
    private static final int RUNS_PER_HALF = 32 / L;
    private static final int RUNS = 2 * RUNS_PER_HALF;
    private static final int[] CHUNK_ORDER = halfOrder();

    private Q6_KFormat() {
    }

    private static int[] halfOrder() {
        int[] order = new int[QK / L];
        int c = 0;
        for (int half = 0; half < 2; half++) {
            for (int l = 0; l < 32; l += L) {
                for (int g = 0; g < 4; g++) {
                    order[c++] = 128 * half + 32 * g + l;
                }
            }
        }
        return order;
    }

    @Override
    public GgmlType type() {
        return GgmlType.Q6_K;
    }

    @Override
    public int[] chunkOrder() {
        return CHUNK_ORDER;
    }

    private static float half(long at) {
        return Float.float16ToFloat(ALL.get(SHORT_LE, at));
    }

    /** The factors of the super-block at {@code block}: 16 of d * scale_i, then 16 of -32 times those. */
    private static void scales(long block, float[] t, int o) {
        float d = half(block + D);
        for (int i = 0; i < 16; i += L) {
            FloatVector sc = (FloatVector) ByteVector.fromMemorySegment(B, ALL, block + SCALES + i, LE)
                    .convertShape(B2F, F, 0);
            sc.mul(d).intoArray(t, o + i);
            sc.mul(-32 * d).intoArray(t, o + 16 + i);
        }
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        float[] ds = new float[32];
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int half = run / RUNS_PER_HALF;
            int l = run % RUNS_PER_HALF * L;
            long p = address + block * unitStride;
            if (run == 0) {
                scales(p, ds, 0);
            }
            int si = 8 * half + l / 16;
            long ql = p + 64 * half + l;
            IntVector la = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql, LE).convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector lb = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql + 32, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector h = (IntVector) ByteVector.fromMemorySegment(B, ALL, p + QH + 32 * half + l, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            int at = o + block * QK + 128 * half + l;
            ((FloatVector) la.and(0x0f).or(h.lanewise(LSHL, 4).and(0x30)).convert(I2F, 0))
                    .fma(ds[si], ds[si + 16]).intoArray(dst, at);
            ((FloatVector) lb.and(0x0f).or(h.lanewise(LSHL, 2).and(0x30)).convert(I2F, 0))
                    .fma(ds[si + 2], ds[si + 18]).intoArray(dst, at + 32);
            ((FloatVector) la.lanewise(LSHR, 4).or(h.and(0x30)).convert(I2F, 0))
                    .fma(ds[si + 4], ds[si + 20]).intoArray(dst, at + 64);
            ((FloatVector) lb.lanewise(LSHR, 4).or(h.lanewise(LSHR, 2).and(0x30)).convert(I2F, 0))
                    .fma(ds[si + 6], ds[si + 22]).intoArray(dst, at + 96);
        }
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        float[] ds = new float[32];
        FloatVector acc = FloatVector.zero(F);
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int half = run / RUNS_PER_HALF;
            int l = run % RUNS_PER_HALF * L;
            long p = address + (long) block * BYTES;
            if (run == 0) {
                scales(p, ds, 0);
            }
            int si = 8 * half + l / 16;
            long ql = p + 64 * half + l;
            IntVector la = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql, LE).convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector lb = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql + 32, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector h = (IntVector) ByteVector.fromMemorySegment(B, ALL, p + QH + 32 * half + l, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            int xk = xOffset + block * QK + 128 * half + l;
            acc = ((FloatVector) la.and(0x0f).or(h.lanewise(LSHL, 4).and(0x30)).convert(I2F, 0))
                    .fma(ds[si], ds[si + 16]).fma(FloatVector.fromArray(F, x, xk), acc);
            acc = ((FloatVector) lb.and(0x0f).or(h.lanewise(LSHL, 2).and(0x30)).convert(I2F, 0))
                    .fma(ds[si + 2], ds[si + 18]).fma(FloatVector.fromArray(F, x, xk + 32), acc);
            acc = ((FloatVector) la.lanewise(LSHR, 4).or(h.and(0x30)).convert(I2F, 0))
                    .fma(ds[si + 4], ds[si + 20]).fma(FloatVector.fromArray(F, x, xk + 64), acc);
            acc = ((FloatVector) lb.lanewise(LSHR, 4).or(h.lanewise(LSHR, 2).and(0x30)).convert(I2F, 0))
                    .fma(ds[si + 6], ds[si + 22]).fma(FloatVector.fromArray(F, x, xk + 96), acc);
        }
        return Lanes.sum(acc);
    }

    /**
     * Two rows per pass, not four: a Q6_K chunk takes about twice the vector operations of a Q4_K one, and four
     * rows of them in one loop body would outgrow what the JIT compiles well.
     */
    @Override
    public int unitBytes() {
        return BYTES;
    }

    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        dot2(address, rowStride, unitStride, x, xOffset, n, t, 0);
        dot2(address + 2 * rowStride, rowStride, unitStride, x, xOffset, n, t, 2 * L);
        Lanes.sum4(t, 0, out, outOffset, 1);
    }

    /** Rows at address and address + rowStride; their accumulators go to t[acc] and t[acc + L]. */
    private static void dot2(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] t,
                             int acc) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0;
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int half = run / RUNS_PER_HALF;
            int l = run % RUNS_PER_HALF * L;
            long p = address + block * unitStride;
            if (run == 0) {
                scales(p, t, DS);
                scales(p + rowStride, t, DS + 32);
            }
            int si = DS + 8 * half + l / 16;
            long ql = p + 64 * half + l;
            long qh = p + QH + 32 * half + l;
            int xk = xOffset + block * QK + 128 * half + l;
            IntVector la0 = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector lb0 = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql + 32, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector h0 = (IntVector) ByteVector.fromMemorySegment(B, ALL, qh, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector la1 = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql + rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector lb1 = (IntVector) ByteVector.fromMemorySegment(B, ALL, ql + rowStride + 32, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector h1 = (IntVector) ByteVector.fromMemorySegment(B, ALL, qh + rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            FloatVector xv = FloatVector.fromArray(F, x, xk);
            a0 = ((FloatVector) la0.and(0x0f).or(h0.lanewise(LSHL, 4).and(0x30)).convert(I2F, 0))
                    .fma(t[si], t[si + 16]).fma(xv, a0);
            a1 = ((FloatVector) la1.and(0x0f).or(h1.lanewise(LSHL, 4).and(0x30)).convert(I2F, 0))
                    .fma(t[si + 32], t[si + 48]).fma(xv, a1);
            xv = FloatVector.fromArray(F, x, xk + 32);
            a0 = ((FloatVector) lb0.and(0x0f).or(h0.lanewise(LSHL, 2).and(0x30)).convert(I2F, 0))
                    .fma(t[si + 2], t[si + 18]).fma(xv, a0);
            a1 = ((FloatVector) lb1.and(0x0f).or(h1.lanewise(LSHL, 2).and(0x30)).convert(I2F, 0))
                    .fma(t[si + 34], t[si + 50]).fma(xv, a1);
            xv = FloatVector.fromArray(F, x, xk + 64);
            a0 = ((FloatVector) la0.lanewise(LSHR, 4).or(h0.and(0x30)).convert(I2F, 0))
                    .fma(t[si + 4], t[si + 20]).fma(xv, a0);
            a1 = ((FloatVector) la1.lanewise(LSHR, 4).or(h1.and(0x30)).convert(I2F, 0))
                    .fma(t[si + 36], t[si + 52]).fma(xv, a1);
            xv = FloatVector.fromArray(F, x, xk + 96);
            a0 = ((FloatVector) lb0.lanewise(LSHR, 4).or(h0.lanewise(LSHR, 2).and(0x30)).convert(I2F, 0))
                    .fma(t[si + 6], t[si + 22]).fma(xv, a0);
            a1 = ((FloatVector) lb1.lanewise(LSHR, 4).or(h1.lanewise(LSHR, 2).and(0x30)).convert(I2F, 0))
                    .fma(t[si + 38], t[si + 54]).fma(xv, a1);
        }
        a0.intoArray(t, acc);
        a1.intoArray(t, acc + L);
    }

    /**
     * Per 16 values a signed scale s with x ≈ s * l, l in -32..31 (a small search around max|x| / 32, weighting
     * each value by x²); the 16 scales are then stored as int8 against d, the largest mapping to -128 (so the
     * int8 range is used on the side that has one more step), and every l is re-picked for the stored scale.
     */
    @Override
    public void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset) {
        Blocks.check(this, n);
        long p = byteOffset;
        for (int k = 0; k < n; k += QK, p += BYTES) {
            int o = srcOffset + k;
            float[] scales = new float[16];
            float maxScale = 0;
            float maxAbsScale = 0;
            for (int j = 0; j < 16; j++) {
                scales[j] = fitSymmetric(src, o + 16 * j);
                if (Math.abs(scales[j]) > maxAbsScale) {
                    maxAbsScale = Math.abs(scales[j]);
                    maxScale = scales[j];
                }
            }
            int[] q = new int[QK];
            byte[] block = new byte[BYTES];
            if (maxAbsScale == 0) {
                Arrays.fill(q, 32);
            } else {
                float iscale = -128 / maxScale;
                short dBits = Float.floatToFloat16(1 / iscale);
                float d = Float.float16ToFloat(dBits);
                block[D] = (byte) dBits;
                block[D + 1] = (byte) (dBits >>> 8);
                for (int j = 0; j < 16; j++) {
                    int sc = Math.max(-128, Math.min(127, Blocks.nearestInt(iscale * scales[j])));
                    block[SCALES + j] = (byte) sc;
                    float ds = d * sc;
                    for (int i = 0; i < 16; i++) {
                        int l = ds != 0 ? Blocks.nearestInt(src[o + 16 * j + i] / ds) : 0;
                        q[16 * j + i] = Math.max(-32, Math.min(31, l)) + 32;
                    }
                }
            }
            for (int half = 0; half < 2; half++) {
                for (int l = 0; l < 32; l++) {
                    int v = 128 * half + l;
                    int q0 = q[v], q1 = q[v + 32], q2 = q[v + 64], q3 = q[v + 96];
                    block[64 * half + l] = (byte) ((q0 & 0x0f) | (q2 & 0x0f) << 4);
                    block[64 * half + 32 + l] = (byte) ((q1 & 0x0f) | (q3 & 0x0f) << 4);
                    block[QH + 32 * half + l] =
                            (byte) ((q0 >>> 4) | (q1 >>> 4) << 2 | (q2 >>> 4) << 4 | (q3 >>> 4) << 6);
                }
            }
            MemorySegment.copy(block, 0, dst, ValueLayout.JAVA_BYTE, p, BYTES);
        }
    }

    /** Scale s of 16 values with x ≈ s * l, l in -32..31, minimizing the x²-weighted squared error. */
    private static float fitSymmetric(float[] x, int off) {
        float amax = 0;
        float max = 0;
        for (int i = 0; i < 16; i++) {
            if (Math.abs(x[off + i]) > amax) {
                amax = Math.abs(x[off + i]);
                max = x[off + i];
            }
        }
        if (amax == 0) {
            return 0;
        }
        double bestErr = Double.POSITIVE_INFINITY;
        double best = -max / 32;
        for (int step = -9; step <= 9; step++) {
            float iscale = -(32 + 0.1f * step) / max;
            double slx = 0, sl2 = 0;
            int[] l = new int[16];
            for (int i = 0; i < 16; i++) {
                l[i] = Math.max(-32, Math.min(31, Blocks.nearestInt(iscale * x[off + i])));
                double w = (double) x[off + i] * x[off + i];
                slx += w * x[off + i] * l[i];
                sl2 += w * l[i] * l[i];
            }
            if (sl2 == 0) {
                continue;
            }
            double s = slx / sl2;
            double err = 0;
            for (int i = 0; i < 16; i++) {
                double e = s * l[i] - x[off + i];
                err += (double) x[off + i] * x[off + i] * e * e;
            }
            if (err < bestErr) {
                bestErr = err;
                best = s;
            }
        }
        return (float) best;
    }
}
