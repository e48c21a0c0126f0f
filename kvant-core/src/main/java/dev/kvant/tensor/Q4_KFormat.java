package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.B;
import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.RawMemory.ALL;
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
 * Q4_K: super-blocks of 256 values, 144 bytes: fp16 {@code d}, fp16 {@code dmin}, 12 bytes of packed 6-bit
 * scales and mins for 8 sub-blocks of 32 ({@link KQuantScales}), 128 bytes of nibbles. Sub-blocks go in pairs:
 * 32 bytes hold sub-block 2p in their low nibbles and sub-block 2p+1 in their high nibbles.
 * Value = (d*sc) * q - (dmin*m): both products are exact in float, so the subtraction is the only rounding, and
 * {@code fma(q, d*sc, -(dmin*m))} gives the same bits.
 *
 * <p>Kernels decode through tables, as Q4_0's: per sub-block, its 16 possible values in one vector, indexed by
 * the nibbles with one permute.
 */
final class Q4_KFormat implements WeightFormat, FusedRows {
    static final Q4_KFormat INSTANCE = new Q4_KFormat();
    private static final int QK = 256;
    private static final int BYTES = 144;
    private static final int QS = 16;
    /** Runs of L nibble bytes per pair of sub-blocks, and per super-block. */
    private static final int RUNS_PER_PAIR = 32 / L;
    private static final int RUNS = 4 * RUNS_PER_PAIR;
    /** Scratch {@code t[SM + 16*r ..]} holds row r's decoded scales and mins ({@link KQuantScales#decode4}). */
    private static final int SM = 4 * L;
    private static final int[] CHUNK_ORDER = pairOrder();
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;

    private Q4_KFormat() {
    }

    /** Per pair of sub-blocks, byte run h gives values h.. (low nibbles), then 32+h.. (high nibbles). */
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
        return GgmlType.Q4_K;
    }

    @Override
    public int[] chunkOrder() {
        return CHUNK_ORDER;
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        float[] sm = new float[16];
        IntVector la = IntVector.zero(I), lb = la, ha = la, hb = la;
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int pair = run / RUNS_PER_PAIR;
            int h = run % RUNS_PER_PAIR * L;
            long p = address + block * unitStride;
            if (run == 0) {
                KQuantScales.decode(p, sm, 0);
            }
            if (h == 0) {
                float s = sm[KQuantScales.scaleAt(2 * pair)], m = sm[KQuantScales.minAt(2 * pair)];
                la = Lanes.TABLE_LOW.fma(s, m).reinterpretAsInts();
                lb = Lanes.TABLE_HIGH.fma(s, m).reinterpretAsInts();
                s = sm[KQuantScales.scaleAt(2 * pair + 1)];
                m = sm[KQuantScales.minAt(2 * pair + 1)];
                ha = Lanes.TABLE_LOW.fma(s, m).reinterpretAsInts();
                hb = Lanes.TABLE_HIGH.fma(s, m).reinterpretAsInts();
            }
            IntVector q = (IntVector) ByteVector.fromMemorySegment(B, ALL, p + QS + 32 * pair + h, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            int at = o + block * QK + 64 * pair + h;
            q.selectFrom(la, lb).reinterpretAsFloats().intoArray(dst, at);
            q.lanewise(LSHR, 4).selectFrom(ha, hb).reinterpretAsFloats().intoArray(dst, at + 32);
        }
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        float[] sm = new float[16];
        FloatVector acc = FloatVector.zero(F);
        IntVector la = IntVector.zero(I), lb = la, ha = la, hb = la;
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int pair = run / RUNS_PER_PAIR;
            int h = run % RUNS_PER_PAIR * L;
            long p = address + (long) block * BYTES;
            if (run == 0) {
                KQuantScales.decode(p, sm, 0);
            }
            if (h == 0) {
                float s = sm[KQuantScales.scaleAt(2 * pair)], m = sm[KQuantScales.minAt(2 * pair)];
                la = Lanes.TABLE_LOW.fma(s, m).reinterpretAsInts();
                lb = Lanes.TABLE_HIGH.fma(s, m).reinterpretAsInts();
                s = sm[KQuantScales.scaleAt(2 * pair + 1)];
                m = sm[KQuantScales.minAt(2 * pair + 1)];
                ha = Lanes.TABLE_LOW.fma(s, m).reinterpretAsInts();
                hb = Lanes.TABLE_HIGH.fma(s, m).reinterpretAsInts();
            }
            IntVector q = (IntVector) ByteVector.fromMemorySegment(B, ALL, p + QS + 32 * pair + h, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            int xk = xOffset + block * QK + 64 * pair + h;
            acc = q.selectFrom(la, lb).reinterpretAsFloats().fma(FloatVector.fromArray(F, x, xk), acc);
            acc = q.lanewise(LSHR, 4).selectFrom(ha, hb).reinterpretAsFloats()
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
        IntVector la0 = IntVector.zero(I), lb0 = la0, ha0 = la0, hb0 = la0, la1 = la0, lb1 = la0, ha1 = la0;
        IntVector hb1 = la0, la2 = la0, lb2 = la0, ha2 = la0, hb2 = la0, la3 = la0, lb3 = la0, ha3 = la0, hb3 = la0;
        for (int c = 0; c < n / QK * RUNS; c++) {
            int block = c / RUNS;
            int run = c % RUNS;
            int pair = run / RUNS_PER_PAIR;
            int h = run % RUNS_PER_PAIR * L;
            long p = address + block * unitStride;
            if (run == 0) {
                KQuantScales.decode4(p, rowStride, t, SM);
            }
            if (h == 0) {
                int sLo = SM + KQuantScales.scaleAt(2 * pair), mLo = SM + KQuantScales.minAt(2 * pair);
                int sHi = SM + KQuantScales.scaleAt(2 * pair + 1), mHi = SM + KQuantScales.minAt(2 * pair + 1);
                la0 = Lanes.TABLE_LOW.fma(t[sLo], t[mLo]).reinterpretAsInts();
                lb0 = Lanes.TABLE_HIGH.fma(t[sLo], t[mLo]).reinterpretAsInts();
                ha0 = Lanes.TABLE_LOW.fma(t[sHi], t[mHi]).reinterpretAsInts();
                hb0 = Lanes.TABLE_HIGH.fma(t[sHi], t[mHi]).reinterpretAsInts();
                la1 = Lanes.TABLE_LOW.fma(t[sLo + 16], t[mLo + 16]).reinterpretAsInts();
                lb1 = Lanes.TABLE_HIGH.fma(t[sLo + 16], t[mLo + 16]).reinterpretAsInts();
                ha1 = Lanes.TABLE_LOW.fma(t[sHi + 16], t[mHi + 16]).reinterpretAsInts();
                hb1 = Lanes.TABLE_HIGH.fma(t[sHi + 16], t[mHi + 16]).reinterpretAsInts();
                la2 = Lanes.TABLE_LOW.fma(t[sLo + 32], t[mLo + 32]).reinterpretAsInts();
                lb2 = Lanes.TABLE_HIGH.fma(t[sLo + 32], t[mLo + 32]).reinterpretAsInts();
                ha2 = Lanes.TABLE_LOW.fma(t[sHi + 32], t[mHi + 32]).reinterpretAsInts();
                hb2 = Lanes.TABLE_HIGH.fma(t[sHi + 32], t[mHi + 32]).reinterpretAsInts();
                la3 = Lanes.TABLE_LOW.fma(t[sLo + 48], t[mLo + 48]).reinterpretAsInts();
                lb3 = Lanes.TABLE_HIGH.fma(t[sLo + 48], t[mLo + 48]).reinterpretAsInts();
                ha3 = Lanes.TABLE_LOW.fma(t[sHi + 48], t[mHi + 48]).reinterpretAsInts();
                hb3 = Lanes.TABLE_HIGH.fma(t[sHi + 48], t[mHi + 48]).reinterpretAsInts();
            }
            long q = p + QS + 32 * pair + h;
            int xk = xOffset + block * QK + 64 * pair + h;
            FloatVector xLo = FloatVector.fromArray(F, x, xk);
            FloatVector xHi = FloatVector.fromArray(F, x, xk + 32);
            IntVector q0 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q, LE).convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector q1 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q + rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector q2 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q + 2 * rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            IntVector q3 = (IntVector) ByteVector.fromMemorySegment(B, ALL, q + 3 * rowStride, LE)
                    .convertShape(ZERO_EXTEND_B2I, I, 0);
            a0 = q0.selectFrom(la0, lb0).reinterpretAsFloats().fma(xLo, a0);
            a1 = q1.selectFrom(la1, lb1).reinterpretAsFloats().fma(xLo, a1);
            a2 = q2.selectFrom(la2, lb2).reinterpretAsFloats().fma(xLo, a2);
            a3 = q3.selectFrom(la3, lb3).reinterpretAsFloats().fma(xLo, a3);
            a0 = q0.lanewise(LSHR, 4).selectFrom(ha0, hb0).reinterpretAsFloats().fma(xHi, a0);
            a1 = q1.lanewise(LSHR, 4).selectFrom(ha1, hb1).reinterpretAsFloats().fma(xHi, a1);
            a2 = q2.lanewise(LSHR, 4).selectFrom(ha2, hb2).reinterpretAsFloats().fma(xHi, a2);
            a3 = q3.lanewise(LSHR, 4).selectFrom(ha3, hb3).reinterpretAsFloats().fma(xHi, a3);
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
            int[] q = KQuantScales.quantizeSuperBlock(src, srcOffset + k, 15, dst, p);
            for (int pair = 0; pair < 4; pair++) {
                for (int l = 0; l < 32; l++) {
                    int lo = q[64 * pair + l];
                    int hi = q[64 * pair + 32 + l];
                    dst.set(ValueLayout.JAVA_BYTE, p + QS + 32 * pair + l, (byte) (lo | hi << 4));
                }
            }
        }
    }
}
