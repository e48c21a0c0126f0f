package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.half;

import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorShape;
import jdk.incubator.vector.VectorSpecies;

/**
 * f16 and bf16 rows. The Vector API has no half-precision conversion, so f16 is widened by arithmetic: the 15
 * magnitude bits shifted into float position read as a float 2^112 too small, for normal and subnormal halves
 * alike, so one exact multiply by 2^112 fixes them; the sign is ORed back, and exponent 31 (infinity, NaN) gets the
 * float's all-ones exponent. That is exactly {@link Float#float16ToFloat}, 16 lanes at a time.
 */
final class HalfRows implements RowDecoder {
    private static final float TWO_112 = 0x1p112f;
    /** Sign, exponent and mantissa of a sign-extended half shifted left 13; its exponent field there. */
    private static final int KEEP = 0x8FFF_E000;
    private static final int EXP31 = 0x7C00 << 13;
    /** 2L bytes, reinterpreted as L little-endian halves (the platform order; {@link Lanes} checks it). */
    private static final VectorSpecies<Byte> B2 = VectorSpecies.of(byte.class, VectorShape.forBitSize(L * 16));

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
    public void decode(byte[] src, int[] offs, int count, float[] dst, int stride) {
        int vec = dim - dim % L;
        if (brain) {
            bf16(src, offs, count, dst, stride, vec);
        } else {
            f16(src, offs, count, dst, stride, vec);
        }
        for (int k = 0; k < count; k++) {
            for (int i = vec; i < dim; i++) {
                short h = half(src, offs[k] + 2 * i);
                dst[k * stride + i] = brain ? Float.intBitsToFloat(h << 16) : Float.float16ToFloat(h);
            }
        }
    }

    private static void bf16(byte[] src, int[] offs, int count, float[] dst, int stride, int vec) {
        for (int k = 0; k < count; k++) {
            int off = offs[k];
            int o = k * stride;
            for (int i = 0; i < vec; i += L) {
                ((IntVector) ByteVector.fromArray(B2, src, off + 2 * i).reinterpretAsShorts()
                        .convertShape(VectorOperators.S2I, I, 0)).lanewise(VectorOperators.LSHL, 16)
                        .reinterpretAsFloats().intoArray(dst, o + i);
            }
        }
    }

    /**
     * Widens every lane as if it were finite (sign, exponent and mantissa shifted into place, one multiply) and
     * tracks the largest exponent field; only when some lane had exponent 31 are the rows widened again with the
     * blend ({@link #f16Exact}). Finite halves get the same bits either way.
     */
    private static void f16(byte[] src, int[] offs, int count, float[] dst, int stride, int vec) {
        IntVector seen = IntVector.zero(I);
        for (int k = 0; k < count; k++) {
            int off = offs[k];
            int o = k * stride;
            for (int i = 0; i < vec; i += L) {
                IntVector b = ((IntVector) ByteVector.fromArray(B2, src, off + 2 * i).reinterpretAsShorts()
                        .convertShape(VectorOperators.S2I, I, 0)).lanewise(VectorOperators.LSHL, 13).and(KEEP);
                seen = seen.max(b.and(EXP31));
                b.reinterpretAsFloats().mul(TWO_112).intoArray(dst, o + i);
            }
        }
        if (seen.reduceLanes(VectorOperators.MAX) == EXP31) {
            f16Exact(src, offs, count, dst, stride, vec);
        }
    }

    private static void f16Exact(byte[] src, int[] offs, int count, float[] dst, int stride, int vec) {
        for (int k = 0; k < count; k++) {
            int off = offs[k];
            int o = k * stride;
            for (int i = 0; i < vec; i += L) {
                IntVector h = (IntVector) ByteVector.fromArray(B2, src, off + 2 * i).reinterpretAsShorts()
                        .convertShape(VectorOperators.S2I, I, 0);
                IntVector bits = h.and(0x7FFF).lanewise(VectorOperators.LSHL, 13).reinterpretAsFloats()
                        .mul(TWO_112).reinterpretAsInts()
                        .or(h.and(0x8000).lanewise(VectorOperators.LSHL, 16));
                VectorMask<Integer> special = h.and(0x7C00).compare(VectorOperators.EQ, 0x7C00);
                bits.blend(bits.or(0x7F80_0000), special).reinterpretAsFloats().intoArray(dst, o + i);
            }
        }
    }
}
