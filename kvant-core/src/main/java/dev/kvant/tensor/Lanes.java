package dev.kvant.tensor;

import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorShape;
import jdk.incubator.vector.VectorShuffle;
import jdk.incubator.vector.VectorSpecies;

/**
 * The vector shapes every weight kernel uses, and the one lane reduction they all share.
 *
 * <p>The float species is the machine's preferred one (16 lanes on AVX-512). Byte and short species are sized to
 * the same lane count, so that one load of quantized bytes (or half floats) widens to exactly one float vector.
 * Only 16 and 8 lanes are supported (a 128-bit shape would leave no byte species of
 * matching lane count), so anything short of AVX-512 uses 256-bit floats, emulated where the hardware is
 * narrower: slow but correct.
 *
 * <p>Why a hand-written reduction: {@code reduceLanes(ADD)} on floats may sum in any order, and its order can
 * differ between the interpreter and compiled code. Every dot product in this package ends with the fixed
 * pairwise tree of {@link #sum} (or {@link #sum4}, the same tree four at a time), so a result depends only on
 * its inputs.
 */
final class Lanes {
    static final VectorSpecies<Float> F = FloatVector.SPECIES_PREFERRED.length() == 16
            ? FloatVector.SPECIES_512 : FloatVector.SPECIES_256;
    static final int L = F.length();
    static final VectorSpecies<Byte> B = VectorSpecies.of(byte.class, VectorShape.forBitSize(L * 8));
    static final VectorSpecies<Short> S = VectorSpecies.of(short.class, VectorShape.forBitSize(L * 16));
    static final VectorSpecies<Integer> I = VectorSpecies.of(int.class, F.vectorShape());

    /** Shuffles pairing lane j with lane j ^ s, for s = L/2, L/4, ..., 1. */
    private static final VectorShuffle<Float>[] TREE = tree();
    /** Lanes of the upper half, of the second and fourth quarters, of every second eighth and every second lane. */
    static final VectorMask<Float> UPPER_HALF = VectorMask.fromLong(F, ((1L << L) - 1) & -(1L << L / 2));
    static final VectorMask<Float> ODD_QUARTERS = VectorMask.fromLong(F, odd(L / 4));
    static final VectorMask<Float> ODD_EIGHTHS = VectorMask.fromLong(F, odd(L / 8));
    static final VectorMask<Float> ODD_LANES = VectorMask.fromLong(F, odd(1));
    static final VectorShuffle<Float> SWAP_HALVES = TREE[0];
    static final VectorShuffle<Float> SWAP_QUARTERS = TREE[1];
    static final VectorShuffle<Float> SWAP_EIGHTHS = TREE[2];
    /** Lane j with j ^ 1 when L = 16; unused (L = 8 ends at the eighths). */
    static final VectorShuffle<Float> SWAP_SIXTEENTHS = TREE[TREE.length - 1];

    /**
     * Lane j holds j (as a float) in TABLE_LOW, (j + L) mod 16 in TABLE_HIGH: {@code fma(TABLE_LOW, s, m)} and
     * {@code fma(TABLE_HIGH, s, m)} are a 16-entry table of {@code i*s + m} split over two vectors (at 16 lanes
     * both hold all 16 entries), for {@code index.selectFrom(low, high)}, which wraps an index modulo 2L: at 16
     * lanes a byte's low five bits pick entry (byte & 15) from either copy, at 8 lanes its low four bits pick
     * entry (byte & 15). So a nibble looks up its value in one permute, whatever the bits above it.
     */
    static final FloatVector TABLE_LOW = (FloatVector) IntVector.zero(VectorSpecies.of(int.class, F.vectorShape()))
            .addIndex(1).convert(VectorOperators.I2F, 0);
    static final FloatVector TABLE_HIGH = L == 16 ? TABLE_LOW
            : (FloatVector) IntVector.zero(VectorSpecies.of(int.class, F.vectorShape())).addIndex(1).add(L)
            .convert(VectorOperators.I2F, 0);

    private Lanes() {
    }

    @SuppressWarnings("unchecked")
    private static VectorShuffle<Float>[] tree() {
        int steps = Integer.numberOfTrailingZeros(L);
        VectorShuffle<Float>[] t = new VectorShuffle[steps];
        for (int i = 0; i < steps; i++) {
            int s = L >> (i + 1);
            t[i] = VectorShuffle.fromOp(F, j -> j ^ s);
        }
        return t;
    }

    /** The lanes of every second group of {@code group} lanes (the second, fourth, ...). */
    private static long odd(int group) {
        long bits = 0;
        for (int j = 0; j < L; j++) {
            if ((j / group) % 2 == 1) {
                bits |= 1L << j;
            }
        }
        return bits;
    }

    /** {@code count < L} values of {@code x} from {@code from}, zero-padded to one chunk. */
    static float[] padded(float[] x, int from, int count) {
        float[] p = new float[L];
        System.arraycopy(x, from, p, 0, count);
        return p;
    }

    /** The lanes of an accumulator summed as {@link #sum(float[], int)} sums them (a one-row kernel's result). */
    static float sum(FloatVector acc) {
        float[] t = new float[L];
        acc.intoArray(t, 0);
        return sum(t, 0);
    }

    /**
     * The lanes of {@code t[off .. off+L)} summed as a pairwise tree: first lane j with lane j + L/2, then with
     * j + L/4, and so on down to lanes 0 and 1. Kernels store their accumulator (one {@code intoArray}) and call
     * this, or {@link #sum4}; both give the same bits for the same lanes.
     */
    static float sum(float[] t, int off) {
        float[] a = new float[L];
        System.arraycopy(t, off, a, 0, L);
        for (int width = L / 2; width >= 1; width /= 2) {
            for (int j = 0; j < width; j++) {
                a[j] = a[j] + a[j + width];
            }
        }
        return a[0];
    }

    /**
     * The tree of {@link #sum} for the four accumulators stored at {@code t[off], t[off+L], t[off+2L],
     * t[off+3L]}, on vectors: the first two tree levels of two accumulators share one vector (each keeps its
     * half, then its quarter, of the lanes), the last levels run on all four together. Every add pairs the same
     * two partial sums as in {@link #sum}, and a + b is b + a in floating point, so the bits agree. Results go to
     * {@code out[o]}, {@code out[o + stride]}, {@code out[o + 2*stride]}, {@code out[o + 3*stride]}.
     *
     * <p>Why accumulators travel through an array: kernels pass no vectors to methods of their own, since a
     * call the JIT declines to inline (it stops inlining non-library code past a node budget that vector kernels
     * reach) would box every vector argument.
     */
    static void sum4(float[] t, int off, float[] out, int o, int stride) {
        FloatVector a = FloatVector.fromArray(F, t, off);
        FloatVector b = FloatVector.fromArray(F, t, off + L);
        FloatVector c = FloatVector.fromArray(F, t, off + 2 * L);
        FloatVector d = FloatVector.fromArray(F, t, off + 3 * L);
        // Level 1: lanes j (lower half) and j + L/2. ab = [a's pair sums | b's pair sums].
        FloatVector ab = a.blend(b, UPPER_HALF).add(b.blend(a, UPPER_HALF).rearrange(SWAP_HALVES));
        FloatVector cd = c.blend(d, UPPER_HALF).add(d.blend(c, UPPER_HALF).rearrange(SWAP_HALVES));
        // Level 2: within each half, lanes j and j + L/4. v = [a | c | b | d], a quarter each.
        FloatVector v = ab.blend(cd, ODD_QUARTERS).add(cd.blend(ab, ODD_QUARTERS).rearrange(SWAP_QUARTERS));
        v = v.add(v.rearrange(SWAP_EIGHTHS));
        if (L == 16) {
            v = v.add(v.rearrange(SWAP_SIXTEENTHS));
        }
        int q = L / 4;
        out[o] = v.lane(0);
        out[o + stride] = v.lane(2 * q);
        out[o + 2 * stride] = v.lane(q);
        out[o + 3 * stride] = v.lane(3 * q);
    }
}
