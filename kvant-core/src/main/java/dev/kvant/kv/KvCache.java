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
    private final KvLayerFormats formats;
    private final int pageTokens;
    // per layer (a layer may have formats of its own: KvLayerFormats)
    private final KvFormat[] kFormats;
    private final KvFormat[] vFormats;
    private final long[] kRowBytes;
    private final long[] vRowBytes;
    private final long[] kPageBytes;
    private final long[] vPageBytes;
    /** Where a K page's means start (its rows' bytes); meaningful where {@link #keyMeans(int)}. */
    private final long[] kMeansOffset;
    private final boolean kUniform;
    private final boolean vUniform;
    private final Arena arena;
    private final MemorySegment[] kPools;
    private final MemorySegment[] vPools;
    final PageAllocator allocator;

    public KvCache(KvGeometry g, KvFormat k, KvFormat v, int pageTokens, int pages) {
        this(g, KvLayerFormats.of(k, v), pageTokens, pages);
    }

    public KvCache(KvGeometry g, KvLayerFormats f, int pageTokens, int pages) {
        if (pageTokens <= 0) {
            throw new IllegalArgumentException("KV cache pages must hold at least one token, got pageTokens=" + pageTokens);
        }
        if (pages <= 0) {
            throw new IllegalArgumentException("KV cache needs at least one page, got " + pages);
        }
        f.check(g.layers());
        this.geometry = g;
        this.formats = f;
        this.pageTokens = pageTokens;
        int layers = g.layers();
        this.kFormats = new KvFormat[layers];
        this.vFormats = new KvFormat[layers];
        this.kRowBytes = new long[layers];
        this.vRowBytes = new long[layers];
        this.kPageBytes = new long[layers];
        this.vPageBytes = new long[layers];
        this.kMeansOffset = new long[layers];
        boolean kSame = true;
        boolean vSame = true;
        for (int l = 0; l < layers; l++) {
            KvFormat k = f.k(l, layers);
            KvFormat v = f.v(l, layers);
            if (v instanceof PageMeanFormat) {
                throw new IllegalArgumentException("V cache format " + v.name() + ": only keys are centered on their "
                        + "page's mean (values have no common part worth the bytes); use "
                        + PageMeanFormat.rows(v).name());
            }
            kFormats[l] = k;
            vFormats[l] = v;
            kRowBytes[l] = k.rowBytes(g.headDimK());
            vRowBytes[l] = v.rowBytes(g.headDimV());
            kMeansOffset[l] = Math.multiplyExact((long) pageTokens * g.kvHeads(), kRowBytes[l]);
            kPageBytes[l] = kPageBytes(g, k, pageTokens);
            vPageBytes[l] = Math.multiplyExact((long) pageTokens * g.kvHeads(), vRowBytes[l]);
            kSame &= k.equals(kFormats[0]);
            vSame &= v.equals(vFormats[0]);
        }
        this.kUniform = kSame;
        this.vUniform = vSame;
        this.arena = Arena.ofShared();
        this.kPools = new MemorySegment[layers];
        this.vPools = new MemorySegment[layers];
        try {
            this.allocator = new PageAllocator(pages);   // its tables, 8 bytes a page, inside the check as well
            for (int l = 0; l < layers; l++) {
                kPools[l] = arena.allocate(Math.multiplyExact(kPageBytes[l], (long) pages), 64);
                vPools[l] = arena.allocate(Math.multiplyExact(vPageBytes[l], (long) pages), 64);
            }
        } catch (OutOfMemoryError | ArithmeticException e) {
            arena.close();
            throw new IllegalArgumentException("KV cache of " + pages + " pages × " + pageTokens + " tokens × "
                    + bytesPerToken(g, f) + " bytes per token does not fit in memory", e);
        }
    }

    /** A cache with room for at least this many tokens (summed over all sequences). */
    public static KvCache forTokens(KvGeometry g, KvFormat k, KvFormat v, int pageTokens, int tokens) {
        return forTokens(g, KvLayerFormats.of(k, v), pageTokens, tokens);
    }

    /** A cache with room for at least this many tokens (summed over all sequences). */
    public static KvCache forTokens(KvGeometry g, KvLayerFormats f, int pageTokens, int tokens) {
        if (tokens <= 0 || pageTokens <= 0) {
            throw new IllegalArgumentException("KV cache needs positive tokens and pageTokens, got tokens=" + tokens
                    + " pageTokens=" + pageTokens);
        }
        return new KvCache(g, f, pageTokens, (int) (((long) tokens + pageTokens - 1) / pageTokens));
    }

    /** The largest cache whose pools (all layers, K and V) fit in this many bytes. */
    public static KvCache forBudget(KvGeometry g, KvFormat k, KvFormat v, int pageTokens, long bytes) {
        return forBudget(g, KvLayerFormats.of(k, v), pageTokens, bytes);
    }

    /** The largest cache whose pools (all layers, K and V) fit in this many bytes. */
    public static KvCache forBudget(KvGeometry g, KvLayerFormats f, int pageTokens, long bytes) {
        if (pageTokens <= 0) {
            throw new IllegalArgumentException("KV cache pages must hold at least one token, got pageTokens=" + pageTokens);
        }
        long pageBytes = pageBytes(g, f, pageTokens);
        long pages = bytes / pageBytes;
        if (pages < 1) {
            throw new IllegalArgumentException("a KV cache budget of " + bytes + " bytes holds no page: one page of "
                    + pageTokens + " tokens takes " + pageBytes + " bytes with " + f.name());
        }
        return new KvCache(g, f, pageTokens, (int) Math.min(pages, Integer.MAX_VALUE));
    }

    /**
     * Bytes one token takes in all layers' K and V pages: its rows, plus its share of the key means of a 64-token
     * page (rounded up) with a {@link PageMeanFormat} K format.
     */
    public static long bytesPerToken(KvGeometry g, KvFormat k, KvFormat v) {
        return bytesPerToken(g, KvLayerFormats.of(k, v));
    }

    /** As {@link #bytesPerToken(KvGeometry, KvFormat, KvFormat)}, summed over the layers' own formats. */
    public static long bytesPerToken(KvGeometry g, KvLayerFormats f) {
        f.check(g.layers());
        long rows = 0;
        long means = 0;
        for (int l = 0; l < g.layers(); l++) {
            KvFormat k = f.k(l, g.layers());
            rows += (long) g.kvHeads() * (k.rowBytes(g.headDimK()) + f.v(l, g.layers()).rowBytes(g.headDimV()));
            means += k instanceof PageMeanFormat ? meanBytes(g, k) : 0;
        }
        return rows + (means + 63) / 64;
    }

    /** Bytes of one page id in all layers' K and V pools. */
    public static long pageBytes(KvGeometry g, KvFormat k, KvFormat v, int pageTokens) {
        return pageBytes(g, KvLayerFormats.of(k, v), pageTokens);
    }

    /** Bytes of one page id in all layers' K and V pools, each layer in its own formats. */
    public static long pageBytes(KvGeometry g, KvLayerFormats f, int pageTokens) {
        f.check(g.layers());
        long bytes = 0;
        for (int l = 0; l < g.layers(); l++) {
            KvFormat v = f.v(l, g.layers());
            bytes = Math.addExact(bytes, Math.addExact(kPageBytes(g, f.k(l, g.layers()), pageTokens),
                    Math.multiplyExact((long) pageTokens * g.kvHeads(), v.rowBytes(g.headDimV()))));
        }
        return bytes;
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
        return bytesPerToken(geometry, formats);
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

    /** The formats of this cache's layers. */
    public KvLayerFormats formats() {
        return formats;
    }

    /** The K format of every layer; for a cache whose layers differ, {@link #kFormat(int)}. */
    public KvFormat kFormat() {
        requireUniform(kUniform, "K format");
        return kFormats[0];
    }

    /** The V format of every layer; for a cache whose layers differ, {@link #vFormat(int)}. */
    public KvFormat vFormat() {
        requireUniform(vUniform, "V format");
        return vFormats[0];
    }

    public KvFormat kFormat(int layer) {
        return kFormats[layer];
    }

    public KvFormat vFormat(int layer) {
        return vFormats[layer];
    }

    private void requireUniform(boolean uniform, String what) {
        if (!uniform) {
            throw new IllegalStateException("the layers of this cache differ in format (" + formats.name()
                    + "): the " + what + " of a layer is asked per layer");
        }
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

    /** The raw K page of a layer: pageTokens × kvHeads rows of kFormat(layer).rowBytes(headDimK), [token][head]. */
    public MemorySegment kPage(int layer, int page) {
        checkPage(page);
        return kPools[layer].asSlice(page * kPageBytes[layer], kPageBytes[layer]);
    }

    public MemorySegment vPage(int layer, int page) {
        checkPage(page);
        return vPools[layer].asSlice(page * vPageBytes[layer], vPageBytes[layer]);
    }

    /** The whole K pool of a layer: page p starts at {@code p × kPageBytes(layer)}. */
    public MemorySegment kPool(int layer) {
        return kPools[layer];
    }

    public MemorySegment vPool(int layer) {
        return vPools[layer];
    }

    /** Bytes of a K page of every layer; for a cache whose layers differ, {@link #kPageBytes(int)}. */
    public long kPageBytes() {
        requireUniform(kUniform, "K page size");
        return kPageBytes[0];
    }

    /** Bytes of a V page of every layer; for a cache whose layers differ, {@link #vPageBytes(int)}. */
    public long vPageBytes() {
        requireUniform(vUniform, "V page size");
        return vPageBytes[0];
    }

    public long kPageBytes(int layer) {
        return kPageBytes[layer];
    }

    public long vPageBytes(int layer) {
        return vPageBytes[layer];
    }

    /** Byte offset of a K row of a layer inside its page. */
    public long kRowOffset(int layer, int tokenInPage, int head) {
        return ((long) tokenInPage * geometry.kvHeads() + head) * kRowBytes[layer];
    }

    public long vRowOffset(int layer, int tokenInPage, int head) {
        return ((long) tokenInPage * geometry.kvHeads() + head) * vRowBytes[layer];
    }

    /** Byte offset of a K row inside its page, every layer; for a cache whose layers differ, per layer. */
    public long kRowOffset(int tokenInPage, int head) {
        return ((long) tokenInPage * geometry.kvHeads() + head) * kRowBytes();
    }

    public long vRowOffset(int tokenInPage, int head) {
        return ((long) tokenInPage * geometry.kvHeads() + head) * vRowBytes();
    }

    /** Bytes of a K row of every layer; for a cache whose layers differ, {@link #kRowBytes(int)}. */
    public long kRowBytes() {
        requireUniform(kUniform, "K row size");
        return kRowBytes[0];
    }

    /** Bytes of a V row of every layer; for a cache whose layers differ, {@link #vRowBytes(int)}. */
    public long vRowBytes() {
        requireUniform(vUniform, "V row size");
        return vRowBytes[0];
    }

    public long kRowBytes(int layer) {
        return kRowBytes[layer];
    }

    public long vRowBytes(int layer) {
        return vRowBytes[layer];
    }

    /** True when every layer's K rows are centered on their page's mean; per layer: {@link #keyMeans(int)}. */
    public boolean keyMeans() {
        requireUniform(kUniform, "K format");
        return keyMeans(0);
    }

    /** True when some layer's K rows are centered on their page's mean. */
    public boolean anyKeyMeans() {
        for (KvFormat f : kFormats) {
            if (f instanceof PageMeanFormat) {
                return true;
            }
        }
        return false;
    }

    /** True when a layer's K rows are centered on their page's mean ({@link PageMeanFormat}). */
    public boolean keyMeans(int layer) {
        return kFormats[layer] instanceof PageMeanFormat;
    }

    /** Byte offset, inside a K page of the layer, of one kv head's mean (domainDim halves); with keyMeans(layer). */
    public long kMeanOffset(int layer, int head) {
        if (!keyMeans(layer)) {
            throw new IllegalStateException("K format " + kFormats[layer].name() + " of layer " + layer
                    + " keeps no page means");
        }
        return kMeansOffset[layer] + 2L * head * kFormats[layer].domainDim(geometry.headDimK());
    }

    /** As {@link #kMeanOffset(int, int)} for a cache whose layers share their K format. */
    public long kMeanOffset(int head) {
        requireUniform(kUniform, "K format");
        return kMeanOffset(0, head);
    }

    /**
     * Reads one kv head's key mean of a page into {@code dst[off, off + domainDim)}: values of K's domain (rotated
     * like the rows of a rotated format), so that it adds to a decoded row.
     */
    public void keyMean(int layer, int page, int head, float[] dst, int off) {
        long at = page * kPageBytes[layer] + kMeanOffset(layer, head);
        int dim = kFormats[layer].domainDim(geometry.headDimK());
        for (int i = 0; i < dim; i++) {
            dst[off + i] = Float.float16ToFloat(kPools[layer].get(LE_HALF, at + 2L * i));
        }
    }

    /** Sets one kv head's key mean of a page from {@code src[off, off + domainDim)}, rounding each to a half. */
    void setKeyMean(int layer, int page, int head, float[] src, int off) {
        long at = page * kPageBytes[layer] + kMeanOffset(layer, head);
        int dim = kFormats[layer].domainDim(geometry.headDimK());
        for (int i = 0; i < dim; i++) {
            kPools[layer].set(LE_HALF, at + 2L * i, KvLanes.toHalf(src[off + i]));   // clamped, as scales are
        }
    }

    /** Frees the pools; every sequence of this cache is unusable afterwards. */
    @Override
    public void close() {
        arena.close();
    }

    /** How many sequences hold the page: the last one to close gives it back. */
    public int refCount(int page) {
        synchronized (allocator) {
            return allocator.refCount(page);
        }
    }

    /** Copies the first tokens rows (and the key means) of every layer's K and V page from one page id to another. */
    void copyPage(int from, int to, int tokens) {
        for (int l = 0; l < geometry.layers(); l++) {
            long kBytes = (long) tokens * geometry.kvHeads() * kRowBytes[l];
            long vBytes = (long) tokens * geometry.kvHeads() * vRowBytes[l];
            long kp = kPageBytes[l];
            long vp = vPageBytes[l];
            MemorySegment.copy(kPools[l], from * kp, kPools[l], to * kp, kBytes);
            if (keyMeans(l)) {
                MemorySegment.copy(kPools[l], from * kp + kMeansOffset[l], kPools[l], to * kp + kMeansOffset[l],
                        kp - kMeansOffset[l]);
            }
            MemorySegment.copy(vPools[l], from * vp, vPools[l], to * vp, vBytes);
        }
    }

    private void checkPage(int page) {
        if (page < 0 || page >= allocator.total()) {
            throw new IndexOutOfBoundsException("page " + page + " is outside the cache's " + allocator.total() + " pages");
        }
    }

    @Override
    public String toString() {
        return "KvCache[" + geometry + ", " + formats.name() + ", " + allocator.total()
                + " pages × " + pageTokens + " tokens, " + bytesPerToken() + " bytes/token]";
    }
}
