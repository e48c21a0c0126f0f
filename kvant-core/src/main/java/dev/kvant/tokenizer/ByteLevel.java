package dev.kvant.tokenizer;

/**
 * GPT-2's reversible map from bytes to printable characters, which byte-level BPE vocabularies are written in.
 * Bytes that are already printable Latin-1 ({@code !..~}, {@code ¡..¬}, {@code ®..ÿ}) stand for themselves; the other
 * 68 bytes are given the characters U+0100, U+0101, ... in byte order (so a space is {@code Ġ} U+0120 and a newline
 * is {@code Ċ} U+010A).
 */
final class ByteLevel {

    private static final char[] BYTE_TO_CHAR = new char[256];
    /** Indexed by character; -1 where the character stands for no byte. Covers U+0000..U+01FF. */
    private static final short[] CHAR_TO_BYTE = new short[512];

    static {
        java.util.Arrays.fill(CHAR_TO_BYTE, (short) -1);
        int next = 256;
        for (int b = 0; b < 256; b++) {
            boolean printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            char c = printable ? (char) b : (char) next++;
            BYTE_TO_CHAR[b] = c;
            CHAR_TO_BYTE[c] = (short) b;
        }
    }

    private ByteLevel() {
    }

    static char charOf(int b) {
        return BYTE_TO_CHAR[b & 0xFF];
    }

    /** The byte a character stands for, or -1. */
    static int byteOf(char c) {
        return c < CHAR_TO_BYTE.length ? CHAR_TO_BYTE[c] : -1;
    }

    /** The byte-level spelling of some bytes. */
    static String encode(byte[] bytes) {
        char[] out = new char[bytes.length];
        for (int i = 0; i < bytes.length; i++) {
            out[i] = BYTE_TO_CHAR[bytes[i] & 0xFF];
        }
        return new String(out);
    }
}
