package dev.kvant.tensor;

import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import java.util.function.IntConsumer;

/**
 * A fixed pool of threads for the kernels' fork-join steps, built for many small steps: a decode step calls a
 * matvec of a few microseconds several times per layer, where waking a parked thread (tens of microseconds)
 * would cost more than the work.
 *
 * <p>So the workers spin (with {@link Thread#onSpinWait}) for {@link #SPIN_NANOS} after their last task before
 * they park; back-to-back calls find them awake and cost one volatile write and a few cache-line transfers. The
 * caller runs tasks too, and tasks are handed out one at a time from a shared counter, so a worker that the OS
 * has descheduled (the machine may be shared) delays nothing but the task it holds.
 *
 * <p>Which thread runs which task is not fixed, so results must not depend on it: the kernels give each output
 * element to exactly one task and fix its arithmetic, and the task split never depends on the thread count.
 *
 * <p>A call from inside a task, or from a second thread while the pool is busy, runs its tasks on the calling
 * thread instead of waiting for the pool.
 */
public final class Parallel implements AutoCloseable {
    /**
     * How long an idle worker spins before parking. Long enough to bridge the gaps between the matvecs of a
     * decode step (norms, rope, attention run in between), short enough not to burn a shared core for long.
     */
    static final long SPIN_NANOS = 200_000;

    private static final Parallel SERIAL = new Parallel(1);
    private static final Job SHUTDOWN = new Job(0, t -> { });

    private final int threads;
    private final Worker[] workers;
    private final AtomicBoolean busy = new AtomicBoolean();
    /** The thread whose forEach holds busy, while it does. */
    private volatile Thread owner;
    private volatile Job current;
    private volatile boolean closed;

    public Parallel(int threads) {
        if (threads < 1) {
            throw new IllegalArgumentException("a pool needs at least one thread, got " + threads);
        }
        this.threads = threads;
        this.workers = new Worker[threads - 1];
        for (int i = 0; i < workers.length; i++) {
            workers[i] = new Worker(i + 1);
            workers[i].start();
        }
    }

    /** A pool of one thread: every call runs on the caller. Shared; closing it does nothing. */
    public static Parallel serial() {
        return SERIAL;
    }

    public int threads() {
        return threads;
    }

    /**
     * Runs {@code task.accept(i)} for i = 0 .. tasks-1 across the pool, the calling thread included, and returns
     * when all have finished. If tasks throw, the first exception is rethrown here (the others are attached as
     * suppressed) after every task has run or failed.
     */
    public void forEach(int tasks, IntConsumer task) {
        if (tasks <= 0) {
            return;
        }
        if (closed) {
            throw new IllegalStateException("this pool is closed");
        }
        if (workers.length == 0 || tasks == 1 || !busy.compareAndSet(false, true)) {
            runInline(tasks, task);
            return;
        }
        Job job;
        owner = Thread.currentThread();
        try {
            job = new Job(tasks, task);
            if (closed) {   // close() ran since the check above: it waits for busy, so no worker is left behind
                throw new IllegalStateException("this pool is closed");
            }
            current = job;
            for (Worker w : workers) {
                if (w.parked) {
                    LockSupport.unpark(w);
                }
            }
            job.work();
            job.awaitFinished();
        } finally {
            owner = null;
            busy.set(false);
        }
        job.rethrow();
    }

    /**
     * As the pool runs them: every task, then the first failure (the others suppressed in it). A plain loop: this is
     * every call of a one-thread pool, so it allocates nothing unless a task throws.
     */
    private static void runInline(int tasks, IntConsumer task) {
        Throwable failure = null;
        for (int i = 0; i < tasks; i++) {
            try {
                task.accept(i);
            } catch (Throwable e) {
                if (failure == null) {
                    failure = e;
                } else if (e != failure) {
                    failure.addSuppressed(e);
                }
            }
        }
        rethrow(failure);
    }

    /** Throws e as it is (unchecked), wrapped when checked; nothing when null. */
    private static void rethrow(Throwable e) {
        if (e instanceof RuntimeException r) {
            throw r;
        }
        if (e instanceof Error err) {
            throw err;
        }
        if (e != null) {
            throw new IllegalStateException(e);
        }
    }

    @Override
    public void close() {
        if (this == SERIAL) {
            return;
        }
        synchronized (this) {   // one closer
            if (closed) {
                return;
            }
            closed = true;
        }
        // From inside a task (the thread running forEach, or a worker) the job in flight is this call's own: the
        // workers stop after it, unjoined. From outside, a forEach that passed its closed check before this holds
        // busy until its job is done: wait for it, so SHUTDOWN is never overwritten by a job the workers would then
        // wait behind forever.
        Thread me = Thread.currentThread();
        boolean inside = me == owner || me instanceof Worker w && w.pool() == this;
        if (!inside) {
            while (!busy.compareAndSet(false, true)) {
                Thread.onSpinWait();
            }
        }
        current = SHUTDOWN;
        for (Worker w : workers) {
            LockSupport.unpark(w);
        }
        if (inside) {
            return;
        }
        for (Worker w : workers) {
            try {
                w.join();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
    }

    /** One {@link #forEach} call: a counter hands out task indices, another counts finished ones. */
    private static final class Job {
        final int tasks;
        final IntConsumer body;
        final AtomicInteger next = new AtomicInteger();
        final AtomicInteger finished = new AtomicInteger();
        volatile Throwable failure;

        Job(int tasks, IntConsumer body) {
            this.tasks = tasks;
            this.body = body;
        }

        void work() {
            int done = 0;
            try {
                for (int t; (t = next.getAndIncrement()) < tasks; ) {
                    try {
                        body.accept(t);
                    } catch (Throwable e) {
                        fail(e);
                    }
                    done++;
                }
            } finally {   // counted whatever happens, or awaitFinished would wait forever
                if (done > 0) {
                    finished.addAndGet(done);
                }
            }
        }

        private synchronized void fail(Throwable e) {
            if (failure == null) {
                failure = e;
            } else if (e != failure) {   // one exception object thrown by two tasks (a shared instance)
                failure.addSuppressed(e);
            }
        }

        void awaitFinished() {
            for (int spins = 0; finished.get() < tasks; spins++) {
                if (spins < 1 << 16) {
                    Thread.onSpinWait();
                } else {
                    // A worker holding a task was descheduled: let it have the core.
                    Thread.yield();
                }
            }
        }

        void rethrow() {
            Parallel.rethrow(failure);
        }
    }

    private final class Worker extends Thread {
        volatile boolean parked;

        Worker(int index) {
            super("kvant-parallel-" + index);
            setDaemon(true);
        }

        Parallel pool() {
            return Parallel.this;
        }

        @Override
        public void run() {
            Job last = null;
            while (true) {
                Job job = awaitJob(last);
                if (job == SHUTDOWN) {
                    return;
                }
                job.work();
                last = job;
            }
        }

        private Job awaitJob(Job last) {
            long spinUntil = System.nanoTime() + SPIN_NANOS;
            for (int spins = 0; ; spins++) {
                Job job = current;
                if (job != last) {
                    return job;
                }
                if ((spins & 255) != 255 || System.nanoTime() < spinUntil) {
                    Thread.onSpinWait();
                    continue;
                }
                // Publish "parked" before re-reading current; forEach writes current before reading parked,
                // so one of the two sees the other and no wake-up is lost.
                parked = true;
                while ((job = current) == last) {
                    LockSupport.park(this);
                }
                parked = false;
                return job;
            }
        }
    }
}
