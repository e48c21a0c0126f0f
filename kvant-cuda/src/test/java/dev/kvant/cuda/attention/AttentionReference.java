package dev.kvant.cuda.attention;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;

/**
 * Float64 attention, plain loops: the reference every GPU attention kernel is measured against. Keys and values
 * come either as the cache holds them (decoded by the CPU decoder and rotated back: the kernels must reproduce
 * exactly this function, up to their f16/f32 arithmetic) or as the exact floats that were written (the reference
 * for the format's own quantization error).
 */
final class AttentionReference {
    private AttentionReference() {
    }

    /** The K (or V) rows of positions 0..len-1 of a sequence, decoded and rotated back: [pos][kvHead][d]. */
    static double[][][] decoded(KvSequence seq, int layer, int len, boolean values) {
        var cache = seq.cache();
        int kvHeads = cache.geometry().kvHeads();
        KvFormat f = values ? cache.vFormat() : cache.kFormat();
        int d = values ? cache.geometry().headDimV() : cache.geometry().headDimK();
        float[] row = new float[f.domainDim(d)];
        double[][][] out = new double[len][kvHeads][d];
        for (int p = 0; p < len; p++) {
            for (int h = 0; h < kvHeads; h++) {
                if (values) {
                    seq.decodeV(layer, p, h, row, 0);
                } else {
                    seq.decodeK(layer, p, h, row, 0);
                }
                f.unrotate(row, 0, d);
                for (int i = 0; i < d; i++) {
                    out[p][h][i] = row[i];
                }
            }
        }
        return out;
    }

    /** Rows given as floats [pos][kvHead][d] (the exact values written). */
    static double[][][] exact(float[] rows, int len, int kvHeads, int d) {
        double[][][] out = new double[len][kvHeads][d];
        for (int p = 0; p < len; p++) {
            for (int h = 0; h < kvHeads; h++) {
                for (int i = 0; i < d; i++) {
                    out[p][h][i] = rows[(p * kvHeads + h) * d + i];
                }
            }
        }
        return out;
    }

    /**
     * softmax(scale * q.K^T) V for every query head of one query that sees positions 0..visible-1; q is
     * [heads][dK] at qOff; the result [heads][dV] goes to out at outOff. Query head h reads kv head h / group.
     */
    static void attend(double[][][] k, double[][][] v, float[] q, int qOff, int heads, int visible, double scale,
                       double[] out, int outOff) {
        int kvHeads = k[0].length;
        int group = heads / kvHeads;
        int dK = k[0][0].length, dV = v[0][0].length;
        double[] s = new double[visible];
        for (int h = 0; h < heads; h++) {
            int g = h / group;
            double max = Double.NEGATIVE_INFINITY;
            for (int p = 0; p < visible; p++) {
                double dot = 0;
                for (int i = 0; i < dK; i++) {
                    dot += q[qOff + h * dK + i] * k[p][g][i];
                }
                s[p] = dot * scale;
                max = Math.max(max, s[p]);
            }
            double sum = 0;
            for (int p = 0; p < visible; p++) {
                s[p] = Math.exp(s[p] - max);
                sum += s[p];
            }
            for (int i = 0; i < dV; i++) {
                double acc = 0;
                for (int p = 0; p < visible; p++) {
                    acc += s[p] * v[p][g][i];
                }
                out[outOff + h * dV + i] = acc / sum;
            }
        }
    }

    /** Sum of squared differences over sum of squared reference values. */
    static double nmse(float[] actual, double[] expected) {
        double num = 0, den = 0;
        for (int i = 0; i < expected.length; i++) {
            double diff = actual[i] - expected[i];
            num += diff * diff;
            den += expected[i] * expected[i];
        }
        return num / den;
    }
}
