package dev.kvant.server;

import java.io.IOException;
import java.time.Duration;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;

/**
 * Cuts a response whose client stops reading: every write to the client (and its flush) must end within the limit,
 * else the thread writing is interrupted, which closes the connection's channel and fails the write, so the
 * handler cancels the generation as for a client that went away. A blocked socket write has no timeout of its own,
 * and Helidon's idle-connection check leaves a request in progress alone: without this, a client that stops reading
 * keeps its connection, its request thread and its undelivered events for as long as it stays connected.
 *
 * <p>One a response, made on the thread that writes it; {@link #close} when the response is done.
 */
final class WriteDeadline implements AutoCloseable {

    /** Something that writes to the client. */
    interface Write {
        void run() throws IOException;
    }

    private static final ScheduledExecutorService TIMER = timer();

    private static ScheduledExecutorService timer() {
        ScheduledThreadPoolExecutor t = new ScheduledThreadPoolExecutor(1, r -> {
            Thread th = new Thread(r, "kvant-write-deadline");
            th.setDaemon(true);
            return th;
        });
        t.setRemoveOnCancelPolicy(true);   // a finished response's check goes at once, not at its next run
        return t;
    }

    private final long limitNanos;
    private final Thread writer = Thread.currentThread();
    private final ScheduledFuture<?> check;
    /** The start (System.nanoTime) of the write in progress; NONE when none is. Guarded by this. */
    private long started = NONE;
    /** The writer was interrupted for a write past the limit. Guarded by this. */
    private boolean expired;
    private static final long NONE = Long.MIN_VALUE;

    WriteDeadline(Duration limit) {
        this.limitNanos = limit.toNanos();
        long period = Math.max(10, limit.toMillis() / 4);
        this.check = TIMER.scheduleAtFixedRate(this::check, period, period, TimeUnit.MILLISECONDS);
    }

    private synchronized void check() {
        if (started != NONE && !expired && System.nanoTime() - started > limitNanos) {
            expired = true;
            writer.interrupt();
        }
    }

    /**
     * Runs one write under the limit: a write the limit cut fails (IOException, the interrupt cleared); one that
     * returned just as the limit was reached was delivered, and the response goes on (the interrupt cleared too).
     */
    void run(Write w) throws IOException {
        synchronized (this) {
            started = System.nanoTime();
        }
        boolean done = false;
        try {
            w.run();
            done = true;
        } finally {
            boolean cut;
            synchronized (this) {
                started = NONE;
                cut = expired;
                expired = false;
            }
            if (cut) {
                Thread.interrupted();
                if (!done) {
                    throw timedOut();
                }
            }
        }
    }

    private IOException timedOut() {
        return new IOException("the client read nothing for " + limitNanos / 1_000_000 + " ms: response cut");
    }

    @Override
    public void close() {
        check.cancel(false);
        synchronized (this) {
            started = NONE;
            if (expired) {
                Thread.interrupted();
            }
        }
    }
}
