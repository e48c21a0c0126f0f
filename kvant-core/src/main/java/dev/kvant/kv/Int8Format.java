package dev.kvant.kv;

import static dev.kvant.kv.KvLanes.B;
import static dev.kvant.kv.KvLanes.F;
import static dev.kvant.kv.KvLanes.L;
import static dev.kvant.kv.KvLanes.LE;
import static dev.kvant.kv.KvLanes.LE_SHORT;

import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.Objects;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorOperators;

/**
 * Symmetric 8-bit blocks: per block of B values an fp16 scale {@code d = amax/127} and B signed bytes
 * {@code q = rint(x / d)}, decoded as {@code d·q}. q8_0 is GGUF's Q8_0 block (B = 32, 34 bytes); int8 has one
 * scale per 64 values (66 bytes, 8.25 bits per value).
 *
 * <p>The codes are computed with the stored (fp16-rounded) scale, so the error of every value is at most half a
 * step of the scale the decoder uses. A row whose length is not a whole number of blocks is zero-padded to one.
 */
public final class Int8Format implements KvFormat {
    public static final Int8Format Q8_0 = new Int8Format("q8_0", 32);
    public static final Int8Format INT8 = new Int8Format("int8", 64);

    /** Adding and subtracting 1.5·2^23 rounds a float of magnitude below 2^22 to the nearest integer, ties to even. */
    static final float RINT_MAGIC = 12582912f;

    private final String name;
    private final int block;

    private Int8Format(String name, int block) {
        this.name = name;
        this.block = block;
    }

    @Override
    public String name() {
        return name;
    }

    /** Values per block (32 for q8_0, 64 for int8). */
    public int blockSize() {
        return block;
    }

    /** Bytes per block: fp16 scale + one byte per value. */
    public int blockBytes() {
        return 2 + block;
    }

    @Override
    public double bitsPerValue() {
        return 8.0 * blockBytes() / block;
    }

    @Override
    public long rowBytes(int headDim) {
        return (long) blocks(headDim) * blockBytes();
    }

    private int blocks(int headDim) {
        return (domainDim(headDim) + block - 1) / block;
    }

    @Override
    public boolean rotated() {
        return false;
    }

    @Override
    public void encodeRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff, long dstStride) {
        Objects.checkFromIndexSize(srcOff, rows * headDim, src.length);
        int full = headDim / block;
        float[] tail = headDim % block == 0 ? null : KernelScratch.get().row(block);
        for (int r = 0; r < rows; r++) {
            int row = srcOff + r * headDim;
            long out = dstOff + r * dstStride;
            for (int b = 0; b < full; b++) {
                encodeBlock(src, row + b * block, dst, out + (long) b * blockBytes());
            }
            if (tail != null) {
                Arrays.fill(tail, 0, block, 0f);
                System.arraycopy(src, row + full * block, tail, 0, headDim - full * block);
                encodeBlock(tail, 0, dst, out + (long) full * blockBytes());
            }
        }
    }

    private void encodeBlock(float[] x, int off, MemorySegment dst, long out) {
        FloatVector amaxV = FloatVector.zero(F);
        for (int i = 0; i < block; i += L) {
            amaxV = amaxV.max(FloatVector.fromArray(F, x, off + i).abs());
        }
        short h = KvLanes.toHalf(amaxV.reduceLanes(VectorOperators.MAX) / 127f);
        float d = KvLanes.fromHalf(h);
        float id = d != 0 ? 1f / d : 0f;
        dst.set(LE_SHORT, out, h);
        for (int i = 0; i < block; i += L) {
            FloatVector q = FloatVector.fromArray(F, x, off + i).mul(id).add(RINT_MAGIC).sub(RINT_MAGIC)
                    .max(-127f).min(127f);
            ((ByteVector) q.convertShape(VectorOperators.F2B, B, 0)).intoMemorySegment(dst, out + 2 + i, LE);
        }
    }

    @Override
    public void decode(MemorySegment src, long srcOff, int headDim, float[] dst, int dstOff) {
        Objects.checkFromIndexSize(dstOff, headDim, dst.length);
        int full = headDim / block;
        for (int b = 0; b < full; b++) {
            decodeBlock(src, srcOff + (long) b * blockBytes(), dst, dstOff + b * block);
        }
        if (headDim % block != 0) {
            float[] tail = KernelScratch.get().row(block);
            decodeBlock(src, srcOff + (long) full * blockBytes(), tail, 0);
            System.arraycopy(tail, 0, dst, dstOff + full * block, headDim - full * block);
        }
    }

    private void decodeBlock(MemorySegment src, long in, float[] dst, int off) {
        float d = KvLanes.fromHalf(src.get(LE_SHORT, in));
        for (int i = 0; i < block; i += L) {
            ((FloatVector) ByteVector.fromMemorySegment(B, src, in + 2 + i, LE).convertShape(VectorOperators.B2F, F, 0))
                    .mul(d).intoArray(dst, off + i);
        }
    }

    @Override
    public String toString() {
        return name;
    }
}
