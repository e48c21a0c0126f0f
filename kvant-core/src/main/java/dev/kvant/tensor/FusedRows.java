package dev.kvant.tensor;

import static dev.kvant.tensor.Lanes.F;
import static dev.kvant.tensor.Lanes.L;

import java.util.Arrays;
import jdk.incubator.vector.FloatVector;

/**
 * The kernels of a weight format, on native memory at absolute addresses read through {@link RawMemory#ALL}
 * (callers check the addresses). {@link WeightFormat}'s public methods and {@link WeightMatrix} drive them.
 *
 * <p>How the kernels are written, and why:
 * <ul>
 *   <li>No vector crosses a call to a method of ours. The JIT inlines the Vector API's own methods
 *       unconditionally, but stops inlining ordinary methods once a compilation grows past a node budget that
 *       vector kernels reach quickly; a vector passed to or returned from a method that was not inlined is boxed
 *       on the heap, which costs more than the arithmetic. So each kernel spells its vector operations out and
 *       hands accumulators to {@link Lanes#sum4} through a scratch array.
 *   <li>One flat loop per kernel, its offsets computed from the counter by shifts and masks. Nested counted
 *       loops over the parts of a block made C2 rewrite every load's bounds check into a long sequence of
 *       scalar instructions; a flat loop keeps one compare per load.
 *   <li>No masked operations: the first-tier compiler expands them so far that it gives up on the method.
 * </ul>
 * Each row's result is bitwise the single-row {@link #dot1}: the same chunks, fused in the same order, into its
 * own accumulator, reduced by the same tree.
 */
interface FusedRows {
    /** Floats of scratch a {@link #dot4} call needs. */
    int SCRATCH = 4 * 256;

    /**
     * The order in which the kernels take a block's chunks of L values, as the offset of each chunk's first
     * value within the block; null when it is the natural order. Packed formats are fastest read in byte order,
     * and one byte holds two values a chunk apart (Q4_K: low nibble value h, high nibble value 32+h), so their
     * kernels accumulate e.g. chunks 0, 2, 1, 3 of a pair of sub-blocks. {@link TiledMatmul} arranges its
     * decoded tiles and its x rows the same way, which keeps its results bitwise those of the fused kernels.
     */
    default int[] chunkOrder() {
        return null;
    }

    /** Kernels for a packed copy of rows of {@code cols} values that run faster than these, or null. */
    default PackedRows packing(int cols) {
        return null;
    }

    /** Decodes {@code n} values at {@code address} into {@code dst[o ..]}, in natural order. */
    default void decode(long address, float[] dst, int o, int n) {
        decode(address, unitBytes(), dst, o, n);
    }

    /**
     * {@link #decode(long, float[], int, int)} of a row whose units ({@link #unitBytes}) lie {@code unitStride}
     * bytes apart: the unit's own size for a row as in the file, four times it in a quad of interleaved rows. A
     * part of a unit at the end of the row follows the last whole unit.
     */
    void decode(long address, long unitStride, float[] dst, int o, int n);

    /** The dot product of the {@code n} weights at {@code address} with {@code x[xOffset ..]}. */
    float dot1(long address, float[] x, int xOffset, int n);

    /**
     * Bytes of the unit that {@link #dot4} takes from each of its rows in turn: a block (Q8_0, Q4_0, the
     * K-quants' super-blocks), a run of blocks in a packed layout, or L values of the plain float formats.
     * {@link WeightMatrix} may interleave rows four by four at this unit, so that a four-row product reads one
     * sequential stream.
     */
    int unitBytes();

    /**
     * {@code out[outOffset + j] = dot(row j, x[xOffset ..])} for j = 0..3 over {@code n} values, where unit u of
     * row j is at {@code address + j * rowStride + u * unitStride}: rows as they are ({@code rowStride} = bytes per
     * row, {@code unitStride} = {@link #unitBytes}) or interleaved four by four ({@code rowStride} =
     * {@link #unitBytes}, {@code unitStride} = 4 × that). A part of a unit at the end of a row (plain floats whose
     * count is not a multiple of L) follows the row's last whole unit; interleaved rows have none. {@code scratch}
     * has at least {@link #SCRATCH} floats.
     */
    void dot4(long address, long rowStride, long unitStride, float[] x, int xOffset, int n, float[] out,
              int outOffset, float[] scratch);

    /**
     * The end of a {@link #dot4} of a plain float format whose four accumulators the caller stored at
     * {@code t[0 .. 4L)}: each row's values past {@code full} (fewer than L) decoded into {@code t[4L ..)},
     * zero-padded and multiplied in as one more chunk, then each accumulator's lanes summed by
     * {@link Lanes#sum4} into {@code out[outOffset + j]}. The accumulators travel through t, not as arguments
     * (see {@link Lanes#sum4}).
     */
    default void finish4(long address, long rowStride, long unitStride, float[] x, int xOffset, int full, int n,
                         float[] out, int outOffset, float[] t) {
        if (full < n) {
            int len = n - full;
            FloatVector xv = FloatVector.fromArray(F, Lanes.padded(x, xOffset + full, len), 0);
            for (int r = 0; r < 4; r++) {
                int w = (4 + r) * L;
                decode(address + r * rowStride + full / L * unitStride, t, w, len);
                Arrays.fill(t, w + len, w + L, 0f);
                FloatVector.fromArray(F, t, w).fma(xv, FloatVector.fromArray(F, t, r * L)).intoArray(t, r * L);
            }
        }
        Lanes.sum4(t, 0, out, outOffset, 1);
    }
}
