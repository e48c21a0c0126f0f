package dev.kvant.backend;

import dev.kvant.engine.ContextFullException;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.util.Arrays;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class CpuBackendTest {

    @Test
    void randomFillAppendsRowsDeterministicallyAndRefusesPastTheContext() {
        long seed = new Random().nextLong();
        int vocab = TinyModels.VOCAB;
        try (Arena arena = Arena.ofShared();
             Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F32, seed, arena).file());
            CpuBackend backend = new CpuBackend(model, pool);
            KvFormat f = KvFormat.parse("turbo3");
            float[][] logits = new float[2][vocab];
            for (int run = 0; run < 2; run++) {
                try (BackendSequence s = backend.newSequence(300, f, f)) {
                    s.fillRandom(250, 7);
                    assertEquals(250, s.length());
                    s.forward(new int[] {3}, 0, 1, false, logits[run]);
                    assertEquals(251, s.length());
                    assertThrows(ContextFullException.class, () -> s.fillRandom(50, 8));
                    assertThrows(ContextFullException.class, () -> s.fillRandom(Integer.MAX_VALUE, 8),
                            "a count whose sum with the length overflows");
                    assertEquals(251, s.length(), "a refused fill changes nothing");
                }
            }
            assertArrayEquals(logits[0], logits[1], "the same fill seed gives the same cache (seed " + seed + ")");
            for (float x : logits[0]) {
                assertTrue(Float.isFinite(x));
            }
        }
    }

    @Test
    void batchedDecodeEqualsEachSequenceAloneBitForBit() {
        long seed = new Random().nextLong();
        Random r = new Random(seed);
        int vocab = TinyModels.VOCAB;
        KvFormat[] formats = {KvFormat.parse("f16"), KvFormat.parse("q8_0"), KvFormat.parse("turbo3")};
        int[] lengths = {1, 37, 130};
        try (Arena arena = Arena.ofShared();
             Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("qwen3", GgmlType.Q8_0, seed, arena).file());
            CpuBackend backend = new CpuBackend(model, pool);
            int n = lengths.length;
            BackendSequence[] batch = new BackendSequence[n];
            BackendSequence[] alone = new BackendSequence[n];
            int[][] prompts = new int[n][];
            for (int i = 0; i < n; i++) {
                batch[i] = backend.newSequence(256, formats[i], formats[i]);
                alone[i] = backend.newSequence(256, formats[i], formats[i]);
                prompts[i] = r.ints(lengths[i], 0, vocab).toArray();
                float[] sink = new float[vocab];
                batch[i].forward(prompts[i], 0, lengths[i], false, sink);
                alone[i].forward(prompts[i], 0, lengths[i], false, sink);
            }
            for (int step = 0; step < 3; step++) {
                int[] tokens = r.ints(n, 0, vocab).toArray();
                float[] batched = new float[n * vocab];
                Arrays.fill(batched, Float.NaN);
                backend.decodeBatch(batch, tokens, batched);
                for (int i = 0; i < n; i++) {
                    float[] one = new float[vocab];
                    alone[i].forward(tokens, i, 1, false, one);
                    assertArrayEquals(one, Arrays.copyOfRange(batched, i * vocab, (i + 1) * vocab),
                            "step " + step + " sequence " + i + " (seed " + seed + ")");
                    assertEquals(lengths[i] + step + 1, batch[i].length());
                }
            }
            for (int i = 0; i < n; i++) {
                batch[i].close();
                alone[i].close();
            }
        }
    }

    /** The model's attention options reach every layer: sparse V moves the logits a little, and back is exact. */
    @Test
    void sparseVAppliesToTheModelsAttentionAndTurnsOffExactly() {
        long seed = new Random().nextLong();
        Random r = new Random(seed);
        try (Arena arena = Arena.ofShared();
             Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F32, seed, arena).file());
            CpuBackend backend = new CpuBackend(model, pool);
            int vocab = TinyModels.VOCAB;
            int[] prompt = r.ints(200, 0, vocab).toArray();
            float[][] runs = new float[3][];
            float[] thresholds = {0f, 0.01f, 0f};
            for (int i = 0; i < 3; i++) {
                model.setAttentionOptions(dev.kvant.attention.AttentionOptions.defaults().withSparseV(thresholds[i]));
                try (BackendSequence s = backend.newSequence(256, KvFormat.parse("f16"), KvFormat.parse("f16"))) {
                    runs[i] = new float[vocab];
                    s.forward(prompt, 0, prompt.length, false, runs[i]);
                }
            }
            model.setAttentionOptions(dev.kvant.attention.AttentionOptions.defaults());
            assertArrayEquals(runs[0], runs[2], "exact again (seed " + seed + ")");
            double num = 0;
            double den = 0;
            boolean differs = false;
            for (int i = 0; i < vocab; i++) {
                double d = runs[1][i] - runs[0][i];
                num += d * d;
                den += (double) runs[0][i] * runs[0][i];
                differs |= runs[1][i] != runs[0][i];
            }
            assertTrue(differs, "sparse V at 0.01 changed nothing (seed " + seed + ")");
            // a random model attends broadly, so a threshold this high drops a lot: only sanity is checked here
            assertTrue(num / den < 0.5, "sparse V NMSE " + num / den + " (seed " + seed + ")");
        }
    }

    @Test
    void batchRefusesARepeatedSequenceAndAFullOne() {
        try (Arena arena = Arena.ofShared();
             Parallel pool = new Parallel(1)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, 7, arena).file());
            CpuBackend backend = new CpuBackend(model, pool);
            KvFormat f16 = KvFormat.parse("f16");
            try (BackendSequence a = backend.newSequence(2, f16, f16)) {
                float[] logits = new float[2 * TinyModels.VOCAB];
                assertThrows(IllegalArgumentException.class,
                        () -> backend.decodeBatch(new BackendSequence[] {a, a}, new int[] {1, 2}, logits));
                a.forward(new int[] {1, 2}, 0, 2, false, logits);
                assertThrows(ContextFullException.class,
                        () -> backend.decodeBatch(new BackendSequence[] {a}, new int[] {3}, logits));
                assertEquals(2, a.length());
            }
        }
    }
}
