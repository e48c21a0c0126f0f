package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import static dev.kvant.tokenizer.SyntheticVocab.AA;
import static dev.kvant.tokenizer.SyntheticVocab.HE;
import static dev.kvant.tokenizer.SyntheticVocab.HELL;
import static dev.kvant.tokenizer.SyntheticVocab.HELLO;
import static dev.kvant.tokenizer.SyntheticVocab.IM_END;
import static dev.kvant.tokenizer.SyntheticVocab.IM_START;
import static dev.kvant.tokenizer.SyntheticVocab.LD;
import static dev.kvant.tokenizer.SyntheticVocab.LL;
import static dev.kvant.tokenizer.SyntheticVocab.OR;
import static dev.kvant.tokenizer.SyntheticVocab.SPACE_WORLD;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Byte-level BPE on a hand-made vocabulary (ids 0..255 are the bytes; see {@link SyntheticVocab#BPE_MERGES}). */
class BpeTokenizerTest {

    private final Tokenizer tok = Tokenizer.create(SyntheticVocab.bpe("gpt-2"));

    private int[] enc(String text) {
        return tok.encode(text, false, false);
    }

    @Test
    void mergesApplyInRankOrderWithinEachPiece() {
        // "hello" -> h e l l o: "h e" (rank 0) then "l l" (1) then "he ll" (2) then "hell o" (3).
        // " world" -> Ġ w o r l d: "Ġ w" (4), "o r" (5), "Ġw or" (6), "l d" (7), "Ġwor ld" (8).
        assertArrayEquals(new int[] {HELLO, SPACE_WORLD}, enc("hello world"));
        assertArrayEquals(new int[] {HELL}, enc("hell"));
        // Without its leading space "world" never reaches "Ġw", so "or" and "ld" stay apart from 'w'.
        assertArrayEquals(new int[] {'w', OR, LD}, enc("world"));
    }

    @Test
    void equalRanksMergeLeftmostFirst() {
        assertArrayEquals(new int[] {AA, 'a'}, enc("aaa"));
        assertArrayEquals(new int[] {AA, AA, 'a'}, enc("aaaaa"));
    }

    @Test
    void mergesNeverCrossPreTokenizerPieces() {
        // "he llo": the space starts a new piece " llo" = Ġ l l o, so "he" and "llo" are never joined.
        assertArrayEquals(new int[] {HE, ' ', LL, 'o'}, enc("he llo"));
    }

    @Test
    void bytesWithoutMergesAreTheirOwnTokens() {
        assertArrayEquals(new int[] {0xE2, 0x82, 0xAC}, enc("€"));
        assertArrayEquals(new int[] {0xF0, 0x9F, 0x98, 0x80}, enc("😀"));
        assertEquals("€😀", tok.decode(new int[] {0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80}));
    }

    @Test
    void controlTokensAreRecognisedOnlyWhenParsingSpecialTokens() {
        String text = "<|im_start|>hello<|im_end|>";
        assertArrayEquals(new int[] {IM_START, HELLO, IM_END}, tok.encode(text, false, true));
        int[] plain = tok.encode(text, false, false);
        assertFalse(Arrays.stream(plain).anyMatch(id -> id == IM_START || id == IM_END), Arrays.toString(plain));
        assertEquals(text, tok.decode(plain));
        assertEquals(text, tok.decode(tok.encode(text, false, true)));
        // A cut-off marker is plain text even when parsing.
        assertFalse(Arrays.stream(tok.encode("<|im_start|", false, true)).anyMatch(id -> id == IM_START));
    }

    @Test
    void controlTokenTextsInPlainRangesArePlainText() {
        String text = "<|im_start|>hello<|im_end|>";   // 12 + 5 + 10 characters
        int[] all = tok.encode(text, false, true, new int[0]);
        assertArrayEquals(new int[] {IM_START, HELLO, IM_END}, all, "no ranges: as encode");
        int[] message = tok.encode(text, false, true, new int[] {12, 27});   // "hello<|im_end|>" is a message's
        assertEquals(IM_START, message[0]);
        assertFalse(Arrays.stream(message).skip(1).anyMatch(id -> id == IM_START || id == IM_END),
                Arrays.toString(message));
        assertEquals(text, tok.decode(message));
        // a range that reaches one character into the marker makes all of it plain; one that ends before it, none
        assertFalse(Arrays.stream(tok.encode(text, false, true, new int[] {12, 18})).anyMatch(id -> id == IM_END));
        assertArrayEquals(new int[] {IM_START, HELLO, IM_END}, tok.encode(text, false, true, new int[] {12, 17}));
        assertThrows(IllegalArgumentException.class, () -> tok.encode(text, false, true, new int[] {12}));
        assertThrows(IllegalArgumentException.class, () -> tok.encode(text, false, true, new int[] {20, 40}));
    }

    @Test
    void addSpecialFollowsTheVocabularyFlags() {
        TokenizerSpec s = SyntheticVocab.bpe("gpt-2");
        Tokenizer withBoth = Tokenizer.create(new TokenizerSpec(s.model(), s.pre(), s.tokens(), s.scores(),
                s.tokenTypes(), s.merges(), IM_START, IM_END, -1, -1, -1, true, true, false, null));
        assertArrayEquals(new int[] {IM_START, HELLO, IM_END}, withBoth.encode("hello", true, false));
        assertArrayEquals(new int[] {HELLO}, withBoth.encode("hello", false, false));
        assertArrayEquals(new int[] {HELLO}, tok.encode("hello", true, false), "flags off: nothing added");
        assertArrayEquals(new int[0], tok.encode("", false, true));
    }

    @Test
    void anEndOfTurnMarkerTypedAsTextIsStillOneControlToken() {
        // some converters type <|im_end|> as a normal token; llama.cpp retypes it, and a chat prompt's marker must
        // reach the model as that one token
        TokenizerSpec s = SyntheticVocab.bpe("gpt-2");
        int[] types = s.tokenTypes().clone();
        types[IM_END] = 1;   // NORMAL
        Tokenizer typedAsText = Tokenizer.create(new TokenizerSpec(s.model(), s.pre(), s.tokens(), s.scores(), types,
                s.merges(), -1, IM_END, -1, -1, -1, false, false, false, null));
        assertArrayEquals(new int[] {HELLO, IM_END}, typedAsText.encode("hello<|im_end|>", false, true));
        assertTrue(typedAsText.isEndOfGeneration(IM_END));
        types[IM_END] = 4;   // USER_DEFINED: matched in any text as such; as a control token, only when parsing
        Tokenizer userDefined = Tokenizer.create(new TokenizerSpec(s.model(), s.pre(), s.tokens(), s.scores(), types,
                s.merges(), -1, IM_END, -1, -1, -1, false, false, false, null));
        assertArrayEquals(new int[] {HELLO, IM_END}, userDefined.encode("hello<|im_end|>", false, true));
        assertFalse(Arrays.stream(userDefined.encode("hello<|im_end|>", false, false)).anyMatch(id -> id == IM_END));
    }

    @Test
    void aSpecialIdOutsideTheVocabularyIsLeftUnsetAndTheModelLoads() {
        // llama.cpp warns ("bad special token") and goes on; a model must not fail to load over an unused id
        TokenizerSpec s = SyntheticVocab.bpe("gpt-2");
        int n = s.tokens().size();
        Tokenizer t = Tokenizer.create(new TokenizerSpec(s.model(), s.pre(), s.tokens(), s.scores(), s.tokenTypes(),
                s.merges(), -1, IM_END, n, n + 5, -1, false, false, false, null));
        assertEquals(IM_END, t.eos());
        assertTrue(t.isEndOfGeneration(IM_END));
        assertFalse(t.isEndOfGeneration(HELLO));
    }

    @Test
    void endOfGenerationCoversEosAndEndOfTurnMarkers() {
        assertEquals(IM_END, tok.eos());
        assertTrue(tok.isEndOfGeneration(IM_END));
        assertFalse(tok.isEndOfGeneration(IM_START));
        assertFalse(tok.isEndOfGeneration(HELLO));
        assertFalse(tok.isEndOfGeneration(-1));
    }

    @Test
    void llama3PiecesThatAreTokensSkipTheMerges() {
        // Under llama-bpe (HF ignore_merges) a piece spelled by one token is that token even when the merges would
        // not build it: "lld" is no merge result, but add it as a token and "lld" becomes one id.
        TokenizerSpec s = SyntheticVocab.bpe("llama-bpe");
        List<String> tokens = new ArrayList<>(s.tokens());
        tokens.add("lld");
        int[] types = Arrays.copyOf(s.tokenTypes(), tokens.size());
        types[tokens.size() - 1] = 1;
        TokenizerSpec withLld = new TokenizerSpec("gpt2", "llama-bpe", tokens, null, types, s.merges(), -1, -1, -1, -1,
                -1, false, false, false, null);
        assertArrayEquals(new int[] {tokens.size() - 1}, Tokenizer.create(withLld).encode("lld", false, false));
        TokenizerSpec gpt2 = new TokenizerSpec("gpt2", "gpt-2", tokens, null, types, s.merges(), -1, -1, -1, -1, -1,
                false, false, false, null);
        assertArrayEquals(new int[] {LL, 'd'}, Tokenizer.create(gpt2).encode("lld", false, false));
    }

    @Test
    void mergeNamingAMissingTokenIsRejectedWithItsIndex() {
        TokenizerSpec s = SyntheticVocab.bpe("gpt-2");
        List<String> merges = new ArrayList<>(s.merges());
        merges.add("x y");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Tokenizer.create(
                new TokenizerSpec("gpt2", "gpt-2", s.tokens(), null, s.tokenTypes(), merges, -1, -1, -1, -1, -1,
                        false, false, false, null)));
        assertTrue(e.getMessage().contains("tokenizer.ggml.merges[10] = 'x y'"), e.getMessage());
    }

    /**
     * A special id outside the vocabulary is refused, except the padding id, which nothing reads: converted files
     * with a stale one load (as llama.cpp loads them, with a warning there) and tokenize as without it.
     */
    @Test
    void anOutOfRangeSpecialIdIsLeftUnsetUnlessTheModelMustAddIt() {
        TokenizerSpec s = SyntheticVocab.bpe("gpt-2");
        int n = s.tokens().size();
        Tokenizer unset = Tokenizer.create(new TokenizerSpec("gpt2", "gpt-2", s.tokens(), null, s.tokenTypes(),
                s.merges(), -1, n + 5, -1, -1, -1, false, false, false, null));
        assertEquals(-1, unset.eos());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Tokenizer.create(
                new TokenizerSpec("gpt2", "gpt-2", s.tokens(), null, s.tokenTypes(), s.merges(), -1, n + 5, -1, -1, -1,
                        false, true, false, null)));
        assertTrue(e.getMessage().contains("eos_token_id is " + (n + 5) + ", outside the vocabulary"),
                e.getMessage());
        Tokenizer padded = Tokenizer.create(new TokenizerSpec("gpt2", "gpt-2", s.tokens(), null, s.tokenTypes(),
                s.merges(), -1, -1, -1, -1, 999_999, false, false, false, null));
        assertArrayEquals(tok.encode("hello world", false, false), padded.encode("hello world", false, false));
    }

    @Test
    void decodeRejectsIdsOutsideTheVocabulary() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> tok.decode(new int[] {5000}));
        assertTrue(e.getMessage().contains("5000"), e.getMessage());
    }
}
