package dev.kvant.tensor;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorShuffle;

/**
 * The 12-byte block of Q4_K and Q5_K that packs eight 6-bit sub-block scales and eight 6-bit mins, and the search
 * that chooses them when quantizing.
 *
 * <p>Packing (bytes b0..b11): for j < 4, scale j = b[j] & 63 and min j = b[j+4] & 63; for j >= 4 the low four bits
 * of scale j are b[j+4] & 15 and of min j are b[j+4] >> 4, their top two bits are the top two bits of b[j-4]
 * (scale) and b[j] (min).
 */
final class KQuantScales {
    static final int BYTES = 12;
    private static final ValueLayout.OfLong LONG_LE =
            ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfInt INT_LE = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfShort SHORT_LE =
            ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    private KQuantScales() {
    }

    /** Bytes 0..7 of the packed scales at {@code at}. */
    static long low(MemorySegment s, long at) {
        return s.get(LONG_LE, at);
    }

    /** Bytes 8..11 of the packed scales at {@code at}. */
    static int high(MemorySegment s, long at) {
        return s.get(INT_LE, at + 8);
    }

    /** Scale of sub-block j, from the two words {@link #low} and {@link #high} read. */
    static int scale(long low, int high, int j) {
        if (j < 4) {
            return (int) (low >>> (8 * j)) & 63;
        }
        int b = (high >>> (8 * (j - 4))) & 0xff;
        int top = (int) (low >>> (8 * (j - 4))) & 0xff;
        return (b & 0x0f) | (top >>> 6) << 4;
    }

    /** Min of sub-block j. */
    static int min(long low, int high, int j) {
        if (j < 4) {
            return (int) (low >>> (8 * (j + 4))) & 63;
        }
        int b = (high >>> (8 * (j - 4))) & 0xff;
        int top = (int) (low >>> (8 * j)) & 0xff;
        return (b >>> 4) | (top >>> 6) << 4;
    }

    /** Where {@link #decode4} puts sub-block j's scale factor within a row's 16 floats. */
    static int scaleAt(int j) {
        return j + (j & 4);
    }

    /** Where {@link #decode4} puts sub-block j's negated min term within a row's 16 floats. */
    static int minAt(int j) {
        return j + 4 + (j & 4);
    }

    /**
     * Decodes the scales of four rows' super-blocks (row r's block at address {@code block + r * rowBytes}, fp16 d
     * and dmin at offsets 0 and 2 and the packed scales at 4) into {@code dst[o + 16r ..]}: at {@link #scaleAt}(j)
     * the factor {@code d * scale_j}, at {@link #minAt}(j) the term {@code -(dmin * min_j)}, the two factors of
     * a sub-block's {@code fma(q, d*sc, -(dmin*m))}.
     *
     * <p>With 16 float lanes this takes a dozen vector operations per row: the packed bytes, read as four
     * little-endian ints [b0-3, b4-7, b8-11, -], become [scales 0-3, mins 0-3, scales 4-7, mins 4-7] by the
     * packing rule applied to four bytes at a time, then widen to 16 floats. Scalar decoding (two shifts and
     * masks per value) cost as much as the dot product itself.
     */
    static void decode4(long block, long rowBytes, float[] dst, int o) {
        for (int r = 0; r < 4; r++) {
            decode(block + r * rowBytes, dst, o + 16 * r);
        }
    }

    /** One row's part of {@link #decode4}: the super-block at {@code p} into {@code dst[o .. o+16)}. */
    static void decode(long p, float[] dst, int o) {
        if (Lanes.L != 16) {
            decodeScalar(RawMemory.ALL, p, dst, o);
            return;
        }
        MemorySegment w = RawMemory.ALL;
        float d = Float.float16ToFloat(w.get(SHORT_LE, p));
        float dmin = Float.float16ToFloat(w.get(SHORT_LE, p + 2));
        IntVector b = ByteVector.fromMemorySegment(ByteVector.SPECIES_128, w, p + 4, ByteOrder.LITTLE_ENDIAN)
                .reinterpretAsInts();
        // Low bits of each value: [b0-3 & 63, b4-7 & 63, b8-11 & 15, (b8-11 >> 4) & 15].
        IntVector low = b.rearrange(LOW_SOURCE).lanewise(VectorOperators.LSHR, LOW_SHIFT).and(LOW_MASK);
        // Top two bits of values 4-7: from the top of b0-3 (scales) and b4-7 (mins), moved to bits 4-5.
        IntVector top = b.rearrange(TOP_SOURCE).lanewise(VectorOperators.LSHR, 2).and(TOP_MASK);
        IntVector packed = low.or(top);
        FloatVector values = (FloatVector) ((IntVector) packed.reinterpretAsBytes()
                .convertShape(VectorOperators.ZERO_EXTEND_B2I, IntVector.SPECIES_512, 0))
                .convert(VectorOperators.I2F, 0);
        values.mul(FloatVector.broadcast(FloatVector.SPECIES_512, d).blend(-dmin, MIN_LANES))
                .intoArray(dst, o);
    }

    private static final VectorShuffle<Integer> LOW_SOURCE =
            VectorShuffle.fromValues(IntVector.SPECIES_128, 0, 1, 2, 2);
    private static final IntVector LOW_SHIFT = IntVector.fromArray(IntVector.SPECIES_128, new int[]{0, 0, 0, 4}, 0);
    private static final IntVector LOW_MASK = IntVector.fromArray(IntVector.SPECIES_128,
            new int[]{0x3f3f3f3f, 0x3f3f3f3f, 0x0f0f0f0f, 0x0f0f0f0f}, 0);
    private static final VectorShuffle<Integer> TOP_SOURCE =
            VectorShuffle.fromValues(IntVector.SPECIES_128, 0, 1, 0, 1);
    private static final IntVector TOP_MASK = IntVector.fromArray(IntVector.SPECIES_128,
            new int[]{0, 0, 0x30303030, 0x30303030}, 0);
    private static final VectorMask<Float> MIN_LANES =
            VectorMask.fromLong(FloatVector.SPECIES_512, 0xf0f0L);

    /** {@link #decode4}'s result for one row, without vectors: the reference it is tested against. */
    static void decodeScalar(MemorySegment w, long p, float[] dst, int o) {
        float d = Float.float16ToFloat(w.get(SHORT_LE, p));
        float dmin = Float.float16ToFloat(w.get(SHORT_LE, p + 2));
        long lo = low(w, p + 4);
        int hi = high(w, p + 4);
        for (int j = 0; j < 8; j++) {
            dst[o + scaleAt(j)] = d * scale(lo, hi, j);
            dst[o + minAt(j)] = -(dmin * min(lo, hi, j));
        }
    }

    static void pack(int[] scales, int[] mins, MemorySegment dst, long at) {
        byte[] b = new byte[BYTES];
        for (int j = 0; j < 8; j++) {
            int sc = scales[j];
            int m = mins[j];
            if (sc < 0 || sc > 63 || m < 0 || m > 63) {
                throw new IllegalArgumentException("6-bit scale/min out of range: " + sc + ", " + m);
            }
            if (j < 4) {
                b[j] |= (byte) sc;
                b[j + 4] |= (byte) m;
            } else {
                b[j + 4] = (byte) ((sc & 0x0f) | (m & 0x0f) << 4);
                b[j - 4] |= (byte) ((sc >>> 4) << 6);
                b[j] |= (byte) ((m >>> 4) << 6);
            }
        }
        MemorySegment.copy(b, 0, dst, ValueLayout.JAVA_BYTE, at, BYTES);
    }

    /**
     * Quantizes one super-block of 256 values into 8 sub-blocks of 32 as {@code d*sc*q - dmin*m}, q in 0..nmax:
     * fits each sub-block's (scale, min), quantizes those to 6 bits against the largest, then re-picks every q for
     * the scales as stored. Writes d, dmin and the packed scales at {@code at} (4 + 12 bytes) and returns the q.
     */
    static int[] quantizeSuperBlock(float[] x, int off, int nmax, MemorySegment dst, long at) {
        float[] scale = new float[8];
        float[] min = new float[8];
        int[] q = new int[256];
        float[] weights = new float[32];
        float[] minOut = new float[1];
        float maxScale = 0;
        float maxMin = 0;
        for (int j = 0; j < 8; j++) {
            double sumSquares = 0;
            for (int i = 0; i < 32; i++) {
                sumSquares += (double) x[off + 32 * j + i] * x[off + 32 * j + i];
            }
            float rms = (float) Math.sqrt(sumSquares / 32);
            // Large values matter more to a dot product, but small ones are not free: weight |x| plus the RMS.
            for (int i = 0; i < 32; i++) {
                weights[i] = rms + Math.abs(x[off + 32 * j + i]);
            }
            scale[j] = fitAffine(x, off + 32 * j, weights, nmax, minOut);
            min[j] = minOut[0];
            maxScale = Math.max(maxScale, scale[j]);
            maxMin = Math.max(maxMin, min[j]);
        }
        float invScale = maxScale > 0 ? 63 / maxScale : 0;
        float invMin = maxMin > 0 ? 63 / maxMin : 0;
        int[] sc = new int[8];
        int[] m = new int[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = Math.min(63, Blocks.nearestInt(invScale * scale[j]));
            m[j] = Math.min(63, Blocks.nearestInt(invMin * min[j]));
        }
        short dBits = Float.floatToFloat16(maxScale / 63);
        short dminBits = Float.floatToFloat16(maxMin / 63);
        float d = Float.float16ToFloat(dBits);
        float dmin = Float.float16ToFloat(dminBits);
        for (int j = 0; j < 8; j++) {
            float ds = d * sc[j];
            float dm = dmin * m[j];
            for (int i = 0; i < 32; i++) {
                int l = ds != 0 ? Blocks.nearestInt((x[off + 32 * j + i] + dm) / ds) : 0;
                q[32 * j + i] = Math.max(0, Math.min(nmax, l));
            }
        }
        dst.set(ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), at, dBits);
        dst.set(ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN), at + 2, dminBits);
        pack(sc, m, dst, at + 4);
        return q;
    }

    /**
     * Weighted least-squares fit of x[i] ≈ s * q[i] - m over 32 values, q in 0..nmax, m >= 0 (the format stores
     * mins unsigned, so a sub-block that is all positive gets m = 0). Tries grids a little finer and coarser than
     * the plain min-to-max one and keeps the fit of least weighted error. Returns s; m goes to {@code minOut[0]}.
     */
    private static float fitAffine(float[] x, int off, float[] w, int nmax, float[] minOut) {
        float lo = x[off];
        float hi = x[off];
        for (int i = 1; i < 32; i++) {
            lo = Math.min(lo, x[off + i]);
            hi = Math.max(hi, x[off + i]);
        }
        lo = Math.min(lo, 0);
        if (hi == lo) {
            minOut[0] = -lo;
            return 0;
        }
        double bestErr = Double.POSITIVE_INFINITY;
        double bestS = (hi - lo) / nmax;
        double bestB = lo;
        int[] l = new int[32];
        for (int step = -10; step <= 10; step++) {
            float iscale = (nmax + 0.1f * step) / (hi - lo);
            double sw = 0, sl = 0, sl2 = 0, sx = 0, slx = 0;
            for (int i = 0; i < 32; i++) {
                l[i] = Math.max(0, Math.min(nmax, Blocks.nearestInt(iscale * (x[off + i] - lo))));
                double wi = w[i];
                sw += wi;
                sl += wi * l[i];
                sl2 += wi * l[i] * l[i];
                sx += wi * x[off + i];
                slx += wi * l[i] * x[off + i];
            }
            double det = sw * sl2 - sl * sl;
            if (det <= 0) {
                continue;
            }
            double s = (sw * slx - sl * sx) / det;
            double b = (sl2 * sx - sl * slx) / det;
            if (b > 0) {
                b = 0;
                s = slx / sl2;
            }
            if (s <= 0) {
                continue;
            }
            double err = 0;
            for (int i = 0; i < 32; i++) {
                double e = s * l[i] + b - x[off + i];
                err += w[i] * e * e;
            }
            if (err < bestErr) {
                bestErr = err;
                bestS = s;
                bestB = b;
            }
        }
        minOut[0] = (float) -bestB;
        return (float) bestS;
    }
}
