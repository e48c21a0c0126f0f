package dev.kvant.model;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.select.SelectionConfig;
import dev.kvant.select.SelectionLog;
import dev.kvant.tensor.Parallel;

import java.lang.foreign.Arena;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The model attending through page selection. */
class SelectedForwardTest {
    private static final int VOCAB = TinyModels.VOCAB;

    /** Prefill logits of all tokens, then two decode steps, in one array. */
    private static float[] run(LlamaModel model, int[] prompt, KvFormat f, Parallel pool) {
        try (KvCache cache = KvCache.forTokens(dev.kvant.backend.CpuBackend.geometry(model.config()), f, f, 64, 256);
             KvSequence seq = cache.newSequence()) {
            LlamaModel.Scratch s = new LlamaModel.Scratch();
            float[] out = new float[(prompt.length + 2) * VOCAB];
            Arrays.fill(out, Float.NaN);
            float[] all = new float[prompt.length * VOCAB];
            for (int off = 0; off < prompt.length; off += 64) {
                int n = Math.min(64, prompt.length - off);
                model.forward(seq, prompt, off, n, true, all, s, pool);
                System.arraycopy(all, 0, out, off * VOCAB, n * VOCAB);
            }
            float[] one = new float[VOCAB];
            model.forward(seq, new int[] {prompt[5]}, 0, 1, false, one, s, pool);
            System.arraycopy(one, 0, out, prompt.length * VOCAB, VOCAB);
            model.decodeBatch(new KvSequence[] {seq}, new int[] {prompt[9]}, one, s, pool);
            System.arraycopy(one, 0, out, (prompt.length + 1) * VOCAB, VOCAB);
            return out;
        }
    }

    @Test
    void aBudgetCoveringTheContextGivesTheDenseLogitsBitForBit() {
        long seed = new Random().nextLong();
        try (Arena arena = Arena.ofShared(); Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file());
            int[] prompt = LlamaModelTest.randomTokens(seed, 200);
            KvFormat f = KvFormat.parse("turbo3");
            float[] dense = run(model, prompt, f, pool);
            model.setSelection(new SelectionConfig(256, 16, 16, 32, 0));
            float[] selected = run(model, prompt, f, pool);
            assertArrayEquals(dense, selected, "seed " + seed);
        }
    }

    @Test
    void aSmallBudgetChangesTheLogitsAndIsRecordedForSelectedLayersOnly(@TempDir Path dir) {
        long seed = new Random().nextLong();
        try (Arena arena = Arena.ofShared(); Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file());
            int[] prompt = LlamaModelTest.randomTokens(seed, 200);
            KvFormat f = KvFormat.parse("f16");
            float[] dense = run(model, prompt, f, pool);
            SelectionConfig c = new SelectionConfig(64, 16, 16, 16, 1);
            model.setSelection(c);
            Path file = dir.resolve("sel.txt");
            ModelConfig m = model.config();
            try (SelectionLog.Writer w = SelectionLog.writer(file, new SelectionLog.Header(m.layers(), m.heads(),
                    m.kvHeads(), m.headDimK(), m.headDimV(), 16))) {
                model.setSelectionLog(w);
                float[] selected = run(model, prompt, f, pool);
                model.setSelectionLog(null);
                w.commit();
                for (float x : selected) {
                    assertTrue(Float.isFinite(x), "seed " + seed);
                }
                // Up to the first selective position (budget 64 covers the first 64 tokens) the logits are dense.
                assertArrayEquals(Arrays.copyOf(dense, 64 * VOCAB), Arrays.copyOf(selected, 64 * VOCAB),
                        "seed " + seed);
                assertFalse(Arrays.equals(dense, selected), "a 64-token budget over 200 tokens changes the logits");
            }
            SelectionLog log = SelectionLog.read(file);
            assertTrue(log.entries().stream().allMatch(e -> e.layer() == 1), "layer 0 is dense");
            // 200 prompt tokens in query blocks of 16 (chunks of 64: 4 blocks each, the last chunk 8 tokens), 2 steps.
            assertEquals(13 + 2, log.entries().size());
            SelectionLog.Entry last = log.entries().get(log.entries().size() - 1);
            assertEquals(201, last.position());
            assertEquals(4, last.blocks()[0].length, "64 tokens of 16-token blocks");
        }
    }
}
