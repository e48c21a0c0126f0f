package dev.kvant.kv;

import static dev.kvant.kv.KvLanes.B;
import static dev.kvant.kv.KvLanes.F;
import static dev.kvant.kv.KvLanes.I;
import static dev.kvant.kv.KvLanes.L;
import static dev.kvant.kv.KvLanes.LE;
import static dev.kvant.kv.KvLanes.LE_SHORT;

import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.Objects;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorOperators;

/**
 * GGUF's Q4_0 block, optionally after the {@link Rotation} (q4_0h). Per 32 values: fp16 {@code d = m / -8}, where
 * m is the value of largest magnitude with its sign (the positive one when a positive and a negative value tie),
 * then 16 bytes whose low nibbles hold elements 0..15 and high nibbles elements 16..31; a code is
 * {@code min(15, trunc(x/d + 8.5))} and decodes as {@code d·(code - 8)}. As in ggml's reference quantizer the
 * extreme value lands exactly on code 0 and the other end of the range gets 15 levels; unlike it, codes are
 * computed from the stored fp16 d rather than the unrounded one, so the decoder's grid is the encoder's.
 *
 * <p>q4_0h rotates each 128- (or 64-) block first, which spreads outlier channels over the block and so shrinks
 * the scale of every 32-block they would have dominated. Unrotated rows that are not a whole number of blocks
 * are zero-padded to one.
 */
public final class Q4Format implements KvFormat {
    public static final Q4Format Q4_0 = new Q4Format("q4_0", false);
    public static final Q4Format Q4_0H = new Q4Format("q4_0h", true);

    /** Values per block. */
    public static final int BLOCK = 32;
    /** Bytes per block: fp16 d + 16 bytes of nibbles. */
    public static final int BLOCK_BYTES = 18;

    private final String name;
    private final boolean rotated;

    private Q4Format(String name, boolean rotated) {
        this.name = name;
        this.rotated = rotated;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public double bitsPerValue() {
        return 8.0 * BLOCK_BYTES / BLOCK;
    }

    @Override
    public long rowBytes(int headDim) {
        return (long) blocks(headDim) * BLOCK_BYTES;
    }

    private int blocks(int headDim) {
        return (domainDim(headDim) + BLOCK - 1) / BLOCK;
    }

    @Override
    public boolean rotated() {
        return rotated;
    }

    @Override
    public void encodeRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff, long dstStride) {
        encode(src, srcOff, rows, headDim, false, dst, dstOff, dstStride);
    }

    @Override
    public void encodeDomainRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff,
                                 long dstStride) {
        encode(src, srcOff, rows, headDim, true, dst, dstOff, dstStride);
    }

    /** Rows of headDim floats, or of domainDim floats already rotated when {@code domain}. */
    private void encode(float[] src, int srcOff, int rows, int headDim, boolean domain, MemorySegment dst,
                        long dstOff, long dstStride) {
        int width = domain ? domainDim(headDim) : headDim;
        Objects.checkFromIndexSize(srcOff, rows * width, src.length);
        int blocks = blocks(headDim);
        boolean direct = (domain || !rotated) && width % BLOCK == 0;
        float[] scratch = direct ? null : KernelScratch.get().row(blocks * BLOCK);
        for (int r = 0; r < rows; r++) {
            int row = srcOff + r * width;
            long out = dstOff + r * dstStride;
            float[] x = src;
            int off = row;
            if (!direct) {
                System.arraycopy(src, row, scratch, 0, width);
                Arrays.fill(scratch, width, blocks * BLOCK, 0f);
                if (rotated && !domain) {
                    Rotation.forwardRow(scratch, 0, headDim);
                }
                x = scratch;
                off = 0;
            }
            for (int b = 0; b < blocks; b++) {
                encodeBlock(x, off + b * BLOCK, dst, out + (long) b * BLOCK_BYTES);
            }
        }
    }

    private static void encodeBlock(float[] x, int off, MemorySegment dst, long out) {
        FloatVector hiV = FloatVector.fromArray(F, x, off);
        FloatVector loV = hiV;
        for (int i = L; i < BLOCK; i += L) {
            FloatVector v = FloatVector.fromArray(F, x, off + i);
            hiV = hiV.max(v);
            loV = loV.min(v);
        }
        float hi = hiV.reduceLanes(VectorOperators.MAX);
        float lo = loV.reduceLanes(VectorOperators.MIN);
        short h = KvLanes.toHalf((-lo > hi ? lo : hi) / -8f);
        float d = KvLanes.fromHalf(h);
        float id = d != 0 ? 1f / d : 0f;
        dst.set(LE_SHORT, out, h);
        for (int j = 0; j < BLOCK / 2; j += L) {
            IntVector low = code(x, off + j, id);
            IntVector high = code(x, off + j + BLOCK / 2, id);
            ((ByteVector) low.or(high.lanewise(VectorOperators.LSHL, 4)).convertShape(VectorOperators.I2B, B, 0))
                    .intoMemorySegment(dst, out + 2 + j, LE);
        }
    }

    private static IntVector code(float[] x, int at, float id) {
        return ((IntVector) FloatVector.fromArray(F, x, at).mul(id).add(8.5f).convert(VectorOperators.F2I, 0))
                .max(0).min(15);
    }

    @Override
    public void decode(MemorySegment src, long srcOff, int headDim, float[] dst, int dstOff) {
        int n = domainDim(headDim);
        Objects.checkFromIndexSize(dstOff, n, dst.length);
        int full = n / BLOCK;
        for (int b = 0; b < full; b++) {
            decodeBlock(src, srcOff + (long) b * BLOCK_BYTES, dst, dstOff + b * BLOCK);
        }
        if (n % BLOCK != 0) {
            float[] tail = KernelScratch.get().row(BLOCK);
            decodeBlock(src, srcOff + (long) full * BLOCK_BYTES, tail, 0);
            System.arraycopy(tail, 0, dst, dstOff + full * BLOCK, n - full * BLOCK);
        }
    }

    private static void decodeBlock(MemorySegment src, long in, float[] dst, int off) {
        float d = KvLanes.fromHalf(src.get(LE_SHORT, in));
        for (int j = 0; j < BLOCK / 2; j += L) {
            IntVector b = ((IntVector) ByteVector.fromMemorySegment(B, src, in + 2 + j, LE)
                    .convertShape(VectorOperators.B2I, I, 0));
            IntVector low = b.and(15).sub(8);
            IntVector high = b.lanewise(VectorOperators.LSHR, 4).and(15).sub(8);
            ((FloatVector) low.convert(VectorOperators.I2F, 0)).mul(d).intoArray(dst, off + j);
            ((FloatVector) high.convert(VectorOperators.I2F, 0)).mul(d).intoArray(dst, off + j + BLOCK / 2);
        }
    }

    @Override
    public String toString() {
        return name;
    }
}
