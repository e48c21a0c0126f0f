package dev.kvant.tensor;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicIntegerArray;
import org.junit.jupiter.api.Test;

class ParallelTest {
    /** One exception object thrown by many tasks (a shared instance) is rethrown once; the pool goes on. */
    @Test
    void aSharedExceptionThrownByManyTasksNeitherHangsNorKillsAWorker() {
        RuntimeException shared = new RuntimeException("shared");
        try (Parallel pool = new Parallel(2)) {
            org.junit.jupiter.api.Assertions.assertTimeoutPreemptively(java.time.Duration.ofSeconds(20), () -> {
                for (int round = 0; round < 50; round++) {
                    RuntimeException e = assertThrows(RuntimeException.class, () -> pool.forEach(64, t -> {
                        throw shared;
                    }));
                    assertSame(shared, e);
                }
                AtomicIntegerArray ran = new AtomicIntegerArray(64);
                pool.forEach(64, ran::incrementAndGet);
                for (int t = 0; t < 64; t++) {
                    assertEquals(1, ran.get(t));
                }
            });
        }
    }

    /** close() from inside a task, or from two threads at once, returns; the pool refuses work after. */
    @Test
    void closeFromInsideATaskOrTwiceAtOnceReturns() {
        org.junit.jupiter.api.Assertions.assertTimeoutPreemptively(java.time.Duration.ofSeconds(20), () -> {
            Parallel p = new Parallel(2);
            AtomicIntegerArray ran = new AtomicIntegerArray(8);
            p.forEach(8, i -> {
                ran.incrementAndGet(i);
                if (i == 0) {
                    p.close();
                }
            });
            for (int i = 0; i < 8; i++) {
                assertEquals(1, ran.get(i), "task " + i);
            }
            assertThrows(IllegalStateException.class, () -> p.forEach(4, i -> { }));
            for (int round = 0; round < 20; round++) {
                Parallel q = new Parallel(2);
                Thread other = new Thread(q::close);
                other.start();
                q.close();
                other.join();
            }
        });
    }

    /** Run inline (one task, a serial pool, a nested call), every task still runs before the first failure is thrown. */
    @Test
    void theInlinePathRunsEveryTaskBeforeThrowing() {
        AtomicIntegerArray ran = new AtomicIntegerArray(4);
        RuntimeException e = assertThrows(RuntimeException.class, () -> Parallel.serial().forEach(4, t -> {
            ran.incrementAndGet(t);
            if (t == 1) {
                throw new RuntimeException("task 1");
            }
        }));
        assertEquals("task 1", e.getMessage());
        for (int t = 0; t < 4; t++) {
            assertEquals(1, ran.get(t), "task " + t);
        }
    }

    @Test
    void everyTaskRunsExactlyOnceAcrossManyCalls() {
        try (Parallel pool = new Parallel(3)) {
            assertEquals(3, pool.threads());
            for (int call = 0; call < 2000; call++) {
                int tasks = 1 + call % 37;
                AtomicIntegerArray runs = new AtomicIntegerArray(tasks);
                pool.forEach(tasks, runs::incrementAndGet);
                for (int t = 0; t < tasks; t++) {
                    assertEquals(1, runs.get(t), "call " + call + " task " + t);
                }
            }
        }
    }

    @Test
    void tasksRunOnTheWorkersAndTheCaller() {
        try (Parallel pool = new Parallel(2)) {
            ConcurrentHashMap<String, Boolean> threads = new ConcurrentHashMap<>();
            // Tasks long enough that the worker, however late it wakes, takes some.
            for (int call = 0; call < 50 && threads.size() < 2; call++) {
                pool.forEach(64, t -> {
                    threads.put(Thread.currentThread().getName(), true);
                    long until = System.nanoTime() + 20_000;
                    while (System.nanoTime() < until) {
                        Thread.onSpinWait();
                    }
                });
            }
            assertEquals(2, threads.size(), threads.keySet().toString());
        }
    }

    @Test
    void theFirstExceptionPropagatesAfterAllTasksFinish() {
        try (Parallel pool = new Parallel(2)) {
            AtomicIntegerArray runs = new AtomicIntegerArray(10);
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> pool.forEach(10, t -> {
                runs.incrementAndGet(t);
                if (t == 3) {
                    throw new IllegalStateException("task 3 failed");
                }
            }));
            assertEquals("task 3 failed", e.getMessage());
            for (int t = 0; t < 10; t++) {
                assertEquals(1, runs.get(t), "task " + t);
            }
            // The pool still works afterwards.
            AtomicIntegerArray again = new AtomicIntegerArray(5);
            pool.forEach(5, again::incrementAndGet);
            assertEquals(5, again.get(0) + again.get(1) + again.get(2) + again.get(3) + again.get(4));
        }
    }

    @Test
    void aNestedCallRunsOnTheCallingThread() {
        try (Parallel pool = new Parallel(2)) {
            AtomicIntegerArray inner = new AtomicIntegerArray(4 * 8);
            pool.forEach(4, outer -> {
                String thread = Thread.currentThread().getName();
                pool.forEach(8, i -> {
                    assertEquals(thread, Thread.currentThread().getName());
                    inner.incrementAndGet(outer * 8 + i);
                });
            });
            for (int i = 0; i < inner.length(); i++) {
                assertEquals(1, inner.get(i), "inner task " + i);
            }
        }
    }

    @Test
    void serialPoolRunsOnTheCallerAndSurvivesClose() {
        Parallel serial = Parallel.serial();
        assertSame(serial, Parallel.serial());
        assertEquals(1, serial.threads());
        serial.close();
        String caller = Thread.currentThread().getName();
        serial.forEach(3, t -> assertEquals(caller, Thread.currentThread().getName()));
    }

    @Test
    void aClosedPoolRefusesWorkAndParkedWorkersWakeForNewWork() throws InterruptedException {
        Parallel pool = new Parallel(2);
        Thread.sleep(Parallel.SPIN_NANOS / 1_000_000 + 20);
        AtomicIntegerArray runs = new AtomicIntegerArray(16);
        pool.forEach(16, runs::incrementAndGet);
        for (int t = 0; t < 16; t++) {
            assertEquals(1, runs.get(t));
        }
        pool.close();
        assertThrows(IllegalStateException.class, () -> pool.forEach(2, t -> { }));
        assertThrows(IllegalArgumentException.class, () -> new Parallel(0));
    }
}
