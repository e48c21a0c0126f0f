package dev.kvant.tokenizer;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The reference merge loop, as GPT-2's original encoder wrote it: on strings, find the pair with the lowest rank
 * anywhere in the word, merge every occurrence of it left to right, repeat. Quadratic, obviously right; the tests
 * hold the fast heap-based engine to it.
 */
final class TextbookBpe {
    private final Map<String, Integer> ids = new HashMap<>();
    private final Map<String, Integer> ranks = new HashMap<>();

    TextbookBpe(List<String> tokens, List<String> merges) {
        for (int i = 0; i < tokens.size(); i++) {
            ids.putIfAbsent(tokens.get(i), i);
        }
        for (int r = 0; r < merges.size(); r++) {
            ranks.putIfAbsent(merges.get(r), r);
        }
    }

    int[] encode(String piece) {
        List<String> word = new ArrayList<>();
        for (byte b : piece.getBytes(StandardCharsets.UTF_8)) {
            word.add(String.valueOf(ByteLevel.charOf(b)));
        }
        while (word.size() > 1) {
            String best = null;
            int bestRank = Integer.MAX_VALUE;
            for (int i = 0; i + 1 < word.size(); i++) {
                Integer r = ranks.get(word.get(i) + " " + word.get(i + 1));
                if (r != null && r < bestRank) {
                    bestRank = r;
                    best = word.get(i) + " " + word.get(i + 1);
                }
            }
            if (best == null) {
                break;
            }
            List<String> merged = new ArrayList<>();
            for (int i = 0; i < word.size(); i++) {
                if (i + 1 < word.size() && (word.get(i) + " " + word.get(i + 1)).equals(best)) {
                    merged.add(word.get(i) + word.get(i + 1));
                    i++;
                } else {
                    merged.add(word.get(i));
                }
            }
            word = merged;
        }
        return word.stream().mapToInt(s -> ids.get(s)).toArray();
    }
}
