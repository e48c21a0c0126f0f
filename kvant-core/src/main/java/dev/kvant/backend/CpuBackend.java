package dev.kvant.backend;

import dev.kvant.engine.ContextFullException;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.sample.Sampler;
import dev.kvant.tensor.Parallel;

import java.util.Objects;

/**
 * The host backend: the model's own Vector API kernels on a fixed thread pool. A sequence from {@link #newSequence}
 * owns a paged {@link KvCache} sized for its context; sequences of a {@link #newSequencePool} share one cache, so
 * that prefixes share pages. The pool and the model stay the caller's to close.
 */
public final class CpuBackend implements Backend {

    /** Tokens per KV page. */
    public static final int PAGE_TOKENS = 64;

    private final LlamaModel model;
    private final Parallel pool;
    private final LlamaModel.Scratch batchScratch = new LlamaModel.Scratch();

    public CpuBackend(LlamaModel model, Parallel pool) {
        this.model = Objects.requireNonNull(model, "model");
        this.pool = Objects.requireNonNull(pool, "pool");
        model.weights().packForCpu(pool);
    }

    public static KvGeometry geometry(ModelConfig c) {
        return new KvGeometry(c.layers(), c.kvHeads(), c.headDimK(), c.headDimV());
    }

    @Override
    public String name() {
        return "cpu";
    }

    @Override
    public LlamaModel model() {
        return model;
    }

    @Override
    public int threads() {
        return pool.threads();
    }

    public Parallel pool() {
        return pool;
    }

    @Override
    public Sequence newSequence(int contextLength, KvLayerFormats formats) {
        if (contextLength <= 0) {
            throw new IllegalArgumentException("context length must be positive, got " + contextLength);
        }
        checkSelection(formats);
        KvCache cache = KvCache.forTokens(geometry(model.config()), formats, PAGE_TOKENS, contextLength);
        return new Sequence(cache, cache.newSequence(), contextLength, true);
    }

    /** With a selection, the key summaries need one key size in every layer: refused now rather than mid-request. */
    private void checkSelection(KvLayerFormats formats) {
        if (model.selection() != null) {
            formats.keyDomainDim(model.config().headDimK(), model.config().layers());
        }
    }

    @Override
    public Sequence newSequence(int contextLength, KvFormat kFormat, KvFormat vFormat) {
        return newSequence(contextLength, KvLayerFormats.of(kFormat, vFormat));
    }

    @Override
    public SharedPool newSequencePool(int tokens, KvLayerFormats formats) {
        if (tokens <= 0) {
            throw new IllegalArgumentException("a KV pool needs room for at least one token, got " + tokens);
        }
        checkSelection(formats);
        return new SharedPool(KvCache.forTokens(geometry(model.config()), formats, PAGE_TOKENS, tokens));
    }

    @Override
    public void decodeBatch(BackendSequence[] seqs, int[] tokens, float[] logits) {
        KvSequence[] kv = new KvSequence[seqs.length];
        for (int i = 0; i < seqs.length; i++) {
            if (!(seqs[i] instanceof Sequence s) || s.owner() != this) {
                throw new IllegalArgumentException("sequence " + i + " does not belong to this backend");
            }
            s.checkRoom(1);
            kv[i] = s.kv;
        }
        model.decodeBatch(kv, tokens, logits, batchScratch, pool);
    }

    @Override
    public void close() {
    }

    /** Sequences drawing pages from one host {@link KvCache}. */
    public final class SharedPool implements SequencePool {
        private final KvCache cache;

        SharedPool(KvCache cache) {
            this.cache = cache;
        }

        /** The cache itself, for tools that inspect it. */
        public KvCache cache() {
            return cache;
        }

        @Override
        public int pageTokens() {
            return cache.pageTokens();
        }

        @Override
        public boolean forksKeepBits() {
            return !cache.anyKeyMeans();
        }

        @Override
        public int totalPages() {
            return cache.totalPages();
        }

        @Override
        public int freePages() {
            return cache.freePages();
        }

        @Override
        public int holders(int page) {
            return cache.refCount(page);
        }

        @Override
        public Sequence newSequence(int capacity) {
            checkCapacity(capacity);
            return new Sequence(cache, cache.newSequence(), capacity, false);
        }

        @Override
        public Sequence fork(BackendSequence parent, int prefixTokens, int capacity) {
            checkCapacity(capacity);
            if (!(parent instanceof Sequence p) || p.cache != cache) {
                throw new IllegalArgumentException("the sequence to fork does not belong to this pool");
            }
            if (prefixTokens > capacity) {
                throw new IllegalArgumentException("a prefix of " + prefixTokens + " tokens does not fit a sequence of "
                        + capacity);
            }
            return new Sequence(cache, cache.fork(p.kv, prefixTokens), capacity, false);
        }

        private void checkCapacity(int capacity) {
            if (capacity <= 0) {
                throw new IllegalArgumentException("a sequence needs room for at least one token, got " + capacity);
            }
        }

        @Override
        public void close() {
            cache.close();
        }
    }

    /** A sequence whose cache lives in host memory. */
    public final class Sequence implements BackendSequence {
        private final KvCache cache;
        private final KvSequence kv;
        private final int capacity;
        private final boolean ownsCache;
        private final LlamaModel.Scratch scratch = new LlamaModel.Scratch();
        private float[] lastLogits;

        Sequence(KvCache cache, KvSequence kv, int capacity, boolean ownsCache) {
            this.cache = cache;
            this.kv = kv;
            this.capacity = capacity;
            this.ownsCache = ownsCache;
        }

        CpuBackend owner() {
            return CpuBackend.this;
        }

        /** The cache itself, for tools that inspect what was written. */
        public KvSequence kv() {
            return kv;
        }

        @Override
        public int[] pageIds() {
            return kv.pageIds();
        }

        @Override
        public int length() {
            return kv.length();
        }

        @Override
        public int capacity() {
            return capacity;
        }

        @Override
        public void forward(int[] tokens, int off, int n, boolean allLogits, float[] logits) {
            checkRoom(n);
            model.forward(kv, tokens, off, n, allLogits, logits, scratch, pool);
        }

        @Override
        public int forwardGreedy(int[] tokens, int off, int n) {
            int vocab = model.config().vocabSize();
            if (lastLogits == null) {
                lastLogits = new float[vocab];
            }
            forward(tokens, off, n, false, lastLogits);
            return Sampler.argmax(lastLogits, vocab);
        }

        @Override
        public void fillRandom(int tokens, long seed) {
            if (tokens < 0) {
                throw new IllegalArgumentException("fill of " + tokens + " tokens");
            }
            checkRoom(tokens);
            var g = cache.geometry();
            java.util.SplittableRandom r = new java.util.SplittableRandom(seed);
            int chunk = 256;
            float[] k = new float[chunk * g.kvHeads() * g.headDimK()];
            float[] v = new float[chunk * g.kvHeads() * g.headDimV()];
            int start = kv.length();
            try {
                kv.reserve(start + tokens);
                for (int done = 0; done < tokens; done += chunk) {
                    int n = Math.min(chunk, tokens - done);
                    for (int l = 0; l < g.layers(); l++) {
                        for (int i = 0; i < n * g.kvHeads() * g.headDimK(); i++) {
                            k[i] = (float) normal(r);
                        }
                        for (int i = 0; i < n * g.kvHeads() * g.headDimV(); i++) {
                            v[i] = (float) normal(r);
                        }
                        kv.writeRows(l, start + done, n, k, 0, v, 0);
                    }
                }
            } catch (RuntimeException e) {
                kv.truncate(start);   // a pool that ran out (a shared page's copy) keeps nothing of the fill
                throw e;
            }
        }

        private static double normal(java.util.SplittableRandom r) {
            return Math.sqrt(-2 * Math.log(1.0 - r.nextDouble())) * Math.cos(2 * Math.PI * r.nextDouble());
        }

        @Override
        public void truncate(int length) {
            kv.truncate(length);
        }

        void checkRoom(int n) {
            if (n > capacity - kv.length()) {   // (no sum: n may be near Integer.MAX_VALUE)
                throw new ContextFullException("the sequence would need " + ((long) kv.length() + n)
                        + " tokens but the context holds " + capacity
                        + " (raise -c, or --kv-mem where it set the context)");
            }
        }

        @Override
        public void close() {
            kv.close();
            if (ownsCache) {
                cache.close();
            }
        }
    }
}
