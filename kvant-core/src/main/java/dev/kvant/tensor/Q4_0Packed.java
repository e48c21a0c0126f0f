package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.B;
import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.AND;
import static jdk.incubator.vector.VectorOperators.LSHL;
import static jdk.incubator.vector.VectorOperators.LSHR;
import static jdk.incubator.vector.VectorOperators.OR;
import static jdk.incubator.vector.VectorOperators.ZERO_EXTEND_B2I;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;

/**
 * Q4_0 rows packed for 16-lane kernels: each run of four blocks (128 values, 72 bytes in the file's layout too)
 * becomes their four fp16 scales (8 bytes), then 16 little-endian ints whose byte b is byte j of block b's
 * nibbles (j = the int's index). So one 64-byte load brings the nibbles of 128 values, and shifting it right by
 * 8b (low nibbles) or 8b + 4 (high nibbles) puts the nibbles of values 32b..32b+15 or 32b+16..32b+31 of the run
 * in the lanes' low four bits — in value order, against x as it is.
 *
 * <p>Why: streaming a matrix from memory, the file's layout (a 16-byte load every 18 bytes, four rows at once)
 * runs at about 6.5 GB/s on one core of the 2-core Zen 5 VM, this one at about 10 (same values decoded per
 * second when the rows are in cache: the gain is in how the loads reach memory). The values, the table that
 * decodes them and the order of the multiply-adds are those of {@link Q4_0Format}, so every result is bitwise
 * its result on the unpacked rows.
 *
 * <p>Only for 16 lanes (AVX-512) and rows of a multiple of 128 values; {@link Q4_0Format#packing} says when.
 */
final class Q4_0Packed implements PackedRows {
    static final Q4_0Packed INSTANCE = new Q4_0Packed();
    /** Values per run of four blocks. */
    static final int RUN = 128;
    private static final int RUN_BYTES = 72;
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);
    /**
     * Lane i holds i - 8 (lane 8: +0). A block's table is {@code fma(CENTERED, d, +0)}: each (i - 8)·d is exact,
     * and adding +0 turns nibble 8's -0 (for a negative d) into the +0 that Q4_0Format's {@code fma(i, d, -8d)}
     * gives, so the tables are bitwise equal for every finite d, in one multiply-add instead of a multiply, a
     * second broadcast and a multiply-add. A nibble is looked up as {@code (bits & 15).selectFrom(table)}: an and
     * and a one-table permute ran 3% faster on Zen 5 than the two-table permute that wraps the index by itself
     * ({@code selectFrom(table, table)}); the same nibble, the same entry.
     */
    private static final FloatVector CENTERED = Lanes.TABLE_LOW.sub(8);

    private Q4_0Packed() {
    }

    static boolean fits(int cols) {
        return L == 16 && cols % RUN == 0;
    }

    private static float scale(MemorySegment rows, long at) {
        return Float.float16ToFloat(rows.get(SHORT_LE, at));
    }

    /**
     * False when a scale is infinite or NaN: the packed kernels' table {@code (i - 8)·d + 0} is
     * {@code fma(i, d, -8d)} for finite d only.
     */
    @Override
    public boolean pack(long src, long dst, int cols) {
        long bytes = (long) cols / RUN * RUN_BYTES;
        MemorySegment in = ALL.asSlice(src, bytes);
        MemorySegment out = ALL.asSlice(dst, bytes);
        boolean finite = true;
        for (long p = 0; p < bytes; p += RUN_BYTES) {
            IntVector packed = IntVector.zero(I);
            for (int b = 0; b < 4; b++) {
                long block = p + 18L * b;
                short d = in.get(SHORT_LE, block);
                finite &= (d & 0x7c00) != 0x7c00;
                out.set(SHORT_LE, p + 2 * b, d);
                IntVector q = (IntVector) ByteVector.fromMemorySegment(B, in, block + 2, LE)
                        .convertShape(ZERO_EXTEND_B2I, I, 0);
                packed = packed.lanewise(OR, q.lanewise(LSHL, 8 * b));
            }
            packed.intoMemorySegment(out, p + 8, LE);
        }
        return finite;
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        MemorySegment row = ALL.asSlice(address, (n / RUN - 1) * unitStride + RUN_BYTES);
        for (int g = 0; g < n / RUN; g++) {
            long p = g * unitStride;
            IntVector v = IntVector.fromMemorySegment(I, row, p + 8, LE);
            for (int b = 0; b < 4; b++) {
                float d = scale(row, p + 2 * b);
                IntVector t = CENTERED.fma(d, 0f).reinterpretAsInts();
                int at = o + g * RUN + 32 * b;
                v.lanewise(LSHR, 8 * b).lanewise(AND, 15).selectFrom(t).reinterpretAsFloats().intoArray(dst, at);
                v.lanewise(LSHR, 8 * b + 4).lanewise(AND, 15).selectFrom(t).reinterpretAsFloats()
                        .intoArray(dst, at + 16);
            }
        }
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        MemorySegment row = ALL.asSlice(address, (long) n / RUN * RUN_BYTES);
        FloatVector acc = FloatVector.zero(F);
        for (int g = 0; g < n / RUN; g++) {
            long p = (long) g * RUN_BYTES;
            IntVector v = IntVector.fromMemorySegment(I, row, p + 8, LE);
            for (int b = 0; b < 4; b++) {
                float d = scale(row, p + 2 * b);
                IntVector t = CENTERED.fma(d, 0f).reinterpretAsInts();
                int xk = xOffset + g * RUN + 32 * b;
                acc = v.lanewise(LSHR, 8 * b).lanewise(AND, 15).selectFrom(t).reinterpretAsFloats()
                        .fma(FloatVector.fromArray(F, x, xk), acc);
                acc = v.lanewise(LSHR, 8 * b + 4).lanewise(AND, 15).selectFrom(t).reinterpretAsFloats()
                        .fma(FloatVector.fromArray(F, x, xk + 16), acc);
            }
        }
        return Lanes.sum(acc);
    }

    @Override
    public int unitBytes() {
        return RUN_BYTES;
    }

    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        MemorySegment rows = ALL.asSlice(address, 3 * rowStride + (n / RUN - 1) * unitStride + RUN_BYTES);
        // One flat loop over blocks (see FusedRows): block c is block c & 3 of run c >> 2, whose 64 bytes of
        // nibbles are loaded again for each of its blocks (from L1).
        for (int c = 0; c < n / 32; c++) {
            long p = (c >> 2) * unitStride;
            int b = c & 3;
            long s = p + 2 * b;
            float d0 = scale(rows, s), d1 = scale(rows, s + rowStride), d2 = scale(rows, s + 2 * rowStride);
            float d3 = scale(rows, s + 3 * rowStride);
            IntVector t0 = CENTERED.fma(d0, 0f).reinterpretAsInts();
            IntVector t1 = CENTERED.fma(d1, 0f).reinterpretAsInts();
            IntVector t2 = CENTERED.fma(d2, 0f).reinterpretAsInts();
            IntVector t3 = CENTERED.fma(d3, 0f).reinterpretAsInts();
            IntVector v0 = IntVector.fromMemorySegment(I, rows, p + 8, LE);
            IntVector v1 = IntVector.fromMemorySegment(I, rows, p + 8 + rowStride, LE);
            IntVector v2 = IntVector.fromMemorySegment(I, rows, p + 8 + 2 * rowStride, LE);
            IntVector v3 = IntVector.fromMemorySegment(I, rows, p + 8 + 3 * rowStride, LE);
            int xk = xOffset + 32 * c;
            FloatVector xLo = FloatVector.fromArray(F, x, xk);
            FloatVector xHi = FloatVector.fromArray(F, x, xk + 16);
            int lo = 8 * b, hi = 8 * b + 4;
            a0 = v0.lanewise(LSHR, lo).lanewise(AND, 15).selectFrom(t0).reinterpretAsFloats().fma(xLo, a0);
            a1 = v1.lanewise(LSHR, lo).lanewise(AND, 15).selectFrom(t1).reinterpretAsFloats().fma(xLo, a1);
            a2 = v2.lanewise(LSHR, lo).lanewise(AND, 15).selectFrom(t2).reinterpretAsFloats().fma(xLo, a2);
            a3 = v3.lanewise(LSHR, lo).lanewise(AND, 15).selectFrom(t3).reinterpretAsFloats().fma(xLo, a3);
            a0 = v0.lanewise(LSHR, hi).lanewise(AND, 15).selectFrom(t0).reinterpretAsFloats().fma(xHi, a0);
            a1 = v1.lanewise(LSHR, hi).lanewise(AND, 15).selectFrom(t1).reinterpretAsFloats().fma(xHi, a1);
            a2 = v2.lanewise(LSHR, hi).lanewise(AND, 15).selectFrom(t2).reinterpretAsFloats().fma(xHi, a2);
            a3 = v3.lanewise(LSHR, hi).lanewise(AND, 15).selectFrom(t3).reinterpretAsFloats().fma(xHi, a3);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, outOffset, 1);
    }
}
