package dev.kvant.gguf;

import java.util.Arrays;
import java.util.Objects;

/**
 * One tensor of a GGUF file, as declared in its header and validated by {@link GgufFile}.
 *
 * @param shape    {@code ne}: {@code shape[0]} is the innermost dimension (the length of one row), as in GGML
 * @param offset   absolute offset of the first byte of the tensor's data in the file
 * @param byteSize bytes of data: {@code type.rowBytes(shape[0]) * rows()}
 */
public record GgufTensorInfo(String name, GgmlType type, long[] shape, long offset, long byteSize) {

    public GgufTensorInfo {
        Objects.requireNonNull(name, "name");
        Objects.requireNonNull(type, "type");
        shape = Objects.requireNonNull(shape, "shape").clone();
        if (shape.length == 0) {
            throw new IllegalArgumentException("tensor '" + name + "' needs at least one dimension");
        }
    }

    /** A copy of the shape; {@link #ne(int)} reads one dimension without copying. */
    @Override
    public long[] shape() {
        return shape.clone();
    }

    /** Dimension {@code i} (0 = innermost). */
    public long ne(int i) {
        return shape[i];
    }

    public int dims() {
        return shape.length;
    }

    public long elementCount() {
        long n = 1;
        for (long d : shape) {
            n *= d;
        }
        return n;
    }

    /** Number of rows: the product of {@code ne[1..]} (1 for a vector). */
    public long rows() {
        long n = 1;
        for (int i = 1; i < shape.length; i++) {
            n *= shape[i];
        }
        return n;
    }

    /** Values per row: {@code ne[0]}. */
    public long rowLength() {
        return shape[0];
    }

    /** Bytes of one row. */
    public long rowBytes() {
        return type.rowBytes(shape[0]);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof GgufTensorInfo t && t.name.equals(name) && t.type == type && Arrays.equals(t.shape, shape)
                && t.offset == offset && t.byteSize == byteSize;
    }

    @Override
    public int hashCode() {
        return Objects.hash(name, type, Arrays.hashCode(shape), offset, byteSize);
    }

    /** e.g. {@code blk.0.attn_q.weight F16 [512, 512] @ 1,234,560 (524,288 bytes)}. */
    @Override
    public String toString() {
        return String.format(java.util.Locale.ROOT, "%s %s %s @ %,d (%,d bytes)", name, type, Arrays.toString(shape),
                offset, byteSize);
    }
}
