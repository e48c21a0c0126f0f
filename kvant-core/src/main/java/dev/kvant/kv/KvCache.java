package dev.kvant.kv;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * The paged KV cache: per layer a K pool and a V pool of fixed-size pages in off-heap memory. A page holds
 * pageTokens tokens × kvHeads rows, row-major [token][head], each row in the layer's K or V {@link KvFormat}.
 * With a {@link PageMeanFormat} K format, each K page carries after its rows one mean per kv head (halves in K's
 * domain; {@link #keyMean}). Page ids are shared by all layers: a sequence's page table maps a logical page to one physical id that is valid
 * in every layer's K and V pool, so one {@link PageAllocator} serves the whole cache.
 *
 * <p>Page allocation, sharing and release are serialized on the cache; writing rows is not, so different sequences
 * may write concurrently. One sequence must be used by one thread at a time.
 */
public final class KvCache implements AutoCloseable {
    /** Key means are little-endian halves, like every multi-byte field of the formats. */
    private static final ValueLayout.OfShort LE_HALF = ValueLayout.JAVA_SHORT_UNALIGNED.withOrder(
            java.nio.ByteOrder.LITTLE_ENDIAN);
    private final KvGeometry geometry;
    private final KvFormat kFormat;
    private final KvFormat vFormat;
    private final int pageTokens;
    private final long kRowBytes;
    private final long vRowBytes;
    private final long kPageBytes;
    private final long vPageBytes;
    /** Where a K page's means start (its rows' bytes); meaningful with {@link #keyMeans()}. */
    private final long kMeansOffset;
    private final boolean keyMeans;
    private final Arena arena;
    private final MemorySegment[] kPools;
    private final MemorySegment[] vPools;
    final PageAllocator allocator;

    public KvCache(KvGeometry g, KvFormat k, KvFormat v, int pageTokens, int pages) {
        if (pageTokens <= 0) {
            throw new IllegalArgumentException("KV cache pages must hold at least one token, got pageTokens=" + pageTokens);
        }
        if (pages <= 0) {
            throw new IllegalArgumentException("KV cache needs at least one page, got " + pages);
        }
        this.geometry = g;
        this.kFormat = k;
        this.vFormat = v;
        this.pageTokens = pageTokens;
        this.kRowBytes = k.rowBytes(g.headDimK());
        this.vRowBytes = v.rowBytes(g.headDimV());
        if (v instanceof PageMeanFormat) {
            throw new IllegalArgumentException("V cache format " + v.name() + ": only keys are centered on their "
                    + "page's mean (values have no common part worth the bytes); use " + PageMeanFormat.rows(v).name());
        }
        this.keyMeans = k instanceof PageMeanFormat;
        this.kMeansOffset = Math.multiplyExact((long) pageTokens * g.kvHeads(), kRowBytes);
        this.kPageBytes = kPageBytes(g, k, pageTokens);
        this.vPageBytes = Math.multiplyExact((long) pageTokens * g.kvHeads(), vRowBytes);
        this.allocator = new PageAllocator(pages);
        this.arena = Arena.ofShared();
        this.kPools = new MemorySegment[g.layers()];
        this.vPools = new MemorySegment[g.layers()];
        try {
            for (int l = 0; l < g.layers(); l++) {
                kPools[l] = arena.allocate(Math.multiplyExact(kPageBytes, (long) pages), 64);
                vPools[l] = arena.allocate(Math.multiplyExact(vPageBytes, (long) pages), 64);
            }
        } catch (OutOfMemoryError | ArithmeticException e) {
            arena.close();
            throw new IllegalArgumentException("KV cache of " + pages + " pages × " + pageTokens + " tokens × "
                    + bytesPerToken(g, k, v) + " bytes per token does not fit in memory", e);
        }
    }

    /** A cache with room for at least this many tokens (summed over all sequences). */
    public static KvCache forTokens(KvGeometry g, KvFormat k, KvFormat v, int pageTokens, int tokens) {
        if (tokens <= 0 || pageTokens <= 0) {
            throw new IllegalArgumentException("KV cache needs positive tokens and pageTokens, got tokens=" + tokens
                    + " pageTokens=" + pageTokens);
        }
        return new KvCache(g, k, v, pageTokens, (tokens + pageTokens - 1) / pageTokens);
    }

    /** The largest cache whose pools (all layers, K and V) fit in this many bytes. */
    public static KvCache forBudget(KvGeometry g, KvFormat k, KvFormat v, int pageTokens, long bytes) {
        if (pageTokens <= 0) {
            throw new IllegalArgumentException("KV cache pages must hold at least one token, got pageTokens=" + pageTokens);
        }
        long pageBytes = pageBytes(g, k, v, pageTokens);
        long pages = bytes / pageBytes;
        if (pages < 1) {
            throw new IllegalArgumentException("a KV cache budget of " + bytes + " bytes holds no page: one page of "
                    + pageTokens + " tokens takes " + pageBytes + " bytes with K " + k.name() + " and V " + v.name());
        }
        return new KvCache(g, k, v, pageTokens, (int) Math.min(pages, Integer.MAX_VALUE));
    }

    /**
     * Bytes one token takes in all layers' K and V pages: its rows, plus its share of the key means of a 64-token
     * page (rounded up) with a {@link PageMeanFormat} K format.
     */
    public static long bytesPerToken(KvGeometry g, KvFormat k, KvFormat v) {
        long rows = (long) g.layers() * g.kvHeads() * (k.rowBytes(g.headDimK()) + v.rowBytes(g.headDimV()));
        return rows + (k instanceof PageMeanFormat ? (g.layers() * meanBytes(g, k) + 63) / 64 : 0);
    }

    /** Bytes of one page id in all layers' K and V pools. */
    public static long pageBytes(KvGeometry g, KvFormat k, KvFormat v, int pageTokens) {
        long rows = Math.multiplyExact((long) g.layers() * g.kvHeads() * (k.rowBytes(g.headDimK())
                + v.rowBytes(g.headDimV())), (long) pageTokens);
        return rows + (k instanceof PageMeanFormat ? g.layers() * meanBytes(g, k) : 0);
    }

    /** Bytes of one K page of one layer: its rows, then the key means with a {@link PageMeanFormat}. */
    public static long kPageBytes(KvGeometry g, KvFormat k, int pageTokens) {
        return Math.multiplyExact((long) pageTokens * g.kvHeads(), k.rowBytes(g.headDimK()))
                + (k instanceof PageMeanFormat ? meanBytes(g, k) : 0);
    }

    /** The key means of one K page: a half per kv head and value of K's domain. */
    private static long meanBytes(KvGeometry g, KvFormat k) {
        return 2L * g.kvHeads() * k.domainDim(g.headDimK());
    }

    public long bytesPerToken() {
        return bytesPerToken(geometry, kFormat, vFormat);
    }

    public int capacityTokens() {
        return (int) Math.min((long) allocator.total() * pageTokens, Integer.MAX_VALUE);
    }

    public int pageTokens() {
        return pageTokens;
    }

    public int freePages() {
        synchronized (allocator) {
            return allocator.free();
        }
    }

    public int totalPages() {
        return allocator.total();
    }

    public KvGeometry geometry() {
        return geometry;
    }

    public KvFormat kFormat() {
        return kFormat;
    }

    public KvFormat vFormat() {
        return vFormat;
    }

    public KvSequence newSequence() {
        return new KvSequence(this);
    }

    /**
     * A new sequence holding the first prefixTokens tokens of parent: the pages the prefix fills are shared
     * (reference-counted), the page it ends inside is copied, so either sequence can write on without disturbing
     * the other (a later write into a shared page copies it too).
     *
     * @throws KvCacheFullException when the boundary page cannot be copied for lack of a free page
     */
    public KvSequence fork(KvSequence parent, int prefixTokens) {
        return parent.fork(prefixTokens);
    }

    /** The raw K page of a layer: pageTokens × kvHeads rows of kFormat().rowBytes(headDimK), [token][head]. */
    public MemorySegment kPage(int layer, int page) {
        checkPage(page);
        return kPools[layer].asSlice(page * kPageBytes, kPageBytes);
    }

    public MemorySegment vPage(int layer, int page) {
        checkPage(page);
        return vPools[layer].asSlice(page * vPageBytes, vPageBytes);
    }

    /** The whole K pool of a layer: page p starts at {@code p × kPageBytes()}. */
    public MemorySegment kPool(int layer) {
        return kPools[layer];
    }

    public MemorySegment vPool(int layer) {
        return vPools[layer];
    }

    public long kPageBytes() {
        return kPageBytes;
    }

    public long vPageBytes() {
        return vPageBytes;
    }

    /** Byte offset of a K row inside its page. */
    public long kRowOffset(int tokenInPage, int head) {
        return ((long) tokenInPage * geometry.kvHeads() + head) * kRowBytes;
    }

    public long vRowOffset(int tokenInPage, int head) {
        return ((long) tokenInPage * geometry.kvHeads() + head) * vRowBytes;
    }

    public long kRowBytes() {
        return kRowBytes;
    }

    /** True when K rows are centered on their page's mean ({@link PageMeanFormat}). */
    public boolean keyMeans() {
        return keyMeans;
    }

    /** Byte offset, inside a K page, of one kv head's mean (domainDim halves); with {@link #keyMeans()} only. */
    public long kMeanOffset(int head) {
        if (!keyMeans) {
            throw new IllegalStateException("K format " + kFormat.name() + " keeps no page means");
        }
        return kMeansOffset + 2L * head * kFormat.domainDim(geometry.headDimK());
    }

    /**
     * Reads one kv head's key mean of a page into {@code dst[off, off + domainDim)}: values of K's domain (rotated
     * like the rows of a rotated format), so that it adds to a decoded row.
     */
    public void keyMean(int layer, int page, int head, float[] dst, int off) {
        long at = page * kPageBytes + kMeanOffset(head);
        int dim = kFormat.domainDim(geometry.headDimK());
        for (int i = 0; i < dim; i++) {
            dst[off + i] = Float.float16ToFloat(kPools[layer].get(LE_HALF, at + 2L * i));
        }
    }

    /** Sets one kv head's key mean of a page from {@code src[off, off + domainDim)}, rounding each to a half. */
    void setKeyMean(int layer, int page, int head, float[] src, int off) {
        long at = page * kPageBytes + kMeanOffset(head);
        int dim = kFormat.domainDim(geometry.headDimK());
        for (int i = 0; i < dim; i++) {
            kPools[layer].set(LE_HALF, at + 2L * i, Float.floatToFloat16(src[off + i]));
        }
    }

    public long vRowBytes() {
        return vRowBytes;
    }

    /** Frees the pools; every sequence of this cache is unusable afterwards. */
    @Override
    public void close() {
        arena.close();
    }

    int refCount(int page) {
        synchronized (allocator) {
            return allocator.refCount(page);
        }
    }

    /** Copies the first tokens rows (and the key means) of every layer's K and V page from one page id to another. */
    void copyPage(int from, int to, int tokens) {
        long kBytes = (long) tokens * geometry.kvHeads() * kRowBytes;
        long vBytes = (long) tokens * geometry.kvHeads() * vRowBytes;
        for (int l = 0; l < geometry.layers(); l++) {
            MemorySegment.copy(kPools[l], from * kPageBytes, kPools[l], to * kPageBytes, kBytes);
            if (keyMeans) {
                MemorySegment.copy(kPools[l], from * kPageBytes + kMeansOffset, kPools[l], to * kPageBytes
                        + kMeansOffset, kPageBytes - kMeansOffset);
            }
            MemorySegment.copy(vPools[l], from * vPageBytes, vPools[l], to * vPageBytes, vBytes);
        }
    }

    private void checkPage(int page) {
        if (page < 0 || page >= allocator.total()) {
            throw new IndexOutOfBoundsException("page " + page + " is outside the cache's " + allocator.total() + " pages");
        }
    }

    @Override
    public String toString() {
        return "KvCache[" + geometry + ", K " + kFormat.name() + ", V " + vFormat.name() + ", " + allocator.total()
                + " pages × " + pageTokens + " tokens, " + bytesPerToken() + " bytes/token]";
    }
}
