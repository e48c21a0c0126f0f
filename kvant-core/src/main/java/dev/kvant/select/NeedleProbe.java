package dev.kvant.select;

import dev.kvant.tokenizer.ChatMessage;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tokenizer.Tokenizer;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.SplittableRandom;

/**
 * One long-context recall probe: a prompt with a fact planted at some depth, and the text a greedy continuation
 * must start with.
 *
 * @param id       name of the probe
 * @param length   nominal context length of its cell (tokens)
 * @param depth    where the fact sits: a fraction of the prompt (fixture probes), of the filler text (pass-key
 *                 probes, after the template's few dozen tokens of instructions)
 * @param prompt   the prompt text
 * @param expected what the continuation must start with
 * @param chat     the prompt holds chat-template markers: encode them as control tokens, and ignore leading
 *                 whitespace of the answer
 * @param plainRanges ranges of the prompt read as plain text even so ([start, end) pairs: a message's own text,
 *                 {@link dev.kvant.tokenizer.ChatTemplate#renderMarked}), or null
 */
public record NeedleProbe(String id, int length, double depth, String prompt, String expected, boolean chat,
                          int[] plainRanges) {

    /** A probe whose prompt has no ranges of plain text (a fixture's: its control-token texts are all the format's). */
    public NeedleProbe(String id, int length, double depth, String prompt, String expected, boolean chat) {
        this(id, length, depth, prompt, expected, chat, null);
    }

    /**
     * A probe of the fixture format ({@code needle-probes.jsonl}): one JSON object per line with {@code id}
     * ({@code L<length>-d<depth%>-<k>}), {@code n_ctx_tokens}, {@code depth}, {@code name}, {@code value} and
     * {@code prompt}, which ends with {@code name = "}; the continuation must start with {@code value"}.
     */
    public static NeedleProbe parse(String jsonLine) {
        Map<String, Object> o = new JsonObject(jsonLine).parse();
        String id = string(o, "id");
        String value = string(o, "value");
        String prompt = string(o, "prompt");
        double depth = number(o, "depth");
        int length = (int) number(o, "n_ctx_tokens");
        if (id.startsWith("L") && id.indexOf('-') > 1) {
            try {
                length = Integer.parseInt(id.substring(1, id.indexOf('-')));
            } catch (NumberFormatException e) {
                // not the fixture's naming: keep the measured length
            }
        }
        return new NeedleProbe(id, length, depth, prompt, value + "\"", false);
    }

    private static String string(Map<String, Object> o, String key) {
        if (!(o.get(key) instanceof String s)) {
            throw new IllegalArgumentException("needle probe lacks the string field '" + key + "'");
        }
        return s;
    }

    private static double number(Map<String, Object> o, String key) {
        if (!(o.get(key) instanceof Double d)) {
            throw new IllegalArgumentException("needle probe lacks the number field '" + key + "'");
        }
        return d;
    }

    /**
     * A pass-key probe for an instruction-tuned model: filler text cut to about {@code length} tokens with a
     * sentence naming a random 5-digit number planted at {@code depth} of the filler's tokens (on a line or sentence
     * boundary; the instructions before the filler put it a little later in the prompt: 10% of 1,024 tokens near
     * 14%), a
     * question at the end, in the model's chat template, the assistant's answer begun with "The pass key is"; the
     * continuation must give the number.
     */
    public static NeedleProbe passKey(Tokenizer tok, ChatTemplate template, String filler, int length, double depth,
                                      SplittableRandom rnd, int index) {
        if (filler.isBlank()) {
            throw new IllegalArgumentException("the haystack text is empty");
        }
        String key = Integer.toString(10000 + rnd.nextInt(90000));
        String needle = " The pass key is " + key + ". Remember it. " + key + " is the pass key. ";
        String intro = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
                + "I will quiz you about the pass key.\n\n";
        String question = "\n\nWhat is the pass key?";
        String answerStart = "The pass key is";
        int overhead = tok.encode(template.render(List.of(ChatMessage.user(intro + needle + question),
                ChatMessage.assistant(answerStart)), false), true, true).length + 8;
        int want = Math.max(16, length - overhead);
        StringBuilder hay = new StringBuilder();
        int[] fillerTokens = tok.encode(filler, false, false);
        List<Integer> ids = new ArrayList<>();
        while (ids.size() < want) {
            for (int t : fillerTokens) {
                ids.add(t);
                if (ids.size() == want) {
                    break;
                }
            }
        }
        int[] hayIds = ids.stream().mapToInt(Integer::intValue).toArray();
        hay.append(tok.decode(hayIds));
        // the needle goes at depth by tokens (the text of the first depth·want tokens), moved to the nearest sentence
        // or line boundary within 2% of the haystack either way, else left between those tokens: never far from the
        // depth the probe is labelled with (it used to go to the next boundary however far, or to the end)
        int at = Math.min(hay.length(), tok.decode(Arrays.copyOf(hayIds, (int) Math.round(want * depth))).length());
        int window = Math.max(16, hay.length() / 50);
        int best = -1;
        for (int d = 0; d <= window && best < 0; d++) {
            for (int c : new int[] {at - d, at + d}) {
                if (c > 0 && c <= hay.length() && (hay.charAt(c - 1) == '\n'
                        || c >= 2 && hay.charAt(c - 2) == '.' && hay.charAt(c - 1) == ' ')) {
                    best = c;
                    break;
                }
            }
        }
        hay.insert(best >= 0 ? best : at, needle);
        // the message (haystack text included) is plain text: a control-token text in the haystack stays text
        ChatTemplate.Rendered r = template.renderMarked(List.of(ChatMessage.user(intro + hay + question)), true);
        // the answer starts as the format starts an answer: after a space behind Llama 2's and Mistral's [/INST],
        // on a line of its own after a raw prompt's question, right after the other formats' assistant header
        String separator = switch (template.format()) {
            case RAW -> "\n";
            case LLAMA2, MISTRAL_V1, MISTRAL_V3, MISTRAL_V7 -> " ";
            default -> "";
        };
        String prompt = r.text() + separator + answerStart;
        String id = String.format(Locale.ROOT, "passkey-L%d-d%d-%02d", length, Math.round(depth * 100), index);
        return new NeedleProbe(id, length, depth, prompt, key, true, r.contentRanges());
    }

    /** A flat JSON object of string and number fields: all the fixture format needs. */
    private static final class JsonObject {
        private final String s;
        private int i;

        JsonObject(String s) {
            this.s = s;
        }

        Map<String, Object> parse() {
            Map<String, Object> m = new HashMap<>();
            skip();
            expect('{');
            skip();
            if (peek() == '}') {
                return m;
            }
            while (true) {
                skip();
                String key = str();
                skip();
                expect(':');
                skip();
                char c = peek();
                Object v;
                if (c == '"') {
                    v = str();
                } else if (c == '-' || c >= '0' && c <= '9') {
                    int from = i;
                    while (i < s.length() && "+-.eE0123456789".indexOf(s.charAt(i)) >= 0) {
                        i++;
                    }
                    v = Double.parseDouble(s.substring(from, i));
                } else {
                    int from = i;
                    while (i < s.length() && Character.isLetter(s.charAt(i))) {
                        i++;
                    }
                    v = s.substring(from, i);
                }
                m.put(key, v);
                skip();
                char sep = next();
                if (sep == '}') {
                    return m;
                }
                if (sep != ',') {
                    throw error("expected ',' or '}'");
                }
            }
        }

        private String str() {
            expect('"');
            StringBuilder sb = new StringBuilder();
            while (true) {
                char c = next();
                if (c == '"') {
                    return sb.toString();
                }
                if (c != '\\') {
                    sb.append(c);
                    continue;
                }
                char e = next();
                switch (e) {
                    case 'n' -> sb.append('\n');
                    case 't' -> sb.append('\t');
                    case 'r' -> sb.append('\r');
                    case 'b' -> sb.append('\b');
                    case 'f' -> sb.append('\f');
                    case 'u' -> {
                        if (i + 4 > s.length()) {
                            throw error("truncated \\u escape");
                        }
                        sb.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        i += 4;
                    }
                    default -> sb.append(e);
                }
            }
        }

        private void skip() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
        }

        private char peek() {
            if (i >= s.length()) {
                throw error("unexpected end");
            }
            return s.charAt(i);
        }

        private char next() {
            char c = peek();
            i++;
            return c;
        }

        private void expect(char c) {
            if (next() != c) {
                throw error("expected '" + c + "'");
            }
        }

        private IllegalArgumentException error(String what) {
            return new IllegalArgumentException("needle probe JSON, character " + i + ": " + what);
        }
    }
}
