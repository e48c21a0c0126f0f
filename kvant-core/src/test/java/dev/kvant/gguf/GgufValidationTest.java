package dev.kvant.gguf;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Every kind of damage the reader checks for ends in one GgufException that names the file and the problem. */
class GgufValidationTest {
    private static final String FILE = "bad.gguf";
    private static final int F16 = GgmlType.F16.id;

    @TempDir
    Path dir;

    private static String reject(GgufBytes b) {
        return reject(b.segment());
    }

    private static String reject(MemorySegment image) {
        GgufException e = assertThrows(GgufException.class, () -> GgufFile.of(image, FILE));
        assertTrue(e.getMessage().startsWith("GGUF " + FILE + ": "), e.getMessage());
        return e.getMessage();
    }

    private static void assertContains(String message, String... parts) {
        for (String p : parts) {
            assertTrue(message.contains(p), () -> "expected \"" + p + "\" in: " + message);
        }
    }

    /** One F16 tensor of shape {@code shape} at relative offset 0, with its data, after optional extra KVs. */
    private static GgufBytes oneTensor(String name, long[] shape, int typeId, long relOffset, int dataBytes) {
        return GgufBytes.header(3, 1, 0).tensorInfo(name, shape, typeId, relOffset).padTo(32).zeros(dataBytes);
    }

    /**
     * Keys, strings, nested arrays and tensor infos count against one budget for the whole header: each costs tens of
     * bytes of heap for as few as 8 bytes of file (here 12 empty strings against a budget of 12: the key is one).
     */
    @Test
    void theHeadersObjectsAreCountedAgainstOneBudget() {
        GgufBytes b = GgufBytes.header(3, 0, 1).str("tokens").u32(9).u32(8).u64(12);
        for (int i = 0; i < 12; i++) {
            b.str("");
        }
        GgufException e = assertThrows(GgufException.class, () -> GgufParser.parse(FILE, b.segment(), 12,
                GgufParser.MAX_METADATA_BYTES));
        assertContains(e.getMessage(), "more than 12 keys, strings, arrays and tensor infos");
        assertTrue(GgufParser.parse(FILE, b.segment(), 13, GgufParser.MAX_METADATA_BYTES).metadata()
                .containsKey("tokens"), "within the budget");
    }

    /**
     * Strings and arrays of numbers count their bytes against one budget for the whole header: each is bounded, but
     * many of them were bounded only by the file, and a hostile header of 48 arrays of 16M longs (a sparse 6.4 GB
     * file) ran the heap out (here three arrays of 1,000 longs against 20,000 bytes).
     */
    @Test
    void theHeadersStringsAndArraysAreCountedAgainstOneByteBudget() {
        GgufBytes b = GgufBytes.header(3, 0, 3);
        for (int k = 0; k < 3; k++) {
            b.str("a" + k).u32(9).u32(11).u64(1000);   // an array of 1,000 int64
            for (int i = 0; i < 1000; i++) {
                b.u64(i);
            }
        }
        GgufException e = assertThrows(GgufException.class, () -> GgufParser.parse(FILE, b.segment(),
                GgufParser.MAX_HEADER_OBJECTS, 20_000));
        assertContains(e.getMessage(), "GGUF " + FILE + ": ", "more than 20,000 bytes", "key 'a2'");
        assertEquals(3, GgufParser.parse(FILE, b.segment(), GgufParser.MAX_HEADER_OBJECTS, 30_000).metadata().size());
    }

    @Test
    void wrongMagicIsNotAGgufFile() {
        byte[] b = GgufBytes.header(3, 0, 0).bytes();
        b[0] = 'P';
        b[1] = 'K';
        assertContains(reject(MemorySegment.ofArray(b)), "not a GGUF file", "50 4b 55 46");
    }

    @Test
    void versionOneIsRejectedWithAClearMessage() {
        assertContains(reject(GgufBytes.header(1, 0, 0)), "GGUF version 1 is not supported", "2 and 3");
    }

    @Test
    void unknownVersionIsRejected() {
        assertContains(reject(GgufBytes.header(4, 0, 0)), "GGUF version 4 is not supported");
    }

    @Test
    void bigEndianFileIsRecognisedAndRejected() {
        assertContains(reject(GgufBytes.header(Integer.reverseBytes(3), 0, 0)), "big-endian");
    }

    @Test
    void truncatedHeaderSaysWhereAndWhat() {
        byte[] b = Arrays.copyOf(GgufBytes.header(3, 0, 0).bytes(), 12);
        assertContains(reject(MemorySegment.ofArray(b)), "truncated", "the tensor count", "at byte 8",
                "ends at byte 12");
        assertContains(reject(MemorySegment.ofArray(new byte[2])), "truncated", "the magic number", "at byte 0");
    }

    @Test
    void truncatedKeyAndValueNameTheKey() {
        byte[] b = GgufBytes.header(3, 0, 1).kvU32("llama.block_count", 8).bytes();
        assertContains(reject(MemorySegment.ofArray(Arrays.copyOf(b, b.length - 2))), "truncated",
                "a uint32 of key 'llama.block_count'");
        assertContains(reject(MemorySegment.ofArray(Arrays.copyOf(b, 24 + 8 + 5))), "truncated",
                "its key of metadata entry #0", "has length 17");
    }

    @Test
    void truncatedTensorInfoNamesTheTensor() {
        byte[] b = GgufBytes.header(3, 1, 0).tensorInfo("blk.0.attn_q.weight", new long[] {4, 4}, F16, 0).bytes();
        assertContains(reject(MemorySegment.ofArray(Arrays.copyOf(b, b.length - 3))), "truncated",
                "the data offset of tensor 'blk.0.attn_q.weight'");
    }

    @Test
    void absurdTensorAndMetadataCountsAreRejectedBeforeAllocating() {
        assertContains(reject(GgufBytes.header(3, 1L << 40, 0)), "tensor count 1099511627776 is impossible");
        assertContains(reject(GgufBytes.header(3, 0, -1L)), "metadata count 18446744073709551615 is impossible");
    }

    @Test
    void absurdArrayLengthIsBoundedByTheRemainingBytes() {
        GgufBytes b = GgufBytes.header(3, 0, 1).str("tokenizer.ggml.tokens").u32(GgufValueType.ARRAY.id)
                .u32(GgufValueType.STRING.id).u64(1L << 40).zeros(64);
        assertContains(reject(b), "key 'tokenizer.ggml.tokens'", "array of 1099511627776 string elements",
                "needs at least 8,796,093,022,208 bytes", "only 64 remain");
        GgufBytes floats = GgufBytes.header(3, 0, 1).str("s").u32(GgufValueType.ARRAY.id)
                .u32(GgufValueType.FLOAT32.id).u64(5).zeros(16);
        assertContains(reject(floats), "array of 5 float32 elements", "needs at least 20 bytes");
    }

    @Test
    void absurdStringLengthIsBoundedByTheRemainingBytes() {
        GgufBytes b = GgufBytes.header(3, 0, 1).str("general.name").u32(GgufValueType.STRING.id).u64(-2L);
        assertContains(reject(b), "key 'general.name'", "has length 18446744073709551614", "only 0 bytes remain");
    }

    @Test
    void arraysNestedTooDeepAreRejected() {
        GgufBytes b = GgufBytes.header(3, 0, 1).str("deep").u32(GgufValueType.ARRAY.id);
        for (int d = 0; d < GgufParser.MAX_ARRAY_DEPTH + 1; d++) {
            b.u32(GgufValueType.ARRAY.id).u64(1);
        }
        b.u32(GgufValueType.UINT8.id).u64(0);
        assertContains(reject(b), "key 'deep'", "nested more than 8 deep");
    }

    @Test
    void tooManyDimensionsAreRejected() {
        assertContains(reject(oneTensor("t", new long[] {1, 1, 1, 1, 1}, F16, 0, 64)),
                "tensor 't' has 5 dimensions (must be 1 to 4)");
        assertContains(reject(oneTensor("t", new long[0], F16, 0, 64)), "tensor 't' has 0 dimensions");
    }

    @Test
    void zeroAndNegativeDimensionsAreRejected() {
        assertContains(reject(oneTensor("t", new long[] {8, 0}, F16, 0, 64)), "tensor 't' has dimension 1 = 0");
        assertContains(reject(oneTensor("t", new long[] {-8}, F16, 0, 64)),
                "tensor 't' has dimension 0 = 18446744073709551608 (must be positive)");
    }

    @Test
    void elementCountOverflowIsRejected() {
        long big = 1L << 32;
        assertContains(reject(oneTensor("t", new long[] {big, big, big}, F16, 0, 64)),
                "tensor 't' has shape [4294967296, 4294967296, 4294967296]", "element count overflows");
        assertContains(reject(oneTensor("t", new long[] {1L << 62, 1}, GgmlType.F32.id, 0, 64)),
                "byte size overflows");
    }

    @Test
    void unknownTensorTypeIdIsRejected() {
        assertContains(reject(oneTensor("blk.0.attn_q.weight", new long[] {4}, 77, 0, 64)),
                "tensor 'blk.0.attn_q.weight' has unknown type id 77");
    }

    @Test
    void rowLengthMustBeAWholeNumberOfBlocks() {
        assertContains(reject(oneTensor("t", new long[] {48, 2}, GgmlType.Q4_0.id, 0, 64)),
                "tensor 't' has rows of 48 values, which is not a multiple of the Q4_0 block size 32");
    }

    @Test
    void misalignedTensorOffsetIsRejected() {
        GgufBytes b = GgufBytes.header(3, 2, 0)
                .tensorInfo("a", new long[] {4}, F16, 0)
                .tensorInfo("b", new long[] {4}, F16, 16)
                .padTo(32).zeros(64);
        assertContains(reject(b), "tensor 'b' has data offset 16, which is not a multiple of the alignment 32");
    }

    @Test
    void tensorDataPastTheEndOfTheFileIsRejected() {
        GgufBytes b = oneTensor("blk.3.attn_q.weight", new long[] {64, 2}, F16, 0, 200);
        int dataStart = b.size() - 200;
        assertContains(reject(b), "tensor 'blk.3.attn_q.weight': data ends at byte " + (dataStart + 256)
                + " but the file has " + (dataStart + 200) + " bytes");
        assertContains(reject(oneTensor("t", new long[] {4}, F16, 1L << 40, 64)),
                "tensor 't' has data offset 1099511627776, past the end of the file");
    }

    @Test
    void overlappingTensorsAreRejected() {
        GgufBytes b = GgufBytes.header(3, 2, 0)
                .tensorInfo("a", new long[] {32}, F16, 0)
                .tensorInfo("b", new long[] {32}, F16, 32)
                .padTo(32).zeros(128);
        assertContains(reject(b), "tensors 'a'", "and 'b'", "overlap");
    }

    @Test
    void duplicateTensorNamesAreRejected() {
        GgufBytes b = GgufBytes.header(3, 2, 0)
                .tensorInfo("a", new long[] {4}, F16, 0)
                .tensorInfo("a", new long[] {4}, F16, 32)
                .padTo(32).zeros(64);
        assertContains(reject(b), "tensor 'a' appears twice (tensor infos #0 and #1)");
    }

    @Test
    void duplicateKeysAreRejected() {
        assertContains(reject(GgufBytes.header(3, 0, 2).kvU32("k", 1).kvString("k", "x")), "key 'k' appears twice");
    }

    @Test
    void invalidUtf8IsRejectedInKeysValuesAndTensorNames() {
        byte[] bad = {'a', (byte) 0xC3, '('};
        assertContains(reject(GgufBytes.header(3, 0, 1).str(bad).u32(GgufValueType.UINT8.id).u8(1)),
                "its key of metadata entry #0 at byte 24 is not valid UTF-8", "bad byte 0xc3 at byte 33");
        assertContains(reject(GgufBytes.header(3, 0, 1).str("k").u32(GgufValueType.STRING.id)
                .str(new byte[] {(byte) 0xED, (byte) 0xA0, (byte) 0x80})), "a string of key 'k'", "not valid UTF-8");
        GgufBytes t = GgufBytes.header(3, 1, 0).str(new byte[] {(byte) 0xFF}).u32(1).u64(4).u32(F16).u64(0)
                .padTo(32).zeros(8);
        assertContains(reject(t), "the tensor name of tensor info #0", "not valid UTF-8");
    }

    @Test
    void alignmentKeyMustBeANonzeroPowerOfTwoUint32() {
        GgufBytes wrongType = GgufBytes.header(3, 0, 1).str("general.alignment").u32(GgufValueType.INT32.id).u32(32);
        assertContains(reject(wrongType), "key 'general.alignment' is an int32, expected a uint32");
        assertContains(reject(GgufBytes.header(3, 0, 1).kvU32("general.alignment", 48)),
                "key 'general.alignment' is 48, which is not a nonzero power of two");
        assertContains(reject(GgufBytes.header(3, 0, 1).kvU32("general.alignment", 0)), "is 0, which is not");
        // a power of two past an int: it used to open as alignment -2147483648
        assertContains(reject(GgufBytes.header(3, 0, 1).kvU32("general.alignment", 1L << 31)),
                "key 'general.alignment' is 2147483648, above the largest alignment taken (1073741824)");
    }

    @Test
    void unknownValueTypesAndBadBoolsAreRejected() {
        assertContains(reject(GgufBytes.header(3, 0, 1).str("k").u32(13).u32(0)), "key 'k' has unknown value type 13");
        assertContains(reject(GgufBytes.header(3, 0, 1).str("k").u32(GgufValueType.ARRAY.id).u32(99).u64(0)),
                "key 'k' has an array of unknown element type 99");
        assertContains(reject(GgufBytes.header(3, 0, 1).str("k").u32(GgufValueType.BOOL.id).u8(2)),
                "key 'k' has a bool of value 2");
    }

    @Test
    void missingTensorAndForeignTensorInfoAreNamed() {
        try (Arena arena = Arena.ofConfined(); GgufFile f = GgufFile.of(new GgufWriter()
                .addTensor("x", GgmlType.F32, new long[] {2}, new byte[8]).writeToSegment(arena), FILE)) {
            GgufException e = assertThrows(GgufException.class, () -> f.requireTensor("blk.0.attn_q.weight"));
            assertEquals("GGUF bad.gguf: tensor 'blk.0.attn_q.weight' is missing", e.getMessage());
            GgufTensorInfo foreign = new GgufTensorInfo("x", GgmlType.F32, new long[] {2}, 0, 8);
            assertContains(assertThrows(GgufException.class, () -> f.data(foreign)).getMessage(),
                    "does not belong to this file");
        }
    }

    @Test
    void openingAMissingFileOrADirectorySaysSo() {
        Path missing = dir.resolve("nope.gguf");
        assertEquals("GGUF " + missing + ": no such file",
                assertThrows(GgufException.class, () -> GgufFile.open(missing)).getMessage());
        assertContains(assertThrows(GgufException.class, () -> GgufFile.open(dir)).getMessage(), "is a directory");
    }

    @Test
    void openingANamedPipeSaysSoInsteadOfWaitingForAWriter() throws Exception {
        Path fifo = dir.resolve("pipe.gguf");
        Process p = new ProcessBuilder("mkfifo", fifo.toString()).start();
        Assumptions.assumeTrue(p.waitFor() == 0, "mkfifo is not available here");
        assertContains(assertTimeoutPreemptively(Duration.ofSeconds(10),
                () -> assertThrows(GgufException.class, () -> GgufFile.open(fifo))).getMessage(),
                "is not a regular file");
    }

    @Test
    void openingADamagedFileNamesItsPath() throws Exception {
        Path p = dir.resolve("empty.gguf");
        Files.write(p, new byte[0]);
        assertContains(assertThrows(GgufException.class, () -> GgufFile.open(p)).getMessage(),
                "GGUF " + p + ": truncated");
    }

    // ---- the writer refuses what the reader would reject

    @Test
    void writerRejectsTensorDataOfTheWrongSize() {
        GgufException e = assertThrows(GgufException.class,
                () -> new GgufWriter().addTensor("t", GgmlType.F16, new long[] {4, 2}, new byte[15]));
        assertContains(e.getMessage(), "tensor 't' F16 [4, 2]", "has 15 bytes of data, expected 16");
    }

    @Test
    void writerRejectsBadShapesAndDuplicates() {
        GgufWriter w = new GgufWriter().addTensor("t", GgmlType.F32, new long[] {1}, new byte[4]);
        assertContains(assertThrows(GgufException.class,
                () -> w.addTensor("t", GgmlType.F32, new long[] {1}, new byte[4])).getMessage(), "added twice");
        assertContains(assertThrows(GgufException.class,
                () -> w.addTensor("q", GgmlType.Q8_0, new long[] {16}, new byte[17])).getMessage(),
                "not a multiple of the block size 32");
        assertContains(assertThrows(GgufException.class,
                () -> w.addTensor("z", GgmlType.F32, new long[] {0}, new byte[0])).getMessage(), "must be positive");
    }

    @Test
    void writerRejectsValuesThatDoNotFitTheirType() {
        assertContains(assertThrows(GgufException.class, () -> new GgufWriter().putU8("k", 256)).getMessage(),
                "key 'k'", "256 does not fit a uint8");
        assertContains(assertThrows(GgufException.class, () -> new GgufWriter().putU32("k", -1)).getMessage(),
                "does not fit a uint32");
        assertContains(assertThrows(GgufException.class,
                () -> new GgufWriter().putArray("k", GgufValueType.INT8, List.of(1, 200))).getMessage(),
                "key 'k'", "element 1", "200 does not fit an int8");
        assertContains(assertThrows(GgufException.class,
                () -> new GgufWriter().putString("k", "lone \ud800")).getMessage(), "not valid Unicode");
        assertContains(assertThrows(GgufException.class,
                () -> new GgufWriter().putU32("general.alignment", 24)).getMessage(), "not a nonzero power of two");
        assertContains(assertThrows(GgufException.class,
                () -> new GgufWriter().putI32("general.alignment", 32)).getMessage(), "expected a uint32");
        // what the reader would refuse: an alignment past 2^30, a key or tensor name past 64 KiB
        assertContains(assertThrows(GgufException.class,
                () -> new GgufWriter().putU32("general.alignment", 1L << 31)).getMessage(), "up to 1073741824");
        String longName = "k".repeat((int) GgufParser.MAX_NAME_BYTES + 1);
        assertContains(assertThrows(GgufException.class, () -> new GgufWriter().putU32(longName, 1)).getMessage(),
                "a key is longer than 65536 bytes");
        GgufWriter w = new GgufWriter();
        assertContains(assertThrows(GgufException.class, () -> w.addTensor(longName, GgmlType.F32, new long[] {1},
                new byte[4])).getMessage(), "the name is longer than 65536 bytes");
        w.addTensor(longName.substring(1), GgmlType.F32, new long[] {1}, new byte[4]);   // 64 KiB exactly: taken
    }

    @Test
    void writerRejectsArraysNestedDeeperThanTheReaderAccepts() {
        GgufArray deep = new GgufArray(GgufValueType.UINT8, new byte[0]);
        for (int d = 0; d < GgufParser.MAX_ARRAY_DEPTH; d++) {
            deep = new GgufArray(GgufValueType.ARRAY, List.of(deep));
        }
        GgufArray tooDeep = deep;
        assertContains(assertThrows(GgufException.class, () -> new GgufWriter().putArray("k", tooDeep)).getMessage(),
                "nests arrays more than 8 deep");
    }
}
