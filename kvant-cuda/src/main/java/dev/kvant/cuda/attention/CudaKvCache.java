package dev.kvant.cuda.attention;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvLayerFormats;
import java.lang.foreign.MemorySegment;
import java.util.Objects;

/**
 * The paged KV cache in device memory, laid out byte for byte like {@link KvCache}: per layer a K pool and a V pool of
 * {@code pages} pages, page p at {@code p * pageBytes}, and in a page the rows of token t and kv head h at
 * {@code (t * kvHeads + h) * rowBytes}, each row in its format's kv-format v1 layout. Page ids mean the same in every
 * layer, so one page table per sequence (a {@link DeviceBatch} row) serves all layers, as on the host.
 *
 * <p>Because the bytes are the host's, a host cache can be mirrored with one copy per pool ({@link #upload}) and
 * rows written by the device encoder ({@link CudaAttention#quantizeRows}) read back as host rows.
 */
public final class CudaKvCache implements AutoCloseable {
    private final CudaContext context;
    private final KvGeometry geometry;
    private final KvLayerFormats formats;
    private final int pageTokens;
    private final int pages;
    // per layer, as KvCache keeps them (a layer may have formats of its own)
    private final KvFormat[] kFormats;
    private final KvFormat[] vFormats;
    private final long[] kPageBytes;
    private final long[] vPageBytes;
    private final DeviceBuffer[] kPools;
    private final DeviceBuffer[] vPools;
    /** Per layer the key summaries of every page (select.cu's layout), or null before enableKeySummaries. */
    private DeviceBuffer[] summaries;
    private int summaryBlockTokens;
    /** Per layer one coarse summary per page (select.cu's coarse_at), or null without a coarse level. */
    private DeviceBuffer[] coarse;
    private int coarseTokens;

    private CudaKvCache(CudaContext context, KvGeometry g, KvLayerFormats f, int pageTokens, int pages) {
        if (pageTokens <= 0 || pages <= 0) {
            throw new IllegalArgumentException("device KV cache needs positive pageTokens and pages, got "
                    + pageTokens + " and " + pages);
        }
        f.check(g.layers());
        this.context = context;
        this.geometry = g;
        this.formats = f;
        this.pageTokens = pageTokens;
        this.pages = pages;
        int layers = g.layers();
        this.kFormats = new KvFormat[layers];
        this.vFormats = new KvFormat[layers];
        this.kPageBytes = new long[layers];
        this.vPageBytes = new long[layers];
        for (int l = 0; l < layers; l++) {
            kFormats[l] = f.k(l, layers);
            vFormats[l] = f.v(l, layers);
            kPageBytes[l] = KvCache.kPageBytes(g, kFormats[l], pageTokens);   // the host layout, key means included
            vPageBytes[l] = Math.multiplyExact((long) pageTokens * g.kvHeads(), vFormats[l].rowBytes(g.headDimV()));
        }
        this.kPools = new DeviceBuffer[layers];
        this.vPools = new DeviceBuffer[layers];
        try {
            for (int l = 0; l < layers; l++) {
                kPools[l] = context.allocate(Math.multiplyExact(kPageBytes[l], (long) pages));
                vPools[l] = context.allocate(Math.multiplyExact(vPageBytes[l], (long) pages));
            }
        } catch (RuntimeException e) {
            close();
            throw e;
        }
    }

    /** A device cache of {@code pages} pages (contents undefined until written). */
    public static CudaKvCache allocate(CudaContext context, KvGeometry g, KvFormat k, KvFormat v, int pageTokens,
                                       int pages) {
        return new CudaKvCache(context, g, KvLayerFormats.of(k, v), pageTokens, pages);
    }

    /** A device cache of {@code pages} pages, each layer's in its formats (contents undefined until written). */
    public static CudaKvCache allocate(CudaContext context, KvGeometry g, KvLayerFormats f, int pageTokens,
                                       int pages) {
        return new CudaKvCache(context, g, f, pageTokens, pages);
    }

    /** A device cache with the host cache's shape and a copy of its bytes. */
    public static CudaKvCache mirror(CudaContext context, KvCache host) {
        CudaKvCache device = new CudaKvCache(context, host.geometry(), host.formats(), host.pageTokens(),
                host.totalPages());
        device.upload(host);
        return device;
    }

    /** Copies every pool of the host cache (same geometry, formats and page count) to the device. */
    public void upload(KvCache host) {
        boolean same = host.geometry().equals(geometry) && host.pageTokens() == pageTokens
                && host.totalPages() == pages;
        for (int l = 0; same && l < geometry.layers(); l++) {
            same = host.kFormat(l).equals(kFormats[l]) && host.vFormat(l).equals(vFormats[l]);
        }
        if (!same) {
            throw new IllegalArgumentException("host cache " + host + " does not have the layout of " + this);
        }
        for (int l = 0; l < geometry.layers(); l++) {
            kPools[l].copyFromHost(host.kPool(l));
            vPools[l].copyFromHost(host.vPool(l));
        }
    }

    /** Copies one layer's K pool into {@code dst} (at least the pool's size). */
    public void downloadK(int layer, MemorySegment dst) {
        kPool(layer).copyToHost(dst.asSlice(0, kPool(layer).byteSize()));
    }

    public void downloadV(int layer, MemorySegment dst) {
        vPool(layer).copyToHost(dst.asSlice(0, vPool(layer).byteSize()));
    }

    /**
     * Gives every page key summaries for selection blocks of {@code blockTokens} positions (a power of two, 16 and
     * up, dividing the page): per block of the page and kv head, the element-wise minimum and maximum of its K rows
     * as attention decodes them, {@code float [pages][slotsPerPage][kvHeads][2][headDimK]}.
     * Kept by {@link CudaAttention#summarize} after each write; contents undefined until then. Idempotent for one
     * block size; another size replaces the summaries (undefined again until summarized).
     */
    public void enableKeySummaries(int blockTokens) {
        enableKeySummaries(blockTokens, 0);
    }

    /**
     * As {@link #enableKeySummaries(int)}, with a coarse level of {@code coarseTokens} positions per coarse block (0:
     * none; else whole pages, and blocks no larger than a page): per page the min and max over its coarse block
     * from the block's first row to the page's end, {@code float [pages][kvHeads][2][headDimK]}.
     */
    public void enableKeySummaries(int blockTokens, int coarseTokens) {
        if (blockTokens < 16 || Integer.bitCount(blockTokens) != 1 || pageTokens % blockTokens != 0) {
            // A block's summary lives in its page: a block spanning pages would keep it in a page that a fork may
            // share while the block's later rows differ between the sequences.
            throw new IllegalArgumentException("summary blocks on the device are a power of two from 16 tokens that"
                    + " divides the page (" + pageTokens + " tokens; --select-page at most that), got " + blockTokens);
        }
        if (coarseTokens != 0 && (coarseTokens % pageTokens != 0 || Integer.bitCount(coarseTokens) != 1)) {
            throw new IllegalArgumentException("coarse summaries on the device need coarse blocks of whole pages (a"
                    + " power of two, a multiple of " + pageTokens + " tokens), got " + coarseTokens);
        }
        if (summaries != null) {
            if (blockTokens == summaryBlockTokens && coarseTokens == this.coarseTokens) {
                return;
            }
            closeSummaries();
        }
        for (KvFormat k : kFormats) {
            if (k.domainDim(geometry.headDimK()) != geometry.headDimK()) {
                throw new IllegalArgumentException("key summaries on the device need a K domain of headDimK values"
                        + " (K format " + k.name() + ")");
            }
        }
        summaryBlockTokens = blockTokens;
        this.coarseTokens = coarseTokens;
        DeviceBuffer[] s = new DeviceBuffer[geometry.layers()];
        DeviceBuffer[] c = coarseTokens == 0 ? null : new DeviceBuffer[geometry.layers()];
        try {
            for (int l = 0; l < s.length; l++) {
                s[l] = context.allocate(Math.multiplyExact(fineBytes(), (long) pages));
                if (c != null) {
                    c[l] = context.allocate(Math.multiplyExact(coarseBytes(), (long) pages));
                }
            }
        } catch (RuntimeException e) {
            summaries = s;
            coarse = c;
            closeSummaries();
            throw e;
        }
        summaries = s;
        coarse = c;
    }

    private void closeSummaries() {
        for (DeviceBuffer[] level : new DeviceBuffer[][] {summaries, coarse}) {
            if (level != null) {
                for (DeviceBuffer b : level) {
                    if (b != null) {
                        b.close();
                    }
                }
            }
        }
        summaries = null;
        coarse = null;
        summaryBlockTokens = 0;
        coarseTokens = 0;
    }

    /**
     * Summary bytes per page and layer for blocks of {@code blockTokens} (and a coarse level when coarseTokens >
     * 0): what enableKeySummaries adds.
     */
    public static long summaryPageBytes(KvGeometry g, int pageTokens, int blockTokens, int coarseTokens) {
        long vector = (long) g.kvHeads() * 2 * g.headDimK() * 4;
        return (long) (pageTokens / blockTokens) * vector + (coarseTokens == 0 ? 0 : vector);
    }

    private long fineBytes() {
        return summaryPageBytes(geometry, pageTokens, summaryBlockTokens, 0);
    }

    private long coarseBytes() {
        return (long) geometry.kvHeads() * 2 * geometry.headDimK() * 4;
    }

    /** Positions per coarse block of the summaries; 0 without a coarse level. */
    public int summaryCoarseTokens() {
        return coarseTokens;
    }

    /** The coarse summaries of one layer. */
    public DeviceBuffer coarseSummaries(int layer) {
        if (coarse == null) {
            throw new IllegalStateException("coarse key summaries are off: enableKeySummaries(blocks, coarse)");
        }
        return coarse[Objects.checkIndex(layer, coarse.length)];
    }

    /** Whether {@link #enableKeySummaries} ran. */
    public boolean hasKeySummaries() {
        return summaries != null;
    }

    public int summaryBlockTokens() {
        return summaryBlockTokens;
    }

    /** Summary slots of one page: the selection blocks it holds. */
    public int summarySlotsPerPage() {
        return pageTokens / summaryBlockTokens;
    }

    /** The key summaries of one layer. */
    public DeviceBuffer keySummaries(int layer) {
        if (summaries == null) {
            throw new IllegalStateException("key summaries are off: call enableKeySummaries first");
        }
        return summaries[Objects.checkIndex(layer, summaries.length)];
    }

    /** Queues the copy of page {@code from}'s K, V and summary bytes (all layers) onto page {@code to}. */
    public void copyPage(int from, int to, dev.kvant.cuda.CudaStream stream) {
        for (int l = 0; l < geometry.layers(); l++) {
            long kb = kPageBytes[l];
            long vb = vPageBytes[l];
            kPools[l].copyFromAsync(kPools[l], from * kb, to * kb, kb, stream);
            vPools[l].copyFromAsync(vPools[l], from * vb, to * vb, vb, stream);
            if (summaries != null) {
                long sb = fineBytes();
                summaries[l].copyFromAsync(summaries[l], from * sb, to * sb, sb, stream);
            }
            if (coarse != null) {
                long cb = coarseBytes();
                coarse[l].copyFromAsync(coarse[l], from * cb, to * cb, cb, stream);
            }
        }
    }

    public DeviceBuffer kPool(int layer) {
        return kPools[Objects.checkIndex(layer, kPools.length)];
    }

    public DeviceBuffer vPool(int layer) {
        return vPools[Objects.checkIndex(layer, vPools.length)];
    }

    public KvGeometry geometry() {
        return geometry;
    }

    /** The formats of this cache's layers. */
    public KvLayerFormats formats() {
        return formats;
    }

    public KvFormat kFormat(int layer) {
        return kFormats[layer];
    }

    public KvFormat vFormat(int layer) {
        return vFormats[layer];
    }

    public int pageTokens() {
        return pageTokens;
    }

    public int pages() {
        return pages;
    }

    public long kRowBytes(int layer) {
        return kFormats[layer].rowBytes(geometry.headDimK());
    }

    public long vRowBytes(int layer) {
        return vFormats[layer].rowBytes(geometry.headDimV());
    }

    public long kPageBytes(int layer) {
        return kPageBytes[layer];
    }

    public long vPageBytes(int layer) {
        return vPageBytes[layer];
    }

    /** Device bytes of all pools. */
    public long byteSize() {
        long bytes = 0;
        for (int l = 0; l < geometry.layers(); l++) {
            bytes += (kPageBytes[l] + vPageBytes[l]) * pages;
        }
        return bytes;
    }

    /** Whether attention of this shape can run over a layer of this cache. */
    void checkShape(AttentionShape shape, int layer) {
        if (!shape.geometry().equals(geometry) || !shape.kFormat().equals(kFormats[layer])
                || !shape.vFormat().equals(vFormats[layer]) || shape.pageTokens() != pageTokens) {
            throw new IllegalArgumentException("attention compiled for " + shape + " cannot read layer " + layer
                    + " of " + this);
        }
    }

    @Override
    public void close() {
        closeSummaries();
        for (DeviceBuffer b : kPools) {
            if (b != null) {
                b.close();
            }
        }
        for (DeviceBuffer b : vPools) {
            if (b != null) {
                b.close();
            }
        }
    }

    @Override
    public String toString() {
        return "CudaKvCache[" + geometry + ", " + formats.name() + ", " + pages
                + " pages x " + pageTokens + " tokens, " + (byteSize() >> 20) + " MiB]";
    }
}
