package dev.kvant.kv;

import java.lang.foreign.MemorySegment;
import java.util.List;
import java.util.stream.Collectors;

/**
 * How one row of the KV cache (one kv head of one token, headDim floats) is stored: {@code --ctk/--ctv} names,
 * byte layouts and the quantize-on-write kernels. The layouts are kv-format v{@value #VERSION}, documented byte
 * for byte in docs/KV_FORMATS.md.
 *
 * <p>Rotated formats (q4_0h, turbo*) store a row in the domain of {@link Rotation}: attention rotates the query
 * once (the rotation is orthogonal, so ⟨Rq, Rk⟩ = ⟨q, k⟩), never de-rotates K, and rotates a V-weighted sum back
 * once per head. Their rows have {@link #domainDim} = {@link Rotation#paddedDim} values, which is more than
 * headDim when headDim is not a multiple of 64; {@link #decode}, {@link #rotate} and {@link #unrotate} work on
 * that many floats. Unrotated formats have {@code domainDim(headDim) == headDim}.
 *
 * <p>Encoding is deterministic: the same row gives the same bytes on every call, through {@link #encode} or
 * {@link #encodeRows}. Non-finite inputs are not supported; the rows they land in decode to unspecified values.
 */
public sealed interface KvFormat permits HalfFormat, Int8Format, Q4Format, TurboFormat, PageMeanFormat {
    /** The format version of every layout here; bump it when any byte layout, codebook, seed or sign changes. */
    int VERSION = 1;

    /** All formats, in the order of the {@code --ctk/--ctv} table. */
    static List<KvFormat> all() {
        return List.of(HalfFormat.F16, HalfFormat.BF16, Int8Format.Q8_0, Int8Format.INT8, Q4Format.Q4_0,
                Q4Format.Q4_0H, TurboFormat.TURBO4, TurboFormat.TURBO3, TurboFormat.TURBO2);
    }

    /** The format of a {@code --ctk/--ctv} name; a name ending in {@code +mean} is a {@link PageMeanFormat}. */
    static KvFormat parse(String name) {
        if (name.endsWith(PageMeanFormat.SUFFIX) && name.length() > PageMeanFormat.SUFFIX.length()) {
            return new PageMeanFormat(parse(name.substring(0, name.length() - PageMeanFormat.SUFFIX.length())));
        }
        for (KvFormat f : all()) {
            if (f.name().equals(name)) {
                return f;
            }
        }
        throw new IllegalArgumentException("unknown KV cache format '" + name + "'; known formats: "
                + all().stream().map(KvFormat::name).collect(Collectors.joining(", "))
                + " (K formats may end in " + PageMeanFormat.SUFFIX + ": keys centered on their page's mean)");
    }

    String name();

    /** Storage bits per value for a head size that is a multiple of 128 (headers included). */
    double bitsPerValue();

    /** Bytes of one row of this head size. */
    long rowBytes(int headDim);

    /** True when rows live in the rotated domain (q4_0h, turbo*). */
    boolean rotated();

    /** Values per row in the format's domain: {@code Rotation.paddedDim(headDim)} if rotated, else headDim. */
    default int domainDim(int headDim) {
        if (headDim <= 0) {
            throw new IllegalArgumentException("head size must be positive, got " + headDim);
        }
        return rotated() ? Rotation.paddedDim(headDim) : headDim;
    }

    /** Quantizes one unrotated row {@code src[srcOff, srcOff+headDim)} into {@code rowBytes(headDim)} bytes at dstOff. */
    default void encode(float[] src, int srcOff, int headDim, MemorySegment dst, long dstOff) {
        encodeRows(src, srcOff, 1, headDim, dst, dstOff, 0);
    }

    /** Encodes rows×headDim consecutive floats as rows rows dstStride bytes apart; bit-identical to row by row. */
    void encodeRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff, long dstStride);

    /**
     * Encodes rows already in the format's domain ({@link #rotate}d when rotated): rows × domainDim(headDim)
     * consecutive floats, as {@link #encodeRows} encodes the unrotated rows they came from, bit for bit.
     */
    default void encodeDomainRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff,
                                  long dstStride) {
        if (rotated()) {
            throw new UnsupportedOperationException(name() + " must encode rows of its rotated domain itself");
        }
        encodeRows(src, srcOff, rows, headDim, dst, dstOff, dstStride);
    }

    /** Dequantizes one row into {@code dst[dstOff, dstOff+domainDim(headDim))}; rotated-domain values if rotated. */
    void decode(MemorySegment src, long srcOff, int headDim, float[] dst, int dstOff);

    /**
     * Brings a row into the format's domain in place: {@code x[off, off+headDim)} is the row; for rotated formats
     * {@code x[off+headDim, off+domainDim)} is overwritten with zero padding first. Identity if not rotated.
     */
    default void rotate(float[] x, int off, int headDim) {
        if (rotated()) {
            Rotation.forwardRow(x, off, headDim);
        }
    }

    /** Undoes {@link #rotate} on {@code x[off, off+domainDim)}; the row is then in {@code x[off, off+headDim)}. */
    default void unrotate(float[] x, int off, int headDim) {
        if (rotated()) {
            Rotation.inverseRow(x, off, headDim);
        }
    }
}
