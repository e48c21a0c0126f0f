package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;

import java.util.SplittableRandom;

/**
 * One layer's attention inputs drawn at random, for the parity tool, the benchmark and the tests: a cache of one
 * layer holding start + n positions written through {@link KvSequence#writeRows} (so every format quantizes them
 * as it would in a model), and n tokens' queries. Keys and queries are Gaussian with two RoPE-style channel pairs
 * scaled ×4, like the outlier channels of real keys, so scores have a realistic spread (soft but not flat
 * attention) and block scales see outliers.
 */
public final class AttentionProblem implements AutoCloseable {
    private static final int WRITE_CHUNK = 512;

    private final KvCache cache;
    private final KvSequence seq;
    private final float[] queries;
    private final int n;
    private final int start;
    private final int heads;
    private final float scale;

    private AttentionProblem(KvCache cache, KvSequence seq, float[] queries, int n, int start, int heads) {
        this.cache = cache;
        this.seq = seq;
        this.queries = queries;
        this.n = n;
        this.start = start;
        this.heads = heads;
        this.scale = (float) (1 / Math.sqrt(cache.geometry().headDimK()));
    }

    /**
     * @param start positions before the first query token; the cache holds start + n positions
     * @param group query heads per kv head
     */
    public static AttentionProblem random(KvFormat k, KvFormat v, int kvHeads, int group, int headDimK, int headDimV,
                                          int start, int n, int pageTokens, long seed) {
        return random(k, v, kvHeads, group, headDimK, headDimV, start, n, pageTokens, seed, Integer.MAX_VALUE);
    }

    /**
     * As above, but only the first {@code distinct} positions (rounded up to a write chunk) are drawn; later ones
     * repeat them. For benchmarks over long caches, where drawing every value would take longer than the runs.
     */
    public static AttentionProblem random(KvFormat k, KvFormat v, int kvHeads, int group, int headDimK, int headDimV,
                                          int start, int n, int pageTokens, long seed, int distinct) {
        if (start < 0 || n < 1) {
            throw new IllegalArgumentException("need start >= 0 and at least one query token, got start=" + start
                    + " n=" + n);
        }
        if ((long) start + n > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("a cache of " + start + " + " + n + " positions does not fit an int");
        }
        int total = start + n;
        int chunk = Math.min(WRITE_CHUNK, total);
        int heads;
        int kFloats;
        int vFloats;
        int qFloats;
        try {
            heads = Math.multiplyExact(kvHeads, group);
            kFloats = Math.multiplyExact(Math.multiplyExact(chunk, kvHeads), headDimK);
            vFloats = Math.multiplyExact(Math.multiplyExact(chunk, kvHeads), headDimV);
            qFloats = Math.multiplyExact(Math.multiplyExact(n, heads), headDimK);
            Math.multiplyExact(Math.multiplyExact(n, heads), headDimV);   // the output's, outputSize()
        } catch (ArithmeticException e) {
            // (the int products overflowed into a negative array size or a short array indexed out of bounds)
            throw new IllegalArgumentException(n + " queries of " + kvHeads + " x " + group + " heads of " + headDimK
                    + " / " + headDimV + " values (and rows written " + chunk + " at a time) do not fit in an array");
        }
        KvGeometry g = new KvGeometry(1, kvHeads, headDimK, headDimV);
        KvCache cache = KvCache.forTokens(g, k, v, pageTokens, total);
        try {
            KvSequence seq = cache.newSequence();
            SplittableRandom rnd = new SplittableRandom(seed);
            float[] kb = new float[kFloats];
            float[] vb = new float[vFloats];
            for (int pos = 0; pos < total; pos += chunk) {
                int m = Math.min(chunk, total - pos);
                if (pos < distinct) {
                    fill(rnd, kb, m * kvHeads, headDimK, 4f);
                    fill(rnd, vb, m * kvHeads, headDimV, 1f);
                }
                seq.writeRows(0, pos, m, kb, 0, vb, 0);
            }
            float[] q = new float[qFloats];
            fill(rnd, q, n * heads, headDimK, 4f);
            return new AttentionProblem(cache, seq, q, n, start, heads);
        } catch (RuntimeException e) {
            cache.close();
            throw e;
        }
    }

    private static void fill(SplittableRandom rnd, float[] x, int rows, int dim, float outlier) {
        for (int r = 0; r < rows; r++) {
            for (int d = 0; d < dim; d++) {
                x[r * dim + d] = (float) rnd.nextGaussian();
            }
            for (int c : new int[] {1, 5}) {
                if (c < dim / 2) {
                    x[r * dim + c] *= outlier;
                    x[r * dim + c + dim / 2] *= outlier;
                }
            }
        }
    }

    public KvSequence seq() {
        return seq;
    }

    public KvCache cache() {
        return cache;
    }

    /** Queries [n][heads][headDimK]. */
    public float[] queries() {
        return queries;
    }

    public int n() {
        return n;
    }

    public int start() {
        return start;
    }

    public int heads() {
        return heads;
    }

    public float scale() {
        return scale;
    }

    /** Floats of the output [n][heads][headDimV]. */
    public int outputSize() {
        return n * heads * cache.geometry().headDimV();
    }

    @Override
    public void close() {
        seq.close();
        cache.close();
    }
}
