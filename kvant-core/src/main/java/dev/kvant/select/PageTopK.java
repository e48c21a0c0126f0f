package dev.kvant.select;

import dev.kvant.kv.KeySummaries;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.tensor.Parallel;

import java.util.Arrays;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorSpecies;

/**
 * Query-aware block selection (Quest-style): per block of the cache and kv head, the key summaries (element-wise
 * min and max) give an upper bound on the score of any key in the block for a query q,
 * {@code Σ_d max(q_d·min_d, q_d·max_d)}; a block's score is the largest bound over the queries of the query block
 * and the query heads of the kv head's GQA group (a block matters if any head may attend to it). Under the token
 * budget, after the always-attended sink blocks, recent blocks and the queries' own blocks, the blocks with the
 * highest scores are taken; ties go to the lower block index. Lists come out ascending. With a coarse level
 * ({@link SelectionConfig#coarseTokens}) and more coarse candidates than {@code coarseKeep} (the coarse blocks
 * meeting the candidates), only the blocks of the coarseKeep best of them (same bound over coarse summaries, same
 * tie rule) compete: a step then bounds context / coarseTokens coarse blocks and about coarseKeep · coarseTokens /
 * blockTokens blocks, whatever the context. One exception keeps the choice causal: where the recent window is
 * shorter than a coarse block, the coarse block it cuts can reach the queries' own rows, and its summary then
 * covers rows at or after them (in a prefill chunk, rows written before the chunk's queries select); such a block
 * is not ranked, and its blocks below the window always compete (one coarse block's more).
 *
 * <p>The bound is computed in float as {@code Σ_d (max(q_d,0)·max_d + min(q_d,0)·min_d)} (equal to the definition
 * in exact arithmetic), with fmas in dimension order per lane and the lanes summed in lane order, so the same query
 * and cache give the same scores, and the same selection, on every run and thread count.
 *
 * <p>Thread-safe for distinct output selections: scratch is per thread.
 */
public final class PageTopK {
    private static final VectorSpecies<Float> F = FloatVector.SPECIES_PREFERRED;
    private static final int L = F.length();
    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    private final SelectionConfig config;

    public PageTopK(SelectionConfig config) {
        this.config = config;
    }

    public SelectionConfig config() {
        return config;
    }

    /**
     * Selects blocks for the n queries at positions start .. start+n-1 of a layer into out. The sequence's key
     * summaries must be on ({@link KvSequence#enableKeySummaries}) with this config's block size, and must cover
     * the queries' own positions.
     *
     * @param q queries [n][heads][headDimK], unrotated (as attention takes them)
     */
    public void select(KvSequence seq, int layer, float[] q, int n, int start, int heads, Selection out,
                       Parallel pool) {
        KeySummaries ks = seq.keySummaries();
        int b = config.blockTokens();
        if (ks == null || ks.blockTokens() != b || ks.coarseTokens() != config.coarseTokens()) {
            throw new IllegalStateException("page selection over blocks of " + b + " (coarse "
                    + config.coarseTokens() + ") needs the sequence's key summaries for that size: call"
                    + " enableKeySummaries(" + b + ", " + config.coarseTokens() + ") first");
        }
        if (start + n > seq.layerLength(layer)) {
            throw new IllegalArgumentException("selection for positions " + start + ".." + (start + n - 1)
                    + " but layer " + layer + " holds " + seq.layerLength(layer) + " positions");
        }
        int kvHeads = ks.kvHeads();
        out.reset(b, kvHeads, start, n);
        Prepared p = prepared(seq, layer, q, n, heads, ks.dim());
        int tasks = out.queryBlocks() * kvHeads;
        boolean[] full = new boolean[tasks];
        if (tasks == 1) {
            full[0] = selectOne(ks, layer, p, out, 0, 0, heads);
        } else {
            pool.forEach(tasks, t -> full[t] = selectOne(ks, layer, p, out, t / kvHeads, t % kvHeads, heads));
        }
        boolean all = true;
        for (boolean f : full) {
            all &= f;
        }
        out.setAll(all);
    }

    /** Queries rotated into K's domain, split into their positive and negative parts. */
    private record Prepared(float[] pos, float[] neg, int dim, int group) {
    }

    private Prepared prepared(KvSequence seq, int layer, float[] q, int n, int heads, int dim) {
        KvFormat kf = seq.cache().kFormat(layer);
        int headDim = seq.cache().geometry().headDimK();
        int kvHeads = seq.cache().geometry().kvHeads();
        float[] pos = new float[n * heads * dim];
        float[] neg = new float[n * heads * dim];
        float[] row = new float[dim];
        for (int r = 0; r < n * heads; r++) {
            System.arraycopy(q, r * headDim, row, 0, headDim);
            kf.rotate(row, 0, headDim);
            for (int d = 0; d < dim; d++) {
                pos[r * dim + d] = Math.max(row[d], 0f);
                neg[r * dim + d] = Math.min(row[d], 0f);
            }
        }
        return new Prepared(pos, neg, dim, heads / kvHeads);
    }

    /** Fills the list of (qb, g); true when it holds every visible block. */
    private boolean selectOne(KeySummaries ks, int layer, Prepared p, Selection out, int qb, int g, int heads) {
        int bt = config.blockTokens();
        int t0 = qb * Selection.QUERY_BLOCK;
        int t1 = Math.min(out.n(), t0 + Selection.QUERY_BLOCK);
        int first = out.start() + t0;
        int visible = (out.start() + t1 + bt - 1) / bt;
        int sink = Math.min(visible, config.sinkBlocks());
        int recentFrom = Math.max(sink, first / bt - config.recentBlocks());
        int always = sink + (visible - recentFrom);
        int candidates = recentFrom - sink;
        int k = Math.max(0, config.budget() / bt - always);
        int[] list = out.blocks();
        int o = out.offset(qb, g);
        if (k >= candidates) {
            for (int b = 0; b < visible; b++) {
                list[o + b] = b;
            }
            out.setCount(qb, g, visible);
            return true;
        }
        int c = 0;
        for (int b = 0; b < sink; b++) {
            list[o + c++] = b;
        }
        if (k > 0) {
            Scratch s = SCRATCH.get();
            float[] sum = ks.layer(layer);
            int dim = p.dim();
            int nq = (t1 - t0) * p.group();
            int[] qo = s.queries(nq);
            for (int t = t0, i = 0; t < t1; t++) {
                for (int h = g * p.group(); h < (g + 1) * p.group(); h++) {
                    qo[i++] = (t * heads + h) * dim;
                }
            }
            int per = config.coarseBlocks();
            int j0 = per == 0 ? 0 : sink / per;
            // The coarse blocks meeting the candidates are ranked, but for the one the recent window cuts when its
            // rows reach the queries' own (a short recent window): its summary then covers rows at and after them
            // (a prefill chunk's later rows are written before its queries select), so it is not ranked and its
            // blocks always compete — which keeps the choice causal.
            int jEnd = per == 0 ? 0 : recentFrom / per;
            boolean reaches = per > 0 && jEnd * per < recentFrom && (long) (jEnd + 1) * per * bt > first;
            int jRank = per == 0 || reaches || jEnd * per == recentFrom ? jEnd : jEnd + 1;
            int coarseCandidates = Math.max(0, jRank - j0);
            long[] keys = s.keys(candidates);
            int n = 0;
            if (coarseCandidates > config.coarseKeep()) {
                // two rounds: the coarseKeep best coarse blocks, then their blocks between the windows (and those of
                // a cut coarse block that reaches the queries) compete
                int keep = config.coarseKeep();
                long[] ckeys = s.coarseKeys(coarseCandidates);
                float[] csum = ks.coarse(layer);
                for (int j = j0; j < jRank; j++) {
                    ckeys[j - j0] = key(best(p.pos(), p.neg(), qo, nq, csum, ks.coarseOffset(j, g), dim, s.lanes), j);
                }
                smallest(ckeys, coarseCandidates, keep);
                int[] kept = s.picked(keep);
                for (int i = 0; i < keep; i++) {
                    kept[i] = (int) ckeys[i];
                }
                Arrays.sort(kept, 0, keep);
                for (int i = 0; i < keep; i++) {
                    for (int b = Math.max(sink, kept[i] * per); b < Math.min(recentFrom, (kept[i] + 1) * per); b++) {
                        keys[n++] = key(best(p.pos(), p.neg(), qo, nq, sum, ks.offset(b, g), dim, s.lanes), b);
                    }
                }
                for (int b = reaches ? Math.max(sink, jEnd * per) : recentFrom; b < recentFrom; b++) {
                    keys[n++] = key(best(p.pos(), p.neg(), qo, nq, sum, ks.offset(b, g), dim, s.lanes), b);
                }
            } else {
                for (int b = sink; b < recentFrom; b++) {
                    keys[n++] = key(best(p.pos(), p.neg(), qo, nq, sum, ks.offset(b, g), dim, s.lanes), b);
                }
            }
            int take = Math.min(k, n);
            smallest(keys, n, take);
            int[] picked = s.picked(take);
            for (int i = 0; i < take; i++) {
                picked[i] = (int) keys[i];
            }
            Arrays.sort(picked, 0, take);
            System.arraycopy(picked, 0, list, o + c, take);
            c += take;
        }
        for (int b = recentFrom; b < visible; b++) {
            list[o + c++] = b;
        }
        out.setCount(qb, g, c);
        return false;
    }

    /**
     * The largest upper bound of q·k over a block for the nq queries at pos/neg[qo[i]]: per query
     * Σ_d pos_d·max_d + neg_d·min_d, summaries at sum[so] (min) and sum[so + dim] (max). Four queries share each
     * load of the summaries; every query's sum is the same chain of fmas (dimension order, per lane) and the same
     * lane order whichever pass computes it.
     */
    static float best(float[] pos, float[] neg, int[] qo, int nq, float[] sum, int so, int dim, float[] lanes) {
        float best = Float.NEGATIVE_INFINITY;
        int mx = so + dim;
        int vdim = dim - dim % L;
        int i = 0;
        for (; i + 4 <= nq; i += 4) {
            int q0 = qo[i], q1 = qo[i + 1], q2 = qo[i + 2], q3 = qo[i + 3];
            FloatVector a0 = FloatVector.zero(F), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < vdim; d += L) {
                FloatVector hi = FloatVector.fromArray(F, sum, mx + d);
                FloatVector lo = FloatVector.fromArray(F, sum, so + d);
                a0 = FloatVector.fromArray(F, pos, q0 + d).fma(hi, a0);
                a1 = FloatVector.fromArray(F, pos, q1 + d).fma(hi, a1);
                a2 = FloatVector.fromArray(F, pos, q2 + d).fma(hi, a2);
                a3 = FloatVector.fromArray(F, pos, q3 + d).fma(hi, a3);
                a0 = FloatVector.fromArray(F, neg, q0 + d).fma(lo, a0);
                a1 = FloatVector.fromArray(F, neg, q1 + d).fma(lo, a1);
                a2 = FloatVector.fromArray(F, neg, q2 + d).fma(lo, a2);
                a3 = FloatVector.fromArray(F, neg, q3 + d).fma(lo, a3);
            }
            a0.intoArray(lanes, 0);
            a1.intoArray(lanes, L);
            a2.intoArray(lanes, 2 * L);
            a3.intoArray(lanes, 3 * L);
            float s0 = 0f, s1 = 0f, s2 = 0f, s3 = 0f;
            for (int l = 0; l < L; l++) {
                s0 += lanes[l];
                s1 += lanes[L + l];
                s2 += lanes[2 * L + l];
                s3 += lanes[3 * L + l];
            }
            best = Math.max(best, Math.max(Math.max(tail(pos, neg, q0, sum, so, dim, vdim, s0),
                    tail(pos, neg, q1, sum, so, dim, vdim, s1)), Math.max(tail(pos, neg, q2, sum, so, dim, vdim, s2),
                    tail(pos, neg, q3, sum, so, dim, vdim, s3))));
        }
        for (; i < nq; i++) {
            int q0 = qo[i];
            FloatVector a0 = FloatVector.zero(F);
            for (int d = 0; d < vdim; d += L) {
                a0 = FloatVector.fromArray(F, pos, q0 + d).fma(FloatVector.fromArray(F, sum, mx + d), a0);
                a0 = FloatVector.fromArray(F, neg, q0 + d).fma(FloatVector.fromArray(F, sum, so + d), a0);
            }
            a0.intoArray(lanes, 0);
            float s0 = 0f;
            for (int l = 0; l < L; l++) {
                s0 += lanes[l];
            }
            best = Math.max(best, tail(pos, neg, q0, sum, so, dim, vdim, s0));
        }
        return best;
    }

    /** The dimensions past the last whole vector, scalar, after the vector part's sum. */
    private static float tail(float[] pos, float[] neg, int q, float[] sum, int so, int dim, int from, float total) {
        for (int d = from; d < dim; d++) {
            total = Math.fma(pos[q + d], sum[so + dim + d], total);
            total = Math.fma(neg[q + d], sum[so + d], total);
        }
        return total;
    }

    /**
     * A long whose ascending order is descending score, then ascending block: the score's bits made monotone as a
     * signed int and complemented, above the block index. A NaN score (a NaN in the query or in the block's keys)
     * comes first whatever its sign: the block is kept, as dense attention would show the NaN (select.cu's rule).
     */
    static long key(float score, int block) {
        int bits = Float.floatToRawIntBits(score);
        int ordered = score != score ? Integer.MAX_VALUE : bits >= 0 ? bits : bits ^ 0x7fffffff;
        return ((long) ~ordered << 32) | block;
    }

    /** Moves the k smallest of keys[0, n) (distinct values) to keys[0, k), in no particular order: quickselect. */
    static void smallest(long[] keys, int n, int k) {
        int lo = 0;
        int hi = n - 1;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            long a = keys[lo];
            long b = keys[mid];
            long c = keys[hi];
            long pivot = Math.max(Math.min(a, b), Math.min(Math.max(a, b), c));
            int i = lo;
            int j = hi;
            while (i <= j) {
                while (keys[i] < pivot) {
                    i++;
                }
                while (keys[j] > pivot) {
                    j--;
                }
                if (i <= j) {
                    long t = keys[i];
                    keys[i] = keys[j];
                    keys[j] = t;
                    i++;
                    j--;
                }
            }
            // [lo, j] ≤ pivot ≤ [i, hi]; k-1 is the index to settle.
            if (k - 1 <= j) {
                hi = j;
            } else if (k - 1 >= i) {
                lo = i;
            } else {
                return;
            }
        }
    }

    private static final class Scratch {
        long[] keys = new long[0];
        int[] picked = new int[0];
        int[] queries = new int[0];
        final float[] lanes = new float[4 * L];

        long[] coarseKeys = new long[0];

        long[] coarseKeys(int n) {
            if (coarseKeys.length < n) {
                coarseKeys = new long[Math.max(n, 2 * coarseKeys.length)];
            }
            return coarseKeys;
        }

        int[] queries(int n) {
            if (queries.length < n) {
                queries = new int[n];
            }
            return queries;
        }

        long[] keys(int n) {
            if (keys.length < n) {
                keys = new long[Math.max(n, 2 * keys.length)];
            }
            return keys;
        }

        int[] picked(int n) {
            if (picked.length < n) {
                picked = new int[Math.max(n, 2 * picked.length)];
            }
            return picked;
        }
    }
}
