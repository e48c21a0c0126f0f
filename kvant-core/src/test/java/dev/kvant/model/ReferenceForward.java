package dev.kvant.model;

import java.util.ArrayList;
import java.util.List;

/**
 * The llama-family forward pass in float64, plain loops, straight from the definitions. Keys and values are rounded
 * to f16 as they enter the cache, as an f16 KV cache does; everything else stays in double.
 */
final class ReferenceForward {

    private final TinyModels.Built m;
    private final boolean neox;
    private final List<double[][]> keys = new ArrayList<>();   // per layer: [pos][kvHeads*headDim]
    private final List<double[][]> values = new ArrayList<>();
    private int pos;
    /** RoPE scaling: positions divided by linearScale, pair i's frequency divided by freqFactors[i] (or 1). */
    private final double linearScale;
    private final float[] freqFactors;

    ReferenceForward(TinyModels.Built m) {
        this(m, 1, null);
    }

    ReferenceForward(TinyModels.Built m, double linearScale, float[] freqFactors) {
        this.m = m;
        this.linearScale = linearScale;
        this.freqFactors = freqFactors;
        this.neox = !m.arch().equals("llama");
        for (int l = 0; l < TinyModels.LAYERS; l++) {
            keys.add(new double[256][]);
            values.add(new double[256][]);
        }
    }

    /** Logits after feeding one token. */
    double[] step(int token) {
        int dim = TinyModels.DIM;
        int hd = TinyModels.HEAD_DIM;
        int heads = TinyModels.HEADS;
        int kvHeads = TinyModels.KV_HEADS;
        double[] x = row(m.t("token_embd.weight"), token, dim);
        for (int l = 0; l < TinyModels.LAYERS; l++) {
            String p = "blk." + l + ".";
            double[] xb = rmsNorm(x, m.t(p + "attn_norm.weight"));
            double[] q = matvec(m.t(p + "attn_q.weight"), xb, heads * hd);
            double[] k = matvec(m.t(p + "attn_k.weight"), xb, kvHeads * hd);
            double[] v = matvec(m.t(p + "attn_v.weight"), xb, kvHeads * hd);
            if (m.tensors().containsKey(p + "attn_q.bias")) {
                add(q, m.t(p + "attn_q.bias"));
                add(k, m.t(p + "attn_k.bias"));
                add(v, m.t(p + "attn_v.bias"));
            }
            if (m.tensors().containsKey(p + "attn_q_norm.weight")) {
                headNorm(q, heads, m.t(p + "attn_q_norm.weight"));
                headNorm(k, kvHeads, m.t(p + "attn_k_norm.weight"));
            }
            rope(q, heads);
            rope(k, kvHeads);
            for (int i = 0; i < k.length; i++) {
                k[i] = Float.float16ToFloat(Float.floatToFloat16((float) k[i]));
                v[i] = Float.float16ToFloat(Float.floatToFloat16((float) v[i]));
            }
            keys.get(l)[pos] = k;
            values.get(l)[pos] = v;
            double[] att = new double[heads * hd];
            for (int h = 0; h < heads; h++) {
                int g = h / (heads / kvHeads);
                double[] s = new double[pos + 1];
                double max = Double.NEGATIVE_INFINITY;
                for (int t = 0; t <= pos; t++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) {
                        d += q[h * hd + i] * keys.get(l)[t][g * hd + i];
                    }
                    s[t] = d / Math.sqrt(hd);
                    max = Math.max(max, s[t]);
                }
                double sum = 0;
                for (int t = 0; t <= pos; t++) {
                    s[t] = Math.exp(s[t] - max);
                    sum += s[t];
                }
                for (int t = 0; t <= pos; t++) {
                    for (int i = 0; i < hd; i++) {
                        att[h * hd + i] += s[t] / sum * values.get(l)[t][g * hd + i];
                    }
                }
            }
            add(x, matvec(m.t(p + "attn_output.weight"), att, dim));
            xb = rmsNorm(x, m.t(p + "ffn_norm.weight"));
            double[] gate = matvec(m.t(p + "ffn_gate.weight"), xb, TinyModels.FFN);
            double[] up = matvec(m.t(p + "ffn_up.weight"), xb, TinyModels.FFN);
            for (int i = 0; i < gate.length; i++) {
                gate[i] = gate[i] / (1 + Math.exp(-gate[i])) * up[i];
            }
            add(x, matvec(m.t(p + "ffn_down.weight"), gate, dim));
        }
        double[] xn = rmsNorm(x, m.t("output_norm.weight"));
        float[] out = m.tensors().containsKey("output.weight") ? m.t("output.weight") : m.t("token_embd.weight");
        pos++;
        return matvec(out, xn, TinyModels.VOCAB);
    }

    private void rope(double[] x, int heads) {
        int hd = TinyModels.HEAD_DIM;
        for (int h = 0; h < heads; h++) {
            for (int i = 0; i < hd / 2; i++) {
                double theta = pos / linearScale * Math.pow(10000.0, -2.0 * i / hd)
                        / (freqFactors == null ? 1 : freqFactors[i]);
                int a = neox ? h * hd + i : h * hd + 2 * i;
                int b = neox ? a + hd / 2 : a + 1;
                double x0 = x[a];
                double x1 = x[b];
                x[a] = x0 * Math.cos(theta) - x1 * Math.sin(theta);
                x[b] = x0 * Math.sin(theta) + x1 * Math.cos(theta);
            }
        }
    }

    private static void headNorm(double[] x, int heads, float[] w) {
        int hd = w.length;
        for (int h = 0; h < heads; h++) {
            double ss = 0;
            for (int i = 0; i < hd; i++) {
                ss += x[h * hd + i] * x[h * hd + i];
            }
            double inv = 1 / Math.sqrt(ss / hd + 1e-5);
            for (int i = 0; i < hd; i++) {
                x[h * hd + i] = x[h * hd + i] * inv * w[i];
            }
        }
    }

    private static double[] rmsNorm(double[] x, float[] w) {
        double ss = 0;
        for (double v : x) {
            ss += v * v;
        }
        double inv = 1 / Math.sqrt(ss / x.length + 1e-5);
        double[] out = new double[x.length];
        for (int i = 0; i < x.length; i++) {
            out[i] = x[i] * inv * w[i];
        }
        return out;
    }

    private static double[] matvec(float[] w, double[] x, int rows) {
        double[] out = new double[rows];
        for (int r = 0; r < rows; r++) {
            double s = 0;
            for (int c = 0; c < x.length; c++) {
                s += w[r * x.length + c] * x[c];
            }
            out[r] = s;
        }
        return out;
    }

    private static double[] row(float[] w, int r, int cols) {
        double[] out = new double[cols];
        for (int c = 0; c < cols; c++) {
            out[c] = w[r * cols + c];
        }
        return out;
    }

    private static void add(double[] x, double[] y) {
        for (int i = 0; i < x.length; i++) {
            x[i] += y[i];
        }
    }

    private static void add(double[] x, float[] y) {
        for (int i = 0; i < x.length; i++) {
            x[i] += y[i];
        }
    }
}
