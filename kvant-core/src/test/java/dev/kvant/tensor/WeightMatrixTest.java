package dev.kvant.tensor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import java.util.Random;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

class WeightMatrixTest {
    private static final long SEED = System.nanoTime();
    private static Parallel two;
    private static Parallel three;

    static {
        System.out.println("WeightMatrixTest seed " + SEED);
    }

    @BeforeAll
    static void pools() {
        two = new Parallel(2);
        three = new Parallel(3);
    }

    @AfterAll
    static void closePools() {
        two.close();
        three.close();
    }

    /** A random matrix of the format, with its float64 decoding per row. */
    private record Fixture(WeightMatrix matrix, double[][] reference) {
    }

    /** rows x cols F16 weights of Gaussian values (standard deviation 0.5), row after row. */
    private static MemorySegment f16Rows(int rows, int cols, Random random, Arena arena) {
        WeightFormat f = WeightFormat.of(GgmlType.F16);
        long rowBytes = f.bytesFor(cols);
        MemorySegment data = arena.allocate(rowBytes * rows, 64);
        for (int r = 0; r < rows; r++) {
            f.quantize(Float64Reference.gaussian(random, cols, 0.5), 0, cols, data, r * rowBytes);
        }
        return data;
    }

    private static Fixture fixture(GgmlType type, int rows, int cols, Random random, Arena arena) {
        WeightFormat f = WeightFormat.of(type);
        long rowBytes = f.bytesFor(cols);
        MemorySegment data = arena.allocate(rowBytes * rows, 64);
        double[][] reference = new double[rows][];
        for (int r = 0; r < rows; r++) {
            float[] values = Float64Reference.gaussian(random, cols, 0.05 + random.nextDouble());
            f.quantize(values, 0, cols, data, r * rowBytes);
            byte[] bytes = data.asSlice(r * rowBytes, rowBytes).toArray(ValueLayout.JAVA_BYTE);
            reference[r] = Float64Reference.decode(type, bytes, cols);
        }
        return new Fixture(new WeightMatrix("blk.0.test." + type, f, data, rows, cols), reference);
    }

    /**
     * F16 rows with an infinity or a NaN: the four-row product notices the exponent and redoes its group exactly, so
     * such rows give infinity and NaN while their finite neighbours keep the bits they have in an all-finite matrix.
     */
    @Test
    void f16RowsWithInfinitiesAndNaNsGiveThemAndLeaveTheirNeighboursAlone() {
        int rows = 8;
        int cols = 3 * Lanes.L;
        Random random = new Random(SEED);
        try (Arena arena = Arena.ofConfined()) {
            WeightFormat f = WeightFormat.of(GgmlType.F16);
            long rowBytes = f.bytesFor(cols);
            MemorySegment finite = f16Rows(rows, cols, random, arena);
            MemorySegment special = arena.allocate(rowBytes * rows, 64);
            special.copyFrom(finite);
            special.set(ValueLayout.JAVA_SHORT_UNALIGNED, 1 * rowBytes + 2L * 5, (short) 0x7C00);        // +inf
            special.set(ValueLayout.JAVA_SHORT_UNALIGNED, 6 * rowBytes + 2L * (cols - 1), (short) 0x7E00); // NaN
            float[] x = new float[cols];
            Arrays.fill(x, 1f);
            float[] want = new float[rows];
            float[] got = poisoned(rows);
            new WeightMatrix("finite", f, finite, rows, cols).matvec(x, want, Parallel.serial());
            new WeightMatrix("special", f, special, rows, cols).matvec(x, got, Parallel.serial());
            for (int r = 0; r < rows; r++) {
                if (r == 1) {
                    assertEquals(Float.POSITIVE_INFINITY, got[r], "row 1 holds +inf");
                } else if (r == 6) {
                    assertTrue(Float.isNaN(got[r]), "row 6 holds a NaN");
                } else {
                    assertEquals(Float.floatToRawIntBits(want[r]), Float.floatToRawIntBits(got[r]), "row " + r);
                }
            }
        }
    }

    /**
     * The F16 row quads put 2^112 on x: an x of 2^16 or more overflows there, and the quad is redone exactly, so
     * inputs of any size (huge, infinite, NaN, subnormal) give F16Format's bits, in the matrix-vector product and
     * the matmul alike. A matrix holding an infinity keeps F16Format's kernels.
     */
    @Test
    void checkedF16RowsGiveTheExactBitsForInputsOfAnySize() {
        int rows = 14;
        int cols = 5 * Lanes.L;
        Random random = new Random(SEED ^ 61);
        float[][] inputs = new float[5][];
        for (int i = 0; i < inputs.length; i++) {
            inputs[i] = Float64Reference.gaussian(random, cols, 1);
        }
        inputs[1][3] = 65536f;                       // exactly 2^16: x·2^112 overflows
        inputs[2][Lanes.L + 1] = -3e30f;
        inputs[2][7] = Float.MIN_VALUE;
        inputs[3][cols - 1] = Float.POSITIVE_INFINITY;
        inputs[4][0] = Float.NaN;
        try (Arena arena = Arena.ofConfined()) {
            WeightFormat f = WeightFormat.of(GgmlType.F16);
            long rowBytes = f.bytesFor(cols);
            MemorySegment data = f16Rows(rows, cols, random, arena);
            data.set(ValueLayout.JAVA_SHORT_UNALIGNED, 2 * rowBytes + 2L * 9, (short) 0x0001);  // a subnormal half
            WeightMatrix plain = new WeightMatrix("plain", f, data, rows, cols);
            WeightMatrix checked = new WeightMatrix("checked", f, data, rows, cols);
            checked.packForCpu(two);
            assertTrue(checked.cpuRows().kernels() instanceof F16Finite, "finite F16 rows take the checked kernels");
            assertEquals(rows & ~3, checked.cpuRows().quadRows(), "short rows interleaved four by four");
            for (int i = 0; i < inputs.length; i++) {
                float[] want = poisoned(rows);
                float[] got = poisoned(rows);
                plain.matvec(inputs[i], want, two);
                checked.matvec(inputs[i], got, two);
                assertBitsEqualOrBothNaN(want, got, "input " + i + ", seed " + SEED);
            }
            float[] all = new float[inputs.length * cols];
            for (int i = 0; i < inputs.length; i++) {
                System.arraycopy(inputs[i], 0, all, i * cols, cols);
            }
            float[] wantAll = poisoned(inputs.length * rows);
            float[] gotAll = poisoned(inputs.length * rows);
            plain.matmul(all, inputs.length, wantAll, two);
            checked.matmul(all, inputs.length, gotAll, two);
            assertBitsEqualOrBothNaN(wantAll, gotAll, "matmul, seed " + SEED);
            MemorySegment withInf = arena.allocate(rowBytes * rows, 64);
            withInf.copyFrom(data);
            withInf.set(ValueLayout.JAVA_SHORT_UNALIGNED, 9 * rowBytes + 2L * 4, (short) 0xFC00);  // -inf
            WeightMatrix infinite = new WeightMatrix("infinite", f, withInf, rows, cols);
            float[] want = poisoned(rows);
            infinite.matvec(inputs[0], want, two);
            infinite.packForCpu(two);
            assertTrue(infinite.cpuRows().kernels() instanceof F16Format,
                    "a matrix holding an infinity keeps F16Format's kernels");
            float[] got = poisoned(rows);
            infinite.matvec(inputs[0], got, two);
            assertBitsEqualOrBothNaN(want, got, "interleaved, with an infinity");
        }
    }

    /**
     * F16 rows too long to interleave are checked where they are: no copy, the file's address, the checked kernels,
     * and F16Format's bits.
     */
    @Test
    void longF16RowsAreCheckedInPlace() {
        int rows = 6;
        int cols = WeightMatrix.MAX_QUAD_ROW_BYTES / 2 + Lanes.L;
        Random random = new Random(SEED ^ 67);
        try (Arena arena = Arena.ofConfined()) {
            WeightFormat f = WeightFormat.of(GgmlType.F16);
            long rowBytes = f.bytesFor(cols);
            MemorySegment data = f16Rows(rows, cols, random, arena);
            WeightMatrix m = new WeightMatrix("long", f, data, rows, cols);
            float[] x = Float64Reference.gaussian(random, cols, 1);
            float[] want = poisoned(rows);
            m.matvec(x, want, two);
            m.packForCpu(two);
            assertTrue(m.cpuRows().kernels() instanceof F16Finite, "checked kernels, seed " + SEED);
            assertEquals(0, m.cpuRows().quadRows(), "rows of " + rowBytes + " bytes stay row-major");
            assertEquals(data.address(), m.cpuRows().address(), "read in place, not copied");
            float[] got = poisoned(rows);
            m.matvec(x, got, two);
            assertBitsEqual(want, got, "checked in place, seed " + SEED);
        }
    }

    /** Column counts: one block, a few blocks, and for plain floats widths that end in a partial chunk. */
    private static int[] widths(GgmlType type) {
        int b = type.blockSize;
        return b == 1 ? new int[]{1, Lanes.L - 1, 2 * Lanes.L + 3, 96} : new int[]{b, 3 * b};
    }

    private static float[] poisoned(int n) {
        float[] a = new float[n];
        Arrays.fill(a, Float.NaN);
        return a;
    }

    private static String where(GgmlType type, int rows, int cols) {
        return type + " " + rows + " x " + cols + ", seed " + SEED;
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void matvecMatchesFloat64Reference(GgmlType type) {
        Random random = new Random(SEED ^ type.ordinal());
        try (Arena arena = Arena.ofConfined()) {
            for (int cols : widths(type)) {
                for (int rows : new int[]{1, 3, 4, 7, 69}) {
                    Fixture fx = fixture(type, rows, cols, random, arena);
                    float[] x = Float64Reference.gaussian(random, cols, 1);
                    float[] out = poisoned(rows);
                    fx.matrix().matvec(x, out, two);
                    for (int r = 0; r < rows; r++) {
                        double expected = Float64Reference.dot(fx.reference()[r], x, 0);
                        double bound = Float64Reference.bound(cols, Float64Reference.absDot(fx.reference()[r], x, 0));
                        assertTrue(Math.abs(out[r] - expected) <= bound, "row " + r + ": " + out[r] + " vs "
                                + expected + " (bound " + bound + "), " + where(type, rows, cols));
                    }
                }
            }
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void matvecIsBitIdenticalAtOneTwoAndThreeThreadsAndToDot(GgmlType type) {
        Random random = new Random(SEED ^ (7 + type.ordinal()));
        int rows = 1030;
        int cols = type.blockSize == 1 ? 200 : 2 * type.blockSize;
        try (Arena arena = Arena.ofConfined()) {
            Fixture fx = fixture(type, rows, cols, random, arena);
            float[] x = Float64Reference.gaussian(random, cols, 1);
            float[] one = poisoned(rows);
            float[] twoThreads = poisoned(rows);
            float[] threeThreads = poisoned(rows);
            fx.matrix().matvec(x, one, Parallel.serial());
            fx.matrix().matvec(x, twoThreads, two);
            fx.matrix().matvec(x, threeThreads, three);
            WeightMatrix m = fx.matrix();
            for (int r = 0; r < rows; r++) {
                int bits = Float.floatToRawIntBits(one[r]);
                assertFalse(Float.isNaN(one[r]), "row " + r + " not written, " + where(type, rows, cols));
                assertEquals(bits, Float.floatToRawIntBits(twoThreads[r]), "row " + r + ", " + where(type, rows, cols));
                assertEquals(bits, Float.floatToRawIntBits(threeThreads[r]),
                        "row " + r + ", " + where(type, rows, cols));
                float single = m.format().dot(m.data(), r * m.rowBytes(), x, 0, cols);
                assertEquals(bits, Float.floatToRawIntBits(single), "row " + r + " vs dot, " + where(type, rows, cols));
            }
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void matmulEqualsMatvecOfEachVectorBitForBit(GgmlType type) {
        Random random = new Random(SEED ^ (13 + type.ordinal()));
        try (Arena arena = Arena.ofConfined()) {
            for (int cols : widths(type)) {
                // Rows not a multiple of the kernel's 4, nor of a tile; vector counts on both sides of 4.
                for (int rows : new int[]{1, 6, 70}) {
                    Fixture fx = fixture(type, rows, cols, random, arena);
                    for (int n : new int[]{1, 2, 3, 4, 5, 7, 9}) {
                        float[] x = Float64Reference.gaussian(random, n * cols, 1);
                        float[] out = poisoned(n * rows + 1);
                        fx.matrix().matmul(x, n, out, three);
                        assertTrue(Float.isNaN(out[n * rows]), "wrote past n*rows, " + where(type, rows, cols));
                        float[] single = poisoned(rows);
                        for (int i = 0; i < n; i++) {
                            fx.matrix().matvec(Arrays.copyOfRange(x, i * cols, (i + 1) * cols), single, two);
                            for (int r = 0; r < rows; r++) {
                                assertEquals(Float.floatToRawIntBits(single[r]),
                                        Float.floatToRawIntBits(out[i * rows + r]),
                                        "vector " + i + " row " + r + " of n=" + n + ", " + where(type, rows, cols));
                            }
                        }
                    }
                }
            }
        }
    }

    /**
     * A matrix packed for the CPU kernels gives, through every kernel, the bits it gave unpacked, and its file
     * bytes stay as they were (the GPU upload reads them). Widths with and without a packed layout (Q4_0 packs
     * runs of 128 values, on 16 lanes only).
     */
    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void packedRowsGiveTheUnpackedBitsThroughEveryKernel(GgmlType type) {
        Random random = new Random(SEED ^ (29 + type.ordinal()));
        int block = type.blockSize;
        try (Arena arena = Arena.ofConfined()) {
            for (int cols : new int[]{Math.max(block, 128), 384 / block * block + block, 4096, 3 * block}) {
                for (int rows : new int[]{1, 6, 70}) {
                    Fixture fx = fixture(type, rows, cols, random, arena);
                    WeightMatrix m = fx.matrix();
                    byte[] file = m.data().toArray(ValueLayout.JAVA_BYTE);
                    int n = 5;
                    float[] x = Float64Reference.gaussian(random, n * cols, 1);
                    float[] x0 = Arrays.copyOf(x, cols);
                    float[] mv = poisoned(rows);
                    float[] mm = poisoned(n * rows);
                    float[] rowValues = poisoned(rows * cols);
                    m.matvec(x0, mv, two);
                    m.matmul(x, n, mm, three);
                    for (int r = 0; r < rows; r++) {
                        m.dequantizeRow(r, rowValues, r * cols);
                    }
                    assertFalse(m.packedForCpu(), where(type, rows, cols));
                    m.packForCpu(two);
                    m.packForCpu(three);
                    boolean packs = ((FusedRows) m.format()).packing(cols) != null;
                    assertEquals(packs, m.cpuRows().packed(), where(type, rows, cols));
                    int unit = m.cpuRows().kernels().unitBytes();
                    boolean quads = m.rowBytes() <= WeightMatrix.MAX_QUAD_ROW_BYTES && m.rowBytes() % unit == 0;
                    assertEquals(quads ? rows & ~3 : 0, m.cpuRows().quadRows(), "interleaved rows, " + where(type,
                            rows, cols));
                    if (type == GgmlType.Q4_0 && Lanes.L == 16) {
                        assertEquals(cols % 128 == 0, packs, "Q4_0 packs whole runs of 128, " + where(type, rows, cols));
                    }
                    float[] mvPacked = poisoned(rows);
                    float[] mmPacked = poisoned(n * rows);
                    float[] rowsPacked = poisoned(rows * cols);
                    m.matvec(x0, mvPacked, Parallel.serial());
                    m.matmul(x, n, mmPacked, two);
                    for (int r = 0; r < rows; r++) {
                        m.dequantizeRow(r, rowsPacked, r * cols);
                    }
                    String w = (packs ? "packed " : "unpacked ") + (m.cpuRows().quadRows() > 0 ? "interleaved " : "")
                            + where(type, rows, cols);
                    assertBitsEqual(mv, mvPacked, "matvec, " + w);
                    assertBitsEqual(mm, mmPacked, "matmul, " + w);
                    assertBitsEqual(rowValues, rowsPacked, "dequantizeRow, " + w);
                    assertTrue(Arrays.equals(file, m.data().toArray(ValueLayout.JAVA_BYTE)),
                            "the file's bytes are untouched, " + w);
                }
            }
        }
    }

    /**
     * Q4_0 blocks whose scale is +0, -0, a subnormal, negative or huge decode through the packed table (i - 8)·d + 0
     * to the file layout's fma(i, d, -8d) bit for bit (signed zeros included); a matrix with an infinite or NaN scale
     * is left unpacked, where the two would differ.
     */
    @Test
    void packedQ4_0TablesMatchTheFileLayoutForEveryFiniteScale() {
        Random random = new Random(SEED ^ 43);
        int rows = 8;
        int cols = 256;
        short[] special = {0x0000, (short) 0x8000, 0x0001, (short) 0x8001, 0x03ff, (short) 0xbc00, 0x7bff,
                (short) 0xfbff};
        try (Arena arena = Arena.ofConfined()) {
            for (short odd : new short[] {0, 0x7c00, (short) 0xfc00, 0x7e00}) {
                Fixture fx = fixture(GgmlType.Q4_0, rows, cols, random, arena);
                WeightMatrix m = fx.matrix();
                for (int r = 0; r < rows; r++) {
                    for (int b = 0; b < cols / 32; b++) {
                        short d = special[(r * 8 + b) % special.length];
                        m.data().set(ValueLayout.JAVA_SHORT_UNALIGNED, r * m.rowBytes() + 18L * b, d);
                    }
                }
                if (odd != 0) {
                    m.data().set(ValueLayout.JAVA_SHORT_UNALIGNED, 3 * m.rowBytes() + 18L * 5, odd);
                }
                float[] x = Float64Reference.gaussian(random, cols, 1);
                float[] unpacked = poisoned(rows);
                float[] values = poisoned(rows * cols);
                m.matvec(x, unpacked, two);
                for (int r = 0; r < rows; r++) {
                    m.dequantizeRow(r, values, r * cols);
                }
                m.packForCpu(two);
                boolean expectPacked = Lanes.L == 16 && odd == 0;
                String what = "scale 0x" + Integer.toHexString(odd & 0xffff) + " in row 3, seed " + SEED;
                assertEquals(expectPacked, m.cpuRows().packed(), what);
                float[] packed = poisoned(rows);
                float[] packedValues = poisoned(rows * cols);
                m.matvec(x, packed, two);
                for (int r = 0; r < rows; r++) {
                    m.dequantizeRow(r, packedValues, r * cols);
                }
                assertBitsEqualOrBothNaN(unpacked, packed, "matvec, " + what);
                assertBitsEqualOrBothNaN(values, packedValues, "dequantizeRow, " + what);
            }
        }
    }

    private static void assertBitsEqualOrBothNaN(float[] expected, float[] actual, String what) {
        for (int i = 0; i < expected.length; i++) {
            if (Float.isNaN(expected[i])) {
                assertTrue(Float.isNaN(actual[i]), what + ": element " + i + " should be NaN, is " + actual[i]);
            } else {
                assertEquals(Float.floatToRawIntBits(expected[i]), Float.floatToRawIntBits(actual[i]),
                        what + ": element " + i + " (" + expected[i] + " vs " + actual[i] + ")");
            }
        }
    }

    /** A packed copy larger than a huge page (the mapped buffer of {@link LargePages}) gives the unpacked bits. */
    @Test
    void aPackedCopyLargerThanAHugePageGivesTheUnpackedBits() {
        Random random = new Random(SEED ^ 41);
        int rows = 1000;
        int cols = 4096;  // 1000 Q4_0 rows of 4096: 2.3 MB
        try (Arena arena = Arena.ofConfined()) {
            WeightMatrix m = fixture(GgmlType.Q4_0, rows, cols, random, arena).matrix();
            float[] x = Float64Reference.gaussian(random, cols, 1);
            float[] unpacked = poisoned(rows);
            m.matvec(x, unpacked, two);
            m.packForCpu(two);
            float[] packed = poisoned(rows);
            m.matvec(x, packed, two);
            assertBitsEqual(unpacked, packed, (m.packedForCpu() ? "packed" : "unpacked") + " Q4_0 " + rows + " x "
                    + cols + ", seed " + SEED);
        }
    }

    /**
     * Matrices of several formats and heights over one input in one pool call (the q, k and v projections) give
     * each matrix's own matvec bits and write every element; batches of vectors go through each matmul.
     */
    @Test
    void matmulAllGivesEachMatrixsOwnBits() {
        Random random = new Random(SEED ^ 57);
        int cols = 256;
        try (Arena arena = Arena.ofConfined()) {
            WeightMatrix[] ms = {fixture(GgmlType.Q4_0, 300, cols, random, arena).matrix(),
                    fixture(GgmlType.F16, 67, cols, random, arena).matrix(),
                    fixture(GgmlType.Q8_0, 129, cols, random, arena).matrix()};
            for (int n : new int[] {1, 3}) {
                float[] x = Float64Reference.gaussian(random, n * cols, 1);
                float[][] outs = new float[ms.length][];
                for (int i = 0; i < ms.length; i++) {
                    outs[i] = poisoned(n * ms[i].rows());
                }
                WeightMatrix.matmulAll(ms, x, n, outs, three);
                for (int i = 0; i < ms.length; i++) {
                    float[] want = poisoned(n * ms[i].rows());
                    ms[i].matmul(x, n, want, Parallel.serial());
                    assertBitsEqual(want, outs[i], "matrix " + i + ", " + n + " vectors, seed " + SEED);
                }
            }
            assertThrows(IllegalArgumentException.class,
                    () -> WeightMatrix.matmulAll(ms, new float[cols], 1, new float[2][], two));
        }
    }

    private static void assertBitsEqual(float[] expected, float[] actual, String what) {
        for (int i = 0; i < expected.length; i++) {
            assertFalse(Float.isNaN(actual[i]) && !Float.isNaN(expected[i]), what + ": element " + i + " not written");
            assertEquals(Float.floatToRawIntBits(expected[i]), Float.floatToRawIntBits(actual[i]),
                    what + ": element " + i);
        }
    }

    @Test
    void matmulMatchesFloat64ReferenceOnAPromptSizedBatch() {
        Random random = new Random(SEED ^ 99);
        int rows = 130;
        int cols = 512;
        int n = 37;
        try (Arena arena = Arena.ofConfined()) {
            for (GgmlType type : new GgmlType[]{GgmlType.F16, GgmlType.Q8_0, GgmlType.Q4_K}) {
                Fixture fx = fixture(type, rows, cols, random, arena);
                float[] x = Float64Reference.gaussian(random, n * cols, 1);
                float[] out = poisoned(n * rows);
                fx.matrix().matmul(x, n, out, two);
                for (int i = 0; i < n; i++) {
                    for (int r = 0; r < rows; r++) {
                        double expected = Float64Reference.dot(fx.reference()[r], x, i * cols);
                        double bound = Float64Reference.bound(cols,
                                Float64Reference.absDot(fx.reference()[r], x, i * cols));
                        assertTrue(Math.abs(out[i * rows + r] - expected) <= bound,
                                "vector " + i + " row " + r + ", " + where(type, rows, cols));
                    }
                }
            }
        }
    }

    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void dequantizeRowIsTheFormatsDequantizationOfThatRow(GgmlType type) {
        Random random = new Random(SEED ^ (21 + type.ordinal()));
        int cols = widths(type)[widths(type).length - 1];
        try (Arena arena = Arena.ofConfined()) {
            Fixture fx = fixture(type, 5, cols, random, arena);
            for (int r = 0; r < 5; r++) {
                float[] row = poisoned(cols + 2);
                fx.matrix().dequantizeRow(r, row, 1);
                assertTrue(Float.isNaN(row[0]) && Float.isNaN(row[cols + 1]));
                for (int i = 0; i < cols; i++) {
                    double tolerance = 0.5 * Math.ulp(row[1 + i]) + 1e-15 * Math.abs(fx.reference()[r][i]);
                    assertTrue(Math.abs(row[1 + i] - fx.reference()[r][i]) <= tolerance,
                            "row " + r + " value " + i + ", " + where(type, 5, cols));
                }
            }
            assertThrows(IndexOutOfBoundsException.class, () -> fx.matrix().dequantizeRow(5, new float[cols], 0));
        }
    }

    @Test
    void shapeErrorsNameTheTensor() {
        try (Arena arena = Arena.ofConfined()) {
            WeightFormat q4k = WeightFormat.of(GgmlType.Q4_K);
            IllegalArgumentException notBlocks = assertThrows(IllegalArgumentException.class,
                    () -> new WeightMatrix("blk.3.ffn_down.weight", q4k, arena.allocate(144 * 4), 4, 200));
            assertTrue(notBlocks.getMessage().contains("blk.3.ffn_down.weight")
                    && notBlocks.getMessage().contains("256"), notBlocks.getMessage());
            IllegalArgumentException tooShort = assertThrows(IllegalArgumentException.class,
                    () -> new WeightMatrix("output.weight", q4k, arena.allocate(144 * 3), 4, 256));
            assertTrue(tooShort.getMessage().contains("output.weight")
                    && tooShort.getMessage().contains("576") && tooShort.getMessage().contains("432"),
                    tooShort.getMessage());
            WeightMatrix m = new WeightMatrix("token_embd.weight", q4k, arena.allocate(144 * 4), 4, 256);
            IllegalArgumentException shortX = assertThrows(IllegalArgumentException.class,
                    () -> m.matvec(new float[255], new float[4], Parallel.serial()));
            assertTrue(shortX.getMessage().contains("token_embd.weight"), shortX.getMessage());
        }
    }

    @Test
    void aHeapSegmentIsCopiedAndGivesTheSameBits() {
        Random random = new Random(SEED ^ 5);
        try (Arena arena = Arena.ofConfined()) {
            Fixture fx = fixture(GgmlType.Q6_K, 9, 512, random, arena);
            byte[] bytes = fx.matrix().data().toArray(ValueLayout.JAVA_BYTE);
            WeightMatrix heap = new WeightMatrix("heap", fx.matrix().format(), MemorySegment.ofArray(bytes), 9, 512);
            float[] x = Float64Reference.gaussian(random, 512, 1);
            float[] a = poisoned(9);
            float[] b = poisoned(9);
            fx.matrix().matvec(x, a, two);
            heap.matvec(x, b, two);
            for (int r = 0; r < 9; r++) {
                assertEquals(Float.floatToRawIntBits(a[r]), Float.floatToRawIntBits(b[r]), "row " + r);
            }
        }
    }

    @Test
    void usingAMatrixAfterItsArenaClosedIsAnError() {
        Arena arena = Arena.ofConfined();
        WeightMatrix m = new WeightMatrix("closed", WeightFormat.of(GgmlType.Q8_0), arena.allocate(34 * 2), 2, 32);
        arena.close();
        IllegalStateException e = assertThrows(IllegalStateException.class,
                () -> m.matvec(new float[32], new float[2], Parallel.serial()));
        assertTrue(e.getMessage().contains("closed"), e.getMessage());
    }
}
