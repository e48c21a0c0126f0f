package dev.kvant.attention;

import static dev.kvant.attention.Lanes.B;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;
import static dev.kvant.attention.Lanes.LE;
import static dev.kvant.attention.Lanes.LE_SHORT;

import dev.kvant.kv.Rotation;
import dev.kvant.kv.TurboFormat;

import java.lang.foreign.MemorySegment;
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
    private final boolean twoTables;
    /** For a plane of P < L bytes: lane i reads byte i mod P, at bit offset (i / P) fields further. */
    private final VectorShuffle<Integer> repeat;
    private final int[] laneField;

    TurboRows(TurboFormat format, int headDim) {
        this.bits = format.bits();
        this.n = Rotation.blockSize(headDim);
        this.dim = Rotation.paddedDim(headDim);
        this.blockBytes = format.blockBytes(n);
        float[] c = format.codebook(headDim).centroidsAsFloat();
        this.twoTables = c.length > L;
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
    public void decode(MemorySegment src, long[] offs, int count, float[] dst, int stride) {
        for (int k = 0; k < count; k++) {
            for (int b = 0; b < dim; b += n) {
                long in = offs[k] + (long) (b / n) * blockBytes;
                float g = Float.float16ToFloat(src.get(LE_SHORT, in));
                int o = k * stride + b;
                switch (bits) {
                    case 4 -> block4(src, in + 2, g, dst, o);
                    case 3 -> block3(src, in + 2, g, dst, o);
                    default -> block2(src, in + 2, g, dst, o);
                }
            }
        }
    }

    // The lookups are written out in each method: a helper taking vectors would box them (see Lanes).

    private void block4(MemorySegment src, long at, float g, float[] dst, int o) {
        IntVector t0 = IntVector.fromArray(I, table, 0);
        IntVector t1 = IntVector.fromArray(I, table, L);
        int p = n / 2;
        for (int j = 0; j < p; j += L) {
            IntVector v = ((IntVector) ByteVector.fromMemorySegment(B, src, at + j, LE)
                    .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
            IntVector lo = v.and(15);
            IntVector hi = v.lanewise(VectorOperators.LSHR, 4);
            (twoTables ? lo.selectFrom(t0, t1) : lo.selectFrom(t0)).reinterpretAsFloats().mul(g).intoArray(dst, o + j);
            (twoTables ? hi.selectFrom(t0, t1) : hi.selectFrom(t0)).reinterpretAsFloats().mul(g)
                    .intoArray(dst, o + j + p);
        }
    }

    private void block2(MemorySegment src, long at, float g, float[] dst, int o) {
        IntVector t = IntVector.fromArray(I, table, 0);
        int p = n / 4;
        for (int j = 0; j < p; j += L) {
            IntVector v = ((IntVector) ByteVector.fromMemorySegment(B, src, at + j, LE)
                    .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
            v.and(3).selectFrom(t).reinterpretAsFloats().mul(g).intoArray(dst, o + j);
            v.lanewise(VectorOperators.LSHR, 2).and(3).selectFrom(t).reinterpretAsFloats().mul(g)
                    .intoArray(dst, o + j + p);
            v.lanewise(VectorOperators.LSHR, 4).and(3).selectFrom(t).reinterpretAsFloats().mul(g)
                    .intoArray(dst, o + j + 2 * p);
            v.lanewise(VectorOperators.LSHR, 6).selectFrom(t).reinterpretAsFloats().mul(g)
                    .intoArray(dst, o + j + 3 * p);
        }
    }

    /** Low two bits from a plane of n/4 bytes, the high bit from the plane of n/8 bytes after it. */
    private void block3(MemorySegment src, long at, float g, float[] dst, int o) {
        IntVector t = IntVector.fromArray(I, table, 0);
        int p2 = n / 4;
        int p1 = n / 8;
        long hiAt = at + p2;
        if (p1 >= L) {
            for (int j = 0; j < p2; j += L) {
                IntVector lo = ((IntVector) ByteVector.fromMemorySegment(B, src, at + j, LE)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                IntVector hi = ((IntVector) ByteVector.fromMemorySegment(B, src, hiAt + j % p1, LE)
                        .convertShape(VectorOperators.B2I, I, 0)).lanewise(VectorOperators.LSHL, 2);
                int f = j / p1;
                for (int q = 0; q < 4; q++) {
                    lo.lanewise(VectorOperators.LSHR, 2 * q).and(3)
                            .or(hi.lanewise(VectorOperators.LSHR, f + 2 * q).and(4))
                            .selectFrom(t).reinterpretAsFloats().mul(g).intoArray(dst, o + j + q * p2);
                }
            }
        } else {
            VectorMask<Byte> m = B.indexInRange(0, p1);
            IntVector hiAll = ((IntVector) ByteVector.fromMemorySegment(B, src, hiAt, LE, m)
                    .convertShape(VectorOperators.B2I, I, 0)).and(0xFF).rearrange(repeat)
                    .lanewise(VectorOperators.LSHL, 2);
            IntVector field = IntVector.fromArray(I, laneField, 0);
            for (int j = 0; j < p2; j += L) {
                IntVector lo = ((IntVector) ByteVector.fromMemorySegment(B, src, at + j, LE)
                        .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                for (int q = 0; q < 4; q++) {
                    int e0 = j + q * p2;
                    lo.lanewise(VectorOperators.LSHR, 2 * q).and(3)
                            .or(hiAll.lanewise(VectorOperators.LSHR, field.add(e0 / p1)).and(4))
                            .selectFrom(t).reinterpretAsFloats().mul(g).intoArray(dst, o + e0);
                }
            }
        }
    }
}
