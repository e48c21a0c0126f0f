package dev.kvant.gguf;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Damaged files, truncated everywhere and flipped at random: each parse must either succeed with a self-consistent
 * result or fail with a GgufException naming the file. Anything else (an IndexOutOfBoundsException, an
 * OutOfMemoryError, a hang) fails the test with the seed and the damage that caused it.
 */
class GgufFuzzTest {
    private static final String NAME = "fuzz.gguf";
    private static final long SEED = System.nanoTime();
    private static byte[] valid;
    private static long dataOffset;

    @BeforeAll
    static void buildValidFile() {
        System.out.println("GgufFuzzTest seed " + SEED);
        Random rnd = new Random(SEED);
        GgufWriter w = new GgufWriter()
                .putString("general.architecture", "llama")
                .putString("general.name", "f\u00fczz \u2713")
                .putU32("llama.block_count", 2)
                .putF32("llama.attention.layer_norm_rms_epsilon", 1e-5f)
                .putBool("tokenizer.ggml.add_bos_token", true)
                .putU64("big", -1L)
                .putStringArray("tokenizer.ggml.tokens", List.of("<s>", "a", "bc", "\u00e9"))
                .putFloatArray("tokenizer.ggml.scores", new float[] {0f, -1f, -2f, -3f})
                .putIntArray("tokenizer.ggml.token_type", new int[] {3, 1, 1, 1})
                .putArray("flags", GgufValueType.BOOL, List.of(true, false, true))
                .putArray("nested", GgufValueType.ARRAY, List.of(
                        GgufArray.of(GgufValueType.STRING, List.of("x", "yz")),
                        GgufArray.of(GgufValueType.UINT16, List.of(1, 65535))));
        long[][] shapes = {{64, 3}, {32}, {256, 1}, {64, 2, 2}};
        GgmlType[] types = {GgmlType.F16, GgmlType.F32, GgmlType.Q4_K, GgmlType.Q8_0};
        for (int i = 0; i < shapes.length; i++) {
            long rows = Arrays.stream(shapes[i]).skip(1).reduce(1, Math::multiplyExact);
            byte[] data = new byte[(int) (types[i].rowBytes(shapes[i][0]) * rows)];
            rnd.nextBytes(data);
            w.addTensor("blk." + i + ".weight", types[i], shapes[i], data);
        }
        try (Arena arena = Arena.ofConfined()) {
            valid = w.writeToSegment(arena).toArray(ValueLayout.JAVA_BYTE);
        }
        try (GgufFile f = GgufFile.of(MemorySegment.ofArray(valid), NAME)) {
            dataOffset = f.dataOffset();
        }
    }

    /** Parses {@code image}; returns null on success (after checking consistency), else the GgufException. */
    private static GgufException parse(byte[] image, String damage) {
        try (GgufFile f = GgufFile.of(MemorySegment.ofArray(image), NAME)) {
            checkConsistent(f, image.length, damage);
            return null;
        } catch (GgufException e) {
            assertTrue(e.getMessage().startsWith("GGUF " + NAME + ": "), damage + ": " + e.getMessage());
            return e;
        } catch (Throwable t) {
            throw new AssertionError(damage + " (seed " + SEED + "): " + t, t);
        }
    }

    private static void checkConsistent(GgufFile f, long size, String damage) {
        assertTrue(f.version() == 2 || f.version() == 3, damage);
        assertEquals(0, f.dataOffset() % f.alignment(), damage);
        List<GgufTensorInfo> byOffset = new ArrayList<>(f.tensors());
        byOffset.sort(Comparator.comparingLong(GgufTensorInfo::offset));
        long previousEnd = f.dataOffset();
        for (GgufTensorInfo t : byOffset) {
            assertTrue(t.offset() >= previousEnd, damage + ": " + t);
            assertEquals(0, (t.offset() - f.dataOffset()) % f.alignment(), damage);
            assertTrue(t.offset() + t.byteSize() <= size, damage + ": " + t);
            assertEquals(t.type().rowBytes(t.rowLength()) * t.rows(), t.byteSize(), damage);
            assertEquals(t.byteSize(), f.data(t).byteSize(), damage);
            assertEquals(t, f.requireTensor(t.name()), damage);
            previousEnd = t.offset() + t.byteSize();
        }
        for (String key : f.metadata().keys()) {
            assertTrue(f.metadata().get(key).isPresent(), damage);
        }
        assertTrue(f.describe().startsWith("GGUF v"), damage);
    }

    @Test
    @Timeout(value = 15, unit = TimeUnit.SECONDS)
    void everyTruncationFailsWithAGgufException() {
        Random rnd = new Random(SEED);
        List<Integer> cuts = new ArrayList<>();
        for (int n = 0; n <= dataOffset + 64; n++) {
            cuts.add(n);
        }
        for (int i = 0; i < 300; i++) {
            cuts.add((int) (dataOffset + rnd.nextInt((int) (valid.length - dataOffset))));
        }
        for (int n : cuts) {
            GgufException e = parse(Arrays.copyOf(valid, n), "truncated to " + n + " bytes");
            if (e == null) {
                fail("truncated to " + n + " of " + valid.length + " bytes, the file still parsed (seed " + SEED + ")");
            }
        }
        assertEquals(null, parse(valid, "intact"));
    }

    @Test
    @Timeout(value = 15, unit = TimeUnit.SECONDS)
    void randomByteFlipsFailCleanlyOrParseConsistently() {
        Random rnd = new Random(SEED);
        int rejected = 0;
        int iterations = 4000;
        for (int it = 0; it < iterations; it++) {
            byte[] image = valid.clone();
            StringBuilder damage = new StringBuilder("iteration " + it + ":");
            int flips = 1 + rnd.nextInt(3);
            for (int k = 0; k < flips; k++) {
                // Nine in ten hits land in the header, where the structure is; data bytes are opaque to the parser.
                int at = rnd.nextInt(10) == 0 ? rnd.nextInt(image.length) : rnd.nextInt((int) dataOffset);
                switch (rnd.nextInt(3)) {
                    case 0 -> image[at] ^= (byte) (1 << rnd.nextInt(8));
                    case 1 -> image[at] = (byte) rnd.nextInt(256);
                    default -> image[at] = (byte) 0xFF; // turns counts and lengths absurd
                }
                damage.append(" byte ").append(at).append(" -> ").append(image[at] & 0xFF);
            }
            if (parse(image, damage.toString()) != null) {
                rejected++;
            }
        }
        System.out.println("GgufFuzzTest: " + rejected + " of " + iterations + " damaged images rejected");
        assertTrue(rejected > iterations / 4, "suspiciously few rejections: " + rejected + " (seed " + SEED + ")");
    }
}
