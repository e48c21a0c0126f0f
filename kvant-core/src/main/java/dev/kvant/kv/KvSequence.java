package dev.kvant.kv;

import java.util.Arrays;
import java.util.Objects;

/**
 * One sequence's view of a {@link KvCache}: a page table (logical page → physical page id, valid in every layer)
 * and the length written so far. Positions [0, pageCount × pageTokens) have pages; writes reserve pages as needed
 * and copy a shared page before writing into it.
 *
 * <p>Not thread-safe: one thread at a time uses a sequence (different sequences may be used concurrently).
 */
public final class KvSequence implements AutoCloseable {
    private final KvCache cache;
    private final PageAllocator allocator;
    private final int pageTokens;
    private int[] table = new int[4];
    private int pageCount;
    private int length;
    private boolean closed;
    private KeySummaries summaries;
    /** Centered K rows on their way to the encoder (K formats with page means). */
    private float[] scratch = new float[0];
    /** A page's key mean in K's domain, for {@link #decodeK}. */
    private float[] domainMean = new float[0];
    /** Per layer, the length written in it (layers are written one after another: a page is fresh per layer). */
    private final int[] layerLength;
    /** The means of the page being written, as halves read back. */
    private float[] mean = new float[0];

    KvSequence(KvCache cache) {
        this.cache = cache;
        this.allocator = cache.allocator;
        this.pageTokens = cache.pageTokens();
        this.layerLength = new int[cache.geometry().layers()];
    }

    /** Tokens written so far: the largest written position + 1 (or the fork's prefix, or the truncated length). */
    public int length() {
        return length;
    }

    /** Whether {@link #close} ran. */
    public boolean isClosed() {
        return closed;
    }

    /** How far a layer has been written (its rows [0, this) hold data). */
    public int layerLength(int layer) {
        return layerLength[layer];
    }

    /** Pages in the page table. */
    public int pageCount() {
        return pageCount;
    }

    /** The pages of the table, in order (a copy); {@link KvCache#refCount} says how many sequences hold each. */
    public int[] pageIds() {
        synchronized (allocator) {
            return java.util.Arrays.copyOf(table, pageCount);
        }
    }

    public KvCache cache() {
        return cache;
    }

    /**
     * Ensures pages for positions [0, tokens), and private copies of the shared pages that the positions from the
     * length on fall in (the ones a write of [length, tokens) will change): a batch that reserves every member's
     * pages before writing any fails before it writes, never half way.
     *
     * @throws KvCacheFullException when the free pages do not suffice; nothing is allocated then
     */
    public void reserve(int tokens) {
        checkOpen();
        if (tokens < 0) {
            throw new IllegalArgumentException("cannot reserve a negative number of tokens: " + tokens);
        }
        synchronized (allocator) {
            prepare(tokens, Math.min(length, tokens));
        }
    }

    /** Writes all kv heads of one token: k is [kvHeads][headDimK], v is [kvHeads][headDimV], both unrotated. */
    public void write(int layer, int pos, float[] k, int kOff, float[] v, int vOff) {
        writeRows(layer, pos, 1, k, kOff, v, vOff);
    }

    /**
     * Writes n consecutive tokens from pos: k is [n][kvHeads][headDimK], v is [n][kvHeads][headDimV]. The bytes
     * equal those of n single {@link #write}s, except with a {@link PageMeanFormat} K format, whose pages take
     * their means from the write that opens them (so a prefill chunk and single-token steps center a page
     * differently; after a truncation into a page, the page keeps the mean it got).
     *
     * @throws KvCacheFullException when pages for [0, pos+n) (or copies of shared pages in range) do not fit;
     *                              nothing is written or allocated then
     * @throws IllegalArgumentException when pos is past the tokens the layer holds (a gap)
     */
    public void writeRows(int layer, int pos, int n, float[] k, int kOff, float[] v, int vOff) {
        checkOpen();
        KvGeometry g = cache.geometry();
        Objects.checkIndex(layer, g.layers());
        if (pos < 0 || n < 0) {
            throw new IllegalArgumentException("write of " + n + " tokens at position " + pos);
        }
        if (pos > layerLength[layer]) {
            // the rows between would be read as written: whatever an earlier sequence left in those pages
            throw new IllegalArgumentException("write at position " + pos + " of layer " + layer + ", which holds "
                    + layerLength[layer] + " tokens: rows are written in order, without gaps");
        }
        if (n == 0) {
            return;
        }
        int kRow = g.kvHeads() * g.headDimK();
        int vRow = g.kvHeads() * g.headDimV();
        Objects.checkFromIndexSize(kOff, Math.multiplyExact(n, kRow), k.length);
        Objects.checkFromIndexSize(vOff, Math.multiplyExact(n, vRow), v.length);
        int end = Math.addExact(pos, n);
        if (summaries != null) {
            summaries.reserve(end);   // before anything is written: its one failure (too many blocks) changes nothing
        }
        synchronized (allocator) {
            prepare(end, pos);
        }
        KvFormat kf = cache.kFormat(layer);
        KvFormat vf = cache.vFormat(layer);
        int before = layerLength[layer];
        for (int t = pos; t < end; ) {
            int page = table[t / pageTokens];
            int inPage = t % pageTokens;
            int span = Math.min(end - t, pageTokens - inPage);
            int done = t - pos;
            if (cache.keyMeans(layer)) {
                kf.encodeDomainRows(centered(layer, t / pageTokens, before, k, kOff + done * kRow, span), 0,
                        span * g.kvHeads(), g.headDimK(), cache.kPool(layer),
                        page * cache.kPageBytes(layer) + cache.kRowOffset(layer, inPage, 0), cache.kRowBytes(layer));
            } else {
                kf.encodeRows(k, kOff + done * kRow, span * g.kvHeads(), g.headDimK(), cache.kPool(layer),
                        page * cache.kPageBytes(layer) + cache.kRowOffset(layer, inPage, 0), cache.kRowBytes(layer));
            }
            vf.encodeRows(v, vOff + done * vRow, span * g.kvHeads(), g.headDimV(), cache.vPool(layer),
                    page * cache.vPageBytes(layer) + cache.vRowOffset(layer, inPage, 0), cache.vRowBytes(layer));
            t += span;
        }
        length = Math.max(length, end);
        layerLength[layer] = Math.max(before, end);
        if (summaries != null) {
            summaries.update(layer, pos, end);
        }
    }

    /**
     * The span K rows from {@code k[kAt..]} (positions from some in logical page lp) in K's domain minus their
     * page's mean, in scratch (rows of domainDim floats); the page gets its mean first if this write opens it in
     * this layer — holds none of its rows yet: its start at or past {@code before}, the layer's length before the
     * write.
     */
    private float[] centered(int layer, int lp, int before, float[] k, int kAt, int span) {
        KvGeometry g = cache.geometry();
        KvFormat kf = cache.kFormat(layer);
        int d = g.headDimK();
        int dom = kf.domainDim(d);
        int heads = g.kvHeads();
        int rows = span * heads;
        if (scratch.length < rows * dom) {
            scratch = new float[rows * dom];
        }
        if (mean.length < heads * dom) {
            mean = new float[heads * dom];
        }
        for (int r = 0; r < rows; r++) {
            System.arraycopy(k, kAt + r * d, scratch, r * dom, d);
            kf.rotate(scratch, r * dom, d);
        }
        int page = table[lp];
        int pageStart = lp * pageTokens;
        if (pageStart >= before) {
            pageMean(layer, lp, pageStart == before, span, mean);
            for (int h = 0; h < heads; h++) {
                cache.setKeyMean(layer, page, h, mean, h * dom);
            }
        }
        for (int h = 0; h < heads; h++) {
            cache.keyMean(layer, page, h, mean, h * dom);   // the halves, as readers add them back
        }
        for (int r = 0; r < rows; r++) {
            int m = (r % heads) * dom;
            for (int i = 0; i < dom; i++) {
                scratch[r * dom + i] -= mean[m + i];
            }
        }
        return scratch;
    }

    /**
     * The mean, in K's domain, that a page lp this write opens gets, from the write's span rows in it (in scratch,
     * rotated): their own mean when they are at least a quarter of a page; else none (0) for the first page; else,
     * when the write starts at the page ({@code atStart}), the mean of the previous page's keys as stored (decoded,
     * its mean added back); else (the previous page is being written too) their own mean. Sums run over the rows in
     * order, one float per value; a value that is not finite adds 0, so a NaN or infinite key stays in its own row
     * instead of making the page's mean (every row of the page, and each page opened after it) non-finite. The same
     * rule on every backend.
     */
    private static float finite(float v) {
        return Float.isFinite(v) ? v : 0f;
    }

    private void pageMean(int layer, int lp, boolean atStart, int span, float[] mean) {
        KvGeometry g = cache.geometry();
        KvFormat kf = cache.kFormat(layer);
        int d = g.headDimK();
        int dom = kf.domainDim(d);
        int heads = g.kvHeads();
        Arrays.fill(mean, 0, heads * dom, 0f);
        if (4 * span >= pageTokens || lp > 0 && !atStart) {
            for (int r = 0; r < span; r++) {
                for (int h = 0; h < heads; h++) {
                    for (int i = 0; i < dom; i++) {
                        mean[h * dom + i] += finite(scratch[(r * heads + h) * dom + i]);
                    }
                }
            }
            for (int i = 0; i < heads * dom; i++) {
                mean[i] /= span;
            }
        } else if (lp > 0) {
            int prev = table[lp - 1];
            float[] row = new float[dom];
            float[] prevMean = new float[dom];
            for (int h = 0; h < heads; h++) {
                for (int t = 0; t < pageTokens; t++) {
                    kf.decode(cache.kPool(layer), prev * cache.kPageBytes(layer) + cache.kRowOffset(layer, t, h), d,
                            row, 0);
                    for (int i = 0; i < dom; i++) {
                        mean[h * dom + i] += finite(row[i]);
                    }
                }
                cache.keyMean(layer, prev, h, prevMean, 0);
                for (int i = 0; i < dom; i++) {
                    mean[h * dom + i] = mean[h * dom + i] / pageTokens + prevMean[i];
                }
            }
        }
    }

    /**
     * Turns on per-block key summaries (min and max of the K rows per block and kv head, see {@link KeySummaries})
     * and returns them: built from the rows written so far, then kept up to date by every write. Calling it again
     * with the same block size returns the same summaries; another size rebuilds them.
     */
    public KeySummaries enableKeySummaries(int blockTokens) {
        return enableKeySummaries(blockTokens, 0);
    }

    /**
     * As {@link #enableKeySummaries(int)} with a coarse level of {@code coarseTokens} positions per block (0: none),
     * the min and max over each coarse block's rows ({@link KeySummaries#coarse}).
     */
    public KeySummaries enableKeySummaries(int blockTokens, int coarseTokens) {
        checkOpen();
        if (summaries == null || summaries.blockTokens() != blockTokens || summaries.coarseTokens() != coarseTokens) {
            summaries = new KeySummaries(this, blockTokens, coarseTokens);
            summaries.rebuild();
        }
        return summaries;
    }

    /** The key summaries, or null when {@link #enableKeySummaries} was never called. */
    public KeySummaries keySummaries() {
        return summaries;
    }

    /**
     * Gives this sequence pages for [0, tokens) and private copies of the shared pages that positions
     * [writeFrom, tokens) fall in; all or nothing. Caller holds the allocator's lock.
     */
    private void prepare(int tokens, int writeFrom) {
        int needed = (int) (((long) tokens + pageTokens - 1) / pageTokens);
        int fresh = Math.max(0, needed - pageCount);
        int firstWritten = writeFrom < tokens ? writeFrom / pageTokens : needed;
        int copies = copiesFor(tokens, writeFrom);
        if (fresh + copies > allocator.free()) {
            int fits = (int) Math.min((long) (pageCount + allocator.free() - copies) * pageTokens, Integer.MAX_VALUE);
            throw new KvCacheFullException("KV cache full: the sequence needs pages for " + tokens + " tokens ("
                    + fresh + " new page(s)" + (copies > 0 ? " and " + copies + " copy-on-write page(s)" : "")
                    + " of " + pageTokens + " tokens) but " + allocator.free() + " of " + allocator.total()
                    + " pages are free, so it fits " + Math.max(fits, length) + " tokens", tokens,
                    Math.max(fits, length));
        }
        for (int p = firstWritten; p < Math.min(needed, pageCount); p++) {
            int old = table[p];
            if (allocator.refCount(old) > 1) {
                int copy = allocator.allocate();
                cache.copyPage(old, copy, pageTokens);
                allocator.release(old);
                table[p] = copy;
            }
        }
        while (pageCount < needed) {
            append(allocator.allocate());
        }
    }

    /** The copy-on-write pages {@link #prepare}(tokens, writeFrom) would copy. Caller holds the allocator's lock. */
    private int copiesFor(int tokens, int writeFrom) {
        int needed = (int) (((long) tokens + pageTokens - 1) / pageTokens);
        int firstWritten = writeFrom < tokens ? writeFrom / pageTokens : needed;
        int copies = 0;
        for (int p = firstWritten; p < Math.min(needed, pageCount); p++) {
            if (allocator.refCount(table[p]) > 1) {
                copies++;
            }
        }
        return copies;
    }

    /** The free pages {@link #reserve}(tokens) would take: new pages and copies. Caller holds the allocator's lock. */
    private int pagesFor(int tokens) {
        int needed = (int) (((long) tokens + pageTokens - 1) / pageTokens);
        return Math.max(0, needed - pageCount) + copiesFor(tokens, Math.min(length, tokens));
    }

    /**
     * {@link #reserve} for several sequences of one cache at once, all or nothing: when the free pages cannot hold
     * what they all need, a {@link KvCacheFullException} and no page taken, none copied. (A page two of them share
     * is counted for each: the check may refuse a batch that would just fit, never pass one that does not.)
     */
    public static void reserveAll(KvSequence[] seqs, int[] tokens) {
        if (seqs.length == 0) {
            return;
        }
        PageAllocator allocator = seqs[0].allocator;
        for (int i = 0; i < seqs.length; i++) {
            seqs[i].checkOpen();
            if (seqs[i].allocator != allocator) {
                throw new IllegalArgumentException("sequence " + i + " belongs to another cache");
            }
            if (tokens[i] < 0) {
                throw new IllegalArgumentException("cannot reserve a negative number of tokens: " + tokens[i]);
            }
        }
        synchronized (allocator) {
            long need = 0;
            int first = -1;      // the first sequence whose pages do not fit after those of the ones before it
            long before = 0;
            for (int i = 0; i < seqs.length; i++) {
                need += seqs[i].pagesFor(tokens[i]);
                if (first < 0 && need > allocator.free()) {
                    first = i;
                } else if (first < 0) {
                    before = need;
                }
            }
            if (first >= 0) {
                // its numbers: what it asked for, and what it could reach with the pages the ones before it leave
                KvSequence s = seqs[first];
                long left = Math.max(0, allocator.free() - before);
                int fits = (int) Math.min(Math.max(s.length,
                        (s.pageCount + left - s.copiesFor(tokens[first], Math.min(s.length, tokens[first]))) * s.pageTokens), Integer.MAX_VALUE);
                throw new KvCacheFullException("KV cache full: a step of " + seqs.length + " sequences needs " + need
                        + " page(s) but " + allocator.free() + " of " + allocator.total() + " are free (sequence "
                        + first + " of the step is the first that does not fit)", tokens[first], fits);
            }
            for (int i = 0; i < seqs.length; i++) {
                seqs[i].prepare(tokens[i], Math.min(seqs[i].length, tokens[i]));
            }
        }
    }

    private void append(int page) {
        if (pageCount == table.length) {
            table = Arrays.copyOf(table, table.length * 2);
        }
        table[pageCount++] = page;
    }

    /** Drops the tokens from length on; pages wholly past it go back to the cache. */
    public void truncate(int length) {
        checkOpen();
        if (length < 0 || length > this.length) {
            throw new IllegalArgumentException("cannot truncate a sequence of " + this.length + " tokens to " + length);
        }
        int keep = (int) (((long) length + pageTokens - 1) / pageTokens);
        synchronized (allocator) {
            while (pageCount > keep) {
                allocator.release(table[--pageCount]);
            }
        }
        this.length = length;
        for (int l = 0; l < layerLength.length; l++) {
            layerLength[l] = Math.min(layerLength[l], length);
        }
        if (summaries != null) {
            summaries.truncated(length);
        }
    }

    /** The physical page id of a logical page. */
    public int page(int logicalPage) {
        Objects.checkIndex(logicalPage, pageCount);
        return table[logicalPage];
    }

    /**
     * Dequantizes the K row of one head at pos into {@code dst[off, off+kFormat(layer).domainDim(headDimK))}, its page's
     * mean added back with a {@link PageMeanFormat}.
     */
    public void decodeK(int layer, int pos, int head, float[] dst, int off) {
        checkRead(layer, pos, head);
        int page = table[pos / pageTokens];
        int d = cache.geometry().headDimK();
        cache.kFormat(layer).decode(cache.kPool(layer),
                page * cache.kPageBytes(layer) + cache.kRowOffset(layer, pos % pageTokens, head), d, dst, off);
        if (cache.keyMeans(layer)) {
            int dom = cache.kFormat(layer).domainDim(d);
            if (domainMean.length < dom) {
                domainMean = new float[dom];
            }
            cache.keyMean(layer, page, head, domainMean, 0);
            for (int i = 0; i < dom; i++) {
                dst[off + i] += domainMean[i];
            }
        }
    }

    public void decodeV(int layer, int pos, int head, float[] dst, int off) {
        checkRead(layer, pos, head);
        int page = table[pos / pageTokens];
        cache.vFormat(layer).decode(cache.vPool(layer),
                page * cache.vPageBytes(layer) + cache.vRowOffset(layer, pos % pageTokens, head),
                cache.geometry().headDimV(), dst, off);
    }

    private void checkRead(int layer, int pos, int head) {
        checkOpen();
        Objects.checkIndex(layer, cache.geometry().layers());
        Objects.checkIndex(head, cache.geometry().kvHeads());
        if (pos < 0 || pos >= layerLength[layer]) {
            throw new IndexOutOfBoundsException("position " + pos + " is outside the " + layerLength[layer]
                    + " tokens layer " + layer + " holds (the sequence's " + length + ")");
        }
    }

    KvSequence fork(int prefixTokens) {
        checkOpen();
        if (prefixTokens < 0 || prefixTokens > length) {
            throw new IllegalArgumentException("cannot fork a prefix of " + prefixTokens + " tokens from a sequence of "
                    + length);
        }
        int shared = prefixTokens / pageTokens;
        int partial = prefixTokens % pageTokens;
        KvSequence child = new KvSequence(cache);
        try {
            synchronized (allocator) {
                if (partial > 0 && allocator.free() == 0) {
                    throw new KvCacheFullException("KV cache full: forking a prefix of " + prefixTokens
                            + " tokens needs a free page to copy the page it ends in; none of " + allocator.total()
                            + " is free, so only " + shared * pageTokens + " tokens can be forked", prefixTokens,
                            shared * pageTokens);
                }
                for (int p = 0; p < shared; p++) {
                    allocator.retain(table[p]);
                    child.append(table[p]);
                }
                if (partial > 0) {
                    int copy = allocator.allocate();
                    child.append(copy);
                    cache.copyPage(table[shared], copy, partial);
                }
            }
            child.length = prefixTokens;
            for (int l = 0; l < layerLength.length; l++) {
                child.layerLength[l] = Math.min(layerLength[l], prefixTokens);
            }
            if (summaries != null) {
                child.summaries = summaries.copyFor(child, prefixTokens);
            }
        } catch (RuntimeException | Error e) {
            child.close();   // gives back what the child holds so far: no page stays retained or allocated
            throw e;
        }
        return child;
    }

    /** Returns the sequence's pages (dropping its share of shared ones); idempotent. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        synchronized (allocator) {
            while (pageCount > 0) {
                allocator.release(table[--pageCount]);
            }
        }
        length = 0;
        closed = true;
    }

    private void checkOpen() {
        if (closed) {
            throw new IllegalStateException("KV sequence is closed");
        }
    }
}
