package dev.kvant.tensor;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

class WeightFormatTest {
    private static final long SEED = System.nanoTime();

    static {
        System.out.println("WeightFormatTest seed " + SEED);
    }

    private static Random random(GgmlType type, int salt) {
        return new Random(SEED ^ (31L * type.ordinal() + salt));
    }

    private static String where(GgmlType type) {
        return type + ", seed " + SEED;
    }

    /** Quantizes {@code values} into a fresh native segment. */
    static MemorySegment encode(WeightFormat f, float[] values, Arena arena) {
        MemorySegment s = arena.allocate(f.bytesFor(values.length), 64);
        f.quantize(values, 0, values.length, s, 0);
        return s;
    }

    static byte[] bytes(MemorySegment s) {
        return s.toArray(ValueLayout.JAVA_BYTE);
    }

    /** Columns covering a few blocks of every format and, for plain floats, a partial last chunk. */
    private static int cols(WeightFormat f) {
        return f.blockSize() == 1 ? 3 * Lanes.L + 5 : 3 * f.blockSize();
    }

    /** A Q4_0 block with an infinite scale decodes as ggml's (q - 8)·d: ±inf, and NaN for nibble 8. */
    @Test
    void q4_0WithAnInfiniteScaleDecodesAsTheReference() {
        byte[] block = new byte[18];
        block[0] = 0x00;
        block[1] = 0x7C;   // d = +inf
        for (int j = 0; j < 16; j++) {
            block[2 + j] = (byte) (j | (j << 4));   // nibbles 0..15, low and high
        }
        WeightFormat f = WeightFormat.of(GgmlType.Q4_0);
        double[] reference = Float64Reference.decode(GgmlType.Q4_0, block, 32);
        float[] out = new float[32];
        f.dequantize(MemorySegment.ofArray(block), 0, out, 0, 32);
        for (int i = 0; i < 32; i++) {
            assertEquals(reference[i], out[i], 0.0, "value " + i);
        }
        assertEquals(Float.NEGATIVE_INFINITY, out[0]);
        assertTrue(Float.isNaN(out[8]), "nibble 8: 0·inf");
        assertEquals(Float.POSITIVE_INFINITY, out[15]);
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void dequantizeMatchesFloat64ReferenceDecoder(GgmlType type) {
        WeightFormat f = WeightFormat.of(type);
        int n = cols(f);
        float[] values = Float64Reference.gaussian(random(type, 1), n, 0.7);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = encode(f, values, arena);
            double[] reference = Float64Reference.decode(type, bytes(s), n);
            float[] out = new float[n + 2];
            Arrays.fill(out, Float.NaN);
            f.dequantize(s, 0, out, 1, n);
            assertTrue(Float.isNaN(out[0]) && Float.isNaN(out[n + 1]), "wrote outside its range: " + where(type));
            for (int i = 0; i < n; i++) {
                // Correctly rounded: within half an ulp of the exact value (the float64 one is exact or nearly).
                double tolerance = 0.5 * Math.ulp(out[1 + i]) + 1e-15 * Math.abs(reference[i]);
                assertTrue(Math.abs(out[1 + i] - reference[i]) <= tolerance,
                        "value " + i + ": " + out[1 + i] + " vs " + reference[i] + ", " + where(type));
            }
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void quantizeThenDequantizeStaysCloseToTheInput(GgmlType type) {
        WeightFormat f = WeightFormat.of(type);
        int n = f.blockSize() == 1 ? 1000 : 16 * f.blockSize();
        float[] values = Float64Reference.gaussian(random(type, 2), n, 1.3);
        double bound = switch (type) {
            case F32 -> 0;
            case F16 -> 1e-3;
            case BF16 -> 5e-3;
            case Q8_0 -> 0.01;
            case Q6_K -> 0.03;
            case Q5_K -> 0.06;
            case Q4_K -> 0.12;
            case Q4_0 -> 0.15;
            default -> throw new AssertionError(type);
        };
        try (Arena arena = Arena.ofConfined()) {
            float[] out = new float[n];
            f.dequantize(encode(f, values, arena), 0, out, 0, n);
            double err = 0;
            double norm = 0;
            for (int i = 0; i < n; i++) {
                err += (out[i] - values[i]) * (double) (out[i] - values[i]);
                norm += values[i] * (double) values[i];
            }
            double relative = Math.sqrt(err / norm);
            assertTrue(relative <= bound, "relative RMS error " + relative + " > " + bound + ", " + where(type));
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void dotMatchesFloat64Reference(GgmlType type) {
        WeightFormat f = WeightFormat.of(type);
        Random random = random(type, 3);
        for (int blocks : new int[]{1, 2, 7}) {
            int n = f.blockSize() == 1 ? blocks * Lanes.L + blocks : blocks * f.blockSize();
            float[] values = Float64Reference.gaussian(random, n, 0.5);
            float[] x = Float64Reference.gaussian(random, n + 3, 2.0);
            try (Arena arena = Arena.ofConfined()) {
                MemorySegment s = encode(f, values, arena);
                double[] w = Float64Reference.decode(type, bytes(s), n);
                double expected = Float64Reference.dot(w, x, 3);
                double bound = Float64Reference.bound(n, Float64Reference.absDot(w, x, 3));
                float got = f.dot(s, 0, x, 3, n);
                assertTrue(Math.abs(got - expected) <= bound,
                        n + " values: " + got + " vs " + expected + " (bound " + bound + "), " + where(type));
            }
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void dotOfAHeapSegmentEqualsDotOfNativeMemory(GgmlType type) {
        WeightFormat f = WeightFormat.of(type);
        int n = cols(f);
        Random random = random(type, 4);
        float[] x = Float64Reference.gaussian(random, n, 1);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = encode(f, Float64Reference.gaussian(random, n, 1), arena);
            MemorySegment heap = MemorySegment.ofArray(bytes(s));
            assertEquals(Float.floatToRawIntBits(f.dot(s, 0, x, 0, n)),
                    Float.floatToRawIntBits(f.dot(heap, 0, x, 0, n)),
                    where(type));
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void readingPastTheSegmentIsRefused(GgmlType type) {
        WeightFormat f = WeightFormat.of(type);
        int n = cols(f);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = encode(f, Float64Reference.gaussian(random(type, 5), n, 1), arena);
            float[] x = new float[2 * n];
            assertThrows(IndexOutOfBoundsException.class, () -> f.dot(s, 1, x, 0, n));
            assertThrows(IndexOutOfBoundsException.class, () -> f.dequantize(s, 0, new float[n - 1], 0, n));
        }
    }

    @Test
    void q8_0BlockDecodesToScaleTimesSignedBytes() {
        // d = 0.5 (fp16 0x3800), q = -128, -127, ..., then a few chosen values.
        byte[] block = new byte[34];
        block[0] = 0x00;
        block[1] = 0x38;
        for (int i = 0; i < 32; i++) {
            block[2 + i] = (byte) (i * 9 - 128);
        }
        float[] out = decode(GgmlType.Q8_0, block, 32);
        for (int i = 0; i < 32; i++) {
            assertEquals(0.5f * (byte) (i * 9 - 128), out[i], "value " + i);
        }
    }

    @Test
    void q4_0BlockDecodesLowNibblesFirstThenHighNibbles() {
        // d = 2 (fp16 0x4000); byte j holds low nibble j % 16 and high nibble 15 - j % 16.
        byte[] block = new byte[18];
        block[0] = 0x00;
        block[1] = 0x40;
        for (int j = 0; j < 16; j++) {
            block[2 + j] = (byte) (j | (15 - j) << 4);
        }
        float[] out = decode(GgmlType.Q4_0, block, 32);
        for (int j = 0; j < 16; j++) {
            assertEquals(2f * (j - 8), out[j], "value " + j);
            assertEquals(2f * (15 - j - 8), out[16 + j], "value " + (16 + j));
        }
    }

    @Test
    void q4_KBlockWithChosenScalesAndMinsDecodesElementByElement() {
        // d = 0.25 (0x3400), dmin = 0.125 (0x3000); sub-block j: scale 40 + 3j, min 63 - 5j (6 bits, so the
        // upper two bits of sub-blocks 4..7 are exercised); value l of sub-block j has q = (l + j) % 16.
        int[] sc = new int[8];
        int[] mn = new int[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = 40 + 3 * j;
            mn[j] = 63 - 5 * j;
        }
        byte[] block = new byte[144];
        block[1] = 0x34;
        block[3] = 0x30;
        MemorySegment scales = MemorySegment.ofArray(new byte[12]);
        KQuantScales.pack(sc, mn, scales, 0);
        System.arraycopy(scales.toArray(ValueLayout.JAVA_BYTE), 0, block, 4, 12);
        for (int pair = 0; pair < 4; pair++) {
            for (int l = 0; l < 32; l++) {
                int lo = (l + 2 * pair) % 16;
                int hi = (l + 2 * pair + 1) % 16;
                block[16 + 32 * pair + l] = (byte) (lo | hi << 4);
            }
        }
        float[] out = decode(GgmlType.Q4_K, block, 256);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) {
                double expected = 0.25 * sc[j] * ((l + j) % 16) - 0.125 * mn[j];
                assertEquals((float) expected, out[32 * j + l], "sub-block " + j + " value " + l);
            }
        }
    }

    @Test
    void q5_KBlockTakesItsFifthBitFromBitJOfQh() {
        // d = 1 (0x3C00), dmin = 0.5 (0x3800), scale j = j + 1, min j = 2j; q = (l + j) % 32.
        int[] sc = {1, 2, 3, 4, 5, 6, 7, 8};
        int[] mn = {0, 2, 4, 6, 8, 10, 12, 14};
        byte[] block = new byte[176];
        block[1] = 0x3c;
        block[3] = 0x38;
        MemorySegment scales = MemorySegment.ofArray(new byte[12]);
        KQuantScales.pack(sc, mn, scales, 0);
        System.arraycopy(scales.toArray(ValueLayout.JAVA_BYTE), 0, block, 4, 12);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) {
                int q = (l + j) % 32;
                int at = 48 + 32 * (j / 2) + l;
                block[at] |= (byte) (j % 2 == 0 ? q & 0x0f : (q & 0x0f) << 4);
                block[16 + l] |= (byte) ((q >> 4) << j);
            }
        }
        float[] out = decode(GgmlType.Q5_K, block, 256);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) {
                assertEquals((float) (sc[j] * ((l + j) % 32) - 0.5 * mn[j]), out[32 * j + l],
                        "sub-block " + j + " value " + l);
            }
        }
    }

    @Test
    void q6_KBlockDecodesSixBitsTimesSignedScales() {
        // d = 0.5 (0x3800), scale i = (i % 2 == 0 ? 1 : -1) * (i + 3); value v has q = (7 * v) % 64.
        byte[] block = new byte[210];
        block[208] = 0x00;
        block[209] = 0x38;
        for (int i = 0; i < 16; i++) {
            block[192 + i] = (byte) ((i % 2 == 0 ? 1 : -1) * (i + 3));
        }
        for (int v = 0; v < 256; v++) {
            int q = (7 * v) % 64;
            int half = v / 128;
            int g = v % 128 / 32;
            int l = v % 32;
            int qlAt = 64 * half + 32 * (g & 1) + l;
            block[qlAt] |= (byte) (g < 2 ? q & 0x0f : (q & 0x0f) << 4);
            block[128 + 32 * half + l] |= (byte) ((q >> 4) << 2 * g);
        }
        float[] out = decode(GgmlType.Q6_K, block, 256);
        for (int v = 0; v < 256; v++) {
            int i = v / 16;
            int scale = (i % 2 == 0 ? 1 : -1) * (i + 3);
            assertEquals(0.5f * scale * ((7 * v) % 64 - 32), out[v], "value " + v);
        }
    }

    @Test
    void f16DecodesSubnormalsInfinitiesAndNaN() {
        short[] halves = {0x0001, (short) 0x8001, 0x03ff, 0x0400, 0x3c00, (short) 0xc000, 0x7bff, 0x7c00,
            (short) 0xfc00, 0x7e00, 0x0000, (short) 0x8000, 0x3555, 0x1234, (short) 0x9abc, 0x5a5a};
        byte[] bytes = new byte[2 * halves.length];
        for (int i = 0; i < halves.length; i++) {
            bytes[2 * i] = (byte) halves[i];
            bytes[2 * i + 1] = (byte) (halves[i] >> 8);
        }
        float[] out = decode(GgmlType.F16, bytes, halves.length);
        for (int i = 0; i < halves.length; i++) {
            double expected = Float64Reference.half(halves[i] & 0xffff);
            if (Double.isNaN(expected)) {
                assertTrue(Float.isNaN(out[i]), "value " + i);
            } else {
                assertEquals(Double.doubleToRawLongBits(expected), Double.doubleToRawLongBits(out[i]), "value " + i);
            }
        }
    }

    /** Every one of the 65,536 halves, through the vector lanes: the bits of {@link Float#float16ToFloat}. */
    @Test
    void f16DecodesEveryHalfToTheBitsOfTheJdksConversion() {
        int n = 1 << 16;
        byte[] bytes = new byte[2 * n];
        for (int h = 0; h < n; h++) {
            bytes[2 * h] = (byte) h;
            bytes[2 * h + 1] = (byte) (h >> 8);
        }
        float[] out = decode(GgmlType.F16, bytes, n);
        for (int h = 0; h < n; h++) {
            String half = "half 0x" + Integer.toHexString(h);
            assertEquals(Float.floatToRawIntBits(Float.float16ToFloat((short) h)), Float.floatToRawIntBits(out[h]),
                    half);
        }
    }

    @Test
    void q8_0QuantizerRoundsHalfAwayFromZeroAsGgmlReference() {
        float[] x = new float[32];
        x[0] = 127f;
        x[1] = 0.5f;
        x[2] = -0.5f;
        x[3] = 1.5f;
        x[4] = -126.5f;
        for (int i = 5; i < 32; i++) {
            x[i] = i - 16.25f;
        }
        try (Arena arena = Arena.ofConfined()) {
            byte[] b = bytes(encode(WeightFormat.of(GgmlType.Q8_0), x, arena));
            assertEquals(0x3c00, Float64Reference.u16(b, 0), "d = max/127 = 1");
            assertEquals(127, b[2]);
            assertEquals(1, b[3]);
            assertEquals(-1, b[4]);
            assertEquals(2, b[5]);
            assertEquals(-127, b[6]);
        }
    }

    @Test
    void q4_0QuantizerMapsTheLargestMagnitudeToNibbleZero() {
        float[] x = new float[32];
        for (int i = 0; i < 32; i++) {
            x[i] = (i - 10) * 0.1f;
        }
        x[7] = -4f;
        x[20] = 4f;
        try (Arena arena = Arena.ofConfined()) {
            byte[] b = bytes(encode(WeightFormat.of(GgmlType.Q4_0), x, arena));
            assertEquals(0x3800, Float64Reference.u16(b, 0), "d = -(-4)/8 = 0.5");
            assertEquals(0, b[2 + 7] & 0x0f, "the value -4 is nibble 0");
            // +4 / -0.5 ... is +4 * (1/d) = 8, + 8.5 = 16.5, truncated to 16, clamped to 15.
            assertEquals(15, (b[2 + 4] >> 4) & 0x0f, "the value +4 clamps to nibble 15");
            // 2.1 * 2 + 8.5 = 12.7 truncates to 12.
            assertEquals(12, (b[2 + 15] >> 4) & 0x0f);
        }
    }

    @Test
    void unsupportedTypeErrorNamesTheTypeAndTheSupportedOnes() {
        UnsupportedTensorTypeException e = assertThrows(UnsupportedTensorTypeException.class,
                () -> WeightFormat.of(GgmlType.Q2_K));
        assertEquals("unsupported tensor type Q2_K (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)",
                e.getMessage());
        assertEquals(GgmlType.Q2_K, e.type());
        for (GgmlType t : GgmlType.values()) {
            boolean supported = UnsupportedTensorTypeException.SUPPORTED.contains(t.name());
            if (supported) {
                assertEquals(t, WeightFormat.of(t).type());
            } else {
                assertThrows(UnsupportedTensorTypeException.class, () -> WeightFormat.of(t), t.name());
            }
        }
    }

    @Test
    void blockCountsThatAreNotWholeAreRefused() {
        WeightFormat f = WeightFormat.of(GgmlType.Q4_K);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment s = arena.allocate(1024);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> f.dot(s, 0, new float[300], 0, 300));
            assertTrue(e.getMessage().contains("Q4_K"), e.getMessage());
        }
    }

    @Test
    void bf16QuantizerRoundsToNearestEvenAndKeepsNaN() {
        assertEquals(0x3f80, Bf16Format.fromFloat(1.0f) & 0xffff);
        assertEquals(0x3f80, Bf16Format.fromFloat(Float.intBitsToFloat(0x3f808000)) & 0xffff, "tie to even");
        assertEquals(0x3f82, Bf16Format.fromFloat(Float.intBitsToFloat(0x3f818000)) & 0xffff, "tie to even");
        assertEquals(0x3f81, Bf16Format.fromFloat(Float.intBitsToFloat(0x3f808001)) & 0xffff);
        assertTrue(Float.isNaN(Float.intBitsToFloat(Bf16Format.fromFloat(Float.NaN) << 16)));
        float largest = Float.intBitsToFloat(0x7f7fffff);
        assertTrue(Float.isInfinite(Float.intBitsToFloat(Bf16Format.fromFloat(largest) << 16)), "rounds past max");
        float nan = Float.intBitsToFloat(0x7fffffff);
        assertFalse(Float.isInfinite(Float.intBitsToFloat(Bf16Format.fromFloat(nan) << 16)), "a NaN stays NaN");
    }

    private static float[] decode(GgmlType type, byte[] block, int n) {
        float[] out = new float[n];
        Arrays.fill(out, Float.NaN);
        WeightFormat.of(type).dequantize(MemorySegment.ofArray(block), 0, out, 0, n);
        // The hand-built block must also agree with the plain reference decoder.
        double[] reference = Float64Reference.decode(type, block, n);
        float[] asFloats = new float[n];
        for (int i = 0; i < n; i++) {
            asFloats[i] = (float) reference[i];
        }
        assertArrayEquals(asFloats, out, type + " kernel vs reference decoder");
        return out;
    }
}
