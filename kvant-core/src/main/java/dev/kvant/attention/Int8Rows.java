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
        if (block == 32) {
            decode32(src, offs, count, dst, stride, full);
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
