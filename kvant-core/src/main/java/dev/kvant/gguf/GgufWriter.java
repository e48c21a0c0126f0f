package dev.kvant.gguf;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetEncoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Builds a GGUF file: metadata in insertion order, then tensors in insertion order, each at the next multiple of
 * the alignment ({@code general.alignment} if put, else 32). Everything the writer accepts, {@link GgufFile} reads
 * back; invalid input (a value that does not fit its type, a duplicate tensor, data of the wrong size, a string that
 * is not valid Unicode) is a {@link GgufException} at the call that supplied it.
 *
 * <p>Tensor data is held by reference, not copied: keep it alive and unchanged until the file is written.
 */
public final class GgufWriter {
    private static final int COPY_CHUNK = 1 << 22;

    private final int version;
    private final Map<String, GgufValue> metadata = new LinkedHashMap<>();
    private final List<Tensor> tensors = new ArrayList<>();
    private final Set<String> tensorNames = new HashSet<>();
    private final CharsetEncoder utf8 = StandardCharsets.UTF_8.newEncoder()
            .onMalformedInput(CodingErrorAction.REPORT)
            .onUnmappableCharacter(CodingErrorAction.REPORT);
    private byte[] header; // encoded header incl. padding to the data section; null when stale

    private record Tensor(String name, byte[] encodedName, GgmlType type, long[] shape, MemorySegment data) {
    }

    /** A version 3 writer. */
    public GgufWriter() {
        this(3);
    }

    /** A writer for GGUF version 2 or 3 (the little-endian layouts are identical; only the number differs). */
    public GgufWriter(int version) {
        if (version != 2 && version != 3) {
            throw new GgufException("GGUF writer: version " + version + " is not supported (only 2 and 3)");
        }
        this.version = version;
    }

    // ---- metadata. Putting a key again replaces its value and keeps its position.

    /** Leaves a key out (nothing if it is not there): a copy of a file without one of its keys. */
    public GgufWriter remove(String key) {
        if (metadata.remove(key) != null) {
            header = null;
        }
        return this;
    }

    /** Puts any value; the generic form behind the typed puts, handy for copying metadata from a {@link GgufFile}. */
    public GgufWriter put(String key, GgufValue value) {
        if (key == null || value == null) {
            throw new GgufException("GGUF writer: null key or value (key " + key + ")");
        }
        if (encode(key, "key").length > GgufParser.MAX_NAME_BYTES) { // encode rejects keys that are not valid Unicode
            throw new GgufException("GGUF writer: a key is longer than " + GgufParser.MAX_NAME_BYTES + " bytes");
        }
        check(key, value.value(), 0);
        if (key.equals(GgufParser.ALIGNMENT_KEY)) {
            if (value.type() != GgufValueType.UINT32) {
                throw error(key, "is " + value.type().withArticle() + ", expected a uint32");
            }
            long a = (Long) value.value();
            if (a == 0 || Long.bitCount(a) != 1 || a > GgufParser.MAX_ALIGNMENT) {
                throw error(key, "is " + a + ", which is not a nonzero power of two up to " + GgufParser.MAX_ALIGNMENT);
            }
        }
        metadata.put(key, value);
        header = null;
        return this;
    }

    public GgufWriter putString(String key, String value) {
        return typed(key, GgufValueType.STRING, value);
    }

    public GgufWriter putU8(String key, int value) {
        return typed(key, GgufValueType.UINT8, value);
    }

    public GgufWriter putI8(String key, int value) {
        return typed(key, GgufValueType.INT8, value);
    }

    public GgufWriter putU16(String key, int value) {
        return typed(key, GgufValueType.UINT16, value);
    }

    public GgufWriter putI16(String key, int value) {
        return typed(key, GgufValueType.INT16, value);
    }

    public GgufWriter putU32(String key, long value) {
        return typed(key, GgufValueType.UINT32, value);
    }

    public GgufWriter putI32(String key, int value) {
        return typed(key, GgufValueType.INT32, value);
    }

    /** {@code value} is taken as the raw 64 bits of the unsigned number. */
    public GgufWriter putU64(String key, long value) {
        return typed(key, GgufValueType.UINT64, value);
    }

    public GgufWriter putI64(String key, long value) {
        return typed(key, GgufValueType.INT64, value);
    }

    public GgufWriter putF32(String key, float value) {
        return typed(key, GgufValueType.FLOAT32, value);
    }

    public GgufWriter putF64(String key, double value) {
        return typed(key, GgufValueType.FLOAT64, value);
    }

    public GgufWriter putBool(String key, boolean value) {
        return typed(key, GgufValueType.BOOL, value);
    }

    public GgufWriter putStringArray(String key, List<String> values) {
        return putArray(key, GgufValueType.STRING, values);
    }

    public GgufWriter putFloatArray(String key, float[] values) {
        return put(key, new GgufValue(GgufValueType.ARRAY, new GgufArray(GgufValueType.FLOAT32, values)));
    }

    /** An array of INT32. */
    public GgufWriter putIntArray(String key, int[] values) {
        return put(key, new GgufValue(GgufValueType.ARRAY, new GgufArray(GgufValueType.INT32, values)));
    }

    /**
     * An array of {@code elementType} from boxed elements (any integral Number for integer types, range-checked;
     * any Number for floats; Boolean; String; {@link GgufArray} for nested arrays).
     */
    public GgufWriter putArray(String key, GgufValueType elementType, List<?> values) {
        GgufArray a;
        try {
            a = GgufArray.of(elementType, values);
        } catch (IllegalArgumentException e) {
            throw error(key, e.getMessage());
        }
        return put(key, new GgufValue(GgufValueType.ARRAY, a));
    }

    public GgufWriter putArray(String key, GgufArray array) {
        return put(key, new GgufValue(GgufValueType.ARRAY, array));
    }

    private GgufWriter typed(String key, GgufValueType type, Object value) {
        try {
            return put(key, GgufValue.of(type, value));
        } catch (IllegalArgumentException | NullPointerException e) {
            throw error(key, e.getMessage());
        }
    }

    /** Rejects what the reader would reject: bad strings, over-long arrays, arrays nested too deep. */
    private void check(String key, Object value, int depth) {
        switch (value) {
            case String s -> {
                if (encode(s, "value of key '" + key + "'").length > GgufParser.MAX_STRING_BYTES) {
                    throw error(key, "holds a string longer than " + GgufParser.MAX_STRING_BYTES + " bytes");
                }
            }
            case GgufArray a -> {
                if (depth + 1 > GgufParser.MAX_ARRAY_DEPTH) {
                    throw error(key, "nests arrays more than " + GgufParser.MAX_ARRAY_DEPTH + " deep");
                }
                if (a.size() > GgufParser.MAX_ARRAY_LENGTH) {
                    throw error(key, "holds an array longer than " + GgufParser.MAX_ARRAY_LENGTH + " elements");
                }
                if (a.raw() instanceof List<?> list) {
                    for (Object o : list) {
                        check(key, o, depth + 1);
                    }
                }
            }
            default -> {
            }
        }
    }

    // ---- tensors

    /**
     * Adds a tensor; {@code shape[0]} is the row length. {@code data} must hold exactly
     * {@code type.rowBytes(shape[0]) * rows} bytes and is written as is.
     */
    public GgufWriter addTensor(String name, GgmlType type, long[] shape, MemorySegment data) {
        if (name == null || type == null || shape == null || data == null) {
            throw new GgufException("GGUF writer: addTensor needs a name, type, shape and data (tensor " + name + ")");
        }
        String what = "GGUF writer: tensor '" + name + "' " + type + " " + Arrays.toString(shape);
        if (!tensorNames.add(name)) {
            throw new GgufException("GGUF writer: tensor '" + name + "' is added twice");
        }
        try {
            byte[] encodedName = encode(name, "tensor name");
            if (encodedName.length > GgufParser.MAX_NAME_BYTES) {
                throw new GgufException(what + ": the name is longer than " + GgufParser.MAX_NAME_BYTES + " bytes");
            }
            if (shape.length < 1 || shape.length > GgufParser.MAX_DIMS) {
                throw new GgufException(what + ": needs 1 to " + GgufParser.MAX_DIMS + " dimensions");
            }
            long rows = 1;
            for (int d = 0; d < shape.length; d++) {
                if (shape[d] <= 0) {
                    throw new GgufException(what + ": dimension " + d + " must be positive");
                }
                if (d > 0) {
                    rows = Math.multiplyExact(rows, shape[d]);
                }
            }
            Math.multiplyExact(rows, shape[0]);
            long rowBytes = type.rowBytes(shape[0]);
            if (rowBytes < 0) {
                throw new GgufException(what + ": row length " + shape[0] + " is not a multiple of the block size "
                        + type.blockSize);
            }
            long expected = Math.multiplyExact(rowBytes, rows);
            if (data.byteSize() != expected) {
                throw new GgufException(what + ": has " + data.byteSize() + " bytes of data, expected " + expected);
            }
            tensors.add(new Tensor(name, encodedName, type, shape.clone(), data));
        } catch (ArithmeticException e) {
            tensorNames.remove(name);
            throw new GgufException(what + ": its size overflows 64 bits");
        } catch (GgufException e) {
            tensorNames.remove(name);
            throw e;
        }
        header = null;
        return this;
    }

    /** As {@link #addTensor(String, GgmlType, long[], MemorySegment)}; the array is not copied. */
    public GgufWriter addTensor(String name, GgmlType type, long[] shape, byte[] data) {
        return addTensor(name, type, shape, data == null ? null : MemorySegment.ofArray(data));
    }

    // ---- output

    /** The alignment of tensor data in the output. */
    public int alignment() {
        GgufValue a = metadata.get(GgufParser.ALIGNMENT_KEY);
        return a == null ? GgufParser.DEFAULT_ALIGNMENT : (int) (long) (Long) a.value();
    }

    /** Size of the file {@link #write} would produce. */
    public long byteSize() {
        long end = header().length;
        long[] offsets = dataOffsets();
        int n = tensors.size();
        return n == 0 ? end : end + offsets[n - 1] + tensors.get(n - 1).data.byteSize();
    }

    /** Writes the file, streaming tensor data from its segments (nothing is held twice). */
    public void write(Path path) {
        byte[] h = header();
        long[] offsets = dataOffsets();
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.CREATE, StandardOpenOption.WRITE,
                StandardOpenOption.TRUNCATE_EXISTING)) {
            writeFully(ch, ByteBuffer.wrap(h));
            byte[] chunk = new byte[(int) Math.min(COPY_CHUNK, Math.max(maxTensorBytes(), alignment()))];
            long at = 0;
            for (int i = 0; i < tensors.size(); i++) {
                MemorySegment data = tensors.get(i).data;
                writeFully(ch, ByteBuffer.wrap(new byte[(int) (offsets[i] - at)]));
                for (long o = 0; o < data.byteSize(); o += chunk.length) {
                    int n = (int) Math.min(chunk.length, data.byteSize() - o);
                    MemorySegment.copy(data, ValueLayout.JAVA_BYTE, o, chunk, 0, n);
                    writeFully(ch, ByteBuffer.wrap(chunk, 0, n));
                }
                at = offsets[i] + data.byteSize();
            }
        } catch (IOException e) {
            throw new GgufException("GGUF " + path + ": cannot write: " + e.getMessage(), e);
        }
    }

    /**
     * The file as one segment allocated from {@code arena}, written in place (no intermediate copies), ready for
     * {@link GgufFile#of}. Its address is aligned like the tensor data, so tensor slices are aligned in memory too.
     */
    public MemorySegment writeToSegment(Arena arena) {
        byte[] h = header();
        long[] offsets = dataOffsets();
        MemorySegment out = arena.allocate(byteSize(), Math.min(alignment(), 4096));
        MemorySegment.copy(MemorySegment.ofArray(h), 0, out, 0, h.length);
        long at = 0;
        for (int i = 0; i < tensors.size(); i++) {
            MemorySegment data = tensors.get(i).data;
            out.asSlice(h.length + at, offsets[i] - at).fill((byte) 0);
            MemorySegment.copy(data, 0, out, h.length + offsets[i], data.byteSize());
            at = offsets[i] + data.byteSize();
        }
        return out;
    }

    private static void writeFully(FileChannel ch, ByteBuffer b) throws IOException {
        while (b.hasRemaining()) {
            ch.write(b);
        }
    }

    private long maxTensorBytes() {
        long m = 1;
        for (Tensor t : tensors) {
            m = Math.max(m, t.data.byteSize());
        }
        return m;
    }

    /** Offset of each tensor's data relative to the data section. */
    private long[] dataOffsets() {
        long[] offsets = new long[tensors.size()];
        long at = 0;
        for (int i = 0; i < offsets.length; i++) {
            offsets[i] = GgufParser.alignUp(at, alignment());
            at = offsets[i] + tensors.get(i).data.byteSize();
        }
        return offsets;
    }

    private byte[] header() {
        if (header != null) {
            return header;
        }
        LittleEndianBytes b = new LittleEndianBytes();
        b.u32(GgufParser.MAGIC);
        b.u32(version);
        b.u64(tensors.size());
        b.u64(metadata.size());
        for (Map.Entry<String, GgufValue> e : metadata.entrySet()) {
            b.string(encode(e.getKey(), "key"));
            b.u32(e.getValue().type().id);
            value(b, e.getValue().type(), e.getValue().value());
        }
        long[] offsets = dataOffsets();
        for (int i = 0; i < offsets.length; i++) {
            Tensor t = tensors.get(i);
            b.string(t.encodedName);
            b.u32(t.shape.length);
            for (long d : t.shape) {
                b.u64(d);
            }
            b.u32(t.type.id);
            b.u64(offsets[i]);
        }
        b.zeros((int) (GgufParser.alignUp(b.size(), alignment()) - b.size()));
        header = b.toArray();
        return header;
    }

    private void value(LittleEndianBytes b, GgufValueType type, Object v) {
        switch (type) {
            case UINT8, INT8 -> b.u8((Integer) v);
            case UINT16, INT16 -> b.u16((Integer) v);
            case INT32 -> b.u32((Integer) v);
            case UINT32 -> b.u32((int) (long) (Long) v);
            case UINT64, INT64 -> b.u64((Long) v);
            case FLOAT32 -> b.u32(Float.floatToRawIntBits((Float) v));
            case FLOAT64 -> b.u64(Double.doubleToRawLongBits((Double) v));
            case BOOL -> b.u8((Boolean) v ? 1 : 0);
            case STRING -> b.string(encode((String) v, "string"));
            case ARRAY -> array(b, (GgufArray) v);
        }
    }

    private void array(LittleEndianBytes b, GgufArray a) {
        b.u32(a.elementType().id);
        b.u64(a.size());
        switch (a.raw()) {
            case byte[] x -> b.bytes(x);
            case short[] x -> {
                for (short s : x) {
                    b.u16(s);
                }
            }
            case int[] x -> {
                for (int i : x) {
                    b.u32(i);
                }
            }
            case long[] x -> {
                for (long l : x) {
                    b.u64(l);
                }
            }
            case float[] x -> {
                for (float f : x) {
                    b.u32(Float.floatToRawIntBits(f));
                }
            }
            case double[] x -> {
                for (double d : x) {
                    b.u64(Double.doubleToRawLongBits(d));
                }
            }
            case boolean[] x -> {
                for (boolean z : x) {
                    b.u8(z ? 1 : 0);
                }
            }
            case List<?> list -> {
                for (Object o : list) {
                    value(b, a.elementType(), o);
                }
            }
            default -> throw new AssertionError(a.raw());
        }
    }

    /** Strict UTF-8: a lone surrogate is an error rather than a silent '?'. */
    private byte[] encode(String s, String what) {
        boolean ascii = true;
        for (int i = 0; i < s.length() && ascii; i++) {
            ascii = s.charAt(i) < 0x80;
        }
        if (ascii) {
            return s.getBytes(StandardCharsets.ISO_8859_1);
        }
        try {
            ByteBuffer bb = utf8.encode(CharBuffer.wrap(s));
            byte[] out = new byte[bb.remaining()];
            bb.get(out);
            return out;
        } catch (CharacterCodingException e) {
            throw new GgufException("GGUF writer: " + what + " '" + s + "' is not valid Unicode (a lone surrogate)");
        }
    }

    private static GgufException error(String key, String what) {
        return new GgufException("GGUF writer: key '" + key + "' " + what);
    }

    /** A growable little-endian byte buffer for the header. */
    private static final class LittleEndianBytes {
        private byte[] buf = new byte[4096];
        private int size;

        int size() {
            return size;
        }

        private void ensure(long more) {
            if (size + more > buf.length) {
                long grown = Math.max(buf.length * 2L, size + more);
                if (grown > Integer.MAX_VALUE - 16) {
                    throw new GgufException("GGUF writer: the header exceeds 2 GB");
                }
                buf = Arrays.copyOf(buf, (int) grown);
            }
        }

        void u8(int v) {
            ensure(1);
            buf[size++] = (byte) v;
        }

        void u16(int v) {
            ensure(2);
            buf[size++] = (byte) v;
            buf[size++] = (byte) (v >>> 8);
        }

        void u32(int v) {
            ensure(4);
            for (int i = 0; i < 4; i++) {
                buf[size++] = (byte) (v >>> (8 * i));
            }
        }

        void u64(long v) {
            ensure(8);
            for (int i = 0; i < 8; i++) {
                buf[size++] = (byte) (v >>> (8 * i));
            }
        }

        void bytes(byte[] b) {
            ensure(b.length);
            System.arraycopy(b, 0, buf, size, b.length);
            size += b.length;
        }

        void string(byte[] utf8) {
            u64(utf8.length);
            bytes(utf8);
        }

        void zeros(int n) {
            ensure(n);
            size += n; // the buffer is zero beyond size: it only grows
        }

        byte[] toArray() {
            return Arrays.copyOf(buf, size);
        }
    }
}
