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
 * @param contextLength the context the model was trained for; a model trained with sliding-window attention
 *                      ({@code <arch>.attention.sliding_window}) gives its window, past which kvant's attention (to
 *                      every position, as llama.cpp's for these architectures) is not what the model learned
 * @param rmsEps        epsilon of every RMSNorm
 * @param rope          rotary position embedding of q and k
 * @param qkvBias       q, k and v projections carry a bias (qwen2)
 * @param qkNorm        q and k are RMS-normalized per head before RoPE (qwen3)
 */
public record ModelConfig(String architecture, int dim, int layers, int heads, int kvHeads, int headDimK, int headDimV,
                          int ffnDim, int vocabSize, int contextLength, float rmsEps, Rope rope, boolean qkvBias,
                          boolean qkNorm) {

    public ModelConfig {
        // (in a compact constructor the fields are not set yet: the message names the parameters themselves)
        if (dim <= 0 || layers <= 0 || heads <= 0 || kvHeads <= 0 || headDimK <= 0 || headDimV <= 0 || ffnDim <= 0
                || vocabSize <= 0 || contextLength <= 0) {
            throw new IllegalArgumentException("model sizes must be positive: embedding_length " + dim
                    + ", block_count " + layers + ", head_count " + heads + ", head_count_kv " + kvHeads
                    + ", key_length " + headDimK + ", value_length " + headDimV + ", feed_forward_length " + ffnDim
                    + ", vocabulary " + vocabSize + ", context_length " + contextLength);
        }
        // the widths every buffer and kernel is sized by (heads x head sizes): each must fit an int
        for (long width : new long[] {(long) heads * headDimK, (long) heads * headDimV, (long) kvHeads * headDimK,
                (long) kvHeads * headDimV, 2L * ffnDim, (long) dim + 2L * heads * Math.max(headDimK, headDimV)}) {
            if (width > MAX_WIDTH) {
                throw new IllegalArgumentException("head_count " + heads + " x key_length " + headDimK + " / value_length "
                        + headDimV + " (or feed_forward_length " + ffnDim + ") makes a layer wider than " + MAX_WIDTH
                        + " values");
            }
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

    /** The widest activation row a layer may have: far beyond any model, far below an int's overflow. */
    public static final int MAX_WIDTH = 1 << 26;

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
        if (md.getInt(arch + ".expert_count", 0) > 0) {
            throw new GgufException("GGUF " + fileName + ": " + arch + ".expert_count is "
                    + md.getInt(arch + ".expert_count", 0) + ": mixture-of-experts models are not supported");
        }
        if (!arch.equals("llama") && ropeFreqFactors != null) {
            // llama.cpp's qwen2/qwen3 graphs take no frequency factors (it refuses the file: a tensor too many)
            throw new GgufException("GGUF " + fileName + ": rope_freqs.weight holds RoPE frequency factors, which a "
                    + arch + " model does not take; not supported");
        }
        int dim = md.getInt(arch + ".embedding_length");
        int heads = md.getInt(arch + ".attention.head_count");
        if (heads <= 0) {
            throw new GgufException("GGUF " + fileName + ": " + arch + ".attention.head_count is " + heads
                    + ", not a positive count");
        }
        int kvHeads = md.getInt(arch + ".attention.head_count_kv", heads);
        if (!md.contains(arch + ".attention.key_length") && dim % heads != 0) {
            throw new GgufException("GGUF " + fileName + ": " + arch + ".embedding_length " + dim + " is not a multiple"
                    + " of " + arch + ".attention.head_count " + heads + ", and no " + arch
                    + ".attention.key_length gives the head size");
        }
        int headDimK = md.getInt(arch + ".attention.key_length", dim / heads);
        int headDimV = md.getInt(arch + ".attention.value_length", headDimK);
        int ropeDim = md.getInt(arch + ".rope.dimension_count", headDimK);
        if (ropeDim <= 0 || ropeDim % 2 != 0) {
            String from = md.contains(arch + ".rope.dimension_count") ? arch + ".rope.dimension_count"
                    : arch + ".attention.key_length (the rope dimension when " + arch
                    + ".rope.dimension_count is absent)";
            throw new GgufException("GGUF " + fileName + ": " + from + " is " + ropeDim + "; the rope dimension must be"
                    + " positive and even");
        }
        float base = md.getFloat(arch + ".rope.freq_base", 10000f);
        if (!(base > 0f) || Float.isInfinite(base)) {
            throw new GgufException("GGUF " + fileName + ": " + arch + ".rope.freq_base is " + base
                    + ", not a finite positive base");
        }
        float linearScale = 1f;
        // as llama.cpp: no scaling type with a factor is linear scaling, and older files name the factor
        // rope.scale_linear
        String factorKey = md.contains(arch + ".rope.scaling.factor") ? arch + ".rope.scaling.factor"
                : arch + ".rope.scale_linear";
        float factor = md.getFloat(factorKey, 1f);
        String scaling = md.getString(arch + ".rope.scaling.type", md.contains(factorKey) ? "linear" : "none");
        if (scaling.equals("linear")) {
            linearScale = factor == 0f ? 1f : factor;   // as llama.cpp: a factor of 0 is no scaling
            if (!(linearScale > 0f) || Float.isInfinite(linearScale)) {
                throw new GgufException("GGUF " + fileName + ": " + factorKey + " is " + linearScale
                        + ", not a finite positive factor");
            }
        } else if (scaling.equals("none") || scaling.isEmpty()) {
            linearScale = 1f;   // as llama.cpp: no scaling type, no scaling, whatever factor is given
        } else if (scaling.equals("llama3") && ropeFreqFactors == null) {
            // the factors are read from rope_freqs.weight, where llama.cpp's conversion writes them; from the scaling
            // keys alone RoPE would run unscaled
            throw new GgufException("GGUF " + fileName + ": rope scaling 'llama3' needs the rope_freqs.weight tensor"
                    + " of its frequency factors" + (arch.equals("llama") ? "" : " and a llama architecture")
                    + "; not supported without it");
        } else if (!scaling.equals("none") && !scaling.equals("llama3") && !scaling.isEmpty()) {
            throw new GgufException("GGUF " + fileName + ": rope scaling '" + scaling
                    + "' is not supported (supported: none, linear, llama3 frequency factors)");
        }
        if (!arch.equals("llama") && (ropeDim != headDimK || headDimV != headDimK)) {
            // llama.cpp's qwen2 and qwen3 graphs assert both (n_rot == n_embd_head_k == n_embd_head_v)
            throw new GgufException("GGUF " + fileName + ": " + arch + " with rope dimension " + ropeDim + ", key head "
                    + headDimK + " and value head " + headDimV + ": the three must be equal for this architecture");
        }
        // required, as llama.cpp requires them: a default would run a model on values it was not trained with
        float rmsEps = md.getFloat(arch + ".attention.layer_norm_rms_epsilon");
        int context = md.getInt(arch + ".context_length");
        int window = md.getInt(arch + ".attention.sliding_window", 0);
        if (window > 0 && window < context) {
            context = window;   // attention to every position matches the model's up to its window (see above)
        }
        float attnFactor = md.getFloat(arch + ".rope.scaling.attn_factor", 1f);
        if (attnFactor != 1f) {   // llama.cpp scales the rotated part of q and k by it; kvant does not
            throw new GgufException("GGUF " + fileName + ": " + arch + ".rope.scaling.attn_factor is " + attnFactor
                    + "; a factor other than 1 is not supported");
        }

        try {
            Rope rope = new Rope(mode, ropeDim, base, linearScale, ropeFreqFactors);
            ModelConfig config = new ModelConfig(arch, dim, md.getInt(arch + ".block_count"), heads, kvHeads, headDimK,
                    headDimV, md.getInt(arch + ".feed_forward_length"), vocabSize, context, rmsEps, rope, qkvBias,
                    qkNorm);
            if (arch.equals("llama") && ropeDim < headDimK) {   // as llama.cpp: partial rotary is not a llama model's
                throw new GgufException("GGUF " + fileName + ": llama.rope.dimension_count " + ropeDim + " is less"
                        + " than the head size " + headDimK + " (llama.cpp refuses such a llama model: invalid n_rot)");
            }
            return config;
        } catch (IllegalArgumentException e) {
            throw new GgufException("GGUF " + fileName + ": " + e.getMessage(), e);
        }
    }
}
