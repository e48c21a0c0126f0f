package dev.kvant.tensor;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A 2-D weight tensor: {@code rows x cols}, row-major, each row {@code cols / blockSize} blocks of its format.
 *
 * <p>{@link #matvec} and {@link #matmul} compute every output element as {@link WeightFormat}'s one dot-product
 * arithmetic, by exactly one task, so results are bitwise the same at any thread count, and {@code matmul}'s
 * column i is bitwise {@code matvec} of x_i.
 */
public final class WeightMatrix {
    /**
     * Rows per matvec task at the least: 64 rows of a 512-wide Q8_0 matrix are 34 KiB of weights, a few
     * microseconds of streaming, well above the cost of handing out a task.
     */
    private static final int MIN_ROWS_PER_TASK = 64;

    private final String name;
    private final WeightFormat format;
    private final MemorySegment data;
    /**
     * What the matrix-vector product reads: {@link #data} as it is, or a packed copy once {@link #packForCpu}
     * made one.
     */
    private volatile Rows cpu;
    /** What decode and the tiled matmul read: {@link #cpu} when its rows are whole and in place, else the file's. */
    private volatile Rows rowMajor;
    private final int rows;
    private final int cols;
    private final long rowBytes;

    /**
     * The data must stay alive while the matrix is used (a heap segment is copied to native memory here).
     *
     * @throws IllegalArgumentException naming the tensor when the shape does not fit the format or the data
     */
    public WeightMatrix(String name, WeightFormat format, MemorySegment data, int rows, int cols) {
        if (rows <= 0 || cols <= 0) {
            throw new IllegalArgumentException("tensor '" + name + "': shape " + rows + " x " + cols
                    + " has no values");
        }
        if (cols % format.blockSize() != 0) {
            throw new IllegalArgumentException("tensor '" + name + "': " + cols + " columns is not a multiple of the "
                    + format.type() + " block size " + format.blockSize());
        }
        long rowBytes = format.bytesFor(cols);
        long expected = rowBytes * rows;
        if (data.byteSize() != expected) {
            throw new IllegalArgumentException("tensor '" + name + "': " + rows + " x " + cols + " " + format.type()
                    + " takes " + expected + " bytes but the data has " + data.byteSize());
        }
        if (!data.isNative()) {
            MemorySegment copy = Arena.ofAuto().allocate(expected, 64);
            copy.copyFrom(data);
            data = copy;
        }
        this.name = name;
        this.format = format;
        this.data = data;
        this.cpu = new Rows((FusedRows) format, RawMemory.address(data, 0, expected), data);
        this.rowMajor = cpu;
        this.rows = rows;
        this.cols = cols;
        this.rowBytes = rowBytes;
    }

    public String name() {
        return name;
    }

    public int rows() {
        return rows;
    }

    public int cols() {
        return cols;
    }

    public WeightFormat format() {
        return format;
    }

    public MemorySegment data() {
        return data;
    }

    /** Bytes per row. */
    public long rowBytes() {
        return rowBytes;
    }

    /**
     * Makes the copy of the rows that the CPU kernels read fastest, where the format has one for this width:
     * each row rearranged in place (Q4_0 on AVX-512: {@link Q4_0Packed}), or rows interleaved four by four for the
     * matrix-vector product (F16 without infinities or NaNs: {@link F16RowQuads}). Results stay bitwise the same
     * (a matrix whose values the packed kernels would not reproduce bit for bit, e.g. with an infinite scale,
     * stays as it is). Idempotent and safe to call from several threads; {@link #data()} keeps the file's layout
     * (the GPU upload reads it). The copy takes as many bytes as the matrix and lives as long as this object.
     */
    public void packForCpu(Parallel pool) {
        Rows current = cpu;
        if (current.packed() || current.kernels().packing(cols) == null) {
            return;
        }
        synchronized (this) {
            if (cpu.packed()) {
                return;
            }
            checkAlive();
            PackedRows packing = cpu.kernels().packing(cols);
            long bytes = rowBytes * rows;
            MemorySegment copy = LargePages.allocate(bytes);
            long src = cpu.address();
            long dst = RawMemory.address(copy, 0, bytes);
            int chunk = roundUp4(Math.max(MIN_ROWS_PER_TASK, ceilDiv(rows, 8 * pool.threads())));
            AtomicBoolean exact = new AtomicBoolean(true);
            pool.forEach(ceilDiv(rows, chunk), t -> {
                int from = t * chunk;
                int count = Math.min(rows, from + chunk) - from;
                if (!packing.pack(src + from * rowBytes, dst + from * rowBytes, rowBytes, cols, count)) {
                    exact.set(false);
                }
            });
            if (exact.get()) {
                cpu = new Rows(packing, dst, copy);
                if (packing.rowMajor()) {
                    rowMajor = cpu;
                }
            }
        }
    }

    /** Whether the CPU kernels read a packed copy ({@link #packForCpu}). */
    public boolean packedForCpu() {
        return cpu.packed();
    }

    /** {@code out[r] = dot(row r, x)} for every row. */
    public void matvec(float[] x, float[] out, Parallel pool) {
        checkLength("x", x, cols);
        checkLength("out", out, rows);
        checkAlive();
        int chunk = chunkRows(pool);
        int tasks = ceilDiv(rows, chunk);
        Rows v = cpu;
        pool.forEach(tasks, t -> matvecRows(v, x, 0, out, 0, t * chunk, Math.min(rows, (t + 1) * chunk)));
    }

    /** Rows a matvec task takes. Any split gives the same bits (each row is one dot); this one balances the pool. */
    private int chunkRows(Parallel pool) {
        return Math.max(MIN_ROWS_PER_TASK, roundUp4(ceilDiv(rows, 4 * pool.threads())));
    }

    /**
     * {@code matmul(x, n, outs[i], pool)} of every matrix in {@code ms} over the same input (the q, k and v
     * projections; gate and up). One vector ({@code n == 1}, a decode step) runs all their row tasks in one
     * {@link Parallel#forEach}, so the pool meets one barrier instead of one a matrix; the bits are each
     * matrix's own {@code matvec}'s.
     */
    public static void matmulAll(WeightMatrix[] ms, float[] x, int n, float[][] outs, Parallel pool) {
        if (ms.length != outs.length) {
            throw new IllegalArgumentException(ms.length + " matrices and " + outs.length + " outputs");
        }
        if (n != 1) {
            for (int i = 0; i < ms.length; i++) {
                ms[i].matmul(x, n, outs[i], pool);
            }
            return;
        }
        int[] chunk = new int[ms.length];
        int[] firstTask = new int[ms.length + 1];
        Rows[] rows = new Rows[ms.length];
        for (int i = 0; i < ms.length; i++) {
            WeightMatrix m = ms[i];
            m.checkLength("x", x, m.cols);
            m.checkLength("out", outs[i], m.rows);
            m.checkAlive();
            chunk[i] = m.chunkRows(pool);
            firstTask[i + 1] = firstTask[i] + ceilDiv(m.rows, chunk[i]);
            rows[i] = m.cpu;
        }
        pool.forEach(firstTask[ms.length], t -> {
            int i = 0;
            while (t >= firstTask[i + 1]) {
                i++;
            }
            WeightMatrix m = ms[i];
            int from = (t - firstTask[i]) * chunk[i];
            m.matvecRows(rows[i], x, 0, outs[i], 0, from, Math.min(m.rows, from + chunk[i]));
        });
    }

    /** Rows {@code from..to-1} against the vector at {@code x[xOffset..]}, into {@code out[outOffset + r]}. */
    private void matvecRows(Rows v, float[] x, int xOffset, float[] out, int outOffset, int from, int to) {
        FusedRows kernels = v.kernels();
        long address = v.address();
        float[] scratch = new float[FusedRows.SCRATCH];
        int r = from;
        for (; r + 4 <= to; r += 4) {
            kernels.dot4(address + r * rowBytes, rowBytes, x, xOffset, cols, out, outOffset + r, scratch);
        }
        for (; r < to; r++) {
            out[outOffset + r] = kernels.dot1(address + r * rowBytes, x, xOffset, cols);
        }
    }

    /**
     * {@code out[i*rows + r] = dot(row r, x_i)} for the {@code n} vectors {@code x_i = x[i*cols .. (i+1)*cols)}.
     * Each result is bitwise {@code matvec} of x_i.
     */
    public void matmul(float[] x, int n, float[] out, Parallel pool) {
        if (n <= 0) {
            throw new IllegalArgumentException("tensor '" + name + "': matmul of " + n + " vectors");
        }
        checkLength("x", x, (long) n * cols);
        checkLength("out", out, (long) n * rows);
        checkAlive();
        if (n == 1) {
            matvec(x, out, pool);
            return;
        }
        TiledMatmul.run(this, rowMajor, x, n, out, pool);
    }

    /** Decodes row {@code row} into {@code dst[dstOffset .. dstOffset + cols)}: an embedding lookup. */
    public void dequantizeRow(int row, float[] dst, int dstOffset) {
        if (row < 0 || row >= rows) {
            throw new IndexOutOfBoundsException("tensor '" + name + "': row " + row + " of " + rows);
        }
        java.util.Objects.checkFromIndexSize(dstOffset, cols, dst.length);
        checkAlive();
        Rows v = rowMajor;
        v.kernels().decode(v.address() + row * rowBytes, dst, dstOffset, cols);
    }

    /**
     * The rows as the CPU kernels read them: their kernels, the native address of row 0, and the memory that
     * holds them (kept here so that a packed copy lives as long as a reader of it).
     */
    record Rows(FusedRows kernels, long address, MemorySegment memory) {
        boolean packed() {
            return kernels instanceof PackedRows;
        }
    }

    private void checkAlive() {
        if (!data.scope().isAlive()) {
            throw new IllegalStateException("tensor '" + name + "': its memory has been released");
        }
    }

    private void checkLength(String what, float[] a, long needed) {
        if (a.length < needed) {
            throw new IllegalArgumentException("tensor '" + name + "' (" + rows + " x " + cols + "): " + what
                    + " has " + a.length + " floats, needs " + needed);
        }
    }

    private static int ceilDiv(int a, int b) {
        return (a + b - 1) / b;
    }

    private static int roundUp4(int a) {
        return (a + 3) & ~3;
    }

    @Override
    public String toString() {
        return "WeightMatrix[" + name + ", " + format.type() + ", " + rows + " x " + cols + "]";
    }
}
