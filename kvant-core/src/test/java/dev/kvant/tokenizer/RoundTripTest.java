package dev.kvant.tokenizer;

import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.Test;

import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;

/**
 * decode(encode(text)) is the text for arbitrary Unicode (letters of many scripts, combining marks, CJK, emoji with
 * joiners, every kind of whitespace), on fresh random texts each run; the seed is printed and in every message.
 */
class RoundTripTest {

    private static void roundTrips(Tokenizer tok, boolean parseSpecial, String what) {
        long seed = System.nanoTime();
        System.out.println(what + ": round-trip seed " + seed);
        Random r = new Random(seed);
        for (int i = 0; i < 500; i++) {
            String text = TokenizerCorpus.randomText(r, r.nextInt(60), false);
            int[] ids = tok.encode(text, false, parseSpecial);
            assertEquals(text, tok.decode(ids), () -> what + ", seed " + seed);
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"gpt-2", "llama-bpe", "qwen2", "starcoder", "deepseek-coder", "deepseek-v3", "falcon",
        "gpt-4o", "tekken"})
    void byteLevelBpeRoundTripsRandomUnicode(String pre) {
        roundTrips(Tokenizer.create(SyntheticVocab.bpe(pre)), false, "bpe " + pre);
        roundTrips(Tokenizer.create(SyntheticVocab.bpe(pre)), true, "bpe " + pre + " parsing specials");
    }

    @Test
    void sentencePieceRoundTripsRandomUnicodeIncludingLeadingSpaces() {
        Tokenizer tok = Tokenizer.create(SyntheticVocab.spm(true));
        roundTrips(tok, false, "spm");
        roundTrips(tok, true, "spm parsing specials");
        assertEquals("  two leading", tok.decode(tok.encode("  two leading", true, false)).substring("<s>".length()));
    }

    @Test
    void specialTokenTextsRoundTripWithAndWithoutParsing() {
        long seed = System.nanoTime();
        Random r = new Random(seed);
        Tokenizer bpe = Tokenizer.create(SyntheticVocab.bpe("llama-bpe"));
        Tokenizer spm = Tokenizer.create(SyntheticVocab.spm(true));
        for (int i = 0; i < 300; i++) {
            String text = TokenizerCorpus.randomText(r, r.nextInt(30), true).replace("\u2581", "");
            for (boolean parse : new boolean[] {false, true}) {
                assertEquals(text, bpe.decode(bpe.encode(text, false, parse)), "bpe, seed " + seed);
                assertEquals(text, spm.decode(spm.encode(text, false, parse)), "spm, seed " + seed);
            }
        }
    }
}
