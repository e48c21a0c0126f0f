package dev.kvant.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.kv.Rotation;
import dev.kvant.select.Selection;

/**
 * The float64 reference every attention kernel (CPU now, GPU later) is checked against: plain loops, no tiling, no
 * partitions, no cleverness. Rows are decoded by the formats' own {@link KvFormat#decode} (the definition of what a
 * cached row means); everything after that is double: the rotation of rotated formats (applied to the query and
 * undone on the output, from the sign vectors and the Hadamard butterflies), dot products, soft-cap, softmax and
 * the weighted sum.
 *
 * <p>Sparse V here is the exact rule: a row whose normalized softmax weight is below T is left out of the weighted
 * sum (not of the normalization). The kernels apply a conservative form of it (they can only know an upper bound
 * of the weight), so with sparse V they sit between this and the dense result.
 */
public final class AttentionReference {

    private AttentionReference() {
    }

    /**
     * Attention of n tokens at positions start .. start+n-1 (token t sees positions 0 .. start+t); arguments as
     * {@link CpuAttention#attend}. Returns [n][heads][headDimV] in double.
     */
    public static double[] attend(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                                  AttentionOptions opts) {
        return attend(seq, layer, q, n, start, heads, scale, opts, null);
    }

    /**
     * As above, each query seeing only the positions of the blocks its query block's list holds for its kv head
     * (sel null: every position).
     */
    public static double[] attend(KvSequence seq, int layer, float[] q, int n, int start, int heads, float scale,
                                  AttentionOptions opts, Selection sel) {
        KvCache cache = seq.cache();
        KvFormat kf = cache.kFormat(layer);
        KvFormat vf = cache.vFormat(layer);
        int kvHeads = cache.geometry().kvHeads();
        int dK = cache.geometry().headDimK();
        int dV = cache.geometry().headDimV();
        int domK = kf.domainDim(dK);
        int domV = vf.domainDim(dV);
        int group = heads / kvHeads;
        int total = start + n;
        double[] out = new double[n * heads * dV];
        float[] buf = new float[Math.max(domK, domV)];
        double[][] keys = new double[total][domK];
        double[][] values = new double[total][domV];
        for (int g = 0; g < kvHeads; g++) {
            for (int pos = 0; pos < total; pos++) {
                seq.decodeK(layer, pos, g, buf, 0);
                for (int d = 0; d < domK; d++) {
                    keys[pos][d] = buf[d];
                }
                seq.decodeV(layer, pos, g, buf, 0);
                for (int d = 0; d < domV; d++) {
                    values[pos][d] = buf[d];
                }
            }
            for (int t = 0; t < n; t++) {
                for (int h = g * group; h < (g + 1) * group; h++) {
                    double[] qr = new double[domK];
                    for (int d = 0; d < dK; d++) {
                        qr[d] = q[(t * heads + h) * dK + d];
                    }
                    if (kf.rotated()) {
                        rotate(qr, dK, false);
                    }
                    int visible = start + t + 1;
                    double[] s = new double[visible];
                    double max = Double.NEGATIVE_INFINITY;
                    boolean[] skip = new boolean[visible];
                    for (int j = 0; sel != null && j < visible; j++) {
                        skip[j] = !sel.contains(t / Selection.QUERY_BLOCK, g, j / sel.blockTokens());
                    }
                    for (int j = 0; j < visible; j++) {
                        if (skip[j]) {
                            s[j] = Double.NEGATIVE_INFINITY;
                            continue;
                        }
                        double dot = 0;
                        for (int d = 0; d < domK; d++) {
                            dot += qr[d] * keys[j][d];
                        }
                        s[j] = dot * scale;
                        if (opts.softCap() > 0) {
                            s[j] = opts.softCap() * Math.tanh(s[j] / opts.softCap());
                        }
                        max = Math.max(max, s[j]);
                    }
                    double z = 0;
                    for (int j = 0; j < visible; j++) {
                        s[j] = Math.exp(s[j] - max);
                        z += s[j];
                    }
                    double[] o = new double[domV];
                    for (int j = 0; j < visible; j++) {
                        double p = s[j] / z;
                        if (p < opts.sparseV()) {
                            continue;
                        }
                        for (int d = 0; d < domV; d++) {
                            o[d] += p * values[j][d];
                        }
                    }
                    if (vf.rotated()) {
                        rotate(o, dV, true);
                    }
                    System.arraycopy(o, 0, out, (t * heads + h) * dV, dV);
                }
            }
        }
        return out;
    }

    /**
     * The rotated formats' rotation of a padded head row, in double: per block of n, y = D2·(H/√n)·D1·x, or its
     * inverse x = D1·(H/√n)·D2·y (H symmetric with H·H = n·I).
     */
    static void rotate(double[] x, int headDim, boolean inverse) {
        Rotation r = Rotation.forHeadDim(headDim);
        int n = r.size();
        double norm = 1 / Math.sqrt(n);
        for (int b = 0; b < Rotation.paddedDim(headDim); b += n) {
            for (int i = 0; i < n; i++) {
                x[b + i] *= r.sign(inverse ? 2 : 1, i);
            }
            for (int len = 1; len < n; len *= 2) {
                for (int i = 0; i < n; i += 2 * len) {
                    for (int j = i; j < i + len; j++) {
                        double u = x[b + j];
                        double v = x[b + j + len];
                        x[b + j] = u + v;
                        x[b + j + len] = u - v;
                    }
                }
            }
            for (int i = 0; i < n; i++) {
                x[b + i] *= r.sign(inverse ? 1 : 2, i) * norm;
            }
        }
    }
}
