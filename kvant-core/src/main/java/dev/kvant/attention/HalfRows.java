package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.LE;
import static dev.kvant.attention.Lanes.LE_SHORT;
import static dev.kvant.attention.Lanes.S;

import java.lang.foreign.MemorySegment;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;

/**
 * f16 and bf16 rows. The Vector API has no half-precision conversion, so f16 is widened by arithmetic: the 15
 * magnitude bits shifted into float position read as a float 2^112 too small, for normal and subnormal halves
 * alike, so one exact multiply by 2^112 fixes them; the sign is ORed back, and exponent 31 (infinity, NaN) gets the
 * float's all-ones exponent. That is exactly {@link Float#float16ToFloat}, 16 lanes at a time.
 */
final class HalfRows implements RowDecoder {
    private static final float TWO_112 = 0x1p112f;

    private final boolean brain;
    private final int dim;

    HalfRows(boolean brain, int dim) {
        this.brain = brain;
        this.dim = dim;
    }

    @Override
    public int dim() {
        return dim;
    }

    @Override
    public void decode(MemorySegment src, long[] offs, int count, float[] dst, int stride) {
        int vec = dim - dim % L;
        for (int k = 0; k < count; k++) {
            long off = offs[k];
            int o = k * stride;
            if (brain) {
                for (int i = 0; i < vec; i += L) {
                    ((IntVector) ShortVector.fromMemorySegment(S, src, off + 2L * i, LE)
                            .convertShape(VectorOperators.S2I, I, 0)).lanewise(VectorOperators.LSHL, 16)
                            .reinterpretAsFloats().intoArray(dst, o + i);
                }
                for (int i = vec; i < dim; i++) {
                    dst[o + i] = Float.intBitsToFloat(src.get(LE_SHORT, off + 2L * i) << 16);
                }
            } else {
                for (int i = 0; i < vec; i += L) {
                    IntVector h = (IntVector) ShortVector.fromMemorySegment(S, src, off + 2L * i, LE)
                            .convertShape(VectorOperators.S2I, I, 0);
                    IntVector bits = h.and(0x7FFF).lanewise(VectorOperators.LSHL, 13).reinterpretAsFloats()
                            .mul(TWO_112).reinterpretAsInts()
                            .or(h.and(0x8000).lanewise(VectorOperators.LSHL, 16));
                    VectorMask<Integer> special = h.and(0x7C00).compare(VectorOperators.EQ, 0x7C00);
                    bits.lanewise(VectorOperators.OR, 0x7F80_0000, special).reinterpretAsFloats().intoArray(dst, o + i);
                }
                for (int i = vec; i < dim; i++) {
                    dst[o + i] = Float.float16ToFloat(src.get(LE_SHORT, off + 2L * i));
                }
            }
        }
    }
}
