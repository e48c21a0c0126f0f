package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.select.Selection;

import java.lang.foreign.MemorySegment;

/**
 * The inputs of one attention call as its tasks see them: where the cache rows are, how to decode them, the
 * prepared queries. One instance per calling thread, refilled by each call and read-only while its tasks run, so a
 * decode step allocates nothing here; the partials of a split-K call live here too.
 */
final class AttentionCall {
    private static final ThreadLocal<AttentionCall> LOCAL = ThreadLocal.withInitial(AttentionCall::new);

    KvSequence seq;
    int layer;
    MemorySegment kPool;
    MemorySegment vPool;
    long kPageBytes;
    long vPageBytes;
    long kRowBytes;
    long vRowBytes;
    int pageTokens;
    int kvHeads;
    KvFormat kFormat;
    KvFormat vFormat;
    RowDecoder kDecoder;
    /** K rows are centered on their page's mean, which readers add back ({@link dev.kvant.kv.PageMeanFormat}). */
    boolean keyMeans;
    RowDecoder vDecoder;
    int headDimK;
    int headDimV;
    /** Domain dimensions (rotated formats pad to a multiple of 64) and the same rounded up to whole vectors. */
    int dimK;
    int dimV;
    int dpK;
    int dpV;
    int heads;
    int group;
    int start;
    int n;
    float softCap;
    float sparseV;
    /** The blocks each query block attends to, or null for dense attention. */
    Selection selection;

    /** Queries rotated into K's domain and scaled: row (t·heads + h) of dpK floats; one zero row after them. */
    float[] queries = new float[0];
    int zeroQuery;

    /** Split-K partials: per (kv head, partition, query slot) the max, the sum and dpV accumulator floats. */
    float[] partMax = new float[0];
    float[] partSum = new float[0];
    float[] partAcc = new float[0];
    int parts;
    int slots;

    private KvFormat kDecoderFormat;
    private KvFormat vDecoderFormat;
    private int kDecoderDim;
    private int vDecoderDim;

    private AttentionCall() {
    }

    static AttentionCall get() {
        return LOCAL.get();
    }

    void set(KvSequence seq, int layer, int n, int start, int heads, AttentionOptions opts) {
        KvCache cache = seq.cache();
        this.seq = seq;
        this.layer = layer;
        this.kPool = cache.kPool(layer);
        this.vPool = cache.vPool(layer);
        this.kPageBytes = cache.kPageBytes(layer);
        this.vPageBytes = cache.vPageBytes(layer);
        this.kRowBytes = cache.kRowBytes(layer);
        this.vRowBytes = cache.vRowBytes(layer);
        this.pageTokens = cache.pageTokens();
        this.kvHeads = cache.geometry().kvHeads();
        this.kFormat = cache.kFormat(layer);
        this.keyMeans = cache.keyMeans(layer);
        this.vFormat = cache.vFormat(layer);
        this.headDimK = cache.geometry().headDimK();
        this.headDimV = cache.geometry().headDimV();
        this.dimK = kFormat.domainDim(headDimK);
        this.dimV = vFormat.domainDim(headDimV);
        this.dpK = roundUp(dimK, Lanes.L);
        this.dpV = roundUp(dimV, Lanes.L);
        if (kDecoderFormat != kFormat || kDecoderDim != headDimK) {
            kDecoder = RowDecoder.of(kFormat, headDimK);
            kDecoderFormat = kFormat;
            kDecoderDim = headDimK;
        }
        if (vDecoderFormat != vFormat || vDecoderDim != headDimV) {
            vDecoder = RowDecoder.of(vFormat, headDimV);
            vDecoderFormat = vFormat;
            vDecoderDim = headDimV;
        }
        this.heads = heads;
        this.group = heads / kvHeads;
        this.start = start;
        this.n = n;
        this.softCap = opts.softCap();
        this.sparseV = opts.sparseV();
        this.selection = null;
        int rows = n * heads;
        int need = (rows + 1) * dpK;
        if (queries.length < need) {
            queries = new float[need];
        }
        zeroQuery = rows * dpK;
        java.util.Arrays.fill(queries, zeroQuery, zeroQuery + dpK, 0f);
    }

    /** Sizes the split-K partials for this many partitions and query slots per kv head. */
    void partials(int parts, int slots) {
        this.parts = parts;
        this.slots = slots;
        int entries = kvHeads * parts * slots;
        if (partMax.length < entries) {
            partMax = new float[entries];
            partSum = new float[entries];
        }
        long accs = (long) entries * dpV;
        if (accs > Integer.MAX_VALUE - 16) {
            throw new IllegalArgumentException("split-K partials of " + accs + " floats do not fit in an array");
        }
        if (partAcc.length < accs) {
            partAcc = new float[(int) accs];
        }
    }

    static int roundUp(int x, int m) {
        return (x + m - 1) / m * m;
    }
}
