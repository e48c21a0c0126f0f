package dev.kvant.attention;

import static dev.kvant.attention.Lanes.B;
import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.half;

import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorOperators;

/**
 * q8_0 (blocks of 32) and int8 (blocks of 64) rows: per block an fp16 scale d and signed bytes, value d·q. The
 * bytes convert to floats lane for lane and are scaled in the same multiply the format's decoder does, so the
 * values match it bit for bit; dot products then run in float on the tile (the Vector API has no int8
 * multiply-accumulate that would beat the conversion).
 */
final class Int8Rows implements RowDecoder {
    private final int block;
    private final int dim;

    Int8Rows(int block, int dim) {
        this.block = block;
        this.dim = dim;
    }

    @Override
    public int dim() {
        return dim;
    }

    @Override
    public void decode(byte[] src, int[] offs, int count, float[] dst, int stride) {
        int full = dim / block;
        // Constant block sizes in the loops: with the size in a field the same loops ran 1.5-2x slower.
        if (block == 32 && dim == 128 && L == 16) {
            decode32x128(src, offs, count, dst, stride);
        } else if (block == 32) {
            decode32(src, offs, count, dst, stride, full);
        } else if (dim == 128 && L == 16) {
            decode64x128(src, offs, count, dst, stride);
        } else {
            decode64(src, offs, count, dst, stride, full);
        }
        if (full * block < dim) {
            for (int k = 0; k < count; k++) {
                int in = offs[k] + full * (block + 2);
                float d = Float.float16ToFloat(half(src, in));
                for (int i = full * block; i < dim; i++) {
                    dst[k * stride + i] = src[in + 2 + i - full * block] * d;
                }
            }
        }
    }

    private static void decode32(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks) {
        for (int k = 0; k < count; k++) {
            int off = offs[k];
            int o = k * stride;
            for (int b = 0; b < blocks; b++) {
                int in = off + b * 34;
                float d = Float.float16ToFloat(half(src, in));
                for (int i = 0; i < 32; i += L) {
                    ((FloatVector) ByteVector.fromArray(B, src, in + 2 + i).convertShape(VectorOperators.B2F, F, 0))
                            .mul(d).intoArray(dst, o + b * 32 + i);
                }
            }
        }
    }

    /**
     * q8_0 rows of 128 (the usual head size) at 16 lanes, written out: four blocks of two vectors a row, no inner
     * loops (C2 keeps a bounds check and a counter per loop; nested loops over constant trips cost it more).
     */
    private static void decode32x128(byte[] src, int[] offs, int count, float[] dst, int stride) {
        for (int k = 0; k < count; k++) {
            int in = offs[k];
            int o = k * stride;
            float d0 = Float.float16ToFloat(half(src, in));
            float d1 = Float.float16ToFloat(half(src, in + 34));
            float d2 = Float.float16ToFloat(half(src, in + 68));
            float d3 = Float.float16ToFloat(half(src, in + 102));
            ((FloatVector) ByteVector.fromArray(B, src, in + 2).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d0).intoArray(dst, o);
            ((FloatVector) ByteVector.fromArray(B, src, in + 18).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d0).intoArray(dst, o + 16);
            ((FloatVector) ByteVector.fromArray(B, src, in + 36).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d1).intoArray(dst, o + 32);
            ((FloatVector) ByteVector.fromArray(B, src, in + 52).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d1).intoArray(dst, o + 48);
            ((FloatVector) ByteVector.fromArray(B, src, in + 70).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d2).intoArray(dst, o + 64);
            ((FloatVector) ByteVector.fromArray(B, src, in + 86).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d2).intoArray(dst, o + 80);
            ((FloatVector) ByteVector.fromArray(B, src, in + 104).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d3).intoArray(dst, o + 96);
            ((FloatVector) ByteVector.fromArray(B, src, in + 120).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d3).intoArray(dst, o + 112);
        }
    }

    /** int8 rows of 128 at 16 lanes, written out as {@link #decode32x128}: two blocks of four vectors a row. */
    private static void decode64x128(byte[] src, int[] offs, int count, float[] dst, int stride) {
        for (int k = 0; k < count; k++) {
            int in = offs[k];
            int o = k * stride;
            float d0 = Float.float16ToFloat(half(src, in + 0));
            float d1 = Float.float16ToFloat(half(src, in + 66));
            ((FloatVector) ByteVector.fromArray(B, src, in + 2).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d0).intoArray(dst, o + 0);
            ((FloatVector) ByteVector.fromArray(B, src, in + 18).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d0).intoArray(dst, o + 16);
            ((FloatVector) ByteVector.fromArray(B, src, in + 34).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d0).intoArray(dst, o + 32);
            ((FloatVector) ByteVector.fromArray(B, src, in + 50).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d0).intoArray(dst, o + 48);
            ((FloatVector) ByteVector.fromArray(B, src, in + 68).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d1).intoArray(dst, o + 64);
            ((FloatVector) ByteVector.fromArray(B, src, in + 84).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d1).intoArray(dst, o + 80);
            ((FloatVector) ByteVector.fromArray(B, src, in + 100).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d1).intoArray(dst, o + 96);
            ((FloatVector) ByteVector.fromArray(B, src, in + 116).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d1).intoArray(dst, o + 112);
        }
    }

    private static void decode64(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks) {
        for (int k = 0; k < count; k++) {
            int off = offs[k];
            int o = k * stride;
            for (int b = 0; b < blocks; b++) {
                int in = off + b * 66;
                float d = Float.float16ToFloat(half(src, in));
                for (int i = 0; i < 64; i += L) {
                    ((FloatVector) ByteVector.fromArray(B, src, in + 2 + i).convertShape(VectorOperators.B2F, F, 0))
                            .mul(d).intoArray(dst, o + b * 64 + i);
                }
            }
        }
    }
}
