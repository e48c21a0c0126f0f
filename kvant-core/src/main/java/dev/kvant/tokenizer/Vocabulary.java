package dev.kvant.tokenizer;

import java.util.ArrayList;
import java.util.BitSet;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The parts both tokenizer families share: token texts and types, the special ids and flags, the end-of-generation
 * set, and the splitting of input text around special-token texts.
 */
final class Vocabulary {

    /**
     * Token texts that end a turn in the chat formats kvant knows; llama.cpp keeps a similar list because GGUF files
     * mark only one EOS id while chat models stop on their turn marker.
     */
    private static final Set<String> END_OF_TURN_TEXTS = Set.of(
            "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<|eom_id|>", "<EOT>", "_<EOT>", "<|EOT|>", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|return|>",
            "<|call|>",
            // fill-in-the-middle padding and repository markers (Qwen2.5-Coder): a completion that reaches them is done
            "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>");

    /** A span of input text, or one special token found in it. */
    record Fragment(int start, int end, int token) {
        boolean isToken() {
            return token >= 0;
        }
    }

    private final String[] texts;
    private final TokenType[] types;
    private final float[] scores;
    private final Map<String, Integer> ids;
    final int bos;
    final int eos;
    final int eot;
    final int unk;
    final boolean addBos;
    final boolean addEos;
    private final BitSet endOfGeneration = new BitSet();
    private final SpecialNode specialRoot = new SpecialNode();
    private final boolean hasUserDefined;

    Vocabulary(TokenizerSpec spec) {
        List<String> tokens = spec.tokens();
        if (tokens == null || tokens.isEmpty()) {
            throw new IllegalArgumentException("tokenizer.ggml.tokens is missing or empty");
        }
        int n = tokens.size();
        if (spec.scores() != null && spec.scores().length != n) {
            throw new IllegalArgumentException("tokenizer.ggml.scores has " + spec.scores().length
                    + " entries but tokenizer.ggml.tokens has " + n);
        }
        if (spec.tokenTypes() != null && spec.tokenTypes().length != n) {
            throw new IllegalArgumentException("tokenizer.ggml.token_type has " + spec.tokenTypes().length
                    + " entries but tokenizer.ggml.tokens has " + n);
        }
        texts = new String[n];
        types = new TokenType[n];
        scores = spec.scores() != null ? spec.scores() : new float[n];
        ids = HashMap.newHashMap(n);
        boolean userDefined = false;
        for (int i = 0; i < n; i++) {
            String text = tokens.get(i);
            if (text == null) {
                throw new IllegalArgumentException("tokenizer.ggml.tokens[" + i + "] is null");
            }
            texts[i] = text;
            types[i] = spec.tokenTypes() != null ? TokenType.ofCode(spec.tokenTypes()[i]) : TokenType.NORMAL;
            // an end-of-turn marker typed otherwise by its converter (plain text, user-defined) is a control token all
            // the same, as llama.cpp retypes it: a chat template's marker must reach the model as the one token it was
            // trained on, and text that merely spells it is text unless special tokens are parsed
            if (types[i] != TokenType.CONTROL && END_OF_TURN_TEXTS.contains(text)) {
                types[i] = TokenType.CONTROL;
            }
            // Duplicate texts occur in some converted vocabularies; the lowest id is the one text maps to.
            if (!text.isEmpty()) {
                ids.putIfAbsent(text, i);
            }
            userDefined |= types[i] == TokenType.USER_DEFINED && !text.isEmpty();
        }
        hasUserDefined = userDefined;
        bos = checkId(spec.bos(), n, "tokenizer.ggml.bos_token_id");
        eos = checkId(spec.eos(), n, "tokenizer.ggml.eos_token_id");
        eot = checkId(spec.eot(), n, "tokenizer.ggml.eot_token_id");
        unk = checkId(spec.unk(), n, "tokenizer.ggml.unknown_token_id");
        // tokenizer.ggml.padding_token_id is not used (nothing is padded), so a file whose id lies outside the
        // vocabulary still loads, as llama.cpp loads it
        addBos = spec.addBos();
        addEos = spec.addEos();
        if (addBos && bos < 0) {
            throw new IllegalArgumentException("tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is"
                    + (spec.bos() >= n ? " " + spec.bos() + ", outside the vocabulary of " + n + " tokens" : " not set"));
        }
        if (addEos && eos < 0) {
            throw new IllegalArgumentException("tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is"
                    + (spec.eos() >= n ? " " + spec.eos() + ", outside the vocabulary of " + n + " tokens" : " not set"));
        }
        for (int i = 0; i < n; i++) {
            TokenType t = types[i];
            if ((t == TokenType.CONTROL || t == TokenType.USER_DEFINED || t == TokenType.UNKNOWN) && !texts[i].isEmpty()
                    && ids.get(texts[i]) == i) {
                addSpecial(texts[i], i, t == TokenType.USER_DEFINED);
            }
            if (END_OF_TURN_TEXTS.contains(texts[i])) {
                endOfGeneration.set(i);
            }
        }
        if (eos >= 0) {
            endOfGeneration.set(eos);
        }
        if (eot >= 0) {
            endOfGeneration.set(eot);
        }
    }

    /** A special id from the metadata; one outside the vocabulary is left unset with a warning, as llama.cpp does. */
    private static int checkId(int id, int n, String key) {
        if (id < -1 || id >= n) {
            System.getLogger(Vocabulary.class.getName()).log(System.Logger.Level.WARNING,
                    key + " = " + id + " is outside the vocabulary of " + n + " tokens; left unset");
            return -1;
        }
        return id;
    }

    int size() {
        return texts.length;
    }

    String text(int id) {
        checkRange(id);
        return texts[id];
    }

    TokenType type(int id) {
        checkRange(id);
        return types[id];
    }

    float score(int id) {
        return scores[id];
    }

    /** The id whose text is exactly {@code text}, or -1. */
    int id(String text) {
        Integer id = ids.get(text);
        return id == null ? -1 : id;
    }

    boolean isEndOfGeneration(int id) {
        return id >= 0 && endOfGeneration.get(id);
    }

    void checkRange(int id) {
        if (id < 0 || id >= texts.length) {
            throw new IllegalArgumentException("token id " + id + " is outside the vocabulary of " + texts.length + " tokens");
        }
    }

    /**
     * Splits {@code text} into plain-text spans and special tokens: user-defined tokens always, control and unknown
     * tokens only when {@code parseSpecial}. Scans left to right and takes the longest special text starting at each
     * position.
     */
    List<Fragment> partition(String text, boolean parseSpecial) {
        return partition(text, parseSpecial, null);
    }

    /** {@link #partition(String, boolean)}, control tokens recognised only where no plain range reaches. */
    List<Fragment> partition(String text, boolean parseSpecial, int[] plainRanges) {
        List<Fragment> out = new ArrayList<>();
        if (text.isEmpty()) {
            return out;
        }
        java.util.BitSet plain = null;
        if (plainRanges != null && plainRanges.length > 0) {
            if (plainRanges.length % 2 != 0) {
                throw new IllegalArgumentException("plain ranges come in [start, end) pairs");
            }
            plain = new java.util.BitSet(text.length());
            for (int k = 0; k < plainRanges.length; k += 2) {
                int from = plainRanges[k], to = plainRanges[k + 1];
                if (from < 0 || to < from || to > text.length()) {
                    throw new IllegalArgumentException("plain range [" + from + ", " + to + ") outside a text of "
                            + text.length() + " characters");
                }
                plain.set(from, to);
            }
        }
        if (!parseSpecial && !hasUserDefined || specialRoot.children.isEmpty()) {
            out.add(new Fragment(0, text.length(), -1));
            return out;
        }
        int plainStart = 0;
        int i = 0;
        while (i < text.length()) {
            int matchEnd = -1;
            int matchId = -1;
            SpecialNode node = specialRoot;
            for (int j = i; j < text.length(); j++) {
                node = node.children.get(text.charAt(j));
                if (node == null) {
                    break;
                }
                if (node.token >= 0 && (parseSpecial && !reaches(plain, i, j + 1) || node.alwaysSplit)) {
                    matchEnd = j + 1;
                    matchId = node.token;
                }
            }
            if (matchId < 0) {
                i++;
                continue;
            }
            if (i > plainStart) {
                out.add(new Fragment(plainStart, i, -1));
            }
            out.add(new Fragment(i, matchEnd, matchId));
            i = matchEnd;
            plainStart = i;
        }
        if (plainStart < text.length()) {
            out.add(new Fragment(plainStart, text.length(), -1));
        }
        return out;
    }

    /** Whether a plain range covers any character of [from, to). */
    private static boolean reaches(java.util.BitSet plain, int from, int to) {
        if (plain == null) {
            return false;
        }
        int next = plain.nextSetBit(from);
        return next >= 0 && next < to;
    }

    private void addSpecial(String text, int id, boolean alwaysSplit) {
        SpecialNode node = specialRoot;
        for (int k = 0; k < text.length(); k++) {
            node = node.children.computeIfAbsent(text.charAt(k), c -> new SpecialNode());
        }
        node.token = id;
        node.alwaysSplit = alwaysSplit;
    }

    /** A trie over special-token texts, one UTF-16 unit per level. */
    private static final class SpecialNode {
        final Map<Character, SpecialNode> children = new HashMap<>(4);
        int token = -1;
        boolean alwaysSplit;
    }
}
