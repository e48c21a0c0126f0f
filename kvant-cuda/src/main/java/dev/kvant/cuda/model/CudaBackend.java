package dev.kvant.cuda.model;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.SequencePool;
import dev.kvant.cuda.CublasLt;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaDataType;
import dev.kvant.cuda.CudaEvent;
import dev.kvant.cuda.DeviceCopy;
import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;
import dev.kvant.cuda.PinnedBuffer;
import dev.kvant.engine.ContextFullException;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.model.Rope;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * The whole model on one GPU. Weights are uploaded once in their compressed formats; each pair of K/V formats gets a
 * paged device cache ({@link KvPool}) shared by the sequences that use it.
 *
 * <p>Decode (one token for each of up to {@code maxBatch} sequences) is one CUDA graph per batch size, captured on
 * first use: every per-step value (tokens, positions, page tables, lengths) is read from device memory that is
 * refreshed by asynchronous copies before the replay, and the only wait is for the chosen token ids (or the logits,
 * when the caller asks for them). Prefill runs a chunk of up to {@code maxPrefill} tokens through tensor-core GEMMs
 * (weights dequantized to f16 one projection at a time) and writes K/V compressed as they are produced.
 */
public final class CudaBackend implements Backend {

    /** Tokens per KV page. */
    public static final int PAGE_TOKENS = 64;
    /** Device memory left free for the driver, cuBLASLt and fragmentation when planning. */
    static final long HEADROOM = 512L << 20;

    /**
     * @param maxBatch   sequences one decode step takes (the server's --parallel)
     * @param maxPrefill prompt tokens of one prefill launch; longer prompts are fed in chunks of this size
     * @param kvTokens   tokens each KV pool holds; 0: contextLength x maxBatch of the first sequence that asks for it
     */
    public record Options(int maxBatch, int maxPrefill, long kvTokens) {
        public Options {
            if (maxBatch < 1 || maxBatch > ModelKernels.MAX_VECTORS) {
                throw new IllegalArgumentException("maxBatch must be 1.." + ModelKernels.MAX_VECTORS + ", got "
                        + maxBatch);
            }
            if (maxPrefill < 1) {
                throw new IllegalArgumentException("maxPrefill must be positive, got " + maxPrefill);
            }
            if (kvTokens < 0) {
                throw new IllegalArgumentException("kvTokens must not be negative, got " + kvTokens);
            }
        }

        public static Options defaults() {
            return new Options(1, 2048, 0);
        }
    }

    private final LlamaModel model;
    private final ModelConfig c;
    private final Options options;
    private final CudaContext context;
    private final CudaStream stream;
    private final ModelKernels k;
    private final CublasLt blas;
    private final DeviceWeights w;
    private final Map<String, KvPool> pools = new LinkedHashMap<>();
    private final List<AutoCloseable> owned = new ArrayList<>();

    private final int qkvDim;
    private final int attnDim;
    private final int rowsMax;
    private final int logitRows;
    private final DeviceBuffer tokensDev;
    private final DeviceBuffer positionsDev;
    private final DeviceBuffer slots;
    /** Argmax keys of the last output product, one per vector (ModelKernels#logits). */
    private final DeviceBuffer best;
    private final DeviceBuffer x;
    private final ModelKernels.Vectors xb;
    private final DeviceBuffer qkv;
    private final DeviceBuffer q;
    private final DeviceBuffer kRows;
    private final DeviceBuffer vRows;
    private final ModelKernels.Vectors attn;
    private final DeviceBuffer gu;
    private final ModelKernels.Vectors g;
    private final DeviceBuffer logits;
    private final DeviceBuffer xh;
    private final DeviceBuffer ah;
    private final DeviceBuffer gh;
    private final DeviceBuffer wScratch;
    private final PinnedBuffer staging;
    private final PinnedBuffer idsHost;
    private boolean closed;

    private CudaBackend(LlamaModel model, Options options, CudaContext context) {
        this.model = model;
        this.c = model.config();
        this.options = options;
        this.context = context;
        try {
            KernelCache cache = KernelCache.open(context);
            this.stream = own(context.createStream());
            this.k = own(new ModelKernels(context, cache));
            this.blas = own(CublasLt.create(context));
            this.w = own(new DeviceWeights(context, c, model.weights()));
            this.qkvDim = c.qDim() + c.kvDimK() + c.kvDimV();
            this.attnDim = c.heads() * c.headDimV();
            this.rowsMax = Math.max(options.maxBatch(), options.maxPrefill());
            this.logitRows = Math.max(options.maxBatch(), ModelKernels.MAX_VECTORS);
            this.tokensDev = floats(rowsMax);
            this.positionsDev = floats(rowsMax);
            this.slots = floats(rowsMax);
            this.best = bytes(8L * logitRows);
            this.x = floats((long) rowsMax * c.dim());
            this.xb = ModelKernels.Vectors.allocate(this::bytes, rowsMax, c.dim());
            this.qkv = floats((long) rowsMax * qkvDim);
            this.q = floats((long) rowsMax * c.qDim());
            this.kRows = floats((long) rowsMax * c.kvDimK());
            this.vRows = floats((long) rowsMax * c.kvDimV());
            this.attn = ModelKernels.Vectors.allocate(this::bytes, rowsMax, attnDim);
            this.gu = floats((long) rowsMax * 2 * c.ffnDim());
            this.g = ModelKernels.Vectors.allocate(this::bytes, rowsMax, c.ffnDim());
            this.logits = floats((long) logitRows * c.vocabSize());
            int p = options.maxPrefill();
            this.xh = own(context.allocate(2L * p * c.dim()));
            this.ah = own(context.allocate(2L * p * attnDim));
            this.gh = own(context.allocate(2L * p * c.ffnDim()));
            this.wScratch = own(context.allocate(2L * w.largestProjectionHalves()));
            this.staging = own(context.allocatePinned(8L * rowsMax));
            this.idsHost = own(context.allocatePinned(8L * logitRows));
        } catch (RuntimeException e) {
            closeOwned();
            context.close();
            throw e;
        }
    }

    /**
     * The model on GPU 0: uploads the weights and compiles (or loads from the kernel cache) the kernels.
     *
     * @throws dev.kvant.cuda.CudaUnavailableException when there is no usable GPU
     * @throws IllegalArgumentException when the weights do not fit, or the model has a shape the kernels do not take
     */
    public static CudaBackend open(LlamaModel model, Options options) {
        CudaContext context = CudaContext.open();
        long need = model.weights().bytesPerToken() + model.weights().tokenEmbedding().data().byteSize() + HEADROOM;
        long free = context.memoryInfo().free();
        if (need > free) {
            context.close();
            throw new IllegalArgumentException(String.format(java.util.Locale.ROOT,
                    "model %s needs %.2f GiB of GPU memory for its weights; %s has %.2f GiB free", model.name(),
                    need / 1073741824.0, context.deviceName(), free / 1073741824.0));
        }
        return new CudaBackend(model, options, context);
    }

    /** The source of the model kernels (for ahead-of-time compiles: AttentionPrecompile). */
    public static KernelSource kernelSource() {
        return ModelKernels.SOURCE;
    }

    private <T extends AutoCloseable> T own(T resource) {
        owned.add(resource);
        return resource;
    }

    private DeviceBuffer floats(long count) {
        return bytes(4L * count);
    }

    private DeviceBuffer bytes(long count) {
        return own(context.allocate(Math.max(16, count)));
    }

    @Override
    public String name() {
        return "cuda";
    }

    @Override
    public LlamaModel model() {
        return model;
    }

    @Override
    public int threads() {
        return 1;
    }

    public Options options() {
        return options;
    }

    /** The device, e.g. "NVIDIA H200". */
    public String deviceName() {
        return context.deviceName();
    }

    /** Device bytes of the weights, and what one decode step reads of them. */
    public long weightBytes() {
        return w.byteSize();
    }

    public long weightBytesPerToken() {
        return w.bytesPerToken();
    }

    /** Multiply-adds of the weight matrices one token goes through (every matrix but the embedding table). */
    public long weightElementsPerToken() {
        long n = (long) w.output.rows() * w.output.cols();
        for (DeviceWeights.Layer l : w.layers) {
            for (Projection p : new Projection[] {l.qkv(), l.wo(), l.gateUp(), l.down()}) {
                n += (long) p.rows() * p.cols();
            }
        }
        return n;
    }

    /**
     * The device's limits measured now, for benchmark ratios: copy bandwidth (GB/s, bytes read + written, a 1 GiB
     * copy) and the rate of a cuBLASLt bf16 GEMM of 8192 x 8192 x 8192 with fp32 accumulation (TFLOP/s); each the
     * median of 7 timed runs.
     */
    public Limits measureLimits() {
        checkOpen();
        long bytes = 1L << 30;
        int reps = 7;
        double[] bw = new double[reps];
        double[] tf = new double[reps];
        try (DeviceCopy copy = DeviceCopy.load(context, KernelCache.open(context));
             DeviceBuffer src = context.allocate(bytes);
             DeviceBuffer dst = context.allocate(bytes)) {
            src.fillBytes((byte) 1);
            for (int r = 0; r < reps; r++) {
                bw[r] = copy.bandwidthGBps(src, dst, bytes, 5, stream);
            }
        }
        int m = 8192;
        try (DeviceBuffer a = context.allocate(2L * m * m);
             DeviceBuffer b = context.allocate(2L * m * m);
             DeviceBuffer out = context.allocate(4L * m * m);
             CudaEvent start = context.createEvent();
             CudaEvent end = context.createEvent()) {
            a.fillBytes((byte) 0x3c);
            b.fillBytes((byte) 0x3c);
            blas.gemm(a, b, out, m, m, m, CudaDataType.BF16, CudaDataType.F32, stream);
            for (int r = 0; r < reps; r++) {
                start.record(stream);
                for (int i = 0; i < 5; i++) {
                    blas.gemm(a, b, out, m, m, m, CudaDataType.BF16, CudaDataType.F32, stream);
                }
                end.record(stream);
                end.synchronize();
                double seconds = CudaEvent.elapsedMillis(start, end) / 1e3 / 5;
                tf[r] = 2.0 * m * m * m / seconds / 1e12;
            }
        }
        Arrays.sort(bw);
        Arrays.sort(tf);
        return new Limits(bw[reps / 2], tf[reps / 2]);
    }

    /** What the device can do at best: copy bandwidth (GB/s, read + written) and a bf16 GEMM's TFLOP/s. */
    public record Limits(double copyGBps, double bf16Tflops) {
    }

    @Override
    public Sequence newSequence(int contextLength, KvFormat kFormat, KvFormat vFormat) {
        checkOpen();
        if (contextLength <= 0) {
            throw new IllegalArgumentException("context length must be positive, got " + contextLength);
        }
        String key = kFormat.name() + "/" + vFormat.name();
        KvPool pool = pools.get(key);
        if (pool == null) {
            long tokens = options.kvTokens() > 0 ? options.kvTokens() : (long) contextLength * options.maxBatch();
            pool = new KvPool(context, c, kFormat, vFormat, PAGE_TOKENS, tokens, contextLength, options.maxBatch(),
                    options.maxPrefill(), HEADROOM);
            pools.put(key, pool);
        }
        if (contextLength > pool.maxContext()) {
            throw new IllegalArgumentException("the " + key + " pool was planned for sequences of up to "
                    + pool.maxContext() + " tokens; a context of " + contextLength + " needs a backend opened for it");
        }
        return new Sequence(pool, contextLength);
    }

    @Override
    public void decodeBatch(BackendSequence[] seqs, int[] tokens, float[] out) {
        decodeGroups(seqs, tokens, Objects.requireNonNull(out, "logits"));
    }

    @Override
    public int[] decodeBatchGreedy(BackendSequence[] seqs, int[] tokens) {
        return decodeGroups(seqs, tokens, null);
    }

    /** Checks the batch and runs it in groups of up to maxBatch; logits into out when given; the chosen ids. */
    private int[] decodeGroups(BackendSequence[] seqs, int[] tokens, float[] out) {
        checkOpen();
        int n = seqs.length;
        if (n < 1) {
            throw new IllegalArgumentException("a decode step of no sequences");
        }
        Sequence[] s = new Sequence[n];
        for (int i = 0; i < n; i++) {
            if (!(seqs[i] instanceof Sequence cs) || cs.owner() != this) {
                throw new IllegalArgumentException("sequence " + i + " does not belong to this backend");
            }
            for (int j = 0; j < i; j++) {
                if (s[j] == cs) {
                    throw new IllegalArgumentException("sequence " + i + " appears twice in one batch");
                }
            }
            if (cs.pool != ((Sequence) seqs[0]).pool) {
                throw new IllegalArgumentException("the sequences of one batch must share K/V formats");
            }
            s[i] = cs;
            cs.checkRoom(1);
        }
        // groups of up to maxBatch sequences, one graph replay each
        int vocab = c.vocabSize();
        int[] ids = new int[n];
        for (int from = 0; from < n; from += options.maxBatch()) {
            int m = Math.min(options.maxBatch(), n - from);
            float[] part = out == null ? null : from == 0 && m == n ? out : new float[m * vocab];
            int[] chosen = decode(Arrays.copyOfRange(s, from, from + m), Arrays.copyOfRange(tokens, from, from + m),
                    part);
            System.arraycopy(chosen, 0, ids, from, m);
            if (part != null && part != out) {
                System.arraycopy(part, 0, out, from * vocab, m * vocab);
            }
        }
        return ids;
    }

    @Override
    public SequencePool newSequencePool(int tokens, KvFormat kFormat, KvFormat vFormat) {
        checkOpen();
        if (tokens <= 0) {
            throw new IllegalArgumentException("a KV pool of " + tokens + " tokens");
        }
        KvPool pool = new KvPool(context, c, kFormat, vFormat, PAGE_TOKENS, tokens, tokens, options.maxBatch(),
                options.maxPrefill(), HEADROOM);
        return new SharedPool(pool);
    }

    /** Sequences of one device KV pool, with prefixes shared page by page ({@link SequencePool}). */
    final class SharedPool implements SequencePool {
        private final KvPool pool;
        private boolean closed;

        SharedPool(KvPool pool) {
            this.pool = pool;
        }

        @Override
        public int pageTokens() {
            return PAGE_TOKENS;
        }

        @Override
        public int totalPages() {
            return pool.totalPages();
        }

        @Override
        public int freePages() {
            return pool.freePages();
        }

        @Override
        public BackendSequence newSequence(int capacity) {
            check(capacity);
            return new Sequence(pool, capacity);
        }

        @Override
        public BackendSequence fork(BackendSequence parent, int prefixTokens, int capacity) {
            check(capacity);
            if (!(parent instanceof Sequence p) || p.pool != pool) {
                throw new IllegalArgumentException("the sequence to fork does not belong to this pool");
            }
            if (prefixTokens < 0 || prefixTokens > p.length || prefixTokens > capacity) {
                throw new IllegalArgumentException("cannot fork " + prefixTokens + " tokens of a sequence of "
                        + p.length + " into one of capacity " + capacity);
            }
            int whole = prefixTokens / PAGE_TOKENS;
            boolean partial = prefixTokens % PAGE_TOKENS != 0;
            pool.checkFree(partial ? 1 : 0, whole, prefixTokens, PAGE_TOKENS);
            Sequence child = new Sequence(pool, capacity);
            child.pages = Arrays.copyOf(p.pages, Math.max(8, whole + 1));
            for (int i = 0; i < whole; i++) {
                pool.share(p.pages[i]);
            }
            child.pageCount = whole;
            if (partial) {
                int copy = pool.take();
                pool.copyPage(p.pages[whole], copy, c.layers(), stream);
                child.pages[whole] = copy;
                child.pageCount = whole + 1;
            }
            child.length = prefixTokens;
            return child;
        }

        private void check(int capacity) {
            checkOpen();
            if (closed) {
                throw new IllegalStateException("the KV pool is closed");
            }
            if (capacity <= 0 || capacity > pool.maxContext()) {
                throw new IllegalArgumentException("a sequence of " + capacity + " tokens in a pool planned for "
                        + pool.maxContext());
            }
        }

        @Override
        public void close() {
            if (!closed) {
                closed = true;
                stream.synchronize();
                pool.close();
            }
        }
    }

    // ---- decode: one token for each of n sequences, one graph replay

    /** Runs the step; writes logits (n x vocab) when out is given; returns the chosen ids. */
    private int[] decode(Sequence[] seqs, int[] tokens, float[] out) {
        int n = seqs.length;
        KvPool pool = seqs[0].pool;
        MemorySegment st = staging.segment();
        for (int i = 0; i < n; i++) {
            Sequence s = seqs[i];
            int token = tokens[i];
            checkToken(token);
            s.ensurePages(s.length + 1);
            pool.batch().set(i, s.pages, s.pageCount, s.length + 1);
            st.setAtIndex(ValueLayout.JAVA_INT, i, token);
            st.setAtIndex(ValueLayout.JAVA_INT, rowsMax + i, s.length);
        }
        tokensDev.copyFromHostAsync(st.asSlice(0, 4L * n), 0, stream);
        positionsDev.copyFromHostAsync(st.asSlice(4L * rowsMax, 4L * n), 0, stream);
        pool.batch().upload(stream);
        CudaGraph graph = pool.graph(n, () -> decodeLaunches(pool, n), stream);
        graph.launch(stream);
        int[] chosen = readIds(n);
        if (out != null) {
            copyLogits(0, n, out, 0);
        }
        for (Sequence s : seqs) {
            s.length++;
        }
        return chosen;
    }

    private void decodeLaunches(KvPool pool, int n) {
        int dim = c.dim();
        int ffn = c.ffnDim();
        float eps = c.rmsEps();
        k.embed(w.embedding, tokensDev, n, x, best, n, stream);
        for (int l = 0; l < c.layers(); l++) {
            DeviceWeights.Layer L = w.layers[l];
            k.rmsnorm(x, L.attnNorm(), xb, n, dim, eps, stream);
            L.qkv().matvec(k, xb, n, qkv, qkvDim, L.qkvBias(), ModelKernels.MV_STORE, stream);
            k.ropeSplit(rope(pool, n, positionsDev, 0, L, 1), stream);
            pool.attention().quantizeRows(pool.cache(), l, kRows, vRows, slots, n, stream);
            pool.attention().decode(pool.cache(), l, q, pool.batch(), n, attn.floats(), stream);
            if (L.wo().readsQ8()) {
                k.quantize(attn, n, stream);
            }
            L.wo().matvec(k, attn, n, x, dim, null, ModelKernels.MV_ADD, stream);
            k.rmsnorm(x, L.ffnNorm(), xb, n, dim, eps, stream);
            if (L.gateUp().single()) {
                k.matvec(L.gateUp().only(), ffn, xb, n, g.floats(), ffn, null, ModelKernels.MV_SWIGLU, ffn, stream);
            } else {
                L.gateUp().matvec(k, xb, n, gu, 2 * ffn, null, ModelKernels.MV_STORE, stream);
                k.swiglu(gu, ffn, n, null, g.floats(), stream);
            }
            if (L.down().readsQ8()) {
                k.quantize(g, n, stream);
            }
            L.down().matvec(k, g, n, x, dim, null, ModelKernels.MV_ADD, stream);
        }
        k.rmsnorm(x, w.outputNorm, xb, n, dim, eps, stream);
        k.logits(w.output.only(), c.vocabSize(), xb, n, logits, best, stream);
    }

    private ModelKernels.RopeLaunch rope(KvPool pool, int n, DeviceBuffer positions, int start,
                                         DeviceWeights.Layer L, int seqStride) {
        Rope r = c.rope();
        return new ModelKernels.RopeLaunch(qkv, n, positions, start, q, kRows, vRows, w.ropeFreqs, r.ropeDim(),
                r.mode() == Rope.Mode.NEOX, r.linearScale(), c.heads(), c.kvHeads(), c.headDimK(), c.headDimV(),
                L.qNorm(), L.kNorm(), c.rmsEps(), pool.batch().tables(), pool.batch().tableStride(), seqStride,
                PAGE_TOKENS, slots);
    }

    // ---- prefill: a chunk of one sequence through tensor-core GEMMs

    /**
     * Runs tokens[off .. off+n) (n <= maxPrefill) of one sequence. allLogits: every row's logits into out; else the
     * last row's logits into out when out is given, and the last row's chosen id returned.
     */
    private int prefill(Sequence s, int[] tokens, int off, int n, boolean allLogits, float[] out) {
        KvPool pool = s.pool;
        int start = s.length;
        int dim = c.dim();
        float eps = c.rmsEps();
        int ffn = c.ffnDim();
        MemorySegment st = staging.segment();
        for (int t = 0; t < n; t++) {
            checkToken(tokens[off + t]);
            st.setAtIndex(ValueLayout.JAVA_INT, t, tokens[off + t]);
        }
        s.ensurePages(start + n);
        pool.batch().set(0, s.pages, s.pageCount, start + n);
        pool.batch().upload(stream);
        tokensDev.copyFromHostAsync(st.asSlice(0, 4L * n), 0, stream);
        k.embed(w.embedding, tokensDev, n, x, best, 1, stream);
        for (int l = 0; l < c.layers(); l++) {
            DeviceWeights.Layer L = w.layers[l];
            k.rmsnormHalf(x, L.attnNorm(), xh, n, dim, eps, stream);
            L.qkv().gemm(k, blas, xh, n, qkv, false, wScratch, stream);
            if (L.qkvBias() != null) {
                k.addBias(qkv, L.qkvBias(), qkvDim, n, stream);
            }
            k.ropeSplit(rope(pool, n, null, start, L, 0), stream);
            pool.attention().quantizeRows(pool.cache(), l, kRows, vRows, slots, n, stream);
            pool.attention().prefill(pool.cache(), l, q, pool.batch(), 0, start, n, attn.floats(), stream);
            k.toHalf(attn.floats(), ah, (long) n * attnDim, stream);
            L.wo().gemm(k, blas, ah, n, x, true, wScratch, stream);
            k.rmsnormHalf(x, L.ffnNorm(), xh, n, dim, eps, stream);
            L.gateUp().gemm(k, blas, xh, n, gu, false, wScratch, stream);
            k.swiglu(gu, ffn, n, gh, null, stream);
            L.down().gemm(k, blas, gh, n, x, true, wScratch, stream);
        }
        int chosen = -1;
        if (allLogits) {
            k.rmsnorm(x, w.outputNorm, xb, n, dim, eps, stream);
            for (int r = 0; r < n; r += ModelKernels.MAX_VECTORS) {
                int m = Math.min(ModelKernels.MAX_VECTORS, n - r);
                k.logits(w.output.only(), c.vocabSize(), xb.from(r), m, logits, null, stream);
                copyLogits(0, m, out, r * c.vocabSize());
            }
        } else {
            k.rmsnorm(x.slice(4L * (n - 1) * dim, 4L * dim), w.outputNorm, xb, 1, dim, eps, stream);
            k.logits(w.output.only(), c.vocabSize(), xb, 1, logits, best, stream);
            chosen = readIds(1)[0];
            if (out != null) {
                copyLogits(0, 1, out, 0);
            }
        }
        if (allLogits) {
            stream.synchronize();
        }
        s.length = start + n;
        return chosen;
    }

    private int[] readIds(int n) {
        best.copyToHostAsync(idsHost.segment().asSlice(0, 8L * n), 0, stream);
        stream.synchronize();
        int[] r = new int[n];
        for (int i = 0; i < n; i++) {
            r[i] = ModelKernels.argmaxIndex(idsHost.segment().getAtIndex(ValueLayout.JAVA_LONG, i));
        }
        return r;
    }

    /** Rows [from, from+count) of the device logits into out[outOff ..]; waits for them. */
    private void copyLogits(int from, int count, float[] out, int outOff) {
        stream.synchronize();
        long bytes = 4L * count * c.vocabSize();
        logits.copyToHost(MemorySegment.ofArray(out).asSlice(4L * outOff, bytes), 4L * from * c.vocabSize());
    }

    private void checkToken(int id) {
        if (id < 0 || id >= c.vocabSize()) {
            throw new IllegalArgumentException("token id " + id + " is outside the vocabulary (0.."
                    + (c.vocabSize() - 1) + ")");
        }
    }

    private void checkOpen() {
        if (closed) {
            throw new IllegalStateException("the CUDA backend is closed");
        }
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        for (KvPool p : pools.values()) {
            p.close();
        }
        pools.clear();
        closeOwned();
        context.close();
    }

    private void closeOwned() {
        for (int i = owned.size() - 1; i >= 0; i--) {
            try {
                owned.get(i).close();
            } catch (Exception ignored) {
                // device memory of a context being torn down
            }
        }
        owned.clear();
    }

    /** A sequence whose cache pages live in its pool on the device. */
    public final class Sequence implements BackendSequence {
        private final KvPool pool;
        private final int capacity;
        private int[] pages = new int[8];
        private int pageCount;
        private int length;
        private boolean released;

        Sequence(KvPool pool, int capacity) {
            this.pool = pool;
            this.capacity = capacity;
        }

        CudaBackend owner() {
            return CudaBackend.this;
        }

        @Override
        public int length() {
            return length;
        }

        @Override
        public int capacity() {
            return capacity;
        }

        @Override
        public void forward(int[] tokens, int off, int n, boolean allLogits, float[] out) {
            run(tokens, off, n, allLogits, Objects.requireNonNull(out, "logits"));
        }

        @Override
        public int forwardGreedy(int[] tokens, int off, int n) {
            return run(tokens, off, n, false, null);
        }

        private int run(int[] tokens, int off, int n, boolean allLogits, float[] out) {
            checkOpen();
            if (released) {
                throw new IllegalStateException("the sequence is closed");
            }
            if (n <= 0) {
                throw new IllegalArgumentException("forward of " + n + " tokens");
            }
            Objects.checkFromIndexSize(off, n, tokens.length);
            checkRoom(n);
            if (n == 1 && !allLogits) {
                return decode(new Sequence[] {this}, new int[] {tokens[off]}, out)[0];
            }
            int chosen = -1;
            int vocab = c.vocabSize();
            for (int done = 0; done < n; done += options.maxPrefill()) {
                int m = Math.min(options.maxPrefill(), n - done);
                boolean last = done + m == n;
                if (allLogits) {
                    float[] part = done == 0 && m == n ? out : new float[m * vocab];
                    prefill(this, tokens, off + done, m, true, part);
                    if (part != out) {
                        System.arraycopy(part, 0, out, done * vocab, m * vocab);
                    }
                } else {
                    chosen = prefill(this, tokens, off + done, m, false, last ? out : null);
                }
            }
            return chosen;
        }

        void checkRoom(int n) {
            if (length + n > capacity) {
                throw new ContextFullException("the sequence would need " + (length + n)
                        + " tokens but the context holds " + capacity + " (raise -c)");
            }
        }

        /**
         * Pages for the first {@code tokens} tokens, taken from the pool, with the pages that tokens from
         * {@code length} on are written into made this sequence's own (a page shared with a fork is copied first).
         * Checks for enough free pages before changing anything.
         */
        void ensurePages(int tokens) {
            int need = (tokens + PAGE_TOKENS - 1) / PAGE_TOKENS;
            int firstWritten = length / PAGE_TOKENS;
            int copies = 0;
            for (int i = firstWritten; i < Math.min(need, pageCount); i++) {
                if (pool.shared(pages[i])) {
                    copies++;
                }
            }
            pool.checkFree(need - pageCount + copies, pageCount, tokens, PAGE_TOKENS);
            if (need > pages.length) {
                pages = Arrays.copyOf(pages, Math.max(need, 2 * pages.length));
            }
            for (int i = firstWritten; i < Math.min(need, pageCount); i++) {
                if (pool.shared(pages[i])) {
                    int own = pool.take();
                    pool.copyPage(pages[i], own, c.layers(), stream);
                    pool.give(pages[i]);
                    pages[i] = own;
                }
            }
            while (pageCount < need) {
                pages[pageCount++] = pool.take();
            }
        }

        @Override
        public void truncate(int newLength) {
            if (newLength < 0 || newLength > length) {
                throw new IllegalArgumentException("cannot truncate a sequence of " + length + " tokens to "
                        + newLength);
            }
            length = newLength;
            int keep = (newLength + PAGE_TOKENS - 1) / PAGE_TOKENS;
            while (pageCount > keep) {
                pool.give(pages[--pageCount]);
            }
        }

        @Override
        public void close() {
            if (released) {
                return;
            }
            released = true;
            if (!closed) {
                truncate(0);
            }
        }
    }
}
