package dev.kvant.cuda.model;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaFunction;
import dev.kvant.cuda.CudaModule;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.Dim3;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;

import java.util.EnumMap;
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

    static final KernelSource SOURCE = KernelSource.resource("model/model.cu");

    private final CudaModule module;
    private final Map<WeightLayout, CudaFunction> mv1 = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> mv8 = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> embed = new EnumMap<>(WeightLayout.class);
    private final Map<WeightLayout, CudaFunction> dequant = new EnumMap<>(WeightLayout.class);
    private final CudaFunction rmsnorm;
    private final CudaFunction ropeSplit;
    private final CudaFunction swiglu;
    private final CudaFunction toHalf;
    private final CudaFunction addBias;
    private final CudaFunction argmax;
    private final int blocksForStreams;

    ModelKernels(CudaContext context, KernelCache cache) {
        this.module = context.loadModule(cache, SOURCE);
        for (WeightLayout l : WeightLayout.values()) {
            mv1.put(l, module.function("kvant_mv1_" + l.kernelSuffix));
            mv8.put(l, module.function("kvant_mv8_" + l.kernelSuffix));
            embed.put(l, module.function("kvant_embed_" + l.kernelSuffix));
            dequant.put(l, module.function("kvant_dequant_" + l.kernelSuffix));
        }
        this.rmsnorm = module.function("kvant_rmsnorm");
        this.ropeSplit = module.function("kvant_rope_split");
        this.swiglu = module.function("kvant_swiglu");
        this.toHalf = module.function("kvant_to_half");
        this.addBias = module.function("kvant_add_bias");
        this.argmax = module.function("kvant_argmax");
        this.blocksForStreams = context.multiprocessors() * 8;
    }

    /**
     * out[v][r] (row stride outStride) = m[r] · x[v] for v < nvec, per {@code mode}; in MV_SWIGLU the matrix is gate
     * rows then up rows and {@code outputs} = ffn.
     */
    void matvec(DeviceMatrix m, int outputs, DeviceBuffer x, int xStride, int nvec, DeviceBuffer out,
                int outStride, DeviceBuffer bias, int mode, int ffn, CudaStream stream) {
        if (nvec < 1 || nvec > MAX_VECTORS) {
            throw new IllegalArgumentException("matrix-vector launch of " + nvec + " vectors; 1.." + MAX_VECTORS);
        }
        int perWarp = mode == MV_SWIGLU ? 2 : 4;
        int warps = (outputs + perWarp - 1) / perWarp;
        int blocks = (warps + MV_WARPS - 1) / MV_WARPS;
        CudaFunction f = (nvec == 1 ? mv1 : mv8).get(m.layout());
        f.launch(Dim3.of(blocks), Dim3.of(MV_WARPS * 32), 0, stream, m.data(), m.rowStride(), m.scales(), outputs,
                m.cols(), x, xStride, nvec, out, outStride, bias == null ? 0L : (Object) bias, mode, ffn);
    }

    /** x[t] = row tokens[t] of the embedding table, for n tokens. */
    void embed(DeviceMatrix table, DeviceBuffer tokens, int n, DeviceBuffer x, CudaStream stream) {
        embed.get(table.layout()).launch(Dim3.of(n), Dim3.of(128), 0, stream, table.data(), table.rowStride(),
                table.scales(), tokens, x, table.cols());
    }

    /** The whole matrix as f16 [rows][cols] into out. */
    void dequantize(DeviceMatrix m, DeviceBuffer out, CudaStream stream) {
        long chunks = (long) m.rows() * (m.cols() / 8);
        int blocks = (int) Math.min((chunks + 255) / 256, blocksForStreams);
        dequant.get(m.layout()).launch(Dim3.of(blocks), Dim3.of(256), 0, stream, m.data(), m.rowStride(), m.scales(),
                m.rows(), m.cols(), out);
    }

    /** n rows: y (f32, may be null) and yh (f16, may be null) = rmsnorm(x) · w. */
    void rmsnorm(DeviceBuffer x, DeviceBuffer w, DeviceBuffer y, DeviceBuffer yh, int n, int dim, float eps,
                 CudaStream stream) {
        rmsnorm.launch(Dim3.of(n), Dim3.of(256), 0, stream, x, w, y == null ? 0L : (Object) y,
                yh == null ? 0L : (Object) yh, dim, eps);
    }

    void ropeSplit(RopeLaunch r, CudaStream stream) {
        ropeSplit.launch(Dim3.of(r.n()), Dim3.of(256), 0, stream, r.qkv(), r.n(), orNull(r.positions()), r.start(),
                r.q(), r.k(), r.v(), r.freqs(), r.ropeDim(), r.neox() ? 1 : 0, r.positionScale(), r.heads(),
                r.kvHeads(), r.headDim(), r.headDimV(), orNull(r.qNorm()), orNull(r.kNorm()), r.eps(), r.tables(),
                r.tableStride(), r.seqStride(), r.pageTokens(), r.slots());
    }

    /** silu(gate)·up of n rows of a stacked gate/up output, as f16 (outHalf) or f32 (outFloat). */
    void swiglu(DeviceBuffer gu, int ffn, int n, DeviceBuffer outHalf, DeviceBuffer outFloat, CudaStream stream) {
        swiglu.launch(Dim3.of(grid((long) n * ffn)), Dim3.of(256), 0, stream, gu, ffn, n, orNull(outHalf),
                orNull(outFloat));
    }

    void toHalf(DeviceBuffer x, DeviceBuffer out, long count, CudaStream stream) {
        toHalf.launch(Dim3.of(grid(count)), Dim3.of(256), 0, stream, x, out, count);
    }

    void addBias(DeviceBuffer y, DeviceBuffer b, int width, int n, CudaStream stream) {
        addBias.launch(Dim3.of(grid((long) n * width)), Dim3.of(256), 0, stream, y, b, width, n);
    }

    void argmax(DeviceBuffer logits, int vocab, int nvec, DeviceBuffer ids, CudaStream stream) {
        argmax.launch(Dim3.of(nvec), Dim3.of(1024), 0, stream, logits, vocab, ids);
    }

    private int grid(long count) {
        return (int) Math.max(1, Math.min((count + 255) / 256, blocksForStreams));
    }

    private static Object orNull(DeviceBuffer b) {
        return b == null ? 0L : b;
    }

    /** Arguments of one kvant_rope_split launch (see model.cu). */
    record RopeLaunch(DeviceBuffer qkv, int n, DeviceBuffer positions, int start, DeviceBuffer q, DeviceBuffer k,
                      DeviceBuffer v, DeviceBuffer freqs, int ropeDim, boolean neox, float positionScale, int heads,
                      int kvHeads, int headDim, int headDimV, DeviceBuffer qNorm, DeviceBuffer kNorm, float eps,
                      DeviceBuffer tables, int tableStride, int seqStride, int pageTokens, DeviceBuffer slots) {
    }

    @Override
    public void close() {
        module.close();
    }
}
