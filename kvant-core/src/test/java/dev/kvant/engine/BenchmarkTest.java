package dev.kvant.engine;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.CpuBackend;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class BenchmarkTest {

    /** Hands out the given run times (milliseconds) in turn as nanoseconds, counts the calls, and is the clock. */
    private static class Runs implements LongSupplier {
        private final long[] millis;
        final AtomicInteger calls = new AtomicInteger();
        long clock;

        Runs(long... millis) {
            this.millis = millis;
        }

        @Override
        public long getAsLong() {
            int i = calls.getAndIncrement();
            long nanos = millis[Math.min(i, millis.length - 1)] * 1_000_000L;
            clock += nanos;
            return nanos;
        }

        /** The JIT's compilation time the warm-up sees: constant unless a test moves it. */
        long compiled;

        void warmUp() {
            Benchmark.warmUp(this, () -> clock, () -> compiled);
        }
    }

    @Test
    void warmUpStopsOnceTheFastestRunStopsImproving() {
        Runs runs = new Runs(1000, 800, 600, 600, 605, 598, 601, 600, 100);
        runs.warmUp();
        assertEquals(6, runs.calls.get(), "600 at the third run, then three runs none of which is 1% faster, 1.8 s");
    }

    /**
     * Runs that each take a little less than the one before are the JIT at work, however well neighbours agree:
     * they go on until the fastest stops improving (two consecutive runs within 5% used to end the warm-up there).
     */
    @Test
    void warmUpGoesOnWhileEachRunIsALittleFaster() {
        long[] rising = new long[40];
        for (int i = 0; i < rising.length; i++) {
            rising[i] = i < 20 ? 1000 - 30L * i : 430;   // 3% faster a run for 20 runs, then flat
        }
        Runs runs = new Runs(rising);
        runs.warmUp();
        assertEquals(20 + Benchmark.PLATEAU_RUNS, runs.calls.get(), "20 runs of speeding up, then the plateau");
    }

    /** A run during which the JIT compiled something starts the plateau again, however fast it was. */
    @Test
    void warmUpWaitsForTheJitToStopCompiling() {
        Runs runs = new Runs(500, 510) {
            @Override
            public long getAsLong() {
                if (calls.get() == 3) {
                    compiled += 7;   // a compilation lands during the fourth run
                }
                return super.getAsLong();
            }
        };
        runs.warmUp();
        assertEquals(4 + Benchmark.PLATEAU_RUNS, runs.calls.get(), "two flat runs, a compiling one, then three");
    }

    /** Runs that agree at once still warm up for the minimum time (a short test agrees before the JIT is done). */
    @Test
    void warmUpLastsItsMinimumTimeEvenWhenTheFirstRunsAgree() {
        Runs runs = new Runs(500, 510);
        runs.warmUp();
        assertEquals(1 + Benchmark.PLATEAU_RUNS, runs.calls.get(),
                "the first run, then three flat runs of half a second (past the 1.5 s minimum)");
        Runs quick = new Runs(10);
        quick.warmUp();
        assertEquals(1 + Benchmark.MIN_WARMUP_NANOS / 10_000_000, quick.calls.get());
    }

    @Test
    void warmUpGivesUpAfterItsTimeCap() {
        long[] faster = new long[1000];
        for (int i = 0; i < faster.length; i++) {
            faster[i] = Math.round(1000 * Math.pow(0.98, i));   // 2% faster every run: never a plateau
        }
        Runs runs = new Runs(faster);
        runs.warmUp();
        assertTrue(runs.clock >= Benchmark.MAX_WARMUP_NANOS && runs.clock < Benchmark.MAX_WARMUP_NANOS + 2_000_000_000L,
                "stopped at " + runs.clock + " ns of runs");
    }

    /** Records the batches a backend is asked to decode: their size and each sequence's length before the step. */
    private static final class Recording extends ForwardingBackend {
        final List<int[]> steps = new ArrayList<>();

        Recording(Backend inner) {
            super(inner);
        }

        @Override
        public void decodeBatch(BackendSequence[] seqs, int[] tokens, float[] logits) {
            int[] lengths = new int[seqs.length];
            for (int i = 0; i < seqs.length; i++) {
                lengths[i] = seqs[i].length();
            }
            steps.add(lengths);
            super.decodeBatch(seqs, tokens, logits);
        }
    }

    @Test
    void generationOfSeveralSequencesDecodesThemTogetherFromTheDepth() {
        KvFormat f16 = KvFormat.parse("f16");
        try (Arena arena = Arena.ofShared(); Parallel threads = new Parallel(1)) {
            LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, 5, arena).file());
            Recording backend = new Recording(new CpuBackend(model, threads));
            Benchmark.Settings s = new Benchmark.Settings(new int[] {0}, new int[] {4}, new int[] {10}, 2, 1, f16, f16,
                    32, false, 3);
            List<Benchmark.Row> rows = Benchmark.run(backend, s, p -> { });
            assertEquals(1, rows.size());
            assertEquals("tg4 x3", rows.get(0).test());
            assertTrue(rows.get(0).tpsMean() > 0);
            assertEquals(0, backend.steps.size() % 4, "whole runs of 4 steps");
            for (int i = 0; i < backend.steps.size(); i++) {
                int want = 10 + i % 4;
                assertEquals(List.of(want, want, want), java.util.Arrays.stream(backend.steps.get(i)).boxed().toList(),
                        "step " + i + ": three sequences, each at the depth plus the tokens before");
            }
        }
    }

    /** Quantiles interpolate between the sorted repetitions; the median and quartiles reach the JSON and the table. */
    @Test
    void medianAndQuartilesOfTheRepetitions() {
        Benchmark.Row r = new Benchmark.Row("m", "cpu", 2, "f16/f16", "tg16", 0, 5, 30, 1,
                new double[] {50, 10, 40, 20, 30});
        assertEquals(30, r.quantile(0.5));
        assertEquals(20, r.quantile(0.25));
        assertEquals(40, r.quantile(0.75));
        assertEquals(10, r.quantile(0));
        assertEquals(50, r.quantile(1));
        Benchmark.Row even = new Benchmark.Row("m", "cpu", 2, "f16/f16", "tg16", 0, 4, 25, 1,
                new double[] {40, 10, 30, 20});
        assertEquals(25, even.quantile(0.5));
        assertEquals(17.5, even.quantile(0.25));
        assertTrue(r.toJson(true).endsWith(",\"tps_mean\":30.000,\"tps_sd\":1.000,\"tps_median\":30.000,"
                + "\"tps_q1\":20.000,\"tps_q3\":40.000}"), r.toJson(true));
        assertTrue(r.toJson().endsWith(",\"tps_sd\":1.000}"), r.toJson());
        assertTrue(Benchmark.markdown(List.of(r), true).contains("| tg16 | 30.00 (20.00 - 40.00) |"),
                Benchmark.markdown(List.of(r), true));
    }
}
