package dev.kvant.tokenizer;

/**
 * Text to token ids and back, for the two vocabulary families llama-style GGUF models use.
 *
 * <p><b>Encoding.</b> {@code addSpecial} adds BOS / EOS as the model's {@code add_bos_token} /
 * {@code add_eos_token} flags ask. User-defined tokens are always split out of the text as whole units; control
 * tokens ({@code <|im_start|>}, {@code <s>}, ...) and the unknown token are recognised in the text only when
 * {@code parseSpecial} is true, otherwise their text is tokenized like any other text. Where two special texts
 * could start at the same place the longest wins, scanning left to right.
 *
 * <p><b>Decoding.</b> {@link #decode} skips nothing: control tokens render as their text (so a BOS at the start renders
 * as, e.g., {@code <|endoftext|>}); this keeps {@code decode(encode(text, false, true))} equal to the text and shows
 * exactly what the model saw. (Not for characters a SentencePiece vocabulary without byte tokens cannot spell: they
 * became its unknown token, which renders as SentencePiece renders it, {@code " ⁇ "}.) Callers that want prose only
 * stop at {@link #isEndOfGeneration} tokens and drop the BOS. {@code decode} treats the ids as a whole sequence from
 * the start of a text and is the inverse of {@link #encode}: for SentencePiece it removes the one space the encoder
 * prefixes. {@link #streamDecoder} treats ids as a continuation of a sequence (generated tokens) and removes nothing.
 *
 * <p>Text is handled as UTF-8; an unpaired surrogate in a Java string is encoded as '?', as
 * {@link String#getBytes(java.nio.charset.Charset)} does. Instances are immutable and safe to use from several threads.
 */
public sealed interface Tokenizer permits VocabularyTokenizer {

    /**
     * Builds the tokenizer that {@code spec.model()} names.
     *
     * @throws IllegalArgumentException naming the offending GGUF key when the spec is unusable
     */
    static Tokenizer create(TokenizerSpec spec) {
        if (spec.model() == null) {
            throw new IllegalArgumentException("tokenizer.ggml.model is missing; kvant supports 'gpt2' (byte-level BPE)"
                    + " and 'llama' (SentencePiece)");
        }
        return switch (spec.model()) {
            case "gpt2" -> new BpeTokenizer(spec);
            case "llama" -> new SpmTokenizer(spec);
            default -> throw new IllegalArgumentException("tokenizer.ggml.model '" + spec.model()
                    + "' is not supported; kvant supports 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)");
        };
    }

    /**
     * @param addSpecial   add BOS / EOS as the model's flags ask
     * @param parseSpecial recognise control-token texts such as {@code <|im_start|>} in the text
     */
    default int[] encode(String text, boolean addSpecial, boolean parseSpecial) {
        return encode(text, addSpecial, parseSpecial, null);
    }

    /**
     * {@link #encode(String, boolean, boolean)} with control-token texts recognised (parseSpecial) only outside
     * plainRanges ([start, end) pairs in order, or null): a chat's messages ({@link ChatTemplate.Rendered}) cannot
     * then write the format's markers. A control-token text that reaches into a plain range is plain text; tokens
     * the vocabulary always splits out (user-defined ones) still are.
     */
    int[] encode(String text, boolean addSpecial, boolean parseSpecial, int[] plainRanges);

    /**
     * A prompt given as text with control tokens ({@code encode(text, true, true)}), with one BOS where the text
     * already starts with the BOS token's text (a prompt rendered by another tool's chat template, which writes
     * it): the model would otherwise see two.
     */
    default int[] encodePrompt(String text) {
        int[] ids = encode(text, true, true);
        if (addBos() && ids.length >= 2 && ids[0] == bos() && ids[1] == bos()) {
            return java.util.Arrays.copyOfRange(ids, 1, ids.length);
        }
        return ids;
    }

    /** The text of a whole id sequence; see the class comment for what is rendered. Malformed UTF-8 becomes U+FFFD. */
    String decode(int[] ids);

    /** A fresh decoder for ids that arrive one at a time. */
    default StreamDecoder streamDecoder() {
        return new StreamDecoder(this);
    }

    /** The bytes this token contributes to decoded text (control tokens: their text in UTF-8). */
    byte[] tokenBytes(int id);

    /** The token's text as the vocabulary stores it (byte-level BPE: e.g. {@code "Ġthe"}; SentencePiece: {@code "▁the"}). */
    String tokenText(int id);

    TokenType tokenType(int id);

    int vocabSize();

    /** The BOS id, -1 if the vocabulary has none. */
    int bos();

    /** The EOS id, -1 if the vocabulary has none. */
    int eos();

    /** Whether the model's {@code add_bos_token} flag asks for a BOS in front of every prompt. */
    boolean addBos();

    /** Whether the model's {@code add_eos_token} flag asks for an EOS after every encoded text. */
    boolean addEos();

    /**
     * Whether generation ends at this token: EOS, EOT, and tokens whose text is a common end-of-turn marker
     * ({@code <|eot_id|>}, {@code <|im_end|>}, {@code <end_of_turn>}, {@code <|endoftext|>}, ...) when present.
     */
    boolean isEndOfGeneration(int id);
}
