package dev.kvant.gguf;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.Arena;
import java.util.List;
import java.util.function.Consumer;
import org.junit.jupiter.api.Test;

class GgufMetadataTest {

    private static void withMetadata(GgufWriter w, Consumer<GgufMetadata> body) {
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(w.writeToSegment(arena), "m.gguf")) {
            body.accept(f.metadata());
        }
    }

    private static String error(Runnable r) {
        return assertThrows(GgufException.class, r::run).getMessage();
    }

    @Test
    void getLongAcceptsEveryIntegerType() {
        GgufWriter w = new GgufWriter().putU8("u8", 200).putI8("i8", -5).putU16("u16", 60000).putI16("i16", -300)
                .putU32("u32", 4_000_000_000L).putI32("i32", -7).putU64("u64", 1L << 40).putI64("i64", -(1L << 40));
        withMetadata(w, md -> {
            assertEquals(200, md.getLong("u8"));
            assertEquals(-5, md.getLong("i8"));
            assertEquals(60000, md.getLong("u16"));
            assertEquals(-300, md.getLong("i16"));
            assertEquals(4_000_000_000L, md.getLong("u32"));
            assertEquals(-7, md.getLong("i32"));
            assertEquals(1L << 40, md.getLong("u64"));
            assertEquals(-(1L << 40), md.getLong("i64"));
            assertEquals(60000, md.getInt("u16"));
        });
    }

    @Test
    void wrongTypeNamesFileKeyAndBothTypes() {
        withMetadata(new GgufWriter().putString("llama.block_count", "8").putBool("b", true), md -> {
            assertEquals("GGUF m.gguf: key 'llama.block_count' is a string, expected an integer",
                    error(() -> md.getLong("llama.block_count")));
            assertEquals("GGUF m.gguf: key 'b' is a bool, expected an integer", error(() -> md.getInt("b", 3)));
            assertEquals("GGUF m.gguf: key 'b' is a bool, expected a number", error(() -> md.getFloat("b")));
            assertEquals("GGUF m.gguf: key 'llama.block_count' is a string, expected a bool",
                    error(() -> md.getBoolean("llama.block_count", false)));
            assertEquals("GGUF m.gguf: key 'b' is a bool, expected a string", error(() -> md.getString("b")));
            assertEquals("GGUF m.gguf: key 'b' is a bool, expected an array", error(() -> md.getStringArray("b")));
        });
    }

    @Test
    void missingKeyIsAnErrorWithoutADefaultAndTheDefaultWithOne() {
        withMetadata(new GgufWriter(), md -> {
            assertEquals("GGUF m.gguf: key 'llama.context_length' is missing",
                    error(() -> md.getInt("llama.context_length")));
            assertEquals(4096, md.getInt("llama.context_length", 4096));
            assertEquals(7L, md.getLong("x", 7L));
            assertEquals(0.5f, md.getFloat("x", 0.5f));
            assertEquals("d", md.getString("x", "d"));
            assertTrue(md.getBoolean("x", true));
            assertTrue(md.get("x").isEmpty());
        });
    }

    @Test
    void getIntChecksTheRange() {
        withMetadata(new GgufWriter().putU32("big", 3_000_000_000L).putU64("huge", -1L), md -> {
            assertEquals("GGUF m.gguf: key 'big' is 3000000000, which does not fit an int", error(() -> md.getInt("big")));
            assertTrue(error(() -> md.getLong("huge")).contains("is 18446744073709551615, which does not fit"));
        });
    }

    @Test
    void getFloatWidensIntegersAndNarrowsDoubles() {
        withMetadata(new GgufWriter().putF64("d", 1e-5).putU32("i", 10000).putF32("f", 0.25f), md -> {
            assertEquals(1e-5f, md.getFloat("d"));
            assertEquals(10000f, md.getFloat("i"));
            assertEquals(0.25f, md.getFloat("f"));
        });
    }

    @Test
    void typedArrayGettersConvertAndCheckElements() {
        GgufWriter w = new GgufWriter()
                .putArray("u32s", GgufValueType.UINT32, List.of(1L, 4_000_000_000L))
                .putArray("u8s", GgufValueType.UINT8, List.of(0, 255))
                .putArray("f64s", GgufValueType.FLOAT64, List.of(0.5, 2.0))
                .putStringArray("strs", List.of("a"))
                .putArray("bools", GgufValueType.BOOL, List.of(true));
        withMetadata(w, md -> {
            assertEquals("GGUF m.gguf: key 'u32s' element 1 is 4000000000, which does not fit an int",
                    error(() -> md.getIntArray("u32s")));
            assertArrayEquals(new long[] {1L, 4_000_000_000L}, md.getLongArray("u32s"));
            assertArrayEquals(new int[] {0, 255}, md.getIntArray("u8s"));
            assertArrayEquals(new float[] {0f, 255f}, md.getFloatArray("u8s"));
            assertArrayEquals(new float[] {0.5f, 2f}, md.getFloatArray("f64s"));
            assertEquals("GGUF m.gguf: key 'strs' is an array of string, expected an array of integers",
                    error(() -> md.getIntArray("strs")));
            assertEquals("GGUF m.gguf: key 'bools' is an array of bool, expected an array of numbers",
                    error(() -> md.getFloatArray("bools")));
            assertEquals("GGUF m.gguf: key 'u8s' is an array of uint8, expected an array of strings",
                    error(() -> md.getStringArray("u8s")));
            assertEquals("GGUF m.gguf: key 'u8s' is an array of uint8, expected a string",
                    error(() -> md.getString("u8s")));
        });
    }

    @Test
    void returnedArraysAreCopies() {
        withMetadata(new GgufWriter().putFloatArray("f", new float[] {1f, 2f}), md -> {
            md.getFloatArray("f")[0] = 99f;
            assertEquals(1f, md.getFloatArray("f")[0]);
            ((float[]) md.getArray("f").values())[1] = 99f;
            assertEquals(2f, md.getFloatArray("f")[1]);
        });
    }
}
