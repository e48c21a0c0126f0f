package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A spec that cannot make a tokenizer is refused with a message naming the GGUF key and what is wrong; the defaults
 * of keys a file leaves out are llama.cpp's.
 */
class TokenizerCreateTest {

    private static void assertRefused(TokenizerSpec spec, String... expectedInMessage) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Tokenizer.create(spec));
        for (String s : expectedInMessage) {
            assertTrue(e.getMessage().contains(s), "'" + s + "' not in: " + e.getMessage());
        }
    }

    private static TokenizerSpec bpe(String model, String pre, float[] scores, int bos, boolean addBos) {
        TokenizerSpec s = SyntheticVocab.bpe("gpt-2");
        return new TokenizerSpec(model, pre, s.tokens(), scores, s.tokenTypes(), s.merges(), bos, -1, -1, -1, -1, addBos,
                false, false, null);
    }

    @Test
    void unknownModelNamesTheSupportedOnes() {
        assertRefused(bpe("bert", "gpt-2", null, -1, false), "tokenizer.ggml.model 'bert'", "'gpt2'", "'llama'");
        assertRefused(bpe(null, "gpt-2", null, -1, false), "tokenizer.ggml.model is missing");
    }

    @Test
    void unknownPreTokenizerListsTheSupportedNames() {
        assertRefused(bpe("gpt2", "mystery", null, -1, false), "tokenizer.ggml.pre 'mystery'", "qwen2", "llama-bpe");
    }

    @Test
    void inconsistentArraysAndFlagsAreNamed() {
        assertRefused(bpe("gpt2", "gpt-2", new float[3], -1, false), "tokenizer.ggml.scores has 3 entries");
        assertRefused(bpe("gpt2", "gpt-2", null, -1, true), "tokenizer.ggml.add_bos_token", "bos_token_id");
        assertRefused(bpe("gpt2", "gpt-2", null, 9999, true), "tokenizer.ggml.bos_token_id is 9999, outside");
        assertRefused(new TokenizerSpec("gpt2", "gpt-2", List.of("a"), null, null, null, -1, -1, -1, -1, false, false,
                null), "tokenizer.ggml.merges is missing");
        assertRefused(new TokenizerSpec("llama", null, List.of(), null, null, null, -1, -1, -1, -1, false, false, null),
                "tokenizer.ggml.tokens is missing or empty");
    }

    @Test
    void llamaThreeFamilyFilesStartWithBosWhenTheyDoNotSay() {
        assertTrue(TokenizerSpec.defaultAddBos("gpt2", "llama-bpe"));
        assertTrue(TokenizerSpec.defaultAddBos("gpt2", "pixtral"));
        assertTrue(TokenizerSpec.defaultAddBos("gpt2", "tekken"));
        assertTrue(TokenizerSpec.defaultAddBos("llama", null));
        assertFalse(TokenizerSpec.defaultAddBos("gpt2", "qwen2"));
        assertFalse(TokenizerSpec.defaultAddBos("gpt2", null));
    }

    @Test
    void anUnsignedMinusOneIdMeansNoToken() {
        // llama2.c's converter writes u32 0xFFFFFFFF for the padding and separator ids; llama.cpp loads such files
        assertEquals(-1, TokenizerSpec.tokenId("tokenizer.ggml.padding_token_id", 0xFFFFFFFFL));
        assertEquals(-1, TokenizerSpec.tokenId("tokenizer.ggml.padding_token_id", -1));
        assertEquals(7, TokenizerSpec.tokenId("tokenizer.ggml.bos_token_id", 7));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> TokenizerSpec.tokenId("tokenizer.ggml.bos_token_id", 1L << 40));
        assertTrue(e.getMessage().contains("tokenizer.ggml.bos_token_id"), e.getMessage());
    }
}
