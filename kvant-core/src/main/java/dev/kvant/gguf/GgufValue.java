package dev.kvant.gguf;

import java.util.Objects;

/**
 * One metadata value. {@code value} holds the Java representation documented on {@link GgufValueType}: an
 * {@link Integer} for the integer types up to 32 bits signed, a {@link Long} for {@code UINT32}, {@code INT64} and
 * {@code UINT64} (raw bits), {@link Float}, {@link Double}, {@link Boolean}, {@link String}, or a {@link GgufArray}.
 * The constructor enforces that representation, including the range of the narrow integer types.
 */
public record GgufValue(GgufValueType type, Object value) {

    public GgufValue {
        Objects.requireNonNull(type, "type");
        Objects.requireNonNull(value, "value");
        if (!represents(type, value)) {
            throw new IllegalArgumentException(
                    "a " + type + " value cannot be " + value.getClass().getSimpleName() + " " + value);
        }
    }

    /**
     * The value of {@code type} for any reasonable Java object: any integral {@link Number} for an integer type
     * (range-checked; {@code UINT64} takes the raw bits of a long), any {@link Number} for a float type. Throws
     * {@link IllegalArgumentException} when it does not fit.
     */
    public static GgufValue of(GgufValueType type, Object value) {
        return new GgufValue(type, canonical(type, value));
    }

    private static boolean represents(GgufValueType type, Object v) {
        return switch (type) {
            case UINT8 -> v instanceof Integer i && i >= 0 && i <= 0xFF;
            case INT8 -> v instanceof Integer i && i >= Byte.MIN_VALUE && i <= Byte.MAX_VALUE;
            case UINT16 -> v instanceof Integer i && i >= 0 && i <= 0xFFFF;
            case INT16 -> v instanceof Integer i && i >= Short.MIN_VALUE && i <= Short.MAX_VALUE;
            case INT32 -> v instanceof Integer;
            case UINT32 -> v instanceof Long l && l >= 0 && l <= 0xFFFF_FFFFL;
            case INT64, UINT64 -> v instanceof Long;
            case FLOAT32 -> v instanceof Float;
            case FLOAT64 -> v instanceof Double;
            case BOOL -> v instanceof Boolean;
            case STRING -> v instanceof String;
            case ARRAY -> v instanceof GgufArray;
        };
    }

    /** Converts {@code v} to the representation of {@code type}, or throws IllegalArgumentException saying why. */
    static Object canonical(GgufValueType type, Object v) {
        Objects.requireNonNull(v, "value");
        if (type.isInteger()) {
            if (!(v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte)) {
                throw new IllegalArgumentException("a " + type + " value cannot be " + describe(v));
            }
            long x = ((Number) v).longValue();
            Object c = switch (type) {
                case UINT32 -> x;
                case INT64, UINT64 -> x;
                default -> x >= Integer.MIN_VALUE && x <= Integer.MAX_VALUE ? (Object) (int) x : null;
            };
            if (c == null || !represents(type, c)) {
                throw new IllegalArgumentException(x + " does not fit " + type.withArticle());
            }
            return c;
        }
        Object c = switch (type) {
            case FLOAT32 -> v instanceof Number n ? (Object) n.floatValue() : null;
            case FLOAT64 -> v instanceof Number n ? (Object) n.doubleValue() : null;
            default -> v;
        };
        if (c == null || !represents(type, c)) {
            throw new IllegalArgumentException("a " + type + " value cannot be " + describe(v));
        }
        return c;
    }

    private static String describe(Object v) {
        return v.getClass().getSimpleName() + " " + v;
    }

    /** The value as text: numbers as written (uint64 unsigned), strings quoted, arrays summarised. */
    @Override
    public String toString() {
        return switch (type) {
            case UINT64 -> Long.toUnsignedString((Long) value);
            case STRING -> '"' + (String) value + '"';
            default -> String.valueOf(value);
        };
    }
}
