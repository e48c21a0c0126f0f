package dev.kvant.server;

import static org.junit.jupiter.api.Assertions.assertEquals;

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
        TextCodec.Detokenizer d = new TextCodec.Model(tok, ChatTemplate.CHATML, 14).detokenizer();
        StringBuilder out = new StringBuilder();
        for (int id : new int[] {0, 4, 1, 2, 3}) {
            out.append(d.feed(id));
        }
        out.append(d.flush());
        assertEquals("ab c", out.toString());
    }
}
