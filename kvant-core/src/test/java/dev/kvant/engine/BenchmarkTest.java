package dev.kvant.engine;

import org.junit.jupiter.api.Test;

import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;

class BenchmarkTest {

    /** Hands out the given run times in turn and counts the calls. */
    private static final class Runs implements LongSupplier {
        private final long[] times;
        final AtomicInteger calls = new AtomicInteger();

        Runs(long... times) {
            this.times = times;
        }

        @Override
        public long getAsLong() {
            int i = calls.getAndIncrement();
            return times[Math.min(i, times.length - 1)];
        }
    }

    @Test
    void warmUpStopsOnceTwoConsecutiveRunsAgree() {
        Runs runs = new Runs(1000, 800, 600, 590, 100);
        Benchmark.warmUp(runs);
        assertEquals(4, runs.calls.get(), "600 and 590 agree within 5%");
    }

    @Test
    void warmUpRunsTwiceWhenTheFirstRunsAlreadyAgree() {
        Runs runs = new Runs(500, 510);
        Benchmark.warmUp(runs);
        assertEquals(2, runs.calls.get());
    }

    @Test
    void warmUpGivesUpAfterItsRunCap() {
        long[] alternating = new long[20];
        for (int i = 0; i < alternating.length; i++) {
            alternating[i] = i % 2 == 0 ? 100 : 200;
        }
        Runs runs = new Runs(alternating);
        Benchmark.warmUp(runs);
        assertEquals(Benchmark.MAX_WARMUP_RUNS, runs.calls.get());
    }
}
