package dev.kvant.backend;

import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvCacheFullException;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.util.Arrays;
import java.util.Random;
import java.util.function.Consumer;

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
        onTinyModel(seed, 2, backend -> {
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
        });
    }

    @Test
    void forkRefusesASequenceOfAnotherPool() {
        onTinyModel(3, 1, backend -> {
            KvFormat f = KvFormat.parse("f16");
            try (SequencePool a = backend.newSequencePool(256, f, f);
                 SequencePool b = backend.newSequencePool(256, f, f);
                 BackendSequence s = a.newSequence(128)) {
                assertThrows(IllegalArgumentException.class, () -> b.fork(s, 0, 128));
            }
        });
    }

    /**
     * A batch whose second member needs a copy-on-write page the pool does not have fails before any member writes:
     * the first keeps its length (it had one layer written, its length advanced, before reserve counted copies).
     */
    @Test
    void aBatchThatCannotCopyASharedPageFailsBeforeAnyMemberWrites() {
        onTinyModel(5, 2, backend -> {
            KvFormat f = KvFormat.parse("q8_0");
            try (SequencePool pool = backend.newSequencePool(6 * 64, f, f)) {
                int pt = pool.pageTokens();
                int[] tokens = new int[4 * pt];
                for (int i = 0; i < tokens.length; i++) {
                    tokens[i] = (i * 7 + 3) % TinyModels.VOCAB;
                }
                float[] sink = new float[TinyModels.VOCAB];
                BackendSequence a = pool.newSequence(1000);
                a.forward(tokens, 0, 10, false, sink);
                BackendSequence p = pool.newSequence(1000);
                p.forward(tokens, 0, 2 * pt, false, sink);
                BackendSequence b = pool.fork(p, 2 * pt, 1000);   // shares both pages
                b.truncate(2 * pt - 28);                            // its next write lands in a shared page
                BackendSequence filler = pool.newSequence(1000);
                filler.forward(tokens, 0, pool.freePages() * pt, false, sink);
                assertEquals(0, pool.freePages());
                assertThrows(KvCacheFullException.class, () -> backend.decodeBatch(new BackendSequence[] {a, b},
                        new int[] {5, 6}, new float[2 * TinyModels.VOCAB]));
                assertEquals(10, a.length(), "the first member wrote nothing");
                assertEquals(2 * pt - 28, b.length());
            }
        });
    }

    /**
     * A refused step or forward takes no page: a batch whose members together need more pages than are free (one a
     * fresh page, the other a copy) leaves the free count as it was, and so does a prompt with a bad token id.
     */
    @Test
    void aRefusedStepOrForwardTakesNoPage() {
        onTinyModel(6, 2, backend -> {
            KvFormat f = KvFormat.parse("q8_0");
            try (SequencePool pool = backend.newSequencePool(6 * 64, f, f)) {
                int pt = pool.pageTokens();
                int[] tokens = new int[4 * pt];
                for (int i = 0; i < tokens.length; i++) {
                    tokens[i] = (i * 5 + 1) % TinyModels.VOCAB;
                }
                float[] sink = new float[TinyModels.VOCAB];
                BackendSequence a = pool.newSequence(1000);
                a.forward(tokens, 0, pt, false, sink);              // a whole page: its next token needs a fresh one
                BackendSequence p = pool.newSequence(1000);
                p.forward(tokens, 0, 2 * pt, false, sink);
                BackendSequence b = pool.fork(p, 2 * pt, 1000);     // shares both pages
                b.truncate(2 * pt - 28);                              // its next write needs a copy
                BackendSequence filler = pool.newSequence(1000);
                filler.forward(tokens, 0, (pool.freePages() - 1) * pt, false, sink);
                assertEquals(1, pool.freePages());
                assertThrows(KvCacheFullException.class, () -> backend.decodeBatch(new BackendSequence[] {a, b},
                        new int[] {5, 6}, new float[2 * TinyModels.VOCAB]));
                assertEquals(1, pool.freePages(), "no page taken by the refused batch");
                assertEquals(pt, a.length());
                assertEquals(2 * pt - 28, b.length());
                BackendSequence c = pool.newSequence(1000);
                assertThrows(IllegalArgumentException.class, () -> c.forward(new int[] {1, TinyModels.VOCAB}, 0, 2,
                        false, sink));
                assertEquals(1, pool.freePages(), "no page taken by a prompt with a bad id");
                assertEquals(0, c.length());
                a.forward(new int[] {5}, 0, 1, false, sink);   // alone it fits
                assertEquals(0, pool.freePages());
            }
        });
    }

    /** Runs a test on the CPU backend of a tiny F16 model built from seed, with that many threads. */
    private static void onTinyModel(long seed, int threads, Consumer<CpuBackend> test) {
        try (Arena arena = Arena.ofShared(); Parallel pool = new Parallel(threads)) {
            test.accept(new CpuBackend(LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file()),
                    pool));
        }
    }
}
