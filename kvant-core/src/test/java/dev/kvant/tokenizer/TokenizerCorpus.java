package dev.kvant.tokenizer;

import java.util.ArrayList;
import java.util.List;
import java.util.Random;

/**
 * Test texts that stress tokenizers: contractions in both cases, digit runs, whitespace runs of every kind before
 * words and at the end, newlines next to symbols, combining marks, CJK, emoji with joiners, and special-token texts
 * (whole, cut off, glued to words). Random texts come from a seeded mix of these.
 */
final class TokenizerCorpus {

    /** The special tokens the agreement vocabularies add after the fixture's own tokens. */
    static final List<String> EXTRA_TOKENS = List.of("<|im_start|>", "<|im_end|>", "<tool>");
    static final int[] EXTRA_TYPES = {3, 3, 4};

    static final List<String> TRICKY = List.of(
            "",
            " ",
            "Hello world",
            "Hello world  foo\n\n bar   ",
            "I'm sure you'LL see it's THEIR car, isn't it? We'd've gone. I'M DONE'S",
            "don't can't won't shouldn't've",
            "12345 1234567 3.14159 0x1F 1e-10 ٣٤٥٦ ²³ Ⅻ",
            "x = 1000000\ny=22\n\n\n\t\tz = 333",
            "foo.\n\nbar!!\r\n\r\nbaz?!\n",
            "    def f(self):\n        return self.x  \n",
            "trailing spaces   ",
            "\ttab\t\tdouble tab \t mixed",
            "nbsp\u00A0here and\u3000ideographic and\u2009thin",
            "e\u0301 cafe\u0301 n\u0303 a\u0308\u0304",
            "日本語のテキストと中文混合 한국어 텍스트",
            "emoji 😀😃 family 👨‍👩‍👧 flag 🇯🇵 ok👍🏽",
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|><|im_start|>x<|im_end|>",
            "broken <|im_sta and <|im_end| and |>",
            "use <tool> and<tool>glued<tool>",
            "<|endoftext|>start and end<|endoftext|>",
            "  leading two spaces",
            "\n\nleading newlines",
            "a\u000Bb\u000Cc\u0085d\u2028e",
            "!!!???...---___===",
            "MixedCASE camelCase snake_case SCREAMING_CASE");

    private static final String[] FRAGMENTS = {
        "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'t", "'m", "don't", "<|im_start|>", "<|im_end|>", "<tool>",
        "<|endoftext|>", "<|im", "  ", "\n\n", "123456", "    ", "...", " the", " self", "def ", "return"
    };
    private static final int[] WHITESPACE = {' ', '\t', '\n', '\r', 0x00A0, 0x3000, 0x2009, 0x000B, 0x000C, 0x0085};

    private TokenizerCorpus() {
    }

    /** The tricky texts followed by {@code count} random ones from {@code seed}. */
    static List<String> texts(long seed, int count) {
        List<String> out = new ArrayList<>(TRICKY);
        Random r = new Random(seed);
        for (int i = 0; i < count; i++) {
            out.add(randomText(r, r.nextInt(48), true));
        }
        return out;
    }

    /**
     * A random text of about {@code length} code points. Without {@code withFragments} it has no special-token texts
     * and no U+2581, so SentencePiece round trips are exact.
     */
    static String randomText(Random r, int length, boolean withFragments) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < length; i++) {
            int bucket = r.nextInt(withFragments ? 11 : 10);
            switch (bucket) {
                case 0, 1, 2 -> sb.appendCodePoint(32 + r.nextInt(95));
                case 3 -> sb.appendCodePoint('a' + r.nextInt(26));
                case 4 -> sb.appendCodePoint(WHITESPACE[r.nextInt(WHITESPACE.length)]);
                case 5 -> sb.appendCodePoint(r.nextBoolean() ? '0' + r.nextInt(10) : 0x0660 + r.nextInt(10));
                case 6 -> sb.appendCodePoint(r.nextBoolean() ? 0x00C0 + r.nextInt(0x190) : 0x0391 + r.nextInt(0x38));
                case 7 -> sb.appendCodePoint(0x0300 + r.nextInt(0x70));
                case 8 -> sb.appendCodePoint(r.nextBoolean() ? 0x4E00 + r.nextInt(0x200) : 0xAC00 + r.nextInt(0x50));
                case 9 -> {
                    sb.appendCodePoint(0x1F300 + r.nextInt(0x150));
                    if (r.nextInt(4) == 0) {
                        sb.appendCodePoint(r.nextBoolean() ? 0x200D : 0xFE0F);
                    }
                }
                default -> sb.append(FRAGMENTS[r.nextInt(FRAGMENTS.length)]);
            }
        }
        return sb.toString();
    }
}
