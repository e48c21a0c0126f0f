package dev.kvant.tokenizer;

import java.util.ArrayList;
import java.util.List;

/** Small vocabularies written by hand, so that expected tokenizations can be worked out on paper. */
final class SyntheticVocab {

    private SyntheticVocab() {
    }

    /** Byte-level BPE ids: 0..255 are the bytes themselves, then these merges in rank order, then two control tokens. */
    static final String[] BPE_MERGES = {
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "a a",
    };
    static final int HE = 256;
    static final int LL = 257;
    static final int HELL = 258;
    static final int HELLO = 259;
    static final int OR = 261;
    static final int LD = 263;
    static final int SPACE_WORLD = 264;
    static final int AA = 265;
    static final int IM_START = 266;
    static final int IM_END = 267;

    static TokenizerSpec bpe(String pre) {
        List<String> tokens = new ArrayList<>();
        for (int b = 0; b < 256; b++) {
            tokens.add(String.valueOf(ByteLevel.charOf(b)));
        }
        for (String m : BPE_MERGES) {
            tokens.add(m.replace(" ", ""));
        }
        tokens.add("<|im_start|>");
        tokens.add("<|im_end|>");
        int[] types = new int[tokens.size()];
        java.util.Arrays.fill(types, 1);
        types[IM_START] = 3;
        types[IM_END] = 3;
        return new TokenizerSpec("gpt2", pre, tokens, null, types, List.of(BPE_MERGES), -1, IM_END, -1, -1, -1,
                false, false, false, null);
    }

    /**
     * SentencePiece: {@code <unk> <s> </s>}, byte tokens {@code <0x00>..<0xFF>} (ids 3..258), then pieces with scores.
     * Single characters score lowest; among pairs "ll" is best, then "he", "llo", "▁he", ...
     */
    static final String[][] SPM_PIECES = {
        {"▁", "-100"}, {"h", "-100"}, {"e", "-100"}, {"l", "-100"}, {"o", "-100"}, {"w", "-100"}, {"r", "-100"},
        {"d", "-100"}, {"a", "-100"}, {"i", "-100"},
        {"ll", "-1"}, {"he", "-2"}, {"llo", "-3"}, {"▁he", "-4"}, {"▁w", "-5"}, {"or", "-6"}, {"ld", "-7"},
        {"▁wor", "-8"}, {"▁world", "-9"}, {"aa", "-10"},
    };
    static final int BYTE0 = 3;
    static final int FIRST_PIECE = 259;

    static int piece(String text) {
        for (int i = 0; i < SPM_PIECES.length; i++) {
            if (SPM_PIECES[i][0].equals(text)) {
                return FIRST_PIECE + i;
            }
        }
        throw new IllegalArgumentException(text);
    }

    static final int SPM_IM_START = FIRST_PIECE + SPM_PIECES.length;

    static TokenizerSpec spm(boolean byteTokens) {
        List<String> tokens = new ArrayList<>(List.of("<unk>", "<s>", "</s>"));
        List<Integer> types = new ArrayList<>(List.of(2, 3, 3));
        List<Float> scores = new ArrayList<>(List.of(0f, 0f, 0f));
        for (int b = 0; b < 256; b++) {
            // Without byte tokens the slots stay, renamed, so that ids do not move.
            tokens.add(byteTokens ? String.format("<0x%02X>", b) : "<unused" + b + ">");
            types.add(byteTokens ? 6 : 5);
            scores.add(0f);
        }
        for (String[] p : SPM_PIECES) {
            tokens.add(p[0]);
            types.add(1);
            scores.add(Float.parseFloat(p[1]));
        }
        tokens.add("<|im_start|>");
        types.add(3);
        scores.add(0f);
        float[] s = new float[scores.size()];
        for (int i = 0; i < s.length; i++) {
            s[i] = scores.get(i);
        }
        return new TokenizerSpec("llama", null, tokens, s, types.stream().mapToInt(Integer::intValue).toArray(), null,
                1, 2, -1, 0, -1, true, false, true, null);
    }
}
