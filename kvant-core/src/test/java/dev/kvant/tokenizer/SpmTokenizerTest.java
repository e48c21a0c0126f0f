package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.util.List;

import static dev.kvant.tokenizer.SyntheticVocab.BYTE0;
import static dev.kvant.tokenizer.SyntheticVocab.SPM_IM_START;
import static dev.kvant.tokenizer.SyntheticVocab.piece;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** SentencePiece on a hand-made vocabulary with scores and byte fallback (see {@link SyntheticVocab#SPM_PIECES}). */
class SpmTokenizerTest {

    private static final int UNK = 0;

    private final Tokenizer tok = Tokenizer.create(SyntheticVocab.spm(true));

    @Test
    void highestScoringPairMergesFirst() {
        // "hello world" -> "▁hello▁world" -> ▁ h e l l o ▁ w o r l d. By score: ll(-1), he(-2), llo(-3), ▁he(-4),
        // ▁w(-5), or(-6), ld(-7), ▁wor(-8), ▁world(-9). "hello" and "▁hello" are no pieces, so ▁he + llo remain.
        assertInstanceOf(SpmTokenizer.class, tok);
        assertArrayEquals(new int[] {piece("▁he"), piece("llo"), piece("▁world")}, tok.encode("hello world", false, false));
    }

    @Test
    void equalScoresMergeLeftmostFirst() {
        assertArrayEquals(new int[] {piece("▁"), piece("aa"), piece("a")}, tok.encode("aaa", false, false));
    }

    @Test
    void charactersThatAreNoPieceFallBackToTheirUtf8Bytes() {
        // 'é' is C3 A9, and byte token <0xNN> has id 3 + NN.
        assertArrayEquals(new int[] {piece("▁"), piece("h"), BYTE0 + 0xC3, BYTE0 + 0xA9}, tok.encode("hé", false, false));
        assertArrayEquals(new int[] {piece("▁"), BYTE0 + 0xF0, BYTE0 + 0x9F, BYTE0 + 0x98, BYTE0 + 0x80},
                tok.encode("😀", false, false));
        assertEquals("hé😀", tok.decode(tok.encode("hé😀", false, false)));
    }

    @Test
    void withoutByteTokensAnUnknownCharacterIsOneUnknownToken() {
        Tokenizer noBytes = Tokenizer.create(SyntheticVocab.spm(false));
        assertArrayEquals(new int[] {piece("▁"), piece("h"), UNK, piece("i")}, noBytes.encode("h😀i", false, false));
        assertEquals("h ⁇ i", noBytes.decode(noBytes.encode("h😀i", false, false)));
    }

    /**
     * Without byte tokens, text the vocabulary cannot spell decodes as SentencePiece's DecodeIds decodes its ids: the
     * unknown token is " ⁇ " and the piece after it keeps its space (a first "▁" is dropped as usual). A run of such
     * characters is one unknown token, as SentencePiece merges it. The ids and texts here are those sentencepiece 0.1.97
     * gives (EncodeIds, DecodeIds) for this vocabulary written as a BPE ModelProto without byte fallback.
     */
    @Test
    void withoutByteTokensUnknownCharactersDecodeAsSentencePieceDecodesThem() {
        Tokenizer noBytes = Tokenizer.create(SyntheticVocab.spm(false));
        int[] ids = noBytes.encode("a\u0001i world", false, false);
        assertArrayEquals(new int[] {piece("▁"), piece("a"), UNK, piece("i"), piece("▁world")}, ids);
        assertEquals("a ⁇ i world", noBytes.decode(ids));
        // 'b' is no piece either: "\u0001b" is one run
        ids = noBytes.encode("a\u0001b word", false, false);
        assertArrayEquals(new int[] {piece("▁"), piece("a"), UNK, piece("▁wor"), piece("d")}, ids);
        assertEquals("a ⁇  word", noBytes.decode(ids));
        ids = noBytes.encode("日本語 world", false, false);
        assertArrayEquals(new int[] {piece("▁"), UNK, piece("▁world")}, ids);
        assertEquals(" ⁇  world", noBytes.decode(ids));
        assertEquals(" ⁇  world", noBytes.decode(noBytes.encode("😀 world", false, false)));
        assertEquals("<s> ⁇  world", noBytes.decode(noBytes.encode("😀 world", true, false)));
        assertEquals("hello ⁇  ⁇ ", noBytes.decode(new int[] {piece("▁he"), piece("llo"), UNK, UNK}));
        // generated text renders it the same way
        StreamDecoder d = noBytes.streamDecoder();
        StringBuilder sb = new StringBuilder();
        for (int id : noBytes.encode("h😀i", false, false)) {
            sb.append(d.feed(id));
        }
        assertEquals(" h ⁇ i", sb + d.flush());
        assertEquals("<unk>", noBytes.tokenText(UNK));
    }

    /**
     * Without byte tokens a parsed {@code <unk>} has the ids of an unknown character (the text after it gets the space
     * prefix of a new fragment), so it decodes as that: which of the two the text was, the ids do not say.
     */
    @Test
    void withoutByteTokensAParsedUnknownTextDecodesAsAnUnknownCharacter() {
        Tokenizer noBytes = Tokenizer.create(SyntheticVocab.spm(false));
        int[] ids = noBytes.encode("hello<unk>world", false, true);
        assertArrayEquals(new int[] {piece("▁he"), piece("llo"), UNK, piece("▁world")}, ids);
        assertArrayEquals(noBytes.encode("hello😀 world", false, false), ids);
        assertEquals("hello ⁇  world", noBytes.decode(ids));
        ids = noBytes.encode("<unk> world", false, true);
        assertArrayEquals(new int[] {UNK, piece("▁"), piece("▁world")}, ids);
        assertEquals(" ⁇   world", noBytes.decode(ids));
    }

    /**
     * With byte tokens (Llama, Mistral) no character becomes the unknown token, only the text {@code <unk>} parsed as
     * a special token; the text after it got its own space prefix when encoded, which decode drops, as after a control
     * token, so it decodes as written.
     */
    @Test
    void withByteTokensOnlyAParsedUnknownTextIsTheUnknownTokenAndItDecodesAsWritten() {
        int[] ids = tok.encode("a\u0001b word", false, false);
        assertArrayEquals(new int[] {piece("▁"), piece("a"), BYTE0 + 0x01, BYTE0 + 'b', piece("▁wor"), piece("d")},
                ids);
        assertEquals("a\u0001b word", tok.decode(ids));
        assertEquals("日本語 world", tok.decode(tok.encode("日本語 world", false, false)));

        ids = tok.encode("<unk> world", false, true);
        assertArrayEquals(new int[] {UNK, piece("▁"), piece("▁world")}, ids);
        assertEquals("<unk> world", tok.decode(ids));
        assertArrayEquals(new int[] {piece("▁he"), piece("llo"), UNK, piece("▁world")},
                tok.encode("hello<unk>world", false, true));
        assertEquals("hello<unk>world", tok.decode(tok.encode("hello<unk>world", false, true)));
        for (String text : List.of("<unk>", "<unk>world", "hello <unk> world", "a\u0001<unk>\u0001 b", "<unk><unk> x",
                "world<unk>", " <unk>\n\nhi")) {
            assertEquals(text, tok.decode(tok.encode(text, false, true)), text);
            assertEquals("<s>" + text, tok.decode(tok.encode(text, true, true)), text);
            assertEquals(text, tok.decode(tok.encode(text, false, false)), text + ", not parsed");
        }
    }

    @Test
    void aBosTypedAsNormalStillRestartsTheSpacePrefixOnDecode() {
        // files without tokenizer.ggml.token_type: every token is normal, the BOS id included
        TokenizerSpec s = SyntheticVocab.spm(true);
        int[] normal = new int[s.tokenTypes().length];
        java.util.Arrays.fill(normal, 1);
        Tokenizer untyped = Tokenizer.create(new TokenizerSpec(s.model(), s.pre(), s.tokens(), s.scores(), normal,
                s.merges(), s.bos(), s.eos(), s.eot(), s.unk(), s.pad(), s.addBos(), s.addEos(), s.addSpacePrefix(),
                null));
        assertEquals("<s>hello", untyped.decode(untyped.encode("hello", true, false)));
    }

    @Test
    void bosIsAddedAndTheAddedSpaceIsRemovedOnDecode() {
        int[] ids = tok.encode("hello", true, false);
        assertArrayEquals(new int[] {1, piece("▁he"), piece("llo")}, ids);
        assertEquals("<s>hello", tok.decode(ids));
        // A real leading space survives: "  " + ... -> the encoder adds one, decode removes one.
        assertEquals(" hello", tok.decode(tok.encode(" hello", false, false)));
        assertEquals("", tok.decode(tok.encode("", false, false)));
    }

    @Test
    void controlTokensSplitTheTextAndRestartTheSpacePrefix() {
        // After a special token llama.cpp prefixes the next span with a space again.
        int[] ids = tok.encode("<|im_start|>hi", false, true);
        assertArrayEquals(new int[] {SPM_IM_START, piece("▁"), piece("h"), piece("i")}, ids);
        assertEquals("<|im_start|>hi", tok.decode(ids));
        int[] plain = tok.encode("<|im_start|>hi", false, false);
        assertTrue(java.util.Arrays.stream(plain).noneMatch(id -> id == SPM_IM_START));
        assertEquals("<|im_start|>hi", tok.decode(plain));
    }

    @Test
    void streamDecoderKeepsTheLeadingSpaceOfAContinuation() {
        StreamDecoder d = tok.streamDecoder();
        StringBuilder sb = new StringBuilder();
        for (int id : tok.encode("hello world", false, false)) {
            sb.append(d.feed(id));
        }
        assertEquals(" hello world", sb + d.flush());
    }

    @Test
    void tokenTextsKeepTheSpaceMark() {
        assertEquals("▁world", tok.tokenText(piece("▁world")));
        assertEquals(TokenType.BYTE, tok.tokenType(BYTE0 + 0x41));
        assertArrayEquals(new byte[] {0x41}, tok.tokenBytes(BYTE0 + 0x41));
        assertArrayEquals(" world".getBytes(java.nio.charset.StandardCharsets.UTF_8), tok.tokenBytes(piece("▁world")));
    }

    /** A prompt rendered by another tool's template starts with the BOS text: it gets one BOS, not two. */
    @Test
    void aPromptThatStartsWithTheBosTextGetsOneBos() {
        Tokenizer tok = Tokenizer.create(SyntheticVocab.spm(true));
        assertTrue(tok.addBos());
        int[] twice = tok.encode("<s>hello", true, true);
        assertEquals(tok.bos(), twice[1], "encode keeps what it was asked for");
        int[] ids = tok.encodePrompt("<s>hello");
        assertEquals(1, java.util.Arrays.stream(ids).filter(id -> id == tok.bos()).count(), java.util.Arrays.toString(ids));
        assertEquals(tok.bos(), ids[0]);
        assertArrayEquals(java.util.Arrays.copyOfRange(twice, 1, twice.length), ids);
        assertArrayEquals(tok.encode("hello", true, true), tok.encodePrompt("hello"));
    }
}
