package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.RawMemory.ALL;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.FloatVector;

/**
 * IEEE binary32, little-endian. A row whose length is not a multiple of L ends with a partial chunk, which every
 * kernel pads with zeros to a full one.
 */
final class F32Format implements WeightFormat, FusedRows {
    static final F32Format INSTANCE = new F32Format();
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfFloat FLOAT_LE = ValueLayout.JAVA_FLOAT_UNALIGNED.withOrder(LE);

    private F32Format() {
    }

    @Override
    public GgmlType type() {
        return GgmlType.F32;
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        if (unitStride == 4L * L) {
            MemorySegment.copy(ALL, FLOAT_LE, address, dst, o, n);
            return;
        }
        int full = n - n % L;
        for (int k = 0; k < full; k += L) {
            MemorySegment.copy(ALL, FLOAT_LE, address + k / L * unitStride, dst, o + k, L);
        }
        MemorySegment.copy(ALL, FLOAT_LE, address + full / L * unitStride, dst, o + full, n - full);
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        FloatVector acc = FloatVector.zero(F);
        MemorySegment row = ALL.asSlice(address, 4L * n);
        int full = n - n % L;
        for (int k = 0; k < full; k += L) {
            acc = FloatVector.fromMemorySegment(F, row, 4L * k, LE).fma(FloatVector.fromArray(F, x, xOffset + k), acc);
        }
        if (full < n) {
            float[] wt = new float[L];
            decode(address + 4L * full, wt, 0, n - full);
            acc = FloatVector.fromArray(F, wt, 0)
                    .fma(FloatVector.fromArray(F, Lanes.padded(x, xOffset + full, n - full), 0), acc);
        }
        return Lanes.sum(acc);
    }

    @Override
    public int unitBytes() {
        return 4 * L;
    }

    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        int full = n - n % L;
        MemorySegment rows = ALL.asSlice(address, 3 * rowStride + full / L * unitStride + 4L * (n - full));
        long p1 = rowStride, p2 = 2 * rowStride, p3 = 3 * rowStride;
        for (int k = 0; k < full; k += L) {
            FloatVector xv = FloatVector.fromArray(F, x, xOffset + k);
            long at = k / L * unitStride;
            a0 = FloatVector.fromMemorySegment(F, rows, at, LE).fma(xv, a0);
            a1 = FloatVector.fromMemorySegment(F, rows, p1 + at, LE).fma(xv, a1);
            a2 = FloatVector.fromMemorySegment(F, rows, p2 + at, LE).fma(xv, a2);
            a3 = FloatVector.fromMemorySegment(F, rows, p3 + at, LE).fma(xv, a3);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        finish4(address, rowStride, unitStride, x, xOffset, full, n, out, outOffset, t);
    }

    @Override
    public void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset) {
        MemorySegment.copy(src, srcOffset, dst, FLOAT_LE, byteOffset, n);
    }
}
