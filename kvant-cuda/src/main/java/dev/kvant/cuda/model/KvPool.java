package dev.kvant.cuda.model;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.attention.AttentionPlan;
import dev.kvant.cuda.attention.AttentionShape;
import dev.kvant.cuda.attention.CudaAttention;
import dev.kvant.cuda.attention.CudaKvCache;
import dev.kvant.cuda.attention.DeviceBatch;
import dev.kvant.kv.KvCacheFullException;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.model.ModelConfig;

import java.util.Locale;

/**
 * The device KV cache of one pair of K/V formats: its pages (a free stack), the attention kernels compiled for it,
 * the device batch its decode and prefill launches read, and the decode graphs captured over it (one per batch
 * size).
 */
final class KvPool implements AutoCloseable {
    private final KvFormat kFormat;
    private final KvFormat vFormat;
    private final int maxContext;
    private final CudaKvCache cache;
    private final CudaAttention attention;
    private final DeviceBatch batch;
    private final CudaGraph[] graphs;
    private final int[] free;
    /** Sequences holding each page (a shared prefix page has several); 0 for a free page. */
    private final int[] refs;
    private int freeCount;

    KvPool(CudaContext context, ModelConfig c, KvFormat kFormat, KvFormat vFormat, int pageTokens, long tokens,
           int maxContext, int maxBatch, int maxPrefill, long headroom) {
        this.kFormat = kFormat;
        this.vFormat = vFormat;
        this.maxContext = maxContext;
        KvGeometry geometry = new KvGeometry(c.layers(), c.kvHeads(), c.headDimK(), c.headDimV());
        AttentionShape shape = new AttentionShape(geometry, c.heads(), kFormat, vFormat, pageTokens);
        long pages = Math.max((tokens + pageTokens - 1) / pageTokens, (maxContext + pageTokens - 1) / pageTokens);
        long pageBytes = shape.kPageBytes() * c.layers() + shape.vPageBytes() * c.layers();
        long free = context.memoryInfo().free() - headroom;
        if (pages * pageBytes > free || pages > Integer.MAX_VALUE / 2) {
            throw new IllegalArgumentException(String.format(Locale.ROOT,
                    "a %s/%s KV cache of %d tokens needs %.2f GiB; %s has %.2f GiB free after the weights (%d "
                            + "tokens fit; lower -c or --kv-mem)", kFormat.name(), vFormat.name(),
                    pages * pageTokens, pages * pageBytes / 1073741824.0, context.deviceName(), free / 1073741824.0,
                    Math.max(0, free / pageBytes) * pageTokens));
        }
        int pageCount = (int) pages;
        CudaKvCache cache = null;
        CudaAttention attention = null;
        try {
            cache = CudaKvCache.allocate(context, geometry, kFormat, vFormat, pageTokens, pageCount);
            attention = CudaAttention.create(context, KernelCache.open(context), shape,
                    AttentionPlan.of(maxBatch, 1, maxContext, maxPrefill));
            this.batch = DeviceBatch.allocate(context, Math.max(1, maxBatch), (maxContext + pageTokens - 1)
                    / pageTokens);
        } catch (RuntimeException e) {
            if (attention != null) {
                attention.close();
            }
            if (cache != null) {
                cache.close();
            }
            throw e;
        }
        this.cache = cache;
        this.attention = attention;
        this.graphs = new CudaGraph[maxBatch + 1];
        this.free = new int[pageCount];
        this.refs = new int[pageCount];
        for (int i = 0; i < pageCount; i++) {
            this.free[i] = pageCount - 1 - i;  // pages are handed out lowest first
        }
        this.freeCount = pageCount;
    }

    int maxContext() {
        return maxContext;
    }

    CudaKvCache cache() {
        return cache;
    }

    CudaAttention attention() {
        return attention;
    }

    DeviceBatch batch() {
        return batch;
    }

    synchronized int freePages() {
        return freeCount;
    }

    int totalPages() {
        return free.length;
    }

    int pageTokens() {
        return cache.pageTokens();
    }

    /**
     * Checks that {@code more} pages are free for a sequence holding {@code held} pages that needs
     * {@code tokens} tokens, before anything is taken.
     */
    synchronized void checkFree(int more, int held, int tokens, int pageTokens) {
        if (more > freeCount) {
            throw new KvCacheFullException("the " + kFormat.name() + "/" + vFormat.name() + " device KV cache has "
                    + freeCount + " of " + free.length + " pages free, a sequence of " + tokens + " tokens needs "
                    + more + " more; finish or close sequences, or give the cache more memory (--kv-mem)",
                    tokens, (held + freeCount) * pageTokens);
        }
    }

    synchronized int take() {
        int page = free[--freeCount];
        refs[page] = 1;
        return page;
    }

    /** One more sequence holds the page. */
    synchronized void share(int page) {
        refs[page]++;
    }

    synchronized boolean shared(int page) {
        return refs[page] > 1;
    }

    /** A holder lets go of the page; the last one frees it. */
    synchronized void give(int page) {
        if (--refs[page] == 0) {
            free[freeCount++] = page;
        }
    }

    /** Queues a copy of every layer's K and V rows of page {@code from} onto page {@code to}. */
    void copyPage(int from, int to, int layers, CudaStream stream) {
        long kb = cache.kPageBytes(), vb = cache.vPageBytes();
        for (int l = 0; l < layers; l++) {
            cache.kPool(l).copyFromAsync(cache.kPool(l), from * kb, to * kb, kb, stream);
            cache.vPool(l).copyFromAsync(cache.vPool(l), from * vb, to * vb, vb, stream);
        }
    }

    /** The decode graph of n sequences, captured from {@code launches} on first use. */
    CudaGraph graph(int n, Runnable launches, CudaStream stream) {
        if (graphs[n] == null) {
            graphs[n] = CudaGraph.capture(stream, launches);
        }
        return graphs[n];
    }

    @Override
    public void close() {
        for (CudaGraph g : graphs) {
            if (g != null) {
                g.close();
            }
        }
        batch.close();
        attention.close();
        cache.close();
    }
}
