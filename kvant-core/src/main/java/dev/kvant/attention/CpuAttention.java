package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.tensor.Parallel;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorSpecies;

import java.lang.foreign.MemorySegment;

/**
 * Causal attention of a batch of consecutive queries over a sequence's (compressed) KV cache, on the CPU.
 *
 * <p>Work is cut into tasks of (kv head, block of {@value #QUERY_BLOCK} query tokens); a task serves every query head
 * of its GQA group from one read of each K/V row. Keys and values are dequantized a tile of {@value #TILE} rows at a
 * time into task-local scratch (the only uncompressed copy) and consumed with an online softmax. Each output element
 * is produced by one task in a fixed order of tiles, so results do not depend on the thread count.
 *
 * <p>Rotated formats: the query is rotated into the key format's domain once, scores are taken there, and the output
 * is rotated back out of the value format's domain once per head.
 */
public final class CpuAttention {

    static final int TILE = 64;
    static final int QUERY_BLOCK = 64;
    private static final VectorSpecies<Float> F = FloatVector.SPECIES_PREFERRED;

    private CpuAttention() {
    }

    /**
     * @param q     queries [n][heads][headDimK], token t at position start + t (not modified)
     * @param out   outputs [n][heads][headDimV]
     * @param scale softmax scale, usually 1/sqrt(headDimK)
     */
    public static void attend(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                              float[] out, Parallel pool) {
        KvCache cache = seq.cache();
        int kvHeads = cache.geometry().kvHeads();
        int blocks = (n + QUERY_BLOCK - 1) / QUERY_BLOCK;
        pool.forEach(kvHeads * blocks, task -> {
            int g = task % kvHeads;
            int b = task / kvHeads;
            int t0 = b * QUERY_BLOCK;
            attendBlock(seq, cache, layer, q, t0, Math.min(n, t0 + QUERY_BLOCK), start, heads, g, scale, out);
        });
    }

    private static void attendBlock(KvSequence seq, KvCache cache, int layer, float[] q, int t0, int t1, int start,
                                    int heads, int g, float scale, float[] out) {
        int kvHeads = cache.geometry().kvHeads();
        int dK = cache.geometry().headDimK();
        int dV = cache.geometry().headDimV();
        KvFormat kf = cache.kFormat();
        KvFormat vf = cache.vFormat();
        int group = heads / kvHeads;
        int nq = (t1 - t0) * group;

        float[] qs = new float[nq * dK];
        float[] m = new float[nq];
        float[] l = new float[nq];
        float[] acc = new float[nq * dV];
        for (int i = 0; i < nq; i++) {
            int t = t0 + i / group;
            int h = g * group + i % group;
            System.arraycopy(q, (t * heads + h) * dK, qs, i * dK, dK);
            kf.rotate(qs, i * dK, dK);
            for (int d = 0; d < dK; d++) {
                qs[i * dK + d] *= scale;
            }
            m[i] = Float.NEGATIVE_INFINITY;
        }

        float[] kt = new float[TILE * dK];
        float[] vt = new float[TILE * dV];
        float[] p = new float[TILE];
        int pageTokens = cache.pageTokens();
        int last = start + t1 - 1;
        for (int p0 = 0; p0 <= last; p0 += TILE) {
            int rows = Math.min(TILE, last + 1 - p0);
            for (int j = 0; j < rows; j++) {
                int pos = p0 + j;
                int page = seq.page(pos / pageTokens);
                int inPage = pos % pageTokens;
                MemorySegment kp = cache.kPage(layer, page);
                MemorySegment vp = cache.vPage(layer, page);
                kf.decode(kp, cache.kRowOffset(inPage, g), dK, kt, j * dK);
                vf.decode(vp, cache.vRowOffset(inPage, g), dV, vt, j * dV);
            }
            for (int i = 0; i < nq; i++) {
                int maxPos = start + t0 + i / group;
                if (p0 > maxPos) {
                    continue;
                }
                int cnt = Math.min(rows, maxPos - p0 + 1);
                float mt = Float.NEGATIVE_INFINITY;
                for (int j = 0; j < cnt; j++) {
                    float s = dot(qs, i * dK, kt, j * dK, dK);
                    p[j] = s;
                    mt = Math.max(mt, s);
                }
                float mNew = Math.max(m[i], mt);
                float corr = (float) Math.exp(m[i] - mNew);
                float sum = l[i] * corr;
                int ao = i * dV;
                if (corr != 1f) {
                    scale(acc, ao, dV, corr);
                }
                for (int j = 0; j < cnt; j++) {
                    float w = (float) Math.exp(p[j] - mNew);
                    sum += w;
                    axpy(w, vt, j * dV, acc, ao, dV);
                }
                l[i] = sum;
                m[i] = mNew;
            }
        }
        for (int i = 0; i < nq; i++) {
            int t = t0 + i / group;
            int h = g * group + i % group;
            int o = (t * heads + h) * dV;
            float inv = 1f / l[i];
            for (int d = 0; d < dV; d++) {
                out[o + d] = acc[i * dV + d] * inv;
            }
            vf.unrotate(out, o, dV);
        }
    }

    static float dot(float[] a, int ao, float[] b, int bo, int n) {
        int i = 0;
        FloatVector s = FloatVector.zero(F);
        for (int ub = F.loopBound(n); i < ub; i += F.length()) {
            s = FloatVector.fromArray(F, a, ao + i).fma(FloatVector.fromArray(F, b, bo + i), s);
        }
        float r = s.reduceLanes(VectorOperators.ADD);
        for (; i < n; i++) {
            r += a[ao + i] * b[bo + i];
        }
        return r;
    }

    static void axpy(float w, float[] x, int xo, float[] y, int yo, int n) {
        int i = 0;
        FloatVector wv = FloatVector.broadcast(F, w);
        for (int ub = F.loopBound(n); i < ub; i += F.length()) {
            FloatVector.fromArray(F, x, xo + i).fma(wv, FloatVector.fromArray(F, y, yo + i)).intoArray(y, yo + i);
        }
        for (; i < n; i++) {
            y[yo + i] += w * x[xo + i];
        }
    }

    static void scale(float[] y, int yo, int n, float c) {
        for (int i = 0; i < n; i++) {
            y[yo + i] *= c;
        }
    }
}
