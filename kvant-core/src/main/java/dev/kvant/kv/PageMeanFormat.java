package dev.kvant.kv;

import java.lang.foreign.MemorySegment;

/**
 * A K format whose rows are stored centered on their page's mean: {@code --ctk turbo3+mean}. Each page of a cache
 * with such a K format carries, after its rows, one mean per kv head (halves in the format's domain: rotated for a
 * rotated format), and a row is the base format's encoding of its domain row minus μ
 * ({@link KvFormat#encodeDomainRows}); readers add μ back to every decoded row. Softmax
 * is invariant to an offset shared by the keys of one query's sum, so it could even be dropped within a page — it
 * is given back because pages have different means.
 *
 * <p>Why: a real model's keys share a large common part that drifts slowly with position (RoPE turns it), and a
 * 3-bit code spends its levels on it; centered on a 64-key page's own mean, tinycode's turbo3 keys lose a third as
 * much perplexity (docs/KV_FORMATS.md). Which mean a page gets is decided when its first row is written
 * ({@link KvSequence#writeRows}): the mean of that write's rows in the page when they are at least a quarter of it
 * (a prefill's pages), else the mean of the previous page's keys as stored (a decode step opening a page), else 0
 * (a first page opened by a few rows: one of them a sink whose key is unlike the rest).
 *
 * <p>The encode and decode methods are the base format's: they see rows already centered. Only a K side can be
 * centered ({@link KvCache} refuses it for V: values have no common part worth the bytes).
 */
public record PageMeanFormat(KvFormat base) implements KvFormat {
    /** The suffix of a centered format's name. */
    public static final String SUFFIX = "+mean";
    /** The page size {@link #bitsPerValue} assumes (the backends' pages). */
    private static final int PAGE_TOKENS = 64;

    public PageMeanFormat {
        if (base instanceof PageMeanFormat) {
            throw new IllegalArgumentException("a format can be centered once: " + base.name() + SUFFIX);
        }
        if (base instanceof HalfFormat) {
            throw new IllegalArgumentException(base.name() + SUFFIX + ": " + base.name() + " keys are stored as they "
                    + "are; " + SUFFIX + " is for the quantized formats");
        }
    }

    @Override
    public String name() {
        return base.name() + SUFFIX;
    }

    /** The base format's bits plus a 16-bit mean per value of a 64-token page's row. */
    @Override
    public double bitsPerValue() {
        return base.bitsPerValue() + 16.0 / PAGE_TOKENS;
    }

    @Override
    public long rowBytes(int headDim) {
        return base.rowBytes(headDim);
    }

    @Override
    public boolean rotated() {
        return base.rotated();
    }

    @Override
    public int domainDim(int headDim) {
        return base.domainDim(headDim);
    }

    @Override
    public void encode(float[] src, int srcOff, int headDim, MemorySegment dst, long dstOff) {
        base.encode(src, srcOff, headDim, dst, dstOff);
    }

    @Override
    public void encodeRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff,
                           long dstStride) {
        base.encodeRows(src, srcOff, rows, headDim, dst, dstOff, dstStride);
    }

    @Override
    public void encodeDomainRows(float[] src, int srcOff, int rows, int headDim, MemorySegment dst, long dstOff,
                                 long dstStride) {
        base.encodeDomainRows(src, srcOff, rows, headDim, dst, dstOff, dstStride);
    }

    @Override
    public void decode(MemorySegment src, long srcOff, int headDim, float[] dst, int dstOff) {
        base.decode(src, srcOff, headDim, dst, dstOff);
    }

    @Override
    public void rotate(float[] x, int off, int headDim) {
        base.rotate(x, off, headDim);
    }

    @Override
    public void unrotate(float[] x, int off, int headDim) {
        base.unrotate(x, off, headDim);
    }

    /** The format rows are encoded in: the base of a centered format, else the format itself. */
    public static KvFormat rows(KvFormat f) {
        return f instanceof PageMeanFormat m ? m.base() : f;
    }
}
