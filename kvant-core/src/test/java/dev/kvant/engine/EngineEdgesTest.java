package dev.kvant.engine;

import dev.kvant.backend.CpuBackend;
import dev.kvant.backend.SequencePool;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.sample.SamplerConfig;
import dev.kvant.select.SelectionConfig;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The engine against a request's own faults and around its edges: a stop or ban predicate that throws fails that
 * request alone; a model that selects KV pages reuses whole prompt chunks only (the answer is the fresh one); a queue head that
 * must wait for pages held outside the engine does not keep its thread busy; clearing the prefix cache after the
 * engine ended returns at once.
 */
class EngineEdgesTest {
    private static final KvFormat F16 = KvFormat.parse("f16");
    private static final int CTX = 256;

    /**
     * With a page selection on the model a prefix of any length would give other tokens than the same prompt computed
     * afresh (selection is per block of queries, and per token in decode steps): the engine reuses the first turn's
     * whole prompt chunks only, and answers as a fresh engine.
     */
    @Test
    void withPageSelectionWholeChunksAreReusedAndTheAnswerIsTheFreshOne() throws Exception {
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(2)) {
            CpuBackend backend = backend(7, arena, threads);
            backend.model().setSelection(new SelectionConfig(64, 16, 16, 16, 1));
            EngineTest.secondTurnReusesWholeChunksAndAnswersAsAFreshEngine(backend, F16, F16, 7);
        }
    }

    /** A request whose stop predicate throws fails alone; the engine and the request beside it go on. */
    @Test
    void aThrowingStopPredicateFailsItsRequestAlone() throws Exception {
        long seed = 3;
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(2)) {
            CpuBackend backend = backend(seed, arena, threads);
            try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
                 Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, 32, 8, true))) {
                EngineTest.Events bystander = new EngineTest.Events();
                engine.submit(new GenerationRequest(new Random(1).ints(20, 0, TinyModels.VOCAB).toArray(), 200,
                        SamplerConfig.greedy(), null), bystander.queue::add);
                EngineTest.Events bad = new EngineTest.Events();
                engine.submit(new GenerationRequest(new int[] {1, 2, 3}, 5, SamplerConfig.greedy(),
                        t -> { throw new IllegalStateException("predicate bug"); }), bad.queue::add);
                GenerationEvent failed = bad.end();
                assertInstanceOf(GenerationEvent.Failed.class, failed);
                assertTrue(((GenerationEvent.Failed) failed).message().contains("predicate bug"), failed.toString());
                GenerationEvent e = bystander.end();
                assertNull(engine.failure(), "engine died: " + engine.failure() + "; bystander got " + e);
                assertInstanceOf(GenerationEvent.Finished.class, e);
            }
        }
    }

    /**
     * A queue head that waits for a page another user of the pool holds, nothing running: the engine looks again
     * now and then (it used to loop at full speed), and starts the request once the page is back.
     */
    @Test
    void aRequestWaitingForPagesHeldOutsideTheEngineDoesNotKeepItsThreadBusy() throws Exception {
        long seed = 5;
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(2)) {
            CpuBackend backend = backend(seed, arena, threads);
            try (SequencePool pool = backend.newSequencePool(CTX, F16, F16);
                 Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, 32, 8, false))) {
                // another user of the pool holds one page
                dev.kvant.backend.BackendSequence other = pool.newSequence(CTX);
                other.forward(new int[] {1, 2, 3}, 0, 3, false, new float[TinyModels.VOCAB]);
                EngineTest.Events e = new EngineTest.Events();
                engine.submit(new GenerationRequest(new Random(1).ints(100, 0, TinyModels.VOCAB).toArray(), 200,
                        SamplerConfig.greedy(), null), e.queue::add);
                Thread.sleep(200);
                java.lang.management.ThreadMXBean mx = java.lang.management.ManagementFactory.getThreadMXBean();
                long id = Thread.getAllStackTraces().keySet().stream().filter(t -> t.getName().equals("kvant-engine"))
                        .findFirst().orElseThrow().threadId();
                long cpu0 = mx.getThreadCpuTime(id);
                long t0 = System.nanoTime();
                Thread.sleep(1000);
                double share = (mx.getThreadCpuTime(id) - cpu0) / (double) (System.nanoTime() - t0);
                other.close();
                assertInstanceOf(GenerationEvent.Finished.class, e.end());
                assertTrue(share < 0.2, "the engine thread burnt " + Math.round(share * 100) + "% of a core while waiting");
            }
        }
    }

    /** After the engine thread has ended, clearing the prefix cache returns at once (it used to wait 60 s). */
    @Test
    void clearingThePrefixCacheAfterCloseReturnsAtOnce() throws Exception {
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(2)) {
            CpuBackend backend = backend(9, arena, threads);
            try (SequencePool pool = backend.newSequencePool(CTX, F16, F16)) {
                Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, 32, 8, true));
                engine.close();
                assertTimeoutPreemptively(java.time.Duration.ofSeconds(3), engine::clearPrefixCache);
            }
        }
    }

    /** A request whose banned-token predicate throws fails alone, its sequence closed. */
    @Test
    void aThrowingBanPredicateFailsItsRequestAlone() throws Exception {
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(2)) {
            CpuBackend backend = backend(9, arena, threads);
            try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
                 Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, 32, 8, true))) {
                EngineTest.Events bad = new EngineTest.Events();
                engine.submit(new GenerationRequest(new int[] {1, 2, 3}, 5, SamplerConfig.greedy(), null,
                        t -> { if (t == 299) throw new IllegalStateException("ban bug"); return false; }), bad.queue::add);
                GenerationEvent e = bad.end();
                assertNull(engine.failure(), "engine died: " + engine.failure() + "; request got " + e);
                assertInstanceOf(GenerationEvent.Failed.class, e);
                assertEquals(pool.totalPages(), pool.freePages(), "the sequence's pages came back");
            }
        }
    }

    /** The CPU backend of a tiny llama model built from seed (F16 weights). */
    private static CpuBackend backend(long seed, Arena arena, Parallel threads) {
        return new CpuBackend(LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, arena).file()), threads);
    }
}
