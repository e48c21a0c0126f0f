package dev.kvant.model;

import dev.kvant.gguf.GgufException;
import dev.kvant.gguf.GgufMetadata;

/**
 * The hyper-parameters of a llama-family model, read from the GGUF metadata of its architecture.
 *
 * @param architecture  {@code general.architecture}: llama, qwen2 or qwen3
 * @param dim           width of the residual stream
 * @param layers        transformer blocks
 * @param heads         query heads
 * @param kvHeads       key/value heads (GQA when fewer than heads)
 * @param headDimK      size of one query/key head
 * @param headDimV      size of one value head
 * @param ffnDim        hidden size of the SwiGLU feed-forward network
 * @param vocabSize     rows of the embedding table
 * @param contextLength the context the model was trained for
 * @param rmsEps        epsilon of every RMSNorm
 * @param rope          rotary position embedding of q and k
 * @param qkvBias       q, k and v projections carry a bias (qwen2)
 * @param qkNorm        q and k are RMS-normalized per head before RoPE (qwen3)
 */
public record ModelConfig(String architecture, int dim, int layers, int heads, int kvHeads, int headDimK, int headDimV,
                          int ffnDim, int vocabSize, int contextLength, float rmsEps, Rope rope, boolean qkvBias,
                          boolean qkNorm) {

    public ModelConfig {
        if (dim <= 0 || layers <= 0 || heads <= 0 || kvHeads <= 0 || headDimK <= 0 || headDimV <= 0 || ffnDim <= 0
                || vocabSize <= 0 || contextLength <= 0) {
            throw new IllegalArgumentException("model sizes must be positive: " + this);
        }
        if (rope.ropeDim() > headDimK) {
            throw new IllegalArgumentException("the rope dimension (" + rope.ropeDim() + ") exceeds the key head size ("
                    + headDimK + ")");
        }
        if (!(rmsEps >= 0f) || Float.isInfinite(rmsEps)) {
            throw new IllegalArgumentException("the RMSNorm epsilon must be finite and not negative, got " + rmsEps);
        }
        if (heads % kvHeads != 0) {
            throw new IllegalArgumentException(
                    "query heads (" + heads + ") must be a multiple of key/value heads (" + kvHeads + ")");
        }
    }

    public int qDim() {
        return heads * headDimK;
    }

    public int kvDimK() {
        return kvHeads * headDimK;
    }

    public int kvDimV() {
        return kvHeads * headDimV;
    }

    public int groupSize() {
        return heads / kvHeads;
    }

    /** Reads the configuration of a supported architecture; vocabSize comes from the embedding tensor. */
    public static ModelConfig fromGguf(String fileName, GgufMetadata md, int vocabSize, float[] ropeFreqFactors) {
        String arch = md.getString("general.architecture");
        boolean qkvBias;
        boolean qkNorm;
        Rope.Mode mode;
        switch (arch) {
            case "llama" -> { qkvBias = false; qkNorm = false; mode = Rope.Mode.NORMAL; }
            case "qwen2" -> { qkvBias = true; qkNorm = false; mode = Rope.Mode.NEOX; }
            case "qwen3" -> { qkvBias = false; qkNorm = true; mode = Rope.Mode.NEOX; }
            default -> throw new GgufException("GGUF " + fileName + ": architecture '" + arch
                    + "' is not supported (supported: llama, qwen2, qwen3)");
        }
        int dim = md.getInt(arch + ".embedding_length");
        int heads = md.getInt(arch + ".attention.head_count");
        if (heads <= 0) {
            throw new GgufException("GGUF " + fileName + ": " + arch + ".attention.head_count is " + heads
                    + ", not a positive count");
        }
        int kvHeads = md.getInt(arch + ".attention.head_count_kv", heads);
        int headDimK = md.getInt(arch + ".attention.key_length", dim / heads);
        int headDimV = md.getInt(arch + ".attention.value_length", headDimK);
        int ropeDim = md.getInt(arch + ".rope.dimension_count", headDimK);
        float base = md.getFloat(arch + ".rope.freq_base", 10000f);
        float linearScale = 1f;
        String scaling = md.getString(arch + ".rope.scaling.type", "none");
        if (scaling.equals("linear")) {
            linearScale = md.getFloat(arch + ".rope.scaling.factor", 1f);
        } else if (!scaling.equals("none") && !scaling.equals("llama3") && !scaling.isEmpty()) {
            throw new GgufException("GGUF " + fileName + ": rope scaling '" + scaling
                    + "' is not supported (supported: none, linear, llama3 frequency factors)");
        }
        try {
            Rope rope = new Rope(mode, ropeDim, base, linearScale, ropeFreqFactors);
            return new ModelConfig(arch, dim, md.getInt(arch + ".block_count"), heads, kvHeads, headDimK, headDimV,
                    md.getInt(arch + ".feed_forward_length"), vocabSize, md.getInt(arch + ".context_length", 4096),
                    md.getFloat(arch + ".attention.layer_norm_rms_epsilon", 1e-5f), rope, qkvBias, qkNorm);
        } catch (IllegalArgumentException e) {
            throw new GgufException("GGUF " + fileName + ": " + e.getMessage(), e);
        }
    }
}
