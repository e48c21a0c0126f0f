package dev.kvant.attention;

import static dev.kvant.attention.Lanes.B;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.half;

import dev.kvant.kv.Q4Format;

import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorOperators;

/**
 * q4_0 and q4_0h rows: per 32 values an fp16 d and 16 bytes of nibbles (low nibble element j, high nibble element
 * j + 16), value d·(code - 8). One byte vector yields both halves of a block. q4_0h rows are in the rotated domain;
 * the decoder does not care.
 */
final class Q4Rows implements RowDecoder {
    private static final int BLOCK = Q4Format.BLOCK;
    private static final int HALF = BLOCK / 2;

    private final int dim;

    Q4Rows(int dim) {
        this.dim = dim;
    }

    @Override
    public int dim() {
        return dim;
    }

    @Override
    public void decode(byte[] src, int[] offs, int count, float[] dst, int stride) {
        int full = dim / BLOCK;
        blocks(src, offs, count, dst, stride, full);
        if (full * BLOCK < dim) {
            for (int k = 0; k < count; k++) {
                int in = offs[k] + full * Q4Format.BLOCK_BYTES;
                float d = Float.float16ToFloat(half(src, in));
                for (int i = full * BLOCK; i < dim; i++) {
                    int e = i - full * BLOCK;
                    int byt = src[in + 2 + e % HALF] & 0xFF;
                    int code = e < HALF ? byt & 15 : byt >>> 4;
                    dst[k * stride + i] = (code - 8) * d;
                }
            }
        }
    }

    private static void blocks(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks) {
        for (int k = 0; k < count; k++) {
            int off = offs[k];
            int o = k * stride;
            for (int b = 0; b < blocks; b++) {
                int in = off + b * 18;
                float d = Float.float16ToFloat(half(src, in));
                int at = o + b * 32;
                for (int j = 0; j < 16; j += L) {
                    IntVector v = (IntVector) ByteVector.fromArray(B, src, in + 2 + j)
                            .convertShape(VectorOperators.B2I, I, 0);
                    ((FloatVector) v.and(15).sub(8).convert(VectorOperators.I2F, 0)).mul(d).intoArray(dst, at + j);
                    ((FloatVector) v.lanewise(VectorOperators.LSHR, 4).and(15).sub(8).convert(VectorOperators.I2F, 0))
                            .mul(d).intoArray(dst, at + j + 16);
                }
            }
        }
    }
}
