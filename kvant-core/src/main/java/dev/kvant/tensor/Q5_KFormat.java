package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.B;
import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.I2F;
import static jdk.incubator.vector.VectorOperators.LSHL;
import static jdk.incubator.vector.VectorOperators.LSHR;
import static jdk.incubator.vector.VectorOperators.ZERO_EXTEND_B2I;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;

/**
 * Q5_K: super-blocks of 256 values, 176 bytes: fp16 {@code d}, fp16 {@code dmin}, 12 bytes of packed 6-bit
 * scales and mins for 8 sub-blocks of 32 ({@link KQuantScales}), 32 bytes {@code qh} of fifth bits, 128 bytes of
 * nibbles. As in Q4_K, 32 nibble bytes hold sub-blocks 2p (low) and 2p+1 (high); value l of sub-block j takes its
 * fifth bit from bit j of qh[l]. Value = (d*sc) * q - (dmin*m), q in 0..31: the products are exact in float, so
 * the subtraction is the one rounding and {@code fma(q, d*sc, -(dmin*m))} gives the same bits.
 */
final class Q5_KFormat implements WeightFormat, FusedRows {
    static final Q5_KFormat INSTANCE = new Q5_KFormat();
    private static final int QK = 256;
    private static final int BYTES = 176;
    private static final int QH = 16;
    private static final int QS = 48;
    /** Runs of L nibble bytes per pair of sub-blocks, and per super-block. */
    private static final int RUNS_PER_PAIR = 32 / L;
    private static final int RUNS = 4 * RUNS_PER_PAIR;
    /** Scratch {@code t[SM + 16*r ..]} holds row r's decoded scales and mins ({@link KQuantScales#decode4}). */
    private static final int SM = 4 * L;
    private static final int[] CHUNK_ORDER = pairOrder();
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;

    private Q5_KFormat() {
    }

    /** As Q4_K: per pair of sub-blocks, byte run h gives values h.. then 32+h.. */
    private static int[] pairOrder() {
        int[] order = new int[QK / L];
        int c = 0;
        for (int pair = 0; pair < 4; pair++) {
            for (int h = 0; h < 32; h += L) {
                order[c++] = 64 * pair + h;
                order[c++] = 64 * pair + 32 + h;
            }
        }
        return order;
    }

    @Override
    public GgmlType type() {
        return GgmlType.Q5_K;
    }

    @Override
    public int[] chunkOrder() {
        return CHUNK_ORDER;
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        float[] sm = new float[16];
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int pair = run / RUNS_PER_PAIR;
            int h = run % RUNS_PER_PAIR * L;
            long p = address + block * unitStride;
            if (run == 0) {
                KQuantScales.decode(p, sm, 0);
            }
            int j = 2 * pair;
            IntVector q = (IntVector) ByteVector.fromMemorySegment(B, ALL, p + QS + 32 * pair + h, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector f = ((IntVector) ByteVector.fromMemorySegment(B, ALL, p + QH + h, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0)).lanewise(LSHR, j);
            int at = o + block * QK + 64 * pair + h;
            ((FloatVector) q.and(0x0f).or(f.lanewise(LSHL, 4).and(0x10)).convert(I2F, 0))
                    .fma(sm[KQuantScales.scaleAt(j)], sm[KQuantScales.minAt(j)]).intoArray(dst, at);
            ((FloatVector) q.lanewise(LSHR, 4).or(f.lanewise(LSHL, 3).and(0x10)).convert(I2F, 0))
                    .fma(sm[KQuantScales.scaleAt(j + 1)], sm[KQuantScales.minAt(j + 1)]).intoArray(dst, at + 32);
        }
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        float[] sm = new float[16];
        FloatVector acc = FloatVector.zero(F);
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int pair = run / RUNS_PER_PAIR;
            int h = run % RUNS_PER_PAIR * L;
            long p = address + (long) block * BYTES;
            if (run == 0) {
                KQuantScales.decode(p, sm, 0);
            }
            int j = 2 * pair;
            IntVector q = (IntVector) ByteVector.fromMemorySegment(B, ALL, p + QS + 32 * pair + h, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector f = ((IntVector) ByteVector.fromMemorySegment(B, ALL, p + QH + h, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0)).lanewise(LSHR, j);
            int xk = xOffset + block * QK + 64 * pair + h;
            acc = ((FloatVector) q.and(0x0f).or(f.lanewise(LSHL, 4).and(0x10)).convert(I2F, 0))
                    .fma(sm[KQuantScales.scaleAt(j)], sm[KQuantScales.minAt(j)])
                    .fma(FloatVector.fromArray(F, x, xk), acc);
            acc = ((FloatVector) q.lanewise(LSHR, 4).or(f.lanewise(LSHL, 3).and(0x10)).convert(I2F, 0))
                    .fma(sm[KQuantScales.scaleAt(j + 1)], sm[KQuantScales.minAt(j + 1)])
                    .fma(FloatVector.fromArray(F, x, xk + 32), acc);
        }
        return Lanes.sum(acc);
    }

    @Override
    public int unitBytes() {
        return BYTES;
    }

    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int pair = run / RUNS_PER_PAIR;
            int h = run % RUNS_PER_PAIR * L;
            long p = address + block * unitStride;
            if (run == 0) {
                KQuantScales.decode4(p, rowStride, t, SM);
            }
            int j = 2 * pair;
            int sLo = SM + KQuantScales.scaleAt(j), mLo = SM + KQuantScales.minAt(j);
            int sHi = SM + KQuantScales.scaleAt(j + 1), mHi = SM + KQuantScales.minAt(j + 1);
            long q = p + QS + 32 * pair + h;
            long f = p + QH + h;
            int xk = xOffset + block * QK + 64 * pair + h;
            FloatVector xLo = FloatVector.fromArray(F, x, xk);
            FloatVector xHi = FloatVector.fromArray(F, x, xk + 32);
            IntVector q0 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector f0 = ((IntVector) ByteVector.fromMemorySegment(B, ALL, f, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0)).lanewise(LSHR, j);
            a0 = ((FloatVector) q0.and(0x0f).or(f0.lanewise(LSHL, 4).and(0x10)).convert(I2F, 0))
                    .fma(t[sLo], t[mLo]).fma(xLo, a0);
            a0 = ((FloatVector) q0.lanewise(LSHR, 4).or(f0.lanewise(LSHL, 3).and(0x10)).convert(I2F, 0))
                    .fma(t[sHi], t[mHi]).fma(xHi, a0);
            IntVector q1 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q + rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector f1 = ((IntVector) ByteVector.fromMemorySegment(B, ALL, f + rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0)).lanewise(LSHR, j);
            a1 = ((FloatVector) q1.and(0x0f).or(f1.lanewise(LSHL, 4).and(0x10)).convert(I2F, 0))
                    .fma(t[sLo + 16], t[mLo + 16]).fma(xLo, a1);
            a1 = ((FloatVector) q1.lanewise(LSHR, 4).or(f1.lanewise(LSHL, 3).and(0x10)).convert(I2F, 0))
                    .fma(t[sHi + 16], t[mHi + 16]).fma(xHi, a1);
            IntVector q2 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q + 2 * rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector f2 = ((IntVector) ByteVector.fromMemorySegment(B, ALL, f + 2 * rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0)).lanewise(LSHR, j);
            a2 = ((FloatVector) q2.and(0x0f).or(f2.lanewise(LSHL, 4).and(0x10)).convert(I2F, 0))
                    .fma(t[sLo + 32], t[mLo + 32]).fma(xLo, a2);
            a2 = ((FloatVector) q2.lanewise(LSHR, 4).or(f2.lanewise(LSHL, 3).and(0x10)).convert(I2F, 0))
                    .fma(t[sHi + 32], t[mHi + 32]).fma(xHi, a2);
            IntVector q3 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q + 3 * rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector f3 = ((IntVector) ByteVector.fromMemorySegment(B, ALL, f + 3 * rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0)).lanewise(LSHR, j);
            a3 = ((FloatVector) q3.and(0x0f).or(f3.lanewise(LSHL, 4).and(0x10)).convert(I2F, 0))
                    .fma(t[sLo + 48], t[mLo + 48]).fma(xLo, a3);
            a3 = ((FloatVector) q3.lanewise(LSHR, 4).or(f3.lanewise(LSHL, 3).and(0x10)).convert(I2F, 0))
                    .fma(t[sHi + 48], t[mHi + 48]).fma(xHi, a3);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, outOffset, 1);
    }

    @Override
    public void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset) {
        Blocks.check(this, n);
        long p = byteOffset;
        for (int k = 0; k < n; k += QK, p += BYTES) {
            int[] q = KQuantScales.quantizeSuperBlock(src, srcOffset + k, 31, dst, p);
            byte[] qh = new byte[32];
            for (int pair = 0; pair < 4; pair++) {
                for (int l = 0; l < 32; l++) {
                    int lo = q[64 * pair + l];
                    int hi = q[64 * pair + 32 + l];
                    qh[l] |= (byte) ((lo >>> 4) << 2 * pair | (hi >>> 4) << 2 * pair + 1);
                    dst.set(ValueLayout.JAVA_BYTE, p + QS + 32 * pair + l, (byte) ((lo & 0x0f) | (hi & 0x0f) << 4));
                }
            }
            MemorySegment.copy(qh, 0, dst, ValueLayout.JAVA_BYTE, p + QH, 32);
        }
    }
}
