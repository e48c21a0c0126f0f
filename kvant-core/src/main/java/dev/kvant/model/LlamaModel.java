package dev.kvant.model;

import dev.kvant.attention.AttentionOptions;
import dev.kvant.attention.CpuAttention;
import dev.kvant.gguf.GgufException;
import dev.kvant.gguf.GgufFile;
import dev.kvant.kv.KvSequence;
import dev.kvant.select.PageTopK;
import dev.kvant.select.Selection;
import dev.kvant.select.SelectionConfig;
import dev.kvant.select.SelectionLog;
import dev.kvant.tensor.Parallel;
import dev.kvant.tensor.WeightMatrix;
import dev.kvant.tokenizer.Tokenizer;
import dev.kvant.tokenizer.TokenizerSpec;

import java.nio.file.Path;

/**
 * A llama-family decoder (llama, qwen2, qwen3) on the CPU. {@link #forward} walks the layers top to bottom for a
 * batch of consecutive tokens of one sequence; the speed lives in the kernels it calls.
 */
public final class LlamaModel implements AutoCloseable {
    /**
     * Smallest pieces of the elementwise work handed to the pool ({@link Ops#ranges}): rows for norms and RoPE,
     * values for SwiGLU (an exp each) and the residual adds. A decode step's single row stays on one thread.
     */
    private static final int ROWS_PER_TASK = 4;
    private static final int SWIGLU_PER_TASK = 8192;
    private static final int ADDS_PER_TASK = 16384;

    private final String name;
    private final ModelConfig config;
    private final LlamaWeights weights;
    private final Tokenizer tokenizer;
    private final AutoCloseable memory;
    private String chatTemplate;
    private volatile SelectionConfig selection;
    private volatile AttentionOptions attentionOptions = AttentionOptions.defaults();
    private volatile SelectionLog.Writer selectionLog;
    private volatile KvRowHook kvRowHook;

    /**
     * @param memory what holds the weights' bytes (the mapped file, an arena), closed with the model
     */
    public LlamaModel(String name, ModelConfig config, LlamaWeights weights, Tokenizer tokenizer,
                      AutoCloseable memory) {
        this.name = name;
        this.config = config;
        this.weights = weights;
        this.tokenizer = tokenizer;
        this.memory = memory;
    }

    public static LlamaModel load(Path path) {
        return fromGguf(GgufFile.open(path));
    }

    /** Builds the model over an opened file; the model owns the file from here on. */
    public static LlamaModel fromGguf(GgufFile file) {
        try {
            WeightMatrix embedding = LlamaWeights.embedding(file);
            float[] ropeFactors = LlamaWeights.ropeFreqFactors(file);
            ModelConfig config = ModelConfig.fromGguf(file.name(), file.metadata(), embedding.rows(), ropeFactors);
            LlamaWeights weights = LlamaWeights.load(file, config, embedding, ropeFactors);
            Tokenizer tokenizer = null;
            if (file.metadata().contains("tokenizer.ggml.model")) {
                try {
                    tokenizer = Tokenizer.create(TokenizerSpec.fromGguf(file.metadata()));
                } catch (IllegalArgumentException e) {   // name the file, as every other refusal of it does
                    throw new GgufException("GGUF " + file.name() + ": the tokenizer: " + e.getMessage(), e);
                }
            }
            if (tokenizer != null && tokenizer.vocabSize() != config.vocabSize()) {
                // every id the model can sample must be a token, and every token an embedding row
                throw new GgufException("GGUF " + file.name() + ": the tokenizer has " + tokenizer.vocabSize()
                        + " tokens but token_embd.weight has " + config.vocabSize() + " rows");
            }
            LlamaModel model = new LlamaModel(file.name(), config, weights, tokenizer, file);
            model.chatTemplate = file.metadata().getString("tokenizer.chat_template", null);
            return model;
        } catch (RuntimeException | Error e) {
            file.close();
            throw e;
        }
    }

    public ModelConfig config() {
        return config;
    }

    public LlamaWeights weights() {
        return weights;
    }

    /** The model's tokenizer; throws when the file carries none (synthetic benchmark models). */
    public Tokenizer tokenizer() {
        if (tokenizer == null) {
            throw new IllegalStateException("model " + name + " has no tokenizer");
        }
        return tokenizer;
    }

    public boolean hasTokenizer() {
        return tokenizer != null;
    }

    public String name() {
        return name;
    }

    /** The chat template text of the file ({@code tokenizer.chat_template}), or null. */
    public String chatTemplate() {
        return chatTemplate;
    }

    /**
     * Turns query-aware page selection on (a config) or off (null) for every later forward call of this model, on
     * every sequence: layers from {@code config.denseLayers()} on attend through a {@link PageTopK} selection made
     * per query block from the sequence's key summaries (which the first selected call turns on). A config whose
     * dense layers are all the model's is refused: it would select nothing while reports say topk.
     */
    public void setSelection(SelectionConfig config) {
        if (config != null && config.denseLayers() >= this.config.layers()) {
            throw new IllegalArgumentException("--select-dense-layers " + config.denseLayers() + " makes all "
                    + this.config.layers() + " layers of the model dense, so nothing would be selected: give at most "
                    + (this.config.layers() - 1));
        }
        this.selection = config;
    }

    /**
     * Options of every later attention (sparse V: leave out of the V sum the rows whose softmax weight falls below
     * a threshold; docs/BENCHMARKS.md measures what it buys and costs); exact attention by default.
     */
    public void setAttentionOptions(AttentionOptions options) {
        this.attentionOptions = java.util.Objects.requireNonNull(options, "options");
    }

    public AttentionOptions attentionOptions() {
        return attentionOptions;
    }

    /** The selection config in force, or null (dense attention). */
    public SelectionConfig selection() {
        return selection;
    }

    /** Calls hook with the K and V rows of every later cache write (null: none); for studies only. */
    public void setKvRowHook(KvRowHook hook) {
        this.kvRowHook = hook;
    }

    /** Records every selection made from now on (null: stop recording); the caller closes the writer. */
    public void setSelectionLog(SelectionLog.Writer log) {
        this.selectionLog = log;
    }

    /**
     * Runs tokens[off .. off+n) at positions seq.length() .. seq.length()+n-1, appending their keys and values to the
     * sequence's cache. Writes the logits of every token (allLogits: n x vocab) or of the last one (vocab floats).
     */
    public void forward(KvSequence seq, int[] tokens, int off, int n, boolean allLogits, float[] logits,
                        Scratch s, Parallel pool) {
        int start = seq.length();
        checkTokens(tokens, off, n);   // before any page is taken: a refused call changes nothing
        seq.reserve(start + n);
        runOrRollBack(new KvSequence[] {seq}, new int[] {start}, tokens, off, n, allLogits, logits, s, pool);
    }

    /**
     * One decode step for several sequences: tokens[i] is appended to seqs[i]; logits[i*vocab ..) receive the
     * logits after it. Every weight is read once for the whole batch; each row equals {@link #forward} of that
     * sequence alone, bit for bit (matmul rows are matvecs, attention runs per sequence).
     */
    public void decodeBatch(KvSequence[] seqs, int[] tokens, float[] logits, Scratch s, Parallel pool) {
        int n = seqs.length;
        if (tokens.length < n) {
            throw new IllegalArgumentException(n + " sequences but " + tokens.length + " tokens");
        }
        int[] starts = new int[n];
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < i; j++) {
                if (seqs[j] == seqs[i]) {
                    throw new IllegalArgumentException("sequence " + i + " appears twice in one batch");
                }
            }
            starts[i] = seqs[i].length();
        }
        checkTokens(tokens, 0, n);
        reserveStep(seqs, starts);
        runOrRollBack(seqs, starts, tokens, 0, n, true, logits, s, pool);
    }

    /**
     * A page for each sequence's next token, all or none: in one cache at once ({@link KvSequence#reserveAll}); in
     * several, one after another, the ones before given back when one is refused.
     */
    private static void reserveStep(KvSequence[] seqs, int[] starts) {
        int n = seqs.length;
        int[] need = new int[n];
        boolean oneCache = true;
        for (int i = 0; i < n; i++) {
            need[i] = starts[i] + 1;
            oneCache &= seqs[i].cache() == seqs[0].cache();
        }
        if (oneCache) {
            KvSequence.reserveAll(seqs, need);
            return;
        }
        for (int i = 0; i < n; i++) {
            try {
                seqs[i].reserve(need[i]);
            } catch (RuntimeException | Error e) {
                for (int j = 0; j < i; j++) {
                    seqs[j].truncate(starts[j]);   // gives back what reserve took past the written tokens
                }
                throw e;
            }
        }
    }

    private void checkTokens(int[] tokens, int off, int n) {
        java.util.Objects.checkFromIndexSize(off, n, tokens.length);
        for (int t = 0; t < n; t++) {
            int id = tokens[off + t];
            if (id < 0 || id >= config.vocabSize()) {
                throw new IllegalArgumentException("token id " + id + " is outside the vocabulary (0.."
                        + (config.vocabSize() - 1) + ")");
            }
        }
    }

    /**
     * {@link #run}; when it fails part way (a later layer, a selection, an interrupted pool), every sequence is cut
     * back to its length before the step, so none keeps a position written in some layers only.
     */
    private void runOrRollBack(KvSequence[] seqs, int[] starts, int[] tokens, int off, int n, boolean allLogits,
                               float[] logits, Scratch s, Parallel pool) {
        try {
            run(seqs, starts, tokens, off, n, allLogits, logits, s, pool);
        } catch (RuntimeException | Error e) {
            for (int i = 0; i < seqs.length; i++) {
                if (!seqs[i].isClosed()) {
                    try {
                        seqs[i].truncate(starts[i]);   // also gives back pages reserved and not written
                    } catch (RuntimeException | Error t) {   // the step's own failure is the one to report
                        e.addSuppressed(t);
                    }
                }
            }
            throw e;
        }
    }

    /**
     * The layers over n rows. With one sequence the rows are tokens at starts[0] .. starts[0]+n-1 of it; with n
     * sequences row i is one token of seqs[i] at starts[i].
     */
    private void run(KvSequence[] seqs, int[] starts, int[] tokens, int off, int n, boolean allLogits,
                     float[] logits, Scratch s, Parallel pool) {
        ModelConfig c = config;
        boolean batch = seqs.length > 1;
        s.ensure(c, n);
        int dim = c.dim();
        for (int t = 0; t < n; t++) {   // the ids were checked before the step took its pages (checkTokens)
            weights.tokenEmbedding().dequantizeRow(tokens[off + t], s.x, t * dim);
        }
        for (int t = 0; t < n; t++) {
            c.rope().angles(batch ? starts[t] : starts[0] + t, s.ropeTable[t]);
        }
        float scale = (float) (1.0 / Math.sqrt(c.headDimK()));
        int attnDim = c.heads() * c.headDimV();
        SelectionConfig sc = selection;
        SelectionLog.Writer log = selectionLog;
        KvRowHook hook = kvRowHook;
        AttentionOptions ao = attentionOptions;
        if (sc != null) {
            for (KvSequence seq : seqs) {
                seq.enableKeySummaries(sc.blockTokens(), sc.coarseTokens());
            }
        }
        for (int l = 0; l < c.layers(); l++) {
            LlamaWeights.Layer w = weights.layers()[l];
            Ops.ranges(pool, n, ROWS_PER_TASK, (r0, r1) -> {
                for (int r = r0; r < r1; r++) {
                    Ops.rmsNorm(s.x, r * dim, w.attnNorm(), s.xb, r * dim, dim, c.rmsEps());
                }
            });
            WeightMatrix.matmulAll(new WeightMatrix[] {w.wq(), w.wk(), w.wv()}, s.xb, n,
                    new float[][] {s.q, s.k, s.v}, pool);
            if (w.bq() != null) {
                Ops.addBias(s.q, w.bq(), n);
                Ops.addBias(s.k, w.bk(), n);
                Ops.addBias(s.v, w.bv(), n);
            }
            if (w.qNorm() != null) {
                Ops.rmsNorm(s.q, w.qNorm(), s.q, n * c.heads(), c.headDimK(), c.rmsEps());
                Ops.rmsNorm(s.k, w.kNorm(), s.k, n * c.kvHeads(), c.headDimK(), c.rmsEps());
            }
            Ops.ranges(pool, n, ROWS_PER_TASK, (t0, t1) -> {
                for (int t = t0; t < t1; t++) {
                    c.rope().apply(s.q, t * c.qDim(), c.heads(), c.headDimK(), s.ropeTable[t]);
                    c.rope().apply(s.k, t * c.kvDimK(), c.kvHeads(), c.headDimK(), s.ropeTable[t]);
                }
            });
            boolean selected = sc != null && l >= sc.denseLayers();
            if (!batch) {
                if (hook != null) {
                    hook.beforeWrite(seqs[0], l, starts[0], n, s.q, 0, s.k, 0, s.v, 0);
                }
                seqs[0].writeRows(l, starts[0], n, s.k, 0, s.v, 0);
                Selection sel = selected ? s.select(sc, log, seqs[0], l, s.q, n, starts[0], c.heads(), pool) : null;
                CpuAttention.attend(seqs[0], l, s.q, n, starts[0], c.heads(), scale, ao, sel,
                        s.attnOut, pool);
            } else {
                for (int i = 0; i < n; i++) {
                    if (hook != null) {
                        hook.beforeWrite(seqs[i], l, starts[i], 1, s.q, i * c.qDim(), s.k, i * c.kvDimK(), s.v,
                                i * c.kvDimV());
                    }
                    seqs[i].writeRows(l, starts[i], 1, s.k, i * c.kvDimK(), s.v, i * c.kvDimV());
                    System.arraycopy(s.q, i * c.qDim(), s.qRow, 0, c.qDim());
                    Selection sel = selected ? s.select(sc, log, seqs[i], l, s.qRow, 1, starts[i], c.heads(), pool)
                            : null;
                    CpuAttention.attend(seqs[i], l, s.qRow, 1, starts[i], c.heads(), scale, ao, sel, s.outRow,
                            pool);
                    System.arraycopy(s.outRow, 0, s.attnOut, i * attnDim, attnDim);
                }
            }
            w.wo().matmul(s.attnOut, n, s.xb, pool);
            Ops.ranges(pool, n, ROWS_PER_TASK, (r0, r1) -> {
                Ops.add(s.x, s.xb, r0 * dim, r1 * dim);
                for (int r = r0; r < r1; r++) {
                    Ops.rmsNorm(s.x, r * dim, w.ffnNorm(), s.xb, r * dim, dim, c.rmsEps());
                }
            });
            WeightMatrix.matmulAll(new WeightMatrix[] {w.wGate(), w.wUp()}, s.xb, n,
                    new float[][] {s.gate, s.up}, pool);
            Ops.ranges(pool, n * c.ffnDim(), SWIGLU_PER_TASK, (i0, i1) -> Ops.swiglu(s.gate, s.up, i0, i1));
            w.wDown().matmul(s.gate, n, s.xb, pool);
            Ops.ranges(pool, n * dim, ADDS_PER_TASK, (i0, i1) -> Ops.add(s.x, s.xb, i0, i1));
        }
        if (allLogits) {
            Ops.rmsNorm(s.x, weights.outputNorm(), s.xb, n, dim, c.rmsEps());
            weights.output().matmul(s.xb, n, logits, pool);
        } else {
            Ops.rmsNorm(s.x, (n - 1) * dim, weights.outputNorm(), s.xb, 0, dim, c.rmsEps());
            weights.output().matvec(s.xb, logits, pool);
        }
    }

    @Override
    public void close() {
        try {
            memory.close();
        } catch (Exception e) {
            throw new IllegalStateException("closing model " + name, e);
        }
    }

    /** Activations of one forward call, grown to the largest batch seen and reused. */
    public static final class Scratch {
        float[] x = new float[0];
        float[] xb;
        float[] q;
        float[] k;
        float[] v;
        float[] attnOut;
        float[] qRow;
        float[] outRow;
        float[] gate;
        float[] up;
        float[][] ropeTable;
        private int capacity;
        private final Selection selection = new Selection();
        private PageTopK topK;

        /** The selection of a layer's queries, made with this scratch's selector (and recorded when asked). */
        Selection select(SelectionConfig config, SelectionLog.Writer log, KvSequence seq, int layer, float[] q, int n,
                         int start, int heads, Parallel pool) {
            if (topK == null || !topK.config().equals(config)) {
                topK = new PageTopK(config);
            }
            topK.select(seq, layer, q, n, start, heads, selection, pool);
            if (log != null) {
                log.record(layer, selection);
            }
            return selection;
        }

        void ensure(ModelConfig c, int n) {
            if (n <= capacity) {
                return;
            }
            x = new float[n * c.dim()];
            xb = new float[n * c.dim()];
            q = new float[n * c.qDim()];
            k = new float[n * c.kvDimK()];
            v = new float[n * c.kvDimV()];
            attnOut = new float[n * c.heads() * c.headDimV()];
            qRow = new float[c.qDim()];
            outRow = new float[c.heads() * c.headDimV()];
            gate = new float[n * c.ffnDim()];
            up = new float[n * c.ffnDim()];
            ropeTable = new float[n][c.rope().ropeDim()];
            capacity = n;
        }
    }
}
