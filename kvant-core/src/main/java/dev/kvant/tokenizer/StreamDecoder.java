package dev.kvant.tokenizer;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * Turns ids that arrive one at a time (a generation in progress) into text without ever splitting a character: a
 * token may end in the middle of a UTF-8 sequence (byte-level BPE and byte-fallback tokens do), so the bytes of an
 * unfinished character wait for the next token. Bytes that can never form a character come out as U+FFFD at once.
 * Every id is rendered, with every space (see {@link Tokenizer} on decoding). Not thread-safe: one per sequence.
 */
public final class StreamDecoder {

    private final Tokenizer tokenizer;
    /** Bytes of an unfinished character; at most 3. */
    private byte[] pending = new byte[0];

    StreamDecoder(Tokenizer tokenizer) {
        this.tokenizer = tokenizer;
    }

    /** Adds one token; returns the text that is complete now (possibly empty). */
    public String feed(int id) {
        byte[] piece = tokenizer.tokenBytes(id);
        byte[] bytes = Arrays.copyOf(pending, pending.length + piece.length);
        System.arraycopy(piece, 0, bytes, pending.length, piece.length);
        int complete = completeLength(bytes);
        pending = Arrays.copyOfRange(bytes, complete, bytes.length);
        return new String(bytes, 0, complete, StandardCharsets.UTF_8);
    }

    /** Ends the stream: whatever bytes are still waiting, as text (an unfinished character becomes U+FFFD). */
    public String flush() {
        String rest = new String(pending, StandardCharsets.UTF_8);
        pending = new byte[0];
        return rest;
    }

    /**
     * The length of the longest prefix that does not end inside a character that later bytes could still complete.
     * Only the last three bytes can start such a character.
     */
    static int completeLength(byte[] b) {
        int n = b.length;
        for (int start = n - 1; start >= Math.max(0, n - 3); start--) {
            int lead = b[start] & 0xFF;
            if ((lead & 0xC0) == 0x80) {
                continue; // a continuation byte; its lead byte is further left
            }
            int need = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 && lead < 0xE0 ? 2 : 1;
            if (lead > 0xF4) {
                need = 1; // never a lead byte
            }
            if (start + need > n && prefixCanContinue(b, start, n)) {
                return start;
            }
            return n;
        }
        return n;
    }

    /** Whether {@code b[start, n)} is a valid beginning of a UTF-8 sequence (so waiting for more bytes makes sense). */
    private static boolean prefixCanContinue(byte[] b, int start, int n) {
        int lead = b[start] & 0xFF;
        for (int i = start + 1; i < n; i++) {
            int c = b[i] & 0xFF;
            int lo = 0x80;
            int hi = 0xBF;
            if (i == start + 1) {
                // The second byte's range excludes overlong forms and surrogates (RFC 3629).
                if (lead == 0xE0) {
                    lo = 0xA0;
                } else if (lead == 0xED) {
                    hi = 0x9F;
                } else if (lead == 0xF0) {
                    lo = 0x90;
                } else if (lead == 0xF4) {
                    hi = 0x8F;
                }
            }
            if (c < lo || c > hi) {
                return false;
            }
        }
        return true;
    }

    /** For tests: the bytes waiting for the rest of a character. */
    int pendingBytes() {
        return pending.length;
    }
}
