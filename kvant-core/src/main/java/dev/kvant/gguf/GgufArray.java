package dev.kvant.gguf;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import java.util.StringJoiner;

/**
 * A metadata array. Numbers are kept in primitive arrays so that a tokenizer's 150k scores or token types cost what
 * they weigh: {@code byte[]} for UINT8/INT8, {@code short[]} for UINT16/INT16, {@code int[]} for UINT32/INT32,
 * {@code long[]} for UINT64/INT64 (unsigned types hold raw bits), {@code float[]}, {@code double[]},
 * {@code boolean[]}; strings as {@code List<String>}; nested arrays as {@code List<GgufArray>}.
 *
 * <p>Immutable: the constructor and {@link #values()} copy primitive arrays.
 */
public record GgufArray(GgufValueType elementType, Object values) {

    public GgufArray {
        Objects.requireNonNull(elementType, "elementType");
        Objects.requireNonNull(values, "values");
        values = switch (elementType) {
            case UINT8, INT8 -> values instanceof byte[] a ? a.clone() : mismatch(elementType, values);
            case UINT16, INT16 -> values instanceof short[] a ? a.clone() : mismatch(elementType, values);
            case UINT32, INT32 -> values instanceof int[] a ? a.clone() : mismatch(elementType, values);
            case UINT64, INT64 -> values instanceof long[] a ? a.clone() : mismatch(elementType, values);
            case FLOAT32 -> values instanceof float[] a ? a.clone() : mismatch(elementType, values);
            case FLOAT64 -> values instanceof double[] a ? a.clone() : mismatch(elementType, values);
            case BOOL -> values instanceof boolean[] a ? a.clone() : mismatch(elementType, values);
            case STRING -> values instanceof List<?> l
                    ? List.copyOf(castList(l, String.class)) : mismatch(elementType, values);
            case ARRAY -> values instanceof List<?> l
                    ? List.copyOf(castList(l, GgufArray.class)) : mismatch(elementType, values);
        };
    }

    private static Object mismatch(GgufValueType elementType, Object values) {
        throw new IllegalArgumentException(
                "an array of " + elementType + " cannot be stored in a " + values.getClass().getSimpleName());
    }

    private static <T> List<T> castList(List<?> list, Class<T> type) {
        for (Object o : list) {
            if (!type.isInstance(o)) {
                throw new IllegalArgumentException("expected " + type.getSimpleName() + " elements, found " + o);
            }
        }
        @SuppressWarnings("unchecked")
        List<T> typed = (List<T>) list;
        return typed;
    }

    /**
     * An array of {@code elementType} built from boxed elements in any reasonable Java type (see
     * {@link GgufValue#of}); for {@code ARRAY} the elements must be {@link GgufArray}s.
     */
    public static GgufArray of(GgufValueType elementType, List<?> elements) {
        int n = elements.size();
        Object store = switch (elementType) {
            case UINT8, INT8 -> new byte[n];
            case UINT16, INT16 -> new short[n];
            case UINT32, INT32 -> new int[n];
            case UINT64, INT64 -> new long[n];
            case FLOAT32 -> new float[n];
            case FLOAT64 -> new double[n];
            case BOOL -> new boolean[n];
            case STRING, ARRAY -> new ArrayList<>(n);
        };
        for (int i = 0; i < n; i++) {
            Object c;
            try {
                c = GgufValue.canonical(elementType, elements.get(i));
            } catch (IllegalArgumentException | NullPointerException e) {
                throw new IllegalArgumentException("element " + i + ": " + e.getMessage(), e);
            }
            switch (store) {
                case byte[] a -> a[i] = (byte) (int) (Integer) c;
                case short[] a -> a[i] = (short) (int) (Integer) c;
                case int[] a -> a[i] = c instanceof Long l ? (int) (long) l : (Integer) c;
                case long[] a -> a[i] = (Long) c;
                case float[] a -> a[i] = (Float) c;
                case double[] a -> a[i] = (Double) c;
                case boolean[] a -> a[i] = (Boolean) c;
                case List<?> l -> addUnchecked(l, c);
                default -> throw new AssertionError(store);
            }
        }
        return new GgufArray(elementType, store);
    }

    @SuppressWarnings("unchecked")
    private static void addUnchecked(List<?> list, Object o) {
        ((List<Object>) list).add(o);
    }

    /** A copy of the storage (primitive arrays are copied; lists are immutable). */
    @Override
    public Object values() {
        return switch (values) {
            case byte[] a -> a.clone();
            case short[] a -> a.clone();
            case int[] a -> a.clone();
            case long[] a -> a.clone();
            case float[] a -> a.clone();
            case double[] a -> a.clone();
            case boolean[] a -> a.clone();
            default -> values;
        };
    }

    /** The storage itself, for readers in this package that promise not to modify it. */
    Object raw() {
        return values;
    }

    public int size() {
        return switch (values) {
            case byte[] a -> a.length;
            case short[] a -> a.length;
            case int[] a -> a.length;
            case long[] a -> a.length;
            case float[] a -> a.length;
            case double[] a -> a.length;
            case boolean[] a -> a.length;
            case List<?> l -> l.size();
            default -> throw new AssertionError(values);
        };
    }

    /** Element {@code i} in the Java representation of a scalar {@link GgufValue} of the element type. */
    public Object get(int i) {
        return switch (elementType) {
            case UINT8 -> Byte.toUnsignedInt(((byte[]) values)[i]);
            case INT8 -> (int) ((byte[]) values)[i];
            case UINT16 -> Short.toUnsignedInt(((short[]) values)[i]);
            case INT16 -> (int) ((short[]) values)[i];
            case UINT32 -> Integer.toUnsignedLong(((int[]) values)[i]);
            case INT32 -> ((int[]) values)[i];
            case UINT64, INT64 -> ((long[]) values)[i];
            case FLOAT32 -> ((float[]) values)[i];
            case FLOAT64 -> ((double[]) values)[i];
            case BOOL -> ((boolean[]) values)[i];
            case STRING, ARRAY -> ((List<?>) values).get(i);
        };
    }

    /** Element {@code i} of an integer array as a long (UINT64: raw bits). */
    long longAt(int i) {
        return switch (elementType) {
            case UINT64, INT64 -> ((long[]) values)[i];
            default -> ((Number) get(i)).longValue();
        };
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof GgufArray a && a.elementType == elementType && Objects.deepEquals(values, a.values);
    }

    @Override
    public int hashCode() {
        return 31 * elementType.hashCode() + Arrays.deepHashCode(new Object[] {values});
    }

    /** e.g. {@code array<string>[4096] ["<|endoftext|>", "!", ...]}. */
    @Override
    public String toString() {
        int n = size();
        StringJoiner j = new StringJoiner(", ", "array<" + elementType + ">[" + n + "] [", "]");
        for (int i = 0; i < Math.min(n, 8); i++) {
            Object e = get(i);
            j.add(switch (elementType) {
                case STRING -> '"' + (String) e + '"';
                case UINT64 -> Long.toUnsignedString((Long) e);
                default -> String.valueOf(e);
            });
        }
        if (n > 8) {
            j.add("...");
        }
        return j.toString();
    }
}
