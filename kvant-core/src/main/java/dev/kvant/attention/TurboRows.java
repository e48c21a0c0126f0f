package dev.kvant.attention;

import static dev.kvant.attention.Lanes.B;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.half;

import dev.kvant.kv.Rotation;
import dev.kvant.kv.TurboFormat;

import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorShuffle;

/**
 * turbo4/3/2 rows: per block of n = 128 (or 64) values an fp16 norm g and split-plane codes; value
 * g·centroid[code], in the rotated domain.
 *
 * <p>The codebook lives in one or two vector registers and codes are looked up with a lane permute
 * ({@code selectFrom}): 16 lookups per instruction. A per-query table of q[d]·centroid[c] (the GPU formulation)
 * would need a per-lane gather on the CPU, one element per cycle, so the table here holds the centroids and the
 * product with the query is the tile kernel's fma, which costs the same as an add.
 *
 * <p>The planes are laid out so that L consecutive elements sit in the same field of L consecutive bytes: a chunk
 * of codes is one byte load, a shift and a mask per plane. The one plane narrower than L (turbo3's high-bit plane
 * of 8 bytes in a 64-block, with 16 lanes) is loaded masked, repeated across the lanes and shifted lane by lane.
 */
final class TurboRows implements RowDecoder {
    private final int bits;
    private final int n;
    private final int dim;
    private final int blockBytes;
    private final int[] table;
    /** For a plane of P < L bytes: lane i reads byte i mod P, at bit offset (i / P) fields further. */
    private final VectorShuffle<Integer> repeat;
    private final int[] laneField;

    TurboRows(TurboFormat format, int headDim) {
        this.bits = format.bits();
        this.n = Rotation.blockSize(headDim);
        this.dim = Rotation.paddedDim(headDim);
        this.blockBytes = format.blockBytes(n);
        float[] c = format.codebook(headDim).centroidsAsFloat();
        this.table = new int[2 * L];
        for (int i = 0; i < c.length; i++) {
            table[i] = Float.floatToRawIntBits(c[i]);
        }
        int p1 = n / 8;
        this.repeat = VectorShuffle.fromOp(I, i -> i % Math.min(p1, L));
        this.laneField = new int[L];
        for (int i = 0; i < L; i++) {
            laneField[i] = i / Math.min(p1, L);
        }
    }

    @Override
    public int dim() {
        return dim;
    }

    @Override
    public void decode(byte[] src, int[] offs, int count, float[] dst, int stride) {
        int blocks = dim / n;
        // Loops with constant sizes for the usual 128-blocks: with sizes in variables they ran 1.5-2x slower.
        if (n == 128 && L == 16) {
            switch (bits) {
                case 4 -> rows4(src, offs, count, dst, stride, blocks, table, 128, 66);
                case 3 -> rows3x128(src, offs, count, dst, stride, blocks, table);
                default -> rows2x128(src, offs, count, dst, stride, blocks, table);
            }
        } else {
            switch (bits) {
                case 4 -> rows4(src, offs, count, dst, stride, blocks, table, n, blockBytes);
                case 3 -> rows3Narrow(src, offs, count, dst, stride, blocks);
                default -> rows2(src, offs, count, dst, stride, blocks, table, n, blockBytes);
            }
        }
    }

    // The lookups are written out in each method: a helper taking vectors would box them (see Lanes).

    private static void rows4(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks, int[] table,
                              int n, int blockBytes) {
        IntVector t0 = IntVector.fromArray(I, table, 0);
        IntVector t1 = IntVector.fromArray(I, table, L);
        boolean two = L < 16;
        int p = n / 2;
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < blocks; b++) {
                int at = offs[k] + b * blockBytes;
                float g = Float.float16ToFloat(half(src, at));
                // the centroids times the block's norm: each lane's product as the per-value multiply gives it
                IntVector g0 = t0.reinterpretAsFloats().mul(g).reinterpretAsInts();
                IntVector g1 = two ? t1.reinterpretAsFloats().mul(g).reinterpretAsInts() : g0;   // 8 lanes: 16 entries
                int o = k * stride + b * n;
                for (int j = 0; j < p; j += L) {
                    IntVector v = ((IntVector) ByteVector.fromArray(B, src, at + 2 + j)
                            .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                    IntVector lo = v.and(15);
                    IntVector hi = v.lanewise(VectorOperators.LSHR, 4);
                    (two ? lo.selectFrom(g0, g1) : lo.selectFrom(g0)).reinterpretAsFloats()
                            .intoArray(dst, o + j);
                    (two ? hi.selectFrom(g0, g1) : hi.selectFrom(g0)).reinterpretAsFloats()
                            .intoArray(dst, o + j + p);
                }
            }
        }
    }

    private static void rows2(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks, int[] table,
                              int n, int blockBytes) {
        IntVector t = IntVector.fromArray(I, table, 0);
        int p = n / 4;
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < blocks; b++) {
                int at = offs[k] + b * blockBytes;
                float g = Float.float16ToFloat(half(src, at));
                IntVector tg = t.reinterpretAsFloats().mul(g).reinterpretAsInts();   // centroids times the norm
                int o = k * stride + b * n;
                for (int j = 0; j < p; j += L) {
                    IntVector v = ((IntVector) ByteVector.fromArray(B, src, at + 2 + j)
                            .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                    v.and(3).selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + j);
                    v.lanewise(VectorOperators.LSHR, 2).and(3).selectFrom(tg).reinterpretAsFloats()
                            .intoArray(dst, o + j + p);
                    v.lanewise(VectorOperators.LSHR, 4).and(3).selectFrom(tg).reinterpretAsFloats()
                            .intoArray(dst, o + j + 2 * p);
                    v.lanewise(VectorOperators.LSHR, 6).selectFrom(tg).reinterpretAsFloats()
                            .intoArray(dst, o + j + 3 * p);
                }
            }
        }
    }

    /**
     * turbo3, 128-blocks, 16 lanes, written out: the 8 chunks of a block come from two 16-byte loads of the low plane
     * and one of the high plane. With the plane sizes as variables C2 kept a division per chunk.
     */
    private static void rows3x128(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks,
                                  int[] table) {
        IntVector t = IntVector.fromArray(I, table, 0);
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < blocks; b++) {
                int at = offs[k] + b * 50;
                float g = Float.float16ToFloat(half(src, at));
                IntVector tg = t.reinterpretAsFloats().mul(g).reinterpretAsInts();   // centroids times the norm
                int o = k * stride + b * 128;
                IntVector lo0 = ((IntVector) ByteVector.fromArray(B, src, at + 2)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                IntVector lo1 = ((IntVector) ByteVector.fromArray(B, src, at + 18)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                // high bits moved to bit 2, the code's third bit: element e's is bit e / 16 of byte e % 16
                IntVector hi = ((IntVector) ByteVector.fromArray(B, src, at + 34)
                        .convertShape(VectorOperators.B2I, I, 0)).lanewise(VectorOperators.LSHL, 2);
                lo0.and(3).or(hi.and(4)).selectFrom(tg).reinterpretAsFloats().intoArray(dst, o);
                lo1.and(3).or(hi.lanewise(VectorOperators.LSHR, 1).and(4)).selectFrom(tg).reinterpretAsFloats()
                        .intoArray(dst, o + 16);
                lo0.lanewise(VectorOperators.LSHR, 2).and(3).or(hi.lanewise(VectorOperators.LSHR, 2).and(4))
                        .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 32);
                lo1.lanewise(VectorOperators.LSHR, 2).and(3).or(hi.lanewise(VectorOperators.LSHR, 3).and(4))
                        .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 48);
                lo0.lanewise(VectorOperators.LSHR, 4).and(3).or(hi.lanewise(VectorOperators.LSHR, 4).and(4))
                        .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 64);
                lo1.lanewise(VectorOperators.LSHR, 4).and(3).or(hi.lanewise(VectorOperators.LSHR, 5).and(4))
                        .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 80);
                lo0.lanewise(VectorOperators.LSHR, 6).or(hi.lanewise(VectorOperators.LSHR, 6).and(4))
                        .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 96);
                lo1.lanewise(VectorOperators.LSHR, 6).or(hi.lanewise(VectorOperators.LSHR, 7).and(4))
                        .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 112);
            }
        }
    }

    /** turbo2, 128-blocks, 16 lanes, written out: two 16-byte loads give the 8 chunks of a block. */
    private static void rows2x128(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks,
                                  int[] table) {
        IntVector t = IntVector.fromArray(I, table, 0);
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < blocks; b++) {
                int at = offs[k] + b * 34;
                float g = Float.float16ToFloat(half(src, at));
                IntVector tg = t.reinterpretAsFloats().mul(g).reinterpretAsInts();   // centroids times the norm
                int o = k * stride + b * 128;
                IntVector v0 = ((IntVector) ByteVector.fromArray(B, src, at + 2)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                IntVector v1 = ((IntVector) ByteVector.fromArray(B, src, at + 18)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                v0.and(3).selectFrom(tg).reinterpretAsFloats().intoArray(dst, o);
                v1.and(3).selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 16);
                v0.lanewise(VectorOperators.LSHR, 2).and(3).selectFrom(tg).reinterpretAsFloats()
                        .intoArray(dst, o + 32);
                v1.lanewise(VectorOperators.LSHR, 2).and(3).selectFrom(tg).reinterpretAsFloats()
                        .intoArray(dst, o + 48);
                v0.lanewise(VectorOperators.LSHR, 4).and(3).selectFrom(tg).reinterpretAsFloats()
                        .intoArray(dst, o + 64);
                v1.lanewise(VectorOperators.LSHR, 4).and(3).selectFrom(tg).reinterpretAsFloats()
                        .intoArray(dst, o + 80);
                v0.lanewise(VectorOperators.LSHR, 6).selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 96);
                v1.lanewise(VectorOperators.LSHR, 6).selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + 112);
            }
        }
    }

    /** Low two bits from a plane of n/4 bytes, the high bit from the plane of n/8 (at least L) bytes after it. */
    private static void rows3(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks, int[] table,
                              int n, int blockBytes) {
        IntVector t = IntVector.fromArray(I, table, 0);
        int p2 = n / 4;
        int p1 = n / 8;
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < blocks; b++) {
                int at = offs[k] + b * blockBytes;
                float g = Float.float16ToFloat(half(src, at));
                IntVector tg = t.reinterpretAsFloats().mul(g).reinterpretAsInts();   // centroids times the norm
                int o = k * stride + b * n;
                for (int j = 0; j < p2; j += L) {
                    IntVector lo = ((IntVector) ByteVector.fromArray(B, src, at + 2 + j)
                            .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                    IntVector hi = ((IntVector) ByteVector.fromArray(B, src, at + 2 + p2 + j % p1)
                            .convertShape(VectorOperators.B2I, I, 0)).lanewise(VectorOperators.LSHL, 2);
                    int f = j / p1;
                    for (int q = 0; q < 4; q++) {
                        lo.lanewise(VectorOperators.LSHR, 2 * q).and(3)
                                .or(hi.lanewise(VectorOperators.LSHR, f + 2 * q).and(4))
                                .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + j + q * p2);
                    }
                }
            }
        }
    }

    /** turbo3 with a high-bit plane narrower than L (64-blocks at 16 lanes): read masked, repeated, lane-shifted. */
    private void rows3Narrow(byte[] src, int[] offs, int count, float[] dst, int stride, int blocks) {
        if (n / 8 >= L) {
            rows3(src, offs, count, dst, stride, blocks, table, n, blockBytes);
            return;
        }
        IntVector t = IntVector.fromArray(I, table, 0);
        int p2 = n / 4;
        int p1 = n / 8;
        VectorMask<Byte> m = B.indexInRange(0, p1);
        IntVector field = IntVector.fromArray(I, laneField, 0);
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < blocks; b++) {
                int at = offs[k] + b * blockBytes;
                float g = Float.float16ToFloat(half(src, at));
                IntVector tg = t.reinterpretAsFloats().mul(g).reinterpretAsInts();   // centroids times the norm
                int o = k * stride + b * n;
                IntVector hiAll = ((IntVector) ByteVector.fromArray(B, src, at + 2 + p2, m)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF).rearrange(repeat)
                        .lanewise(VectorOperators.LSHL, 2);
                for (int j = 0; j < p2; j += L) {
                    IntVector lo = ((IntVector) ByteVector.fromArray(B, src, at + 2 + j)
                            .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                    for (int q = 0; q < 4; q++) {
                        int e0 = j + q * p2;
                        lo.lanewise(VectorOperators.LSHR, 2 * q).and(3)
                                .or(hiAll.lanewise(VectorOperators.LSHR, field.add(e0 / p1)).and(4))
                                .selectFrom(tg).reinterpretAsFloats().intoArray(dst, o + e0);
                    }
                }
            }
        }
    }
}
