package dev.kvant.cuda.model;

import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.attention.AttentionPlan;
import dev.kvant.cuda.attention.AttentionShape;
import dev.kvant.cuda.attention.CudaAttention;
import dev.kvant.cuda.attention.CudaKvCache;
import dev.kvant.cuda.attention.DeviceBatch;
import dev.kvant.kv.KvCacheFullException;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.ModelConfig;
import dev.kvant.select.SelectionConfig;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Locale;

/**
 * The device KV cache of one set of K/V formats (a pair for all layers, or layers of their own): one page numbering (a free stack with reference counts: shared
 * prefix pages, copy on write) over a {@link Part} on each stage — that stage's layers' pages, the attention
 * kernels compiled for them, the device batch its launches read, and the decode graphs captured over it (one per
 * batch size). A page id means the same tokens on every stage.
 */
final class KvPool implements AutoCloseable {

    /**
     * One stage's share: the pages of its layers, and per local layer the attention kernels of its format pair
     * (one compiled module per distinct pair).
     */
    record Part(Stage stage, CudaKvCache cache, CudaAttention[] attentions, DeviceBatch batch, CudaGraph[] graphs) {
        CudaAttention attention(int layer) {
            return attentions[layer];
        }
    }

    private final KvLayerFormats formats;
    private final boolean keyMeans;
    private final int maxContext;
    private final SelectionConfig selection;
    private final List<Part> parts = new ArrayList<>();
    private boolean closed;
    private final int[] free;
    /** Sequences holding each page (a shared prefix page has several); 0 for a free page. */
    private final int[] refs;
    private int freeCount;
    /** Sequences made on this pool and not yet closed. */
    private int sequences;

    /**
     * @param selection query-aware selection of the decode steps (null: dense): every page then carries key
     *                  summaries, and each stage's attention the selection kernels
     */
    /** Whether some layer's K rows are centered on their page's mean. */
    boolean keyMeans() {
        return keyMeans;
    }

    KvPool(Stage[] stages, ModelConfig c, KvLayerFormats formats, int pageTokens, long tokens,
           int maxContext, int maxBatch, int maxPrefill, long headroom, float sparseV, SelectionConfig selection) {
        formats.check(c.layers());
        this.formats = formats;
        this.keyMeans = formats.anyKeyMeans(c.layers());
        this.selection = selection;
        this.maxContext = maxContext;
        long pages = Math.max((tokens + pageTokens - 1) / pageTokens,
                ((long) maxContext + pageTokens - 1) / pageTokens);
        // a cache slot is page * pageTokens + row, an int32 on the device
        if (pages > Integer.MAX_VALUE / pageTokens) {
            throw new IllegalArgumentException("a KV cache of " + Math.max(tokens, maxContext) + " tokens has more"
                    + " than the " + Integer.MAX_VALUE / pageTokens + " pages of " + pageTokens + " tokens a pool holds");
        }
        try {
            for (Stage s : stages) {
                int layers = s.layerCount();
                KvGeometry geometry = new KvGeometry(layers, c.kvHeads(), c.headDimK(), c.headDimV());
                KvLayerFormats local = stageFormats(formats, s.from, layers, c.layers());
                AttentionShape[] shapes = new AttentionShape[layers];
                long pageBytes = 0;
                for (int l = 0; l < layers; l++) {
                    shapes[l] = new AttentionShape(geometry, c.heads(), local.k(l, layers), local.v(l, layers),
                            pageTokens);
                    pageBytes += shapes[l].kPageBytes() + shapes[l].vPageBytes()
                            + (selection == null ? 0 : CudaKvCache.summaryPageBytes(geometry, pageTokens,
                            selection.blockTokens(), selection.coarseTokens()));
                }
                // the attention modules and their scratch (selection's included) first, so that the cache is
                // sized by what they leave: a selected prefill's scratch is not allocated on first use
                CudaAttention[] attentions = new CudaAttention[layers];
                Map<AttentionShape, CudaAttention> byShape = new HashMap<>();
                CudaKvCache cache = null;
                DeviceBatch batch = null;
                try {
                    for (int l = 0; l < layers; l++) {
                        CudaAttention a = byShape.get(shapes[l]);
                        if (a == null) {
                            a = CudaAttention.create(s.context, KernelCache.open(s.context), shapes[l],
                                    AttentionPlan.of(maxBatch, 1, maxContext, maxPrefill),
                                    (float) (1.0 / Math.sqrt(c.headDimK())), sparseV);
                            byShape.put(shapes[l], a);
                            if (selection != null) {
                                a.enableSelection(selection, 0);
                            }
                        }
                        attentions[l] = a;
                    }
                    batch = DeviceBatch.allocate(s.context, Math.max(1, maxBatch),
                            (int) (((long) maxContext + pageTokens - 1) / pageTokens));
                    long free = s.context.memoryInfo().free() - headroom;
                    if (pages * pageBytes > free) {
                        throw new IllegalArgumentException(String.format(Locale.ROOT,
                                "a %s KV cache of %d tokens needs %.2f GiB on %s (layers %d..%d); %.2f GiB are free "
                                        + "after the weights and the attention's scratch (%d tokens fit; lower -c, "
                                        + "--parallel or --kv-mem, or split the layers over more GPUs)", formats.name(),
                                pages * pageTokens, pages * pageBytes / 1073741824.0, s.context.deviceName(), s.from,
                                s.to - 1, free / 1073741824.0, Math.max(0, free / pageBytes) * pageTokens));
                    }
                    cache = CudaKvCache.allocate(s.context, geometry, local, pageTokens, (int) pages);
                    if (selection != null) {
                        cache.enableKeySummaries(selection.blockTokens(), selection.coarseTokens());
                    }
                } catch (RuntimeException | Error e) {
                    if (batch != null) {
                        batch.close();
                    }
                    for (CudaAttention a : byShape.values()) {
                        a.close();
                    }
                    if (cache != null) {
                        cache.close();
                    }
                    throw e;
                }
                parts.add(new Part(s, cache, attentions, batch, new CudaGraph[maxBatch + 1]));
            }
        } catch (RuntimeException | Error e) {
            close();
            throw e;
        }
        int pageCount = (int) pages;
        this.free = new int[pageCount];
        this.refs = new int[pageCount];
        for (int i = 0; i < pageCount; i++) {
            this.free[i] = pageCount - 1 - i;  // pages are handed out lowest first
        }
        this.freeCount = pageCount;
    }

    /**
     * The formats of a stage's layers, numbered from 0: those of the model's layers from .. from+layers-1 (a
     * negative index of the model's formats counts from the model's end, not the stage's).
     */
    static KvLayerFormats stageFormats(KvLayerFormats formats, int from, int layers, int modelLayers) {
        KvLayerFormats local = KvLayerFormats.of(formats.k(from, modelLayers), formats.v(from, modelLayers));
        for (int l = 0; l < layers; l++) {
            local = local.withK(l, formats.k(from + l, modelLayers)).withV(l, formats.v(from + l, modelLayers));
        }
        return local;
    }

    int maxContext() {
        return maxContext;
    }

    /** The decode selection of this pool's sequences, or null (dense). */
    SelectionConfig selection() {
        return selection;
    }

    List<Part> parts() {
        return parts;
    }

    /** A sequence was made on this pool. */
    synchronized void attach() {
        sequences++;
    }

    /** A sequence of this pool was closed. */
    synchronized void detach() {
        sequences--;
    }

    /** Whether no sequence of this pool is open (so closing it takes nothing from anyone). */
    synchronized boolean idle() {
        return sequences == 0;
    }

    synchronized int freePages() {
        return freeCount;
    }

    int totalPages() {
        return free.length;
    }

    /**
     * Checks that {@code more} pages are free for a sequence holding {@code held} pages that needs
     * {@code tokens} tokens, before anything is taken.
     */
    synchronized void checkFree(int more, int held, int tokens, int pageTokens) {
        if (more > freeCount) {
            throw new KvCacheFullException("the " + formats.name() + " device KV cache has "
                    + freeCount + " of " + free.length + " pages free, a sequence of " + tokens + " tokens needs "
                    + more + " more; finish or close sequences, or give the cache more memory (--kv-mem)",
                    tokens, (held + freeCount) * pageTokens);
        }
    }

    /**
     * Refuses a decode step of n sequences that needs more free pages than there are; changes nothing. longest: the
     * longest length the step asks for (the exception's requested length; it fits one token less).
     */
    synchronized void checkFreeForStep(int more, int sequences, int longest) {
        if (more > freeCount) {
            throw new KvCacheFullException("the " + formats.name() + " device KV cache has " + freeCount + " of "
                    + free.length + " pages free, a decode step of " + sequences + " sequences needs " + more
                    + " more; finish or close sequences, or give the cache more memory (--kv-mem)", longest,
                    longest - 1);
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

    synchronized int holders(int page) {
        return refs[page];
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

    /** Queues, on each stage's stream, a copy of every layer's K and V rows (and key summaries) of page {@code from} onto {@code to}. */
    void copyPage(int from, int to) {
        for (Part p : parts) {
            p.cache().copyPage(from, to, p.stage().stream);
        }
    }

    /** The decode graph of n sequences on a part, captured from {@code launches} on first use. */
    static CudaGraph graph(Part part, int n, Runnable launches) {
        if (part.graphs()[n] == null) {
            part.graphs()[n] = CudaGraph.capture(part.stage().stream, launches);
        }
        return part.graphs()[n];
    }

    /** Whether {@link #close} ran: its pages, tables and graphs are gone. */
    boolean isClosed() {
        return closed;
    }

    @Override
    public void close() {
        closed = true;
        for (Part p : parts) {
            for (CudaGraph g : p.graphs()) {
                if (g != null) {
                    g.close();
                }
            }
            p.batch().close();
            for (CudaAttention a : new java.util.LinkedHashSet<>(java.util.Arrays.asList(p.attentions()))) {
                a.close();
            }
            p.cache().close();
        }
        parts.clear();
    }
}
