package dev.kvant.cuda.model;

import dev.kvant.cuda.CublasLt;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaEvent;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.Owned;
import dev.kvant.cuda.PinnedBuffer;
import dev.kvant.cuda.attention.CudaAttention;
import dev.kvant.cuda.attention.RopeRows;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.model.Rope;

import java.lang.foreign.MemorySegment;

/**
 * One device's part of the model: layers [from, to) with their weights, kernels, stream and activations (the first
 * stage also embeds tokens, the last one makes logits). A model on one GPU is one stage; a layer split is several,
 * whose hidden states cross from one to the next once per step ({@link #sendHidden}).
 */
final class Stage implements AutoCloseable {
    final CudaContext context;
    final CudaStream stream;
    final ModelKernels k;
    final CublasLt blas;
    final DeviceWeights w;
    final int from;
    final int to;
    final boolean first;
    final boolean last;
    private final ModelConfig c;
    private final Owned owned = new Owned();

    private final int qkvDim;
    private final int attnDim;
    final DeviceBuffer tokens;
    final DeviceBuffer positions;
    final DeviceBuffer slots;
    /** Per vector, what kvant_kv_page_means needs to center a page it opens (see kv_write.cu). */
    final DeviceBuffer prevPages;
    /** Argmax keys of the output product, one per vector (ModelKernels#logits); the last stage's. */
    final DeviceBuffer best;
    /**
     * The decode step's draws, one per vector ({@link ModelKernels#DRAW_BYTES}: 1/T — 0 for greedy — and the number
     * of banned ids, the key, the banned ids, top-k, top-p, min-p, penalties), staged from {@link #staging} past its
     * tokens and positions ({@link #drawsOffset}); the last stage's decode graph draws the rows that have a
     * temperature, banned ids or penalties ({@link ModelKernels#draw}).
     */
    final DeviceBuffer draws;
    /** Where the draws sit in {@link #staging}. */
    final long drawsOffset;
    /** Each vector's penalized ids and counts ({@link ModelKernels#PENALTY_BYTES}), staged from {@link #penalizedOffset}. */
    final DeviceBuffer penalized;
    final long penalizedOffset;
    final DeviceBuffer x;
    private final ModelKernels.Vectors xb;
    private final DeviceBuffer qkv;
    private final DeviceBuffer q;
    private final DeviceBuffer kRows;
    private final DeviceBuffer vRows;
    private final ModelKernels.Vectors attn;
    private final DeviceBuffer gu;
    private final ModelKernels.Vectors g;
    final DeviceBuffer logits;
    private final DeviceBuffer xh;
    private final DeviceBuffer ah;
    private final DeviceBuffer gh;
    private final DeviceBuffer wScratch;
    /** (cos, sin) of each rotated pair at each row's position: made once a step, read by every layer. */
    private final DeviceBuffer angles;
    final PinnedBuffer staging;
    final PinnedBuffer idsHost;
    /** Recorded after the hidden state left for the next stage. */
    final CudaEvent sent;
    /**
     * Recorded on this stage's stream when the previous stage is about to send it a hidden state: the copy waits
     * for it, so that it never lands in {@link #x} while an earlier step (of other sequences) is still using it.
     */
    private final CudaEvent ready;
    /** Recorded after the copies from {@link #staging} and the KV batch's staging: the host waits before rewriting. */
    private final CudaEvent uploaded;

    /**
     * @param rowsMax   the most rows (decode vectors or prefill tokens) one launch takes
     * @param logitRows the most vectors whose logits one product makes
     */
    Stage(CudaContext context, LlamaModel model, int from, int to, int rowsMax, int logitRows, int maxPrefill) {
        this.context = context;
        this.c = model.config();
        this.from = from;
        this.to = to;
        this.first = from == 0;
        this.last = to == c.layers();
        try {
            KernelCache cache = KernelCache.open(context);
            this.stream = own(context.createStream());
            this.sent = own(context.createEvent());
            this.ready = own(context.createEvent());
            this.uploaded = own(context.createEvent());
            this.k = own(new ModelKernels(context, cache));
            this.blas = own(CublasLt.create(context));
            this.w = own(new DeviceWeights(context, c, model.weights(), from, to));
            this.qkvDim = c.qDim() + c.kvDimK() + c.kvDimV();
            this.attnDim = c.heads() * c.headDimV();
            this.tokens = floats(rowsMax);
            this.positions = floats(rowsMax);
            this.slots = floats(rowsMax);
            this.prevPages = floats(rowsMax);
            this.best = bytes(8L * logitRows);
            this.draws = bytes((long) ModelKernels.DRAW_BYTES * logitRows);
            this.drawsOffset = 8L * rowsMax;
            this.penalized = bytes((long) ModelKernels.PENALTY_BYTES * logitRows);
            this.penalizedOffset = drawsOffset + (long) ModelKernels.DRAW_BYTES * logitRows;
            this.x = floats((long) rowsMax * c.dim());
            this.xb = ModelKernels.Vectors.allocate(this::bytes, rowsMax, c.dim());
            this.qkv = floats((long) rowsMax * qkvDim);
            this.q = floats((long) rowsMax * c.qDim());
            this.kRows = floats((long) rowsMax * c.kvDimK());
            this.vRows = floats((long) rowsMax * c.kvDimV());
            this.attn = ModelKernels.Vectors.allocate(this::bytes, rowsMax, attnDim);
            this.gu = floats((long) rowsMax * 2 * c.ffnDim());
            this.g = ModelKernels.Vectors.allocate(this::bytes, rowsMax, c.ffnDim());
            this.logits = last ? floats((long) logitRows * c.vocabSize()) : null;
            this.xh = bytes(2L * maxPrefill * c.dim());
            this.ah = bytes(2L * maxPrefill * attnDim);
            this.gh = bytes(2L * maxPrefill * c.ffnDim());
            this.wScratch = bytes(Math.max(16, w.gemmScratchBytes(maxPrefill)));
            this.angles = bytes(8L * rowsMax * Math.max(1, c.rope().ropeDim() / 2));
            this.staging = own(context.allocatePinned(penalizedOffset
                    + (long) ModelKernels.PENALTY_BYTES * logitRows));
            this.idsHost = own(context.allocatePinned(8L * logitRows));
        } catch (RuntimeException | Error e) {
            close();
            throw e;
        }
    }

    /**
     * Device bytes the constructor allocates besides the weights (activations, logits, prefill operands), with the
     * prefill's weight scratch at its bound (the f16 copy of the largest projection): what a stage needs on its GPU
     * beyond {@link CudaBackend#stageWeightBytes}, for the fit check before anything is allocated.
     */
    static long scratchBytes(ModelConfig c, int rowsMax, int logitRows, int maxPrefill, boolean last) {
        long r = rowsMax;
        long dim = c.dim();
        long ffn = c.ffnDim();
        long qkvDim = (long) c.qDim() + c.kvDimK() + c.kvDimV();
        long attnDim = (long) c.heads() * c.headDimV();
        // tokens, positions, slots, pages; best, draws, penalized ids
        long bytes = 16 * r + (8L + ModelKernels.DRAW_BYTES + ModelKernels.PENALTY_BYTES) * logitRows;
        bytes += 4 * r * dim + vectorBytes(r, dim);                            // x, xb
        bytes += 4 * r * (qkvDim + c.qDim() + c.kvDimK() + c.kvDimV());        // qkv, q, kRows, vRows
        bytes += vectorBytes(r, attnDim) + 4 * r * 2 * ffn + vectorBytes(r, ffn);   // attn, gu, g
        bytes += last ? 4L * logitRows * c.vocabSize() : 0;                     // logits
        bytes += 2L * maxPrefill * (dim + attnDim + ffn);                       // xh, ah, gh
        // wScratch, at most (Projection.gemmScratchBytes): the f16 copy of the largest projection, or the partial
        // sums of the dequantizing products, which are larger for rows under 1,024 columns
        long partialsPerRow = 4L * ModelKernels.MH_MAX_SPLITS * Math.min(maxPrefill, Projection.FUSED_GEMM_TOKENS);
        bytes += Math.max(2 * Math.max(Math.max(qkvDim * dim, dim * attnDim), 2 * ffn * dim),
                partialsPerRow * Math.max(Math.max(qkvDim, dim), 2 * ffn));
        bytes += 8 * r * Math.max(1, c.rope().ropeDim() / 2);                   // angles
        return bytes;
    }

    /** ModelKernels.Vectors.allocate's bytes: floats, 8-bit codes and their scales. */
    private static long vectorBytes(long rows, long width) {
        return 4 * rows * width + rows * width + 8 * rows * (width / 32);
    }

    private <T extends AutoCloseable> T own(T resource) {
        return owned.add(resource);
    }

    private DeviceBuffer floats(long count) {
        return bytes(4L * count);
    }

    private DeviceBuffer bytes(long count) {
        return own(context.allocate(Math.max(16, count)));
    }

    int layerCount() {
        return to - from;
    }

    /**
     * The decode launches of this stage for n vectors (captured into its graph): embedding on the first stage,
     * its layers, the output product with the greedy keys on the last.
     */
    void decodeLaunches(KvPool.Part kv, int n) {
        stream.overlapLaunches(true);
        try {
            queueDecode(kv, n);
        } finally {
            stream.overlapLaunches(false);
        }
    }

    private void queueDecode(KvPool.Part kv, int n) {
        int dim = c.dim();
        int ffn = c.ffnDim();
        float eps = c.rmsEps();
        if (first) {
            k.embed(w.embedding, tokens, n, x, best, n, stream);
        } else if (last) {
            best.fillIntsAsync(0, stream);
        }
        k.ropeAngles(positions, 0, n, w.ropeFreqs, c.rope().ropeDim(), c.rope().linearScale(), angles, stream);
        for (int l = 0; l < layerCount(); l++) {
            DeviceWeights.Layer L = w.layers[l];
            k.rmsnorm(x, L.attnNorm(), xb, n, dim, eps, stream);
            L.qkv().matvec(k, xb, n, qkv, qkvDim, L.qkvBias(), ModelKernels.MV_STORE, stream);
            // dense decode takes its queries rotated into K's basis: RoPE rotates them as it writes them, instead of
            // every block of the decode after its wait (CudaAttention.decode)
            CudaAttention attention = kv.attention(l);
            boolean dense = !selected(kv, l);
            if (attention.writesRoped(n)) {
                attention.writeRoped(kv.cache(), l, rope(kv, n, positions, 0, l, L, 1), dense, stream);
            } else {
                k.ropeSplit(rope(kv, n, positions, 0, l, L, 1), dense ? attention.queryRotation() : 0, stream);
                attention.quantizeRows(kv.cache(), l, kRows, vRows, slots, prevPages, n, stream);
            }
            // the merge writes the 8-bit operand of the o product too when that product reads one
            DeviceBuffer outQ8 = L.wo().readsQ8() ? attn.q8() : null;
            DeviceBuffer outQ8Scales = L.wo().readsQ8() ? attn.q8Scales() : null;
            if (!dense) {
                attention.summarize(kv.cache(), l, kv.batch(), n, 1, stream);
                attention.select(kv.cache(), l, q, kv.batch(), n, 1, stream);
                attention.decodeSelected(kv.cache(), l, q, kv.batch(), n, 1, attn.floats(), outQ8, outQ8Scales,
                        stream);
            } else {
                attention.decode(kv.cache(), l, q, kv.batch(), n, attn.floats(), outQ8, outQ8Scales, true, stream);
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
        if (last) {
            k.rmsnorm(x, w.outputNorm, xb, n, dim, eps, stream);
            k.logits(w.output.only(), c.vocabSize(), xb, n, logits, best, stream);
            k.draw(logits, c.vocabSize(), n, draws, penalized, best, stream);
        }
    }

    /**
     * The prefill launches of this stage for n tokens of one sequence at start.. (queued, not captured); the last
     * stage leaves the last row's logits and greedy key, or with allLogits the normalized rows in xb for
     * {@link #allLogits}.
     */
    void prefillLaunches(KvPool.Part kv, int n, int start, boolean allLogits) {
        int dim = c.dim();
        float eps = c.rmsEps();
        int ffn = c.ffnDim();
        if (first) {
            k.embed(w.embedding, tokens, n, x, best, 1, stream);
        } else if (last) {
            best.fillIntsAsync(0, stream);
        }
        k.ropeAngles(null, start, n, w.ropeFreqs, c.rope().ropeDim(), c.rope().linearScale(), angles, stream);
        for (int l = 0; l < layerCount(); l++) {
            DeviceWeights.Layer L = w.layers[l];
            k.rmsnormHalf(x, L.attnNorm(), xh, n, dim, eps, stream);
            L.qkv().gemm(k, blas, xh, n, qkv, false, wScratch, stream);
            if (L.qkvBias() != null) {
                k.addBias(qkv, L.qkvBias(), qkvDim, n, stream);
            }
            // dense prefill takes its queries rotated into K's basis and leaves its output in V's: RoPE rotates the
            // queries as it writes them and the conversion to f16 turns the output back, passes made anyway, instead
            // of the attention's blocks (one an SM) while the tensor cores wait (CudaAttention.prefill)
            CudaAttention attention = kv.attention(l);
            boolean dense = !selected(kv, l);
            k.ropeSplit(rope(kv, n, null, start, l, L, 0), dense ? attention.queryRotation() : 0, stream);
            attention.quantizeRows(kv.cache(), l, kRows, vRows, slots, prevPages, n, stream);
            if (dense) {
                attention.prefill(kv.cache(), l, q, kv.batch(), 0, start, n, attn.floats(), true, stream);
            } else {
                attention.summarize(kv.cache(), l, kv.batch(), 0, start + n, n, stream);
                attention.prefillSelected(kv.cache(), l, q, kv.batch(), 0, start, n, attn.floats(), stream);
            }
            if (dense && attention.outputRotation() != 0) {
                k.toHalfUnrotated(attn.floats(), ah, (long) n * c.heads(), c.headDimV(), attention.outputRotation(),
                        stream);
            } else {
                k.toHalf(attn.floats(), ah, (long) n * attnDim, stream);
            }
            L.wo().gemm(k, blas, ah, n, x, true, wScratch, stream);
            k.rmsnormHalf(x, L.ffnNorm(), xh, n, dim, eps, stream);
            L.gateUp().gemm(k, blas, xh, n, gu, false, wScratch, stream);
            k.swiglu(gu, ffn, n, gh, null, stream);
            L.down().gemm(k, blas, gh, n, x, true, wScratch, stream);
        }
        if (last) {
            if (allLogits) {
                k.rmsnorm(x, w.outputNorm, xb, n, dim, eps, stream);
            } else {
                k.rmsnorm(x.slice(4L * (n - 1) * dim, 4L * dim), w.outputNorm, xb, 1, dim, eps, stream);
                k.logits(w.output.only(), c.vocabSize(), xb, 1, logits, best, stream);
            }
        }
    }

    /**
     * Writes random K and V rows (standard normal) for n tokens into every layer of this stage, at the slots already
     * in {@link #slots} (and {@link #prevPages}); the sequence is then {@code length} long (batch row 0). Keeps key summaries where decode
     * reads them. Queued on the stage's stream. {@code chunk} (the chunk's first token) varies the rows per chunk.
     */
    void fillRandom(KvPool.Part kv, int length, int n, long seed, int chunk) {
        for (int l = 0; l < layerCount(); l++) {
            kv.attention(l).fillNormal(kRows, (long) n * c.kvDimK(), fillSeed(seed, chunk, from + l, 0), 1f, stream);
            kv.attention(l).fillNormal(vRows, (long) n * c.kvDimV(), fillSeed(seed, chunk, from + l, 1), 1f, stream);
            kv.attention(l).quantizeRows(kv.cache(), l, kRows, vRows, slots, prevPages, n, stream);
            if (selected(kv, l)) {
                kv.attention(l).summarize(kv.cache(), l, kv.batch(), 0, length, n, stream);
            }
        }
    }

    /** A generator seed per (fill seed, chunk, layer, K or V): distinct rows for every one of them. */
    private static int fillSeed(long seed, int chunk, int layer, int kv) {
        long h = seed * 0x9E3779B97F4A7C15L + chunk;
        h = (h ^ (h >>> 31)) * 0xBF58476D1CE4E5B9L + layer;
        h = (h ^ (h >>> 29)) * 0x94D049BB133111EBL + kv;
        return (int) (h ^ (h >>> 32));
    }

    /** Whether local layer l attends through the pool's selection (past its dense first layers). */
    private boolean selected(KvPool.Part kv, int l) {
        return kv.attention(l).selection() != null && from + l >= kv.attention(l).selection().denseLayers();
    }

    /** Logits of rows [r, r+m) of the normalized rows a prefill left in xb (m <= MAX_VECTORS). */
    void allLogits(int r, int m) {
        k.logits(w.output.only(), c.vocabSize(), xb.from(r), m, logits, null, stream);
    }

    /**
     * Queues the copy of n rows of the hidden state to the next stage (a peer copy between devices) and records
     * {@link #sent}; the next stage's stream waits for it before its layers. The copy itself waits until the next
     * stage has finished the work queued on it so far: with decode steps of several batches in flight, that stage
     * may still be running another batch's layers over its hidden state.
     */
    void sendHidden(Stage next, int n) {
        next.ready.record(next.stream);
        stream.waitFor(next.ready);
        next.x.copyFromPeerAsync(x, 0, 0, 4L * n * c.dim(), stream);
        sent.record(stream);
        next.stream.waitFor(sent);
    }

    /** The RoPE launch of local layer l; the first layer writes the vectors' cache slots, which all layers share. */
    private RopeRows rope(KvPool.Part kv, int n, DeviceBuffer positions, int start, int l,
                                         DeviceWeights.Layer L, int seqStride) {
        Rope r = c.rope();
        return new RopeRows(qkv, n, positions, start, q, kRows, vRows, angles, r.ropeDim(),
                r.mode() == Rope.Mode.NEOX, c.heads(), c.kvHeads(), c.headDimK(), c.headDimV(),
                L.qNorm(), L.kNorm(), c.rmsEps(), kv.batch().tables(), kv.batch().tableStride(), seqStride,
                CudaBackend.PAGE_TOKENS, l == 0 ? slots : null, l == 0 ? prevPages : null);
    }

    /**
     * The host staging of this stage, once the copies queued from it (and from its KV batch's staging) have been
     * made: with decode steps in flight, an earlier step's copies may still be waiting in the stream. Pair with
     * {@link #staged}.
     */
    MemorySegment stagingSegment() {
        uploaded.synchronize();
        return staging.segment();
    }

    /** Marks the copies from the staging queued so far: the next {@link #stagingSegment} waits for them. */
    void staged() {
        uploaded.record(stream);
    }

    @Override
    public void close() {
        owned.close();
    }
}
