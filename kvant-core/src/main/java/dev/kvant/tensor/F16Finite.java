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
import java.util.Arrays;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;

/**
 * Kernels for F16 rows known to hold no infinity or NaN, read where they are (no copy: {@link #inPlace}).
 *
 * <p>{@link F16Format} widens a half into the binary32 pattern of its value times 2^-112 and multiplies by 2^112;
 * here the 2^112 goes on x instead, once a vector of x for four rows: {@code fma(h·2^-112, x·2^112, acc)} is
 * {@code fma(h, x, acc)} bit for bit, because both products are the same real number, rounded once by the
 * multiply-add, as long as x·2^112 is exact — every finite x below 2^16 in magnitude, subnormals included. A larger
 * x overflows to infinity, which makes its row's sum infinite or NaN; the kernel checks the four sums and redoes a
 * group with a non-finite one through {@link F16Format}'s exact product, so every result is that product's bits.
 * With finite rows (checked once by {@link #pack}) the exponent-31 bookkeeping goes too: a widened half costs a
 * shift and a mask before its multiply-add, where {@link F16Format#dot4} spends three more operations.
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

    @Override
    public boolean inPlace() {
        return true;
    }

    /** True when no half of the row has exponent 31; copies the row when {@code dst} is another place. */
    @Override
    public boolean pack(long src, long dst, int cols) {
        MemorySegment row = ALL.asSlice(src, 2L * cols);
        int i = 0;
        boolean finite = true;
        for (; i + S.length() <= cols; i += S.length()) {
            finite &= !ShortVector.fromMemorySegment(S, row, 2L * i, LE).lanewise(AND, EXP31).compare(EQ, EXP31)
                    .anyTrue();
        }
        for (; i < cols; i++) {
            finite &= (row.get(SHORT_LE, 2L * i) & EXP31)
                    != EXP31;
        }
        if (dst != src) {
            MemorySegment.copy(ALL, src, ALL, dst, 2L * cols);
        }
        return finite;
    }

    @Override
    public void decode(long address, float[] dst, int o, int n) {
        F16Format.INSTANCE.decode(address, dst, o, n);
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        return F16Format.INSTANCE.dot1(address, x, xOffset, n);
    }

    @Override
    public void dot4(long address, long rowBytes, float[] x, int xOffset, int n, float[] out, int outOffset,
                     float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        MemorySegment rows = ALL;
        int full = n - n % L;
        for (int k = 0; k < full; k += L) {
            FloatVector xv = FloatVector.fromArray(F, x, xOffset + k).mul(UNBIAS);
            long p = address + 2L * k;
            IntVector b0 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p, LE).convertShape(S2I, I, 0))
                    .lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b1 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + rowBytes, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b2 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 2 * rowBytes, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b3 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 3 * rowBytes, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            a0 = b0.reinterpretAsFloats().fma(xv, a0);
            a1 = b1.reinterpretAsFloats().fma(xv, a1);
            a2 = b2.reinterpretAsFloats().fma(xv, a2);
            a3 = b3.reinterpretAsFloats().fma(xv, a3);
        }
        if (full < n) {
            int len = n - full;
            for (int r = 0; r < 4; r++) {
                decode(address + r * rowBytes + 2L * full, t, r * L, len);
                Arrays.fill(t, r * L + len, (r + 1) * L, 0f);
            }
            FloatVector xv = FloatVector.fromArray(F, Lanes.padded(x, xOffset + full, len), 0);
            a0 = FloatVector.fromArray(F, t, 0).fma(xv, a0);
            a1 = FloatVector.fromArray(F, t, L).fma(xv, a1);
            a2 = FloatVector.fromArray(F, t, 2 * L).fma(xv, a2);
            a3 = FloatVector.fromArray(F, t, 3 * L).fma(xv, a3);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, outOffset, 1);
        if (!(Float.isFinite(out[outOffset]) && Float.isFinite(out[outOffset + 1])
                && Float.isFinite(out[outOffset + 2]) && Float.isFinite(out[outOffset + 3]))) {
            // Rare: x·2^112 may have overflowed (|x| >= 2^16), or the exact sum is not finite itself.
            for (int r = 0; r < 4; r++) {
                out[outOffset + r] = dot1(address + r * rowBytes, x, xOffset, n);
            }
        }
    }
}
