package dev.kvant.cuda.model;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.Draws;
import dev.kvant.backend.PendingDecode;
import dev.kvant.backend.SequencePool;
import dev.kvant.cuda.CublasLt;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaDataType;
import dev.kvant.cuda.CudaEvent;
import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.DeviceCopy;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;
import dev.kvant.cuda.PinnedBuffer;
import dev.kvant.engine.ContextFullException;
import dev.kvant.engine.Session;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * The whole model on one GPU, or split by layers over several ({@link Stage}: each holds its layers' weights and KV
 * pages; the hidden state crosses to the next GPU once per step, a peer copy ordered by an event, so the split
 * changes no arithmetic: the same kernels run in the same order). Weights are uploaded once in their compressed
 * formats; each pair of K/V formats gets a paged device cache ({@link KvPool}) shared by the sequences that use it.
 *
 * <p>Decode (one token for each of up to {@code maxBatch} sequences) is one CUDA graph per batch size and stage,
 * captured on first use: every per-step value (tokens, positions, page tables, lengths) is read from device memory
 * that is refreshed by asynchronous copies before the replay, and the only wait is for the chosen token ids (or the
 * logits, when the caller asks for them). Prefill runs a chunk of up to {@code maxPrefill} tokens through
 * tensor-core GEMMs (weights dequantized to f16 one projection at a time) and writes K/V compressed as they are
 * produced.
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
     * @param devices    GPU ordinals, one per stage of a layer split (the same ordinal twice splits the layers over
     *                   two stages of one GPU: the test of the split's code path); empty: one GPU
     * @param layerSplit layers per stage, first to last; null: balanced by weight and KV bytes
     * @param kvBytes    the KV cache bytes planned over all layers (a --kv-mem budget), which a balanced split
     *                   spreads with the weights (every layer holds the same share); 0: balance the weights alone
     */
    public record Options(int maxBatch, int maxPrefill, long kvTokens, int[] devices, int[] layerSplit,
                          long kvBytes) {
        public Options {
            if (maxBatch < 1 || maxBatch > ModelKernels.MAX_VECTORS) {
                throw new IllegalArgumentException("maxBatch must be 1.." + ModelKernels.MAX_VECTORS + ", got "
                        + maxBatch);
            }
            if (maxPrefill < 1) {
                throw new IllegalArgumentException("maxPrefill must be positive, got " + maxPrefill);
            }
            if (kvTokens < 0 || kvBytes < 0) {
                throw new IllegalArgumentException("kvTokens and kvBytes must not be negative, got " + kvTokens
                        + " and " + kvBytes);
            }
            devices = devices == null ? new int[0] : devices.clone();
            layerSplit = layerSplit == null ? null : layerSplit.clone();
        }

        /** Layers split over devices as layerSplit says, or balanced by the weights alone. */
        public Options(int maxBatch, int maxPrefill, long kvTokens, int[] devices, int[] layerSplit) {
            this(maxBatch, maxPrefill, kvTokens, devices, layerSplit, 0);
        }

        /** One GPU ($KVANT_CUDA_DEVICE, else 0). */
        public Options(int maxBatch, int maxPrefill, long kvTokens) {
            this(maxBatch, maxPrefill, kvTokens, null, null);
        }

        public static Options defaults() {
            return new Options(1, 2048, 0);
        }
    }

    private final LlamaModel model;
    private final ModelConfig c;
    private final Options options;
    private final Stage[] stages;
    private final List<CudaContext> contexts;
    private final Map<String, KvPool> pools = new LinkedHashMap<>();
    private final int rowsMax;
    /** One per decode step that may be in flight ({@link #pipelineDepth}), on the last stage's device. */
    private final Landing[] landings;
    private boolean closed;

    private CudaBackend(LlamaModel model, Options options, List<CudaContext> contexts, int[] split) {
        this.model = model;
        this.c = model.config();
        this.options = options;
        this.contexts = contexts;
        this.rowsMax = Math.max(options.maxBatch(), options.maxPrefill());
        int logitRows = Math.max(options.maxBatch(), ModelKernels.MAX_VECTORS);
        this.stages = new Stage[split.length];
        this.landings = new Landing[split.length];
        try {
            int from = 0;
            for (int i = 0; i < split.length; i++) {
                stages[i] = new Stage(contexts.get(i), model, from, from + split[i], rowsMax, logitRows,
                        options.maxPrefill());
                from += split[i];
            }
            for (int i = 0; i + 1 < stages.length; i++) {
                stages[i].context.enablePeerAccess(stages[i + 1].context);
            }
            for (int i = 0; i < landings.length; i++) {
                landings[i] = new Landing(stages[stages.length - 1].context);
            }
        } catch (RuntimeException | Error e) {   // an OutOfMemoryError of a host copy too: nothing held
            for (Landing l : landings) {
                if (l != null) {
                    l.close();
                }
            }
            for (Stage st : stages) {
                if (st != null) {
                    st.close();
                }
            }
            contexts.forEach(CudaContext::close);
            throw e;
        }
    }

    /**
     * The model on its GPUs ({@link Options#devices}; one stage per device, layers split as
     * {@link Options#layerSplit} says): uploads the weights and compiles (or loads from the kernel cache) the kernels.
     *
     * @throws dev.kvant.cuda.CudaUnavailableException when there is no usable GPU
     * @throws IllegalArgumentException when the weights do not fit, or the model has a shape the kernels do not take
     */
    public static CudaBackend open(LlamaModel model, Options options) {
        ModelConfig c = model.config();
        // heads the attention kernels do not take are refused before a weight is uploaded (the cache's pools
        // would refuse them only at the first sequence)
        dev.kvant.cuda.attention.AttentionShape.checkHeads(c.heads(), c.kvHeads(), c.headDimK(), c.headDimV());
        ModelKernels.checkNormWidth(c.dim());   // and widths the RMSNorm kernel does not take (it would at the first step)
        int[] devices = options.devices().length == 0 ? new int[] {-1} : options.devices();
        if (options.layerSplit() != null) {
            checkSplit(options.layerSplit(), devices.length, c.layers());
        }
        List<CudaContext> contexts = new ArrayList<>();
        int[] split = options.layerSplit();
        try {
            int rowsMax = Math.max(options.maxBatch(), options.maxPrefill());
            int logitRows = Math.max(options.maxBatch(), ModelKernels.MAX_VECTORS);
            Map<Integer, Integer> stagesOn = new HashMap<>();
            for (int device : devices) {
                CudaContext context = device < 0 ? CudaContext.open() : CudaContext.open(device);
                contexts.add(context);
                context.computeCapability().requireKvantKernels(context.toString());
                stagesOn.merge(context.ordinal(), 1, Integer::sum);
            }
            if (split == null) {
                // each stage's share of the layers follows the memory its device has free (split evenly between
                // the stages that share a device), less what every stage needs beside its layers
                long[] room = new long[devices.length];
                for (int i = 0; i < devices.length; i++) {
                    CudaContext context = contexts.get(i);
                    long scratch = Stage.scratchBytes(c, rowsMax, logitRows, options.maxPrefill(),
                            i == devices.length - 1);
                    room[i] = Math.max(1, context.memoryInfo().free() / stagesOn.get(context.ordinal()) - scratch
                            - HEADROOM);
                }
                split = autoSplit(model, room, options.kvBytes());
            }
            int from = 0;
            // what the stages before this one planned on the same device (one GPU may hold two stages)
            Map<Integer, Long> planned = new HashMap<>();
            for (int i = 0; i < devices.length; i++) {
                CudaContext context = contexts.get(i);
                int to = from + split[i];
                long stage = stageWeightBytes(model, from, to)
                        + Stage.scratchBytes(c, rowsMax, logitRows, options.maxPrefill(), to == c.layers());
                long before = planned.getOrDefault(context.ordinal(), 0L);
                planned.put(context.ordinal(), before + stage);
                long need = before + stage + HEADROOM;
                long free = context.memoryInfo().free();
                if (need > free) {
                    throw new IllegalArgumentException(String.format(java.util.Locale.ROOT,
                            "layers %d..%d of %s need %.2f GiB of GPU memory for their weights and activations"
                                    + " (a prefill chunk of %d tokens)%s; %s (device %d) has %.2f GiB free%s",
                            from, to - 1, model.name(), need / 1073741824.0, options.maxPrefill(),
                            before > 0 ? String.format(java.util.Locale.ROOT, ", with %.2f GiB of the stages before"
                                    + " it on the same device", before / 1073741824.0) : "",
                            context.deviceName(), context.ordinal(), free / 1073741824.0,
                            devices.length == 1 ? " (split the layers over more GPUs with --gpus, or a smaller"
                                    + " --prefill-chunk)" : ""));
                }
                from = to;
            }
        } catch (RuntimeException | Error e) {
            contexts.forEach(CudaContext::close);
            throw e;
        }
        return new CudaBackend(model, options, contexts, split);
    }

    private static void checkSplit(int[] split, int gpus, int layers) {
        if (split.length != gpus) {
            throw new IllegalArgumentException("--layer-split gives " + split.length + " parts for " + gpus + " GPUs");
        }
        int sum = 0;
        for (int n : split) {
            if (n < 1) {
                throw new IllegalArgumentException("every GPU of a layer split needs at least one layer: "
                        + Arrays.toString(split));
            }
            sum += n;
        }
        if (sum != layers) {
            throw new IllegalArgumentException("--layer-split " + Arrays.toString(split) + " covers " + sum
                    + " layers; the model has " + layers);
        }
    }

    /**
     * Host bytes of the weights that layers [from, to) of a stage hold, with the embedding or output at the ends (a
     * tied table once where one stage has both, as DeviceWeights uploads it).
     */
    static long stageWeightBytes(LlamaModel model, int from, int to) {
        long bytes = 0;
        for (int l = from; l < to; l++) {
            bytes += layerBytes(model, l);
        }
        var w = model.weights();
        boolean last = to == model.config().layers();
        if (from == 0 && !(last && w.output() == w.tokenEmbedding())) {
            bytes += w.tokenEmbedding().data().byteSize();
        }
        if (last) {
            bytes += w.output().data().byteSize();
        }
        return bytes;
    }

    private static long layerBytes(LlamaModel model, int l) {
        var x = model.weights().layers()[l];
        long bytes = 0;
        for (var m : new dev.kvant.tensor.WeightMatrix[] {x.wq(), x.wk(), x.wv(), x.wo(), x.wGate(), x.wUp(),
                x.wDown()}) {
            bytes += m.data().byteSize();
        }
        return bytes;
    }

    /** {@link #autoSplit(LlamaModel, long[], long)} over GPUs with the same room. */
    static int[] autoSplit(LlamaModel model, int gpus, long kvBytes) {
        long[] room = new long[gpus];
        Arrays.fill(room, 1);
        return autoSplit(model, room, kvBytes);
    }

    /**
     * Layers per GPU that give each GPU its share of the bytes, in proportion to its room (the memory it has for
     * them): its layers' weights and their share of kvBytes (the same for every layer), with the embedding table on
     * the first and the output on the last. Consecutive layers are given to a GPU until it reaches its share of the
     * total; every GPU gets at least one.
     */
    static int[] autoSplit(LlamaModel model, long[] room, long kvBytes) {
        int layers = model.config().layers();
        int gpus = room.length;
        if (gpus > layers) {
            throw new IllegalArgumentException(gpus + " GPUs for " + layers + " layers");
        }
        double roomTotal = 0;
        for (long r : room) {
            if (r <= 0) {
                throw new IllegalArgumentException("room must be positive: " + Arrays.toString(room));
            }
            roomTotal += r;
        }
        double kvLayer = (double) kvBytes / layers;
        double total = stageWeightBytes(model, 0, layers) + (double) kvBytes;
        int[] split = new int[gpus];
        int l = 0;
        double held = model.weights().tokenEmbedding().data().byteSize();
        double roomBefore = 0;
        for (int g = 0; g < gpus - 1; g++) {
            roomBefore += room[g];
            double target = total * roomBefore / roomTotal;
            int start = l;
            while (l < layers - (gpus - 1 - g)
                    && (l == start || held + (layerBytes(model, l) + kvLayer) / 2.0 <= target)) {
                held += layerBytes(model, l) + kvLayer;
                l++;
            }
            split[g] = l - start;
        }
        split[gpus - 1] = layers - l;
        return split;
    }

    /** The source of the model kernels (for ahead-of-time compiles: AttentionPrecompile). */
    public static KernelSource kernelSource() {
        return ModelKernels.SOURCE;
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

    /** The device, e.g. "NVIDIA H200", and how many when the layers are split. */
    public String deviceName() {
        return stages[0].context.deviceName() + (stages.length > 1 ? " x " + stages.length : "");
    }

    /** Layers of each stage, first to last. */
    public int[] layerSplit() {
        int[] split = new int[stages.length];
        for (int i = 0; i < stages.length; i++) {
            split[i] = stages[i].layerCount();
        }
        return split;
    }

    /** Sequences one decode launch takes: a step of more runs as several launches, each reading the weights. */
    public int maxBatch() {
        return options.maxBatch();
    }

    /** Device bytes of the weights, on all devices (a tied embedding table once where one device has both ends). */
    public long weightBytes() {
        long b = 0;
        for (Stage st : stages) {
            b += st.w.byteSize();
        }
        return b;
    }

    /** Device bytes of the weights one decode step reads (every matrix but the embedding table). */
    public long weightBytesPerToken() {
        long b = 0;
        for (Stage st : stages) {
            b += st.w.bytesPerToken();
        }
        return b;
    }

    /** Multiply-adds of the weight matrices one token goes through (every matrix but the embedding table). */
    public long weightElementsPerToken() {
        long n = 0;
        for (Stage st : stages) {
            n += st.w.elementsPerToken();
        }
        return n;
    }

    /**
     * Which kernel launches overlap their predecessors on every device of this backend from now on (a decode graph
     * captured before keeps the launches it was captured with); for comparisons and tests.
     */
    public void setLaunchOverlap(CudaContext.LaunchOverlap overlap) {
        checkOpen();
        contexts.forEach(c -> c.setLaunchOverlap(overlap));
    }

    /**
     * The device's limits measured now, for benchmark ratios: copy bandwidth (GB/s, bytes read + written, a 1 GiB
     * copy) and the rate of a cuBLASLt bf16 GEMM of 8192 x 8192 x 8192 with fp32 accumulation (TFLOP/s); each the
     * median of 7 timed runs.
     */
    public Limits measureLimits() {
        checkOpen();
        CudaContext context = stages[0].context;
        CudaStream stream = stages[0].stream;
        CublasLt blas = stages[0].blas;
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

    /** The model's sparse-V threshold ({@link LlamaModel#attentionOptions}), fixed when a KV pool is made. */
    private float sparseV() {
        if (model.attentionOptions().softCap() != 0f) {
            throw new IllegalArgumentException("the CUDA attention kernels have no logit soft-cap yet");
        }
        return model.attentionOptions().sparseV();
    }

    @Override
    public Sequence newSequence(int contextLength, KvFormat kFormat, KvFormat vFormat) {
        return newSequence(contextLength, KvLayerFormats.of(kFormat, vFormat));
    }

    /**
     * A sequence of the pool of these formats (made on first use). Layers of their own get their own attention
     * modules: one per distinct format pair.
     */
    /**
     * The tokens a pool for sequences of contextLength holds: maxBatch whole contexts, each a whole number of pages,
     * capped by the --kv-mem budget (kvTokens, 0 for none) — a budget is a cap, not a size: `run -c 2048 --kv-mem
     * 60G` took 60 GiB of the device for one 2,048-token sequence (and was refused where -c alone fitted).
     */
    static long poolTokens(long kvTokens, int contextLength, int maxBatch) {
        long perSequence = ((long) contextLength + PAGE_TOKENS - 1) / PAGE_TOKENS * PAGE_TOKENS;
        long whole = perSequence * maxBatch;
        return kvTokens > 0 ? Math.min(kvTokens, whole) : whole;
    }

    @Override
    public Sequence newSequence(int contextLength, KvLayerFormats formats) {
        checkOpen();
        if (contextLength <= 0) {
            throw new IllegalArgumentException("context length must be positive, got " + contextLength);
        }
        formats.check(c.layers());
        String key = formats.name();
        KvPool pool = pools.get(key);
        if (pool == null) {
            // the pools of other format pairs that no open sequence uses go first (bench --kv f16,q8_0,turbo3 runs
            // its caches one after another: each gets the device, and a --kv-mem budget, to itself)
            for (var it = pools.entrySet().iterator(); it.hasNext(); ) {
                KvPool other = it.next().getValue();
                if (other.idle()) {
                    for (Stage st : stages) {
                        st.stream.synchronize();
                    }
                    other.close();
                    it.remove();
                }
            }
            // a --kv-mem budget in bytes holds as many tokens as these formats' bytes per token allow
            long budget = options.kvBytes() > 0
                    ? Session.contextForBudget(c, formats, model.selection(), options.kvBytes()) : options.kvTokens();
            long tokens = poolTokens(budget, contextLength, options.maxBatch());
            pool = new KvPool(stages, c, formats, PAGE_TOKENS, tokens, contextLength, options.maxBatch(),
                    options.maxPrefill(), HEADROOM, sparseV(), model.selection());
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
        Sequence[] s = checkBatch(seqs, tokens);
        int n = s.length;
        int vocab = c.vocabSize();
        if (out != null && out.length < (long) n * vocab) {
            throw new IllegalArgumentException("a logits array of " + out.length + " floats for " + n + " rows");
        }
        decodeGraphs(s[0].pool, n);
        takePages(s);
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

    /**
     * The sequences of a decode batch (distinct, this backend's, one K/V format pair, not in flight, with room), every
     * token id checked; changes nothing. With {@link #takePages} after it, before any of the batch is queued, a batch
     * run as several groups of up to maxBatch cannot fail on its input in a later group, after the earlier groups
     * were counted in.
     */
    private Sequence[] checkBatch(BackendSequence[] seqs, int[] tokens) {
        int n = seqs.length;
        if (n < 1) {
            throw new IllegalArgumentException("a decode step of no sequences");
        }
        if (tokens.length < n) {
            throw new IllegalArgumentException("a decode step of " + n + " sequences with " + tokens.length
                    + " tokens");
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
            cs.checkUsable();
            cs.checkRoom(1);
            checkToken(tokens[i]);
            s[i] = cs;
        }
        return s;
    }

    /**
     * Every sequence's page for its next token in hand (shared pages copied), or — when the pool has too few free
     * pages for the whole batch — a {@link dev.kvant.kv.KvCacheFullException} and no page taken. (A page shared by two
     * sequences of the batch is counted for each: the check may refuse a batch that would just fit, never pass one
     * that does not.)
     */
    private static void takePages(Sequence[] s) {
        int more = 0;
        int longest = 0;
        for (Sequence cs : s) {
            more += cs.pagesToTake(cs.length + 1);
            longest = Math.max(longest, cs.length + 1);
        }
        s[0].pool.checkFreeForStep(more, s.length, longest);
        for (Sequence cs : s) {
            cs.ensurePages(cs.length + 1);
        }
    }

    /**
     * Every decode graph a batch of n sequences takes (groups of maxBatch and the rest, each stage), captured now if
     * not yet: a batch run as several groups cannot fail on a graph after its first groups were queued and counted in
     * (which a retry of the step would write a second time).
     */
    private void decodeGraphs(KvPool pool, int n) {
        for (int from = 0; from < n; from += options.maxBatch()) {
            int m = Math.min(options.maxBatch(), n - from);
            for (KvPool.Part part : pool.parts()) {
                decodeGraph(part, m);
            }
        }
    }

    /** The decode graph of a stage's part for batches of m sequences (captured at first use). */
    private static CudaGraph decodeGraph(KvPool.Part part, int m) {
        Stage st = part.stage();
        return KvPool.graph(part, m, () -> st.decodeLaunches(part, m));
    }

    /** As many decode steps as there are stages: while one stage runs a batch's layers, the next runs another's. */
    @Override
    public int pipelineDepth() {
        return stages.length;
    }

    /**
     * Queues the step on the stages' streams and returns; the chosen ids (and the logits, when asked) are copied
     * into a page-locked landing of their own as the last stage finishes, so the next step's replay cannot
     * overwrite them before {@link PendingDecode#await} reads them. A batch larger than maxBatch is queued as several
     * launches, one after the other, landing side by side.
     */
    @Override
    public PendingDecode startDecode(BackendSequence[] seqs, int[] tokens, float[] logits) {
        return start(seqs, tokens, logits, null);
    }

    /**
     * Yes: the last stage's decode graph draws the rows that have a temperature, and takes the largest logit but the
     * banned ids of greedy rows that have banned ids ({@link ModelKernels#draw}).
     */
    @Override
    public boolean drawsWhereItRuns() {
        return true;
    }

    /**
     * As {@link #startDecode(BackendSequence[], int[], float[])}, each row's id chosen on the device as draws says
     * (Gumbel-max at its temperature, from its key; the largest logit at 0).
     */
    @Override
    public PendingDecode startDecodeDrawn(BackendSequence[] seqs, int[] tokens, Draws draws, float[] logits) {
        if (draws.temperature().length != seqs.length) {
            throw new IllegalArgumentException(draws.temperature().length + " draws for " + seqs.length
                    + " sequences");
        }
        return start(seqs, tokens, logits, draws);
    }

    private PendingDecode start(BackendSequence[] seqs, int[] tokens, float[] logits, Draws draws) {
        checkOpen();
        Sequence[] s = checkBatch(seqs, tokens);
        int n = s.length;
        int vocab = c.vocabSize();
        if (logits != null && logits.length < (long) n * vocab) {
            throw new IllegalArgumentException("a logits array of " + logits.length + " floats for " + n + " rows");
        }
        Landing landing = null;
        for (Landing l : landings) {
            if (l.step == null) {
                landing = l;
                break;
            }
        }
        if (landing == null) {
            throw new IllegalStateException(landings.length + " decode steps are in flight already (the pipeline "
                    + "depth); await one before starting another");
        }
        landing.reserve(n, logits != null);   // before any work is queued: a failure here changes nothing
        decodeGraphs(s[0].pool, n);            // nor here (a graph that cannot be made fails the step before any of it)
        takePages(s);                           // nor here: no page is taken unless all are
        Stage last = stages[stages.length - 1];
        for (int from = 0; from < n; from += options.maxBatch()) {
            int m = Math.min(options.maxBatch(), n - from);
            queueDecode(Arrays.copyOfRange(s, from, from + m), Arrays.copyOfRange(tokens, from, from + m), draws, from);
            last.best.copyToHostAsync(landing.ids.segment().asSlice(8L * from, 8L * m), 0, last.stream);
            if (logits != null) {
                last.logits.copyToHostAsync(landing.logits.segment().asSlice(4L * from * vocab, 4L * m * vocab), 0,
                        last.stream);
            }
        }
        landing.done.record(last.stream);
        Step step = new Step(landing, s, logits, draws != null);
        landing.step = step;
        for (Sequence q : s) {
            q.inFlight = step;
        }
        return step;
    }

    /** Page-locked host memory a decode step in flight copies its results into, and the event that says they are there. */
    private final class Landing implements AutoCloseable {
        private final CudaContext context;
        final CudaEvent done;
        PinnedBuffer ids;
        PinnedBuffer logits;
        Step step;

        Landing(CudaContext context) {
            this.context = context;
            this.done = context.createEvent();
        }

        /**
         * Room for the ids of n sequences, and their logits rows when asked (grown, never shrunk; at least twice the
         * rows held before, so a server whose batches outgrow maxBatch one sequence at a time pins memory a few
         * times, not at every new size).
         */
        void reserve(int n, boolean withLogits) {
            if (ids == null || ids.byteSize() < 8L * n) {
                long rows = Math.max(Math.max(n, options.maxBatch()), ids == null ? 0 : 2 * (ids.byteSize() / 8));
                PinnedBuffer grown = context.allocatePinned(8L * rows);
                if (ids != null) {
                    ids.close();
                }
                ids = grown;
            }
            long need = 4L * n * c.vocabSize();
            if (withLogits && (logits == null || logits.byteSize() < need)) {
                long held = logits == null ? 0 : 2 * logits.byteSize();
                PinnedBuffer grown = context.allocatePinned(Math.max(Math.max(need, held),
                        4L * options.maxBatch() * c.vocabSize()));
                if (logits != null) {
                    logits.close();
                }
                logits = grown;
            }
        }

        @Override
        public void close() {
            done.close();
            if (ids != null) {
                ids.close();
            }
            if (logits != null) {
                logits.close();
            }
        }
    }

    /** A decode step in flight: its sequences take no other work until it is awaited. */
    private final class Step implements PendingDecode {
        private final Landing landing;
        private final Sequence[] seqs;
        private final float[] out;
        /** Started with draws: the ids come back with the logits too. */
        private final boolean drawn;
        private int[] ids;
        private RuntimeException failure;

        Step(Landing landing, Sequence[] seqs, float[] out, boolean drawn) {
            this.landing = landing;
            this.seqs = seqs;
            this.out = out;
            this.drawn = drawn;
        }

        @Override
        public int[] await() {
            if (landing.step == this) {
                try {
                    checkOpen();
                    landing.done.synchronize();
                    int n = seqs.length;
                    MemorySegment keys = landing.ids.segment();
                    ids = new int[n];
                    for (int i = 0; i < n; i++) {
                        ids[i] = ModelKernels.argmaxIndex(keys.getAtIndex(ValueLayout.JAVA_LONG, i));
                    }
                    if (out != null) {
                        MemorySegment.copy(landing.logits.segment(), ValueLayout.JAVA_FLOAT, 0, out, 0,
                                n * c.vocabSize());
                    }
                } catch (RuntimeException e) {
                    failure = e;
                } finally {
                    landing.step = null;
                    for (Sequence q : seqs) {
                        q.inFlight = null;
                    }
                }
            }
            if (failure != null) {
                throw failure;
            }
            return out == null || drawn ? ids : null;
        }
    }

    @Override
    public SequencePool newSequencePool(int tokens, KvFormat kFormat, KvFormat vFormat) {
        return newSequencePool(tokens, KvLayerFormats.of(kFormat, vFormat));
    }

    @Override
    public SequencePool newSequencePool(int tokens, KvLayerFormats formats) {
        checkOpen();
        if (tokens <= 0) {
            throw new IllegalArgumentException("a KV pool of " + tokens + " tokens");
        }
        KvPool pool = new KvPool(stages, c, formats, PAGE_TOKENS, tokens, tokens, options.maxBatch(),
                options.maxPrefill(), HEADROOM, sparseV(), model.selection());
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

        /**
         * No: on the GPU a row's K/V and logits depend on how it was computed — a prompt chunk's rows come from
         * tensor-core GEMMs with f16 operands (kernels and tiles chosen by the chunk's length), a decode step's from
         * the matrix-vector products (8-bit activations with quantized weights) — so a cached prefix whose rows a
         * decode step wrote, or one that ends inside a prompt chunk, would change a request's greedy output against
         * the same request computed afresh (seen on an H200 with Q8_0 weights, and with a turbo3 cache). A prefix of
         * whole prompt chunks, the rest read in the same chunks, gives the same bits (the chunks' products and
         * attention are the same launches): the engine reuses those (CudaBackendGpuTest).
         */
        @Override
        public boolean forksKeepBits() {
            return false;
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
        public int holders(int page) {
            return pool.holders(page);
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
                pool.copyPage(p.pages[whole], copy);
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
                try {
                    // a backend closed first has waited for its streams and given its contexts back (the pool's
                    // device memory with them): only the pool's own bookkeeping is left
                    if (!CudaBackend.this.closed) {
                        for (Stage st : stages) {
                            st.stream.synchronize();
                        }
                    }
                } finally {
                    pool.close();
                }
            }
        }
    }

    // ---- decode: one token for each of n sequences, one graph replay per stage

    /** Runs the step and waits for it; writes logits (n x vocab) when out is given; returns the chosen ids. */
    private int[] decode(Sequence[] seqs, int[] tokens, float[] out) {
        queueDecode(seqs, tokens, null, 0);
        int n = seqs.length;
        int[] chosen = readIds(n);
        if (out != null) {
            copyLogits(0, n, out, 0);
        }
        return chosen;
    }

    /**
     * Queues one decode step of n <= maxBatch sequences ({@link #checkBatch}, {@link #takePages}: tokens checked, pages in hand), stage
     * after stage, and counts the token in: tokens,
     * positions and page tables go up through each stage's staging, then each stage replays its graph and sends the
     * hidden state on. The last stage leaves the chosen keys in {@code best} — the largest logit's, or for a row that
     * draws[from + i] gives a temperature, the drawn token's — and the rows in {@code logits}.
     */
    private static final int[] NONE_BANNED = {};

    private void queueDecode(Sequence[] seqs, int[] tokens, Draws draws, int from) {
        int n = seqs.length;
        KvPool pool = seqs[0].pool;
        for (KvPool.Part part : pool.parts()) {
            Stage st = part.stage();
            MemorySegment staging = st.stagingSegment();
            for (int i = 0; i < n; i++) {
                Sequence s = seqs[i];
                part.batch().set(i, s.pages, s.pageCount, s.length + 1);
                staging.setAtIndex(ValueLayout.JAVA_INT, i, tokens[i]);
                staging.setAtIndex(ValueLayout.JAVA_INT, rowsMax + i, s.length);
            }
            if (st.first) {
                st.tokens.copyFromHostAsync(staging.asSlice(0, 4L * n), 0, st.stream);
            }
            if (st.last) {   // every step sets every row's draw: greedy, none banned, unless draws says otherwise
                boolean anyPenalized = false;
                for (int i = 0; i < n; i++) {
                    float t = draws == null ? 0f : draws.temperature()[from + i];
                    int[] banned = draws == null || draws.banned()[from + i] == null ? NONE_BANNED
                            : draws.banned()[from + i];
                    long at = st.drawsOffset + (long) ModelKernels.DRAW_BYTES * i;
                    long invT = t > 0 ? Float.floatToRawIntBits(1f / t) & 0xFFFFFFFFL : 0L;
                    staging.set(ValueLayout.JAVA_LONG, at, invT | (long) banned.length << 32);
                    staging.set(ValueLayout.JAVA_LONG, at + 8, draws == null ? 0L : draws.key()[from + i]);
                    for (int b = 0; b < Draws.MAX_BANNED; b++) {
                        staging.set(ValueLayout.JAVA_INT, at + 16 + 4 * b, b < banned.length ? banned[b] : -1);
                    }
                    staging.set(ValueLayout.JAVA_INT, at + 32, draws == null ? 0 : draws.topK()[from + i]);
                    staging.set(ValueLayout.JAVA_FLOAT, at + 36, draws == null ? 1f : draws.topP()[from + i]);
                    staging.set(ValueLayout.JAVA_FLOAT, at + 40, draws == null ? 0f : draws.minP()[from + i]);
                    Draws.Penalty p = draws == null ? null : draws.penalty()[from + i];
                    staging.set(ValueLayout.JAVA_INT, at + 44, p == null ? 0 : p.ids().length);
                    staging.set(ValueLayout.JAVA_FLOAT, at + 48, p == null ? 1f : p.repeat());
                    staging.set(ValueLayout.JAVA_FLOAT, at + 52, p == null ? 0f : p.frequency());
                    staging.set(ValueLayout.JAVA_FLOAT, at + 56, p == null ? 0f : p.presence());
                    staging.set(ValueLayout.JAVA_INT, at + 60, 0);
                    if (p != null) {
                        anyPenalized = true;
                        long row = st.penalizedOffset + (long) ModelKernels.PENALTY_BYTES * i;
                        for (int j = 0; j < p.ids().length; j++) {
                            staging.set(ValueLayout.JAVA_INT, row + 8L * j, p.ids()[j]);
                            staging.set(ValueLayout.JAVA_INT, row + 8L * j + 4, p.counts()[j]);
                        }
                    }
                }
                st.draws.copyFromHostAsync(staging.asSlice(st.drawsOffset, (long) ModelKernels.DRAW_BYTES * n), 0,
                        st.stream);
                if (anyPenalized) {   // the ids of this step's penalties (a row's count says how many are its own)
                    st.penalized.copyFromHostAsync(staging.asSlice(st.penalizedOffset,
                            (long) ModelKernels.PENALTY_BYTES * n), 0, st.stream);
                }
            }
            st.positions.copyFromHostAsync(staging.asSlice(4L * rowsMax, 4L * n), 0, st.stream);
            part.batch().upload(st.stream);
            st.staged();
        }
        List<KvPool.Part> parts = pool.parts();
        for (int i = 0; i < parts.size(); i++) {
            KvPool.Part part = parts.get(i);
            Stage st = part.stage();
            decodeGraph(part, n).launch(st.stream);
            if (!st.last) {
                st.sendHidden(parts.get(i + 1).stage(), n);
            }
        }
        for (Sequence s : seqs) {
            s.length++;
        }
    }

    // ---- prefill: a chunk of one sequence through tensor-core GEMMs, stage after stage

    /**
     * Runs tokens[off .. off+n) (n <= maxPrefill) of one sequence, their ids checked and their pages in hand
     * ({@link Sequence#run}). allLogits: every row's logits into out; else the last row's logits into out when out is
     * given, and the last row's chosen id returned.
     */
    private int prefill(Sequence s, int[] tokens, int off, int n, boolean allLogits, float[] out) {
        KvPool pool = s.pool;
        int start = s.length;
        List<KvPool.Part> parts = pool.parts();
        for (int i = 0; i < parts.size(); i++) {
            KvPool.Part part = parts.get(i);
            Stage st = part.stage();
            MemorySegment staging = st.stagingSegment();
            part.batch().set(0, s.pages, s.pageCount, start + n);
            part.batch().upload(st.stream);
            if (st.first) {
                for (int t = 0; t < n; t++) {
                    staging.setAtIndex(ValueLayout.JAVA_INT, t, tokens[off + t]);
                }
                st.tokens.copyFromHostAsync(staging.asSlice(0, 4L * n), 0, st.stream);
            }
            st.staged();
            st.prefillLaunches(part, n, start, allLogits);
            if (!st.last) {
                st.sendHidden(parts.get(i + 1).stage(), n);
            }
        }
        Stage last = stages[stages.length - 1];
        int chosen = -1;
        if (allLogits) {
            for (int r = 0; r < n; r += ModelKernels.MAX_VECTORS) {
                int m = Math.min(ModelKernels.MAX_VECTORS, n - r);
                last.allLogits(r, m);
                copyLogits(0, m, out, r * c.vocabSize());
            }
        } else {
            chosen = readIds(1)[0];
            if (out != null) {
                copyLogits(0, 1, out, 0);
            }
        }
        s.length = start + n;
        return chosen;
    }

    private int[] readIds(int n) {
        Stage last = stages[stages.length - 1];
        last.best.copyToHostAsync(last.idsHost.segment().asSlice(0, 8L * n), 0, last.stream);
        last.stream.synchronize();
        int[] r = new int[n];
        for (int i = 0; i < n; i++) {
            r[i] = ModelKernels.argmaxIndex(last.idsHost.segment().getAtIndex(ValueLayout.JAVA_LONG, i));
        }
        return r;
    }

    /** Rows [from, from+count) of the device logits into out[outOff ..]; waits for them. */
    private void copyLogits(int from, int count, float[] out, int outOff) {
        Stage last = stages[stages.length - 1];
        last.stream.synchronize();
        long bytes = 4L * count * c.vocabSize();
        last.logits.copyToHost(MemorySegment.ofArray(out).asSlice(4L * outOff, bytes), 4L * from * c.vocabSize());
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
        // every release runs even when one before it throws (a sticky device error makes the first synchronize
        // throw): the first failure is rethrown once everything was given back
        List<Runnable> steps = new ArrayList<>();
        for (Stage st : stages) {
            steps.add(st.stream::synchronize);
        }
        for (KvPool p : pools.values()) {
            steps.add(p::close);
        }
        steps.add(pools::clear);
        for (Landing l : landings) {
            steps.add(l::close);
        }
        for (Stage st : stages) {
            steps.add(st::close);
        }
        for (CudaContext context : contexts) {
            steps.add(context::close);
        }
        RuntimeException first = null;
        for (Runnable step : steps) {
            try {
                step.run();
            } catch (RuntimeException e) {
                if (first == null) {
                    first = e;
                } else {
                    first.addSuppressed(e);
                }
            }
        }
        if (first != null) {
            throw first;
        }
    }

    /** A sequence whose cache pages live in its pool on the device. */
    public final class Sequence implements BackendSequence {
        private final KvPool pool;
        private final int capacity;
        private int[] pages = new int[8];
        private int pageCount;
        private int length;
        private boolean released;
        /** The decode step in flight that this sequence is part of, or null. */
        private Step inFlight;

        Sequence(KvPool pool, int capacity) {
            this.pool = pool;
            this.capacity = capacity;
            pool.attach();
        }

        CudaBackend owner() {
            return CudaBackend.this;
        }

        /** The physical page of a logical page, and the pool it lives in (tests read the device cache through them). */
        int page(int logicalPage) {
            Objects.checkIndex(logicalPage, pageCount);
            return pages[logicalPage];
        }

        KvPool pool() {
            return pool;
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
            checkUsable();
            if (n <= 0) {
                throw new IllegalArgumentException("forward of " + n + " tokens");
            }
            Objects.checkFromIndexSize(off, n, tokens.length);
            checkRoom(n);
            long rows = allLogits ? n : 1;
            if (out != null && out.length < rows * c.vocabSize()) {
                throw new IllegalArgumentException("a logits array of " + out.length + " floats for " + rows
                        + " rows of " + c.vocabSize());
            }
            // every id and every page before the first chunk: a later chunk cannot then fail on its input after the
            // earlier ones were counted in
            for (int t = 0; t < n; t++) {
                checkToken(tokens[off + t]);
            }
            ensurePages(length + n);
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

        /** Refuses work on a closed sequence or one whose decode step is still in flight. */
        void checkUsable() {
            if (released) {
                throw new IllegalStateException("the sequence is closed");
            }
            if (pool.isClosed()) {
                throw new IllegalStateException("the sequence's KV pool is closed");
            }
            if (inFlight != null) {
                throw new IllegalStateException("the sequence has a decode step in flight; await it first");
            }
        }

        void checkRoom(int n) {
            if (n > capacity - length) {   // (no sum: n may be near Integer.MAX_VALUE)
                throw new ContextFullException("the sequence would need " + ((long) length + n)
                        + " tokens but the context holds " + capacity + " (raise -c)");
            }
        }

        @Override
        public int[] pageIds() {
            return java.util.Arrays.copyOf(pages, pageCount);
        }

        /** The free pages {@link #ensurePages}(tokens) would take: new pages, and copies of shared ones. */
        int pagesToTake(int tokens) {
            int need = (tokens + PAGE_TOKENS - 1) / PAGE_TOKENS;
            int copies = 0;
            for (int i = length / PAGE_TOKENS; i < Math.min(need, pageCount); i++) {
                if (pool.shared(pages[i])) {
                    copies++;
                }
            }
            return Math.max(0, need - pageCount) + copies;
        }

        /**
         * Pages for the first {@code tokens} tokens, taken from the pool, with the pages that tokens from
         * {@code length} on are written into made this sequence's own (a page shared with a fork is copied first).
         * Checks for enough free pages before changing anything.
         */
        void ensurePages(int tokens) {
            int need = (tokens + PAGE_TOKENS - 1) / PAGE_TOKENS;
            int firstWritten = length / PAGE_TOKENS;
            pool.checkFree(pagesToTake(tokens), pageCount, tokens, PAGE_TOKENS);
            if (need > pages.length) {
                pages = Arrays.copyOf(pages, Math.max(need, 2 * pages.length));
            }
            for (int i = firstWritten; i < Math.min(need, pageCount); i++) {
                if (pool.shared(pages[i])) {
                    int own = pool.take();
                    pool.copyPage(pages[i], own);
                    pool.give(pages[i]);
                    pages[i] = own;
                }
            }
            while (pageCount < need) {
                pages[pageCount++] = pool.take();
            }
        }

        @Override
        public void fillRandom(int tokens, long seed) {
            checkOpen();
            checkUsable();
            if (tokens < 0) {
                throw new IllegalArgumentException("fill of " + tokens + " tokens");
            }
            checkRoom(tokens);
            int start = length;
            ensurePages(start + tokens);
            try {
                for (int done = 0; done < tokens; done += rowsMax) {
                    int n = Math.min(rowsMax, tokens - done);
                    for (KvPool.Part part : pool.parts()) {
                        Stage st = part.stage();
                        MemorySegment staging = st.stagingSegment();
                        for (int t = 0; t < n; t++) {
                            int pos = start + done + t;
                            staging.setAtIndex(ValueLayout.JAVA_INT, t, pages[pos / PAGE_TOKENS] * PAGE_TOKENS
                                    + pos % PAGE_TOKENS);
                            // kvant_kv_page_means: the chunk is one write of the sequence
                            staging.setAtIndex(ValueLayout.JAVA_INT, n + t, pos < PAGE_TOKENS ? -1
                                    : t == 0 ? pages[pos / PAGE_TOKENS - 1] : -2);
                        }
                        st.slots.copyFromHostAsync(staging.asSlice(0, 4L * n), 0, st.stream);
                        st.prevPages.copyFromHostAsync(staging.asSlice(4L * n, 4L * n), 0, st.stream);
                        part.batch().set(0, pages, pageCount, start + done + n);
                        part.batch().upload(st.stream);
                        st.staged();
                        st.fillRandom(part, start + done + n, n, seed, done);
                        st.stream.synchronize();   // the staging and the batch are reused by the next chunk
                    }
                }
            } catch (RuntimeException e) {
                truncate(start);   // give back the pages of a fill that did not finish
                throw e;
            }
            length = start + tokens;
        }

        @Override
        public void truncate(int newLength) {
            if (inFlight != null) {
                throw new IllegalStateException("the sequence has a decode step in flight; await it first");
            }
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
            if (inFlight != null && !closed) {
                try {
                    inFlight.await();   // its pages are written until the step ends
                } catch (RuntimeException e) {
                    // the step's failure is its awaiter's to report; the pages go back either way
                }
            }
            released = true;
            try {
                if (!closed) {
                    truncate(0);
                }
            } finally {
                pool.detach();   // its pages are back first: an idle pool may then be closed
            }
        }
    }
}
