package dev.kvant.attention;

import static dev.kvant.attention.Lanes.B;
import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.LE;
import static dev.kvant.attention.Lanes.LE_SHORT;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
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
    public void decode(MemorySegment src, long[] offs, int count, float[] dst, int stride) {
        int blockBytes = block + 2;
        int full = dim / block;
        for (int k = 0; k < count; k++) {
            long off = offs[k];
            int o = k * stride;
            for (int b = 0; b < full; b++) {
                long in = off + (long) b * blockBytes;
                float d = Float.float16ToFloat(src.get(LE_SHORT, in));
                for (int i = 0; i < block; i += L) {
                    ((FloatVector) ByteVector.fromMemorySegment(B, src, in + 2 + i, LE)
                            .convertShape(VectorOperators.B2F, F, 0)).mul(d).intoArray(dst, o + b * block + i);
                }
            }
            if (full * block < dim) {
                long in = off + (long) full * blockBytes;
                float d = Float.float16ToFloat(src.get(LE_SHORT, in));
                for (int i = full * block; i < dim; i++) {
                    dst[o + i] = src.get(ValueLayout.JAVA_BYTE, in + 2 + i - full * block) * d;
                }
            }
        }
    }
}
