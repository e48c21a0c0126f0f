package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.Lanes.S;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.LSHL;
import static jdk.incubator.vector.VectorOperators.S2I;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.util.Arrays;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;

/**
 * bfloat16 (the upper half of a binary32), little-endian. The four-row product widens each row's lanes in registers
 * and multiplies them at once (1.7x the speed of decoding a chunk of each row into scratch first); single rows
 * and the tail go through scratch.
 */
final class Bf16Format implements WeightFormat, FusedRows {
    static final Bf16Format INSTANCE = new Bf16Format();
    /** Values decoded per row per step: four rows of them are 4 KiB of scratch, well inside L1. */
    private static final int CHUNK = FusedRows.SCRATCH / 4;
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);

    private Bf16Format() {
    }

    @Override
    public GgmlType type() {
        return GgmlType.BF16;
    }

    /** A bfloat16 is the top half of a float: widen to int and shift into place. */
    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        int full = n - n % L;
        MemorySegment row = ALL.asSlice(address, full / L * unitStride + 2L * (n - full));
        int i = 0;
        for (; i < full; i += L) {
            ((IntVector) ShortVector.fromMemorySegment(S, row, i / L * unitStride, LE).convertShape(S2I, I, 0))
                    .lanewise(LSHL, 16).reinterpretAsFloats().intoArray(dst, o + i);
        }
        for (; i < n; i++) {
            dst[o + i] = Float.intBitsToFloat(row.get(SHORT_LE, full / L * unitStride + 2L * (i - full)) << 16);
        }
    }

    /** L bfloat16 values at byte offset p as floats. */
    private static FloatVector widen(MemorySegment rows, long p) {
        return ((IntVector) ShortVector.fromMemorySegment(S, rows, p, LE).convertShape(S2I, I, 0))
                .lanewise(LSHL, 16).reinterpretAsFloats();
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        float[] buf = new float[CHUNK];
        FloatVector acc = FloatVector.zero(F);
        for (int k0 = 0; k0 < n; k0 += CHUNK) {
            int len = Math.min(CHUNK, n - k0);
            decode(address + 2L * k0, buf, 0, len);
            int full = len - len % L;
            for (int k = 0; k < full; k += L) {
                acc = FloatVector.fromArray(F, buf, k).fma(FloatVector.fromArray(F, x, xOffset + k0 + k), acc);
            }
            if (full < len) {
                Arrays.fill(buf, len, full + L, 0f);
                float[] xt = Lanes.padded(x, xOffset + k0 + full, len - full);
                acc = FloatVector.fromArray(F, buf, full).fma(FloatVector.fromArray(F, xt, 0), acc);
            }
        }
        return Lanes.sum(acc);
    }

    @Override
    public int unitBytes() {
        return 2 * L;
    }

    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        // Widened in registers and multiplied at once: the same products in the same order as decoding into
        // scratch first, without the round trip through it.
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        int full = n - n % L;
        MemorySegment rows = ALL.asSlice(address, 3 * rowStride + full / L * unitStride + 2L * (n - full));
        for (int k = 0; k < full; k += L) {
            FloatVector xv = FloatVector.fromArray(F, x, xOffset + k);
            long p = k / L * unitStride;
            a0 = widen(rows, p).fma(xv, a0);
            a1 = widen(rows, p + rowStride).fma(xv, a1);
            a2 = widen(rows, p + 2 * rowStride).fma(xv, a2);
            a3 = widen(rows, p + 3 * rowStride).fma(xv, a3);
        }
        a0.intoArray(t, 0);
        a1.intoArray(t, L);
        a2.intoArray(t, 2 * L);
        a3.intoArray(t, 3 * L);
        finish4(address, rowStride, unitStride, x, xOffset, full, n, out, outOffset, t);
    }

    @Override
    public void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset) {
        for (int k = 0; k < n; k++) {
            dst.set(SHORT_LE, byteOffset + 2L * k, fromFloat(src[srcOffset + k]));
        }
    }

    /** Round to nearest even, as ggml converts; a NaN stays a (quiet) NaN rather than rounding to infinity. */
    static short fromFloat(float f) {
        int bits = Float.floatToRawIntBits(f);
        if (Float.isNaN(f)) {
            return (short) ((bits >>> 16) | 0x40);
        }
        return (short) ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16);
    }
}
