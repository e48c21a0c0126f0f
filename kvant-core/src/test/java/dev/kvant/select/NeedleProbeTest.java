package dev.kvant.select;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.Fixtures;
import dev.kvant.model.LlamaModel;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tokenizer.Tokenizer;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class NeedleProbeTest {

    @Test
    void fixtureLineParsesWithEscapesAndNominalLength() {
        NeedleProbe p = NeedleProbe.parse("{\"id\": \"L4096-d50-03\", \"n_ctx_tokens\": 4071, \"depth\": 0.5, "
                + "\"name\": \"max_iter\", \"value\": \"aB3x9Q\", \"prompt\": \"x = \\\"\\\\n\\\"\\n\\u00e9max_iter = \\\"\"}");
        assertEquals("L4096-d50-03", p.id());
        assertEquals(4096, p.length());
        assertEquals(0.5, p.depth());
        assertEquals("x = \"\\n\"\n\u00e9max_iter = \"", p.prompt());
        assertEquals("aB3x9Q\"", p.expected());
        assertFalse(p.chat());
    }

    @Test
    void aProbeWithoutItsValueIsAnErrorNamingTheField() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> NeedleProbe.parse(
                "{\"id\": \"x\", \"n_ctx_tokens\": 10, \"depth\": 0.1, \"prompt\": \"p\"}"));
        assertTrue(e.getMessage().contains("'value'"), e.getMessage());
    }

    @Test
    void cellsCountCorrectProbesPerLengthAndDepth() {
        NeedleProbe a = new NeedleProbe("a", 1024, 0.1, "", "x", false);
        NeedleProbe b = new NeedleProbe("b", 1024, 0.1, "", "x", false);
        NeedleProbe c = new NeedleProbe("c", 2048, 0.5, "", "x", false);
        List<NeedleEval.Outcome> o = List.of(new NeedleEval.Outcome(a, true, "x", 10),
                new NeedleEval.Outcome(b, false, "y", 10), new NeedleEval.Outcome(c, true, "x", 10));
        NeedleEval.Result r = new NeedleEval.Result(o, NeedleEval.cells(o));
        assertEquals(List.of(new NeedleEval.Cell(1024, 0.1, 2, 1), new NeedleEval.Cell(2048, 0.5, 1, 1)), r.cells());
        assertEquals(2 / 3.0, r.accuracy(), 1e-12);
        assertTrue(r.toJson().contains("{\"n_ctx\":1024,\"depth\":0.1,\"n\":2,\"correct\":1}"), r.toJson());
    }

    @Test
    void passKeyProbeHasTheKeyAtItsDepthAndAboutItsLength() throws Exception {
        Path gguf = Fixtures.requireTinycode("tinycode-f16.gguf");
        String filler = Files.readString(Fixtures.requireTinycode("eval-heldout.txt")).substring(0, 20000);
        try (LlamaModel m = LlamaModel.load(gguf)) {
            Tokenizer tok = m.tokenizer();
            NeedleProbe p = NeedleProbe.passKey(tok, ChatTemplate.CHATML, filler, 2048, 0.5, new SplittableRandom(7), 0);
            assertTrue(p.expected().matches("\\d{5}"), p.expected());
            int at = p.prompt().indexOf("The pass key is " + p.expected());
            assertTrue(at > 0.4 * p.prompt().length() && at < 0.6 * p.prompt().length(), "needle at " + at + " of "
                    + p.prompt().length());
            assertTrue(p.prompt().endsWith("<|im_start|>assistant\nThe pass key is"), p.prompt().substring(
                    p.prompt().length() - 60));
            int tokens = tok.encode(p.prompt(), true, true).length;
            assertTrue(tokens > 1900 && tokens <= 2048, tokens + " tokens for a 2048-token probe");
            // a control-token text in the haystack stays text: the message is a plain range
            NeedleProbe marked = NeedleProbe.passKey(tok, ChatTemplate.CHATML, "<|im_end|> " + filler, 512, 0.5,
                    new SplittableRandom(7), 0);
            int[] r = marked.plainRanges();
            assertTrue(r != null && r.length >= 2, "the message's ranges");
            int marker = marked.prompt().indexOf("<|im_end|> ");
            assertTrue(marker > r[0] && marker < r[r.length - 1], "the haystack's marker inside the message's range");
            // a haystack with no sentence or line boundary: the needle stays at its depth (it used to go to the end)
            String flat = filler.replace('.', ' ').replace('\n', ' ');
            for (double depth : new double[] {0.1, 0.9}) {
                NeedleProbe q = NeedleProbe.passKey(tok, ChatTemplate.RAW, flat, 1024, depth, new SplittableRandom(7),
                        0);
                double where = (double) q.prompt().indexOf("The pass key is " + q.expected()) / q.prompt().length();
                assertTrue(Math.abs(where - depth) < 0.06, "depth " + depth + ": the needle at " + where);
            }
        }
    }
}
