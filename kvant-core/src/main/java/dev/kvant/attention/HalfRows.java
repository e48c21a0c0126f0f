package dev.kvant.attention;

import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.half;

import java.lang.foreign.MemorySegment;
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
 * float's all-ones exponent. That is exactly {@link Float#float16ToFloat}, 16 lanes at a time. Long runs of adjacent
 * rows into an unpadded tile take the hardware's conversion instead, through C2 ({@link #f16Runs}).
 */
final class HalfRows implements RowDecoder {
    private static final float TWO_112 = 0x1p112f;
    /** Sign, exponent and mantissa of a sign-extended half shifted left 13; its exponent field there. */
    private static final int KEEP = 0x8FFF_E000;
    private static final int EXP31 = 0x7C00 << 13;
    /** 2L bytes, reinterpreted as L little-endian halves (the platform order; {@link Lanes} checks it). */
    private static final VectorSpecies<Byte> B2 = VectorSpecies.of(byte.class, VectorShape.forBitSize(L * 16));

    /**
     * Values in a run below which the Vector API's widening is kept: a loop over one or two rows of 128 spends on
     * its set-up what the conversion saves (0.12 ns a value for a row alone, 0.09 by exponent arithmetic, 0.055 in
     * long runs; docs/BENCHMARKS.md).
     */
    private static final int MIN_RUN = 512;

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
        if (!brain && stride == dim && dim % L == 0) {
            f16Runs(src, offs, count, dst);
            return;
        }
        int vec = dim - dim % L;
        if (brain) {
            bf16(src, offs, count, dst, stride, vec);
        } else {
            f16(src, offs, 0, count, dst, stride, vec);
        }
        for (int k = 0; k < count; k++) {
            for (int i = vec; i < dim; i++) {
                short h = half(src, offs[k] + 2 * i);
                dst[k * stride + i] = brain ? Float.intBitsToFloat(h << 16) : Float.float16ToFloat(h);
            }
        }
    }

    /**
     * f16 rows into a tile without gaps (stride = dim), a run of rows adjacent in src at a time: each run is one
     * loop of {@link Float#float16ToFloat} over consecutive halves, which C2 turns into the hardware's
     * half-to-float conversion, 16 lanes an instruction (the Vector API has no such conversion).
     */
    private void f16Runs(byte[] src, int[] offs, int count, float[] dst) {
        MemorySegment in = MemorySegment.ofArray(src);
        long rowBytes = 2L * dim;
        for (int k = 0; k < count; ) {
            int r = k + 1;
            while (r < count && offs[r] == offs[r - 1] + rowBytes) {
                r++;
            }
            if ((r - k) * dim >= MIN_RUN) {
                widen(in, offs[k], dst, k * dim, (r - k) * dim);
            } else {
                f16(src, offs, k, r, dst, dim, dim);
            }
            k = r;
        }
    }

    private static void widen(MemorySegment in, long from, float[] dst, int to, int n) {
        for (int i = 0; i < n; i++) {
            dst[to + i] = Float.float16ToFloat(in.get(Lanes.LE_SHORT, from + 2L * i));
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
    private static void f16(byte[] src, int[] offs, int from, int to, float[] dst, int stride, int vec) {
        IntVector seen = IntVector.zero(I);
        for (int k = from; k < to; k++) {
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
            f16Exact(src, offs, from, to, dst, stride, vec);
        }
    }

    private static void f16Exact(byte[] src, int[] offs, int from, int to, float[] dst, int stride, int vec) {
        for (int k = from; k < to; k++) {
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
