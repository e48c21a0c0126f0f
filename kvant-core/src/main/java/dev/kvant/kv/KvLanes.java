package dev.kvant.kv;

import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.ShortVector;
import jdk.incubator.vector.VectorShape;
import jdk.incubator.vector.VectorShuffle;
import jdk.incubator.vector.VectorSpecies;

/**
 * The vector shapes every KV kernel shares: L float lanes, and the int, short and byte species with the same
 * lane count so that codes, halves and bytes convert lane for lane.
 *
 * <p>L is the preferred float width, but at least 8 (a byte species needs 64 bits) and at most 16 (half a q4_0
 * block). On hardware narrower than 256 bits the 256-bit species runs in software.
 */
final class KvLanes {
    static final VectorSpecies<Float> F = FloatVector.SPECIES_PREFERRED.length() >= 8
            && FloatVector.SPECIES_PREFERRED.length() <= 16 ? FloatVector.SPECIES_PREFERRED : FloatVector.SPECIES_256;
    static final int L = F.length();
    static final VectorSpecies<Integer> I = IntVector.SPECIES_PREFERRED.withShape(F.vectorShape());
    static final VectorSpecies<Short> S = ShortVector.SPECIES_64.withShape(VectorShape.forBitSize(L * 16));
    static final VectorSpecies<Byte> B = ByteVector.SPECIES_64.withShape(VectorShape.forBitSize(L * 8));

    /** Multi-byte fields in every KV layout are little-endian, as in GGUF. */
    static final ValueLayout.OfShort LE_SHORT = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ByteOrder LE = ByteOrder.LITTLE_ENDIAN;

    /** Largest finite fp16; scales and norms are clamped to it rather than overflowing to infinity. */
    static final float HALF_MAX = 65504f;

    /** Lane exchanges i ↔ i^h for h = 1, 2, 4, 8 (the last only when L = 16). */
    static final VectorShuffle<Float> X1 = VectorShuffle.fromOp(F, i -> i ^ 1);
    static final VectorShuffle<Float> X2 = VectorShuffle.fromOp(F, i -> i ^ 2);
    static final VectorShuffle<Float> X4 = VectorShuffle.fromOp(F, i -> i ^ 4);
    static final VectorShuffle<Float> X8 = L > 8 ? VectorShuffle.fromOp(F, i -> i ^ 8) : X4;

    private KvLanes() {
    }

    /**
     * The sum of the lanes by a fixed pairwise tree (lanes L/2 apart first): every step is a lanewise IEEE add, so
     * the result is the same in the interpreter and in compiled code, unlike {@code reduceLanes(ADD)}, whose order
     * is unspecified.
     */
    static float sumLanes(FloatVector v) {
        if (L > 8) {
            v = v.add(v.rearrange(X8));
        }
        v = v.add(v.rearrange(X4));
        v = v.add(v.rearrange(X2));
        v = v.add(v.rearrange(X1));
        return v.lane(0);
    }

    /** A float scale rounded to the fp16 the layouts store, its magnitude clamped to {@link #HALF_MAX}. */
    static short toHalf(float x) {
        return Float.floatToFloat16(Math.copySign(Math.min(Math.abs(x), HALF_MAX), x));
    }

    static float fromHalf(short h) {
        return Float.float16ToFloat(h);
    }
}
