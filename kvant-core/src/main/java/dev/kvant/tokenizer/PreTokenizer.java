package dev.kvant.tokenizer;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The regex splitting a byte-level BPE vocabulary applies before merging: BPE never merges across the pieces this
 * produces. A pre-tokenizer is a sequence of regexes; each splits every piece of the previous step into its matches
 * and the text between matches, both kept (HF tokenizers' {@code Split} with {@code Isolated} behaviour, and
 * llama.cpp's {@code unicode_regex_split}).
 *
 * <p>The regexes are those of the models' {@code tokenizer.json} as llama.cpp maps {@code tokenizer.ggml.pre} names to
 * them, written for {@link java.util.regex}: {@code UNICODE_CHARACTER_CLASS} makes {@code \s} the Unicode White_Space
 * property, as in Oniguruma, which HF tokenizers uses; {@code (?i:'s|...)} is spelled {@code '[sS]|...} so that case
 * folding cannot reach non-ASCII letters (as llama.cpp does). Java's ordered alternation, greedy quantifiers and
 * backtracking into {@code \s+(?!\S)} behave as in those engines. One known difference from llama.cpp: for
 * {@link #GPT4O} and {@link #TEKKEN} llama.cpp rewrites the case classes with letter lookaheads that drop combining
 * marks ({@code \p{M}}) from words; kvant keeps the published regex (as HF tokenizers runs it), so the two split
 * text with combining marks differently.
 */
enum PreTokenizer {
    /** GPT-2: contractions, letter runs, digit runs and symbol runs each with one optional leading space. */
    GPT2(Regexes.GPT2),
    /**
     * What llama.cpp applies to a missing or "default" tokenizer.ggml.pre (older conversions): punctuation runs, then
     * GPT-2's pieces, then digit runs, then runs of three ASCII digits ("12345" is "123", "45").
     */
    LEGACY_DEFAULT("[\\p{P}\\$\\+<=>\\^~\\|]+", Regexes.GPT2_NO_FALLBACK, "\\p{N}+", "[0-9][0-9][0-9]"),
    /** Llama 3: case-insensitive contractions, digits in groups of at most three, newlines kept with symbols. */
    LLAMA3(Regexes.LLAMA3_LIKE.formatted("\\p{N}{1,3}")),
    /** Qwen 2: as Llama 3 but every digit on its own. */
    QWEN2(Regexes.LLAMA3_LIKE.formatted("\\p{N}")),
    /** StarCoder, SmolLM, Command-R, Refact: single digits first, then GPT-2. */
    STARCODER("\\p{N}", Regexes.GPT2_NO_FALLBACK),
    FALCON("[\\p{P}\\$\\+<=>\\^~\\|`]+", Regexes.GPT2_NO_FALLBACK, "[0-9][0-9][0-9]"),
    DEEPSEEK_CODER("[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}"),
    DEEPSEEK_V3("\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                    + "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    /** GPT-4o and Llama 4: upper/lower-case aware words with attached contractions. */
    GPT4O(Regexes.CASED_WORDS + "(?:" + Regexes.CONTRACTIONS + ")?|"
            + Regexes.CASED_WORDS_UPPER + "(?:" + Regexes.CONTRACTIONS + ")?"
            + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    /** Mistral's Tekken. */
    TEKKEN(Regexes.CASED_WORDS + "|" + Regexes.CASED_WORDS_UPPER
            + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");

    /** Regex sources shared by several pre-tokenizers (an enum cannot refer to its own static fields in constructors). */
    private static final class Regexes {
        static final String GPT2_NO_FALLBACK =
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
        static final String GPT2 = GPT2_NO_FALLBACK + "|\\s+";
        static final String CONTRACTIONS = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]";
        static final String LLAMA3_LIKE = "(?:" + CONTRACTIONS + ")|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|%s"
                + "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        static final String CASED_WORDS =
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+";
        static final String CASED_WORDS_UPPER =
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*";
    }

    /** {@code tokenizer.ggml.pre} values, grouped as llama.cpp groups them. */
    private static final Map<String, PreTokenizer> BY_NAME = new TreeMap<>();
    /** Pre-tokenizer names whose vocabularies use a piece that is itself a token as is (HF {@code ignore_merges}). */
    private static final Set<String> IGNORE_MERGES =
            Set.of("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "tekken");

    static {
        // a missing or "default" value: llama.cpp's legacy sequence, so that older files give its ids
        names(LEGACY_DEFAULT, "default");
        names(GPT2, "gpt-2", "phi-2", "mpt", "olmo", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
                "gigachat", "a.x-4.0", "mellum", "modern-bert", "roberta-bpe", "jina-v1-en", "jina-v2-code", "jais",
                "trillion", "granite-docling", "exaone4");
        names(LLAMA3, "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
                "smaug-bpe", "chatglm-bpe", "glm4");
        names(QWEN2, "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan", "kormo");
        names(STARCODER, "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b");
        names(FALCON, "falcon");
        names(DEEPSEEK_CODER, "deepseek-coder");
        names(DEEPSEEK_V3, "deepseek-v3", "hunyuan-dense");
        names(GPT4O, "gpt-4o", "llama4");
        names(TEKKEN, "tekken");
    }

    private static void names(PreTokenizer p, String... names) {
        for (String n : names) {
            BY_NAME.put(n, p);
        }
    }

    private final Pattern[] patterns;

    PreTokenizer(String... regexes) {
        patterns = Arrays.stream(regexes).map(r -> Pattern.compile(r, Pattern.UNICODE_CHARACTER_CLASS))
                .toArray(Pattern[]::new);
    }

    /**
     * The pre-tokenizer for a {@code tokenizer.ggml.pre} value (null means "default").
     *
     * @throws IllegalArgumentException listing the supported names
     */
    static PreTokenizer forName(String pre) {
        PreTokenizer p = BY_NAME.get(pre == null ? "default" : pre);
        if (p == null) {
            throw new IllegalArgumentException("tokenizer.ggml.pre '" + pre + "' is not supported; supported: "
                    + String.join(", ", BY_NAME.keySet()));
        }
        return p;
    }

    /** Whether vocabularies with this {@code tokenizer.ggml.pre} take a whole piece that is a token without merging. */
    static boolean ignoresMerges(String pre) {
        return pre != null && IGNORE_MERGES.contains(pre);
    }

    /** The pieces of {@code text}. */
    List<String> split(String text) {
        List<String> out = new ArrayList<>();
        split(text, 0, text.length(), out);
        return out;
    }

    /** Appends the pieces of {@code text[start, end)} to {@code out}; their concatenation is that span. */
    void split(String text, int start, int end, List<String> out) {
        if (start >= end) {
            return;
        }
        // Piece boundaries as a flat list of [start, end) pairs, refined by each regex in turn.
        int[] spans = {start, end};
        int count = 1;
        for (Pattern p : patterns) {
            int[] next = new int[Math.max(8, spans.length * 2)];
            int nextCount = 0;
            Matcher m = p.matcher(text);
            for (int k = 0; k < count; k++) {
                int s = spans[2 * k];
                int e = spans[2 * k + 1];
                m.region(s, e);
                int last = s;
                while (m.find()) {
                    if (m.end() == m.start()) {
                        continue; // an empty match splits nothing
                    }
                    if (m.start() > last) {
                        next = add(next, nextCount++, last, m.start());
                    }
                    next = add(next, nextCount++, m.start(), m.end());
                    last = m.end();
                }
                if (last < e) {
                    next = add(next, nextCount++, last, e);
                }
            }
            spans = next;
            count = nextCount;
        }
        for (int k = 0; k < count; k++) {
            out.add(text.substring(spans[2 * k], spans[2 * k + 1]));
        }
    }

    private static int[] add(int[] spans, int index, int s, int e) {
        if (2 * index + 2 > spans.length) {
            spans = Arrays.copyOf(spans, spans.length * 2);
        }
        spans[2 * index] = s;
        spans[2 * index + 1] = e;
        return spans;
    }
}
