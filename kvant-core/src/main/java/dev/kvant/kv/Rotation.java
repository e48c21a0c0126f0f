package dev.kvant.kv;

import static dev.kvant.kv.KvLanes.F;
import static dev.kvant.kv.KvLanes.L;

import java.util.Arrays;
import jdk.incubator.vector.FloatVector;

/**
 * The randomized Walsh-Hadamard rotation of the rotated KV formats: {@code y = D2 · (H/√n) · D1 · x} on each
 * block of n = 64 or 128 values, with H the Sylvester Hadamard matrix and D1, D2 fixed ±1 diagonals. Its inverse
 * is the same transform with D1 and D2 swapped, {@code x = D1 · (H/√n) · D2 · y}, because H is symmetric and
 * H·H = n·I.
 *
 * <p>The signs come from SplitMix64 seeded with {@link #SEED}: for a block of n, draws 0..n-1 give D1 and draws
 * n..2n-1 give D2, a draw's top bit set meaning -1. Every rotated format (q4_0h, turbo*) uses this one rotation
 * per block size, so a query rotated once serves any rotated K format of that head size.
 *
 * <p>A head row is cut into blocks by {@link #paddedDim}/{@link #blockSize}: rows whose length is not a multiple
 * of 64 are zero-padded to the next multiple of 64, and the padded row is cut into 128-blocks when its length
 * allows, else 64-blocks.
 *
 * <p>The vector kernel performs exactly the float operations of the textbook in-place radix-2 transform (stage
 * distance 1, 2, 4, ..., each butterfly {@code (a, b) -> (a + b, a - b)}), so its result does not depend on the
 * vector width: stages closer than a vector are done in-register with a lane shuffle and a ±1 multiply-add.
 */
public final class Rotation {
    /** Seed of the sign vectors: the ASCII bytes of "kvant". Changing it changes kv-format v1. */
    public static final long SEED = 0x6B76616E74L;

    private static final Rotation R64 = new Rotation(64);
    private static final Rotation R128 = new Rotation(128);

    /** {@code SIGN[h]} is -1 in lanes whose bit h is set: the butterfly's sign for the partner lane i^h. */
    private static final FloatVector[] SIGN = new FloatVector[L];

    static {
        for (int h = 1; h < L; h <<= 1) {
            float[] s = new float[L];
            for (int i = 0; i < L; i++) {
                s[i] = (i & h) != 0 ? -1f : 1f;
            }
            SIGN[h] = FloatVector.fromArray(F, s, 0);
        }
    }

    private final int n;
    private final float[] d1;
    private final float[] d2;
    private final float[] d1Scaled;
    private final float[] d2Scaled;

    private Rotation(int n) {
        this.n = n;
        d1 = new float[n];
        d2 = new float[n];
        long[] state = {SEED};
        for (int i = 0; i < n; i++) {
            d1[i] = splitMix64(state) < 0 ? -1f : 1f;
        }
        for (int i = 0; i < n; i++) {
            d2[i] = splitMix64(state) < 0 ? -1f : 1f;
        }
        float scale = (float) (1.0 / Math.sqrt(n));
        d1Scaled = new float[n];
        d2Scaled = new float[n];
        for (int i = 0; i < n; i++) {
            d1Scaled[i] = d1[i] * scale;
            d2Scaled[i] = d2[i] * scale;
        }
    }

    /** The rotation of blocks of n values; n is 64 or 128. */
    public static Rotation ofBlock(int n) {
        return switch (n) {
            case 64 -> R64;
            case 128 -> R128;
            default -> throw new IllegalArgumentException("rotation blocks are 64 or 128 values, not " + n);
        };
    }

    /** The rotation that {@link #paddedDim} cuts a head of this size into. */
    public static Rotation forHeadDim(int headDim) {
        return ofBlock(blockSize(headDim));
    }

    /** A head row's length in the rotated domain: headDim rounded up to a multiple of 64. */
    public static int paddedDim(int headDim) {
        if (headDim <= 0) {
            throw new IllegalArgumentException("head size must be positive, got " + headDim);
        }
        return (headDim + 63) & ~63;
    }

    /** 128 when the padded row is a whole number of 128-blocks, else 64. */
    public static int blockSize(int headDim) {
        return paddedDim(headDim) % 128 == 0 ? 128 : 64;
    }

    public int size() {
        return n;
    }

    /** Sign i of D1 (before H) or D2 (after H), as ±1. */
    public float sign(int which, int i) {
        return switch (which) {
            case 1 -> d1[i];
            case 2 -> d2[i];
            default -> throw new IllegalArgumentException("sign vectors are D1 and D2, not D" + which);
        };
    }

    /** Rotates one block of n values in place. */
    public void forward(float[] x, int off) {
        transform(x, off, d1, d2Scaled);
    }

    /** Undoes {@link #forward} on one block in place. */
    public void inverse(float[] x, int off) {
        transform(x, off, d2, d1Scaled);
    }

    /**
     * Rotates a head row in place: {@code x[off, off+headDim)} is the row, {@code x[off+headDim, off+paddedDim)}
     * is overwritten with the zero padding before every block is rotated.
     */
    public static void forwardRow(float[] x, int off, int headDim) {
        int padded = paddedDim(headDim);
        Arrays.fill(x, off + headDim, off + padded, 0f);
        Rotation r = forHeadDim(headDim);
        for (int b = 0; b < padded; b += r.n) {
            r.forward(x, off + b);
        }
    }

    /** Undoes {@link #forwardRow} on the {@code paddedDim(headDim)} values at off. */
    public static void inverseRow(float[] x, int off, int headDim) {
        int padded = paddedDim(headDim);
        Rotation r = forHeadDim(headDim);
        for (int b = 0; b < padded; b += r.n) {
            r.inverse(x, off + b);
        }
    }

    private void transform(float[] x, int off, float[] pre, float[] postScaled) {
        for (int i = 0; i < n; i += L) {
            FloatVector v = FloatVector.fromArray(F, x, off + i).mul(FloatVector.fromArray(F, pre, i));
            for (int h = 1; h < L; h <<= 1) {
                // lane with bit h clear: v[i] + v[i^h]; set: v[i^h] - v[i]; both exactly the scalar butterfly.
                v = v.fma(SIGN[h], v.rearrange(KvLanes.xor(h)));
            }
            v.intoArray(x, off + i);
        }
        for (int h = L; h < n; h <<= 1) {
            for (int i = 0; i < n; i += 2 * h) {
                for (int j = i; j < i + h; j += L) {
                    FloatVector a = FloatVector.fromArray(F, x, off + j);
                    FloatVector b = FloatVector.fromArray(F, x, off + j + h);
                    a.add(b).intoArray(x, off + j);
                    a.sub(b).intoArray(x, off + j + h);
                }
            }
        }
        for (int i = 0; i < n; i += L) {
            FloatVector.fromArray(F, x, off + i).mul(FloatVector.fromArray(F, postScaled, i)).intoArray(x, off + i);
        }
    }

    /** SplitMix64 (Steele, Lea, Flood 2014): advances the state by the golden gamma and mixes it. */
    static long splitMix64(long[] state) {
        long z = (state[0] += 0x9E3779B97F4A7C15L);
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }
}
