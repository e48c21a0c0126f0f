package dev.kvant.tokenizer;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Byte-level BPE ({@code tokenizer.ggml.model = gpt2}): the GPT-2 / Llama 3 / Qwen family.
 *
 * <p>Text is split around special tokens, then by the {@link PreTokenizer} regex into pieces; each piece's UTF-8 bytes
 * start as one symbol per byte (the vocabulary spells bytes with {@link ByteLevel} characters) and the adjacent pair
 * with the lowest merge rank is merged, leftmost first among equal ranks, until no pair has a rank. This is the merge
 * order of HF tokenizers and llama.cpp. A heap keeps each piece O(n log n), so long runs (indentation, rulers) stay
 * cheap; a cache maps recurring pieces to their ids, which is what makes whole files fast.
 */
public final class BpeTokenizer extends VocabularyTokenizer {

    /** Pieces longer than this are not cached: they are rare, and would let one input fill the cache. */
    private static final int CACHE_MAX_PIECE = 128;
    /** The cache is dropped when it grows past this many pieces (a few tens of MB at most). */
    private static final int CACHE_MAX_ENTRIES = 1 << 18;

    private final PreTokenizer pre;
    private final boolean ignoreMerges;
    private final MergeTable merges;
    /** The id of the one-character token for each byte, -1 where the vocabulary lacks it. */
    private final int[] byteTokens = new int[256];
    private final ConcurrentHashMap<String, int[]> cache = new ConcurrentHashMap<>();

    BpeTokenizer(TokenizerSpec spec) {
        super(spec, BpeTokenizer::bytesOf);
        pre = PreTokenizer.forName(spec.pre());
        ignoreMerges = PreTokenizer.ignoresMerges(spec.pre());
        if (spec.merges() == null) {
            throw new IllegalArgumentException("tokenizer.ggml.merges is missing; a gpt2 (BPE) vocabulary needs it");
        }
        merges = new MergeTable(spec.merges(), vocab);
        for (int b = 0; b < 256; b++) {
            byteTokens[b] = vocab.id(String.valueOf(ByteLevel.charOf(b)));
        }
    }

    private static byte[] bytesOf(String text, TokenType type) {
        if (type == TokenType.BYTE) {
            int b = SpmTokenizer.byteTokenValue(text);
            if (b >= 0) {
                return new byte[] {(byte) b};
            }
        }
        if (!type.isText()) {
            return text.getBytes(StandardCharsets.UTF_8);
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream(text.length());
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            int b = ByteLevel.byteOf(c);
            if (b >= 0) {
                out.write(b);
            } else {
                // Not a byte-level character: the vocabulary holds raw text here; keep it as is.
                int cp = text.codePointAt(i);
                out.writeBytes(Character.toString(cp).getBytes(StandardCharsets.UTF_8));
                i += Character.charCount(cp) - 1;
            }
        }
        return out.toByteArray();
    }

    @Override
    public int[] encode(String text, boolean addSpecial, boolean parseSpecial, int[] plainRanges) {
        IdList out = new IdList();
        if (addSpecial && vocab.addBos) {
            out.add(vocab.bos);
        }
        List<String> pieces = new ArrayList<>();
        for (Vocabulary.Fragment f : vocab.partition(text, parseSpecial, plainRanges)) {
            if (f.isToken()) {
                out.add(f.token());
                continue;
            }
            pieces.clear();
            pre.split(text, f.start(), f.end(), pieces);
            for (String piece : pieces) {
                encodePiece(piece, out);
            }
        }
        if (addSpecial && vocab.addEos) {
            out.add(vocab.eos);
        }
        return out.toArray();
    }

    private void encodePiece(String piece, IdList out) {
        int[] ids = cache.get(piece);
        if (ids == null) {
            ids = mergePiece(piece);
            if (piece.length() <= CACHE_MAX_PIECE) {
                if (cache.size() >= CACHE_MAX_ENTRIES) {
                    cache.clear();
                }
                cache.put(piece, ids);
            }
        }
        out.addAll(ids);
    }

    /** The ids of one pre-tokenized piece. */
    int[] mergePiece(String piece) {
        byte[] bytes = piece.getBytes(StandardCharsets.UTF_8);
        if (ignoreMerges) {
            int whole = vocab.id(ByteLevel.encode(bytes));
            if (whole >= 0) {
                return new int[] {whole};
            }
        }
        int n = bytes.length;
        int[] sym = new int[n];
        int[] prev = new int[n];
        int[] next = new int[n];
        boolean[] dead = new boolean[n];
        for (int i = 0; i < n; i++) {
            sym[i] = byteTokens[bytes[i] & 0xFF];
            prev[i] = i - 1;
            next[i] = i + 1 < n ? i + 1 : -1;
        }
        // Heap entries are (rank << 32 | left position): the smallest is the lowest rank, leftmost among equals.
        long[] heap = new long[Math.max(4, n)];
        int heapSize = 0;
        for (int i = 0; i + 1 < n; i++) {
            long m = merges.find(sym[i], sym[i + 1]);
            if (m >= 0) {
                heap = heapPush(heap, heapSize++, (m & 0xFFFFFFFF00000000L) | i);
            }
        }
        while (heapSize > 0) {
            long top = heap[0];
            heapSize = heapPop(heap, heapSize);
            int left = (int) top;
            int rank = (int) (top >>> 32);
            int right = next[left];
            if (dead[left] || right < 0) {
                continue;
            }
            long m = merges.find(sym[left], sym[right]);
            if (m < 0 || (int) (m >>> 32) != rank) {
                continue; // stale: one side has been merged since this entry was pushed
            }
            sym[left] = (int) m;
            dead[right] = true;
            next[left] = next[right];
            if (next[right] >= 0) {
                prev[next[right]] = left;
            }
            if (prev[left] >= 0) {
                long mp = merges.find(sym[prev[left]], sym[left]);
                if (mp >= 0) {
                    heap = heapPush(heap, heapSize++, (mp & 0xFFFFFFFF00000000L) | prev[left]);
                }
            }
            if (next[left] >= 0) {
                long mn = merges.find(sym[left], sym[next[left]]);
                if (mn >= 0) {
                    heap = heapPush(heap, heapSize++, (mn & 0xFFFFFFFF00000000L) | left);
                }
            }
        }
        int[] result = new int[n];
        int count = 0;
        for (int i = 0; i >= 0 && n > 0; i = next[i]) {
            int id = sym[i];
            if (id < 0) {
                // A byte the vocabulary has no symbol for: the unknown token if there is one, else nothing (llama.cpp).
                if (vocab.unk < 0) {
                    continue;
                }
                id = vocab.unk;
            }
            result[count++] = id;
        }
        return count == n ? result : Arrays.copyOf(result, count);
    }

    private static long[] heapPush(long[] heap, int size, long value) {
        if (size == heap.length) {
            heap = Arrays.copyOf(heap, heap.length * 2);
        }
        int i = size;
        while (i > 0) {
            int parent = (i - 1) >>> 1;
            if (heap[parent] <= value) {
                break;
            }
            heap[i] = heap[parent];
            i = parent;
        }
        heap[i] = value;
        return heap;
    }

    /** Removes the smallest entry; returns the new size. */
    private static int heapPop(long[] heap, int size) {
        long last = heap[--size];
        int i = 0;
        while (true) {
            int child = 2 * i + 1;
            if (child >= size) {
                break;
            }
            if (child + 1 < size && heap[child + 1] < heap[child]) {
                child++;
            }
            if (heap[child] >= last) {
                break;
            }
            heap[i] = heap[child];
            i = child;
        }
        if (size > 0) {
            heap[i] = last;
        }
        return size;
    }

    @Override
    public String decode(int[] ids) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(ids.length * 4);
        for (int id : ids) {
            vocab.checkRange(id);
            out.writeBytes(tokenBytes[id]);
        }
        return out.toString(StandardCharsets.UTF_8);
    }

    /**
     * Merge rank and result per ordered pair of token ids, in an open-addressing table: the merge loop looks pairs up
     * millions of times per megabyte of text, so it avoids boxing.
     */
    private static final class MergeTable {
        private final long[] keys;
        /** {@code rank << 32 | merged id}. */
        private final long[] values;
        private final int shift;

        MergeTable(List<String> merges, Vocabulary vocab) {
            int bits = Math.max(4, 64 - Long.numberOfLeadingZeros(Math.max(1, merges.size()) * 2L - 1));
            keys = new long[1 << bits];
            values = new long[1 << bits];
            shift = 64 - bits;
            Arrays.fill(keys, -1L);
            for (int rank = 0; rank < merges.size(); rank++) {
                String m = merges.get(rank);
                // Byte-level symbols never contain a space; the first one after position 0 separates the two parts.
                int sp = m == null ? -1 : m.indexOf(' ', 1);
                if (sp < 0) {
                    throw new IllegalArgumentException("tokenizer.ggml.merges[" + rank + "] = '" + m
                            + "' is not two symbols separated by a space");
                }
                String a = m.substring(0, sp);
                String b = m.substring(sp + 1);
                int left = vocab.id(a);
                int right = vocab.id(b);
                int merged = vocab.id(a + b);
                if (left < 0 || right < 0 || merged < 0) {
                    String missing = left < 0 ? a : right < 0 ? b : a + b;
                    throw new IllegalArgumentException("tokenizer.ggml.merges[" + rank + "] = '" + m + "' refers to '"
                            + missing + "', which is not in tokenizer.ggml.tokens");
                }
                put(key(left, right), ((long) rank << 32) | merged);
            }
        }

        private static long key(int left, int right) {
            return ((long) left << 32) | (right & 0xFFFFFFFFL);
        }

        private int slot(long key) {
            return (int) ((key * 0x9E3779B97F4A7C15L) >>> shift);
        }

        private void put(long key, long value) {
            int mask = keys.length - 1;
            for (int i = slot(key); ; i = (i + 1) & mask) {
                if (keys[i] == key) {
                    return; // a repeated merge keeps its first (lowest) rank
                }
                if (keys[i] == -1L) {
                    keys[i] = key;
                    values[i] = value;
                    return;
                }
            }
        }

        /** {@code rank << 32 | merged id}, or -1 when the pair does not merge. */
        long find(int left, int right) {
            if (left < 0 || right < 0) {
                return -1;
            }
            long key = key(left, right);
            int mask = keys.length - 1;
            for (int i = slot(key); ; i = (i + 1) & mask) {
                if (keys[i] == key) {
                    return values[i];
                }
                if (keys[i] == -1L) {
                    return -1;
                }
            }
        }
    }
}
