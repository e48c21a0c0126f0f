package dev.kvant.gguf;

import java.io.ByteArrayOutputStream;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;

/**
 * Hand-assembles GGUF bytes, field by field, so that tests can build files the writer refuses to produce: wrong
 * magic, bad counts, unknown types, misaligned or overlapping tensors.
 */
final class GgufBytes {
    private final ByteArrayOutputStream out = new ByteArrayOutputStream();

    /** Magic, version and the two counts. */
    static GgufBytes header(int version, long tensorCount, long kvCount) {
        return new GgufBytes().raw("GGUF".getBytes(StandardCharsets.US_ASCII)).u32(version).u64(tensorCount)
                .u64(kvCount);
    }

    GgufBytes u8(int v) {
        out.write(v);
        return this;
    }

    GgufBytes u32(long v) {
        for (int i = 0; i < 4; i++) {
            out.write((int) (v >>> (8 * i)));
        }
        return this;
    }

    GgufBytes u64(long v) {
        for (int i = 0; i < 8; i++) {
            out.write((int) (v >>> (8 * i)));
        }
        return this;
    }

    GgufBytes raw(byte[] b) {
        out.writeBytes(b);
        return this;
    }

    GgufBytes str(String s) {
        return str(s.getBytes(StandardCharsets.UTF_8));
    }

    GgufBytes str(byte[] utf8) {
        return u64(utf8.length).raw(utf8);
    }

    GgufBytes kvU32(String key, long v) {
        return str(key).u32(GgufValueType.UINT32.id).u32(v);
    }

    GgufBytes kvString(String key, String v) {
        return str(key).u32(GgufValueType.STRING.id).str(v);
    }

    /** A tensor info with its offset relative to the data section. */
    GgufBytes tensorInfo(String name, long[] shape, int typeId, long relativeOffset) {
        str(name).u32(shape.length);
        for (long d : shape) {
            u64(d);
        }
        return u32(typeId).u64(relativeOffset);
    }

    /** Zero bytes up to the next multiple of {@code alignment}. */
    GgufBytes padTo(int alignment) {
        while (out.size() % alignment != 0) {
            out.write(0);
        }
        return this;
    }

    GgufBytes zeros(int n) {
        out.writeBytes(new byte[n]);
        return this;
    }

    int size() {
        return out.size();
    }

    byte[] bytes() {
        return out.toByteArray();
    }

    MemorySegment segment() {
        return MemorySegment.ofArray(bytes());
    }
}
