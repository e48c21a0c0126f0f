package dev.kvant.cuda.attention;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaFunction;
import dev.kvant.cuda.CudaModule;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.Dim3;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;
import dev.kvant.cuda.Owned;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.kv.TurboFormat;
import dev.kvant.select.SelectionConfig;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Attention over a {@link CudaKvCache} on the GPU: quantize-on-write of new K/V rows, split-K decode of one or a few
 * queries per sequence for a batch of sequences, and causal prefill of a chunk of queries; the kernels are
 * {@code attention/*.cu}, compiled for one {@link AttentionShape} (see their header comments for the launch geometry
 * and numerics).
 *
 * <p>Decode launches read every length and page table from a {@link DeviceBatch} and use only scratch allocated here
 * from the {@link AttentionPlan}, so a decode captured into a {@link dev.kvant.cuda.CudaGraph} replays at any length up
 * to the plan's maxTokens.
 *
 * <p>Layouts: queries {@code float [seqs][queries][heads][headDimK]} (unrotated; query i of a sequence of length len
 * sits at position len - queries + i), outputs {@code float [seqs][queries][heads][headDimV]} (unrotated). Prefill:
 * {@code float [n][heads][headDimK]} at positions start..start+n-1, outputs {@code [n][heads][headDimV]}.
 */
public final class CudaAttention implements AutoCloseable {
    /** Threads of the merge and unrotate kernels (attention.cu MERGE_THREADS). */
    static final int MERGE_THREADS = 1024;
    /**
     * Writes of at most this many rows (K or V) with a turbo format take one block a row and one warp a gain
     * (kvant_kv_write_gains): a decode step's few rows then try their gains side by side instead of one after the
     * other. Longer writes keep one warp a row, which does no work twice.
     */
    static final int GAIN_WRITER_ROWS = 256;
    /** Warps of a one-row-a-block writer: one per gain the turbo encoder tries (kv_write.cu KV_GAINS). */
    private static final int KV_GAINS = TurboFormat.gains().length;
    /** Query rows (query x head in group) of one prefill block (attention.cu PRE_ROWS). */
    static final int PREFILL_ROWS = 128;
    /** The largest grid height CUDA launches. */
    static final int MAX_GRID_Y = 65535;

    private final CudaContext context;
    private final AttentionShape shape;
    private final AttentionPlan plan;
    private final float scale;
    private final float sparseThreshold;
    private final CudaModule module;
    private final CudaFunction writeKv;
    private final CudaFunction writeGains;
    private final CudaFunction pageMeans;
    private final CudaFunction ropeWrite;
    private final CudaFunction decode;
    private final CudaFunction prefill;
    private final CudaFunction merge;
    private final CudaFunction unrotate;
    private final CudaFunction fill;
    private final int decodeShared;
    private final int decodeThreads;
    private final int prefillShared;
    private final int prefillThreads;
    private final int decodeStages;
    /** Whether a prefill's output, in a rotated V format's domain, takes the unrotate kernel after it. */
    private final boolean prefillUnrotates;
    /** The rotation blocks of K's and V's bases (0: not rotated); see {@link #queryRotation()}. */
    private final int kRotation;
    private final int vRotation;
    /**
     * The most splits dense decode cuts a sequence into (the plan's for as many decode blocks an SM as the layout
     * allows), and about the blocks one decode launch fills (attention.cu dec_run).
     */
    private final int decodeSplits;
    private final int prefillStages;
    private final int decodeHeads;
    private final DeviceBuffer partials;
    private final DeviceBuffer maxSums;
    private final KernelCache kernelCache;
    /** Query-aware selection, once {@link #enableSelection} ran; null for dense attention only. */
    private Selector selector;

    private CudaAttention(CudaContext context, KernelCache cache, AttentionShape shape, AttentionPlan plan, float scale,
                          float sparseThreshold) {
        this.context = context;
        this.shape = shape;
        this.plan = plan;
        this.scale = scale;
        this.sparseThreshold = sparseThreshold;
        this.decodeHeads = AttentionSource.decodeHeads(shape);
        this.kernelCache = cache;
        KernelSource source = AttentionSource.source(shape);
        // what is made here is closed again when a later step fails (a rejected module, no memory left)
        Owned made = new Owned();
        try {
            this.module = made.add(context.loadModule(cache, source, AttentionSource.defines(shape)));
            this.writeKv = module.function("kvant_kv_write_kv");
            this.writeGains = module.function("kvant_kv_write_gains");
            this.pageMeans = module.function("kvant_kv_page_means");
            this.ropeWrite = module.function("kvant_rope_write");
            // launched overlapped: its page lookups and pair tables run while the launch before it (the step's
            // kvant_rope_write) does; its query loads follow its wait (attention.cu, decode_body)
            this.decode = module.function("kvant_attn_decode");
            this.prefill = module.function("kvant_attn_prefill");
            this.merge = module.function("kvant_attn_merge");
            this.unrotate = module.function("kvant_attn_unrotate");
            this.fill = module.function("kvant_fill_normal");
            int[] info = info(context, module);
            this.decodeShared = info[0];
            this.decodeThreads = info[1];
            this.decodeStages = info[2];
            this.prefillShared = info[3];
            this.prefillThreads = info[4];
            this.prefillStages = info[5];
            this.decodeSplits = plan.maxSplits(info[8]);
            this.prefillUnrotates = info[9] != 0;
            this.kRotation = info[10];
            this.vRotation = info[11];
            if (info[6] != shape.kRowBytes() || info[7] != shape.vRowBytes()) {
                throw new IllegalStateException("module " + source.name() + " computes rows of " + info[6] + "/"
                        + info[7] + " bytes, the formats say " + shape.kRowBytes() + "/" + shape.vRowBytes());
            }
            decode.setMaxDynamicSharedMemory(decodeShared);
            prefill.setMaxDynamicSharedMemory(prefillShared);
            long rows = (long) plan.maxSeqs() * plan.maxQueries() * shape.heads() * plan.maxSplits();
            this.partials = made.add(context.allocate(rows * shape.headDimV() * 4));
            this.maxSums = made.add(context.allocate(rows * 8));
        } catch (RuntimeException | Error e) {
            made.close();
            throw e;
        }
    }

    /** Attention with the usual softmax scale 1/sqrt(headDimK) and dense V. */
    public static CudaAttention create(CudaContext context, KernelCache cache, AttentionShape shape, AttentionPlan plan) {
        return create(context, cache, shape, plan, (float) (1.0 / Math.sqrt(shape.headDimK())), 0f);
    }

    /**
     * @param scale           the softmax scale applied to q.k
     * @param sparseThreshold sparse V: a softmax weight below this (relative to the running maximum of its row, so
     *                        an upper bound of the final weight) is left out of the V sum but kept in the
     *                        denominator, and a 16-token block whose weights all fall below it is neither
     *                        dequantized nor multiplied; 0 disables it
     */
    public static CudaAttention create(CudaContext context, KernelCache cache, AttentionShape shape, AttentionPlan plan,
                                       float scale, float sparseThreshold) {
        if (!(sparseThreshold >= 0f && sparseThreshold < 1f)) {
            throw new IllegalArgumentException("sparse-V threshold must be in [0, 1), got " + sparseThreshold);
        }
        // the prefill grid's height: every kv head's blocks of 128 query rows (a grid's y is at most 65535)
        long prefillBlocks = (long) shape.kvHeads() * (((long) plan.maxPrefill() * shape.group() + PREFILL_ROWS - 1)
                / PREFILL_ROWS);
        if (prefillBlocks > MAX_GRID_Y) {
            throw new IllegalArgumentException("a prefill chunk of " + plan.maxPrefill() + " tokens would launch "
                    + prefillBlocks + " blocks of " + PREFILL_ROWS + " query rows, more than a grid holds ("
                    + MAX_GRID_Y + "); use a smaller --prefill-chunk");
        }
        return new CudaAttention(context, cache, shape, plan, scale, sparseThreshold);
    }

    /** Ints kvant_attn_info writes (attention.cu). */
    private static final int INFO_INTS = 12;

    private static int[] info(CudaContext context, CudaModule module) {
        try (DeviceBuffer out = context.allocate(INFO_INTS * 4); Arena arena = Arena.ofConfined()) {
            CudaStream stream = context.defaultStream();
            module.function("kvant_attn_info").launch(Dim3.of(1), Dim3.of(1), 0, stream, out);
            MemorySegment host = arena.allocate(INFO_INTS * 4);
            out.copyToHost(host);
            return host.toArray(ValueLayout.JAVA_INT);
        }
    }

    /**
     * Quantizes {@code tokens} tokens of K and V rows into their slots of one layer. {@code k} is
     * {@code float [tokens][kvHeads][headDimK]}, {@code v} {@code float [tokens][kvHeads][headDimV]}, unrotated;
     * {@code slots} {@code int32 [tokens]} holds each token's physical slot {@code page * pageTokens + tokenInPage}
     * (negative: skip), read on the device. The bytes equal {@link dev.kvant.kv.KvFormat#encode}'s on this JVM.
     */
    public void quantizeRows(CudaKvCache kv, int layer, DeviceBuffer k, DeviceBuffer v, DeviceBuffer slots, int tokens,
                             CudaStream stream) {
        quantizeRows(kv, layer, k, v, slots, null, tokens, stream);
    }

    /**
     * As above; with a K format centered on page means ({@link PageMeanFormat}) {@code prevPages} (int32 [tokens],
     * see kvant_kv_page_means in kv_write.cu) lets the pages this write opens get their means first.
     */
    public void quantizeRows(CudaKvCache kv, int layer, DeviceBuffer k, DeviceBuffer v, DeviceBuffer slots,
                             DeviceBuffer prevPages, int tokens, CudaStream stream) {
        kv.checkShape(shape, layer);
        if (tokens <= 0) {
            return;
        }
        int rows = tokens * shape.kvHeads();
        requireBytes("K rows", k, (long) rows * shape.headDimK() * 4);
        requireBytes("V rows", v, (long) rows * shape.headDimV() * 4);
        requireBytes("slots", slots, 4L * tokens);
        if (shape.kFormat() instanceof PageMeanFormat) {
            if (prevPages == null) {
                throw new IllegalArgumentException("K format " + shape.kFormat().name() + " centers pages on their "
                        + "means: the write needs the previous pages (prevPages)");
            }
            requireBytes("prevPages", prevPages, 4L * tokens);
            pageMeans.launch(new Dim3(tokens, shape.kvHeads(), 1), Dim3.of(32), 0, stream, k, tokens,
                    shape.kvHeads(), slots, prevPages, kv.kPool(layer), shape.pageTokens(), kv.kPageBytes(layer));
        }
        if ((triesGains(shape.kFormat()) || triesGains(shape.vFormat())) && rows <= GAIN_WRITER_ROWS) {
            writeGains.launch(new Dim3(rows, 2, 1), Dim3.of(32 * KV_GAINS), 0, stream, k, v, rows,
                    shape.kvHeads(), slots, kv.kPool(layer), kv.vPool(layer), shape.pageTokens(), kv.kPageBytes(layer),
                    kv.vPageBytes(layer));
        } else {
            writeKv.launch(new Dim3((rows + 3) / 4, 2, 1), Dim3.of(128), 0, stream, k, v, rows, shape.kvHeads(),
                    slots, kv.kPool(layer), kv.vPool(layer), shape.pageTokens(), kv.kPageBytes(layer), kv.vPageBytes(layer));
        }
    }

    /**
     * Whether {@link #writeRoped} takes a write of {@code tokens} vectors: a K format without page means (whose
     * write needs every row's RoPE first) and rows few enough for one block each (a decode step). Every head size
     * of these kernels (up to 256) fits rope.cuh's registers.
     */
    public boolean writesRoped(int tokens) {
        return !(shape.kFormat() instanceof PageMeanFormat) && tokens > 0
                && (long) tokens * shape.kvHeads() <= GAIN_WRITER_ROWS;
    }

    /**
     * A decode step's RoPE and cache write in one launch (kv_write.cu's kvant_rope_write): q, k and v of r.n()
     * vectors at r.positions() from the fused projection r.qkv(); k rotated by RoPE and v written into this layer's
     * pools in the bytes {@link #quantizeRows} writes from kvant_rope_split's rows, q rotated into r.q(); r.k() and
     * r.v() are not written. Only where {@link #writesRoped} says so.
     */
    public void writeRoped(CudaKvCache kv, int layer, RopeRows r, CudaStream stream) {
        writeRoped(kv, layer, r, false, stream);
    }

    /**
     * As {@link #writeRoped(CudaKvCache, int, RopeRows, CudaStream)}, with rotatedBasis the queries also rotated into
     * K's basis by {@link #queryRotation()} (where it is not 0): the operand of a {@link #decode(CudaKvCache, int,
     * DeviceBuffer, DeviceBatch, int, DeviceBuffer, DeviceBuffer, DeviceBuffer, boolean, CudaStream) decode} told
     * so, whose blocks then skip that rotation. The queries are kvant_rope_split's with the same rotation, bit for bit.
     */
    public void writeRoped(CudaKvCache kv, int layer, RopeRows r, boolean rotatedBasis, CudaStream stream) {
        kv.checkShape(shape, layer);
        if (!writesRoped(r.n()) || r.positions() == null || r.seqStride() != 1 || r.heads() % r.kvHeads() != 0
                || r.kvHeads() != shape.kvHeads() || r.headDim() != shape.headDimK()
                || r.headDimV() != shape.headDimV()) {
            throw new IllegalArgumentException("a fused RoPE write takes decode vectors of this module's shape ("
                    + shape + "), not " + r.n() + " vectors of " + r.kvHeads() + " kv heads of " + r.headDim() + "/"
                    + r.headDimV());
        }
        requireBytes("qkv", r.qkv(), 4L * r.n() * ((long) r.heads() * r.headDim()
                + (long) r.kvHeads() * (r.headDim() + r.headDimV())));
        requireBytes("q", r.q(), 4L * r.n() * r.heads() * r.headDim());
        int queryBlocks = (r.heads() + KV_GAINS - 1) / KV_GAINS;
        ropeWrite.launch(new Dim3(r.n(), 2 * shape.kvHeads() + queryBlocks, 1), Dim3.of(32 * KV_GAINS), 0, stream,
                r.qkv(), r.positions(), r.q(), r.angles(), r.ropeDim(), r.neox() ? 1 : 0, r.heads(), r.kvHeads(),
                orNull(r.qNorm()), orNull(r.kNorm()), r.eps(), r.tables(), r.tableStride(), r.pageTokens(),
                orNull(r.slots()), orNull(r.prevPages()), kv.kPool(layer), kv.vPool(layer), kv.kPageBytes(layer),
                kv.vPageBytes(layer), rotatedBasis && kRotation != 0 ? 1 : 0);
    }

    private static Object orNull(DeviceBuffer b) {
        return b == null ? 0L : b;
    }

    /** Whether rows of format f are encoded by trying the turbo gains (TurboFormat.gains), centered or not. */
    private static boolean triesGains(KvFormat f) {
        return f instanceof TurboFormat || f instanceof PageMeanFormat pm && pm.base() instanceof TurboFormat;
    }

    /** One query per sequence: {@code seqs} sequences of the batch, each query at position length - 1. */
    public void decode(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seqs, DeviceBuffer out,
                       CudaStream stream) {
        decodeMulti(kv, layer, q, batch, seqs, 1, out, null, null, false, stream);
    }

    /**
     * As {@link #decode}, also writing the output rows as 8-bit codes (int8 [seqs][heads·dV]) and per 32 values
     * (scale, scale·Σcodes) (float2 [seqs][heads·dV/32]) where outQ8 is not null: the operand of the next 8-bit
     * product, made in the merge. rotatedBasis: the queries come rotated by {@link #queryRotation()} (where it is not
     * 0; a decode step's {@link #writeRoped(CudaKvCache, int, RopeRows, boolean, CudaStream)} or kvant_rope_split
     * rotates them), so the decode's blocks do not, after the wait that the rest of the step waits on; the same
     * bits as the plain call over the unrotated queries.
     */
    public void decode(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seqs, DeviceBuffer out,
                       DeviceBuffer outQ8, DeviceBuffer outQ8Scales, boolean rotatedBasis, CudaStream stream) {
        decodeMulti(kv, layer, q, batch, seqs, 1, out, outQ8, outQ8Scales, rotatedBasis, stream);
    }

    /**
     * {@code queries} (1..8) consecutive queries per sequence, causal among themselves: query i of a sequence of
     * length len sees positions 0..len-queries+i. Their K/V rows must be in the cache already.
     */
    public void decodeMulti(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seqs, int queries,
                            DeviceBuffer out, CudaStream stream) {
        decodeMulti(kv, layer, q, batch, seqs, queries, out, null, null, false, stream);
    }

    private void decodeMulti(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seqs, int queries,
                             DeviceBuffer out, DeviceBuffer outQ8, DeviceBuffer outQ8Scales, boolean rotatedBasis,
                             CudaStream stream) {
        kv.checkShape(shape, layer);
        if (seqs < 1 || seqs > plan.maxSeqs() || seqs > batch.maxSeqs()) {
            throw new IllegalArgumentException("decode of " + seqs + " sequences; the plan takes " + plan.maxSeqs()
                    + " and the batch holds " + batch.maxSeqs());
        }
        if (queries < 1 || queries > plan.maxQueries()) {
            throw new IllegalArgumentException("decode of " + queries + " queries per sequence; the plan takes 1.."
                    + plan.maxQueries());
        }
        long rows = (long) seqs * queries * shape.heads();
        requireBytes("queries", q, rows * shape.headDimK() * 4);
        requireBytes("output", out, rows * shape.headDimV() * 4);
        int rowTiles = (queries * shape.group() + 7) / 8;
        int maxSplits = decodeSplits;
        // attention.cu dec_run: each block a run of one sequence's splits, about decodeSplits blocks in all for the
        // launch's (kv-head block, row tile) pairs, at most seqs more
        int yBlocks = shape.kvHeads() / decodeHeads * rowTiles;
        int targetBlocks = Math.max(1, decodeSplits / yBlocks);
        Dim3 grid = new Dim3(targetBlocks + seqs, yBlocks, 1);
        decode.launch(grid, Dim3.of(decodeThreads), decodeShared, stream, q, kv.kPool(layer), kv.vPool(layer),
                batch.tables(), batch.tableStride(), batch.lengths(), partials, maxSums, shape.kvHeads(),
                shape.group(), queries, shape.pageTokens(), kv.kPageBytes(layer), kv.vPageBytes(layer), plan.splitTokens(),
                maxSplits, qscale(), sparseThreshold, seqs, targetBlocks, rotatedBasis && kRotation != 0 ? 1 : 0);
        if (outQ8 != null) {
            requireBytes("8-bit output", outQ8, rows * shape.headDimV());
            requireBytes("8-bit output scales", outQ8Scales, rows * shape.headDimV() / 32 * 8);
        }
        merge.launch(new Dim3(queries * shape.heads(), seqs, 1), Dim3.of(MERGE_THREADS), 0, stream, partials,
                maxSums, out, batch.lengths(), -1, queries, shape.heads(), maxSplits, plan.splitTokens(),
                outQ8 == null ? 0L : (Object) outQ8, outQ8Scales == null ? 0L : (Object) outQ8Scales, 0L, 0L, 0, 0,
                shape.group());
    }

    // ---- query-aware selection (select.cu)

    /**
     * Turns on selected decode with {@code config} (the kernels of the one-kv-head-per-block module, compiled on
     * first use, and the scratch of the plan's sequences and tokens). Decode splits of {@code splitTokens} list
     * tokens (0: about 64 splits over the longest list, at least the plan's smallest split each: a list is short, and
     * its one-warp blocks need numbers to hide the memory latency; and a list of every block then splits as dense
     * decode does while its length is within the plan's splits of that size, giving dense decode's bits). Once per
     * attention; the same config again is a no-op.
     */
    public void enableSelection(SelectionConfig config, int splitTokens) {
        if (selector != null) {
            if (!selector.config.equals(config)) {
                throw new IllegalStateException("selection is on with " + selector.config + ", not " + config);
            }
            return;
        }
        selector = new Selector(config, splitTokens);
    }

    /** The selection config in force, or null. */
    public SelectionConfig selection() {
        return selector == null ? null : selector.config;
    }

    /**
     * Recomputes the key summaries of the blocks holding the last {@code written} positions of each of the
     * {@code seqs} sequences of the batch (lengths read on the device: graph-safe), after their rows were written.
     */
    public void summarize(CudaKvCache kv, int layer, DeviceBatch batch, int seqs, int written, CudaStream stream) {
        Selector sl = selector();
        sl.checkCache(kv, layer);
        sl.summarize.launch(new Dim3(written / sl.blockTokens + 2, shape.kvHeads(), seqs), Dim3.of(shape.headDimK()),
                0, stream, kv.kPool(layer), kv.keySummaries(layer), batch.tables(), batch.tableStride(),
                batch.lengths(), 0, written, shape.kvHeads(), shape.pageTokens(), kv.kPageBytes(layer), sl.shift,
                kv.summarySlotsPerPage());
        if (sl.coarse) {
            sl.summarizeCoarse.launch(new Dim3(written / sl.config.coarseTokens() + 2, shape.kvHeads(), seqs),
                    Dim3.of(shape.headDimK()), 0, stream, kv.keySummaries(layer), kv.coarseSummaries(layer),
                    batch.tables(), batch.tableStride(), batch.lengths(), 0, written, shape.kvHeads(),
                    shape.pageTokens(), sl.shift, sl.cshift, kv.summarySlotsPerPage());
        }
    }

    /** As above for one sequence whose length after the write is {@code length} (a prefill chunk, not captured). */
    public void summarize(CudaKvCache kv, int layer, DeviceBatch batch, int seq, int length, int written,
                          CudaStream stream) {
        Selector sl = selector();
        sl.checkCache(kv, layer);
        sl.summarize.launch(new Dim3(written / sl.blockTokens + 2, shape.kvHeads(), 1), Dim3.of(shape.headDimK()),
                0, stream, kv.kPool(layer), kv.keySummaries(layer), batch.table(seq), batch.tableStride(), 0L,
                length, written, shape.kvHeads(), shape.pageTokens(), kv.kPageBytes(layer), sl.shift,
                kv.summarySlotsPerPage());
        if (sl.coarse) {
            sl.summarizeCoarse.launch(new Dim3(written / sl.config.coarseTokens() + 2, shape.kvHeads(), 1),
                    Dim3.of(shape.headDimK()), 0, stream, kv.keySummaries(layer), kv.coarseSummaries(layer),
                    batch.table(seq), batch.tableStride(), 0L, length, written, shape.kvHeads(), shape.pageTokens(),
                    sl.shift, sl.cshift, kv.summarySlotsPerPage());
        }
    }

    /**
     * Chooses, for each of {@code seqs} sequences and each kv head, the blocks its {@code queries} last positions
     * attend to (the lists {@link #decodeSelected} reads): scores from the layer's key summaries, then the top
     * blocks under the budget. Lengths and tables are read on the device (graph-safe).
     */
    public void select(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seqs, int queries,
                       CudaStream stream) {
        Selector sl = selector();
        sl.checkCache(kv, layer);
        checkDecode(batch, seqs, queries);
        requireBytes("queries", q, (long) seqs * queries * shape.heads() * shape.headDimK() * 4);
        sl.select(kv, layer, q, batch.tables(), batch.tableStride(), batch.lengths(), 0, seqs, queries,
                sl.decodeScratch, stream);
    }

    /**
     * Decode as {@link #decodeMulti} through the lists of the last {@link #select}: each kv head attends to its
     * listed blocks only (causal within them). q8 outputs as {@link #decode(CudaKvCache, int, DeviceBuffer,
     * DeviceBatch, int, DeviceBuffer, DeviceBuffer, DeviceBuffer, CudaStream)} when given.
     */
    public void decodeSelected(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seqs, int queries,
                               DeviceBuffer out, DeviceBuffer outQ8, DeviceBuffer outQ8Scales, CudaStream stream) {
        Selector sl = selector();
        kv.checkShape(shape, layer);
        checkDecode(batch, seqs, queries);
        long rows = (long) seqs * queries * shape.heads();
        requireBytes("queries", q, rows * shape.headDimK() * 4);
        requireBytes("output", out, rows * shape.headDimV() * 4);
        if (outQ8 != null) {
            requireBytes("8-bit output", outQ8, rows * shape.headDimV());
            requireBytes("8-bit output scales", outQ8Scales, rows * shape.headDimV() / 32 * 8);
        }
        sl.attend(kv, layer, q, batch.tables(), batch.tableStride(), batch.lengths(), seqs, queries, out, outQ8,
                outQ8Scales, sl.decodeScratch, stream);
    }

    /**
     * {@link #prefill} through a selection per query block, PageTopK's rule for a chunk: the chunk's tokens cut into
     * runs of 16 from its first ({@link dev.kvant.select.Selection#QUERY_BLOCK}), each run choosing its blocks
     * with its own queries and attending causally through them. Runs of {@value #PREFILL_GROUP} blocks go through
     * the selected decode kernels together (each block a pseudo-sequence over the one page table), the last short
     * block alone; a chunk whose every block would list every block runs {@link #prefill} (as the CPU takes its
     * dense path then). The chunk's K rows must be written and summarized ({@link #summarize}) first. Not
     * graph-safe (lengths are uploaded per call).
     */
    public void prefillSelected(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seq, int start,
                                int n, DeviceBuffer out, CudaStream stream) {
        Selector sl = selector();
        sl.checkCache(kv, layer);
        if (n < 1 || n > plan.maxPrefill() || start < 0 || start + n > plan.maxTokens()) {
            throw new IllegalArgumentException("prefill of " + n + " queries at " + start + "; the plan takes 1.."
                    + plan.maxPrefill() + " queries within " + plan.maxTokens() + " tokens");
        }
        long rowBytesK = (long) shape.heads() * shape.headDimK() * 4;
        long rowBytesV = (long) shape.heads() * shape.headDimV() * 4;
        requireBytes("queries", q, n * rowBytesK);
        requireBytes("output", out, n * rowBytesV);
        int qb = dev.kvant.select.Selection.QUERY_BLOCK;
        if (sl.everyBlockSelected(start, n)) {
            // every query block's list holds every block (a short context): dense attention, as the CPU's
            prefill(kv, layer, q, batch, seq, start, n, out, stream);
            return;
        }
        Scratch sc = sl.prefillScratch();
        int blocks = (n + qb - 1) / qb;
        MemorySegment lens = sc.lensHost.segment();
        for (int i = 0; i < blocks; i++) {
            lens.setAtIndex(ValueLayout.JAVA_INT, i, start + Math.min(n, (i + 1) * qb));
        }
        sc.lens.copyFromHostAsync(lens.asSlice(0, 4L * blocks), 0, stream);
        DeviceBuffer table = batch.table(seq);
        int full = n / qb;
        for (int b0 = 0; b0 < full; b0 += PREFILL_GROUP) {
            int m = Math.min(PREFILL_GROUP, full - b0);
            DeviceBuffer qs = q.slice(b0 * qb * rowBytesK, m * qb * rowBytesK);
            DeviceBuffer os = out.slice(b0 * qb * rowBytesV, m * qb * rowBytesV);
            DeviceBuffer ls = sc.lens.slice(4L * b0, 4L * m);
            sl.select(kv, layer, qs, table, 0, ls, start + n, m, qb, sc, stream);
            sl.attend(kv, layer, qs, table, 0, ls, m, qb, os, null, null, sc, stream);
        }
        int rest = n - full * qb;
        if (rest > 0) {
            DeviceBuffer qs = q.slice((long) full * qb * rowBytesK, rest * rowBytesK);
            DeviceBuffer os = out.slice((long) full * qb * rowBytesV, rest * rowBytesV);
            DeviceBuffer ls = sc.lens.slice(4L * full, 4);
            sl.select(kv, layer, qs, table, 0, ls, start + n, 1, rest, sc, stream);
            sl.attend(kv, layer, qs, table, 0, ls, 1, rest, os, null, null, sc, stream);
        }
        // the lens staging is rewritten by the next call: wait for this one's copy
        stream.synchronize();
    }

    /** Query blocks of a selected prefill that run in one set of launches. */
    static final int PREFILL_GROUP = 16;
    /** Query rows one pass of the score kernels holds in shared memory (select.cu SCORE_ROWS). */
    static final int SCORE_ROWS = 32;

    /**
     * The lists of the last {@link #select} (once the stream that made them is synchronized): [seq][kvHead] =
     * ascending block indices. For tests and selection dumps.
     */
    public int[][][] selectionLists(int seqs) {
        Selector sl = selector();
        Scratch sc = sl.decodeScratch;
        int kvh = shape.kvHeads();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment counts = arena.allocate(4L * seqs * kvh, 16);
            MemorySegment lists = arena.allocate(4L * seqs * kvh * sl.listStride, 16);
            sc.counts.copyToHost(counts);
            sc.lists.copyToHost(lists);
            int[][][] out = new int[seqs][kvh][];
            for (int s = 0; s < seqs; s++) {
                for (int g = 0; g < kvh; g++) {
                    int n = counts.getAtIndex(ValueLayout.JAVA_INT, (long) s * kvh + g);
                    out[s][g] = new int[n];
                    for (int i = 0; i < n; i++) {
                        out[s][g][i] = lists.getAtIndex(ValueLayout.JAVA_INT, ((long) s * kvh + g) * sl.listStride + i);
                    }
                }
            }
            return out;
        }
    }

    /** Selected-decode launch facts for reports. */
    public String selectionSummary() {
        Selector sl = selector();
        return sl.config + "; lists of up to " + sl.listStride + " blocks, decode splits of "
                + sl.decodeScratch.splitTokens + " list tokens (" + sl.decodeScratch.maxSplits + " at most), "
                + sl.decodeThreads + " threads, " + sl.decodeShared + " B shared";
    }

    private Selector selector() {
        if (selector == null) {
            throw new IllegalStateException("selection is off: call enableSelection first");
        }
        return selector;
    }

    private void checkDecode(DeviceBatch batch, int seqs, int queries) {
        if (seqs < 1 || seqs > plan.maxSeqs() || seqs > batch.maxSeqs()) {
            throw new IllegalArgumentException("decode of " + seqs + " sequences; the plan takes " + plan.maxSeqs()
                    + " and the batch holds " + batch.maxSeqs());
        }
        if (queries < 1 || queries > plan.maxQueries()) {
            throw new IllegalArgumentException("decode of " + queries + " queries per sequence; the plan takes 1.."
                    + plan.maxQueries());
        }
    }

    /**
     * The device memory of one kind of selected launch (decode steps, or prefill chunks): scores, lists, the coarse
     * round's kept blocks, split partials, for up to {@code seqs} (pseudo-)sequences of {@code queries} queries.
     */
    private final class Scratch implements AutoCloseable {
        final int seqs;
        final int queries;
        final int splitTokens;
        final int maxSplits;
        final DeviceBuffer scores;
        final DeviceBuffer lists;
        final DeviceBuffer counts;
        final DeviceBuffer partials;
        final DeviceBuffer maxSums;
        final DeviceBuffer coarseScores;
        final DeviceBuffer kept;
        final DeviceBuffer keptCounts;
        /** Prefill only: the lengths of the pseudo-sequences (query blocks), on the device and pinned for upload. */
        final DeviceBuffer lens;
        final dev.kvant.cuda.PinnedBuffer lensHost;

        Scratch(Selector sl, int seqs, int queries, int splitTokens, int lensCount) {
            this.seqs = seqs;
            this.queries = queries;
            this.splitTokens = splitTokens;
            this.maxSplits = (sl.listStride * sl.blockTokens + splitTokens - 1) / splitTokens;
            if (maxSplits > AttentionPlan.MAX_SPLITS) {
                throw new IllegalArgumentException("selected decode of " + sl.listStride * sl.blockTokens
                        + " tokens in splits of " + splitTokens + " makes more than " + AttentionPlan.MAX_SPLITS
                        + " splits");
            }
            Owned made = new Owned();
            try {
                long seqHeads = (long) seqs * shape.kvHeads();
                // the kept round's entries: the kept coarse blocks and the one the recent window cuts
                int entries = sl.coarse ? Math.max(sl.maxBlocks, (sl.keep + 1) * sl.config.coarseBlocks())
                        : sl.maxBlocks;
                this.scores = made.add(context.allocate(4L * seqHeads * entries));
                this.lists = made.add(context.allocate(4L * seqHeads * sl.listStride));
                this.counts = made.add(context.allocate(4L * seqHeads));
                long rows = (long) seqs * queries * shape.heads() * maxSplits;
                this.partials = made.add(context.allocate(rows * shape.headDimV() * 4));
                this.maxSums = made.add(context.allocate(rows * 8));
                this.coarseScores = made.add(context.allocate(4L * seqHeads * Math.max(1, sl.maxCoarse)));
                this.kept = made.add(context.allocate(4L * seqHeads * (sl.keep + 1)));
                this.keptCounts = made.add(context.allocate(4L * seqHeads));
                this.lens = lensCount == 0 ? null : made.add(context.allocate(4L * lensCount));
                this.lensHost = lensCount == 0 ? null : made.add(context.allocatePinned(4L * lensCount));
            } catch (RuntimeException e) {
                made.close();
                throw e;
            }
            this.owned = made;
        }

        private final Owned owned;

        @Override
        public void close() {
            owned.close();
        }
    }

    /** Kernels of selection (the one-kv-head-per-block module) and the decode steps' scratch. */
    private final class Selector implements AutoCloseable {
        final SelectionConfig config;
        final int blockTokens;
        final int shift;
        final int maxBlocks;
        final int budgetBlocks;
        final int listStride;
        final CudaModule own;
        final CudaFunction summarize;
        final CudaFunction score;
        final CudaFunction topk;
        final boolean coarse;
        final int cshift;
        final int maxCoarse;
        /** Coarse blocks kept: the config's, at most the plan's coarse blocks. */
        final int keep;
        final CudaFunction summarizeCoarse;
        final CudaFunction scoreCoarse;
        final CudaFunction topkCoarse;
        final CudaFunction scoreKept;
        final CudaFunction topkKept;
        final CudaFunction decode;
        final CudaFunction merge;
        final int decodeShared;
        final int decodeThreads;
        final Scratch decodeScratch;
        final Scratch prefillScratch;

        Selector(SelectionConfig config, int split) {
            this.config = config;
            this.blockTokens = config.blockTokens();
            this.shift = Integer.numberOfTrailingZeros(blockTokens);
            this.coarse = config.coarseTokens() > 0;
            this.cshift = coarse ? Integer.numberOfTrailingZeros(config.coarseTokens()) : shift;
            this.maxCoarse = coarse ? (plan.maxTokens() + config.coarseTokens() - 1) / config.coarseTokens() : 0;
            // keeping more coarse blocks than the plan's context holds is keeping them all: the same choice
            this.keep = Math.min(config.coarseKeep(), maxCoarse);
            if (shape.pageTokens() % blockTokens != 0
                    || coarse && config.coarseTokens() % shape.pageTokens() != 0) {
                throw new IllegalArgumentException("selection on the GPU needs blocks that divide the page ("
                        + shape.pageTokens() + " tokens) and coarse blocks of whole pages; got " + config);
            }
            this.maxBlocks = (plan.maxTokens() + blockTokens - 1) / blockTokens;
            this.budgetBlocks = config.budget() / blockTokens;
            // A list holds max(budget blocks, sink + recent + the queries' own two) blocks (PageTopK's count).
            this.listStride = Math.min(maxBlocks,
                    Math.max(budgetBlocks, config.sinkBlocks() + config.recentBlocks() + 2));
            int listTokens = listStride * blockTokens;
            if (split == 0) {
                split = Math.clamp(Integer.highestOneBit(Math.max(1, listTokens / 64 - 1)) * 2, plan.splitTokens(),
                        Math.max(plan.splitTokens(), 1024));
            }
            if (split < 16 || split % 16 != 0) {
                throw new IllegalArgumentException("selected decode splits are whole 16-token tiles, got " + split);
            }
            CudaModule m = decodeHeads == 1 ? module : context.loadModule(kernelCache,
                    AttentionSource.source(shape, 1), AttentionSource.defines(shape, 1));
            this.own = m == module ? null : m;
            try {
                this.summarize = m.function("kvant_kv_summarize");
                this.score = m.function("kvant_select_score");
                this.topk = m.function("kvant_select_topk");
                this.summarizeCoarse = m.function("kvant_kv_summarize_coarse");
                this.scoreCoarse = m.function("kvant_select_score_coarse");
                this.topkCoarse = m.function("kvant_select_topk_coarse");
                this.scoreKept = m.function("kvant_select_score_kept");
                this.topkKept = m.function("kvant_select_topk_kept");
                this.decode = m.function("kvant_attn_decode_sel").plainLaunches();
                this.merge = m.function("kvant_attn_merge");
                int[] info = info(context, m);
                this.decodeShared = info[0];
                this.decodeThreads = info[1];
                decode.setMaxDynamicSharedMemory(decodeShared);
                for (CudaFunction f : new CudaFunction[] {score, scoreCoarse, scoreKept}) {
                    f.setMaxDynamicSharedMemory(SCORE_ROWS * shape.headDimK() * 8);
                }
                this.decodeScratch = new Scratch(this, plan.maxSeqs(), plan.maxQueries(), split, 0);
            } catch (RuntimeException e) {
                if (own != null) {
                    own.close();
                }
                throw e;
            }
            // selected prefill's scratch made now, not at the first chunk, so that the KV cache's fit check (which
            // comes after) counts it; splits of 256 list tokens keep its partials small
            int qb = dev.kvant.select.Selection.QUERY_BLOCK;
            try {
                this.prefillScratch = plan.maxPrefill() == 0 ? null
                        : new Scratch(this, PREFILL_GROUP, qb, 256, (plan.maxPrefill() + qb - 1) / qb);
            } catch (RuntimeException e) {
                decodeScratch.close();
                if (own != null) {
                    own.close();
                }
                throw e;
            }
        }

        /**
         * Whether every query block of a chunk of n queries at start selects every block (the budget covers what it
         * sees): select.cu's SelectWindow, computed on the host from the lengths alone.
         */
        boolean everyBlockSelected(int start, int n) {
            int qb = dev.kvant.select.Selection.QUERY_BLOCK;
            for (int t0 = 0; t0 < n; t0 += qb) {
                int t1 = Math.min(n, t0 + qb);
                int len = start + t1;
                int visible = (len + blockTokens - 1) / blockTokens;
                int sink = Math.min(visible, config.sinkBlocks());
                int recentFrom = Math.max(sink, (start + t0) / blockTokens - config.recentBlocks());
                int k = Math.max(0, budgetBlocks - (sink + visible - recentFrom));
                if (k < recentFrom - sink) {
                    return false;
                }
            }
            return true;
        }

        /** The scratch of selected prefill (made with the selection when the plan has prefill chunks). */
        Scratch prefillScratch() {
            if (prefillScratch == null) {
                throw new IllegalStateException("selected prefill in an attention planned without prefill chunks");
            }
            return prefillScratch;
        }

        void checkCache(CudaKvCache kv, int layer) {
            kv.checkShape(shape, layer);
            if (kv.summaryBlockTokens() != blockTokens || kv.summaryCoarseTokens() != config.coarseTokens()) {
                throw new IllegalArgumentException("selection over blocks of " + blockTokens + " tokens (coarse "
                        + config.coarseTokens() + ") needs the cache's key summaries for those sizes"
                        + " (enableKeySummaries(" + blockTokens + ", " + config.coarseTokens() + "))");
            }
        }

        /** Scores and top-k of seqs (pseudo-)sequences into sc's lists. */
        void select(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBuffer tables, int tableStride,
                    DeviceBuffer lens, int summaryLen, int seqs, int queries, Scratch sc, CudaStream stream) {
            int shared = Math.min(SCORE_ROWS, queries * shape.group()) * shape.headDimK() * 8;
            int sink = config.sinkBlocks(), recent = config.recentBlocks();
            Dim3 topkGrid = new Dim3(shape.kvHeads(), seqs, 1);
            if (!coarse) {
                score.launch(new Dim3((maxBlocks + 63) / 64, shape.kvHeads(), seqs), Dim3.of(256), shared, stream,
                        q, kv.keySummaries(layer), tables, tableStride, lens, summaryLen, sc.scores, 0L, 0L, 0,
                        shape.kvHeads(),
                        shape.group(), queries, shape.pageTokens(), shift, shift, kv.summarySlotsPerPage(), sink,
                        recent, budgetBlocks, maxBlocks);
                topk.launch(topkGrid, Dim3.of(1024), 0, stream, sc.scores, lens, sc.lists, sc.counts, listStride,
                        shape.kvHeads(), queries, shift, sink, recent, budgetBlocks, maxBlocks);
                return;
            }
            int keep = this.keep;
            int entries = (keep + 1) * config.coarseBlocks();
            scoreCoarse.launch(new Dim3((maxCoarse + 63) / 64, shape.kvHeads(), seqs), Dim3.of(256), shared, stream,
                    q, kv.coarseSummaries(layer), tables, tableStride, lens, summaryLen, sc.coarseScores, 0L, 0L,
                    keep,
                    shape.kvHeads(), shape.group(), queries, shape.pageTokens(), shift, cshift,
                    kv.summarySlotsPerPage(), sink, recent, budgetBlocks, maxCoarse);
            topkCoarse.launch(topkGrid, Dim3.of(1024), 0, stream, sc.coarseScores, lens, sc.kept, sc.keptCounts,
                    keep, shape.kvHeads(), queries, shift, cshift, sink, recent, budgetBlocks, maxCoarse);
            scoreKept.launch(new Dim3((entries + 63) / 64, shape.kvHeads(), seqs), Dim3.of(256), shared, stream, q,
                    kv.keySummaries(layer), tables, tableStride, lens, summaryLen, sc.scores, sc.kept,
                    sc.keptCounts, keep,
                    shape.kvHeads(), shape.group(), queries, shape.pageTokens(), shift, cshift,
                    kv.summarySlotsPerPage(), sink, recent, budgetBlocks, entries);
            topkKept.launch(topkGrid, Dim3.of(1024), 0, stream, sc.scores, lens, sc.kept, sc.keptCounts, keep,
                    sc.lists, sc.counts, listStride, shape.kvHeads(), queries, shift, cshift, sink, recent,
                    budgetBlocks, entries);
        }

        /** Selected decode of seqs (pseudo-)sequences through sc's lists, and the merge into out. */
        void attend(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBuffer tables, int tableStride,
                    DeviceBuffer lens, int seqs, int queries, DeviceBuffer out, DeviceBuffer outQ8,
                    DeviceBuffer outQ8Scales, Scratch sc, CudaStream stream) {
            int rowTiles = (queries * shape.group() + 7) / 8;
            decode.launch(new Dim3(sc.maxSplits, shape.kvHeads() * rowTiles, seqs), Dim3.of(decodeThreads),
                    decodeShared, stream, q, kv.kPool(layer), kv.vPool(layer), tables, tableStride, lens,
                    sc.partials, sc.maxSums, shape.kvHeads(), shape.group(), queries, shape.pageTokens(),
                    kv.kPageBytes(layer), kv.vPageBytes(layer), sc.splitTokens, sc.maxSplits, qscale(), sparseThreshold,
                    sc.lists, sc.counts, listStride, shift);
            merge.launch(new Dim3(queries * shape.heads(), seqs, 1), Dim3.of(MERGE_THREADS), 0, stream, sc.partials,
                    sc.maxSums, out, lens, -1, queries, shape.heads(), sc.maxSplits, sc.splitTokens,
                    outQ8 == null ? 0L : (Object) outQ8, outQ8Scales == null ? 0L : (Object) outQ8Scales, sc.lists,
                    sc.counts, listStride, shift, shape.group());
        }

        @Override
        public void close() {
            decodeScratch.close();
            if (prefillScratch != null) {
                prefillScratch.close();
            }
            if (own != null) {
                own.close();
            }
        }
    }

    /**
     * Causal attention of {@code n} queries of sequence {@code seq} at positions start..start+n-1 over its cached
     * tokens 0..start+n-1 (the chunk's own K/V rows written first): a chunk of a prompt, after earlier chunks.
     */
    public void prefill(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seq, int start, int n,
                        DeviceBuffer out, CudaStream stream) {
        prefill(kv, layer, q, batch, seq, start, n, out, false, stream);
    }

    /**
     * The block of the rotation that takes queries into K's basis: 64 or 128 values (dev.kvant.kv.Rotation of that
     * block, block after block along the head), or 0 where K is not rotated (no turbo or q4_0h rows).
     */
    public int queryRotation() {
        return kRotation;
    }

    /** As {@link #queryRotation} for V: the rotation an output left in V's basis must be turned back by. */
    public int outputRotation() {
        return vRotation;
    }

    /**
     * As {@link #prefill(CudaKvCache, int, DeviceBuffer, DeviceBatch, int, int, int, DeviceBuffer, CudaStream)}, with
     * rotatedBasis the queries already rotated by {@link #queryRotation()} (where it is not 0) and the output left
     * rotated by {@link #outputRotation()} (where it is not 0): the model rotates them in passes it makes anyway (its
     * RoPE, and the output's conversion to f16), so the kernel's blocks, one an SM, do not hold the tensor cores idle
     * for them. The output, turned back, has the bits of the plain call's.
     */
    public void prefill(CudaKvCache kv, int layer, DeviceBuffer q, DeviceBatch batch, int seq, int start, int n,
                        DeviceBuffer out, boolean rotatedBasis, CudaStream stream) {
        kv.checkShape(shape, layer);
        if (n < 1 || n > plan.maxPrefill() || start < 0) {
            throw new IllegalArgumentException("prefill of " + n + " queries at " + start + "; the plan takes 1.."
                    + plan.maxPrefill() + " queries");
        }
        if ((long) start + n > plan.maxTokens()) {   // the kernel reads the table this far
            throw new IllegalArgumentException("prefill of " + n + " queries at " + start + " reaches past the "
                    + plan.maxTokens() + " tokens a sequence of the plan holds");
        }
        long rows = (long) n * shape.heads();
        requireBytes("queries", q, rows * shape.headDimK() * 4);
        requireBytes("output", out, rows * shape.headDimV() * 4);
        int rowBlocks = (n * shape.group() + PREFILL_ROWS - 1) / PREFILL_ROWS;
        // attention.cu PRE_Q_ROTATED, PRE_OUT_ROTATED
        int flags = rotatedBasis ? (kRotation != 0 ? 1 : 0) | (vRotation != 0 ? 2 : 0) : 0;
        prefill.launch(new Dim3(1, shape.kvHeads() * rowBlocks, 1), Dim3.of(prefillThreads), prefillShared, stream, q,
                kv.kPool(layer), kv.vPool(layer), batch.table(seq), start, n, out, shape.kvHeads(), shape.group(),
                shape.pageTokens(), kv.kPageBytes(layer), kv.vPageBytes(layer), qscale(), sparseThreshold, flags);
        if (prefillUnrotates && !rotatedBasis) {
            int perBlock = MERGE_THREADS / shape.headDimV();
            unrotate.launch(Dim3.of((int) ((rows + perBlock - 1) / perBlock)), Dim3.of(MERGE_THREADS), 0, stream, out,
                    rows);
        }
    }

    /** Fills {@code n} floats with standard normal draws times {@code scale} (device test and benchmark data). */
    public void fillNormal(DeviceBuffer dst, long n, int seed, float scale, CudaStream stream) {
        requireBytes("fill", dst, n * 4);
        int blocks = (int) Math.max(1, Math.min((n + 255) / 256, 4L * 1024));
        fill.launch(Dim3.of(blocks), Dim3.of(256), 0, stream, dst, n, seed, scale);
    }

    /** The softmax scale times log2(e): the kernels' softmax is exp2 of pre-scaled logits. */
    private float qscale() {
        return (float) (scale / Math.log(2.0));
    }

    private static void requireBytes(String what, DeviceBuffer b, long bytes) {
        if (b.byteSize() < bytes) {
            throw new IllegalArgumentException(what + ": device buffer " + b + " is smaller than the " + bytes
                    + " bytes the launch reads or writes");
        }
    }

    public AttentionShape shape() {
        return shape;
    }

    public AttentionPlan plan() {
        return plan;
    }

    /** The split a dense decode over {@code len} cached tokens uses. */
    public int decodeSplit(int len) {
        return plan.splitFor(len, decodeSplits);
    }

    /** Kv heads one decode block serves (one warp each). */
    public int decodeHeads() {
        return decodeHeads;
    }

    /** Launch facts for reports: shared bytes, threads and cp.async stages of decode and prefill. */
    public String launchSummary() {
        return "decode " + decodeThreads + " threads, " + decodeShared + " B shared, " + decodeStages
                + " stages, regs " + decode.registers() + "; prefill " + prefillThreads + " threads, " + prefillShared
                + " B shared, " + prefillStages + " stages, regs " + prefill.registers();
    }

    @Override
    public void close() {
        if (selector != null) {
            selector.close();
            selector = null;
        }
        partials.close();
        maxSums.close();
        module.close();
    }
}
