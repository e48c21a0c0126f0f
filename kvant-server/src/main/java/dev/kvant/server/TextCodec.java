package dev.kvant.server;

import dev.kvant.model.LlamaModel;
import dev.kvant.tokenizer.ChatMessage;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tokenizer.StreamDecoder;
import dev.kvant.tokenizer.TokenType;
import dev.kvant.tokenizer.Tokenizer;

import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * Text to the model's token ids and back, as the server needs it: a chat rendered with the model's template, a plain
 * prompt, the generated ids streamed back as text, and which ids end a generation.
 */
public sealed interface TextCodec {

    /**
     * The prompt of a conversation, ending with the cue for the assistant's turn.
     *
     * @throws TooLong when the rendered conversation is certain to come to {@code limit} tokens or more: refused
     *                 before it is tokenized (templates add text of their own, and keep whitespace the messages hold)
     */
    int[] chat(List<ChatMessage> messages, int limit);

    /** A prompt certain to reach its limit of tokens: its text's UTF-8 bytes, and the fewest tokens they come to. */
    final class TooLong extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final long bytes;
        final long least;

        TooLong(long bytes, long least) {
            super("a text of " + bytes + " bytes, at least " + least + " tokens", null, false, false);
            this.bytes = bytes;
            this.least = least;
        }
    }

    /** Throws {@link TooLong} when {@code text} is certain to come to {@code limit} tokens or more. */
    default void checkLength(CharSequence text, int limit) {
        long bytes = utf8Length(text);
        long least = bytes / maxTokenBytes();
        if (least >= limit) {
            throw new TooLong(bytes, least);
        }
    }

    /** The prompt of a text completion. */
    int[] text(String prompt);

    boolean isEndOfGeneration(int token);

    /**
     * The most UTF-8 bytes of text one token stands for: a text of n bytes comes to at least n / this many tokens,
     * which refuses a prompt far past the context before tokenizing it (the tokenizers' working memory grows with
     * the text).
     */
    int maxTokenBytes();

    /** The UTF-8 length of s, without encoding it (a lone surrogate as the one byte '?' the encoder writes). */
    static long utf8Length(CharSequence s) {
        long n = 0;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                n += 4;
                i++;
            } else {
                n += c < 0x80 || Character.isSurrogate(c) ? 1 : c < 0x800 ? 2 : 3;
            }
        }
        return n;
    }

    /** A fresh decoder for one generation's ids. */
    Detokenizer detokenizer();

    /** Generated ids to text, one at a time, never splitting a character. */
    interface Detokenizer {
        String feed(int id);

        String flush();
    }

    /** The model's own tokenizer and chat template, or {@link Bytes} for a model without a tokenizer. */
    static TextCodec of(LlamaModel model, String templateOverride) {
        if (!model.hasTokenizer()) {
            return new Bytes(model.config().vocabSize());
        }
        Tokenizer t = model.tokenizer();
        int most = 1;
        for (int id = 0; id < t.vocabSize(); id++) {
            most = Math.max(most, t.tokenBytes(id).length);
        }
        ChatTemplate template;
        String problem = null;
        try {
            template = ChatTemplate.detect(model.chatTemplate(), templateOverride);
        } catch (IllegalArgumentException e) {
            if (templateOverride != null) {
                throw e;   // a name asked for and not known: the command line's mistake
            }
            // a template of no built-in format: plain completions still serve; chat requests say why they cannot
            template = null;
            problem = e.getMessage() + " (start the server with --chat-template NAME)";
            System.err.println("kvant serve: " + problem + "; /v1/chat/completions refuses requests until then,"
                    + " /v1/completions serves");
        }
        if (template == ChatTemplate.RAW && templateOverride == null) {
            System.err.println("kvant serve: the model has no chat template (tokenizer.chat_template): chat messages"
                    + " are joined with no turn markers; choose a format with --chat-template NAME");
        }
        return new Model(t, template, problem, most);
    }

    /**
     * A real model: its tokenizer, BOS as the model asks, control-token texts in the rendered chat recognised; a
     * null template (one of no built-in format) refuses chat with {@code templateProblem}.
     */
    record Model(Tokenizer tokenizer, ChatTemplate template, String templateProblem, int maxTokenBytes)
            implements TextCodec {
        @Override
        public int[] chat(List<ChatMessage> messages, int limit) {
            if (template == null) {
                throw ApiException.unsupported("messages", templateProblem);
            }
            // the messages' own text is read with control-token texts as plain text: a message cannot open a turn
            ChatTemplate.Rendered r = template.renderMarked(messages, true);
            checkLength(r.text(), limit);
            return tokenizer.encode(r.text(), true, true, r.contentRanges());
        }

        @Override
        public int[] text(String prompt) {
            return tokenizer.encodePrompt(prompt);
        }

        @Override
        public boolean isEndOfGeneration(int token) {
            return tokenizer.isEndOfGeneration(token);
        }

        @Override
        public Detokenizer detokenizer() {
            StreamDecoder d = tokenizer.streamDecoder();
            return new Detokenizer() {
                @Override
                public String feed(int id) {
                    // a control token (a turn marker, <|python_tag|>, ...) is not text: left out of the reply, as
                    // llama.cpp's server leaves special tokens out unless asked
                    return tokenizer.tokenType(id) == TokenType.CONTROL ? "" : d.feed(id);
                }

                @Override
                public String flush() {
                    return d.flush();
                }
            };
        }
    }

    /**
     * For synthetic benchmark models, which have no tokenizer: each UTF-8 byte of the text is one id, a chat is
     * rendered as "role: content" lines, and a generated id comes back as its ASCII character when it is a printable
     * one, else as {@code <id>}. No id ends a generation. The text means nothing; the token counts and timings do.
     */
    record Bytes(int vocabSize) implements TextCodec {
        public Bytes {
            if (vocabSize < 256) {
                throw new IllegalArgumentException("a model without a tokenizer needs a vocabulary of at least 256 ids"
                        + " to take bytes as tokens, got " + vocabSize);
            }
        }

        @Override
        public int[] chat(List<ChatMessage> messages, int limit) {
            StringBuilder sb = new StringBuilder();
            for (ChatMessage m : messages) {
                sb.append(m.role()).append(": ").append(m.content()).append('\n');
            }
            sb.append("assistant:");
            checkLength(sb, limit);
            return text(sb.toString());
        }

        @Override
        public int[] text(String prompt) {
            byte[] b = prompt.getBytes(StandardCharsets.UTF_8);
            int[] ids = new int[b.length];
            for (int i = 0; i < b.length; i++) {
                ids[i] = b[i] & 0xFF;
            }
            return ids;
        }

        @Override
        public boolean isEndOfGeneration(int token) {
            return false;
        }

        @Override
        public int maxTokenBytes() {
            return 1;
        }

        @Override
        public Detokenizer detokenizer() {
            return new Detokenizer() {
                @Override
                public String feed(int id) {
                    return id >= 0x20 && id < 0x7F || id == '\n' ? String.valueOf((char) id) : "<" + id + ">";
                }

                @Override
                public String flush() {
                    return "";
                }
            };
        }
    }
}
