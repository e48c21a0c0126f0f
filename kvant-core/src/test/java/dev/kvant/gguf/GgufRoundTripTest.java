package dev.kvant.gguf;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

class GgufRoundTripTest {
    private static final long SEED = System.nanoTime();

    static {
        System.out.println("GgufRoundTripTest seed " + SEED);
    }

    @TempDir
    Path dir;

    private static GgufArray arr(GgufValueType t, Object values) {
        return new GgufArray(t, values);
    }

    /** One value of every type, at the edges of its range, plus arrays of every element type and nested arrays. */
    static Map<String, GgufValue> everyValueType() {
        Map<String, GgufValue> m = new java.util.LinkedHashMap<>();
        m.put("u8", GgufValue.of(GgufValueType.UINT8, 255));
        m.put("i8", GgufValue.of(GgufValueType.INT8, -128));
        m.put("u16", GgufValue.of(GgufValueType.UINT16, 65535));
        m.put("i16", GgufValue.of(GgufValueType.INT16, -32768));
        m.put("u32", GgufValue.of(GgufValueType.UINT32, 0xFFFF_FFFFL));
        m.put("i32", GgufValue.of(GgufValueType.INT32, Integer.MIN_VALUE));
        m.put("u64", GgufValue.of(GgufValueType.UINT64, -1L));
        m.put("i64", GgufValue.of(GgufValueType.INT64, Long.MIN_VALUE));
        m.put("f32", GgufValue.of(GgufValueType.FLOAT32, 1.4e-45f));
        m.put("f32.nan", GgufValue.of(GgufValueType.FLOAT32, Float.NaN));
        m.put("f32.negzero", GgufValue.of(GgufValueType.FLOAT32, -0.0f));
        m.put("f64", GgufValue.of(GgufValueType.FLOAT64, Math.PI));
        m.put("bool.t", GgufValue.of(GgufValueType.BOOL, true));
        m.put("bool.f", GgufValue.of(GgufValueType.BOOL, false));
        m.put("str", GgufValue.of(GgufValueType.STRING, "h\u00e9llo \u2713 \ud834\udd1e"));
        m.put("str.empty", GgufValue.of(GgufValueType.STRING, ""));
        m.put("a.u8", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.UINT8, new byte[] {0, 1, (byte) 255})));
        m.put("a.i8", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.INT8, new byte[] {-128, 127})));
        m.put("a.u16", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.UINT16, new short[] {-1, 7})));
        m.put("a.i16", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.INT16, new short[] {-32768, 9})));
        m.put("a.u32", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.UINT32, new int[] {-1, 3})));
        m.put("a.i32", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.INT32, new int[] {Integer.MIN_VALUE})));
        m.put("a.u64", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.UINT64, new long[] {-1L, 5})));
        m.put("a.i64", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.INT64, new long[] {Long.MIN_VALUE})));
        m.put("a.f32", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.FLOAT32, new float[] {1.5f, -2e30f})));
        m.put("a.f64", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.FLOAT64, new double[] {1e300, -0.0})));
        m.put("a.bool", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.BOOL, new boolean[] {true, false})));
        m.put("a.str", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.STRING, List.of("a", "", "\u00fc"))));
        m.put("a.empty", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.FLOAT32, new float[0])));
        GgufArray inner1 = arr(GgufValueType.STRING, List.of("x", "y"));
        GgufArray inner2 = arr(GgufValueType.INT32, new int[] {1, 2, 3});
        GgufArray mid = arr(GgufValueType.ARRAY, List.of(inner1, inner2));
        m.put("a.nested", new GgufValue(GgufValueType.ARRAY, arr(GgufValueType.ARRAY, List.of(mid, mid))));
        GgufArray deep = arr(GgufValueType.BOOL, new boolean[] {true});
        for (int d = 1; d < GgufParser.MAX_ARRAY_DEPTH; d++) {
            deep = arr(GgufValueType.ARRAY, List.of(deep));
        }
        m.put("a.deepest", new GgufValue(GgufValueType.ARRAY, deep));
        return m;
    }

    @Test
    void everyValueTypeRoundTripsIncludingNestedArrays() {
        Map<String, GgufValue> values = everyValueType();
        GgufWriter w = new GgufWriter();
        values.forEach(w::put);
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(w.writeToSegment(arena), "values.gguf")) {
            assertEquals(List.copyOf(values.keySet()), List.copyOf(f.metadata().keys()));
            for (var e : values.entrySet()) {
                assertEquals(e.getValue(), f.metadata().get(e.getKey()).orElseThrow(), e.getKey());
            }
            GgufMetadata md = f.metadata();
            assertEquals(255, md.getInt("u8"));
            assertEquals(-128, md.getInt("i8"));
            assertEquals(0xFFFF_FFFFL, md.getLong("u32"));
            assertEquals(Long.MIN_VALUE, md.getLong("i64"));
            assertTrue(Float.isNaN(md.getFloat("f32.nan")));
            assertEquals(Float.floatToRawIntBits(-0.0f), Float.floatToRawIntBits(md.getFloat("f32.negzero")));
            assertEquals("h\u00e9llo \u2713 \ud834\udd1e", md.getString("str"));
            assertEquals("", md.getString("str.empty"));
            assertTrue(md.getBoolean("bool.t", false));
            assertFalse(md.getBoolean("bool.f", true));
            assertEquals(List.of("a", "", "\u00fc"), md.getStringArray("a.str"));
            assertArrayEquals(new float[] {1.5f, -2e30f}, md.getFloatArray("a.f32"));
            assertArrayEquals(new int[] {Integer.MIN_VALUE}, md.getIntArray("a.i32"));
            assertArrayEquals(new int[] {0, 1, 255}, md.getIntArray("a.u8"));
            GgufArray nested = md.getArray("a.nested");
            GgufArray mid = (GgufArray) nested.get(1);
            assertEquals(List.of("x", "y"), ((GgufArray) mid.get(0)).values());
            assertEquals(3, ((GgufArray) mid.get(1)).get(2));
        }
    }

    /** Random bytes for a tensor of {@code type} and {@code shape}; never all zeros. */
    private static byte[] randomData(Random rnd, GgmlType type, long[] shape) {
        long rows = 1;
        for (int i = 1; i < shape.length; i++) {
            rows *= shape[i];
        }
        byte[] b = new byte[(int) (type.rowBytes(shape[0]) * rows)];
        rnd.nextBytes(b);
        b[0] = 1;
        return b;
    }

    @Test
    void everyTensorTypeGeometryRoundTrips() {
        Random rnd = new Random(SEED);
        GgufWriter w = new GgufWriter();
        List<GgufTensorInfo> expected = new ArrayList<>();
        List<byte[]> data = new ArrayList<>();
        for (GgmlType type : GgmlType.values()) {
            long[][] shapes = {
                {2L * type.blockSize, 3},
                {type.blockSize},
                {3L * type.blockSize, 2, 1, 2},
            };
            for (int s = 0; s < shapes.length; s++) {
                String name = "t." + type + "." + s;
                byte[] bytes = randomData(rnd, type, shapes[s]);
                w.addTensor(name, type, shapes[s], bytes);
                expected.add(new GgufTensorInfo(name, type, shapes[s], -1, bytes.length));
                data.add(bytes);
            }
        }
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(w.writeToSegment(arena), "types.gguf")) {
            assertEquals(expected.size(), f.tensors().size());
            for (int i = 0; i < expected.size(); i++) {
                GgufTensorInfo want = expected.get(i);
                GgufTensorInfo got = f.tensors().get(i);
                String msg = want.name() + " seed " + SEED;
                assertEquals(want.name(), got.name(), msg);
                assertEquals(want.type(), got.type(), msg);
                assertArrayEquals(want.shape(), got.shape(), msg);
                assertEquals(want.byteSize(), got.byteSize(), msg);
                assertEquals(want.type().rowBytes(got.rowLength()) * got.rows(), got.byteSize(), msg);
                assertEquals(got.rowLength() * got.rows(), got.elementCount(), msg);
                assertEquals(0, (got.offset() - f.dataOffset()) % 32, msg);
                assertTrue(got.offset() >= f.dataOffset(), msg);
                MemorySegment seg = f.data(got);
                assertTrue(seg.isReadOnly(), msg);
                assertArrayEquals(data.get(i), seg.toArray(ValueLayout.JAVA_BYTE), msg);
            }
            assertEquals(expected.getFirst().name(), f.requireTensor(expected.getFirst().name()).name());
        }
    }

    private static GgufWriter sample(int version) {
        Random rnd = new Random(SEED);
        GgufWriter w = new GgufWriter(version)
                .putString("general.architecture", "llama")
                .putU32("llama.block_count", 2)
                .putF32("llama.rope.freq_base", 10000f)
                .putStringArray("tokenizer.ggml.tokens", List.of("<s>", "a", "b\u00e4"))
                .putFloatArray("tokenizer.ggml.scores", new float[] {0f, -1f, -2f})
                .putIntArray("tokenizer.ggml.token_type", new int[] {3, 1, 1});
        long[][] shapes = {{64, 4}, {32}, {256, 2}};
        GgmlType[] types = {GgmlType.F16, GgmlType.F32, GgmlType.Q4_K};
        for (int i = 0; i < shapes.length; i++) {
            w.addTensor("w" + i, types[i], shapes[i], randomData(rnd, types[i], shapes[i]));
        }
        return w;
    }

    @ParameterizedTest
    @ValueSource(ints = {2, 3})
    void versionsTwoAndThreeRoundTrip(int version) {
        try (Arena arena = Arena.ofConfined();
             GgufFile f = GgufFile.of(sample(version).writeToSegment(arena), "v" + version + ".gguf")) {
            assertEquals(version, f.version());
            assertEquals("llama", f.metadata().getString("general.architecture"));
            assertEquals(List.of("w0", "w1", "w2"), f.tensors().stream().map(GgufTensorInfo::name).toList());
        }
    }

    @ParameterizedTest
    @ValueSource(ints = {1, 8, 64, 4096})
    void tensorDataHonoursAlignmentOtherThan32(int alignment) {
        GgufWriter w = sample(3).putU32("general.alignment", alignment);
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(w.writeToSegment(arena), "aligned.gguf")) {
            assertEquals(alignment, f.alignment());
            assertEquals(0, f.dataOffset() % alignment);
            for (GgufTensorInfo t : f.tensors()) {
                assertEquals(0, t.offset() % alignment, t.name());
            }
            assertEquals(w.byteSize(), f.byteSize());
        }
    }

    @Test
    void openedFileEqualsInMemoryImageByteForByte() throws IOException {
        GgufWriter w = sample(3);
        w.putArray("nested", (GgufArray) everyValueType().get("a.nested").value());
        Path file = dir.resolve("m.gguf");
        w.write(file);
        assertEquals(w.byteSize(), Files.size(file));
        try (Arena arena = Arena.ofConfined(); GgufFile fromFile = GgufFile.open(file)) {
            MemorySegment image = w.writeToSegment(arena);
            assertArrayEquals(Files.readAllBytes(file), image.toArray(ValueLayout.JAVA_BYTE));
            GgufFile fromMemory = GgufFile.of(image, file.toString());
            assertEquals(fromFile.version(), fromMemory.version());
            assertEquals(fromFile.dataOffset(), fromMemory.dataOffset());
            assertEquals(fromFile.tensors(), fromMemory.tensors());
            assertEquals(List.copyOf(fromFile.metadata().keys()), List.copyOf(fromMemory.metadata().keys()));
            for (String k : fromFile.metadata().keys()) {
                assertEquals(fromFile.metadata().get(k), fromMemory.metadata().get(k), k);
            }
            for (GgufTensorInfo t : fromFile.tensors()) {
                assertEquals(-1, fromFile.data(t).mismatch(fromMemory.data(t)), t.name());
            }
            assertEquals(fromFile.describe(), fromMemory.describe());
        }
    }

    @Test
    void puttingAKeyAgainReplacesItInPlace() {
        GgufWriter w = new GgufWriter().putU32("a", 1).putString("b", "x").putU32("a", 2);
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(w.writeToSegment(arena), "r.gguf")) {
            assertEquals(List.of("a", "b"), List.copyOf(f.metadata().keys()));
            assertEquals(2, f.metadata().getInt("a"));
        }
    }

    @Test
    void describeReportsCountsAndBytesPerType() {
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(sample(3).writeToSegment(arena), "d.gguf")) {
            String d = f.describe();
            assertTrue(d.startsWith("GGUF v3 d.gguf: "), d);
            assertTrue(d.contains("6 metadata keys, 3 tensors"), d);
            assertTrue(d.matches("(?s).*F16\\s+1 tensors\\s+512 bytes.*"), d);
            assertTrue(d.matches("(?s).*Q4_K\\s+1 tensors\\s+288 bytes.*"), d);
        }
    }

    @Test
    void closingAnOpenedFileReleasesTheMapping() throws IOException {
        Path file = dir.resolve("c.gguf");
        sample(3).write(file);
        GgufFile f = GgufFile.open(file);
        MemorySegment w0 = f.data("w0");
        assertTrue(w0.scope().isAlive());
        f.close();
        assertFalse(w0.scope().isAlive());
        f.close(); // idempotent
    }
}
