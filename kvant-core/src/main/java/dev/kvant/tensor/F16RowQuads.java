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
import java.nio.ByteOrder;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;

/**
 * F16 rows for the matrix-vector product: four rows interleaved chunk by chunk, and checked to hold no infinity
 * or NaN.
 *
 * <p>Layout: each quad of rows (rows 4q..4q+3) becomes, for each chunk of L columns in turn, row 4q's L halves,
 * then row 4q+1's, 4q+2's and 4q+3's; rows past the last whole quad stay as they are. So the four-row product reads
 * one sequential stream where the file's layout gave it four short ones (a 512-wide row is 16 cache lines, too
 * few for the hardware prefetcher to ramp up before the next quad starts four new streams). On the 2-core Zen 5
 * VM, tinycode's matrices streamed from memory by one thread went from 8.7-9.2 to 19-24 GB/s.
 *
 * <p>Arithmetic: {@link F16Format} widens a half into the binary32 pattern of its value times 2^-112 and
 * multiplies by 2^112; here the 2^112 goes on x, once a vector of x for four rows: {@code fma(h·2^-112, x·2^112,
 * acc)} is {@code fma(h, x, acc)} bit for bit, both products being the same real number rounded once, while
 * x·2^112 is exact — every finite x below 2^16 in magnitude, subnormals included. A larger x overflows to infinity,
 * which makes its row's sum infinite or NaN; the kernel checks the four sums and redoes such a quad exactly. With
 * the rows checked once ({@link #pack}) the exponent-31 bookkeeping of {@link F16Format#dot4} goes too: a widened
 * half costs a shift and a mask before its multiply-add, three operations fewer than there. Every result is
 * {@link F16Format#dot1}'s bits.
 *
 * <p>Only for rows of a whole number of chunks ({@link F16Format#packing}); {@link #decode} and {@link #dot1} read
 * row-major rows (the rows past the last quad, and the file's layout that {@link WeightMatrix} keeps for them).
 */
final class F16RowQuads implements PackedRows {
    static final F16RowQuads INSTANCE = new F16RowQuads();
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    /** Bytes of one row's chunk. */
    private static final int CHUNK = 2 * L;
    /** Sign, five exponent and ten mantissa bits of a half once shifted left 13 (after sign extension). */
    private static final int KEEP = 0x8FFF_E000;
    private static final short EXP31 = 0x7C00;
    private static final float UNBIAS = 0x1p112f;

    private F16RowQuads() {
    }

    static boolean fits(int cols) {
        return cols % L == 0;
    }

    @Override
    public boolean rowMajor() {
        return false;
    }

    /** False when a half is infinite or NaN (exponent 31): then the matrix keeps {@link F16Format}'s kernels. */
    @Override
    public boolean pack(long src, long dst, long rowBytes, int cols, int count) {
        boolean finite = true;
        for (int r = 0; r < count; r++) {
            MemorySegment row = ALL.asSlice(src + r * rowBytes, rowBytes);
            for (int k = 0; k < cols; k += L) {
                finite &= !ShortVector.fromMemorySegment(S, row, 2L * k, LE).lanewise(AND, EXP31)
                        .compare(EQ, EXP31).anyTrue();
            }
        }
        int quads = count / 4;
        for (int q = 0; q < quads; q++) {
            long from = src + 4 * q * rowBytes;
            long to = dst + 4 * q * rowBytes;
            for (int j = 0; j < 4; j++) {
                for (int k = 0; k < cols; k += L) {
                    MemorySegment.copy(ALL, from + j * rowBytes + 2L * k, ALL, to + 4L * 2 * k + (long) j * CHUNK,
                            CHUNK);
                }
            }
        }
        MemorySegment.copy(ALL, src + 4 * quads * rowBytes, ALL, dst + 4 * quads * rowBytes,
                (count - 4 * quads) * rowBytes);
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

    /** The quad at {@code address} (interleaved; {@code rowBytes} is unused: the quad is 4 rows' bytes). */
    @Override
    public void dot4(long address, long rowBytes, float[] x, int xOffset, int n, float[] out, int outOffset,
                     float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        MemorySegment rows = ALL;
        for (int k = 0; k < n; k += L) {
            FloatVector xv = FloatVector.fromArray(F, x, xOffset + k).mul(UNBIAS);
            long p = address + 4L * 2 * k;
            IntVector b0 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p, LE).convertShape(S2I, I, 0))
                    .lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b1 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + CHUNK, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b2 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 2 * CHUNK, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b3 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 3 * CHUNK, LE)
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
        Lanes.sum4(t, 0, out, outOffset, 1);
        if (!(Float.isFinite(out[outOffset]) && Float.isFinite(out[outOffset + 1])
                && Float.isFinite(out[outOffset + 2]) && Float.isFinite(out[outOffset + 3]))) {
            // Rare: x·2^112 may have overflowed (|x| >= 2^16), or the exact sum is not finite itself.
            for (int j = 0; j < 4; j++) {
                out[outOffset + j] = exactRow(address + (long) j * CHUNK, x, xOffset, n, t);
            }
        }
    }

    /** {@link F16Format#dot1} of one (finite) row of a quad, whose chunks lie 4 chunks apart from {@code at}. */
    private static float exactRow(long at, float[] x, int xOffset, int n, float[] t) {
        FloatVector acc = FloatVector.zero(F);
        for (int k = 0; k < n; k += L) {
            IntVector b = ((IntVector) ShortVector.fromMemorySegment(S, ALL, at + 4L * 2 * k, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            acc = b.reinterpretAsFloats().mul(UNBIAS).fma(FloatVector.fromArray(F, x, xOffset + k), acc);
        }
        acc.intoArray(t, 0);
        return Lanes.sum(t, 0);
    }
}
