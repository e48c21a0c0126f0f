package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.B;
import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.B2F;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;

/**
 * Q8_0: blocks of 32 values, 34 bytes: fp16 scale {@code d}, then 32 int8 {@code q}; value = q * d (exact in
 * float: 11 by 8 significant bits).
 */
final class Q8_0Format implements WeightFormat, FusedRows {
    static final Q8_0Format INSTANCE = new Q8_0Format();
    private static final int QK = 32;
    private static final int BYTES = 34;
    /** Chunks of L values per block. */
    private static final int CPB = QK / L;
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);

    private Q8_0Format() {
    }

    @Override
    public GgmlType type() {
        return GgmlType.Q8_0;
    }

    private static float scale(MemorySegment rows, long block) {
        return Float.float16ToFloat(rows.get(SHORT_LE, block));
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        MemorySegment row = ALL.asSlice(address, (n / QK - 1) * unitStride + BYTES);
        for (int b = 0; b < n / QK; b++) {
            long p = b * unitStride;
            float d = scale(row, p);
            for (int part = 0; part < CPB; part++) {
                ((FloatVector) ByteVector.fromMemorySegment(B, row, p + 2 + part * L, LE).convertShape(B2F, F, 0))
                        .mul(d).intoArray(dst, o + b * QK + part * L);
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
            for (int part = 0; part < CPB; part++) {
                FloatVector q = (FloatVector) ByteVector.fromMemorySegment(B, row, p + 2 + part * L, LE)
                        .convertShape(B2F, F, 0);
                acc = q.mul(d).fma(FloatVector.fromArray(F, x, xOffset + b * QK + part * L), acc);
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
        // A slice with the rows' own bounds, offsets affine in the block counter: C2 then proves every load in
        // range before the loop and checks none inside it (with absolute addresses into ALL, each load kept a
        // compare and a branch, and streaming from memory ran at 0.6x the speed).
        MemorySegment rows = ALL.asSlice(address, 3 * rowStride + (n / QK - 1) * unitStride + BYTES);
        // Two copies of the loop, each with a constant block stride: C2 proves the loads in range only for a
        // constant scale of the counter (with the stride a variable, in-cache speed fell 5-15%).
        if (unitStride == BYTES) {
            for (int b = 0; b < n / QK; b++) {
                long p = (long) b * BYTES;
                FloatVector d0 = FloatVector.broadcast(F, scale(rows, p));
                FloatVector d1 = FloatVector.broadcast(F, scale(rows, p + rowStride));
                FloatVector d2 = FloatVector.broadcast(F, scale(rows, p + 2 * rowStride));
                FloatVector d3 = FloatVector.broadcast(F, scale(rows, p + 3 * rowStride));
                for (int part = 0; part < CPB; part++) {
                    long q = p + 2 + part * L;
                    FloatVector xv = FloatVector.fromArray(F, x, xOffset + b * QK + part * L);
                    FloatVector q0 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q, LE).convertShape(B2F, F, 0);
                    FloatVector q1 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q + rowStride, LE)
                            .convertShape(B2F, F, 0);
                    FloatVector q2 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q + 2 * rowStride, LE)
                            .convertShape(B2F, F, 0);
                    FloatVector q3 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q + 3 * rowStride, LE)
                            .convertShape(B2F, F, 0);
                    a0 = q0.mul(d0).fma(xv, a0);
                    a1 = q1.mul(d1).fma(xv, a1);
                    a2 = q2.mul(d2).fma(xv, a2);
                    a3 = q3.mul(d3).fma(xv, a3);
                }
            }
        } else if (unitStride == 4 * BYTES) {
            for (int b = 0; b < n / QK; b++) {
                long p = (long) b * (4 * BYTES);
                FloatVector d0 = FloatVector.broadcast(F, scale(rows, p));
                FloatVector d1 = FloatVector.broadcast(F, scale(rows, p + rowStride));
                FloatVector d2 = FloatVector.broadcast(F, scale(rows, p + 2 * rowStride));
                FloatVector d3 = FloatVector.broadcast(F, scale(rows, p + 3 * rowStride));
                for (int part = 0; part < CPB; part++) {
                    long q = p + 2 + part * L;
                    FloatVector xv = FloatVector.fromArray(F, x, xOffset + b * QK + part * L);
                    FloatVector q0 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q, LE).convertShape(B2F, F, 0);
                    FloatVector q1 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q + rowStride, LE)
                            .convertShape(B2F, F, 0);
                    FloatVector q2 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q + 2 * rowStride, LE)
                            .convertShape(B2F, F, 0);
                    FloatVector q3 = (FloatVector) ByteVector.fromMemorySegment(B, rows, q + 3 * rowStride, LE)
                            .convertShape(B2F, F, 0);
                    a0 = q0.mul(d0).fma(xv, a0);
                    a1 = q1.mul(d1).fma(xv, a1);
                    a2 = q2.mul(d2).fma(xv, a2);
                    a3 = q3.mul(d3).fma(xv, a3);
                }
            }
        } else {
            throw new IllegalArgumentException("unit stride " + unitStride);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        Lanes.sum4(t, 0, out, outOffset, 1);
    }

    /** As ggml's reference: d = max|x| / 127, q = round-half-away(x / d). */
    @Override
    public void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset) {
        Blocks.check(this, n);
        long p = byteOffset;
        for (int k = 0; k < n; k += QK, p += BYTES) {
            float amax = 0;
            for (int j = 0; j < QK; j++) {
                amax = Math.max(amax, Math.abs(src[srcOffset + k + j]));
            }
            float d = amax / 127;
            float id = d != 0 ? 1.0f / d : 0.0f;
            dst.set(SHORT_LE, p, Float.floatToFloat16(d));
            for (int j = 0; j < QK; j++) {
                dst.set(ValueLayout.JAVA_BYTE, p + 2 + j, (byte) Blocks.roundHalfAway(src[srcOffset + k + j] * id));
            }
        }
    }
}
