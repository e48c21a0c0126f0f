package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.Lanes.S;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.AND;
import static jdk.incubator.vector.VectorOperators.EQ;
import static jdk.incubator.vector.VectorOperators.LSHL;
import static jdk.incubator.vector.VectorOperators.S2I;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;

/**
 * Kernels for F16 rows checked once to hold no infinity or NaN; the rows keep the file's bytes.
 *
 * <p>{@link F16Format} widens a half into the binary32 pattern of its value times 2^-112 and multiplies by 2^112;
 * here the 2^112 goes on x, once a vector of x for four rows: {@code fma(h·2^-112, x·2^112, acc)} is
 * {@code fma(h, x, acc)} bit for bit, both products being the same real number rounded once, while x·2^112 is
 * exact — every finite x below 2^16 in magnitude, subnormals included. A larger x overflows to infinity, which
 * makes its row's sum infinite or NaN; the kernel checks the four sums and redoes such a group exactly. With the
 * rows checked ({@link #pack}) the exponent-31 bookkeeping of {@link F16Format#dot4} goes too: a widened half
 * costs a shift and a mask before its multiply-add, three operations fewer than there. Every result is
 * {@link F16Format#dot1}'s bits.
 */
final class F16Finite implements PackedRows {
    static final F16Finite INSTANCE = new F16Finite();
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);
    /** Sign, five exponent and ten mantissa bits of a half once shifted left 13 (after sign extension). */
    private static final int KEEP = 0x8FFF_E000;
    private static final short EXP31 = 0x7C00;
    private static final float UNBIAS = 0x1p112f;

    private F16Finite() {
    }

    /** Copies the row (unless dst is src); false when one of its halves is infinite or NaN (exponent 31). */
    @Override
    public boolean pack(long src, long dst, int cols) {
        MemorySegment row = ALL.asSlice(src, 2L * cols);
        boolean finite = true;
        int k = 0;
        for (; k + L <= cols; k += L) {
            finite &= !ShortVector.fromMemorySegment(S, row, 2L * k, LE).lanewise(AND, EXP31).compare(EQ, EXP31)
                    .anyTrue();
        }
        for (; k < cols; k++) {
            finite &= (row.get(SHORT_LE, 2L * k) & EXP31) != EXP31;
        }
        if (dst != src) {
            MemorySegment.copy(ALL, src, ALL, dst, 2L * cols);
        }
        return finite;
    }

    @Override
    public boolean keepsBytes() {
        return true;
    }

    @Override
    public int unitBytes() {
        return 2 * L;
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        F16Format.INSTANCE.decode(address, unitStride, dst, o, n);
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        return F16Format.INSTANCE.dot1(address, x, xOffset, n);
    }

    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        int full = n - n % L;
        // Absolute addresses into ALL, no slice a call (as F16Format's kernel): the slice was not scalar-replaced
        // here, a tenth of a decode step's samples went to allocating it, and without it tinycode's products ran
        // 3-4% faster (MatvecBench 1,2 model, four runs each: 1.96-2.02 against 2.04-2.10 ms at 1 thread, outliers
        // aside; 1.18-1.24 against 1.25-1.30 at 2)
        MemorySegment rows = ALL;
        for (int k = 0; k < full; k += L) {
            FloatVector xv = FloatVector.fromArray(F, x, xOffset + k).mul(UNBIAS);
            long p = address + k / L * unitStride;
            IntVector b0 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p, LE).convertShape(S2I, I, 0))
                    .lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b1 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + rowStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b2 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 2 * rowStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b3 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 3 * rowStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            a0 = b0.reinterpretAsFloats().fma(xv, a0);
            a1 = b1.reinterpretAsFloats().fma(xv, a1);
            a2 = b2.reinterpretAsFloats().fma(xv, a2);
            a3 = b3.reinterpretAsFloats().fma(xv, a3);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        finish4(address, rowStride, unitStride, x, xOffset, full, n, out, outOffset, t);
        if (!(Float.isFinite(out[outOffset]) && Float.isFinite(out[outOffset + 1])
                && Float.isFinite(out[outOffset + 2]) && Float.isFinite(out[outOffset + 3]))) {
            // Rare: x·2^112 may have overflowed (|x| >= 2^16), or the exact sum is not finite itself.
            for (int r = 0; r < 4; r++) {
                out[outOffset + r] = F16Format.dot1(address + r * rowStride, unitStride, x, xOffset, n);
            }
        }
    }
}
