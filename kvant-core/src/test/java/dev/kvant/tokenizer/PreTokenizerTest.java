package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Pre-tokenizer splits on strings where the regexes differ, each expectation worked out from the published regex:
 * alternatives tried in order, quantifiers greedy, {@code \s+(?!\S)} backing off one whitespace so that the last
 * space stays with the following word.
 */
class PreTokenizerTest {

    private static void assertSplit(PreTokenizer p, String text, String... pieces) {
        assertEquals(List.of(pieces), p.split(text), () -> p + " on '" + text.replace("\n", "\\n") + "'");
    }

    @Test
    void gpt2KeepsOneSpaceWithTheNextWordAndTrailingWhitespaceWhole() {
        assertSplit(PreTokenizer.GPT2, "Hello world  foo\n\n bar   ",
                "Hello", " world", " ", " foo", "\n\n", " bar", "   ");
        assertSplit(PreTokenizer.GPT2, "a\t\tb", "a", "\t", "\t", "b");
    }

    @Test
    void gpt2ContractionsAreLowerCaseOnly() {
        assertSplit(PreTokenizer.GPT2, "I'm don't I'M", "I", "'m", " don", "'t", " I", "'", "M");
    }

    @Test
    void gpt2KeepsWholeDigitRunsAndSplitsNewlinesBeforeWords() {
        assertSplit(PreTokenizer.GPT2, "12345 x", "12345", " x");
        // "\n\n" before a word: \s+(?!\S) backs off to the first "\n"; the second is matched alone by \s+.
        assertSplit(PreTokenizer.GPT2, "foo.\n\nbar", "foo", ".", "\n", "\n", "bar");
        assertSplit(PreTokenizer.GPT2, "$hello", "$", "hello");
    }

    @Test
    void llama3ContractionsIgnoreCase() {
        assertSplit(PreTokenizer.LLAMA3, "I'm don't I'M", "I", "'m", " don", "'t", " I", "'M");
    }

    @Test
    void llama3GroupsDigitsByThree() {
        assertSplit(PreTokenizer.LLAMA3, "12345 1234567", "123", "45", " ", "123", "456", "7");
    }

    @Test
    void llama3KeepsNewlinesWithSymbolsAndRunsOfNewlinesTogether() {
        assertSplit(PreTokenizer.LLAMA3, "foo.\n\nbar", "foo", ".\n\n", "bar");
        assertSplit(PreTokenizer.LLAMA3, "a\n\n\nb", "a", "\n\n\n", "b");
        assertSplit(PreTokenizer.LLAMA3, "x =\n  y", "x", " =\n", " ", " y");
        assertSplit(PreTokenizer.LLAMA3, "Hello world  foo\n\n bar   ",
                "Hello", " world", " ", " foo", "\n\n", " bar", "   ");
    }

    @Test
    void llama3LetsOneNonLetterLeadAWord() {
        // "$" leads "hello"; in " _world" the space takes the optional slot, '_' is no letter, so " _" is a symbol run.
        assertSplit(PreTokenizer.LLAMA3, "$hello _world", "$hello", " _", "world");
    }

    @Test
    void qwen2SplitsEveryDigit() {
        assertSplit(PreTokenizer.QWEN2, "12345", "1", "2", "3", "4", "5");
        assertSplit(PreTokenizer.QWEN2, "I'M", "I", "'M");
    }

    @Test
    void starcoderIsolatesDigitsBeforeTheGpt2Split() {
        assertSplit(PreTokenizer.STARCODER, "abc123 45", "abc", "1", "2", "3", " ", "4", "5");
    }

    @Test
    void unicodeWhitespaceAndLettersFollowUnicodeClasses() {
        // U+00A0 and U+3000 are White_Space; 'é' written e + U+0301 puts a mark (not a letter) after the 'e'.
        assertSplit(PreTokenizer.GPT2, "a\u00A0\u00A0b", "a", "\u00A0", "\u00A0", "b");
        assertSplit(PreTokenizer.GPT2, "\u3000日本", "\u3000", "日本");
        assertSplit(PreTokenizer.GPT2, "cafe\u0301!", "cafe", "\u0301!");
        assertSplit(PreTokenizer.GPT2, "x😀😀 y", "x", "😀😀", " y");
    }

    @Test
    void piecesAlwaysConcatenateToTheInput() {
        String text = "Mixed: 'Twas 12,345.6 ok?!\n\t  日本 😀 end  ";
        for (PreTokenizer p : PreTokenizer.values()) {
            assertEquals(text, String.join("", p.split(text)), p.name());
        }
    }

    @Test
    void aMissingOrDefaultNameSplitsAsLlamaCppsLegacySequence() {
        // punctuation runs first, then GPT-2's pieces, then digit runs, then three ASCII digits at a time
        assertEquals(List.of("123", "45"), PreTokenizer.LEGACY_DEFAULT.split("12345"));
        assertEquals(List.of("Hello", ",", " world", "!!"), PreTokenizer.LEGACY_DEFAULT.split("Hello, world!!"));
        assertEquals(List.of("12345"), PreTokenizer.GPT2.split("12345"));
    }

    @Test
    void namesMapAsLlamaCppGroupsThem() {
        assertSame(PreTokenizer.LEGACY_DEFAULT, PreTokenizer.forName(null));
        assertSame(PreTokenizer.LEGACY_DEFAULT, PreTokenizer.forName("default"));
        assertSame(PreTokenizer.GPT2, PreTokenizer.forName("gpt-2"));
        assertSame(PreTokenizer.LLAMA3, PreTokenizer.forName("llama-bpe"));
        assertSame(PreTokenizer.QWEN2, PreTokenizer.forName("qwen2"));
        assertSame(PreTokenizer.STARCODER, PreTokenizer.forName("smollm"));
        assertTrue(PreTokenizer.ignoresMerges("llama-bpe"));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> PreTokenizer.forName("nope"));
        assertTrue(e.getMessage().contains("'nope'") && e.getMessage().contains("llama-bpe"), e.getMessage());
    }
}
