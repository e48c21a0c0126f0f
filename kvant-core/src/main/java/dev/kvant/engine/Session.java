package dev.kvant.engine;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.tensor.Parallel;

/**
 * One sequence being processed by a model: its KV cache, scratch activations and position. Prompts are fed in
 * chunks of at most {@code prefillChunk} tokens, each chunk attending to everything before it.
 */
public final class Session implements AutoCloseable {

    /** Tokens per KV page. */
    public static final int PAGE_TOKENS = 64;

    private final LlamaModel model;
    private final KvCache cache;
    private final KvSequence seq;
    private final LlamaModel.Scratch scratch = new LlamaModel.Scratch();
    private final Parallel pool;
    private final int contextLength;
    private final int prefillChunk;
    private final float[] logits;

    public Session(LlamaModel model, int contextLength, KvFormat kFormat, KvFormat vFormat, int prefillChunk,
                   Parallel pool) {
        if (contextLength <= 0) {
            throw new IllegalArgumentException("context length must be positive, got " + contextLength);
        }
        if (prefillChunk <= 0) {
            throw new IllegalArgumentException("prefill chunk must be positive, got " + prefillChunk);
        }
        ModelConfig c = model.config();
        this.model = model;
        this.cache = KvCache.forTokens(geometry(c), kFormat, vFormat, PAGE_TOKENS, contextLength);
        this.seq = cache.newSequence();
        this.pool = pool;
        this.contextLength = contextLength;
        this.prefillChunk = prefillChunk;
        this.logits = new float[c.vocabSize()];
    }

    public int position() {
        return seq.length();
    }

    public int contextLength() {
        return contextLength;
    }

    public KvCache cache() {
        return cache;
    }

    public KvSequence sequence() {
        return seq;
    }

    /** Bytes of KV cache one token takes for a model and a pair of formats. */
    public static long kvBytesPerToken(ModelConfig c, KvFormat kFormat, KvFormat vFormat) {
        return KvCache.bytesPerToken(geometry(c), kFormat, vFormat);
    }

    /** The context (in whole pages) that a KV memory budget holds for a model and a pair of formats. */
    public static int contextForBudget(ModelConfig c, KvFormat kFormat, KvFormat vFormat, long bytes) {
        long perPage = kvBytesPerToken(c, kFormat, vFormat) * PAGE_TOKENS;
        long pages = bytes / perPage;
        if (pages < 1) {
            throw new IllegalArgumentException("a KV budget of " + bytes + " bytes holds less than one page of "
                    + PAGE_TOKENS + " tokens (" + perPage + " bytes with K " + kFormat.name() + ", V "
                    + vFormat.name() + ")");
        }
        return (int) Math.min(pages * PAGE_TOKENS, Integer.MAX_VALUE - PAGE_TOKENS);
    }

    private static KvGeometry geometry(ModelConfig c) {
        return new KvGeometry(c.layers(), c.kvHeads(), c.headDimK(), c.headDimV());
    }

    public LlamaModel model() {
        return model;
    }

    /** Feeds tokens and returns the logits after the last one (a view, valid until the next call). */
    public float[] prefill(int[] tokens) {
        checkRoom(tokens.length);
        for (int off = 0; off < tokens.length; off += prefillChunk) {
            int n = Math.min(prefillChunk, tokens.length - off);
            model.forward(seq, tokens, off, n, false, logits, scratch, pool);
        }
        return logits;
    }

    /**
     * Feeds tokens[off .. off+n) in chunks and writes the logits of every one of them into out (n x vocab).
     */
    public void prefillAllLogits(int[] tokens, int off, int n, float[] out) {
        checkRoom(n);
        int vocab = model.config().vocabSize();
        float[] chunkLogits = new float[Math.min(prefillChunk, n) * vocab];
        for (int done = 0; done < n; done += prefillChunk) {
            int m = Math.min(prefillChunk, n - done);
            model.forward(seq, tokens, off + done, m, true, chunkLogits, scratch, pool);
            System.arraycopy(chunkLogits, 0, out, done * vocab, m * vocab);
        }
    }

    /** Feeds one token and returns the logits after it (a view, valid until the next call). */
    public float[] decode(int token) {
        checkRoom(1);
        model.forward(seq, new int[] {token}, 0, 1, false, logits, scratch, pool);
        return logits;
    }

    /** Forgets everything after the first {@code length} tokens. */
    public void truncate(int length) {
        seq.truncate(length);
    }

    private void checkRoom(int n) {
        if (seq.length() + n > contextLength) {
            throw new ContextFullException("the sequence would need " + (seq.length() + n)
                    + " tokens but the context holds " + contextLength + " (raise -c)");
        }
    }

    @Override
    public void close() {
        seq.close();
        cache.close();
    }
}
