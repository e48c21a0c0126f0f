package dev.kvant.kv;

import java.util.Arrays;

/**
 * Per block of {@code blockTokens} consecutive positions and per kv head, the element-wise minimum and maximum of
 * the sequence's cached K rows, as the attention decodes them (so in the rotated domain for rotated formats, and
 * after quantization): what a query-aware selector needs to bound a block's scores without reading its rows.
 *
 * <p>Layout, per layer one float array indexed by logical block b (position / blockTokens), kv head g and
 * component (0 = min, 1 = max): {@code data[((b·kvHeads + g)·2 + component)·dim + d]}, dim =
 * {@code kFormat.domainDim(headDimK)}. A GPU copy keeps the same order so one kernel thread block can stream one kv
 * head's summaries. Blocks at or past the sequence's last written position hold stale values: readers only look at
 * blocks of written positions.
 *
 * <p>Kept up to date by {@link KvSequence#writeRows}: a write recomputes each block it touches from the block's first
 * row up to the sequence's length, so overwrites and writes after a truncation leave exact summaries, never merely
 * loose ones; an append (a write that starts where the layer's summaries are known exact and ends the sequence: a
 * decode step, the next prefill chunk) merges its rows into the block it continues instead.
 *
 * <p>An optional coarse level ({@code coarseTokens} > 0) holds the same for coarse blocks of coarseTokens positions
 * in the same layout ({@link #coarse}, {@link #coarseOffset}), recomputed from the blocks it spans up to the
 * sequence's length: the min and max over the coarse block's rows, so its bound is at least every block's in it.
 */
public final class KeySummaries {
    private final KvSequence seq;
    private final int blockTokens;
    private final int kvHeads;
    private final int headDimK;
    private final int dim;
    private final float[][] data;
    private final float[] row;
    private int capacityBlocks;
    private final int coarseTokens;
    private final float[][] coarse;
    private int capacityCoarse;
    /**
     * Per layer, a position t such that every block holds exactly the min and max of its rows before t (the block
     * of t: of its rows [start, t), and no other): a write that starts at t and ends the sequence (decode's append)
     * merges its rows into the block it continues instead of decoding the block's earlier rows again — min and max
     * give the same bits in any order.
     */
    private final int[] through;

    KeySummaries(KvSequence seq, int blockTokens) {
        this(seq, blockTokens, 0);
    }

    KeySummaries(KvSequence seq, int blockTokens, int coarseTokens) {
        if (blockTokens <= 0) {
            throw new IllegalArgumentException("key summary blocks must hold at least one token, got " + blockTokens);
        }
        if (coarseTokens != 0 && (coarseTokens <= blockTokens || coarseTokens % blockTokens != 0)) {
            throw new IllegalArgumentException("coarse summary blocks must be a multiple (> 1) of " + blockTokens
                    + " tokens, got " + coarseTokens);
        }
        this.coarseTokens = coarseTokens;
        KvCache cache = seq.cache();
        this.seq = seq;
        this.blockTokens = blockTokens;
        this.kvHeads = cache.geometry().kvHeads();
        this.headDimK = cache.geometry().headDimK();
        this.dim = cache.formats().keyDomainDim(headDimK, cache.geometry().layers());
        this.data = new float[cache.geometry().layers()][0];
        this.row = new float[dim];
        this.coarse = new float[coarseTokens == 0 ? 0 : cache.geometry().layers()][0];
        this.through = new int[cache.geometry().layers()];
    }

    /** Positions per coarse block; 0 without a coarse level. */
    public int coarseTokens() {
        return coarseTokens;
    }

    /** The coarse summaries of a layer (the layout of {@link #layer}, by coarse block); read-only for callers. */
    public float[] coarse(int layer) {
        return coarse[layer];
    }

    /** Index in {@link #coarse} of the minimum vector of coarse block j, kv head g; the maximum follows at + dim. */
    public int coarseOffset(int j, int head) {
        return offset(j, head);
    }

    /** Positions per block. */
    public int blockTokens() {
        return blockTokens;
    }

    /** Floats per min or max vector: the K format's domain dimension. */
    public int dim() {
        return dim;
    }

    public int kvHeads() {
        return kvHeads;
    }

    /** The summary array of a layer, in the layout of the class comment; read-only for callers. */
    public float[] layer(int layer) {
        return data[layer];
    }

    /** Index in {@link #layer} of the minimum vector of block b, kv head g; the maximum follows at + dim. */
    public int offset(int block, int head) {
        return (block * kvHeads + head) * 2 * dim;
    }

    /** Blocks holding written positions: ceil(length / blockTokens). */
    public int blocks() {
        return (int) (((long) seq.length() + blockTokens - 1) / blockTokens);
    }

    /** Recomputes every layer's blocks over the positions it holds, [0, its length). */
    void rebuild() {
        for (int l = 0; l < data.length; l++) {
            update(l, 0, seq.layerLength(l));
        }
    }

    /**
     * Makes room for the blocks of positions [0, tokens) before a write stores them, so that the write cannot fail
     * here after its rows went in (a sequence too long for one array is refused before anything changes).
     */
    void reserve(int tokens) {
        ensure((int) (((long) tokens + blockTokens - 1) / blockTokens));
        if (coarseTokens > 0) {
            ensureCoarse((int) (((long) tokens + coarseTokens - 1) / coarseTokens));
        }
    }

    /**
     * Recomputes the blocks of a layer that positions [from, to) fall in, each from its first row up to the
     * layer's length (rows past {@code to} may exist when the write overwrote earlier positions; a layer behind the
     * others holds none past its own length, whatever its pages held before). An append —
     * the write starts where the last update of the layer left the sequence and ends it — only merges its own rows
     * into the block it continues (the block's summary is already that of its rows before {@code from}).
     */
    void update(int layer, int from, int to) {
        if (to <= from) {
            return;
        }
        int length = seq.layerLength(layer);
        int exact = through[layer];
        boolean append = from == exact && to == length;
        int lastBlock = (to - 1) / blockTokens;
        ensure(lastBlock + 1);
        float[] s = data[layer];
        for (int b = from / blockTokens; b <= lastBlock; b++) {
            int p0 = b * blockTokens;
            int p1 = (int) Math.min((long) p0 + blockTokens, length);
            int start = append ? Math.max(p0, from) : p0;
            for (int g = 0; g < kvHeads; g++) {
                int o = offset(b, g);
                if (start == p0) {
                    Arrays.fill(s, o, o + dim, Float.POSITIVE_INFINITY);
                    Arrays.fill(s, o + dim, o + 2 * dim, Float.NEGATIVE_INFINITY);
                }
                for (int p = start; p < p1; p++) {
                    seq.decodeK(layer, p, g, row, 0);
                    for (int d = 0; d < dim; d++) {
                        s[o + d] = Math.min(s[o + d], row[d]);
                        s[o + dim + d] = Math.max(s[o + dim + d], row[d]);
                    }
                }
            }
        }
        if (coarseTokens > 0) {
            updateCoarse(layer, from, to, length);
        }
        // The blocks from the write's on are recomputed up to the length, those before it are as exact as before: with
        // them exact up to the write's block, all is exact up to the length. Otherwise the exact point can only stay
        // or fall, to a block start at most (the write's block may now hold rows past the old point, so the next
        // append must recompute that block rather than merge into it).
        int writeBlock = from - from % blockTokens;
        boolean whole = append || (to == length && exact >= writeBlock);
        through[layer] = whole ? length : Math.min(exact, writeBlock);
    }

    /**
     * The sequence was cut to {@code length} positions: the block holding the cut (and its coarse block) summarized
     * rows past it, so in each layer written up to the cut it is recomputed from its rows below the cut — the
     * summaries stay exact, not merely loose. The exact point for appends falls to the block's start at most.
     */
    void truncated(int length) {
        int blockStart = length - length % blockTokens;
        for (int l = 0; l < through.length; l++) {
            through[l] = Math.min(through[l], blockStart);
            if (seq.layerLength(l) < length) {
                continue;   // a layer behind the cut: its next write recomputes what it touches
            }
            if (length > blockStart) {
                update(l, blockStart, length);   // the cut's block from its first row, and its coarse block
            } else if (coarseTokens > 0 && length % coarseTokens != 0) {
                updateCoarse(l, length - 1, length, length);   // a cut on a block edge inside a coarse block
            }
        }
    }

    /** Recomputes the coarse blocks of positions [from, to) from their blocks of written positions. */
    private void updateCoarse(int layer, int from, int to, int length) {
        int per = coarseTokens / blockTokens;
        int lastCoarse = (to - 1) / coarseTokens;
        ensureCoarse(lastCoarse + 1);
        int written = (length + blockTokens - 1) / blockTokens;
        float[] s = data[layer];
        float[] c = coarse[layer];
        for (int j = from / coarseTokens; j <= lastCoarse; j++) {
            for (int g = 0; g < kvHeads; g++) {
                int o = offset(j, g);
                Arrays.fill(c, o, o + dim, Float.POSITIVE_INFINITY);
                Arrays.fill(c, o + dim, o + 2 * dim, Float.NEGATIVE_INFINITY);
                for (int b = j * per; b < Math.min((j + 1) * per, written); b++) {
                    int f = offset(b, g);
                    for (int d = 0; d < dim; d++) {
                        c[o + d] = Math.min(c[o + d], s[f + d]);
                        c[o + dim + d] = Math.max(c[o + dim + d], s[f + dim + d]);
                    }
                }
            }
        }
    }

    private void ensureCoarse(int blocks) {
        if (blocks <= capacityCoarse) {
            return;
        }
        int cap = grown(blocks, capacityCoarse, 16, coarseTokens);
        long floats = (long) cap * kvHeads * 2 * dim;
        if (floats > Integer.MAX_VALUE - 16) {
            cap = blocks;
            floats = (long) cap * kvHeads * 2 * dim;
        }
        for (int l = 0; l < coarse.length; l++) {
            coarse[l] = Arrays.copyOf(coarse[l], (int) floats);
        }
        capacityCoarse = cap;
    }

    /**
     * The blocks (of tokensPer positions) to make room for when blocks are needed and capacity are held: a quarter
     * more than held (at least least), but never past the blocks of every position the cache can give the sequence,
     * so an array ends within 1.25x of what the sequence wrote, and a sequence that fills its cache holds exactly
     * what {@code Session.summaryBytesPerToken} plans for it. (Doubling ended up to 2x: 600K tokens needed 76.8M
     * floats a layer and took 134.2M.)
     */
    private int grown(int blocks, int capacity, int least, int tokensPer) {
        int limit = (int) (((long) seq.cache().capacityTokens() + tokensPer - 1) / tokensPer);
        long grown = Math.max(least, capacity + (long) capacity / 4);
        return (int) Math.max(blocks, Math.min(limit, grown));
    }

    /** A copy holding the blocks of the first {@code tokens} positions, for a fork of the sequence. */
    KeySummaries copyFor(KvSequence child, int tokens) {
        KeySummaries k = new KeySummaries(child, blockTokens, coarseTokens);
        int blocks = (tokens + blockTokens - 1) / blockTokens;
        k.ensure(blocks);
        int floats = blocks * kvHeads * 2 * dim;
        for (int l = 0; l < data.length; l++) {
            System.arraycopy(data[l], 0, k.data[l], 0, Math.min(floats, data[l].length));
        }
        if (coarseTokens > 0 && tokens > 0) {
            int cblocks = (tokens + coarseTokens - 1) / coarseTokens;
            k.ensureCoarse(cblocks);
            int cfloats = cblocks * kvHeads * 2 * dim;
            for (int l = 0; l < coarse.length; l++) {
                System.arraycopy(coarse[l], 0, k.coarse[l], 0, Math.min(cfloats, coarse[l].length));
            }
            if (tokens % coarseTokens != 0) {
                // the fork's last coarse block may have spanned rows past its prefix in the parent
                for (int l = 0; l < coarse.length; l++) {
                    k.updateCoarse(l, tokens - 1, tokens, tokens);
                }
            }
        }
        if (tokens % blockTokens != 0) {
            // The fork's last block may have held rows past its prefix in the parent.
            for (int l = 0; l < data.length; l++) {
                k.update(l, tokens - 1, tokens);
            }
        }
        Arrays.fill(k.through, tokens);
        return k;
    }

    private void ensure(int blocks) {
        if (blocks <= capacityBlocks) {
            return;
        }
        int cap = grown(blocks, capacityBlocks, 64, blockTokens);
        long floats = (long) cap * kvHeads * 2 * dim;
        if (floats > Integer.MAX_VALUE - 16) {
            cap = blocks;
            floats = (long) cap * kvHeads * 2 * dim;
            if (floats > Integer.MAX_VALUE - 16) {
                throw new IllegalArgumentException("key summaries of " + blocks + " blocks x " + kvHeads
                        + " kv heads x " + 2 * dim + " floats do not fit in one array; use larger --select-page");
            }
        }
        for (int l = 0; l < data.length; l++) {
            data[l] = Arrays.copyOf(data[l], (int) floats);
        }
        capacityBlocks = cap;
    }
}
