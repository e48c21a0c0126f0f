package dev.kvant.gguf;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

/**
 * The key/value metadata of a GGUF file, in file order, with typed getters. A missing key or a value of the wrong
 * type is a {@link GgufException} naming the file and the key, e.g.
 * {@code GGUF m.gguf: key 'llama.block_count' is a string, expected an integer}.
 */
public final class GgufMetadata {
    private final String fileName;
    private final Map<String, GgufValue> values;

    GgufMetadata(String fileName, Map<String, GgufValue> values) {
        this.fileName = fileName;
        this.values = Collections.unmodifiableMap(new LinkedHashMap<>(values));
    }

    /** The keys in file order. */
    public Set<String> keys() {
        return values.keySet();
    }

    public int size() {
        return values.size();
    }

    public boolean contains(String key) {
        return values.containsKey(key);
    }

    public Optional<GgufValue> get(String key) {
        return Optional.ofNullable(values.get(key));
    }

    public GgufValue require(String key) {
        GgufValue v = values.get(key);
        if (v == null) {
            throw error(key, "is missing");
        }
        return v;
    }

    public String getString(String key) {
        return string(key, require(key));
    }

    public String getString(String key, String dflt) {
        GgufValue v = values.get(key);
        return v == null ? dflt : string(key, v);
    }

    /** Any integer type, u8 to i64; a uint64 above {@link Long#MAX_VALUE} is an error, as is a bool. */
    public long getLong(String key) {
        return integer(key, require(key));
    }

    public long getLong(String key, long dflt) {
        GgufValue v = values.get(key);
        return v == null ? dflt : integer(key, v);
    }

    /** Any integer type whose value fits an int. */
    public int getInt(String key) {
        return toInt(key, getLong(key));
    }

    public int getInt(String key, int dflt) {
        GgufValue v = values.get(key);
        return v == null ? dflt : toInt(key, integer(key, v));
    }

    /** A float32, a float64 (rounded) or an integer (converted). */
    public float getFloat(String key) {
        return real(key, require(key));
    }

    public float getFloat(String key, float dflt) {
        GgufValue v = values.get(key);
        return v == null ? dflt : real(key, v);
    }

    public boolean getBoolean(String key) {
        return bool(key, require(key));
    }

    public boolean getBoolean(String key, boolean dflt) {
        GgufValue v = values.get(key);
        return v == null ? dflt : bool(key, v);
    }

    /** The array stored under {@code key}, of any element type. */
    public GgufArray getArray(String key) {
        GgufValue v = require(key);
        if (!(v.value() instanceof GgufArray a)) {
            throw error(key, "is " + v.type().withArticle() + ", expected an array");
        }
        return a;
    }

    public List<String> getStringArray(String key) {
        GgufArray a = getArray(key);
        if (a.elementType() != GgufValueType.STRING) {
            throw wrongElements(key, a, "strings");
        }
        @SuppressWarnings("unchecked")
        List<String> strings = (List<String>) a.raw();
        return strings;
    }

    /** An array of any numeric element type (not bool), as floats. */
    public float[] getFloatArray(String key) {
        GgufArray a = getArray(key);
        if (a.raw() instanceof float[] f) {
            return f.clone();
        }
        if (!a.elementType().isInteger() && !a.elementType().isFloat()) {
            throw wrongElements(key, a, "numbers");
        }
        float[] out = new float[a.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = a.elementType() == GgufValueType.UINT64
                    ? unsignedToFloat(a.longAt(i)) : ((Number) a.get(i)).floatValue();
        }
        return out;
    }

    /** An array of any integer element type whose every element fits an int. */
    public int[] getIntArray(String key) {
        GgufArray a = getArray(key);
        if (!a.elementType().isInteger()) {
            throw wrongElements(key, a, "integers");
        }
        if (a.elementType() == GgufValueType.INT32) {
            return ((int[]) a.raw()).clone();
        }
        int[] out = new int[a.size()];
        for (int i = 0; i < out.length; i++) {
            long x = a.longAt(i);
            if (x != (int) x || (a.elementType() == GgufValueType.UINT64 && x < 0)) {
                throw error(key, "element " + i + " is " + render(a.elementType(), x) + ", which does not fit an int");
            }
            out[i] = (int) x;
        }
        return out;
    }

    /** An array of any integer element type; a uint64 element above {@link Long#MAX_VALUE} is an error. */
    public long[] getLongArray(String key) {
        GgufArray a = getArray(key);
        if (!a.elementType().isInteger()) {
            throw wrongElements(key, a, "integers");
        }
        long[] out = new long[a.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = a.longAt(i);
            if (a.elementType() == GgufValueType.UINT64 && out[i] < 0) {
                throw error(key, "element " + i + " is " + Long.toUnsignedString(out[i])
                        + ", which does not fit a signed 64-bit integer");
            }
        }
        return out;
    }

    private String string(String key, GgufValue v) {
        if (v.value() instanceof String s) {
            return s;
        }
        throw wrongType(key, v, "a string");
    }

    private long integer(String key, GgufValue v) {
        if (!v.type().isInteger()) {
            throw wrongType(key, v, "an integer");
        }
        long x = ((Number) v.value()).longValue();
        if (v.type() == GgufValueType.UINT64 && x < 0) {
            throw error(key, "is " + Long.toUnsignedString(x) + ", which does not fit a signed 64-bit integer");
        }
        return x;
    }

    private int toInt(String key, long x) {
        if (x != (int) x) {
            throw error(key, "is " + x + ", which does not fit an int");
        }
        return (int) x;
    }

    private float real(String key, GgufValue v) {
        return switch (v.value()) {
            case Float f -> f;
            case Double d -> d.floatValue();
            case Long l when v.type() == GgufValueType.UINT64 -> unsignedToFloat(l);
            case Number n when v.type().isInteger() -> n.floatValue();
            default -> throw wrongType(key, v, "a number");
        };
    }

    private boolean bool(String key, GgufValue v) {
        if (v.value() instanceof Boolean b) {
            return b;
        }
        throw wrongType(key, v, "a bool");
    }

    private static float unsignedToFloat(long bits) {
        // Halve (keeping the low bit so rounding stays correct), convert, double.
        return bits >= 0 ? bits : ((bits >>> 1) | (bits & 1)) * 2.0f;
    }

    private static String render(GgufValueType type, long x) {
        return type == GgufValueType.UINT64 ? Long.toUnsignedString(x) : Long.toString(x);
    }

    private GgufException wrongType(String key, GgufValue v, String expected) {
        String actual = v.value() instanceof GgufArray a
                ? "an array of " + a.elementType() : v.type().withArticle();
        return error(key, "is " + actual + ", expected " + expected);
    }

    private GgufException wrongElements(String key, GgufArray a, String expected) {
        return error(key, "is an array of " + a.elementType() + ", expected an array of " + expected);
    }

    private GgufException error(String key, String what) {
        return new GgufException("GGUF " + fileName + ": key '" + key + "' " + what);
    }

    @Override
    public String toString() {
        return values.toString();
    }
}
