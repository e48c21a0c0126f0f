package dev.kvant.tokenizer;

/**
 * The kind of a vocabulary entry, with the codes of GGUF's {@code tokenizer.ggml.token_type} array.
 * The kind decides how a token is matched in input text and how it is rendered back.
 */
public enum TokenType {
    /** Code 0; treated like {@link #NORMAL}. */
    UNDEFINED,
    /** Code 1: an ordinary piece produced by the BPE / SentencePiece algorithm. */
    NORMAL,
    /** Code 2: the unknown token; recognised in text only when special tokens are parsed. */
    UNKNOWN,
    /** Code 3: BOS, EOS, chat markers; recognised in text only when special tokens are parsed. */
    CONTROL,
    /** Code 4: added pieces that are always split out of the input text as whole units. */
    USER_DEFINED,
    /** Code 5: reserved slots; never produced from text. */
    UNUSED,
    /** Code 6: SentencePiece byte-fallback tokens {@code <0xNN>}. */
    BYTE;

    private static final TokenType[] BY_CODE = values();

    /** The type for a GGUF code; codes outside 0..6 are treated as {@link #UNDEFINED}, as llama.cpp does. */
    public static TokenType ofCode(int code) {
        return code >= 0 && code < BY_CODE.length ? BY_CODE[code] : UNDEFINED;
    }

    /** Whether the token's text is ordinary model text (rendered through the tokenizer's piece encoding). */
    boolean isText() {
        return this == NORMAL || this == UNDEFINED;
    }
}
