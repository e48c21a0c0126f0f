package dev.kvant.tokenizer;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The byte-level BPE tokenizer on the real vocabulary of the tinycode fixture (see its README, "Tokenizer"). */
class TinycodeTokenizerTest {

    /**
     * SHA-256 of llama.cpp's ids for the whole of eval-heldout.txt (no BOS), each id as a little-endian int32:
     * {@code model.tokenize(text)} of node-llama-cpp 3.22.1 (llama.cpp's tokenizer) on tinycode-f16.gguf, 479,993 ids.
     */
    private static final String LLAMA_CPP_IDS_SHA256 = "5bce2e006f08cc84045c69772a0335b0c5c6093808be475fbd753c41b4597375";

    private static TokenizerSpec spec;
    private static Tokenizer tokenizer;
    private static String evalText;

    @BeforeAll
    static void load() throws IOException {
        spec = TestGgufVocab.spec(TestGgufVocab.fixture("tinycode-f16.gguf"));
        tokenizer = Tokenizer.create(spec);
        evalText = Files.readString(TestGgufVocab.fixture("eval-heldout.txt"), StandardCharsets.UTF_8);
    }

    @Test
    void fixtureVocabularyIsByteLevelBpeWithEndOfTextAsBosAndEos() {
        assertInstanceOf(BpeTokenizer.class, tokenizer);
        assertEquals(4096, tokenizer.vocabSize());
        assertEquals(0, tokenizer.bos());
        assertEquals(0, tokenizer.eos());
        assertTrue(tokenizer.addBos());
        assertEquals("<|endoftext|>", tokenizer.tokenText(0));
        assertEquals(TokenType.CONTROL, tokenizer.tokenType(0));
        assertTrue(tokenizer.isEndOfGeneration(0));
        assertFalse(tokenizer.isEndOfGeneration(1));
    }

    @Test
    void wholeEvalTextEncodesToTheModelCardCountWithBosFirst() {
        long t0 = System.nanoTime();
        int[] ids = tokenizer.encode(evalText, true, false);
        double seconds = (System.nanoTime() - t0) / 1e9;
        assertEquals(479_994, ids.length, "llama-tokenize gives BOS + 479,993 ids");
        assertEquals(0, ids[0]);
        assertTrue(seconds < 10, "encoding 1.5 MB took " + seconds + " s");
        System.out.printf("tinycode: %d ids for %d chars in %.2f s%n", ids.length, evalText.length(), seconds);
    }

    @Test
    void evalTextIdsAreExactlyLlamaCpps() throws NoSuchAlgorithmException {
        int[] ids = tokenizer.encode(evalText, false, false);
        assertEquals(479_993, ids.length);
        assertEquals(LLAMA_CPP_IDS_SHA256, sha256(ids));
    }

    @Test
    void decodeInvertsEncodeOnEvalText() {
        int[] ids = tokenizer.encode(evalText, true, false);
        assertEquals("<|endoftext|>" + evalText, tokenizer.decode(ids), "decode renders the BOS as its text");
        assertEquals(evalText, tokenizer.decode(Arrays.copyOfRange(ids, 1, ids.length)));
    }

    @Test
    void mergeEngineAgreesWithTextbookBpeOnEveryEvalPiece() {
        TextbookBpe reference = new TextbookBpe(spec.tokens(), spec.merges());
        BpeTokenizer bpe = (BpeTokenizer) tokenizer;
        Map<String, Boolean> seen = new HashMap<>();
        for (String piece : PreTokenizer.GPT2.split(evalText)) {
            if (seen.put(piece, Boolean.TRUE) == null) {
                assertArrayEquals(reference.encode(piece), bpe.mergePiece(piece), () -> "piece '" + piece + "'");
            }
        }
        assertTrue(seen.size() > 10_000, "distinct pieces: " + seen.size());
    }

    @Test
    void everyAsciiCharacterEncodesToItsByteSymbol() {
        // Token ids 1..256 are the 256 byte symbols in character order: the 188 printable bytes that stand for
        // themselves (ids 1..188, '!' first), then U+0100.. for the others (byte 0x00 -> id 189, '\n' -> 199, ' ' -> 221).
        assertArrayEquals(new int[] {1}, tokenizer.encode("!", false, false));
        assertArrayEquals(new int[] {33}, tokenizer.encode("A", false, false));
        assertArrayEquals(new int[] {189}, tokenizer.encode("\u0000", false, false));
        assertArrayEquals(new int[] {199}, tokenizer.encode("\n", false, false));
        assertArrayEquals(new int[] {221}, tokenizer.encode(" ", false, false));
        for (int b = 0; b < 128; b++) {
            int[] ids = tokenizer.encode(String.valueOf((char) b), false, false);
            assertEquals(1, ids.length, "byte " + b);
            assertEquals(String.valueOf(ByteLevel.charOf(b)), tokenizer.tokenText(ids[0]), "byte " + b);
        }
    }

    @Test
    void multiByteCharactersSpellTheirUtf8Bytes() {
        // 'Δ' is CE 94: two byte symbols (merged only if the vocabulary learned it), decoding back to the character.
        int[] ids = tokenizer.encode("Δ", false, false);
        byte[] joined = new byte[0];
        for (int id : ids) {
            byte[] b = tokenizer.tokenBytes(id);
            joined = Arrays.copyOf(joined, joined.length + b.length);
            System.arraycopy(b, 0, joined, joined.length - b.length, b.length);
        }
        assertArrayEquals(new byte[] {(byte) 0xCE, (byte) 0x94}, joined);
    }

    @Test
    void commonPythonWordsAreSingleTokens() {
        // "    return self": GPT-2 splits "   " (three spaces: the fourth joins the word), " return", " self".
        assertArrayEquals(new int[] {259, 361, 317}, tokenizer.encode("    return self", false, false));
        assertArrayEquals(new int[] {326}, tokenizer.encode("def", false, false));
        assertEquals("Ġreturn", tokenizer.tokenText(361));
    }

    @Test
    void endOfTextIsParsedOnlyWhenAskedTo() {
        String text = "a = 1<|endoftext|>b";
        int[] parsed = tokenizer.encode(text, false, true);
        int[] plain = tokenizer.encode(text, false, false);
        assertEquals(1, Arrays.stream(parsed).filter(id -> id == 0).count());
        assertEquals(0, Arrays.stream(plain).filter(id -> id == 0).count());
        assertEquals(text, tokenizer.decode(parsed));
        assertEquals(text, tokenizer.decode(plain));
        int split = List.of(Arrays.stream(parsed).boxed().toArray(Integer[]::new)).indexOf(0);
        assertArrayEquals(tokenizer.encode("a = 1", false, false), Arrays.copyOf(parsed, split));
        assertArrayEquals(tokenizer.encode("b", false, false), Arrays.copyOfRange(parsed, split + 1, parsed.length));
    }

    @Test
    void randomUnicodeRoundTripsThroughTheRealVocabulary() {
        long seed = System.nanoTime();
        java.util.Random r = new java.util.Random(seed);
        for (int i = 0; i < 500; i++) {
            String text = TokenizerCorpus.randomText(r, r.nextInt(60), true);
            for (boolean parse : new boolean[] {false, true}) {
                assertEquals(text, tokenizer.decode(tokenizer.encode(text, false, parse)), "seed " + seed);
            }
        }
    }

    private static String sha256(int[] ids) throws NoSuchAlgorithmException {
        ByteBuffer buf = ByteBuffer.allocate(ids.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        for (int id : ids) {
            buf.putInt(id);
        }
        return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(buf.array()));
    }
}
