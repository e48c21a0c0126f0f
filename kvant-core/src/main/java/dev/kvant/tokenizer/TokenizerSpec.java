package dev.kvant.tokenizer;

import dev.kvant.gguf.GgufMetadata;

import java.util.List;
import java.util.Set;

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

    /**
     * Pre-tokenizer names whose vocabularies start a text with BOS when the file does not say
     * ({@code tokenizer.ggml.add_bos_token} absent), as llama.cpp has it: the Llama 3 family's and Tekken's.
     */
    private static final Set<String> ADD_BOS_PRE = Set.of("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
            "pixtral", "midm-2.0", "lfm2", "tekken", "chameleon");

    /** Reads the {@code tokenizer.*} keys of a GGUF file; missing optional keys take llama.cpp's defaults. */
    public static TokenizerSpec fromGguf(GgufMetadata md) {
        String model = md.getString("tokenizer.ggml.model");
        String pre = md.getString("tokenizer.ggml.pre", null);
        boolean llama = "llama".equals(model);
        int bos = tokenId(md, "tokenizer.ggml.bos_token_id", llama ? 1 : -1);
        return new TokenizerSpec(
                model,
                pre,
                md.getStringArray("tokenizer.ggml.tokens"),
                md.contains("tokenizer.ggml.scores") ? md.getFloatArray("tokenizer.ggml.scores") : null,
                md.contains("tokenizer.ggml.token_type") ? md.getIntArray("tokenizer.ggml.token_type") : null,
                md.contains("tokenizer.ggml.merges") ? md.getStringArray("tokenizer.ggml.merges") : null,
                bos,
                tokenId(md, "tokenizer.ggml.eos_token_id", llama ? 2 : -1),
                tokenId(md, "tokenizer.ggml.eot_token_id", -1),
                tokenId(md, "tokenizer.ggml.unknown_token_id", llama ? 0 : -1),
                tokenId(md, "tokenizer.ggml.padding_token_id", -1),
                // a default BOS needs a BOS token; a file that asks for one without naming it is refused
                md.getBoolean("tokenizer.ggml.add_bos_token", defaultAddBos(model, pre) && bos >= 0),
                md.getBoolean("tokenizer.ggml.add_eos_token", false),
                md.getBoolean("tokenizer.ggml.add_space_prefix", llama),
                md.getString("tokenizer.chat_template", null));
    }

    /**
     * Whether a vocabulary starts a text with BOS when its file does not say: SentencePiece ({@code llama}) ones,
     * and the byte-level ones of the pre-tokenizers in {@link #ADD_BOS_PRE}.
     */
    static boolean defaultAddBos(String model, String pre) {
        return "llama".equals(model) || ("gpt2".equals(model) && pre != null && ADD_BOS_PRE.contains(pre));
    }

    /** A token id key: {@code dflt} when absent (SentencePiece files: BOS 1, EOS 2, UNK 0, as llama.cpp). */
    private static int tokenId(GgufMetadata md, String key, int dflt) {
        return md.contains(key) ? tokenId(key, md.getLong(key)) : dflt;
    }

    /**
     * A token id as a file stores it; -1 as an unsigned 32-bit value (0xFFFFFFFF, what some converters write for
     * "no such token") is -1, none; another value outside 0..2^31-1 is refused by name.
     */
    static int tokenId(String key, long value) {
        if (value == -1 || value == 0xFFFFFFFFL) {
            return -1;
        }
        if (value < 0 || value > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("GGUF key '" + key + "' is " + value + ", which is not a token id");
        }
        return (int) value;
    }
}
