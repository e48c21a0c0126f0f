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
 * Q4_0: blocks of 32 values, 18 bytes: fp16 scale {@code d}, then 16 bytes whose low nibbles are values 0..15 and
 * high nibbles values 16..31; value = (nibble - 8) * d, exact in float.
 *
 * <p>Kernels decode through a table: per block, the 16 possible values {@code fma(i - 8, d, +0)} (each exactly
 * (i - 8) * d) in one vector, indexed by the nibbles with one permute ({@link Lanes#TABLE_LOW}), instead of
 * converting every nibble to float and scaling it.
 */
final class Q4_0Format implements WeightFormat, FusedRows {
    static final Q4_0Format INSTANCE = new Q4_0Format();
    private static final int QK = 32;
    private static final int BYTES = 18;
    /** Runs of L nibble bytes per block; run h gives values h.. (low nibbles) and 16+h.. (high nibbles). */
    private static final int RUNS = 16 / L;
    private static final int[] CHUNK_ORDER = L == 16 ? null : new int[]{0, 16, 8, 24};
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);

    private Q4_0Format() {
    }

    @Override
    public GgmlType type() {
        return GgmlType.Q4_0;
    }

    @Override
    public int[] chunkOrder() {
        return CHUNK_ORDER;
    }

    @Override
    public PackedRows packing(int cols) {
        return Q4_0Packed.fits(cols) ? Q4_0Packed.INSTANCE : null;
    }

    /**
     * The nibbles' values less 8, both table halves. A block's table is {@code fma(CENTERED, d, +0)}: each (i - 8)·d
     * is exact and the +0 turns nibble 8's -0 into +0, so for every finite d it holds the bits of
     * {@code fma(i, d, -8d)} ({@link Q4_0Packed} shares it), and for an infinite d it gives ggml's (q - 8)·d — ±inf,
     * NaN for nibble 8 — where fma(i, d, -8d) gave NaN for every nibble.
     */
    private static final FloatVector CENTERED_LOW = Lanes.TABLE_LOW.sub(8);
    private static final FloatVector CENTERED_HIGH = Lanes.TABLE_HIGH.sub(8);

    private static float scale(MemorySegment rows, long block) {
        return Float.float16ToFloat(rows.get(SHORT_LE, block));
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        MemorySegment row = ALL.asSlice(address, (n / QK - 1) * unitStride + BYTES);
        for (int b = 0; b < n / QK; b++) {
            long p = b * unitStride;
            float d = scale(row, p);
            IntVector ta = CENTERED_LOW.fma(d, 0f).reinterpretAsInts();
            IntVector tb = CENTERED_HIGH.fma(d, 0f).reinterpretAsInts();
            for (int run = 0; run < RUNS; run++) {
                int h = run * L;
                IntVector q = (IntVector) ByteVector.fromMemorySegment(B, row, p + 2 + h, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                int at = o + b * QK + h;
                q.selectFrom(ta, tb).reinterpretAsFloats().intoArray(dst, at);
                q.lanewise(LSHR, 4).selectFrom(ta, tb).reinterpretAsFloats().intoArray(dst, at + 16);
            }
        }
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        MemorySegment row = ALL.asSlice(address, bytesFor(n));
        FloatVector acc = FloatVector.zero(F);
        for (int b = 0; b < n / QK; b++) {
            long p = (long) b * BYTES;
            float d = scale(row, p);
            IntVector ta = CENTERED_LOW.fma(d, 0f).reinterpretAsInts();
            IntVector tb = CENTERED_HIGH.fma(d, 0f).reinterpretAsInts();
            for (int run = 0; run < RUNS; run++) {
                int h = run * L;
                IntVector q = (IntVector) ByteVector.fromMemorySegment(B, row, p + 2 + h, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                int xk = xOffset + b * QK + h;
                acc = q.selectFrom(ta, tb).reinterpretAsFloats().fma(FloatVector.fromArray(F, x, xk), acc);
                acc = q.lanewise(LSHR, 4).selectFrom(ta, tb).reinterpretAsFloats()
                        .fma(FloatVector.fromArray(F, x, xk + 16), acc);
            }
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
        // A slice with the rows' own bounds and offsets affine in the block counter: C2 proves every load in
        // range before the loop (see Q8_0Format).
        MemorySegment rows = ALL.asSlice(address, 3 * rowStride + (n / QK - 1) * unitStride + BYTES);
        for (int b = 0; b < n / QK; b++) {
            long p = b * unitStride;
            float d0 = scale(rows, p), d1 = scale(rows, p + rowStride), d2 = scale(rows, p + 2 * rowStride);
            float d3 = scale(rows, p + 3 * rowStride);
            IntVector ta0 = CENTERED_LOW.fma(d0, 0f).reinterpretAsInts();
            IntVector tb0 = CENTERED_HIGH.fma(d0, 0f).reinterpretAsInts();
            IntVector ta1 = CENTERED_LOW.fma(d1, 0f).reinterpretAsInts();
            IntVector tb1 = CENTERED_HIGH.fma(d1, 0f).reinterpretAsInts();
            IntVector ta2 = CENTERED_LOW.fma(d2, 0f).reinterpretAsInts();
            IntVector tb2 = CENTERED_HIGH.fma(d2, 0f).reinterpretAsInts();
            IntVector ta3 = CENTERED_LOW.fma(d3, 0f).reinterpretAsInts();
            IntVector tb3 = CENTERED_HIGH.fma(d3, 0f).reinterpretAsInts();
            for (int run = 0; run < RUNS; run++) {
                int h = run * L;
                long q = p + 2 + h;
                int xk = xOffset + b * QK + h;
                FloatVector xLo = FloatVector.fromArray(F, x, xk);
                FloatVector xHi = FloatVector.fromArray(F, x, xk + 16);
                IntVector q0 = (IntVector) ByteVector.fromMemorySegment(B, rows, q, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                IntVector q1 = (IntVector) ByteVector.fromMemorySegment(B, rows, q + rowStride, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                IntVector q2 = (IntVector) ByteVector.fromMemorySegment(B, rows, q + 2 * rowStride, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                IntVector q3 = (IntVector) ByteVector.fromMemorySegment(B, rows, q + 3 * rowStride, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                a0 = q0.selectFrom(ta0, tb0).reinterpretAsFloats().fma(xLo, a0);
                a1 = q1.selectFrom(ta1, tb1).reinterpretAsFloats().fma(xLo, a1);
                a2 = q2.selectFrom(ta2, tb2).reinterpretAsFloats().fma(xLo, a2);
                a3 = q3.selectFrom(ta3, tb3).reinterpretAsFloats().fma(xLo, a3);
                a0 = q0.lanewise(LSHR, 4).selectFrom(ta0, tb0).reinterpretAsFloats().fma(xHi, a0);
                a1 = q1.lanewise(LSHR, 4).selectFrom(ta1, tb1).reinterpretAsFloats().fma(xHi, a1);
                a2 = q2.lanewise(LSHR, 4).selectFrom(ta2, tb2).reinterpretAsFloats().fma(xHi, a2);
                a3 = q3.lanewise(LSHR, 4).selectFrom(ta3, tb3).reinterpretAsFloats().fma(xHi, a3);
            }
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, outOffset, 1);
    }

    /**
     * As ggml's reference: d = -(the value of largest magnitude) / 8, so that value maps to nibble 0 exactly and
     * the opposite side gets the 7 finer steps; nibble = min(15, trunc(x / d + 8.5)).
     */
    @Override
    public void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset) {
        Blocks.check(this, n);
        long p = byteOffset;
        for (int k = 0; k < n; k += QK, p += BYTES) {
            float amax = 0;
            float max = 0;
            for (int j = 0; j < QK; j++) {
                float v = src[srcOffset + k + j];
                if (amax < Math.abs(v)) {
                    amax = Math.abs(v);
                    max = v;
                }
            }
            float d = max / -8;
            float id = d != 0 ? 1.0f / d : 0.0f;
            dst.set(SHORT_LE, p, Float.floatToFloat16(d));
            for (int j = 0; j < 16; j++) {
                int lo = Math.min(15, (int) (src[srcOffset + k + j] * id + 8.5f));
                int hi = Math.min(15, (int) (src[srcOffset + k + 16 + j] * id + 8.5f));
                dst.set(ValueLayout.JAVA_BYTE, p + 2 + j, (byte) (lo | hi << 4));
            }
        }
    }
}
