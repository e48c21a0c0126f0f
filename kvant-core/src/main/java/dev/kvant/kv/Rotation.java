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
 * vector width: stages closer than a vector are done in-register with a lane shuffle and a ±1 multiply-add, the
 * others between whole vectors held in registers (the loop over memory they replace measured 2.7x slower).
 */
public final class Rotation {
    /** Seed of the sign vectors: the ASCII bytes of "kvant". Changing it changes kv-format v1. */
    public static final long SEED = 0x6B76616E74L;

    private static final Rotation R64 = new Rotation(64);
    private static final Rotation R128 = new Rotation(128);

    /**
     * In-register butterflies at lane distance h = 1, 2, 4 (and 8 when L = 16): lane i takes
     * {@code v[i]·SIGN_h[i] + v[i^h]}, with SIGN_h = -1 where bit h of i is set, which is a + b for the lower lane
     * and a - b for the upper, exactly the scalar butterfly. Written out rather than looped over arrays of shuffles:
     * the looped form measured 1.8x slower (C2 keeps the unrolled shuffles and signs in registers).
     */
    private static final float[] SIGNS = new float[4 * L];
    /** A post scale of 1 (exact), for the inner networks of a 16-vector block. */
    private static final float[] ONES = new float[8 * L];

    static {
        Arrays.fill(ONES, 1f);
        for (int k = 0; k < 4; k++) {
            for (int i = 0; i < L; i++) {
                SIGNS[k * L + i] = (i & (1 << k)) != 0 ? -1f : 1f;
            }
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
        FloatVector s1 = FloatVector.fromArray(F, SIGNS, 0);
        FloatVector s2 = FloatVector.fromArray(F, SIGNS, L);
        FloatVector s4 = FloatVector.fromArray(F, SIGNS, 2 * L);
        FloatVector s8 = FloatVector.fromArray(F, SIGNS, 3 * L);
        for (int i = 0; i < n; i += L) {
            FloatVector v = FloatVector.fromArray(F, x, off + i).mul(FloatVector.fromArray(F, pre, i));
            v = v.fma(s1, v.rearrange(KvLanes.X1));
            v = v.fma(s2, v.rearrange(KvLanes.X2));
            v = v.fma(s4, v.rearrange(KvLanes.X4));
            if (L > 8) {
                v = v.fma(s8, v.rearrange(KvLanes.X8));
            }
            v.intoArray(x, off + i);
        }
        switch (n / L) {
            case 4 -> crossStages4(x, off, postScaled, 0);
            case 8 -> crossStages8(x, off, postScaled, 0);
            case 16 -> {
                crossStages8(x, off, ONES, 0);
                crossStages8(x, off + 8 * L, ONES, 0);
                for (int i = 0; i < 8 * L; i += L) {
                    FloatVector a = FloatVector.fromArray(F, x, off + i);
                    FloatVector b = FloatVector.fromArray(F, x, off + i + 8 * L);
                    a.add(b).mul(FloatVector.fromArray(F, postScaled, i)).intoArray(x, off + i);
                    a.sub(b).mul(FloatVector.fromArray(F, postScaled, i + 8 * L)).intoArray(x, off + i + 8 * L);
                }
            }
            default -> throw new IllegalStateException("no butterfly network for " + n + " values in " + L + " lanes");
        }
    }

    /**
     * The butterflies between 4 vectors (lane distances L and 2L) in registers, then the post scale.
     * Pairs and operand order are those of the scalar transform: (0,1),(2,3), then (0,2),(1,3).
     */
    private static void crossStages4(float[] x, int off, float[] post, int postOff) {
        FloatVector v0 = FloatVector.fromArray(F, x, off);
        FloatVector v1 = FloatVector.fromArray(F, x, off + L);
        FloatVector v2 = FloatVector.fromArray(F, x, off + 2 * L);
        FloatVector v3 = FloatVector.fromArray(F, x, off + 3 * L);
        FloatVector a0 = v0.add(v1);
        FloatVector a1 = v0.sub(v1);
        FloatVector a2 = v2.add(v3);
        FloatVector a3 = v2.sub(v3);
        a0.add(a2).mul(FloatVector.fromArray(F, post, postOff)).intoArray(x, off);
        a1.add(a3).mul(FloatVector.fromArray(F, post, postOff + L)).intoArray(x, off + L);
        a0.sub(a2).mul(FloatVector.fromArray(F, post, postOff + 2 * L)).intoArray(x, off + 2 * L);
        a1.sub(a3).mul(FloatVector.fromArray(F, post, postOff + 3 * L)).intoArray(x, off + 3 * L);
    }

    /**
     * The butterflies between 8 vectors (lane distances L, 2L, 4L) in registers, then the post scale. No helper
     * takes a vector argument: where C2 declines to inline one, the vector is boxed on every call.
     */
    private static void crossStages8(float[] x, int off, float[] post, int postOff) {
        FloatVector v0 = FloatVector.fromArray(F, x, off);
        FloatVector v1 = FloatVector.fromArray(F, x, off + L);
        FloatVector v2 = FloatVector.fromArray(F, x, off + 2 * L);
        FloatVector v3 = FloatVector.fromArray(F, x, off + 3 * L);
        FloatVector v4 = FloatVector.fromArray(F, x, off + 4 * L);
        FloatVector v5 = FloatVector.fromArray(F, x, off + 5 * L);
        FloatVector v6 = FloatVector.fromArray(F, x, off + 6 * L);
        FloatVector v7 = FloatVector.fromArray(F, x, off + 7 * L);
        FloatVector a0 = v0.add(v1);
        FloatVector a1 = v0.sub(v1);
        FloatVector a2 = v2.add(v3);
        FloatVector a3 = v2.sub(v3);
        FloatVector a4 = v4.add(v5);
        FloatVector a5 = v4.sub(v5);
        FloatVector a6 = v6.add(v7);
        FloatVector a7 = v6.sub(v7);
        FloatVector b0 = a0.add(a2);
        FloatVector b1 = a1.add(a3);
        FloatVector b2 = a0.sub(a2);
        FloatVector b3 = a1.sub(a3);
        FloatVector b4 = a4.add(a6);
        FloatVector b5 = a5.add(a7);
        FloatVector b6 = a4.sub(a6);
        FloatVector b7 = a5.sub(a7);
        b0.add(b4).mul(FloatVector.fromArray(F, post, postOff)).intoArray(x, off);
        b1.add(b5).mul(FloatVector.fromArray(F, post, postOff + L)).intoArray(x, off + L);
        b2.add(b6).mul(FloatVector.fromArray(F, post, postOff + 2 * L)).intoArray(x, off + 2 * L);
        b3.add(b7).mul(FloatVector.fromArray(F, post, postOff + 3 * L)).intoArray(x, off + 3 * L);
        b0.sub(b4).mul(FloatVector.fromArray(F, post, postOff + 4 * L)).intoArray(x, off + 4 * L);
        b1.sub(b5).mul(FloatVector.fromArray(F, post, postOff + 5 * L)).intoArray(x, off + 5 * L);
        b2.sub(b6).mul(FloatVector.fromArray(F, post, postOff + 6 * L)).intoArray(x, off + 6 * L);
        b3.sub(b7).mul(FloatVector.fromArray(F, post, postOff + 7 * L)).intoArray(x, off + 7 * L);
    }

    /** SplitMix64 (Steele, Lea, Flood 2014): advances the state by the golden gamma and mixes it. */
    static long splitMix64(long[] state) {
        long z = (state[0] += 0x9E3779B97F4A7C15L);
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
        return z ^ (z >>> 31);
    }
}
