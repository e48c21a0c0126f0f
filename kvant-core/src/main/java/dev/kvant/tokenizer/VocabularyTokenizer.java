package dev.kvant.tokenizer;

import java.util.function.BiFunction;

/**
 * What both tokenizers share: the vocabulary of the GGUF file, the bytes each token contributes to decoded text, and
 * the lookups that only read those.
 */
abstract sealed class VocabularyTokenizer implements Tokenizer permits BpeTokenizer, SpmTokenizer {
    final Vocabulary vocab;
    /** The bytes of each id's text as decoding renders it ({@link #tokenBytes(int)} hands out copies). */
    final byte[][] tokenBytes;

    /** @param bytesOf the bytes of a token from its text and type, the tokenizer family's rendering */
    VocabularyTokenizer(TokenizerSpec spec, BiFunction<String, TokenType, byte[]> bytesOf) {
        vocab = new Vocabulary(spec);
        tokenBytes = new byte[vocab.size()][];
        for (int id = 0; id < vocab.size(); id++) {
            tokenBytes[id] = bytesOf.apply(vocab.text(id), vocab.type(id));
        }
    }

    @Override
    public byte[] tokenBytes(int id) {
        vocab.checkRange(id);
        return tokenBytes[id].clone();
    }

    @Override
    public String tokenText(int id) {
        return vocab.text(id);
    }

    @Override
    public TokenType tokenType(int id) {
        return vocab.type(id);
    }

    @Override
    public int vocabSize() {
        return vocab.size();
    }

    @Override
    public int bos() {
        return vocab.bos;
    }

    @Override
    public int eos() {
        return vocab.eos;
    }

    @Override
    public boolean addBos() {
        return vocab.addBos;
    }

    @Override
    public boolean addEos() {
        return vocab.addEos;
    }

    @Override
    public boolean isEndOfGeneration(int id) {
        return vocab.isEndOfGeneration(id);
    }
}
