package dev.kvant.cuda.model;

import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.TestSeed;
import dev.kvant.sample.Sampler;
import dev.kvant.tensor.WeightFormat;
import dev.kvant.tensor.WeightMatrix;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * The decode products of model.cu one launch at a time against a float64 reference on the host: every quantized
 * layout through the 8-bit vectors, on the tensor cores and with dp4a, for 1, 3 and 8 vectors, every output mode,
 * row counts that leave a partial tile and widths that leave a partial group. The output starts poisoned (NaN), so
 * every element a launch must write is checked and every other must still be poison. Each vector of every launch
 * must also have, bit for bit, what the one-vector product gives it alone: batching never changes a sequence's
 * output.
 */
@Tag("gpu")
class ModelKernelsGpuTest extends ModelKernelsGpuFixture {

    @ParameterizedTest
    @EnumSource(value = WeightLayout.class, names = {"Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void eightBitProductsMatchAFloat64ReferenceAndGiveEachVectorTheSameBitsAloneOrInABatch(WeightLayout layout) {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        boolean superBlocks = superBlocks(layout);
        // a partial 16-row tile (and a partial 8-output SwiGLU tile); Q8_0/Q4_0: a partial 256-column group, and
        // rows of 73 blocks (a lane's third block, in a partial round of the one-vector kernels' loads)
        int[] widths = superBlocks ? new int[] {256, 768} : new int[] {96, 352, 1024, 2336};
        for (int cols : widths) {
            int rows = 2 * 37;  // SwiGLU: 37 gate rows, then 37 up rows
            try (Arena arena = Arena.ofConfined()) {
                WeightMatrix w = randomMatrix(layout, rows, cols, random, arena);
                double[][] weights = new double[rows][cols];
                float[] row = new float[cols];
                for (int r = 0; r < rows; r++) {
                    w.dequantizeRow(r, row, 0);
                    for (int c = 0; c < cols; c++) {
                        weights[r][c] = row[c];
                    }
                }
                try (DeviceMatrix m = DeviceMatrix.upload(context, w)) {
                    check(layout, m, weights, random, seed);
                }
            }
        }
    }

    /**
     * A projection of two 8-bit formats side by side (Q4_K_M's usual q|k|v: q and k in Q4_K, v in Q6_K) takes the
     * dequantizing products part by part: each part's outputs land at its row offset of the shared output rows, and
     * the partial-sum buffer serves both. Against float64 sums of the CPU's dequantized weights (to within their
     * f16 rounding), 1, 20 and 45 tokens, NaN-poisoned output.
     */
    @Test
    void mixedFormatPartsTakeTheDequantizingProductsPartByPart() {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        int cols = 512, rowsA = 96, rowsB = 40, rows = rowsA + rowsB, maxVectors = 45;
        try (Arena arena = Arena.ofConfined()) {
            WeightMatrix a = randomMatrix(WeightLayout.Q4_K, rowsA, cols, random, arena);
            WeightMatrix b = randomMatrix(WeightLayout.Q6_K, rowsB, cols, random, arena);
            double[][] w = new double[rows][cols];
            float[] row = new float[cols];
            for (int r = 0; r < rows; r++) {
                (r < rowsA ? a : b).dequantizeRow(r < rowsA ? r : r - rowsA, row, 0);
                for (int c = 0; c < cols; c++) {
                    w[r][c] = row[c];
                }
            }
            double[][] x = new double[maxVectors][cols];
            short[] xh = randomHalves(x, random);
            try (Projection p = Projection.upload(context, a, b);
                 DeviceBuffer xd = context.allocate(2L * xh.length);
                 DeviceBuffer out = context.allocate(4L * maxVectors * rows);
                 DeviceBuffer partial = context.allocate(p.gemmScratchBytes(maxVectors))) {
                assertEquals(2, p.parts(), "two formats, two parts");
                xd.copyFromHost(MemorySegment.ofArray(xh));
                for (int n : new int[] {1, 20, maxVectors}) {
                    assertTrue(p.fused(n));
                    out.fillFloats(Float.NaN);
                    p.gemm(kernels, null, xd, n, out, false, partial, stream);
                    stream.synchronize();
                    float[] got = new float[maxVectors * rows];
                    out.copyToHost(MemorySegment.ofArray(got));
                    for (int i = 0; i < got.length; i++) {
                        int k = i / rows, r = i % rows;
                        if (k >= n) {
                            assertEquals(Float.floatToRawIntBits(Float.NaN), Float.floatToRawIntBits(got[i]),
                                    n + " tokens: element " + i + " past the outputs was written (seed " + seed + ")");
                            continue;
                        }
                        double expect = dot(w[r], x[k]);
                        double err = Math.abs(got[i] - expect);
                        if (!(err <= 1e-3 * norm(w[r], x[k]) + 1e-6)) {
                            fail(n + " tokens: out[" + k + "][" + r + "] (" + (r < rowsA ? "Q4_K" : "Q6_K")
                                    + " part) = " + got[i] + ", float64 " + expect + " (seed " + seed + ")");
                        }
                    }
                }
            }
        }
    }

    /**
     * kvant_rmsnorm gives, bit for bit, the order its comment documents, computed here in Java floats: 1,024 virtual
     * threads' fmaf chains over their 4-value chunks, butterflies over each 32 of them and over the 32 sums, then
     * v·inv·w, the f16 of that, and 8-bit codes per 32 values — whatever the blocks that play the virtual threads.
     * Rows of 96 (one slice, most threads idle), 4,096 (one chunk a virtual thread), 5,120 (a partial second pass)
     * and 16,384 values (four passes), three rows a launch, outputs poisoned first.
     */
    @Test
    void rmsnormGivesTheBitsOfItsDocumentedOrder() {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        int n = 3;
        for (int dim : new int[] {96, 4096, 5120, ModelKernels.MAX_NORM_WIDTH}) {
            String what = "dim " + dim + " (seed " + seed + ")";
            float[] x = new float[n * dim], w = new float[dim];
            for (int i = 0; i < x.length; i++) {
                x[i] = (float) (random.nextGaussian() * Math.exp(random.nextDouble(-3, 3)));
            }
            for (int i = 0; i < dim; i++) {
                w[i] = (float) random.nextDouble(-2, 2);
            }
            float eps = 1e-5f;
            try (DeviceBuffer xd = context.allocate(4L * x.length);
                 DeviceBuffer wd = context.allocate(4L * dim);
                 DeviceBuffer yf = context.allocate(4L * n * dim);
                 DeviceBuffer yq = context.allocate((long) n * dim);
                 DeviceBuffer ys = context.allocate(8L * n * (dim / 32));
                 DeviceBuffer yh = context.allocate(2L * n * dim)) {
                xd.copyFromHost(MemorySegment.ofArray(x));
                wd.copyFromHost(MemorySegment.ofArray(w));
                for (DeviceBuffer b : List.of(yf, yq, ys, yh)) {
                    b.fillBytes((byte) 0x7F);
                }
                kernels.rmsnorm(xd, wd, new ModelKernels.Vectors(yf, yq, ys, dim), n, dim, eps, stream);
                kernels.rmsnormHalf(xd, wd, yh, n, dim, eps, stream);
                stream.synchronize();
                float[] gotF = new float[n * dim];
                yf.copyToHost(MemorySegment.ofArray(gotF));
                byte[] gotQ = new byte[n * dim];
                yq.copyToHost(MemorySegment.ofArray(gotQ));
                float[] gotS = new float[2 * n * (dim / 32)];
                ys.copyToHost(MemorySegment.ofArray(gotS));
                short[] gotH = new short[n * dim];
                yh.copyToHost(MemorySegment.ofArray(gotH));
                for (int r = 0; r < n; r++) {
                    float[] sums = new float[ModelKernels.NORM_THREADS];
                    for (int v = 0; v < sums.length; v++) {
                        float ss = 0f;
                        for (int c = v; c < dim / 4; c += ModelKernels.NORM_THREADS) {
                            for (int e = 0; e < 4; e++) {
                                float a = x[r * dim + 4 * c + e];
                                ss = Math.fma(a, a, ss);
                            }
                        }
                        sums[v] = ss;
                    }
                    float[] warps = new float[32];
                    for (int g = 0; g < 32; g++) {
                        warps[g] = butterfly(sums, 32 * g);
                    }
                    float total = butterfly(warps, 0);
                    float inv = 1f / (float) Math.sqrt(total / (float) dim + eps);
                    for (int b = 0; b < dim / 32; b++) {
                        float[] o = new float[32];
                        float amax = 0f;
                        for (int e = 0; e < 32; e++) {
                            int i = 32 * b + e;
                            o[e] = x[r * dim + i] * inv * w[i];
                            amax = Math.max(amax, Math.abs(o[e]));
                            assertEquals(Float.floatToRawIntBits(o[e]), Float.floatToRawIntBits(gotF[r * dim + i]),
                                    what + ": row " + r + " value " + i);
                            assertEquals(Float.floatToFloat16(o[e]), gotH[r * dim + i], what + ": f16 of row " + r
                                    + " value " + i);
                        }
                        float d = amax / 127f;
                        int sum = 0;
                        for (int e = 0; e < 32; e++) {
                            int q = d > 0f ? (int) Math.rint(o[e] / d) : 0;
                            sum += q;
                            assertEquals((byte) q, gotQ[r * dim + 32 * b + e], what + ": code of row " + r
                                    + " value " + (32 * b + e));
                        }
                        int at = 2 * (r * (dim / 32) + b);
                        assertEquals(Float.floatToRawIntBits(d), Float.floatToRawIntBits(gotS[at]),
                                what + ": scale of row " + r + " block " + b);
                        assertEquals(Float.floatToRawIntBits(d * (float) sum), Float.floatToRawIntBits(gotS[at + 1]),
                                what + ": scale times code sum of row " + r + " block " + b);
                    }
                }
            }
        }
    }

    /** The value every lane holds after butterflies 16, 8, 4, 2, 1 over a[from .. from + 31] (lane 0's). */
    private static float butterfly(float[] a, int from) {
        float[] v = Arrays.copyOfRange(a, from, from + 32);
        for (int o = 16; o > 0; o >>= 1) {
            float[] next = new float[32];
            for (int l = 0; l < 32; l++) {
                next[l] = v[l] + v[l ^ o];
            }
            v = next;
        }
        return v[0];
    }

    /** x.length vectors of standard normal f16 values, row after row; x gets their values. */
    private static short[] randomHalves(double[][] x, SplittableRandom random) {
        int cols = x[0].length;
        short[] h = new short[x.length * cols];
        for (int k = 0; k < x.length; k++) {
            for (int c = 0; c < cols; c++) {
                h[k * cols + c] = Float.floatToFloat16((float) random.nextGaussian());
                x[k][c] = Float.float16ToFloat(h[k * cols + c]);
            }
        }
        return h;
    }

    /**
     * A NaN stays visible through the 8-bit vectors and the greedy choice, as on the CPU: a NaN activation makes its
     * block's scale NaN (quantize, and rmsnorm's 8-bit output under a NaN weight; fmaxf used to drop it and code the
     * value as 0, so the products came out finite), and the output product's argmax key ranks a NaN logit below every number, as
     * Sampler.argmax does (its bits used to rank it above +inf). Output heads in Q8_0 (8-bit vectors) and F16 (float
     * vectors) with NaN rows; of three vectors the last holds a NaN, so all its logits are NaN and its token is 0;
     * each vector again alone, through the one-vector kernels of a decode step.
     */
    @ParameterizedTest
    @EnumSource(value = WeightLayout.class, names = {"Q8_0", "F16"})
    void aNaNStaysVisibleThroughTheVectorsAndRanksLowestInTheGreedyKey(WeightLayout layout) {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        int vocab = 300, cols = 256, nvec = 3, nb = cols / 32;
        int[] nanRows = {0, 5, 123, 299};
        float[] x = new float[nvec * cols];
        for (int i = 0; i < x.length; i++) {
            x[i] = (float) random.nextGaussian();
        }
        x[2 * cols + 77] = Float.NaN;
        try (Arena arena = Arena.ofConfined()) {
            WeightMatrix w = randomMatrix(layout, vocab, cols, random, arena);
            MemorySegment data = w.data();
            long rowBytes = data.byteSize() / vocab;
            for (int r : nanRows) {   // an f16 NaN: the first block's scale (Q8_0) or the first weight (F16)
                data.set(ValueLayout.JAVA_SHORT_UNALIGNED, r * rowBytes, (short) 0x7E00);
            }
            try (DeviceMatrix m = DeviceMatrix.upload(context, w);
                 DeviceBuffer xd = upload(MemorySegment.ofArray(x));
                 DeviceBuffer xq = context.allocate((long) nvec * cols);
                 DeviceBuffer xs = context.allocate(8L * nvec * nb);
                 DeviceBuffer normWeights = upload(MemorySegment.ofArray(normWeights(cols, 77)));
                 DeviceBuffer normed = context.allocate(4L * nvec * cols);
                 DeviceBuffer nq = context.allocate((long) nvec * cols);
                 DeviceBuffer ns = context.allocate(8L * nvec * nb);
                 DeviceBuffer logits = context.allocate(4L * nvec * vocab);
                 DeviceBuffer best = context.allocate(8L * nvec)) {
                ModelKernels.Vectors v = new ModelKernels.Vectors(xd, xq, xs, cols);
                kernels.quantize(v, nvec, stream);
                kernels.rmsnorm(xd, normWeights, new ModelKernels.Vectors(normed, nq, ns, cols), nvec, cols, 1e-5f, stream);
                logits.fillFloats(0f);
                best.fillBytes((byte) 0);
                kernels.logits(m, vocab, v, nvec, logits, best, stream);
                stream.synchronize();
                String what = layout + " (seed " + seed + ")";
                float[] scales = floats(xs, 2 * nvec * nb);
                float[] normScales = floats(ns, 2 * nvec * nb);
                for (int k = 0; k < nvec; k++) {
                    for (int b = 0; b < nb; b++) {
                        boolean nan = k == 2 && b == 77 / 32;
                        assertEquals(nan, Float.isNaN(scales[2 * (k * nb + b)]), what + ": quantize, vector " + k
                                + " block " + b);
                        // rmsnorm: weight 77 is NaN, so that block of every vector; vector 2's norm, so all of it
                        assertEquals(k == 2 || b == 77 / 32, Float.isNaN(normScales[2 * (k * nb + b)]),
                                what + ": rmsnorm, vector " + k + " block " + b);
                    }
                }
                float[] got = floats(logits, nvec * vocab);
                MemorySegment keys = download(best);
                for (int k = 0; k < nvec; k++) {
                    float[] row = Arrays.copyOfRange(got, k * vocab, (k + 1) * vocab);
                    for (int r = 0; r < vocab; r++) {
                        boolean nan = k == 2 || Arrays.binarySearch(nanRows, r) >= 0;
                        assertEquals(nan, Float.isNaN(row[r]), what + ": logit " + r + " of vector " + k);
                    }
                    int token = ModelKernels.argmaxIndex(keys.getAtIndex(ValueLayout.JAVA_LONG, k));
                    assertEquals(Sampler.argmax(row, vocab), token, what + ": greedy token of vector " + k);
                    assertFalse(k < 2 && Float.isNaN(row[token]), what + ": vector " + k + " chose a NaN logit");
                    // the one-vector product (a decode step's kernel) alone: the same logits and the same token
                    logits.fillFloats(0f);
                    best.fillBytes((byte) 0);
                    kernels.logits(m, vocab, v.from(k), 1, logits, best, stream);
                    stream.synchronize();
                    float[] alone = floats(logits, vocab);
                    for (int r = 0; r < vocab; r++) {
                        assertEquals(Float.isNaN(row[r]), Float.isNaN(alone[r]), what + ": logit " + r + " of vector "
                                + k + " alone");
                    }
                    assertEquals(token, ModelKernels.argmaxIndex(download(best).getAtIndex(ValueLayout.JAVA_LONG, 0)),
                            what + ": greedy token of vector " + k + " alone");
                }
            }
        }
    }

    /**
     * The f16 operands of the prompt's GEMMs saturate: a value past the f16 range becomes ±65504, not ±inf (an
     * infinity in a GEMM operand makes NaN of its zero products); NaN stays NaN; values in range round to nearest
     * even as Float.floatToFloat16 does.
     */
    @Test
    void halfOperandsSaturateInsteadOfOverflowing() {
        float[] x = {1e6f, -1e6f, 65519f, 65520f, -65520f, Float.POSITIVE_INFINITY, Float.NEGATIVE_INFINITY,
                Float.NaN, 1.5f, -3e-8f, 65504f, 0f};
        short max = Float.floatToFloat16(65504f);
        short[] want = {max, (short) (max | 0x8000), max, max, (short) (max | 0x8000), max, (short) (max | 0x8000),
                0, Float.floatToFloat16(1.5f), Float.floatToFloat16(-3e-8f), max, 0};
        try (DeviceBuffer xd = upload(MemorySegment.ofArray(x));
             DeviceBuffer out = context.allocate(2L * x.length)) {
            out.fillBytes((byte) 0x55);
            kernels.toHalf(xd, out, x.length, stream);
            stream.synchronize();
            short[] got = new short[x.length];
            out.copyToHost(MemorySegment.ofArray(got));
            for (int i = 0; i < x.length; i++) {
                if (Float.isNaN(x[i])) {
                    assertTrue(Float.isNaN(Float.float16ToFloat(got[i])), "NaN became " + got[i]);
                } else {
                    assertEquals(want[i], got[i], "f16 of " + x[i]);
                }
            }
        }
    }

    /** n RMSNorm weights of 1, weight nan NaN. */
    private static float[] normWeights(int n, int nan) {
        float[] a = new float[n];
        Arrays.fill(a, 1f);
        a[nan] = Float.NaN;
        return a;
    }

    private static float[] floats(DeviceBuffer b, int n) {
        float[] a = new float[n];
        b.slice(0, 4L * n).copyToHost(MemorySegment.ofArray(a));
        return a;
    }

    /** K-quant layouts: rows in 256-value super-blocks, so widths are multiples of 256. */
    private static boolean superBlocks(WeightLayout layout) {
        return layout == WeightLayout.Q4_K || layout == WeightLayout.Q5_K || layout == WeightLayout.Q6_K;
    }

    /** rows x cols weights drawn from N(0, 0.05²), quantized to the layout's GGUF format in the arena. */
    private static WeightMatrix randomMatrix(WeightLayout layout, int rows, int cols, SplittableRandom random,
                                             Arena arena) {
        WeightFormat format = WeightFormat.of(layout.type);
        float[] values = new float[rows * cols];
        for (int i = 0; i < values.length; i++) {
            values[i] = (float) random.nextGaussian() * 0.05f;
        }
        long rowBytes = format.bytesFor(cols);
        MemorySegment data = arena.allocate(rowBytes * rows, 16);
        for (int r = 0; r < rows; r++) {
            format.quantize(values, r * cols, cols, data, r * rowBytes);
        }
        return new WeightMatrix("w", format, data, rows, cols);
    }

    private static void check(WeightLayout layout, DeviceMatrix m, double[][] weights, SplittableRandom random,
                              long seed) {
        int rows = m.rows(), cols = m.cols(), nb = cols / 32;
        int maxVectors = ModelKernels.MAX_VECTORS;
        float[] x = new float[maxVectors * cols];
        for (int i = 0; i < x.length; i++) {
            x[i] = (float) random.nextGaussian();
        }
        float[] bias = new float[rows];
        for (int i = 0; i < rows; i++) {
            bias[i] = (float) random.nextGaussian();
        }
        try (DeviceBuffer xf = context.allocate(4L * x.length);
             DeviceBuffer xq = context.allocate((long) maxVectors * cols);
             DeviceBuffer xs = context.allocate(8L * maxVectors * nb);
             DeviceBuffer out = context.allocate(4L * maxVectors * rows);
             DeviceBuffer alone = context.allocate(4L * maxVectors * rows);
             DeviceBuffer db = context.allocate(4L * rows)) {
            xf.copyFromHost(MemorySegment.ofArray(x));
            db.copyFromHost(MemorySegment.ofArray(bias));
            ModelKernels.Vectors v = new ModelKernels.Vectors(xf, xq, xs, cols);
            kernels.quantize(v, maxVectors, stream);
            stream.synchronize();
            // the reference multiplies the dequantized weights by the vectors' 8-bit form, as the kernels do
            byte[] q = new byte[maxVectors * cols];
            xq.copyToHost(MemorySegment.ofArray(q));
            float[] ds = new float[2 * maxVectors * nb];
            xs.copyToHost(MemorySegment.ofArray(ds));
            double[][] xr = new double[maxVectors][cols];
            for (int k = 0; k < maxVectors; k++) {
                for (int c = 0; c < cols; c++) {
                    xr[k][c] = (double) ds[2 * (k * nb + c / 32)] * q[k * cols + c];
                }
            }
            // {vectors, rows a warp}: 0 is the backend's choice (one vector: dp4a), 1 or 2 a one-vector dp4a kernel,
            // 16 the tensor cores
            int t = ModelKernels.TENSOR_TILE;
            int[][] launches = {{1, 0}, {1, 1}, {1, 2}, {1, t}, {3, t}, {8, t}, {8, 0}};
            for (int mode : new int[] {ModelKernels.MV_STORE, ModelKernels.MV_ADD, ModelKernels.MV_SWIGLU}) {
                int outputs = mode == ModelKernels.MV_SWIGLU ? rows / 2 : rows;
                boolean withBias = mode == ModelKernels.MV_STORE;
                for (int[] launch : launches) {
                    int nvec = launch[0];
                    if (mode == ModelKernels.MV_SWIGLU && launch[1] == 1) {
                        continue;   // a gate row and its up row go to one warp
                    }
                    String what = layout + " " + cols + " columns, mode " + mode + ", " + nvec + " vectors, "
                            + (launch[1] == 0 ? "the backend's kernel" : launch[1] == t ? "tensor cores"
                            : "dp4a, " + launch[1] + " rows a warp") + ", seed " + seed;
                    float[] start = new float[maxVectors * rows];
                    for (int i = 0; i < start.length; i++) {
                        start[i] = mode == ModelKernels.MV_ADD ? (float) random.nextGaussian() : Float.NaN;
                    }
                    out.copyFromHost(MemorySegment.ofArray(start));
                    if (launch[1] == 0) {
                        kernels.matvec(true, m, outputs, v, nvec, out, outputs, withBias ? db : null, mode, outputs,
                                null, stream);
                    } else {
                        kernels.matvec(true, launch[1], m, outputs, v, nvec, out, outputs, withBias ? db : null, mode,
                                outputs, null, stream);
                    }
                    stream.synchronize();
                    float[] got = new float[maxVectors * rows];
                    out.copyToHost(MemorySegment.ofArray(got));
                    for (int i = nvec * outputs; i < got.length; i++) {
                        assertEquals(Float.floatToRawIntBits(start[i]), Float.floatToRawIntBits(got[i]),
                                what + ": element " + i + " past the outputs was written");
                    }
                    for (int i = 0; i < nvec * outputs; i++) {
                        int k = i / outputs, r = i % outputs;
                        double expect;
                        double scale;
                        if (mode == ModelKernels.MV_SWIGLU) {
                            double g = dot(weights[r], xr[k]), u = dot(weights[outputs + r], xr[k]);
                            expect = g / (1 + Math.exp(-g)) * u;
                            scale = (norm(weights[r], xr[k]) + 1e-3)
                                    * (Math.abs(u) + norm(weights[outputs + r], xr[k]));
                        } else {
                            expect = dot(weights[r], xr[k]) + (withBias ? bias[r] : 0)
                                    + (mode == ModelKernels.MV_ADD ? start[i] : 0);
                            scale = norm(weights[r], xr[k]) + Math.abs(expect);
                        }
                        double err = Math.abs(got[i] - expect);
                        if (!(err <= 1e-5 * scale + 1e-6)) {
                            fail(what + ": out[" + k + "][" + r + "] = " + got[i] + ", float64 " + expect
                                    + " (error " + err + ", scale " + scale + ")");
                        }
                    }
                    if (mode == ModelKernels.MV_ADD) {
                        continue;
                    }
                    // every vector of the launch has the bits the backend's one-vector product gives it alone
                    for (int k = 0; k < nvec; k++) {
                        alone.fillFloats(Float.NaN);
                        kernels.matvec(true, m, outputs, v.from(k), 1, alone, outputs, withBias ? db : null, mode,
                                outputs, null, stream);
                        stream.synchronize();
                        float[] one = new float[outputs];
                        alone.slice(0, 4L * outputs).copyToHost(MemorySegment.ofArray(one));
                        for (int r = 0; r < outputs; r++) {
                            assertEquals(Float.floatToRawIntBits(one[r]), Float.floatToRawIntBits(got[k * outputs + r]),
                                    what + ": out[" + k + "][" + r + "] differs from the vector's product alone");
                        }
                    }
                }
            }
        }
    }

    /**
     * The dequantizing f16 products (prompt chunks): against float64 sums of the f16 weights kvant_dequant_* writes
     * (the cuBLASLt path's operand) times the f16 vectors, for 1 to 45 vectors (two blocks of 32), row counts that
     * leave a partial 64-row block, widths that leave a partial group and widths that split the columns (with the
     * partial-sum buffer; without it, one range). Stores leave the row stride's gap poisoned; adds add; two runs give
     * the same bits.
     */
    @ParameterizedTest
    @EnumSource(value = WeightLayout.class, names = {"Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void dequantizingHalfProductsMatchTheirF16WeightsInFloat64(WeightLayout layout) {
        long seed = TestSeed.next();
        SplittableRandom random = new SplittableRandom(seed);
        boolean superBlocks = superBlocks(layout);
        int[] widths = superBlocks ? new int[] {256, 2304} : new int[] {96, 352, 512, 2080};
        int rows = 200;
        for (int cols : widths) {
            try (Arena arena = Arena.ofConfined()) {
                WeightMatrix w = randomMatrix(layout, rows, cols, random, arena);
                float[][] cpu = new float[rows][cols];
                for (int r = 0; r < rows; r++) {
                    w.dequantizeRow(r, cpu[r], 0);
                }
                try (DeviceMatrix m = DeviceMatrix.upload(context, w)) {
                    checkHalf(layout, m, cpu, random, seed);
                }
            }
        }
    }

    private static void checkHalf(WeightLayout layout, DeviceMatrix m, float[][] cpu, SplittableRandom random,
                                  long seed) {
        int rows = m.rows(), cols = m.cols(), maxVectors = 45, stride = rows + 3;
        double[][] x = new double[maxVectors][cols];
        short[] xh = randomHalves(x, random);
        try (DeviceBuffer wh = context.allocate(2L * rows * cols);
             DeviceBuffer xd = context.allocate(2L * xh.length);
             DeviceBuffer out = context.allocate(4L * maxVectors * stride);
             DeviceBuffer partial = context.allocate(4L * ModelKernels.MH_MAX_SPLITS * maxVectors * rows)) {
            kernels.dequantize(m, wh, stream);
            stream.synchronize();
            short[] w16 = new short[rows * cols];
            wh.copyToHost(MemorySegment.ofArray(w16));
            double[][] w = new double[rows][cols];
            for (int r = 0; r < rows; r++) {
                for (int c = 0; c < cols; c++) {
                    w[r][c] = Float.float16ToFloat(w16[r * cols + c]);
                    // the f16 weights are the format's values (the CPU's dequantization) to within an f16 rounding
                    double bound = Math.abs(cpu[r][c]) * 0x1p-10 + 0x1p-24;
                    if (!(Math.abs(w[r][c] - cpu[r][c]) <= bound)) {
                        fail(layout + " " + rows + " x " + cols + ": kvant_dequant_* gives w[" + r + "][" + c + "] = "
                                + w[r][c] + ", the CPU " + cpu[r][c]);
                    }
                }
            }
            // one-hot vectors: each output is exactly one f16 weight, so the products decode every weight they read
            // to the very value kvant_dequant_* wrote (every other term adds a zero)
            short[] hot = new short[ModelKernels.MH_VECTORS * cols];
            int[] at = new int[ModelKernels.MH_VECTORS];
            for (int k = 0; k < at.length; k++) {
                at[k] = (int) ((k * 97L + 31) % cols);
                hot[k * cols + at[k]] = Float.floatToFloat16(1f);
            }
            xd.copyFromHost(MemorySegment.ofArray(hot));
            out.fillFloats(Float.NaN);
            kernels.matmulHalf(m, xd, at.length, out, stride, false, partial, stream);
            stream.synchronize();
            float[] exact = new float[maxVectors * stride];
            out.copyToHost(MemorySegment.ofArray(exact));
            for (int k = 0; k < at.length; k++) {
                for (int r = 0; r < rows; r++) {
                    float expect = Float.float16ToFloat(w16[r * cols + at[k]]);
                    if (exact[k * stride + r] != expect) {
                        fail(layout + " " + rows + " x " + cols + ": one-hot column " + at[k] + " gives row " + r + " "
                                + exact[k * stride + r] + ", its f16 weight is " + expect + " (seed " + seed + ")");
                    }
                }
            }
            xd.copyFromHost(MemorySegment.ofArray(xh));
            for (int n : new int[] {1, 5, 32, 45}) {
                for (boolean accumulate : new boolean[] {false, true}) {
                    for (DeviceBuffer p : new DeviceBuffer[] {partial, null}) {
                        String what = layout + " " + rows + " x " + cols + ", " + n + " vectors, "
                                + (accumulate ? "adding" : "storing") + (p == null ? ", one column range" : "")
                                + ", seed " + seed;
                        float[] start = new float[maxVectors * stride];
                        for (int i = 0; i < start.length; i++) {
                            start[i] = accumulate ? (float) random.nextGaussian() : Float.NaN;
                        }
                        float[] got = new float[start.length];
                        for (int run = 0; run < 2; run++) {
                            out.copyFromHost(MemorySegment.ofArray(start));
                            kernels.matmulHalf(m, xd, n, out, stride, accumulate, p, stream);
                            stream.synchronize();
                            float[] again = new float[start.length];
                            out.copyToHost(MemorySegment.ofArray(again));
                            if (run == 1) {
                                for (int i = 0; i < got.length; i++) {
                                    assertEquals(Float.floatToRawIntBits(got[i]), Float.floatToRawIntBits(again[i]),
                                            what + ": element " + i + " differs between two runs");
                                }
                            }
                            got = again;
                        }
                        for (int i = 0; i < got.length; i++) {
                            int k = i / stride, r = i % stride;
                            if (k >= n || r >= rows) {
                                assertEquals(Float.floatToRawIntBits(start[i]), Float.floatToRawIntBits(got[i]),
                                        what + ": element " + i + " past the outputs was written");
                                continue;
                            }
                            double expect = dot(w[r], x[k]) + (accumulate ? start[i] : 0);
                            double scale = norm(w[r], x[k]) + Math.abs(expect);
                            double err = Math.abs(got[i] - expect);
                            if (!(err <= 1e-5 * scale + 1e-6)) {
                                fail(what + ": out[" + k + "][" + r + "] = " + got[i] + ", float64 " + expect
                                        + " (error " + err + ", scale " + scale + ")");
                            }
                        }
                    }
                }
            }
        }
    }

    private static double dot(double[] w, double[] x) {
        double s = 0;
        for (int i = 0; i < w.length; i++) {
            s += w[i] * x[i];
        }
        return s;
    }

    private static double norm(double[] w, double[] x) {
        double s = 0;
        for (int i = 0; i < w.length; i++) {
            s += Math.abs(w[i] * x[i]);
        }
        return s;
    }
}
