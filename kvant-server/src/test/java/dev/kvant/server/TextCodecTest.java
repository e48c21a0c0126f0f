package dev.kvant.server;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import dev.kvant.tokenizer.ChatMessage;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tokenizer.Tokenizer;
import dev.kvant.tokenizer.TokenizerSpec;
import java.util.List;
import org.junit.jupiter.api.Test;

class TextCodecTest {

    /** A reply leaves control tokens (turn markers, tool tags) out, as llama.cpp's server does by default. */
    @Test
    void controlTokensAreNotPartOfTheReplyText() {
        // a byte-level BPE vocabulary: "a", "b", "Ġc" (" c"), then two control tokens
        Tokenizer tok = Tokenizer.create(new TokenizerSpec("gpt2", "gpt-2",
                List.of("a", "b", "Ġc", "<|im_end|>", "<|python_tag|>"), null, new int[] {1, 1, 1, 3, 3}, List.of(),
                -1, 3, -1, -1, -1, false, false, false, null));
        TextCodec.Detokenizer d = new TextCodec.Model(tok, ChatTemplate.CHATML, null, 14).detokenizer();
        StringBuilder out = new StringBuilder();
        for (int id : new int[] {0, 4, 1, 2, 3}) {
            out.append(d.feed(id));
        }
        out.append(d.flush());
        assertEquals("ab c", out.toString());
    }

    /**
     * A model whose chat template is of no built-in format still serves plain completions; a chat request gets a
     * 400 that says why and what to do, where the server used to refuse to start.
     */
    @Test
    void aTemplateOfNoKnownFormatRefusesChatOnly() {
        Tokenizer tok = Tokenizer.create(new TokenizerSpec("gpt2", "gpt-2", List.of("a", "b", "Ġc"), null,
                new int[] {1, 1, 1}, List.of(), -1, -1, -1, -1, -1, false, false, false, null));
        TextCodec codec = new TextCodec.Model(tok, null, "the model's chat template is none of the built-in formats",
                14);
        assertEquals("ab", tok.decode(codec.text("ab")));
        ApiException e = assertThrows(ApiException.class, () -> codec.chat(List.of(ChatMessage.user("a")), 100));
        assertEquals(400, e.status());
        assertEquals("the model's chat template is none of the built-in formats", e.getMessage());
    }
}
