package dev.kvant.cuda.model;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaFunction;
import dev.kvant.cuda.CudaModule;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.Dim3;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;
import dev.kvant.cuda.Owned;
import dev.kvant.cuda.attention.RopeRows;
import dev.kvant.cuda.attention.RotationSource;

import java.util.EnumMap;
import java.util.List;
import java.util.Map;

/** The kernels of {@code model/model.cu} and their launch geometry (see the file's comments). */
final class ModelKernels implements AutoCloseable {
    /** Output modes of the matrix-vector kernels (model.cu MV_*). */
    static final int MV_STORE = 0;
    static final int MV_ADD = 1;
    static final int MV_SWIGLU = 2;
    /** Warps per block of the matrix-vector kernels (model.cu MV_WARPS). */
    static final int MV_WARPS = 4;
    /** Vectors one wide matrix-vector kernel takes (model.cu: the NV of kvant_mv8_*). */
    static final int MAX_VECTORS = 8;
    /** Warps per block of the tensor-core 8-bit products, and the stages of each warp's ring (model.cu MT_*). */
    static final int MT_WARPS = 4;
    static final int MT_STAGES = 2;
    /** The "rows a warp" that selects the tensor-core 8-bit products: a block's tile of 16 weight rows. */
    static final int TENSOR_TILE = 16;
    /** The dequantizing f16 products (model.cu MH_*): a block's rows and vectors, its warps and ring stages. */
    static final int MH_ROWS = 64;
    static final int MH_VECTORS = 32;
    static final int MH_WARPS = 4;
    static final int MH_STAGES = 2;
    /** Bytes of one vector's 256 f16 in a dequantizing product's stage, padded (model.cu MH_XSTRIDE). */
    static final int MH_XSTRIDE = 544;
    /** At most this many column splits of a dequantizing product (each adds a plane of partial sums). */
    static final int MH_MAX_SPLITS = 8;

    /** model.cu after RoPE and the rotation (whose tables come from the CPU's {@link dev.kvant.kv.Rotation}). */
    static final KernelSource SOURCE = KernelSource.kvant("model/model.cu", RotationSource.header()
            + KernelSource.joined(List.of("rope.cuh", "rotation.cuh", "model/model.cu")));

    private final CudaModule module;
    private final Map<WeightLayout, CudaFunction> mv1 = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> mv8 = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> mq1r2 = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> mq1r1 = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> mt = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> mh = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> embed = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> dequant = new EnumMap<>(WeightLayout.class);
    private final CudaFunction rmsnorm;
    private final CudaFunction ropeSplit;
    private final CudaFunction ropeAngles;
    private final CudaFunction swiglu;
    private final CudaFunction toHalf;
    private final CudaFunction toHalfUnrotated;
    private final CudaFunction addBias;
    private final CudaFunction quantizeQ8;
    private final CudaFunction mhReduce;
    private final CudaFunction draw;
    private final int multiprocessors;
    private final int blocksForStreams;

    ModelKernels(CudaContext context, KernelCache cache) {
        this.module = context.loadModule(cache, SOURCE);
        try {
            for (WeightLayout l : WeightLayout.values()) {
                mv1.put(l, module.function("kvant_mv1_" + l.kernelSuffix));
                mv8.put(l, module.function("kvant_mv8_" + l.kernelSuffix));
                embed.put(l, module.function("kvant_embed_" + l.kernelSuffix));
                if (l.q8Vectors) {
                    mq1r2.put(l, module.function("kvant_mq1r2_" + l.kernelSuffix));
                    mq1r1.put(l, module.function("kvant_mq1r1_" + l.kernelSuffix));
                    CudaFunction f = module.function("kvant_mt_" + l.kernelSuffix);
                    f.setMaxDynamicSharedMemory(mtSharedBytes(l));
                    mt.put(l, f);
                    CudaFunction h = module.function("kvant_mh_" + l.kernelSuffix);
                    h.setMaxDynamicSharedMemory(mhSharedBytes(l));
                    mh.put(l, h);
                }
                dequant.put(l, module.function("kvant_dequant_" + l.kernelSuffix));
            }
            this.rmsnorm = module.function("kvant_rmsnorm");
            this.ropeSplit = module.function("kvant_rope_split");
            this.ropeAngles = module.function("kvant_rope_angles");
            this.swiglu = module.function("kvant_swiglu");
            this.toHalf = module.function("kvant_to_half");
            this.toHalfUnrotated = module.function("kvant_to_half_unrotated");
            this.addBias = module.function("kvant_add_bias");
            this.quantizeQ8 = module.function("kvant_quantize_q8");
            this.mhReduce = module.function("kvant_mh_reduce");
            this.draw = module.function("kvant_draw");
        } catch (RuntimeException | Error e) {
            Owned.closeAfter(e, module);
            throw e;
        }
        this.multiprocessors = context.multiprocessors();
        this.blocksForStreams = multiprocessors * 8;
    }

    /**
     * out[v][r] (row stride outStride) = m[r] · x[v] for v < nvec, per {@code mode}; in MV_SWIGLU the matrix is gate
     * rows then up rows and {@code outputs} = ffn. The quantized formats read the vectors' 8-bit form
     * ({@link Vectors#q8()}), the others their floats.
     */
    void matvec(DeviceMatrix m, int outputs, Vectors x, int nvec, DeviceBuffer out, int outStride, DeviceBuffer bias,
                int mode, int ffn, CudaStream stream) {
        matvec(m.layout().q8Vectors, m, outputs, x, nvec, out, outStride, bias, mode, ffn, null, stream);
    }

    /**
     * Weight rows one warp takes in a one-vector product of the 8-bit kernels: one (two, a gate and an up row, with
     * SwiGLU). More rows a warp share the vector's loads but leave fewer warps to hide memory latency with; on the
     * H200 one row a warp was as fast or faster on every llama3-8b projection (ModelGpuBench, docs/BENCHMARKS.md).
     */
    static int rowsPerWarp(int mode) {
        return mode == MV_SWIGLU ? 2 : 1;
    }

    /** As above with the path chosen: 8-bit vectors ({@link WeightLayout#q8Vectors} formats only) or floats. */
    void matvec(boolean q8, DeviceMatrix m, int outputs, Vectors x, int nvec, DeviceBuffer out, int outStride,
                DeviceBuffer bias, int mode, int ffn, DeviceBuffer best, CudaStream stream) {
        matvec(q8, !q8 ? 4 : nvec == 1 ? rowsPerWarp(mode) : TENSOR_TILE, m, outputs, x, nvec, out, outStride, bias,
                mode, ffn, best, stream);
    }

    /**
     * As above with the kernel chosen by its rows a warp: {@link #TENSOR_TILE} for the 8-bit products on the tensor
     * cores (any number of vectors; the backend's choice for two or more), 1 or 2 for the one-vector dp4a products
     * (2 with SwiGLU), 4 for float vectors. Either 8-bit kernel gives a vector the same bits.
     */
    void matvec(boolean q8, int rowsPerWarp, DeviceMatrix m, int outputs, Vectors x, int nvec, DeviceBuffer out,
                int outStride, DeviceBuffer bias, int mode, int ffn, DeviceBuffer best, CudaStream stream) {
        if (nvec < 1 || nvec > MAX_VECTORS) {
            throw new IllegalArgumentException("matrix-vector launch of " + nvec + " vectors; 1.." + MAX_VECTORS);
        }
        if (x.width() != m.cols()) {
            throw new IllegalArgumentException("vectors of " + x.width() + " for a matrix of " + m.cols()
                    + " columns");
        }
        Object b = bias == null ? 0L : (Object) bias;
        if (q8 && rowsPerWarp == TENSOR_TILE) {
            int perBlock = mode == MV_SWIGLU ? TENSOR_TILE / 2 : TENSOR_TILE;
            mt.get(m.layout()).launch(Dim3.of((outputs + perBlock - 1) / perBlock), Dim3.of(MT_WARPS * 32),
                    mtSharedBytes(m.layout()), stream, m.data(), m.rowStride(), m.scales(), outputs, m.cols(), x.q8(),
                    x.q8Scales(), nvec, out, outStride, b, mode, ffn, orNull(best));
            return;
        }
        if (q8 ? nvec != 1 || rowsPerWarp < 1 || rowsPerWarp > 2 || (mode == MV_SWIGLU && rowsPerWarp < 2)
               : rowsPerWarp != 4) {
            throw new IllegalArgumentException(rowsPerWarp + " rows a warp for " + nvec + " vectors: 8-bit products"
                    + " take 16 (the tensor cores' tile), or 1-2 for one vector (2 with SwiGLU); floats 4");
        }
        int perWarp = mode == MV_SWIGLU ? rowsPerWarp / 2 : rowsPerWarp;
        int warps = (outputs + perWarp - 1) / perWarp;
        int blocks = (warps + MV_WARPS - 1) / MV_WARPS;
        if (q8) {
            CudaFunction f = (rowsPerWarp == 2 ? mq1r2 : mq1r1).get(m.layout());
            f.launch(Dim3.of(blocks), Dim3.of(MV_WARPS * 32), 0, stream, m.data(), m.rowStride(), m.scales(),
                    outputs, m.cols(), x.q8(), x.q8Scales(), nvec, out, outStride, b, mode, ffn, orNull(best));
        } else {
            CudaFunction f = (nvec == 1 ? mv1 : mv8).get(m.layout());
            f.launch(Dim3.of(blocks), Dim3.of(MV_WARPS * 32), 0, stream, m.data(), m.rowStride(), m.scales(),
                    outputs, m.cols(), x.floats(), x.width(), nvec, out, outStride, b, mode, ffn, orNull(best));
        }
    }

    /**
     * out[v][r] (row stride outStride) = or += (accumulate) m[r] · xh[v] for v < n, xh f16 [n][m.cols()]: the
     * dequantizing f16 products (model.cu kvant_mh_*, {@link WeightLayout#q8Vectors} formats), every weight decoded
     * to the f16 value {@link #dequantize} gives it, the sums in f32 on the tensor cores. Where the matrix's rows give
     * too few blocks to fill the GPU, its columns are split in up to {@link #MH_MAX_SPLITS} ranges whose sums go to
     * {@code partial} (as many as fit in it) and are added in order by a second kernel.
     */
    void matmulHalf(DeviceMatrix m, DeviceBuffer xh, int n, DeviceBuffer out, int outStride, boolean accumulate,
                    DeviceBuffer partial, CudaStream stream) {
        if (!m.layout().q8Vectors) {
            throw new IllegalArgumentException(m.layout() + " has no dequantizing f16 products");
        }
        if (n < 1) {
            throw new IllegalArgumentException("product of " + n + " vectors");
        }
        int rows = m.rows();
        int groups = (m.cols() / 32 + 7) / 8;
        long blocks = (long) ((rows + MH_ROWS - 1) / MH_ROWS) * ((n + MH_VECTORS - 1) / MH_VECTORS);
        long fit = partial == null ? 1 : partial.byteSize() / (4L * n * rows);
        int splits = (int) Math.max(1, Math.min(Math.min(MH_MAX_SPLITS, fit),
                Math.min(groups, (2L * multiprocessors + blocks - 1) / blocks)));
        int perSplit = (groups + splits - 1) / splits;
        splits = (groups + perSplit - 1) / perSplit;
        int mode = accumulate ? MV_ADD : MV_STORE;
        Object part = splits == 1 ? 0L : (Object) partial;
        mh.get(m.layout()).launch(new Dim3((rows + MH_ROWS - 1) / MH_ROWS, (n + MH_VECTORS - 1) / MH_VECTORS, splits),
                Dim3.of(MH_WARPS * 32), mhSharedBytes(m.layout()), stream, m.data(), m.rowStride(), m.scales(), rows,
                m.cols(), xh, n, out, outStride, mode, part, perSplit);
        if (splits > 1) {
            long outputs = (long) n * rows;
            mhReduce.launch(Dim3.of((int) ((outputs + 255) / 256)), Dim3.of(256), 0, stream, partial, splits, n, rows,
                    out, outStride, mode);
        }
    }

    /**
     * Shared memory of a dequantizing f16 product's block (model.cu MhGeom): per stage each warp's 16 rows and
     * their scales (as {@link #mtSharedBytes}) and the block's 32 vectors' 256 f16 at {@link #MH_XSTRIDE} bytes.
     */
    static int mhSharedBytes(WeightLayout layout) {
        return MH_STAGES * (MH_WARPS * (16 * tensorRowStride(layout) + tensorScaleBytes(layout))
                + MH_VECTORS * MH_XSTRIDE);
    }

    /**
     * Shared memory of a tensor-core product's block (model.cu MtGeom): per warp and stage a group's 16 rows (at
     * a padded stride), 8 vectors' 256 codes (272-byte stride), their 64 scale pairs and the rows' block scales.
     */
    static int mtSharedBytes(WeightLayout layout) {
        return MT_WARPS * MT_STAGES * (16 * tensorRowStride(layout) + 8 * 272 + 64 * 8 + tensorScaleBytes(layout));
    }

    /** A row's 256-column group in shared memory: its bytes at a padded stride (model.cu MtGeom::RBP). */
    private static int tensorRowStride(WeightLayout layout) {
        return switch (layout) {
            case Q8_0 -> 272;
            case Q4_0, Q4_K -> 144;
            case Q5_K -> 176;
            case Q6_K -> 208;
            default -> throw new IllegalArgumentException(layout + " has no 8-bit products");
        };
    }

    /** The block scales of 16 rows' group in shared memory (model.cu MtGeom::SC_BYTES). */
    private static int tensorScaleBytes(WeightLayout layout) {
        return switch (layout) {
            case Q8_0, Q4_0 -> 256;
            case Q6_K -> 32;
            default -> 0;
        };
    }

    /** The tensor-core 8-bit product kernel of a layout (benchmarks read its attributes). */
    CudaFunction tensorProduct(WeightLayout layout) {
        return mt.get(layout);
    }

    /** The dequantizing f16 product kernel of a layout (benchmarks read its attributes). */
    CudaFunction halfProduct(WeightLayout layout) {
        return mh.get(layout);
    }

    /** The float-vector product kernel of a layout for one vector or several (benchmarks read its attributes). */
    CudaFunction floatProduct(WeightLayout layout, int nvec) {
        return (nvec == 1 ? mv1 : mv8).get(layout);
    }

    /** The 8-bit form of nvec vectors (their floats are already in x). */
    void quantize(Vectors x, int nvec, CudaStream stream) {
        int blocks = nvec * (x.width() / 32);
        quantizeQ8.launch(Dim3.of((blocks + 7) / 8), Dim3.of(256), 0, stream, x.floats(), x.width(), nvec, x.q8(),
                x.q8Scales());
    }

    /**
     * x[t] = row tokens[t] of the embedding table, for n tokens; also clears the nBest argmax keys of the step's
     * output product (see {@link #logits}).
     */
    void embed(DeviceMatrix table, DeviceBuffer tokens, int n, DeviceBuffer x, DeviceBuffer best, int nBest,
               CudaStream stream) {
        embed.get(table.layout()).launch(Dim3.of(n), Dim3.of(128), 0, stream, table.data(), table.rowStride(),
                table.scales(), tokens, x, table.cols(), best, nBest);
    }

    /**
     * logits[v] = output · x[v], and best[v] (cleared by {@link #embed}) = the argmax key of vector v: logit bits
     * ordered as integers in the high half, 0xFFFFFFFF − index in the low half ({@link #argmaxIndex}).
     */
    void logits(DeviceMatrix output, int vocab, Vectors x, int nvec, DeviceBuffer logits, DeviceBuffer best,
                CudaStream stream) {
        matvec(output.layout().q8Vectors, output, vocab, x, nvec, logits, vocab, null, MV_STORE, 0, best, stream);
    }

    /**
     * Bytes of one vector's draw in the buffer {@link #draw} reads (model.cu, kvant_draw): 1/T as float bits (0:
     * greedy) and the number of banned ids (32 bits each), the key (64), up to {@link
     * dev.kvant.backend.Draws#MAX_BANNED} banned ids (32 bits each), top-k, top-p, min-p, the number of penalized ids,
     * the repeat, frequency and presence penalties, and 4 bytes unused.
     */
    static final int DRAW_BYTES = 64;
    /**
     * Bytes of one vector's penalized ids in the second buffer {@link #draw} reads: up to {@link
     * dev.kvant.backend.Draws#MAX_PENALIZED} (id, count) pairs of 32-bit ints.
     */
    static final int PENALTY_BYTES = 8 * dev.kvant.backend.Draws.MAX_PENALIZED;

    /**
     * The rows of logits [nvec][vocab] whose draw (draws, {@link #DRAW_BYTES} a vector) has a temperature or banned
     * ids: best[v] = the argmax key of the token drawn at it from its candidates (top-k, top-p, min-p as the host
     * sampler's; Gumbel-max with the draw's key: exp(l/T)-weighted), or of the largest logit at temperature 0, its
     * banned ids left out; the others keep the output product's argmax key. A row with penalized ids (penalized,
     * {@link #PENALTY_BYTES} a vector) has those logits penalized first, in place, as the host sampler penalizes them.
     */
    void draw(DeviceBuffer logits, int vocab, int nvec, DeviceBuffer draws, DeviceBuffer penalized, DeviceBuffer best,
              CudaStream stream) {
        draw.launch(Dim3.of(nvec), Dim3.of(1024), 0, stream, logits, vocab, draws, penalized, best);
    }

    /** The token id an argmax key names. */
    static int argmaxIndex(long key) {
        return (int) (0xFFFFFFFFL - (key & 0xFFFFFFFFL));
    }

    /** The whole matrix as f16 [rows][cols] into out. */
    void dequantize(DeviceMatrix m, DeviceBuffer out, CudaStream stream) {
        long chunks = (long) m.rows() * (m.cols() / 8);
        int blocks = (int) Math.min((chunks + 255) / 256, blocksForStreams);
        dequant.get(m.layout()).launch(Dim3.of(blocks), Dim3.of(256), 0, stream, m.data(), m.rowStride(), m.scales(),
                m.rows(), m.cols(), out);
    }

    /** n rows: y = rmsnorm(x) · w, as floats and 8-bit (decode) into y. */
    void rmsnorm(DeviceBuffer x, DeviceBuffer w, Vectors y, int n, int dim, float eps, CudaStream stream) {
        checkNormWidth(dim);
        rmsnorm.launch(normGrid(n, dim), Dim3.of(NORM_SLICE), 0, stream, x, w, y.floats(), 0L, y.q8(), y.q8Scales(),
                dim, eps);
    }

    /** n rows: yh (f16, a GEMM operand) = rmsnorm(x) · w. */
    void rmsnormHalf(DeviceBuffer x, DeviceBuffer w, DeviceBuffer yh, int n, int dim, float eps, CudaStream stream) {
        checkNormWidth(dim);
        rmsnorm.launch(normGrid(n, dim), Dim3.of(NORM_SLICE), 0, stream, x, w, 0L, yh, 0L, 0L, dim, eps);
    }

    /** kvant_rmsnorm's grid: per row, a block of NORM_SLICE threads per slice of its NORM_THREADS virtual threads. */
    private static Dim3 normGrid(int n, int dim) {
        int chunks = Math.min(dim / 4, NORM_THREADS);
        return new Dim3(n, (chunks + NORM_SLICE - 1) / NORM_SLICE, 1);
    }

    /** model.cu NORM_THREADS x NORM_CHUNKS x 4 values per row at most. */
    static final int NORM_THREADS = 1024;
    /** model.cu NORM_SLICE: the threads of one block of kvant_rmsnorm. */
    static final int NORM_SLICE = 128;
    static final int MAX_NORM_WIDTH = NORM_THREADS * 4 * 4;

    static void checkNormWidth(int dim) {
        if (dim > MAX_NORM_WIDTH || dim % 32 != 0) {
            throw new IllegalArgumentException("the CUDA RMSNorm takes widths that are multiples of 32 up to "
                    + MAX_NORM_WIDTH + ", got " + dim);
        }
    }

    /** (cos, sin) of every rotated pair at each of n positions (positions, or start + t when null) into table. */
    void ropeAngles(DeviceBuffer positions, int start, int n, DeviceBuffer freqs, int ropeDim, float positionScale,
                    DeviceBuffer table, CudaStream stream) {
        ropeAngles.launch(Dim3.of(n), Dim3.of(64), 0, stream, orNull(positions), start, n, freqs, ropeDim,
                positionScale, table);
    }

    /** The largest head kvant_rope_split rotates (ROPE_MAX_DIM in model.cu; the attention kernels take up to 256). */
    static final int ROPE_MAX_DIM = 256;

    /**
     * q, k and v of the rows r names, q and k through RoPE; with qRotation 64 or 128 the q heads are then rotated by
     * blocks of that many values into K's basis ({@link dev.kvant.cuda.attention.CudaAttention#queryRotation}), as
     * the attention kernels would rotate them (the same bits); 0 leaves them.
     */
    void ropeSplit(RopeRows r, int qRotation, CudaStream stream) {
        if (qRotation != 0 && qRotation != 64 && qRotation != 128 || qRotation != 0 && r.headDim() % qRotation != 0) {
            throw new IllegalArgumentException("queries rotate by blocks of 64 or 128 values that make up the head, got"
                    + " " + qRotation + " for heads of " + r.headDim());
        }
        if (r.headDim() > ROPE_MAX_DIM) {
            throw new IllegalArgumentException("the CUDA RoPE takes heads up to " + ROPE_MAX_DIM + ", got "
                    + r.headDim());
        }
        ropeSplit.launch(new Dim3(r.n(), (r.heads() + r.kvHeads() + 3) / 4, 1), Dim3.of(128), 0, stream, r.qkv(),
                r.n(), orNull(r.positions()), r.start(), r.q(), r.k(), r.v(), r.angles(), r.ropeDim(),
                r.neox() ? 1 : 0, r.heads(), r.kvHeads(), r.headDim(), r.headDimV(), orNull(r.qNorm()),
                orNull(r.kNorm()), r.eps(), r.tables(), r.tableStride(), r.seqStride(), r.pageTokens(),
                orNull(r.slots()), orNull(r.prevPages()), qRotation);
    }

    /** silu(gate)·up of n rows of a stacked gate/up output, as f16 (outHalf) or f32 (outFloat). */
    void swiglu(DeviceBuffer gu, int ffn, int n, DeviceBuffer outHalf, DeviceBuffer outFloat, CudaStream stream) {
        swiglu.launch(Dim3.of(grid((long) n * ffn)), Dim3.of(256), 0, stream, gu, ffn, n, orNull(outHalf),
                orNull(outFloat));
    }

    void toHalf(DeviceBuffer x, DeviceBuffer out, long count, CudaStream stream) {
        toHalf.launch(Dim3.of(grid(count)), Dim3.of(256), 0, stream, x, out, count);
    }

    /**
     * rows of headDim floats rotated back by blocks of n (64 or 128: {@link
     * dev.kvant.cuda.attention.CudaAttention#outputRotation}), as f16 into out: a prefill's attention output left in V's
     * basis, turned back as the attention's epilogue would (the same bits) and converted.
     */
    void toHalfUnrotated(DeviceBuffer x, DeviceBuffer out, long rows, int headDim, int n, CudaStream stream) {
        if (n != 64 && n != 128 || headDim > ROPE_MAX_DIM || headDim % n != 0) {
            throw new IllegalArgumentException("heads of " + headDim + " values in rotation blocks of " + n);
        }
        toHalfUnrotated.launch(Dim3.of(grid(rows * 32)), Dim3.of(256), 0, stream, x, out, rows, headDim, n);
    }

    void addBias(DeviceBuffer y, DeviceBuffer b, int width, int n, CudaStream stream) {
        addBias.launch(Dim3.of(grid((long) n * width)), Dim3.of(256), 0, stream, y, b, width, n);
    }

    private int grid(long count) {
        return (int) Math.max(1, Math.min((count + 255) / 256, blocksForStreams));
    }

    private static Object orNull(DeviceBuffer b) {
        return b == null ? 0L : b;
    }

    /**
     * Up to maxRows vectors of one width in the two forms the matrix-vector kernels read: floats [rows][width], and
     * 8-bit codes [rows][width] with (scale, scale·Σcodes) per 32 values [rows][width/32].
     */
    record Vectors(DeviceBuffer floats, DeviceBuffer q8, DeviceBuffer q8Scales, int width) {
        static Vectors allocate(java.util.function.LongFunction<DeviceBuffer> allocator, int maxRows, int width) {
            return new Vectors(allocator.apply(4L * maxRows * width), allocator.apply((long) maxRows * width),
                    allocator.apply(8L * maxRows * (width / 32)), width);
        }

        /** Row r on: the floats, codes and scales of vectors r, r+1, ... */
        Vectors from(int r) {
            return new Vectors(floats.slice(4L * r * width, floats.byteSize() - 4L * r * width),
                    q8.slice((long) r * width, q8.byteSize() - (long) r * width),
                    q8Scales.slice(8L * r * (width / 32), q8Scales.byteSize() - 8L * r * (width / 32)), width);
        }
    }

    @Override
    public void close() {
        module.close();
    }
}
