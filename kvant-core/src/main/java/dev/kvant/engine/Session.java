package dev.kvant.engine;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.CpuBackend;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.kv.KvSequence;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.sample.Sampler;
import dev.kvant.select.SelectionConfig;
import dev.kvant.tensor.Parallel;

/**
 * One sequence being processed by a model on a backend: its KV cache and position. Prompts are fed in chunks of at
 * most {@code prefillChunk} tokens, each chunk attending to everything before it.
 */
public final class Session implements AutoCloseable {

    /** Tokens per KV page. */
    public static final int PAGE_TOKENS = CpuBackend.PAGE_TOKENS;

    private final Backend backend;
    private final BackendSequence seq;
    private final int contextLength;
    private final int prefillChunk;
    private final float[] logits;

    public Session(Backend backend, int contextLength, KvFormat kFormat, KvFormat vFormat, int prefillChunk) {
        this(backend, contextLength, KvLayerFormats.of(kFormat, vFormat), prefillChunk);
    }

    /** A session whose cache keeps each layer's keys and values in that layer's formats. */
    public Session(Backend backend, int contextLength, KvLayerFormats formats, int prefillChunk) {
        this(backend, newSequence(backend, contextLength, formats, prefillChunk), contextLength, prefillChunk);
    }

    /**
     * A session over a sequence of this backend made elsewhere (one of a {@link dev.kvant.backend.SequencePool});
     * closing the session closes the sequence.
     */
    public Session(Backend backend, BackendSequence seq, int contextLength, int prefillChunk) {
        check(contextLength, prefillChunk);
        this.backend = backend;
        this.seq = seq;
        this.contextLength = contextLength;
        this.prefillChunk = prefillChunk;
        this.logits = new float[backend.model().config().vocabSize()];
    }

    private static BackendSequence newSequence(Backend backend, int contextLength, KvLayerFormats formats,
                                               int prefillChunk) {
        check(contextLength, prefillChunk);
        return backend.newSequence(contextLength, formats);
    }

    private static void check(int contextLength, int prefillChunk) {
        if (contextLength <= 0) {
            throw new IllegalArgumentException("context length must be positive, got " + contextLength);
        }
        if (prefillChunk <= 0) {
            throw new IllegalArgumentException("prefill chunk must be positive, got " + prefillChunk);
        }
    }

    /** A session on the CPU backend over the given pool. */
    public Session(LlamaModel model, int contextLength, KvFormat kFormat, KvFormat vFormat, int prefillChunk,
                   Parallel pool) {
        this(new CpuBackend(model, pool), contextLength, kFormat, vFormat, prefillChunk);
    }

    public int position() {
        return seq.length();
    }

    public int contextLength() {
        return contextLength;
    }

    public Backend backend() {
        return backend;
    }

    public BackendSequence backendSequence() {
        return seq;
    }

    /** The host KV cache of a CPU session, for tools that inspect it. */
    public KvSequence sequence() {
        if (seq instanceof CpuBackend.Sequence cpu) {
            return cpu.kv();
        }
        throw new IllegalStateException("the " + backend.name() + " backend keeps its cache off the host");
    }

    /** Bytes of KV cache one token takes for a model and a pair of formats. */
    public static long kvBytesPerToken(ModelConfig c, KvFormat kFormat, KvFormat vFormat) {
        return kvBytesPerToken(c, KvLayerFormats.of(kFormat, vFormat));
    }

    /** Bytes of KV cache one token takes for a model, each layer in its formats. */
    public static long kvBytesPerToken(ModelConfig c, KvLayerFormats formats) {
        return KvCache.bytesPerToken(CpuBackend.geometry(c), formats);
    }

    /**
     * Bytes of key summaries a selection keeps per token over every layer (0 without one): a min and a max vector
     * per block and kv head, and with a coarse level one more pair per coarse block (at most one per 64-token page:
     * the GPU keeps one per page).
     */
    public static long summaryBytesPerToken(ModelConfig c, KvFormat kFormat, SelectionConfig s) {
        return summaryBytesPerToken(c, kFormat.domainDim(c.headDimK()), s);
    }

    /** As above, for keys of keyDim values a head in every layer ({@link KvLayerFormats#keyDomainDim}). */
    public static long summaryBytesPerToken(ModelConfig c, int keyDim, SelectionConfig s) {
        if (s == null) {
            return 0;
        }
        double vector = (double) c.kvHeads() * 2 * keyDim * 4;
        double perToken = vector / s.blockTokens()
                + (s.coarseTokens() == 0 ? 0 : vector / Math.min(PAGE_TOKENS, s.coarseTokens()));
        return (long) Math.ceil(perToken * c.layers());
    }

    /** The context (in whole pages) that a KV memory budget holds for a model and a pair of formats. */
    public static int contextForBudget(ModelConfig c, KvFormat kFormat, KvFormat vFormat, long bytes) {
        return contextForBudget(c, KvLayerFormats.of(kFormat, vFormat), null, bytes);
    }

    /**
     * As above, each layer in its formats, the budget also holding the key summaries of a selection (null: none;
     * summaries are kept at the size of the layers' common key domain).
     */
    public static int contextForBudget(ModelConfig c, KvLayerFormats formats, SelectionConfig selection,
                                       long bytes) {
        long summaries = selection == null ? 0 : summaryBytesPerToken(c, formats.keyDomainDim(c.headDimK(),
                c.layers()), selection);
        long perPage = (kvBytesPerToken(c, formats) + summaries) * PAGE_TOKENS;
        long pages = bytes / perPage;
        if (pages < 1) {
            throw new IllegalArgumentException("a KV budget of " + bytes + " bytes holds less than one page of "
                    + PAGE_TOKENS + " tokens (" + perPage + " bytes with " + formats.name() + ")");
        }
        return (int) Math.min(pages * PAGE_TOKENS, Integer.MAX_VALUE - PAGE_TOKENS);
    }

    public LlamaModel model() {
        return backend.model();
    }

    /** Feeds tokens and returns the logits after the last one (a view, valid until the next call). */
    public float[] prefill(int[] tokens) {
        checkRoom(tokens.length);
        for (int off = 0; off < tokens.length; off += prefillChunk) {
            int n = Math.min(prefillChunk, tokens.length - off);
            seq.forward(tokens, off, n, false, logits);
        }
        return logits;
    }

    /** Feeds tokens and returns the id of the largest logit after the last one (computed where the model runs). */
    public int prefillGreedy(int[] tokens) {
        checkRoom(tokens.length);
        int last = (tokens.length - 1) / prefillChunk * prefillChunk;
        for (int off = 0; off < last; off += prefillChunk) {
            seq.forward(tokens, off, prefillChunk, false, logits);
        }
        return seq.forwardGreedy(tokens, last, tokens.length - last);
    }

    /**
     * Feeds tokens[off .. off+n) in chunks and writes the logits of every one of them into out (n x vocab).
     */
    public void prefillAllLogits(int[] tokens, int off, int n, float[] out) {
        int vocab = backend.model().config().vocabSize();
        if ((long) n * vocab > out.length) {
            throw new IllegalArgumentException(n + " positions of " + vocab + " logits do not fit in " + out.length
                    + " floats");
        }
        prefillLogits(tokens, off, n, (first, count, logits) ->
                System.arraycopy(logits, 0, out, first * vocab, count * vocab));
    }

    /** The logits of a run of positions: rows [0, count) of {@code logits} are positions first.. of the prefill. */
    @FunctionalInterface
    public interface LogitRows {
        void accept(int first, int count, float[] logits);
    }

    /**
     * As {@link #prefillAllLogits}, handing each prefill chunk's rows of logits to {@code rows} as they come (the
     * array is reused for the next chunk): a whole context's logits need never be held at once (a 32K context of a
     * 128K vocabulary would be 16 GB).
     */
    public void prefillLogits(int[] tokens, int off, int n, LogitRows rows) {
        checkRoom(n);
        int vocab = backend.model().config().vocabSize();
        // rows a call: the prefill chunk, or fewer where its logits would not fit one array (16K rows of a 152K
        // vocabulary are 2.5G floats)
        int step = Math.max(1, Math.min(prefillChunk, Integer.MAX_VALUE / vocab));
        float[] chunkLogits = new float[Math.min(step, n) * vocab];
        for (int done = 0; done < n; done += step) {
            int m = Math.min(step, n - done);
            seq.forward(tokens, off + done, m, true, chunkLogits);
            rows.accept(done, m, chunkLogits);
        }
    }

    /** Feeds one token and returns the logits after it (a view, valid until the next call). */
    public float[] decode(int token) {
        checkRoom(1);
        seq.forward(new int[] {token}, 0, 1, false, logits);
        return logits;
    }

    /**
     * Feeds tokens and returns the next token as sampler chooses it: the largest logit where the model runs when the
     * sampler is greedy, else the sampler's draw from the last logits.
     */
    public int prefillSampled(int[] tokens, Sampler sampler) {
        return sampler.argmaxSuffices() ? prefillGreedy(tokens)
                : sampler.sample(prefill(tokens), backend.model().config().vocabSize());
    }

    /**
     * Feeds one token and returns the next as sampler chooses it, copying one id back where the backend can choose
     * it: the largest logit for a greedy sampler, a draw where the model runs for one it allows ({@link
     * Sampler#drawsWhereTheModelRuns}: a temperature with top-k, top-p and min-p, penalties over a short window);
     * else the sampler's draw on the host from the logits.
     */
    public int decodeSampled(int token, Sampler sampler) {
        int vocab = backend.model().config().vocabSize();
        if (sampler.argmaxSuffices()) {
            return decodeGreedy(token);
        }
        if (backend.drawsWhereItRuns() && sampler.drawsWhereTheModelRuns(vocab)) {
            checkRoom(1);
            return backend.startDecodeDrawn(new BackendSequence[] {seq}, new int[] {token}, sampler.nextDraw(vocab),
                    null).await()[0];
        }
        return sampler.sample(decode(token), vocab);
    }

    /** Feeds one token and returns the id of the largest logit after it (computed where the model runs). */
    public int decodeGreedy(int token) {
        checkRoom(1);
        return seq.forwardGreedy(new int[] {token}, 0, 1);
    }

    /**
     * Appends {@code tokens} positions of random K/V rows (no model computation; {@link BackendSequence#fillRandom}).
     */
    public void fillRandom(int tokens, long seed) {
        seq.fillRandom(tokens, seed);
    }

/** Forgets everything after the first {@code length} tokens. */
    public void truncate(int length) {
        seq.truncate(length);
    }

    private void checkRoom(int n) {
        if (seq.length() + n > contextLength) {
            throw new ContextFullException("the sequence would need " + (seq.length() + n)
                    + " tokens but the context holds " + contextLength
                    + " (raise -c, or --kv-mem where it set the context)");
        }
    }

    @Override
    public void close() {
        seq.close();
    }
}
