package dev.kvant.kv;

import static dev.kvant.kv.KvLanes.F;
import static dev.kvant.kv.KvLanes.I;
import static dev.kvant.kv.KvLanes.L;
import static dev.kvant.kv.KvLanes.LE;
import static dev.kvant.kv.KvLanes.LE_SHORT;
import static dev.kvant.kv.KvLanes.S;

import java.lang.foreign.MemorySegment;
import java.util.Objects;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;

/**
 * f16 and bf16: one little-endian 16-bit float per value, rounded to nearest even. bf16 keeps NaNs quiet.
 */
public final class HalfFormat implements KvFormat {
    public static final HalfFormat F16 = new HalfFormat("f16", false);
    public static final HalfFormat BF16 = new HalfFormat("bf16", true);

    private final String name;
    private final boolean brain;

    private HalfFormat(String name, boolean brain) {
        this.name = name;
        this.brain = brain;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public double bitsPerValue() {
        return 16;
    }

    @Override
    public long rowBytes(int headDim) {
        return 2L * domainDim(headDim);
    }

    @Override
    public boolean rotated() {
        return false;
    }

    @Override
    public void encode(float[] src, int srcOff, int headDim, MemorySegment dst, long dstOff) {
        Objects.checkFromIndexSize(srcOff, headDim, src.length);
        if (brain) {
            int i = 0;
            for (; i <= headDim - L; i += L) {
                IntVector bits = FloatVector.fromArray(F, src, srcOff + i).reinterpretAsInts();
                IntVector rounded = bits.add(bits.lanewise(VectorOperators.LSHR, 16).and(1).add(0x7FFF))
                        .lanewise(VectorOperators.LSHR, 16);
                VectorMask<Integer> nan = bits.and(0x7FFF_FFFF).compare(VectorOperators.GT, 0x7F80_0000);
                IntVector quiet = bits.lanewise(VectorOperators.LSHR, 16).or(0x40);
                ((ShortVector) rounded.blend(quiet, nan).convertShape(VectorOperators.I2S, S, 0))
                        .intoMemorySegment(dst, dstOff + 2L * i, LE);
            }
            for (; i < headDim; i++) {
                dst.set(LE_SHORT, dstOff + 2L * i, toBf16(src[srcOff + i]));
            }
        } else {
            // saturated, as scales are: a value past the f16 range becomes ±65504, not an infinity (which would turn
            // the zero weight a masked row gets in a prefill or multi-query call into NaN: 0·inf); NaN stays NaN
            for (int i = 0; i < headDim; i++) {
                dst.set(LE_SHORT, dstOff + 2L * i, KvLanes.toHalf(src[srcOff + i]));
            }
        }
    }

    @Override
    public void encodeRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff, long dstStride) {
        for (int r = 0; r < rows; r++) {
            encode(src, srcOff + r * headDim, headDim, dst, dstOff + r * dstStride);
        }
    }

    @Override
    public void decode(MemorySegment src, long srcOff, int headDim, float[] dst, int dstOff) {
        Objects.checkFromIndexSize(dstOff, headDim, dst.length);
        if (brain) {
            int i = 0;
            for (; i <= headDim - L; i += L) {
                ((IntVector) ShortVector.fromMemorySegment(S, src, srcOff + 2L * i, LE).convertShape(VectorOperators.S2I, I, 0))
                        .lanewise(VectorOperators.LSHL, 16).reinterpretAsFloats().intoArray(dst, dstOff + i);
            }
            for (; i < headDim; i++) {
                dst[dstOff + i] = Float.intBitsToFloat(src.get(LE_SHORT, srcOff + 2L * i) << 16);
            }
        } else {
            for (int i = 0; i < headDim; i++) {
                dst[dstOff + i] = Float.float16ToFloat(src.get(LE_SHORT, srcOff + 2L * i));
            }
        }
    }

    /** Round to nearest even on the upper 16 bits of the float; NaNs stay NaN (quiet bit forced). */
    static short toBf16(float x) {
        int bits = Float.floatToRawIntBits(x);
        if ((bits & 0x7FFF_FFFF) > 0x7F80_0000) {
            return (short) ((bits >>> 16) | 0x40);
        }
        return (short) ((bits + 0x7FFF + ((bits >>> 16) & 1)) >>> 16);
    }

    @Override
    public String toString() {
        return name;
    }
}
