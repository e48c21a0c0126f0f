package dev.kvant.tokenizer;

import dev.kvant.gguf.GgufMetadata;

import java.util.List;

/**
 * Everything a tokenizer is built from, as plain data: the {@code tokenizer.*} keys of a GGUF file, already read.
 * Arrays and lists are used as given (not copied); a tokenizer built from a spec does not change it.
 *
 * @param model          {@code tokenizer.ggml.model}: {@code "gpt2"} (byte-level BPE) or {@code "llama"} (SentencePiece)
 * @param pre            {@code tokenizer.ggml.pre}: the pre-tokenizer name of a BPE vocabulary; null means {@code "default"}
 * @param tokens         {@code tokenizer.ggml.tokens}: token texts in id order
 * @param scores         {@code tokenizer.ggml.scores}: SentencePiece merge scores; may be null (all 0)
 * @param tokenTypes     {@code tokenizer.ggml.token_type}: {@link TokenType} codes; may be null (all normal)
 * @param merges         {@code tokenizer.ggml.merges}: BPE merges {@code "left right"} in rank order; required for gpt2
 * @param bos            {@code tokenizer.ggml.bos_token_id}, -1 if none
 * @param eos            {@code tokenizer.ggml.eos_token_id}, -1 if none
 * @param eot            {@code tokenizer.ggml.eot_token_id}, -1 if none
 * @param unk            {@code tokenizer.ggml.unknown_token_id}, -1 if none
 * @param pad            {@code tokenizer.ggml.padding_token_id}, -1 if none
 * @param addBos         {@code tokenizer.ggml.add_bos_token}
 * @param addEos         {@code tokenizer.ggml.add_eos_token}
 * @param addSpacePrefix {@code tokenizer.ggml.add_space_prefix}: SentencePiece prefixes text with a space (llama default true)
 * @param chatTemplate   {@code tokenizer.chat_template}; may be null
 */
public record TokenizerSpec(
        String model,
        String pre,
        List<String> tokens,
        float[] scores,
        int[] tokenTypes,
        List<String> merges,
        int bos,
        int eos,
        int eot,
        int unk,
        int pad,
        boolean addBos,
        boolean addEos,
        boolean addSpacePrefix,
        String chatTemplate) {

    /**
     * A spec with the defaults llama.cpp applies when a GGUF file lacks {@code unknown_token_id} and
     * {@code add_space_prefix}: for {@code llama} the unknown token is id 0 and a space is prefixed; for other models
     * there is no unknown token and no prefix.
     */
    public TokenizerSpec(String model, String pre, List<String> tokens, float[] scores, int[] tokenTypes,
                         List<String> merges, int bos, int eos, int eot, int pad, boolean addBos, boolean addEos,
                         String chatTemplate) {
        this(model, pre, tokens, scores, tokenTypes, merges, bos, eos, eot,
                "llama".equals(model) ? 0 : -1, pad, addBos, addEos, "llama".equals(model), chatTemplate);
    }

    /** Reads the {@code tokenizer.*} keys of a GGUF file; missing optional keys take llama.cpp's defaults. */
    public static TokenizerSpec fromGguf(GgufMetadata md) {
        String model = md.getString("tokenizer.ggml.model");
        boolean llama = "llama".equals(model);
        return new TokenizerSpec(
                model,
                md.getString("tokenizer.ggml.pre", null),
                md.getStringArray("tokenizer.ggml.tokens"),
                md.contains("tokenizer.ggml.scores") ? md.getFloatArray("tokenizer.ggml.scores") : null,
                md.contains("tokenizer.ggml.token_type") ? md.getIntArray("tokenizer.ggml.token_type") : null,
                md.contains("tokenizer.ggml.merges") ? md.getStringArray("tokenizer.ggml.merges") : null,
                md.getInt("tokenizer.ggml.bos_token_id", -1),
                md.getInt("tokenizer.ggml.eos_token_id", -1),
                md.getInt("tokenizer.ggml.eot_token_id", -1),
                md.getInt("tokenizer.ggml.unknown_token_id", llama ? 0 : -1),
                md.getInt("tokenizer.ggml.padding_token_id", -1),
                md.getBoolean("tokenizer.ggml.add_bos_token", llama),
                md.getBoolean("tokenizer.ggml.add_eos_token", false),
                md.getBoolean("tokenizer.ggml.add_space_prefix", llama),
                md.getString("tokenizer.chat_template", null));
    }
}
