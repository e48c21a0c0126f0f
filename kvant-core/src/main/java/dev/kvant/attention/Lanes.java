package dev.kvant.attention;

import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorShape;
import jdk.incubator.vector.VectorShuffle;
import jdk.incubator.vector.VectorSpecies;

/**
 * The vector shapes of the attention kernels and their one horizontal reduction.
 *
 * <p>L float lanes (the preferred width, clamped to 8..16 so that a q4_0 half-block and a byte species fit), and
 * int, short and byte species of the same lane count so that codes, halves and bytes convert lane for lane.
 *
 * <p>Every sum across lanes goes through a fixed pairwise tree (lanes L/2 apart first, then L/4, ...). The
 * Vector API leaves the order of {@code reduceLanes(ADD)} unspecified, and the interpreter and C2 do differ, so a
 * kernel using it could give different bits before and after compilation, which would break the rule that the
 * same input gives the same bits at any thread count.
 *
 * <p>No method of the attention kernels takes or returns a vector: C2 compiles a small helper on its own first,
 * then refuses to inline the (large, boxing) result ("already compiled into a medium method"), and every call boxes
 * its vectors. Measured: the score kernel ran 10x slower with a vector-valued tree helper. Helpers here pass vectors
 * through arrays, which costs an L1 store and load and nothing else when they are not inlined.
 */
final class Lanes {
    static final VectorSpecies<Float> F = FloatVector.SPECIES_PREFERRED.length() >= 8
            && FloatVector.SPECIES_PREFERRED.length() <= 16 ? FloatVector.SPECIES_PREFERRED : FloatVector.SPECIES_256;
    static final int L = F.length();
    static final VectorSpecies<Integer> I = VectorSpecies.of(int.class, F.vectorShape());
    static final VectorSpecies<Short> S = VectorSpecies.of(short.class, VectorShape.forBitSize(L * 16));
    static final VectorSpecies<Byte> B = VectorSpecies.of(byte.class, VectorShape.forBitSize(L * 8));

    static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;
    static final ValueLayout.OfShort LE_SHORT = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(LE);
    private static final VarHandle LE_SHORT_VIEW = MethodHandles.byteArrayViewVarHandle(short[].class, LE);

    /** log2(L): the number of tree stages. */
    static final int STAGES = Integer.numberOfTrailingZeros(L);

    /**
     * Index vectors of the tree's stages for {@link #combine}: stage k (0-based) takes vectors whose lanes form
     * groups of {@code L >> k} partial sums of one accumulator each and adds the lower and upper half of every
     * group, packing the groups of a into the lower L/2 lanes and those of b into the upper L/2.
     */
    private static final int[][] LOW = new int[STAGES][L];
    private static final int[][] HIGH = new int[STAGES][L];
    private static final VectorShuffle<Float>[] SWAP = swaps();

    static {
        for (int k = 0; k < STAGES; k++) {
            int group = L >> k;
            int half = group / 2;
            for (int j = 0; j < L; j++) {
                int base = j < L / 2 ? 0 : L;
                int jj = j % (L / 2);
                int g = jj / half;
                int o = jj % half;
                LOW[k][j] = base + g * group + o;
                HIGH[k][j] = base + g * group + half + o;
            }
        }
    }

    static {
        if (java.nio.ByteOrder.nativeOrder() != LE) {
            // Halves are read from staged bytes by reinterpreting byte vectors, which follows the platform order.
            throw new ExceptionInInitializerError("kvant's attention kernels need a little-endian platform");
        }
    }

    private Lanes() {
    }

    /** The little-endian 16 bits at b[i], as stored for fp16 scales and norms: one 16-bit load. */
    static short half(byte[] b, int i) {
        return (short) LE_SHORT_VIEW.get(b, i);
    }

    @SuppressWarnings("unchecked")
    private static VectorShuffle<Float>[] swaps() {
        VectorShuffle<Float>[] s = new VectorShuffle[STAGES];
        for (int k = 0; k < STAGES; k++) {
            int d = L >> (k + 1);
            s[k] = VectorShuffle.fromOp(F, i -> i ^ d);
        }
        return s;
    }

    /** Index vector (as ints) of the lower halves for {@link #combine}'s stage. */
    static int[] low(int stage) {
        return LOW[stage];
    }

    static int[] high(int stage) {
        return HIGH[stage];
    }

    /** The sum of the L floats at x[off] by the fixed tree: lane i + lane i+L/2 first, down to one lane. */
    static float sumLanes(float[] x, int off) {
        FloatVector v = FloatVector.fromArray(F, x, off);
        for (int k = 0; k < STAGES; k++) {
            v = v.add(v.rearrange(SWAP[k]));
        }
        return v.lane(0);
    }

    /**
     * One stage of the tree over two vectors at once, vectors a, b and the result being L-float slots of buf: the
     * result's lower half holds a's groups, each half as long, its upper half b's. Starting from accumulators (one
     * group of L), {@code STAGES} rounds of pairing turn L accumulators into one vector whose lane j is accumulator
     * j's sum, each lane summed in exactly the order of {@link #sumLanes}.
     */
    static void combine(float[] buf, int a, int b, int out, int stage) {
        IntVector ai = FloatVector.fromArray(F, buf, a * L).reinterpretAsInts();
        IntVector bi = FloatVector.fromArray(F, buf, b * L).reinterpretAsInts();
        IntVector lo = IntVector.fromArray(I, LOW[stage], 0).selectFrom(ai, bi);
        IntVector hi = IntVector.fromArray(I, HIGH[stage], 0).selectFrom(ai, bi);
        lo.reinterpretAsFloats().add(hi.reinterpretAsFloats()).intoArray(buf, out * L);
    }
}
