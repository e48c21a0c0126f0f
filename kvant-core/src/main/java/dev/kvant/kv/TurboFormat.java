package dev.kvant.kv;

import static dev.kvant.kv.KvLanes.F;
import static dev.kvant.kv.KvLanes.I;
import static dev.kvant.kv.KvLanes.L;
import static dev.kvant.kv.KvLanes.LE_SHORT;

import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.Objects;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorOperators;

/**
 * TurboQuant (Zandieh et al., arXiv 2504.19874) applied per block of n = 128 (or 64) values of a head row, in
 * the rotated domain of {@link Rotation}:
 * <ol>
 * <li>y = R·x; s = ‖y‖ (= ‖x‖, R being orthogonal);</li>
 * <li>code_i = the {@link Codebook#sphere} centroid nearest to a·y_i / s (the number of boundaries below it), for
 * the gain a of {@link #GAINS} whose codes point closest to y;</li>
 * <li>store g = s / ‖ĉ‖, where ĉ is the vector of chosen centroids, so the decoded block g·ĉ has length exactly s
 * (up to the fp16 rounding of g).</li>
 * </ol>
 * A block is the fp16 g followed by the codes in {@link PackedCodes} planes: {@code 2 + n·bits/8} bytes, so 66,
 * 50 and 34 bytes for a 128-block of turbo4, turbo3, turbo2. Decoding gives rotated-domain values g·c[code_i].
 *
 * <p>Renormalizing removes the bias of plain Lloyd-Max reconstruction, which shrinks every vector by about D/2
 * (D the codebook's unit-vector error) and with it every attention logit. It costs no accuracy: to first order
 * the squared error goes from D to 2 - 2√(1-D) ≈ D + D²/4, and on the sphere it measures 1-4% below that, below
 * D itself at 3 and 4 bits.
 */
public final class TurboFormat implements KvFormat {
    public static final TurboFormat TURBO4 = new TurboFormat(4);
    public static final TurboFormat TURBO3 = new TurboFormat(3);
    public static final TurboFormat TURBO2 = new TurboFormat(2);

    /**
     * Whether 16 codes need two vectors of table: decided once for the machine (L = 8), never per format, so the
     * kernels have no data-dependent choice between vector values.
     */
    private static final boolean TWO_TABLES = L < 16;

    private final int bits;
    private volatile Tables tables64;
    private volatile Tables tables128;

    /**
     * The gains the encoder tries (see {@link #encodeBlock}): 1 first, so a tie keeps the plain nearest-centroid
     * codes.
     */
    static final float[] GAINS = {1f, 0.95f, 1.05f, 0.9f, 1.1f, 0.85f, 1.15f, 0.8f, 1.2f};

    /**
     * A block size's codebook as the kernels use it: centroids and, per gain a of {@link #GAINS}, the decision
     * boundaries divided by a (u·a > b ⇔ u > b/a, rounded once to float), as raw float bits padded to whole
     * vectors for in-register table lookups ({@code selectFrom}, one table of L lanes or two).
     */
    private record Tables(int n, Codebook codebook, int[][] boundaryBits, int[] centroidBits) {
        static Tables of(int bits, int n) {
            Codebook cb = Codebook.sphere(bits, n);
            float[] c = cb.centroidsAsFloat();
            int size = TWO_TABLES ? 2 * L : L;
            int[] centroidBits = new int[size];
            for (int i = 0; i < c.length; i++) {
                centroidBits[i] = Float.floatToRawIntBits(c[i]);
            }
            int[][] boundaryBits = new int[GAINS.length][size];
            for (int k = 0; k < GAINS.length; k++) {
                Arrays.fill(boundaryBits[k], Float.floatToRawIntBits(Float.POSITIVE_INFINITY));
                float[] b = gainBoundaries(cb, GAINS[k]);
                for (int i = 0; i < b.length; i++) {
                    boundaryBits[k][i] = Float.floatToRawIntBits(b[i]);
                }
            }
            return new Tables(n, cb, boundaryBits, centroidBits);
        }
    }

    /** The gains the encoder tries, in its order (a copy). */
    public static float[] gains() {
        return GAINS.clone();
    }

    /** The decision boundaries of a codebook for the scaled value u·gain: b_i / gain, rounded once to float. */
    public static float[] gainBoundaries(Codebook codebook, float gain) {
        float[] b = codebook.boundaries().clone();
        for (int i = 0; i < b.length; i++) {
            b[i] = b[i] / gain;
        }
        return b;
    }

    private TurboFormat(int bits) {
        this.bits = bits;
    }

    @Override
    public String name() {
        return "turbo" + bits;
    }

    /** Bits per code. */
    public int bits() {
        return bits;
    }

    @Override
    public double bitsPerValue() {
        return 8.0 * blockBytes(128) / 128;
    }

    /** Bytes of one block of n values: fp16 corrected norm + n·bits/8 bytes of codes. */
    public int blockBytes(int n) {
        return 2 + n * bits / 8;
    }

    @Override
    public long rowBytes(int headDim) {
        int n = Rotation.blockSize(headDim);
        return (long) (Rotation.paddedDim(headDim) / n) * blockBytes(n);
    }

    @Override
    public boolean rotated() {
        return true;
    }

    /** The codebook of the blocks a head of this size is cut into. */
    public Codebook codebook(int headDim) {
        return tables(Rotation.blockSize(headDim)).codebook;
    }

    private Tables tables(int n) {
        Tables t = n == 128 ? tables128 : tables64;
        if (t == null) {
            t = Tables.of(bits, n);
            if (n == 128) {
                tables128 = t;
            } else {
                tables64 = t;
            }
        }
        return t;
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

    /** Rows of headDim floats, or of the rotated domain's paddedDim floats when {@code domain}. */
    private void encode(float[] src, int srcOff, int rows, int headDim, boolean domain, MemorySegment dst,
                        long dstOff, long dstStride) {
        int padded = Rotation.paddedDim(headDim);
        int width = domain ? padded : headDim;
        Objects.checkFromIndexSize(srcOff, rows * width, src.length);
        Tables t = tables(Rotation.blockSize(headDim));
        int n = t.n;
        KernelScratch scratch = KernelScratch.get();
        float[] y = scratch.row(padded);
        int[] codes = scratch.codes(n);
        int[] trial = scratch.trialCodes(n);
        for (int r = 0; r < rows; r++) {
            System.arraycopy(src, srcOff + r * width, y, 0, width);
            if (!domain) {
                Rotation.forwardRow(y, 0, headDim);
            }
            long out = dstOff + r * dstStride;
            for (int b = 0; b < padded; b += n) {
                encodeBlock(t, y, b, codes, trial, dst, out + (long) (b / n) * blockBytes(n));
            }
        }
    }

    /**
     * Quantizes the rotated block y[off, off+n) of norm s. The corrected norm makes the block's length exact, so
     * only its direction carries error, and the scale at which the unit block u = y/s meets the codebook is free:
     * for each gain a of {@link #GAINS} the codes are the nearest centroids of a·u (a branchless binary search
     * over the boundaries / a: bits steps of table lookup, compare and masked add, counting the boundaries
     * strictly below the value as a linear scan would), and the block keeps the codes ĉ of the largest cosine
     * y·ĉ / ‖ĉ‖ (the first on a tie, so gain 1 unless another is strictly better); then g = s / ‖ĉ‖. Trying the
     * nine gains lowers the error of Gaussian blocks by about 5% at 3 bits and 13% at 4 (docs/KV_FORMATS.md).
     * Sums run through {@link KvLanes#sumLanes}, so the bytes do not depend on JIT state.
     */
    private void encodeBlock(Tables t, float[] y, int off, int[] codes, int[] trial, MemorySegment dst, long out) {
        int n = t.n;
        FloatVector sq = FloatVector.zero(F);
        for (int i = 0; i < n; i += L) {
            FloatVector v = FloatVector.fromArray(F, y, off + i);
            sq = v.fma(v, sq);
        }
        float s = (float) Math.sqrt(KvLanes.sumLanes(sq));
        float inv = s > 0 ? 1f / s : 0f;
        IntVector c0 = IntVector.fromArray(I, t.centroidBits, 0);
        IntVector c1 = TWO_TABLES ? IntVector.fromArray(I, t.centroidBits, L) : c0;
        float best = Float.NEGATIVE_INFINITY;
        float bestCc = 0f;
        for (int k = 0; k < GAINS.length; k++) {
            IntVector b0 = IntVector.fromArray(I, t.boundaryBits[k], 0);
            IntVector b1 = TWO_TABLES ? IntVector.fromArray(I, t.boundaryBits[k], L) : b0;
            FloatVector cc = FloatVector.zero(F);
            FloatVector dot = FloatVector.zero(F);
            for (int i = 0; i < n; i += L) {
                FloatVector yv = FloatVector.fromArray(F, y, off + i);
                FloatVector u = yv.mul(inv);
                IntVector code = IntVector.zero(I);
                for (int step = 1 << (bits - 1); step > 0; step >>= 1) {
                    FloatVector bound = lookup(code.add(step - 1), b0, b1);
                    code = code.add(step, u.compare(VectorOperators.GT, bound).cast(I));
                }
                code.intoArray(trial, i);
                FloatVector c = lookup(code, c0, c1);
                cc = c.fma(c, cc);
                dot = c.fma(yv, dot);
            }
            float ccSum = KvLanes.sumLanes(cc);
            float cosine = KvLanes.sumLanes(dot) / (float) Math.sqrt(ccSum);
            if (k == 0 || cosine > best) {
                best = cosine;
                bestCc = ccSum;
                System.arraycopy(trial, 0, codes, 0, n);
            }
        }
        float g = s / (float) Math.sqrt(bestCc);
        dst.set(LE_SHORT, out, KvLanes.toHalf(g));
        pack(codes, n, dst, out + 2);
    }

    private static FloatVector lookup(IntVector codes, IntVector t0, IntVector t1) {
        return (TWO_TABLES ? codes.selectFrom(t0, t1) : codes.selectFrom(t0)).reinterpretAsFloats();
    }

    private void pack(int[] codes, int n, MemorySegment dst, long at) {
        switch (bits) {
            case 4 -> PackedCodes.pack(codes, 0, 4, n / 2, dst, at);
            case 2 -> PackedCodes.pack(codes, 0, 2, n / 4, dst, at);
            case 3 -> {
                PackedCodes.pack(codes, 0, 2, n / 4, dst, at);
                PackedCodes.pack(codes, 2, 1, n / 8, dst, at + n / 4);
            }
            default -> throw new IllegalStateException("turbo formats have 2, 3 or 4 bits, not " + bits);
        }
    }

    private void unpack(MemorySegment src, long at, int n, int[] codes) {
        switch (bits) {
            case 4 -> PackedCodes.unpack(src, at, 0, 4, n / 2, codes, true);
            case 2 -> PackedCodes.unpack(src, at, 0, 2, n / 4, codes, true);
            case 3 -> {
                PackedCodes.unpack(src, at, 0, 2, n / 4, codes, true);
                PackedCodes.unpack(src, at + n / 4, 2, 1, n / 8, codes, false);
            }
            default -> throw new IllegalStateException("turbo formats have 2, 3 or 4 bits, not " + bits);
        }
    }

    @Override
    public void decode(MemorySegment src, long srcOff, int headDim, float[] dst, int dstOff) {
        int padded = Rotation.paddedDim(headDim);
        Objects.checkFromIndexSize(dstOff, padded, dst.length);
        Tables t = tables(Rotation.blockSize(headDim));
        int n = t.n;
        int[] codes = KernelScratch.get().codes(n);
        IntVector c0 = IntVector.fromArray(I, t.centroidBits, 0);
        IntVector c1 = TWO_TABLES ? IntVector.fromArray(I, t.centroidBits, L) : c0;
        for (int b = 0; b < padded; b += n) {
            long in = srcOff + (long) (b / n) * blockBytes(n);
            float g = KvLanes.fromHalf(src.get(LE_SHORT, in));
            unpack(src, in + 2, n, codes);
            for (int i = 0; i < n; i += L) {
                lookup(IntVector.fromArray(I, codes, i), c0, c1).mul(g).intoArray(dst, dstOff + b + i);
            }
        }
    }

    @Override
    public String toString() {
        return name();
    }
}
