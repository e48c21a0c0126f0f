package dev.kvant.tensor;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Random;
import org.junit.jupiter.api.Test;

class LanesTest {
    private static final long SEED = System.nanoTime();

    @Test
    void sumIsThePairwiseTreeOfTheLanes() {
        Random random = new Random(SEED);
        for (int trial = 0; trial < 200; trial++) {
            float[] lanes = Float64Reference.gaussian(random, Lanes.L, Math.scalb(1.0, random.nextInt(40) - 20));
            float[] tree = lanes.clone();
            for (int width = Lanes.L / 2; width >= 1; width /= 2) {
                for (int j = 0; j < width; j++) {
                    tree[j] += tree[j + width];
                }
            }
            assertEquals(Float.floatToRawIntBits(tree[0]), Float.floatToRawIntBits(Lanes.sum(lanes, 0)),
                    "seed " + SEED);
        }
    }

    @Test
    void sum4GivesTheBitsOfFourSingleSums() {
        Random random = new Random(SEED + 1);
        for (int trial = 0; trial < 500; trial++) {
            // Wildly different magnitudes make any change of pairing visible in the bits.
            float[] t = new float[4 * Lanes.L];
            for (int i = 0; i < t.length; i++) {
                t[i] = (float) (random.nextGaussian() * Math.scalb(1.0, random.nextInt(30) - 15));
            }
            float[] out = new float[9];
            java.util.Arrays.fill(out, Float.NaN);
            Lanes.sum4(t, 0, out, 1, 2);
            for (int r = 0; r < 4; r++) {
                assertEquals(Float.floatToRawIntBits(Lanes.sum(t, r * Lanes.L)),
                        Float.floatToRawIntBits(out[1 + 2 * r]),
                        "accumulator " + r + ", seed " + SEED);
            }
        }
    }

    @Test
    void vectorScaleDecodingMatchesTheScalarRule() {
        Random random = new Random(SEED + 2);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment blocks = arena.allocate(4 * 144);
            for (int trial = 0; trial < 100; trial++) {
                for (long i = 0; i < blocks.byteSize(); i++) {
                    blocks.set(java.lang.foreign.ValueLayout.JAVA_BYTE, i, (byte) random.nextInt());
                }
                // Keep d and dmin finite so that equality of floats is meaningful.
                for (int r = 0; r < 4; r++) {
                    blocks.set(java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED, 144L * r,
                            Float.floatToFloat16((float) random.nextGaussian()));
                    blocks.set(java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED, 144L * r + 2,
                            Float.floatToFloat16((float) random.nextGaussian()));
                }
                float[] fast = new float[64];
                KQuantScales.decode4(blocks.address(), 144, fast, 0);
                for (int r = 0; r < 4; r++) {
                    float[] plain = new float[16];
                    KQuantScales.decodeScalar(blocks, 144L * r, plain, 0);
                    byte[] b = blocks.asSlice(144L * r, 16).toArray(java.lang.foreign.ValueLayout.JAVA_BYTE);
                    double d = Float64Reference.half(Float64Reference.u16(b, 0));
                    double dmin = Float64Reference.half(Float64Reference.u16(b, 2));
                    for (int j = 0; j < 8; j++) {
                        assertEquals((float) (d * Float64Reference.kScale(b, 4, j)), plain[KQuantScales.scaleAt(j)]);
                        assertEquals((float) (-dmin * Float64Reference.kMin(b, 4, j)), plain[KQuantScales.minAt(j)]);
                    }
                    for (int i = 0; i < 16; i++) {
                        assertEquals(Float.floatToRawIntBits(plain[i]), Float.floatToRawIntBits(fast[16 * r + i]),
                                "row " + r + " entry " + i + ", seed " + SEED);
                    }
                }
            }
        }
    }
}
