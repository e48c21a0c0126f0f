package dev.kvant.engine;

import dev.kvant.Fixtures;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.sample.Sampler;
import dev.kvant.sample.SamplerConfig;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The tinycode fixture model against the figures its model card gives for llama.cpp. */
class TinycodeTest {

    static final String PROMPT = """
            class Stack:
                \"""A simple LIFO stack.\"""

                def __init__(self):
                    self.items = []

                def push(self, item):
            """;

    /** The start of llama.cpp's greedy continuation in the model card. */
    static final String LLAMA_CPP_CONTINUATION = """
                    \"""
                    Push a stack of items.

                    Returns
                    -------
                    list
                        A list of items.
                    \"""
                    return [item.pop() for item in item]

                def pop(self, item):
            """;

    @Test
    void greedyCompletionMatchesLlamaCpp() {
        Path f16 = Fixtures.requireTinycode("tinycode-f16.gguf");
        try (LlamaModel model = LlamaModel.load(f16);
             Parallel pool = new Parallel(2);
             Session s = new Session(model, 1024, KvFormat.parse("f16"), KvFormat.parse("f16"), 512, pool)) {
            // The model card's prompt file holds the 7 lines without a final newline; the model writes it.
            int[] prompt = model.tokenizer().encode(PROMPT.stripTrailing(), true, false);
            StringBuilder out = new StringBuilder();
            Generator.generate(s, model.tokenizer(), prompt, 48, new Sampler(SamplerConfig.greedy()), out::append);
            assertTrue(out.toString().startsWith("\n" + LLAMA_CPP_CONTINUATION.stripTrailing()),
                    "greedy continuation differs from llama.cpp's:\n" + out);
        }
    }

    /**
     * The model card's llama.cpp perplexities (F16 and Q8_0 weights, f16 cache): within 0.3%. About 2 minutes each
     * on 2 cores.
     */
    @Tag("slow")
    @ParameterizedTest(name = "{0} c={1}")
    @CsvSource({
            "tinycode-f16.gguf, 1024, 64, 7.9977",
            "tinycode-f16.gguf, 4096, 16, 6.0114",
            "tinycode-q8_0.gguf, 1024, 64, 7.9999",
            "tinycode-q8_0.gguf, 4096, 16, 6.0130"})
    void perplexityMatchesLlamaCpp(String file, int ctx, int chunks, double llamaCpp) throws IOException {
        Path model = Fixtures.requireTinycode(file);
        String text = Files.readString(Fixtures.requireTinycode("eval-heldout.txt"), StandardCharsets.UTF_8);
        try (LlamaModel m = LlamaModel.load(model);
             Parallel pool = new Parallel(2);
             Session s = new Session(m, ctx, KvFormat.parse("f16"), KvFormat.parse("f16"), 512, pool)) {
            int[] tokens = m.tokenizer().encode(text, true, false);
            Perplexity.Result r = Perplexity.evaluate(s, tokens, ctx, m.tokenizer().bos(), chunks, done -> { });
            assertEquals(chunks, r.chunks());
            double diff = r.ppl() / llamaCpp - 1;
            assertTrue(Math.abs(diff) < 0.003, file + " c=" + ctx + ": PPL " + r.ppl() + " vs llama.cpp "
                    + llamaCpp + " (" + String.format("%+.3f%%", diff * 100) + ")");
        }
    }
}
