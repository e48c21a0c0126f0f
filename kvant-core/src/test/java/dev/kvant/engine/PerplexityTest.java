package dev.kvant.engine;

import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.util.Arrays;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

class PerplexityTest {

    private static final int CTX = 32;

    /** n ids of the tiny model's vocabulary drawn from seed. */
    private static int[] tokens(long seed, int n) {
        return new Random(seed).ints(n, 0, TinyModels.VOCAB).toArray();
    }

    /**
     * Each chunk's mean NLL is that chunk's own perplexity (the log of it, bit for bit: the same sum in the same
     * order) and the chunks' mean is the whole run's, so two runs can be compared chunk by chunk.
     */
    @Test
    void chunkNllIsEachChunksOwnPerplexity() {
        long seed = new Random().nextLong();
        try (Arena arena = Arena.ofShared();
             Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file());
            int[] tokens = tokens(seed, 3 * CTX + 5);
            try (Session s = new Session(model, CTX, KvFormat.parse("f16"), KvFormat.parse("f16"), 16, pool)) {
                Perplexity.Result all = Perplexity.evaluate(s, tokens, CTX, -1, 0, done -> { });
                assertEquals(3, all.chunks());
                assertEquals(3, all.chunkNll().length);
                double mean = Arrays.stream(all.chunkNll()).sum() / 3;
                assertEquals(Math.log(all.ppl()), mean, 1e-12, "seed " + seed);
                for (int c = 0; c < 3; c++) {
                    // the chunk first in a text of two chunks' length (llama.cpp's least), only it scored
                    int[] one = Arrays.copyOfRange(tokens, c * CTX, (c + 2) * CTX);
                    Perplexity.Result own = Perplexity.evaluate(s, one, CTX, -1, 1, done -> { });
                    assertEquals(Math.exp(all.chunkNll()[c]), own.ppl(), "chunk " + c + ", seed " + seed);
                }
                String json = all.toJson(true);
                assertTrue(json.matches("\\{\"ppl\":[0-9.]+,\"ppl_err\":[0-9.]+,\"chunks\":3,\"ctx\":32,"
                        + "\"tokens_scored\":45,\"chunk_nll\":\\[[0-9.]+,[0-9.]+,[0-9.]+]}"), json);
                assertFalse(all.toJson().contains("chunk_nll"), all.toJson());
            }
        }
    }

    /**
     * The logits are scored chunk by chunk as the prefill makes them (a whole context's would not fit: 32K positions of
     * a 128K vocabulary are 16 GB), with prefill chunks that do not line up with the scored half: the same bits as
     * scoring every position's logits held at once.
     */
    @Test
    void scoringEachPrefillChunkAsItComesGivesTheBitsOfAllLogitsAtOnce() {
        long seed = new Random().nextLong();
        try (Arena arena = Arena.ofShared();
             Parallel pool = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file());
            int[] tokens = tokens(seed, 2 * CTX);
            try (Session s = new Session(model, CTX, KvFormat.parse("f16"), KvFormat.parse("f16"), 5, pool)) {
                Perplexity.Result r = Perplexity.evaluate(s, tokens, CTX, -1, 0, done -> { });
                double nll = 0;
                float[] all = new float[CTX * TinyModels.VOCAB];
                for (int c = 0; c < 2; c++) {
                    int[] chunk = Arrays.copyOfRange(tokens, c * CTX, (c + 1) * CTX);
                    s.truncate(0);
                    s.prefillAllLogits(chunk, 0, CTX, all);
                    for (int j = CTX / 2; j < CTX - 1; j++) {
                        nll += -Perplexity.logSoftmax(all, j * TinyModels.VOCAB, TinyModels.VOCAB, chunk[j + 1]);
                    }
                }
                long scored = 2L * (CTX - 1 - CTX / 2);
                assertEquals(scored, r.tokensScored());
                assertEquals(Math.exp(nll / scored), r.ppl(), "seed " + seed);
            }
        }
    }
}
