package dev.kvant.tensor;

/**
 * Kernels that read a weight format's rows rearranged into a layout of their own, with the same bytes per row.
 * {@link WeightMatrix#packForCpu} keeps such a copy for the CPU kernels; the file's layout stays in
 * {@link WeightMatrix#data()} for everything else (the GPU upload reads it).
 *
 * <p>Every result is bitwise what the format's own kernels give on the unpacked rows: a packed layout changes
 * where the kernels find the values, not the arithmetic.
 */
interface PackedRows extends FusedRows {
    /**
     * Rearranges the row of {@code cols} values at {@code src} (the file's layout) into {@code dst}; false when
     * this row's values would not come out bitwise as the format's own kernels give them (then the matrix stays
     * with the format's kernels).
     */
    boolean pack(long src, long dst, int cols);

    /**
     * True when {@link #pack} keeps the file's bytes as they are (it only checks them): rows that are not
     * interleaved then need no copy, and {@code pack} is given {@code dst == src}, which it must not write.
     */
    default boolean keepsBytes() {
        return false;
    }
}
