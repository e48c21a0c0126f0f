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
     * Whether each row of the copy holds its own row's bytes (rearranged among themselves), at the row's place:
     * then {@link #decode} reads the copy's rows and the tiled matmul reads it too. False when rows are
     * interleaved four by four ({@link F16RowQuads}): then the copy serves the matrix-vector product alone
     * ({@link #dot4} on each whole quad, {@link #dot1} on the rows past the last quad, which stay row-major), and
     * decode and matmul read the file's layout with the format's own kernels.
     */
    default boolean rowMajor() {
        return true;
    }

    /**
     * Rearranges the {@code count} rows of {@code cols} values at {@code src} (the file's layout, rows
     * {@code rowBytes} apart) into {@code dst}; {@code count} is a multiple of 4 except at the end of the
     * matrix. False when some value would not come out bitwise as the format's own kernels give it (then the
     * matrix stays unpacked).
     */
    boolean pack(long src, long dst, long rowBytes, int cols, int count);
}
