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
    /**
     * The kernels' scratch, one per thread: allocating it a task (4 KiB, zeroed) took a seventh of tinycode's decode
     * samples at one thread.
     */
    private static final ThreadLocal<float[]> SCRATCH = ThreadLocal.withInitial(() -> new float[FusedRows.SCRATCH]);
    /**
     * Rows of at most this many bytes are interleaved four by four for the CPU ({@link #packForCpu}). Streaming
     * Q8_0 rows from memory on one core of the Zen 5 VM (600 MB of matrices, four-row products): 2,176-byte rows
     * (2048 values) 7.6-8.7 GB/s in the file's layout, 12.9-17.0 interleaved; 4,352-byte rows 9.5-11.2 against
     * 8.9-10.5, and 8,704-byte rows 11.1-13.0 against 9.2-9.5. Four streams of long rows keep more prefetches in
     * flight than one; four short ones stop and restart too often.
     */
    static final int MAX_QUAD_ROW_BYTES = 4096;

    private final String name;
    private final WeightFormat format;
    private final MemorySegment data;
    /** What the CPU kernels read: {@link #data} as it is, or the copy {@link #packForCpu} made. */
    private volatile Rows cpu;
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
        this.cpu = new Rows((FusedRows) format, RawMemory.address(data, 0, expected), data, 0);
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
     * Gives the CPU kernels the rows in the layout they read fastest, once: rows of at most
     * {@link #MAX_QUAD_ROW_BYTES} interleaved four by four at the kernels' unit ({@link FusedRows#unitBytes}), so
     * that a four-row product reads one sequential stream instead of four short ones, and each row in the
     * format's packed form where it has one for this width ({@link FusedRows#packing}: Q4_0 on AVX-512,
     * {@link Q4_0Packed}; F16 checked to be finite, {@link F16Finite}). Results stay bitwise the same (a matrix
     * whose values the packed kernels would not reproduce bit for bit, e.g. with an infinite scale, keeps the
     * format's kernels). Idempotent and safe to call from several threads; {@link #data()} keeps the file's
     * layout (the GPU upload reads it). The copy, where one is made (F16 rows too long to interleave are only
     * checked, in place), takes as many bytes as the matrix and lives as long as this object; every CPU kernel
     * then reads the copy alone.
     */
    public void packForCpu(Parallel pool) {
        if (cpu.prepared()) {
            return;
        }
        synchronized (this) {
            Rows current = cpu;
            if (current.prepared()) {
                return;
            }
            checkAlive();
            PackedRows packing = current.kernels().packing(cols);
            Rows next = packing == null ? null : copyFor(packing, current.address(), pool);
            if (next == null) {
                next = copyFor(current.kernels(), current.address(), pool);
            }
            if (next != null) {
                cpu = next;
            }
        }
    }

    /**
     * The rows at {@code src} (the file's layout) copied for {@code kernels}: packed by them if they are
     * {@link PackedRows}, interleaved four by four if short enough (rows that neither move nor change are only
     * checked, in place); null when that would change nothing (plain kernels, rows too long to interleave) or
     * would change some value's bits (the packing refused a row).
     */
    private Rows copyFor(FusedRows kernels, long src, Parallel pool) {
        PackedRows packing = kernels instanceof PackedRows p ? p : null;
        int unit = kernels.unitBytes();
        int quadRows = rowBytes <= MAX_QUAD_ROW_BYTES && rowBytes % unit == 0 ? rows & ~3 : 0;
        if (quadRows == 0 && packing == null) {
            return null;
        }
        long bytes = rowBytes * rows;
        // Rows that stay as they are, for kernels that only check them, are read in place: no copy.
        boolean inPlace = quadRows == 0 && packing.keepsBytes();
        MemorySegment copy = inPlace ? cpu.memory() : LargePages.allocate(bytes);
        long dst = inPlace ? src : RawMemory.address(copy, 0, bytes);
        int chunk = roundUp4(Math.max(MIN_ROWS_PER_TASK, ceilDiv(rows, 8 * pool.threads())));
        AtomicBoolean exact = new AtomicBoolean(true);
        pool.forEach(ceilDiv(rows, chunk), t -> {
            try (Arena arena = Arena.ofConfined()) {
                long quad = RawMemory.address(arena.allocate(4 * rowBytes, 64), 0, 4 * rowBytes);
                copyRows(packing, unit, quadRows, src, dst, quad, t * chunk, Math.min(rows, (t + 1) * chunk), exact);
            }
        });
        return exact.get() ? new Rows(kernels, dst, copy, quadRows) : null;
    }

    /**
     * Rows {@code first..end-1} of {@link #copyFor} ({@code first} a multiple of 4); a quad to interleave goes
     * through {@code quad}, scratch for four rows.
     */
    private void copyRows(PackedRows packing, int unit, int quadRows, long src, long dst, long quad, int first,
                          int end, AtomicBoolean exact) {
        for (int r = first; r < end; r += 4) {
            boolean interleave = r < quadRows;
            for (int j = 0; j < Math.min(4, rows - r); j++) {
                long in = src + (r + j) * rowBytes;
                long out = interleave ? quad + j * rowBytes : dst + (r + j) * rowBytes;
                if (packing == null) {
                    MemorySegment.copy(RawMemory.ALL, in, RawMemory.ALL, out, rowBytes);
                } else if (!packing.pack(in, out, cols)) {
                    exact.set(false);
                }
            }
            if (interleave) {
                for (long u = 0; u < rowBytes / unit; u++) {
                    for (int j = 0; j < 4; j++) {
                        MemorySegment.copy(RawMemory.ALL, quad + j * rowBytes + u * unit, RawMemory.ALL,
                                dst + r * rowBytes + (4 * u + j) * unit, unit);
                    }
                }
            }
        }
    }

    /** The rows the CPU kernels read now (for tests). */
    Rows cpuRows() {
        return cpu;
    }

    /** Whether {@link #packForCpu} gave the CPU kernels rows of their own: a copy, or the file's rows once checked. */
    public boolean packedForCpu() {
        return cpu.prepared();
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
        float[] scratch = SCRATCH.get();
        long unit = kernels.unitBytes();
        int r = from;
        for (; r + 4 <= to && r < v.quadRows(); r += 4) {
            kernels.dot4(address + r * rowBytes, unit, 4 * unit, x, xOffset, cols, out, outOffset + r, scratch);
        }
        for (; r + 4 <= to; r += 4) {
            kernels.dot4(address + r * rowBytes, rowBytes, unit, x, xOffset, cols, out, outOffset + r, scratch);
        }
        for (; r < to; r++) {
            out[outOffset + r] = kernels.dot1(address + r * rowBytes, x, xOffset, cols);
        }
        // the kernels read v's memory through a raw address: v (whose memory field holds a copy alive) must stay
        // reachable until they are done
        java.lang.ref.Reference.reachabilityFence(v);
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
        TiledMatmul.run(this, cpu, x, n, out, pool);
    }

    /** Decodes row {@code row} into {@code dst[dstOffset .. dstOffset + cols)}: an embedding lookup. */
    public void dequantizeRow(int row, float[] dst, int dstOffset) {
        if (row < 0 || row >= rows) {
            throw new IndexOutOfBoundsException("tensor '" + name + "': row " + row + " of " + rows);
        }
        java.util.Objects.checkFromIndexSize(dstOffset, cols, dst.length);
        checkAlive();
        decodeRow(cpu, row, dst, dstOffset);
    }

    /** Decodes row {@code r} of {@code v} into {@code dst[o .. o + cols)}, wherever its layout puts its units. */
    void decodeRow(Rows v, int r, float[] dst, int o) {
        long unit = v.kernels().unitBytes();
        if (r < v.quadRows()) {
            v.kernels().decode(v.address() + (r & ~3) * rowBytes + (r & 3) * unit, 4 * unit, dst, o, cols);
        } else {
            v.kernels().decode(v.address() + r * rowBytes, unit, dst, o, cols);
        }
        java.lang.ref.Reference.reachabilityFence(v);   // as in matvecRows
    }

    /**
     * The rows as the CPU kernels read them: their kernels, the native address of row 0, the memory that holds
     * them (kept here so that a copy lives as long as a reader of it), and how many rows from the first are
     * interleaved four by four (0, or the rows of all whole quads): unit u of row r &lt; quadRows is at
     * {@code address + (r & ~3) * rowBytes + (4u + (r & 3)) * unitBytes}, every other row as in the file.
     */
    record Rows(FusedRows kernels, long address, MemorySegment memory, int quadRows) {
        boolean packed() {
            return kernels instanceof PackedRows;
        }

        /** Whether these rows were prepared for the CPU kernels: packed (or checked in place), interleaved, or both. */
        boolean prepared() {
            return packed() || quadRows > 0;
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
