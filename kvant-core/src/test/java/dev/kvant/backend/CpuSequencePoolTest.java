package dev.kvant.backend;

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

class CpuSequencePoolTest {

    @Test
    void forkedSequenceContinuesBitForBitLikeTheOriginalAndSharesItsWholePages() {
        long seed = new Random().nextLong();
        Random r = new Random(seed);
        int vocab = TinyModels.VOCAB;
        KvFormat f = KvFormat.parse("q8_0");
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(2)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file());
            CpuBackend backend = new CpuBackend(model, threads);
            try (SequencePool pool = backend.newSequencePool(1024, f, f)) {
                int pt = pool.pageTokens();
                assertEquals(1024 / pt, pool.totalPages());
                int[] prompt = r.ints(2 * pt + 10, 0, vocab).toArray();
                BackendSequence parent = pool.newSequence(512);
                float[] sink = new float[vocab];
                parent.forward(prompt, 0, prompt.length, false, sink);
                assertEquals(pool.totalPages() - 3, pool.freePages(), "seed " + seed);

                int prefix = 2 * pt + 5;
                BackendSequence child = pool.fork(parent, prefix, 512);
                assertEquals(prefix, child.length());
                // Two whole pages shared, the third copied.
                assertEquals(pool.totalPages() - 4, pool.freePages(), "seed " + seed);

                BackendSequence alone = pool.newSequence(512);
                alone.forward(prompt, 0, prefix, false, sink);
                int[] next = r.ints(7, 0, vocab).toArray();
                float[] fromFork = new float[vocab];
                float[] fromScratch = new float[vocab];
                Arrays.fill(fromFork, Float.NaN);
                Arrays.fill(fromScratch, Float.NaN);
                child.forward(next, 0, next.length, false, fromFork);
                alone.forward(next, 0, next.length, false, fromScratch);
                assertArrayEquals(fromScratch, fromFork, "seed " + seed);

                parent.close();
                child.close();
                alone.close();
                assertEquals(pool.totalPages(), pool.freePages(), "every page returned (seed " + seed + ")");
            }
        }
    }

    @Test
    void forkRefusesASequenceOfAnotherPool() {
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(1)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, 3, arena).file());
            CpuBackend backend = new CpuBackend(model, threads);
            KvFormat f = KvFormat.parse("f16");
            try (SequencePool a = backend.newSequencePool(256, f, f);
                 SequencePool b = backend.newSequencePool(256, f, f);
                 BackendSequence s = a.newSequence(128)) {
                assertThrows(IllegalArgumentException.class, () -> b.fork(s, 0, 128));
            }
        }
    }
}
