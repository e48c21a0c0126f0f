package dev.kvant.gguf;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Reads and validates the header of a GGUF image: every count, length, type, shape and offset is checked against the
 * bytes actually present before it is used, so a damaged or hostile file ends in one {@link GgufException} that says
 * what was being read and where, never in an out-of-memory error, a hang or a stray runtime exception.
 *
 * <p>Memory is bounded by the file: a count is accepted only if the remaining bytes could hold that many elements of
 * the smallest encoding, and lists are not pre-sized from counts that have not been proven.
 */
final class GgufParser {
    static final int MAGIC = 0x46554747; // "GGUF" read as a little-endian u32
    static final int DEFAULT_ALIGNMENT = 32;
    /** The largest general.alignment taken, 1 GiB (files use 32; the parser keeps the alignment in an int). */
    static final long MAX_ALIGNMENT = 1L << 30;
    static final String ALIGNMENT_KEY = "general.alignment";
    static final int MAX_DIMS = 4;
    /** Arrays of arrays are legal; this bounds the recursion a hostile file can ask for. */
    static final int MAX_ARRAY_DEPTH = 8;
    /**
     * Far above any real metadata (the largest vocabularies are ~260k tokens, chat templates ~100 KB), low enough
     * that a corrupted length inside a multi-gigabyte model cannot ask for gigabytes of heap.
     */
    static final long MAX_ARRAY_LENGTH = 1L << 24;
    /**
     * The most keys, strings, nested arrays and tensor infos one header may hold, all together: each is an object of
     * tens of bytes in memory for as few as 8 bytes of file, so a count bounded by the file alone could still ask for
     * many times its size in heap. Real files hold about a million (a 256K vocabulary and its merges).
     */
    static final long MAX_HEADER_OBJECTS = 1L << 23;
    /**
     * The most tensor infos a header may hold (real models hold hundreds to a few thousand): each becomes several
     * objects and copies, a few hundred bytes of heap for 32 bytes of file.
     */
    static final long MAX_TENSORS = 1L << 18;
    /**
     * The longest string value (converters embed whole tokenizer.json files of a few MB; chat templates are ~100 KB):
     * decoding one costs about three times its length in heap.
     */
    static final long MAX_STRING_BYTES = 1L << 26;
    /** The longest key or tensor name (ggml keeps tensor names in 64 bytes). */
    static final long MAX_NAME_BYTES = 1L << 16;
    /**
     * The most bytes of file that metadata strings and arrays of numbers may hold, all together: each array and string
     * is bounded above, but a hostile header of many of them is bounded only by the file (gigabytes), and decoding
     * them costs one to three times their bytes in heap. Real metadata holds a few tens of MB at most (a 256K
     * vocabulary with its scores and merges, an embedded tokenizer.json).
     */
    static final long MAX_METADATA_BYTES = 1L << 28;
    /** Smallest tensor info: name length, n_dims, one dimension, type, offset. */
    private static final int MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8;
    /** Smallest key/value: key length, value type, a one-byte value. */
    private static final int MIN_KV_BYTES = 8 + 4 + 1;

    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfShort U16 = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfFloat F32 = ValueLayout.JAVA_FLOAT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfDouble F64 =
            ValueLayout.JAVA_DOUBLE_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    /** What a successful parse found. */
    record Header(int version, Map<String, GgufValue> metadata, List<GgufTensorInfo> tensors, int alignment,
                  long dataOffset) {
    }

    private final String name;
    private final MemorySegment bytes;
    private final long size;
    private final CharsetDecoder utf8 = StandardCharsets.UTF_8.newDecoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT);
    private long pos;
    private long objects;
    /** Bytes of strings and number arrays decoded so far, see {@link #MAX_METADATA_BYTES}. */
    private long metadataBytes;
    /** Where in the file we are, for messages: "metadata entry #3", "key 'x'", "tensor 'y'". */
    private String context = "the header";

    private final long maxObjects;
    private final long maxMetadataBytes;

    private GgufParser(String name, MemorySegment bytes, long maxObjects, long maxMetadataBytes) {
        this.name = name;
        this.bytes = bytes;
        this.size = bytes.byteSize();
        this.maxObjects = maxObjects;
        this.maxMetadataBytes = maxMetadataBytes;
    }

    static Header parse(String name, MemorySegment bytes) {
        return parse(name, bytes, MAX_HEADER_OBJECTS, MAX_METADATA_BYTES);
    }

    /** With other budgets of keys, strings, arrays and tensor infos, and of their bytes (tests). */
    static Header parse(String name, MemorySegment bytes, long maxObjects, long maxMetadataBytes) {
        return new GgufParser(name, bytes, maxObjects, maxMetadataBytes).header();
    }

    private Header header() {
        if (size >= 4 && bytes.get(U32, 0) != MAGIC) {
            byte[] m = bytes.asSlice(0, 4).toArray(ValueLayout.JAVA_BYTE);
            throw fail("not a GGUF file: it starts with bytes %s, expected 47 47 55 46 (\"GGUF\")", hex(m));
        }
        u32("the magic number");
        int version = u32("the version");
        if (version != 2 && version != 3) {
            int swapped = Integer.reverseBytes(version);
            if (swapped >= 1 && swapped <= 3) {
                throw fail("is a big-endian GGUF file (version %d); only little-endian files are supported", swapped);
            }
            if (version == 1) {
                throw fail("GGUF version 1 is not supported (only versions 2 and 3); convert the model again with"
                        + " a current converter");
            }
            throw fail("GGUF version %s is not supported (only versions 2 and 3)", Integer.toUnsignedString(version));
        }
        long tensorCount = u64("the tensor count");
        long kvCount = u64("the metadata count");
        checkCount(tensorCount, MIN_TENSOR_INFO_BYTES, "tensor count", "tensor infos");
        if (tensorCount > MAX_TENSORS) {
            throw fail("the tensor count %,d is more than the limit of %,d", tensorCount, MAX_TENSORS);
        }
        checkCount(kvCount, MIN_KV_BYTES, "metadata count", "key/value entries");

        Map<String, GgufValue> metadata = new LinkedHashMap<>();
        for (long i = 0; i < kvCount; i++) {
            context = "metadata entry #" + i;
            counted();
            String key = string("its key", MAX_NAME_BYTES);
            context = "key '" + key + "'";
            int typeId = u32("the value type");
            GgufValueType type = GgufValueType.byId(Integer.toUnsignedLong(typeId));
            if (type == null) {
                throw fail("key '%s' has unknown value type %s", key, Integer.toUnsignedString(typeId));
            }
            GgufValue value = value(type, 0);
            if (metadata.putIfAbsent(key, value) != null) {
                throw fail("key '%s' appears twice", key);
            }
        }
        int alignment = alignment(metadata.get(ALIGNMENT_KEY));

        // Offsets are relative to the data section until its start is known.
        List<GgufTensorInfo> relative = new ArrayList<>();
        Map<String, Long> seen = new HashMap<>();
        for (long i = 0; i < tensorCount; i++) {
            context = "tensor info #" + i;
            counted();
            String tensorName = string("the tensor name", MAX_NAME_BYTES);
            context = "tensor '" + tensorName + "'";
            Long previous = seen.putIfAbsent(tensorName, i);
            if (previous != null) {
                throw fail("tensor '%s' appears twice (tensor infos #%d and #%d)", tensorName, previous, i);
            }
            int nDims = u32("the dimension count");
            if (nDims < 1 || nDims > MAX_DIMS) {
                throw fail("tensor '%s' has %s dimensions (must be 1 to %d)", tensorName,
                        Integer.toUnsignedString(nDims), MAX_DIMS);
            }
            long[] shape = new long[nDims];
            for (int d = 0; d < nDims; d++) {
                shape[d] = u64("dimension " + d);
                if (shape[d] <= 0) {
                    throw fail("tensor '%s' has dimension %d = %s (must be positive)", tensorName, d,
                            Long.toUnsignedString(shape[d]));
                }
            }
            int typeId = u32("the tensor type");
            GgmlType type = GgmlType.byId(Integer.toUnsignedLong(typeId));
            if (type == null) {
                throw fail("tensor '%s' has unknown type id %s", tensorName, Integer.toUnsignedString(typeId));
            }
            long offset = u64("the data offset");
            relative.add(new GgufTensorInfo(tensorName, type, shape, offset, byteSize(tensorName, type, shape)));
        }
        context = "the tensor infos";
        long dataOffset = alignUp(pos, alignment);

        List<GgufTensorInfo> tensors = new ArrayList<>(relative.size());
        for (GgufTensorInfo t : relative) {
            tensors.add(place(t, alignment, dataOffset));
        }
        checkNoOverlap(tensors);
        return new Header(version, metadata, List.copyOf(tensors), alignment, dataOffset);
    }

    private void checkCount(long count, int minBytes, String what, String things) {
        long remaining = size - pos;
        if (count < 0 || count > remaining / minBytes) {
            throw fail("%s %s is impossible: the remaining %,d bytes hold at most %,d %s", what,
                    Long.toUnsignedString(count), remaining, remaining / minBytes, things);
        }
    }

    private int alignment(GgufValue v) {
        if (v == null) {
            return DEFAULT_ALIGNMENT;
        }
        if (v.type() != GgufValueType.UINT32) {
            throw fail("key '%s' is %s, expected a uint32", ALIGNMENT_KEY, v.type().withArticle());
        }
        long a = (Long) v.value();
        if (a == 0 || Long.bitCount(a) != 1) {
            throw fail("key '%s' is %d, which is not a nonzero power of two", ALIGNMENT_KEY, a);
        }
        if (a > MAX_ALIGNMENT) {
            throw fail("key '%s' is %d, above the largest alignment taken (%d)", ALIGNMENT_KEY, a, MAX_ALIGNMENT);
        }
        return (int) a;
    }

    private long byteSize(String tensorName, GgmlType type, long[] shape) {
        long rows = 1;
        try {
            for (int d = 1; d < shape.length; d++) {
                rows = Math.multiplyExact(rows, shape[d]);
            }
            Math.multiplyExact(rows, shape[0]);
        } catch (ArithmeticException e) {
            throw fail("tensor '%s' has shape %s: its element count overflows 64 bits", tensorName,
                    Arrays.toString(shape));
        }
        if (shape[0] % type.blockSize != 0) {
            throw fail("tensor '%s' has rows of %,d values, which is not a multiple of the %s block size %d",
                    tensorName, shape[0], type, type.blockSize);
        }
        try {
            return Math.multiplyExact(type.rowBytes(shape[0]), rows);
        } catch (ArithmeticException e) {
            throw fail("tensor '%s' has shape %s: its byte size overflows 64 bits", tensorName,
                    Arrays.toString(shape));
        }
    }

    private GgufTensorInfo place(GgufTensorInfo t, int alignment, long dataOffset) {
        long relative = t.offset();
        if (relative < 0 || relative > size) {
            throw fail("tensor '%s' has data offset %s, past the end of the file (%,d bytes)", t.name(),
                    Long.toUnsignedString(relative), size);
        }
        if (relative % alignment != 0) {
            throw fail("tensor '%s' has data offset %,d, which is not a multiple of the alignment %d", t.name(),
                    relative, alignment);
        }
        long start = dataOffset + relative;
        if (start > size || t.byteSize() > size - start) {
            BigInteger end = BigInteger.valueOf(start).add(BigInteger.valueOf(t.byteSize()));
            throw fail("tensor '%s': data ends at byte %,d but the file has %,d bytes", t.name(), end, size);
        }
        return new GgufTensorInfo(t.name(), t.type(), t.shape(), start, t.byteSize());
    }

    private void checkNoOverlap(List<GgufTensorInfo> tensors) {
        List<GgufTensorInfo> byOffset = new ArrayList<>(tensors);
        byOffset.sort(Comparator.comparingLong(GgufTensorInfo::offset));
        for (int i = 1; i < byOffset.size(); i++) {
            GgufTensorInfo a = byOffset.get(i - 1);
            GgufTensorInfo b = byOffset.get(i);
            if (a.offset() + a.byteSize() > b.offset()) {
                throw fail("tensors '%s' (bytes %,d to %,d) and '%s' (bytes %,d to %,d) overlap", a.name(),
                        a.offset(), a.offset() + a.byteSize(), b.name(), b.offset(), b.offset() + b.byteSize());
            }
        }
    }

    static long alignUp(long x, long alignment) {
        return (x + alignment - 1) & -alignment;
    }

    // ---- values

    private GgufValue value(GgufValueType type, int depth) {
        Object v = switch (type) {
            case UINT8 -> Byte.toUnsignedInt(u8("a uint8"));
            case INT8 -> (int) u8("an int8");
            case UINT16 -> Short.toUnsignedInt(u16("a uint16"));
            case INT16 -> (int) u16("an int16");
            case UINT32 -> Integer.toUnsignedLong(u32("a uint32"));
            case INT32 -> u32("an int32");
            case UINT64 -> u64("a uint64");
            case INT64 -> u64("an int64");
            case FLOAT32 -> Float.intBitsToFloat(u32("a float32"));
            case FLOAT64 -> Double.longBitsToDouble(u64("a float64"));
            case BOOL -> bool(u8("a bool"), pos - 1);
            case STRING -> string("a string", MAX_STRING_BYTES);
            case ARRAY -> array(depth + 1);
        };
        return new GgufValue(type, v);
    }

    private boolean bool(byte b, long at) {
        if (b != 0 && b != 1) {
            throw fail("%s has a bool of value %d at byte %,d (must be 0 or 1)", context, b & 0xFF, at);
        }
        return b == 1;
    }

    private GgufArray array(int depth) {
        long start = pos;
        if (depth > MAX_ARRAY_DEPTH) {
            throw fail("%s has arrays nested more than %d deep (at byte %,d)", context, MAX_ARRAY_DEPTH, start);
        }
        int typeId = u32("an array element type");
        GgufValueType type = GgufValueType.byId(Integer.toUnsignedLong(typeId));
        if (type == null) {
            throw fail("%s has an array of unknown element type %s at byte %,d", context,
                    Integer.toUnsignedString(typeId), start);
        }
        long count = u64("an array length");
        long remaining = size - pos;
        if (count < 0 || count > remaining / type.minBytes) {
            BigInteger need = new BigInteger(Long.toUnsignedString(count)).multiply(BigInteger.valueOf(type.minBytes));
            throw fail("%s has an array of %s %s elements at byte %,d that needs at least %,d bytes, but only %,d"
                    + " remain", context, Long.toUnsignedString(count), type, start, need, remaining);
        }
        if (count > MAX_ARRAY_LENGTH) {
            throw fail("%s has an array of %,d elements at byte %,d, more than the limit of %,d", context, count,
                    start, MAX_ARRAY_LENGTH);
        }
        int n = (int) count;
        long at = pos;
        if (type != GgufValueType.STRING && type != GgufValueType.ARRAY) {
            decoded(count * type.minBytes, start);
        }
        Object store = switch (type) {
            case UINT8, INT8 -> {
                byte[] a = new byte[n];
                MemorySegment.copy(bytes, ValueLayout.JAVA_BYTE, at, a, 0, n);
                yield a;
            }
            case UINT16, INT16 -> {
                short[] a = new short[n];
                MemorySegment.copy(bytes, U16, at, a, 0, n);
                yield a;
            }
            case UINT32, INT32 -> {
                int[] a = new int[n];
                MemorySegment.copy(bytes, U32, at, a, 0, n);
                yield a;
            }
            case UINT64, INT64 -> {
                long[] a = new long[n];
                MemorySegment.copy(bytes, U64, at, a, 0, n);
                yield a;
            }
            case FLOAT32 -> {
                float[] a = new float[n];
                MemorySegment.copy(bytes, F32, at, a, 0, n);
                yield a;
            }
            case FLOAT64 -> {
                double[] a = new double[n];
                MemorySegment.copy(bytes, F64, at, a, 0, n);
                yield a;
            }
            case BOOL -> {
                boolean[] a = new boolean[n];
                for (int i = 0; i < n; i++) {
                    a[i] = bool(bytes.get(ValueLayout.JAVA_BYTE, at + i), at + i);
                }
                yield a;
            }
            case STRING -> {
                List<String> a = new ArrayList<>(Math.min(n, 1024));   // grown as the strings prove themselves
                for (int i = 0; i < n; i++) {
                    counted();
                    a.add(string("an array string", MAX_STRING_BYTES));
                }
                yield a;
            }
            case ARRAY -> {
                List<GgufArray> a = new ArrayList<>(Math.min(n, 1024));
                for (int i = 0; i < n; i++) {
                    counted();
                    a.add(array(depth + 1));
                }
                yield a;
            }
        };
        if (type != GgufValueType.STRING && type != GgufValueType.ARRAY) {
            pos = at + count * type.minBytes;
        }
        return new GgufArray(type, store);
    }

    /**
     * n more bytes of strings or numbers to decode (at byte start): refused past the budget
     * ({@link #MAX_METADATA_BYTES}).
     */
    private void decoded(long n, long start) {
        metadataBytes += n;
        if (metadataBytes > maxMetadataBytes) {
            throw fail("the header's strings and arrays hold more than %,d bytes (%s, at byte %,d): not a model's"
                    + " metadata", maxMetadataBytes, context, start);
        }
    }

    /** One more key, string, nested array or tensor info: refused past {@link #MAX_HEADER_OBJECTS}. */
    private void counted() {
        if (++objects > maxObjects) {
            throw fail("the header holds more than %,d keys, strings, arrays and tensor infos (%s, at byte %,d)",
                    maxObjects, context, pos);
        }
    }

    // ---- primitives; each checks that its bytes exist

    private void need(long n, String what) {
        if (n > size - pos) {
            throw fail("truncated: reading %s of %s at byte %,d needs %,d bytes, but the file ends at byte %,d",
                    what, context, pos, n, size);
        }
    }

    private byte u8(String what) {
        need(1, what);
        return bytes.get(ValueLayout.JAVA_BYTE, pos++);
    }

    private short u16(String what) {
        need(2, what);
        short v = bytes.get(U16, pos);
        pos += 2;
        return v;
    }

    private int u32(String what) {
        need(4, what);
        int v = bytes.get(U32, pos);
        pos += 4;
        return v;
    }

    private long u64(String what) {
        need(8, what);
        long v = bytes.get(U64, pos);
        pos += 8;
        return v;
    }

    /** A u64 length, at most {@code limit}, and that many bytes of strict UTF-8. */
    private String string(String what, long limit) {
        long start = pos;
        long length = u64("the length of " + what);
        long remaining = size - pos;
        if (length < 0 || length > remaining) {
            throw fail("truncated: %s of %s at byte %,d has length %s, but only %,d bytes remain", what, context,
                    start, Long.toUnsignedString(length), remaining);
        }
        if (length > limit) {
            throw fail("%s of %s at byte %,d has length %,d, more than the limit of %,d", what, context, start,
                    length, limit);
        }
        decoded(length, start);
        byte[] b = bytes.asSlice(pos, length).toArray(ValueLayout.JAVA_BYTE);
        pos += length;
        boolean ascii = true;
        for (byte x : b) {
            if (x < 0) {
                ascii = false;
                break;
            }
        }
        if (ascii) {
            return new String(b, StandardCharsets.ISO_8859_1);
        }
        ByteBuffer in = ByteBuffer.wrap(b);
        try {
            return utf8.decode(in).toString();
        } catch (CharacterCodingException e) {
            int bad = Math.min(in.position(), b.length - 1);
            throw fail("%s of %s at byte %,d is not valid UTF-8 (bad byte 0x%02x at byte %,d)", what, context, start,
                    b[bad] & 0xFF, start + 8 + bad);
        }
    }

    private static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) {
            s.append(s.isEmpty() ? "" : " ").append(String.format("%02x", x & 0xFF));
        }
        return s.toString();
    }

    private GgufException fail(String format, Object... args) {
        return new GgufException("GGUF " + name + ": " + String.format(Locale.ROOT, format, args));
    }
}
