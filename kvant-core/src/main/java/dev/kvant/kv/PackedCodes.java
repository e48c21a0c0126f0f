package dev.kvant.kv;

import static dev.kvant.kv.KvLanes.B;
import static dev.kvant.kv.KvLanes.I;
import static dev.kvant.kv.KvLanes.L;
import static dev.kvant.kv.KvLanes.LE;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import jdk.incubator.vector.ByteVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorOperators;

/**
 * The one packing scheme of all sub-byte KV codes, a "split plane": a plane of P bytes holds F = 8/w fields of w
 * bits per byte, and field q of byte j holds (a w-bit slice of) code {@code j + q·P}. So the codes of elements
 * j..j+P-1 sit in the same bit position of P consecutive bytes, and a vector of consecutive bytes decodes to a
 * vector of consecutive elements with one shift and one mask, without lane shuffles.
 *
 * <p>4-bit codes are one plane (w=4, P=n/2); 2-bit codes one plane (w=2, P=n/4); 3-bit codes a plane of their low
 * two bits (w=2, P=n/4) followed by a plane of their high bit (w=1, P=n/8).
 */
final class PackedCodes {
    private PackedCodes() {
    }

    /**
     * Writes the plane of the {@code (codes[k] >> shift) & (2^width - 1)} slices of codes[0 .. 8/width·planeBytes)
     * to dst at off.
     */
    static void pack(int[] codes, int shift, int width, int planeBytes, MemorySegment dst, long off) {
        int fields = 8 / width;
        int mask = (1 << width) - 1;
        if (planeBytes % L == 0) {
            for (int j = 0; j < planeBytes; j += L) {
                IntVector acc = IntVector.zero(I);
                for (int q = 0; q < fields; q++) {
                    IntVector c = IntVector.fromArray(I, codes, j + q * planeBytes);
                    acc = acc.or(c.lanewise(VectorOperators.LSHR, shift).and(mask).lanewise(VectorOperators.LSHL, q * width));
                }
                ((ByteVector) acc.convertShape(VectorOperators.I2B, B, 0)).intoMemorySegment(dst, off + j, LE);
            }
        } else {
            for (int j = 0; j < planeBytes; j++) {
                int b = 0;
                for (int q = 0; q < fields; q++) {
                    b |= ((codes[j + q * planeBytes] >> shift) & mask) << (q * width);
                }
                dst.set(ValueLayout.JAVA_BYTE, off + j, (byte) b);
            }
        }
    }

    /**
     * Reads a plane written by {@link #pack}: each slice, shifted left by shift, is stored into codes
     * (overwrite) or ORed into what is there (a plane of higher bits after the low plane).
     */
    static void unpack(MemorySegment src, long off, int shift, int width, int planeBytes, int[] codes, boolean overwrite) {
        int fields = 8 / width;
        int mask = (1 << width) - 1;
        if (planeBytes % L == 0) {
            // Two loops rather than one with a choice between vector values: C2 boxes vectors merged at a branch.
            if (overwrite) {
                for (int j = 0; j < planeBytes; j += L) {
                    IntVector b = ((IntVector) ByteVector.fromMemorySegment(B, src, off + j, LE)
                            .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                    for (int q = 0; q < fields; q++) {
                        b.lanewise(VectorOperators.LSHR, q * width).and(mask).lanewise(VectorOperators.LSHL, shift)
                                .intoArray(codes, j + q * planeBytes);
                    }
                }
            } else {
                for (int j = 0; j < planeBytes; j += L) {
                    IntVector b = ((IntVector) ByteVector.fromMemorySegment(B, src, off + j, LE)
                            .convertShape(VectorOperators.B2I, I, 0)).and(0xFF);
                    for (int q = 0; q < fields; q++) {
                        int at = j + q * planeBytes;
                        b.lanewise(VectorOperators.LSHR, q * width).and(mask).lanewise(VectorOperators.LSHL, shift)
                                .or(IntVector.fromArray(I, codes, at)).intoArray(codes, at);
                    }
                }
            }
        } else {
            for (int j = 0; j < planeBytes; j++) {
                int b = src.get(ValueLayout.JAVA_BYTE, off + j) & 0xFF;
                for (int q = 0; q < fields; q++) {
                    int c = ((b >> (q * width)) & mask) << shift;
                    int at = j + q * planeBytes;
                    codes[at] = overwrite ? c : codes[at] | c;
                }
            }
        }
    }
}
