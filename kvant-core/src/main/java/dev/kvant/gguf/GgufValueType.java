package dev.kvant.gguf;

/**
 * The value types of GGUF metadata, with their ids and encoded sizes.
 *
 * <p>Java representation of a value of each type (see {@link GgufValue}): {@code UINT8, INT8, UINT16, INT16, INT32}
 * hold an {@link Integer}; {@code UINT32, INT64} hold a {@link Long}; {@code UINT64} holds a {@link Long} with the raw
 * 64 bits (read it with {@link Long#toUnsignedString}); {@code FLOAT32} a {@link Float}; {@code FLOAT64} a
 * {@link Double}; {@code BOOL} a {@link Boolean}; {@code STRING} a {@link String}; {@code ARRAY} a {@link GgufArray}.
 */
public enum GgufValueType {
    UINT8(0, 1, "uint8"),
    INT8(1, 1, "int8"),
    UINT16(2, 2, "uint16"),
    INT16(3, 2, "int16"),
    UINT32(4, 4, "uint32"),
    INT32(5, 4, "int32"),
    FLOAT32(6, 4, "float32"),
    BOOL(7, 1, "bool"),
    STRING(8, 8, "string"),
    ARRAY(9, 12, "array"),
    UINT64(10, 8, "uint64"),
    INT64(11, 8, "int64"),
    FLOAT64(12, 8, "float64");

    private static final GgufValueType[] BY_ID = values();

    /** The id stored in the file. */
    public final int id;
    /**
     * The fewest bytes one value of this type occupies: its exact size for numbers and bools, the length prefix for a
     * string, type + count for an array. A count read from the file is checked against this before anything is
     * allocated, so a hostile count cannot ask for more memory than the file could describe.
     */
    final int minBytes;
    private final String displayName;

    GgufValueType(int id, int minBytes, String displayName) {
        this.id = id;
        this.minBytes = minBytes;
        this.displayName = displayName;
    }

    /** The type with this id, or null when the id is not a GGUF value type. */
    public static GgufValueType byId(long id) {
        return id >= 0 && id < BY_ID.length ? BY_ID[(int) id] : null;
    }

    /** True for the eight integer types (bool is not an integer). */
    public boolean isInteger() {
        return switch (this) {
            case UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64 -> true;
            default -> false;
        };
    }

    public boolean isFloat() {
        return this == FLOAT32 || this == FLOAT64;
    }

    /** The name the GGUF specification uses, e.g. {@code uint32}. */
    public String displayName() {
        return displayName;
    }

    /** "a uint32", "an int8", "an array": for messages. */
    String withArticle() {
        char c = displayName.charAt(0);
        return (c == 'a' || c == 'i' ? "an " : "a ") + displayName;
    }

    @Override
    public String toString() {
        return displayName;
    }
}
