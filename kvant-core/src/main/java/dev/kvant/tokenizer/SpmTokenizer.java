package dev.kvant.tokenizer;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.PriorityQueue;

/**
 * SentencePiece BPE ({@code tokenizer.ggml.model = llama}): Llama 1/2, Mistral, CodeLlama and relatives.
 *
 * <p>Each plain-text span (between special tokens) gets one leading space when {@code add_space_prefix} is set and
 * the span starts the text or follows a special token (as llama.cpp does), spaces become U+2581 "▁", and the span
 * starts as one symbol per code point. The adjacent pair whose concatenation is a vocabulary piece with the highest
 * score is merged, leftmost first among equal scores, until no pair forms a piece. A symbol that is no piece is
 * written as its UTF-8 bytes with the byte-fallback tokens {@code <0xNN>}, or as the unknown token when the
 * vocabulary lacks them; a run of such symbols is one unknown token, as SentencePiece writes it.
 *
 * <p>{@link #decode} turns "▁" back into spaces and drops the one space the encoder added at each of those places, so
 * it inverts {@link #encode} exactly; the stream decoder keeps every space, since generated text continues a prompt.
 *
 * <p>The unknown token depends on the vocabulary. With all 256 byte tokens (Llama, Mistral) the encoder writes it only
 * for the text {@code <unk>} parsed as a special token, so it decodes as that text and, like a control token, drops
 * the space the encoder put before the text after it. Without them it stands for characters the vocabulary cannot
 * spell, and it renders as SentencePiece's {@code DecodeIds} renders it, {@code " ⁇ "} (U+2047 between spaces), the
 * piece after it keeping its space: "a😀 b" decodes to "a ⁇  b". There the ids of a parsed {@code <unk>} are those of
 * an unknown character ("a<unk>b" and "a😀 b" give the same ids), and they decode the same way.
 */
public final class SpmTokenizer extends VocabularyTokenizer {

    private static final char SPACE_MARK = '\u2581';
    /** SentencePiece's rendering of the unknown token ({@code kDefaultUnknownSymbol}; GGUF keeps no other). */
    private static final String UNKNOWN_SURFACE = " \u2047 ";

    private final boolean addSpacePrefix;
    /** The id of {@code <0xNN>} for each byte, -1 where the vocabulary lacks it. */
    private final int[] byteTokens = new int[256];
    /** Whether every byte has its token: then no text is encoded as the unknown token but the text {@code <unk>}. */
    private final boolean byteFallback;

    SpmTokenizer(TokenizerSpec spec) {
        super(spec, SpmTokenizer::bytesOf);
        addSpacePrefix = spec.addSpacePrefix();
        boolean allBytes = true;
        for (int b = 0; b < 256; b++) {
            byteTokens[b] = vocab.id(String.format("<0x%02X>", b));
            allBytes &= byteTokens[b] >= 0;
        }
        byteFallback = allBytes;
        if (!byteFallback) {
            byte[] surface = UNKNOWN_SURFACE.getBytes(StandardCharsets.UTF_8);
            for (int id = 0; id < vocab.size(); id++) {
                if (isUnknown(id)) {
                    tokenBytes[id] = surface;
                }
            }
        }
    }

    /** The unknown token: typed so, or the id the metadata names (a file without token types types it normal). */
    private boolean isUnknown(int id) {
        return id == vocab.unk || vocab.type(id) == TokenType.UNKNOWN;
    }

    /** A token's bytes: a byte token's byte, text with its space marks as spaces, control text as it is. */
    private static byte[] bytesOf(String text, TokenType type) {
        int b = type == TokenType.BYTE ? byteTokenValue(text) : -1;
        if (b >= 0) {
            return new byte[] {(byte) b};
        }
        return type.isText() ? text.replace(SPACE_MARK, ' ').getBytes(StandardCharsets.UTF_8)
                : text.getBytes(StandardCharsets.UTF_8);
    }

    /** The byte a {@code <0xNN>} token stands for, or -1 if the text is not of that form. */
    static int byteTokenValue(String text) {
        if (text.length() != 6 || !text.startsWith("<0x") || text.charAt(5) != '>') {
            return -1;
        }
        int hi = Character.digit(text.charAt(3), 16);
        int lo = Character.digit(text.charAt(4), 16);
        return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
    }

    @Override
    public int[] encode(String text, boolean addSpecial, boolean parseSpecial, int[] plainRanges) {
        IdList out = new IdList();
        if (addSpecial && vocab.addBos) {
            out.add(vocab.bos);
        }
        boolean afterSpecial = true;
        for (Vocabulary.Fragment f : vocab.partition(text, parseSpecial, plainRanges)) {
            if (f.isToken()) {
                out.add(f.token());
                afterSpecial = true;
                continue;
            }
            String span = text.substring(f.start(), f.end());
            if (addSpacePrefix && afterSpecial) {
                span = " " + span;
            }
            encodeSpan(span.replace(' ', SPACE_MARK), out);
            afterSpecial = false;
        }
        if (addSpecial && vocab.addEos) {
            out.add(vocab.eos);
        }
        return out.toArray();
    }

    private record Bigram(float score, int left, int right, int length) {
    }

    private void encodeSpan(String s, IdList out) {
        int n = s.codePointCount(0, s.length());
        int[] start = new int[n];
        int[] length = new int[n];
        int[] prev = new int[n];
        int[] next = new int[n];
        for (int i = 0, pos = 0; i < n; i++) {
            start[i] = pos;
            length[i] = Character.charCount(s.codePointAt(pos));
            pos += length[i];
            prev[i] = i - 1;
            next[i] = i + 1 < n ? i + 1 : -1;
        }
        PriorityQueue<Bigram> queue = new PriorityQueue<>(Math.max(1, n), (a, b) -> a.score != b.score
                ? Float.compare(b.score, a.score) : Integer.compare(a.left, b.left));
        for (int i = 0; i + 1 < n; i++) {
            offer(queue, s, start, length, i, i + 1);
        }
        while (!queue.isEmpty()) {
            Bigram bg = queue.poll();
            int l = bg.left;
            int r = bg.right;
            // Stale when either side has been merged away or grown since the pair was offered.
            if (length[l] == 0 || length[r] == 0 || length[l] + length[r] != bg.length) {
                continue;
            }
            length[l] += length[r];
            length[r] = 0;
            next[l] = next[r];
            if (next[r] >= 0) {
                prev[next[r]] = l;
            }
            if (prev[l] >= 0) {
                offer(queue, s, start, length, prev[l], l);
            }
            if (next[l] >= 0) {
                offer(queue, s, start, length, l, next[l]);
            }
        }
        boolean unknownRun = false;
        for (int i = 0; i >= 0 && n > 0; i = next[i]) {
            String piece = s.substring(start[i], start[i] + length[i]);
            int id = pieceId(piece);
            if (id >= 0) {
                out.add(id);
                unknownRun = false;
            } else {
                unknownRun = fallback(piece, out, unknownRun);
            }
        }
    }

    private void offer(PriorityQueue<Bigram> queue, String s, int[] start, int[] length, int l, int r) {
        int id = pieceId(s.substring(start[l], start[r] + length[r]));
        if (id >= 0) {
            queue.add(new Bigram(vocab.score(id), l, r, length[l] + length[r]));
        }
    }

    /**
     * The id of a piece the merge may produce. Only normal pieces qualify: control, unknown, unused and byte tokens
     * are never made from text, and user-defined ones were split out before (so decode can tell where the encoder
     * added a space).
     */
    private int pieceId(String piece) {
        int id = vocab.id(piece);
        return id >= 0 && vocab.type(id).isText() ? id : -1;
    }

    /**
     * Writes a symbol that is no piece as byte tokens, or as the unknown token; returns whether it took the unknown
     * token. A symbol right after one that took it adds nothing: SentencePiece merges a run of unknown pieces into one
     * (its {@code PopulateSentencePieceText}), so "日本 word" is one unknown token, decoded " ⁇  word" as there.
     */
    private boolean fallback(String piece, IdList out, boolean afterUnknown) {
        byte[] bytes = piece.getBytes(StandardCharsets.UTF_8);
        boolean allBytes = true;
        for (byte b : bytes) {
            allBytes &= byteTokens[b & 0xFF] >= 0;
        }
        if (allBytes) {
            for (byte b : bytes) {
                out.add(byteTokens[b & 0xFF]);
            }
            return false;
        } else if (vocab.unk >= 0) {
            if (!afterUnknown) {
                out.add(vocab.unk);
            }
            return true;
        } else {
            throw new IllegalArgumentException("cannot encode '" + piece + "': the vocabulary has neither byte tokens"
                    + " <0xNN> for it nor an unknown token (tokenizer.ggml.unknown_token_id)");
        }
    }

    @Override
    public String decode(int[] ids) {
        ByteArrayOutputStream out = new ByteArrayOutputStream(ids.length * 4);
        boolean dropSpace = addSpacePrefix;
        for (int id : ids) {
            vocab.checkRange(id);
            byte[] b = tokenBytes[id];
            TokenType t = vocab.type(id);
            // a special token (BOS and EOS too where the file types every token as normal, the unknown token where
            // only the parsed text <unk> gives it) ends a fragment: the text after it had its own space prefix added
            // when encoded
            if (t == TokenType.CONTROL || t == TokenType.USER_DEFINED || id == vocab.bos || id == vocab.eos
                    || t == TokenType.UNKNOWN && byteFallback) {
                out.writeBytes(b);
                dropSpace = addSpacePrefix;
                continue;
            }
            // where it stands for characters the vocabulary lacks, " ⁇ " whole, and the text goes on after it
            if (!byteFallback && isUnknown(id)) {
                out.writeBytes(b);
                dropSpace = false;
                continue;
            }
            if (dropSpace && b.length > 0 && b[0] == ' ') {
                out.write(b, 1, b.length - 1);
            } else {
                out.writeBytes(b);
            }
            if (b.length > 0) {
                dropSpace = false;
            }
        }
        return out.toString(StandardCharsets.UTF_8);
    }
}
