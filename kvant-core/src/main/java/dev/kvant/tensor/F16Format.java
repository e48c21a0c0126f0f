package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.I;
import static dev.kvant.tensor.Lanes.L;
import static dev.kvant.tensor.Lanes.S;
import static dev.kvant.tensor.RawMemory.ALL;
import static jdk.incubator.vector.VectorOperators.AND;
import static jdk.incubator.vector.VectorOperators.EQ;
import static jdk.incubator.vector.VectorOperators.LSHL;
import static jdk.incubator.vector.VectorOperators.MAX;
import static jdk.incubator.vector.VectorOperators.OR;
import static jdk.incubator.vector.VectorOperators.S2I;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;

/**
 * IEEE binary16, little-endian.
 *
 * <p>The Vector API (JDK 25) has no half-to-float conversion, so the kernels widen halves in vector lanes with
 * integer operations: sign-extend to int, shift left 13 and keep the sign bit, the five exponent bits and the ten
 * mantissa bits, which is the binary32 bit pattern of the half's value times 2^-112 (subnormal halves land on
 * binary32 subnormals, exactly); one multiply by 2^112 restores the value, exact for every finite half. Infinities
 * and NaNs (exponent 31) instead get the binary32 exponent 255 by one OR and an add of zero, which quiets a
 * signaling NaN as the hardware conversion does; a blend picks them. Every half gives the bits of
 * {@link Float#float16ToFloat}.
 *
 * <p>The four-row product ({@link #dot4}, the hot one) skips the blend: it treats every lane as finite and only
 * tracks the largest exponent field, redoing the group exactly when an infinity or NaN was among them.
 *
 * <p>Why it matters: on 512-wide rows this kernel is bound by how many loads the core keeps in flight, which is
 * the reorder window divided by the operations per vector, so every operation saved shows. This replaced decoding
 * a chunk of each row into scratch with a loop of {@link Float#float16ToFloat} (which C2 turns into vcvtph2ps) and
 * multiplying from there: on one core of the Zen 5 development VM the four-row product went from 10.4 to 16.3 G
 * values/s in L2 and from 12.7 to 17.7 GB/s streaming ({@code MatvecBench}); dropping the blend took tinycode's
 * 512-wide matrices from 7.4-9.1 to 11.4-19.0 GB/s (docs/BENCHMARKS.md).
 */
final class F16Format implements WeightFormat, FusedRows {
    static final F16Format INSTANCE = new F16Format();
    private static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    private static final ValueLayout.OfShort SHORT_LE = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);
    /** Sign, five exponent and ten mantissa bits of a half once shifted left 13 (after sign extension). */
    private static final int KEEP = 0x8FFF_E000;
    /** The exponent field of a half shifted left 13, and the bits that turn it into binary32's 255. */
    private static final int EXP31 = 0x7C00 << 13;
    private static final int EXP255 = 0x7000_0000;
    private static final float UNBIAS = 0x1p112f;

    private F16Format() {
    }

    @Override
    public GgmlType type() {
        return GgmlType.F16;
    }

    @Override
    public PackedRows packing(int cols) {
        return F16Finite.INSTANCE;
    }

    @Override
    public void decode(long address, long unitStride, float[] dst, int o, int n) {
        int full = n - n % L;
        MemorySegment row = ALL.asSlice(address, full / L * unitStride + 2L * (n - full));
        int i = 0;
        for (; i < full; i += L) {
            IntVector b = ((IntVector) ShortVector.fromMemorySegment(S, row, i / L * unitStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            FloatVector f = b.reinterpretAsFloats().mul(UNBIAS);
            f.blend(b.lanewise(OR, EXP255).reinterpretAsFloats().add(0f), b.lanewise(AND, EXP31).compare(EQ, EXP31)
                    .cast(F)).intoArray(dst, o + i);
        }
        for (; i < n; i++) {
            dst[o + i] = Float.float16ToFloat(row.get(SHORT_LE, full / L * unitStride + 2L * (i - full)));
        }
    }

    @Override
    public float dot1(long address, float[] x, int xOffset, int n) {
        return dot1(address, 2L * L, x, xOffset, n);
    }

    /** {@link #dot1} of a row whose chunks of L values lie {@code unitStride} bytes apart (the tail follows the last). */
    static float dot1(long address, long unitStride, float[] x, int xOffset, int n) {
        int full = n - n % L;
        MemorySegment row = ALL.asSlice(address, full / L * unitStride + 2L * (n - full));
        FloatVector acc = FloatVector.zero(F);
        for (int k = 0; k < full; k += L) {
            IntVector b = ((IntVector) ShortVector.fromMemorySegment(S, row, k / L * unitStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            FloatVector w = b.reinterpretAsFloats().mul(UNBIAS).blend(
                    b.lanewise(OR, EXP255).reinterpretAsFloats().add(0f), b.lanewise(AND, EXP31).compare(EQ, EXP31)
                    .cast(F));
            acc = w.fma(FloatVector.fromArray(F, x, xOffset + k), acc);
        }
        if (full < n) {
            float[] w = new float[L];
            INSTANCE.decode(address + full / L * unitStride, w, 0, n - full);
            acc = FloatVector.fromArray(F, w, 0).fma(FloatVector.fromArray(F, Lanes.padded(x, xOffset + full,
                    n - full), 0), acc);
        }
        return Lanes.sum(acc);
    }

    @Override
    public int unitBytes() {
        return 2 * L;
    }

    /**
     * Widens every lane as if it were finite (shift, mask, one multiply) and keeps, on the side, the largest
     * exponent field seen; only when some lane had exponent 31 (an infinity or a NaN) is the product done again
     * row by row with the blend ({@link #dot1}). Three fewer operations a vector than blending each one: more loads in
     * flight. (Rows checked once to be finite take {@link F16Finite}'s kernel, without the bookkeeping.)
     */
    @Override
    public void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
                     int outOffset, float[] t) {
        FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
        IntVector seen = IntVector.zero(I);
        // Absolute addresses into ALL, no slice a call: measured 2-6% faster in L2 and no slower streamed
        // (MatvecBench, docs/BENCHMARKS.md); Q8_0's kernel measured the opposite (see there), so each keeps its own
        MemorySegment rows = ALL;
        int full = n - n % L;
        for (int k = 0; k < full; k += L) {
            FloatVector xv = FloatVector.fromArray(F, x, xOffset + k);
            long p = address + k / L * unitStride;
            IntVector b0 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p, LE).convertShape(S2I, I, 0))
                    .lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b1 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + rowStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b2 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 2 * rowStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            IntVector b3 = ((IntVector) ShortVector.fromMemorySegment(S, rows, p + 3 * rowStride, LE)
                    .convertShape(S2I, I, 0)).lanewise(LSHL, 13).lanewise(AND, KEEP);
            seen = seen.max(b0.lanewise(AND, EXP31).max(b1.lanewise(AND, EXP31)))
                    .max(b2.lanewise(AND, EXP31).max(b3.lanewise(AND, EXP31)));
            a0 = b0.reinterpretAsFloats().mul(UNBIAS).fma(xv, a0);
            a1 = b1.reinterpretAsFloats().mul(UNBIAS).fma(xv, a1);
            a2 = b2.reinterpretAsFloats().mul(UNBIAS).fma(xv, a2);
            a3 = b3.reinterpretAsFloats().mul(UNBIAS).fma(xv, a3);
        }
        if (seen.reduceLanes(MAX) == EXP31) {
            // Rare: the single-row product blends every lane, and gives each row dot4's bits (FusedRows).
            for (int r = 0; r < 4; r++) {
                out[outOffset + r] = dot1(address + r * rowStride, unitStride, x, xOffset, n);
            }
            return;
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
            dst.set(SHORT_LE, byteOffset + 2L * k, Float.floatToFloat16(src[srcOffset + k]));
        }
    }
}
