/**
 * Tokenizers for GGUF vocabularies and chat prompt formats.
 *
 * <p>{@link dev.kvant.tokenizer.Tokenizer#create} builds a byte-level BPE ({@code gpt2}) or SentencePiece
 * ({@code llama}) tokenizer from a {@link dev.kvant.tokenizer.TokenizerSpec}, the {@code tokenizer.*} keys of a GGUF
 * file. Both reproduce llama.cpp's tokenization of the same file (a missing or {@code "default"} pre-tokenizer name
 * included: llama.cpp's legacy split); the exceptions are documented on the types. Decoding never
 * applies the "clean up tokenization spaces" rewriting (" ," to ","), so decoding inverts encoding.
 * {@link dev.kvant.tokenizer.ChatTemplate} turns a conversation into prompt text.
 */
package dev.kvant.tokenizer;
