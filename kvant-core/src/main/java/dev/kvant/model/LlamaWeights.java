package dev.kvant.model;

import dev.kvant.gguf.GgufException;
import dev.kvant.gguf.GgufFile;
import dev.kvant.gguf.GgufTensorInfo;
import dev.kvant.tensor.Parallel;
import dev.kvant.tensor.UnsupportedTensorTypeException;
import dev.kvant.tensor.WeightFormat;
import dev.kvant.tensor.WeightMatrix;

import java.util.List;
import java.util.Optional;

/** The tensors of a llama-family model, viewed in place in the mapped GGUF file (nothing is copied but norms). */
public record LlamaWeights(WeightMatrix tokenEmbedding, float[] outputNorm, WeightMatrix output, Layer[] layers,
                           float[] ropeFreqFactors) {

    /** One transformer block. Biases and q/k norms are null where the architecture has none. */
    public record Layer(float[] attnNorm, WeightMatrix wq, WeightMatrix wk, WeightMatrix wv, WeightMatrix wo,
                       float[] bq, float[] bk, float[] bv, float[] qNorm, float[] kNorm,
                       float[] ffnNorm, WeightMatrix wGate, WeightMatrix wUp, WeightMatrix wDown) {
    }

    /** Embedding table and rope factors, which the configuration needs before the layers are read. */
    static WeightMatrix embedding(GgufFile f) {
        return matrix(f, "token_embd.weight", -1, -1);
    }

    static float[] ropeFreqFactors(GgufFile f) {
        return f.tensor("rope_freqs.weight").map(t -> {
            // one factor a rotated pair: half a head at most (the exact count is checked with the rope dimension)
            if (t.elementCount() > MAX_ROPE_FACTORS) {
                throw new GgufException("GGUF " + f.name() + ": rope_freqs.weight has " + t.elementCount()
                        + " factors; a head's rotated pairs are far fewer (at most " + MAX_ROPE_FACTORS + " here)");
            }
            return vector(f, t.name(), (int) t.elementCount());
        }).orElse(null);
    }

    private static final int MAX_ROPE_FACTORS = 1 << 16;

    static LlamaWeights load(GgufFile f, ModelConfig c, WeightMatrix embedding, float[] ropeFreqFactors) {
        // the last block first: a block count the file does not hold fails here, before anything is sized by it
        if (c.layers() > f.tensors().size()) {
            throw new GgufException("GGUF " + f.name() + ": block_count " + c.layers() + " is more than the file's "
                    + f.tensors().size() + " tensors");
        }
        f.requireTensor("blk." + (c.layers() - 1) + ".attn_norm.weight");
        checkNothingElse(f, c);
        if (embedding.cols() != c.dim()) {
            throw new GgufException("GGUF " + f.name() + ": token_embd.weight has rows of " + embedding.cols()
                    + " values, but embedding_length is " + c.dim());
        }
        Layer[] layers = new Layer[c.layers()];
        for (int i = 0; i < c.layers(); i++) {
            String p = "blk." + i + ".";
            layers[i] = new Layer(
                    vector(f, p + "attn_norm.weight", c.dim()),
                    matrix(f, p + "attn_q.weight", c.qDim(), c.dim()),
                    matrix(f, p + "attn_k.weight", c.kvDimK(), c.dim()),
                    matrix(f, p + "attn_v.weight", c.kvDimV(), c.dim()),
                    matrix(f, p + "attn_output.weight", c.dim(), c.heads() * c.headDimV()),
                    c.qkvBias() ? vector(f, p + "attn_q.bias", c.qDim()) : null,
                    c.qkvBias() ? vector(f, p + "attn_k.bias", c.kvDimK()) : null,
                    c.qkvBias() ? vector(f, p + "attn_v.bias", c.kvDimV()) : null,
                    c.qkNorm() ? vector(f, p + "attn_q_norm.weight", c.headDimK()) : null,
                    c.qkNorm() ? vector(f, p + "attn_k_norm.weight", c.headDimK()) : null,
                    vector(f, p + "ffn_norm.weight", c.dim()),
                    matrix(f, p + "ffn_gate.weight", c.ffnDim(), c.dim()),
                    matrix(f, p + "ffn_up.weight", c.ffnDim(), c.dim()),
                    matrix(f, p + "ffn_down.weight", c.dim(), c.ffnDim()));
        }
        Optional<GgufTensorInfo> out = f.tensor("output.weight");
        WeightMatrix output = out.isPresent() ? matrix(f, "output.weight", c.vocabSize(), c.dim()) : embedding;
        return new LlamaWeights(embedding, vector(f, "output_norm.weight", c.dim()), output, layers, ropeFreqFactors);
    }

    /**
     * Refuses a tensor the model would not use (a bias the architecture does not add, in any block, which llama.cpp
     * adds where a file has it): dropped, it would leave the logits silently wrong. llama.cpp refuses a file whose
     * tensor count differs from what it loads, too. Checked before anything is sized by the file.
     */
    private static void checkNothingElse(GgufFile f, ModelConfig c) {
        java.util.Set<String> used = new java.util.HashSet<>(List.of("token_embd.weight", "output_norm.weight",
                "output.weight", "rope_freqs.weight"));
        for (int i = 0; i < c.layers(); i++) {
            String p = "blk." + i + ".";
            for (String n : List.of("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                    "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")) {
                used.add(p + n);
            }
            if (c.qkvBias()) {
                used.addAll(List.of(p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"));
            }
            if (c.qkNorm()) {
                used.addAll(List.of(p + "attn_q_norm.weight", p + "attn_k_norm.weight"));
            }
        }
        for (GgufTensorInfo t : f.tensors()) {
            if (!used.contains(t.name())) {
                throw new GgufException("GGUF " + f.name() + ": " + t.name() + " is present but a "
                        + c.architecture() + " model of " + c.layers() + " blocks as kvant computes it has no such"
                        + " tensor (a converted file of another family? dropped, it would leave the logits wrong);"
                        + " not supported");
            }
        }
    }

    /** A 2-D weight; rows/cols of -1 accept whatever the file says. */
    static WeightMatrix matrix(GgufFile f, String name, int rows, int cols) {
        GgufTensorInfo t = f.requireTensor(name);
        long fileCols = t.shape()[0];
        long fileRows = t.dims() == 1 ? 1 : t.rows();
        if (t.dims() > 2 || (rows >= 0 && fileRows != rows) || (cols >= 0 && fileCols != cols)) {
            throw new GgufException("GGUF " + f.name() + ": tensor '" + name + "' has shape "
                    + java.util.Arrays.toString(t.shape()) + ", expected [" + cols + ", " + rows + "]");
        }
        if (fileRows > Integer.MAX_VALUE || fileCols > Integer.MAX_VALUE) {
            throw new GgufException("GGUF " + f.name() + ": tensor '" + name + "' is too large");
        }
        return new WeightMatrix(name, format(f, t), f.data(t), (int) fileRows, (int) fileCols);
    }

    /** A 1-D tensor (norm weight, bias) dequantized to floats. */
    static float[] vector(GgufFile f, String name, int length) {
        GgufTensorInfo t = f.requireTensor(name);
        if (t.elementCount() != length) {
            throw new GgufException("GGUF " + f.name() + ": tensor '" + name + "' has " + t.elementCount()
                    + " elements, expected " + length);
        }
        float[] v = new float[length];
        format(f, t).dequantize(f.data(t), 0, v, 0, length);
        return v;
    }

    private static WeightFormat format(GgufFile f, GgufTensorInfo t) {
        try {
            return WeightFormat.of(t.type());
        } catch (UnsupportedTensorTypeException e) {
            throw new GgufException("GGUF " + f.name() + ": tensor '" + t.name() + "': " + e.getMessage());
        }
    }

    /**
     * Gives every matrix the products read the layout the CPU kernels read fastest ({@link WeightMatrix#packForCpu}),
     * made once, in parallel; the file's bytes stay for the GPU. The token embedding is left as it is unless it is
     * the output matrix too: a lookup reads one row a token, and a copy would only cost memory.
     */
    public void packForCpu(Parallel pool) {
        output.packForCpu(pool);
        for (Layer l : layers) {
            for (WeightMatrix m : new WeightMatrix[] {l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown}) {
                m.packForCpu(pool);
            }
        }
    }

    /** Bytes of weights read by one decode step (every matrix once, one embedding row). */
    public long bytesPerToken() {
        long total = output.data().byteSize();
        for (Layer l : layers) {
            for (WeightMatrix m : new WeightMatrix[] {l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown}) {
                total += m.data().byteSize();
            }
        }
        return total;
    }
}
