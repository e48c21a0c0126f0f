package dev.kvant.engine;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.Draws;
import dev.kvant.backend.PendingDecode;
import dev.kvant.backend.SequencePool;
import dev.kvant.sample.Sampler;

import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.ForkJoinTask;
import java.util.concurrent.RecursiveAction;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.IntPredicate;
import java.util.stream.IntStream;

/**
 * Continuous batching over one backend and one shared KV pool: up to {@code parallel} sequences run at once, and each
 * engine step decodes one token for every sequence past its prompt (one {@link Backend#startDecode}, the weights read
 * once for all) and computes one chunk of at most {@code prefillChunk} prompt tokens for one sequence still reading
 * its prompt, taking turns between them. So a long prompt is read a chunk per step while the others go on decoding,
 * and a short prompt that arrives behind it waits for at most one of its chunks. New requests join between steps.
 *
 * <p><b>Pipeline.</b> On a backend that keeps several decode steps in flight ({@link Backend#pipelineDepth}: a
 * layer split over several GPUs), the decoding sequences are dealt into that many cohorts of even size, and each
 * cohort's step is started ({@link Backend#startDecode}) as soon as its previous one is collected, while the others'
 * are still running: the first GPU computes one cohort's next step while the second finishes another's. A sequence
 * makes the same tokens either way (a backend's rows do not depend on their batch).
 *
 * <p><b>Pages.</b> A request is admitted only when the pool can hold it to the end: the pages it may still take
 * (prompt plus maxTokens, capped by the context, minus the whole pages a cached prefix lends it) must not exceed the
 * free pages less what the running sequences may still take. Cached prefixes are evicted, least recently used first,
 * to make room. A running sequence therefore never runs out of pages, and a request that does not fit waits in the
 * queue (first come, first served) until running ones end.
 *
 * <p><b>Prefix reuse.</b> A finished (or cancelled) request's sequence is kept in a {@link PrefixCache} with the tokens
 * it holds; a request whose prompt starts with the same tokens forks it (whole pages shared, the boundary page copied)
 * and computes only the rest. When a prompt has been read, its whole pages are also kept, at no cost in pages, so
 * requests running at the same time share a system prompt. A reused prefix keeps a request's output what it would be
 * computed afresh. Where any prefix of a sequence gives a fresh computation's bits ({@link SequencePool#forksKeepBits}
 * and no page selection: the CPU backend), any prefix is reused. Elsewhere only whole prompt chunks are ({@link
 * #prefixReuseStep}): a prompt is read in chunks of {@code prefillChunk} tokens from its first position, and a chunk's
 * rows depend only on its tokens and the rows before it, so the rows of a prompt's whole chunks are the rows any prompt
 * starting with those chunks gets — where a row's bits also depend on how it was computed (on the GPU a prompt chunk's
 * rows come from GEMMs chosen by the chunk's length, a decode step's from the matrix-vector products), on the write
 * that opened its page (keys centered on their page's mean, {@code +mean}) or on its block of queries (page
 * selection). So a kept sequence gives back the rows past its prompt's last whole chunk (its last, shorter chunk and
 * what decode steps wrote) before it is cached, and a match is cut to whole chunks; the rest of the prompt is then read
 * in the chunks a fresh computation reads. {@link EngineConfig#approximatePrefixes} reuses any prefix in all cases, at
 * the price of outputs that depend on the cache.
 *
 * <p><b>Threads.</b> One engine thread runs every step and owns every sequence; {@link #submit} and {@link
 * Generation#cancel} may be called from any thread. A failing step fails the requests it ran, not the engine.
 *
 * <p><b>Draws.</b> Where the backend draws where it runs ({@link Backend#drawsWhereItRuns}: the GPU), a sequence
 * sampled at a temperature is drawn there (from its sampler's candidates — top-k up to {@link Draws#MAX_TOP_K}, top-p
 * with it, min-p, repetition penalties over a window of up to {@link Draws#MAX_PENALIZED} tokens — by Gumbel-max from
 * a key of its seeded sampler: {@link Draws}), and so is a greedy one with a few banned tokens ({@code ignore_eos}) or
 * a penalty; one id a sequence comes back. The others (top-p without top-k, a larger top-k, a longer penalty window,
 * a temperature below {@link Sampler#LEAST_DRAWN_TEMPERATURE}, more than {@link Draws#MAX_BANNED} banned tokens) draw
 * on the host from the step's copied logits, side by side on a few draw threads, each sequence's
 * by one of them with its own sampler, so the same tokens come whatever the threads; the engine thread then delivers
 * them in order. A sequence's tokens are chosen the same way whatever shares its step.
 */
public final class Engine implements AutoCloseable {

    /** How long an idle engine thread sleeps between looks at the clock (the inbox wakes it at once). */
    private static final long IDLE_POLL_MILLIS = 500;
    /** How often an engine with nothing running looks again whether the queue's head can start. */
    private static final long STALLED_POLL_MILLIS = 20;
    /** The prefix cache's bound on entries, apart from pages. */
    private static final int MAX_PREFIX_ENTRIES = 256;

    private final Backend backend;
    private final SequencePool pool;
    private final EngineConfig config;
    private final int vocab;
    private final int pageTokens;
    private final PrefixCache cache = new PrefixCache(MAX_PREFIX_ENTRIES);
    /** Prefixes are kept and reused (asked for). */
    private final boolean reusePrefixes;
    /** Any prefix of a sequence may be reused, its decode steps' rows too (else whole prompt chunks only). */
    private final boolean anyPrefix;
    /** The granularity of reuse: 1 (any prefix) or the prefill chunk (whole prompt chunks; see the class comment). */
    private final int reuseStep;
    private final LinkedBlockingQueue<Object> inbox = new LinkedBlockingQueue<>();
    private final ArrayDeque<Pending> waiting = new ArrayDeque<>();
    private final List<Active> running = new ArrayList<>();
    private final AtomicInteger inFlight = new AtomicInteger();
    /**
     * Generations in flight that their caller cancelled and the engine has not yet let go of (it does at its next
     * step): they no longer count against the queue limit, so a client that ends a request on a stop string and sends
     * the next one at once is not refused for the place the first still holds.
     */
    private final AtomicInteger cancelledInFlight = new AtomicInteger();
    private final AtomicLong ids = new AtomicLong();
    private final Thread thread;
    /** Decode steps in flight at once, one per cohort. */
    private final Cohort[] cohorts;
    /** The threads that draw a step's host-sampled tokens side by side (null with one sequence at a time). */
    private final ForkJoinPool drawThreads;
    /** A draw thread's copy of the row it samples from (the sampler may change it). */
    private final ThreadLocal<float[]> drawRow;
    private final float[] prefillLogits;
    private final float[] row;
    private volatile boolean stopping;
    /** Set by the engine thread before its very last look at the inbox ({@link #submit}). */
    private volatile boolean finished;
    /** Why the engine thread stopped, when an error ended it rather than a shutdown; null otherwise. */
    private volatile Throwable died;
    private volatile long deadlineNanos;
    private volatile int runningCount;
    private int prefillTurn;

    private volatile long promptTokens;
    private volatile long cachedTokens;
    private volatile long generatedTokens;
    private volatile long prefixHits;
    private volatile long prefixMisses;
    /** Nothing runs and the queue's head could not start (engine thread only). */
    private boolean stalled;
    private volatile long steps;
    private volatile long decodeSteps;
    private volatile long decodeRows;

    /** A request waiting for a slot. */
    private record Pending(Generation handle, GenerationRequest request, Consumer<GenerationEvent> listener) {
    }

    /** A request holding a sequence. */
    private final class Active {
        final Pending p;
        final BackendSequence seq;
        final Sampler sampler;
        /** The ids the request bans (their logits set to -inf before each draw), or null where it bans none. */
        final int[] banned;
        final int cached;
        /** Prompt tokens in the cache so far. */
        int fed;
        int[] generated = new int[16];
        int generatedCount;
        /** The last generated token, to be fed in the next decode step. */
        int next;
        boolean decoding;
        /** In a decode step that has been started and not yet collected: nothing else may touch the sequence. */
        boolean stepping;
        boolean done;

        Active(Pending p, BackendSequence seq, int cached) {
            this.p = p;
            this.seq = seq;
            this.cached = cached;
            this.fed = cached;
            this.sampler = new Sampler(p.request.sampling());
            for (int t : p.request.prompt()) {
                sampler.accept(t);
            }
            IntPredicate ban = p.request.bannedToken();
            int[] ids = ban == null ? null : IntStream.range(0, vocab).filter(ban).toArray();
            this.banned = ids == null || ids.length == 0 ? null : ids;   // (a ban of nothing is no ban: greedy stays so)
        }

        int[] prompt() {
            return p.request.prompt();
        }

        void addGenerated(int t) {
            if (generatedCount == generated.length) {
                generated = Arrays.copyOf(generated, generated.length * 2);
            }
            generated[generatedCount++] = t;
        }

        /** The tokens the sequence holds, in order. */
        int[] heldTokens() {
            int n = seq.length();
            int[] prompt = prompt();
            int[] out = Arrays.copyOf(prompt, n);
            if (n > prompt.length) {
                System.arraycopy(generated, 0, out, prompt.length, n - prompt.length);
            }
            return out;
        }

        /** Pages the sequence may still take from the pool before it ends. */
        int outstandingPages() {
            return pages(maxLength(p.request)) - pages(seq.length());
        }
    }

    /** Sequences whose decode step was started together and is collected together. */
    private final class Cohort {
        final Active[] members;
        final float[] logits;
        /** Member i takes the id the step chose (greedy, or drawn where the model runs); else it draws on the host. */
        final boolean[] byId;
        int size;
        PendingDecode step;

        Cohort(int capacity) {
            this.members = new Active[capacity];
            this.logits = new float[capacity * vocab];
            this.byId = new boolean[capacity];
        }
    }

    /**
     * @param pool a pool of this backend with room for at least one context; the engine draws every sequence from it
     *             and closes none of it but the sequences; the caller closes pool and backend after the engine
     */
    public Engine(Backend backend, SequencePool pool, EngineConfig config) {
        this.backend = Objects.requireNonNull(backend, "backend");
        this.pool = Objects.requireNonNull(pool, "pool");
        this.config = Objects.requireNonNull(config, "config");
        this.vocab = backend.model().config().vocabSize();
        this.pageTokens = pool.pageTokens();
        // a model that selects KV pages per block of queries writes other rows after a prefix of any length (its decode
        // steps select per token, and the rest of a prompt's query blocks start elsewhere): whole chunks only
        this.reusePrefixes = config.prefixCache();
        this.anyPrefix = config.approximatePrefixes() || anyPrefixKeepsBits();
        this.reuseStep = anyPrefix ? 1 : config.prefillChunk();
        if (pool.totalPages() < pages(config.contextLength())) {
            throw new IllegalArgumentException("the KV pool holds " + (long) pool.totalPages() * pageTokens
                    + " tokens, less than one context of " + config.contextLength() + " (raise the KV memory or lower -c)");
        }
        int backendDepth = Math.max(1, backend.pipelineDepth());
        int depth = Math.min(config.parallel(),
                config.pipeline() > 0 ? Math.min(config.pipeline(), backendDepth) : backendDepth);
        this.cohorts = new Cohort[depth];
        for (int i = 0; i < depth; i++) {
            cohorts[i] = new Cohort((config.parallel() + depth - 1) / depth);
        }
        this.prefillLogits = new float[vocab];
        this.row = new float[vocab];
        int threads = Math.min(config.parallel(), Runtime.getRuntime().availableProcessors());
        this.drawThreads = threads > 1 ? new ForkJoinPool(threads) : null;
        this.drawRow = ThreadLocal.withInitial(() -> new float[vocab]);
        this.thread = Thread.ofPlatform().name("kvant-engine").daemon(true).unstarted(this::run);
        thread.start();
    }

    /** Decode steps of different sequences this engine keeps in flight (1: one step at a time). */
    public int pipelineDepth() {
        return cohorts.length;
    }

    public EngineConfig config() {
        return config;
    }

    public Backend backend() {
        return backend;
    }

    /**
     * Queues a request; events about it go to listener on the engine's thread.
     *
     * @throws ContextFullException        when the prompt does not fit the context (says both lengths)
     * @throws IllegalArgumentException    for a token outside the vocabulary
     * @throws EngineBusyException         when the queue is full or the engine is shutting down
     */
    public Generation submit(GenerationRequest request, Consumer<GenerationEvent> listener) {
        Objects.requireNonNull(listener, "listener");
        // the engine's own copy: the caller keeps the request's prompt array (prompt()) and could change it after
        // the checks below, under a cached prefix's rows
        request = request.copy();
        int[] prompt = request.prompt();
        if (prompt.length >= config.contextLength()) {
            throw new ContextFullException("the prompt has " + prompt.length + " tokens but the context holds "
                    + config.contextLength() + " (prompt and generated tokens together)");
        }
        for (int t : prompt) {
            if (t < 0 || t >= vocab) {
                throw new IllegalArgumentException("token id " + t + " is outside the vocabulary (0.." + (vocab - 1) + ")");
            }
        }
        Throwable d = died;
        if (stopping || d != null) {
            throw new EngineBusyException(d != null ? "the engine stopped on an internal error: " + d
                    : "the server is shutting down", true);
        }
        int limit = config.parallel() + config.maxQueue();
        while (true) {
            int n = inFlight.get();
            if (n - cancelledInFlight.get() >= limit) {
                throw new EngineBusyException("all " + config.parallel() + " slots are busy and " + config.maxQueue()
                        + " requests are queued; retry later", false);
            }
            if (inFlight.compareAndSet(n, n + 1)) {
                break;
            }
        }
        Generation g = new Generation(ids.incrementAndGet(), cancelledInFlight::incrementAndGet);
        Pending pending = new Pending(g, request, listener);
        inbox.add(pending);
        // The engine thread's last look at the inbox may have come before this add: then nothing would ever answer
        // the request. Taken back here, it is refused; else the engine took it (that look follows finished).
        if (finished && inbox.remove(pending)) {
            leave(g);
            throw new EngineBusyException("the server is shutting down", true);
        }
        return g;
    }

    /** The state and counters now. */
    public EngineStats stats() {
        int inflight = inFlight.get();
        int run = runningCount;
        return new EngineStats(Math.max(0, inflight - run), run, pool.totalPages(), pool.freePages(), cache.size(),
                promptTokens, cachedTokens, generatedTokens, prefixHits, prefixMisses, steps, decodeSteps, decodeRows);
    }

    /** Whether finished sequences are kept for prefix reuse. */
    public boolean reusesPrefixes() {
        return reusePrefixes;
    }

    /** Whether a reused prefix keeps a fresh computation's bits (false only with approximate prefixes, where not). */
    public boolean prefixesKeepBits() {
        return !config.approximatePrefixes() || anyPrefixKeepsBits();
    }

    /**
     * The tokens a reused prefix is a multiple of: 1 where any prefix keeps a fresh computation's bits (or approximate
     * prefixes are asked for), else the prefill chunk (see the class comment).
     */
    public int prefixReuseStep() {
        return reuseStep;
    }

    private boolean anyPrefixKeepsBits() {
        return pool.forksKeepBits() && backend.model().selection() == null;
    }

    /**
     * Of a sequence's first tokens, how many a fork may take: all, or those of the prompt's whole chunks (never rows a
     * decode step wrote, even with chunks of one token).
     */
    private int reusable(Active a) {
        return anyPrefix ? a.seq.length() : Math.min(a.fed, a.seq.length()) / reuseStep * reuseStep;
    }

    /** Closes every cached prefix (on the engine's thread) and returns when done; pages of running requests stay. */
    public void clearPrefixCache() {
        if (Thread.currentThread() == thread) {   // a listener: the engine's thread itself
            cache.clear();
            return;
        }
        if (finished) {   // the engine thread cleared the cache as it ended, and reads no more commands
            return;
        }
        CompletableFuture<Void> done = new CompletableFuture<>();
        inbox.add((Runnable) () -> {
            cache.clear();
            done.complete(null);
        });
        try {
            // an engine that ends meanwhile answers nothing more from its inbox, but clears the cache as it ends
            while (!done.isDone() && !finished) {
                try {
                    done.get(100, TimeUnit.MILLISECONDS);
                } catch (TimeoutException e) {
                    // look at finished again
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (ExecutionException e) {
            throw new IllegalStateException("the engine did not clear its prefix cache", e);
        }
    }

    /**
     * Stops taking requests; those accepted go on until they end or the grace period is over, when the rest fail
     * with "the server is shutting down". Returns whether the engine thread ended within grace (plus a second).
     */
    public boolean shutdown(Duration grace) {
        deadlineNanos = System.nanoTime() + Math.max(0, grace.toNanos());
        stopping = true;
        inbox.add(Boolean.TRUE);
        try {
            thread.join(grace.plusSeconds(1));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return !thread.isAlive();
    }

    public boolean isShuttingDown() {
        return stopping;
    }

    /**
     * What stopped the engine thread when an error did (out of memory, say) rather than {@link #shutdown}: it then
     * refuses every request, so a server should report itself failed and exit. Null while it runs or after a
     * shutdown.
     */
    public Throwable failure() {
        return died;
    }

    /**
     * Shuts down at once and waits for the engine thread to end, however long its step in progress takes: the
     * caller closes the model next, and a step still reading weights from an unmapped file would crash the JVM.
     */
    @Override
    public void close() {
        shutdown(Duration.ZERO);
        boolean interrupted = false;
        while (thread.isAlive()) {
            try {
                thread.join();
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }

    // ---- the engine thread ----

    private void run() {
        try {
            while (true) {
                boolean idle = running.isEmpty();
                receive(idle);
                if (stopping && System.nanoTime() - deadlineNanos >= 0) {
                    failAll("the server is shutting down");
                    break;
                }
                dropCancelled();
                admit();
                if (running.isEmpty()) {
                    if (stopping && waiting.isEmpty()) {
                        break;
                    }
                    // the queue's head waits for pages that others hold (a sequence of the pool outside the
                    // engine): look again after a while, not at once
                    stalled = !waiting.isEmpty();
                    continue;
                }
                stalled = false;
                step();
            }
        } catch (Throwable t) {
            died = t;
            failAll("the engine stopped on an internal error: " + t, false);
            throw t;
        } finally {
            stopping = true;
            try {
                cache.clear();
            } catch (RuntimeException | Error e) {   // the requests still waiting must be answered regardless
                Throwable d = died;
                if (d != null && d != e) {
                    d.addSuppressed(e);
                }
            }
            // the last look at the inbox comes after finished: a request added before it is failed here, one added
            // after it is taken back by submit, which sees finished
            finished = true;
            receive(false);
            failAll("the server is shutting down");
            if (drawThreads != null) {
                drawThreads.shutdownNow();
            }
        }
    }

    /** Moves new requests from the inbox to the queue and runs commands; waits for one when idle. */
    private void receive(boolean idle) {
        try {
            Object first = null;
            if (idle && (waiting.isEmpty() || stalled)) {
                long wait = waiting.isEmpty() ? IDLE_POLL_MILLIS : STALLED_POLL_MILLIS;
                if (stopping) {
                    wait = Math.max(0, Math.min(wait, TimeUnit.NANOSECONDS.toMillis(deadlineNanos - System.nanoTime())));
                }
                first = inbox.poll(wait, TimeUnit.MILLISECONDS);
            }
            for (Object m = first != null ? first : inbox.poll(); m != null; m = inbox.poll()) {
                switch (m) {
                    case Pending p -> waiting.addLast(p);
                    case Runnable r -> r.run();
                    default -> { } // a wake-up
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stopping = true;
        }
    }

    /** A generation the engine is done with leaves the count of those in flight (and of the cancelled ones). */
    private void leave(Generation g) {
        // the cancelled count first: a submit reading between the two sees one request too many (refused, at worst,
        // a moment early), never one too few (the other order let a submit past the limit)
        if (g.settle()) {
            cancelledInFlight.decrementAndGet();
        }
        inFlight.decrementAndGet();
    }

    private void dropCancelled() {
        waiting.removeIf(p -> {
            if (p.handle.isCancelled()) {
                deliver(p, new GenerationEvent.Finished(FinishReason.CANCELLED, p.request.prompt().length, 0, 0));
                leave(p.handle);
                return true;
            }
            return false;
        });
        for (Active a : running) {
            if (a.p.handle.isCancelled() && !a.stepping) {
                finish(a, FinishReason.CANCELLED);
            }
        }
        removeDone();
    }

    private void admit() {
        while (running.size() < config.parallel() && !waiting.isEmpty()) {
            if (!start(waiting.peekFirst())) {
                return;
            }
            waiting.removeFirst();
        }
    }

    /** Gives the request a sequence if the pool can hold it to its end; false when it must wait. */
    private boolean start(Pending p) {
        int[] prompt = p.request.prompt();
        PrefixCache.Match m = reusePrefixes ? cache.match(prompt, reuseStep) : new PrefixCache.Match(null, 0);
        int maxPages = pages(maxLength(p.request));
        // Evicting is only worth it where it can make room: while requests run, an eviction that cannot free enough
        // (the pages the other entries hold alone are too few: a running sequence's kept prompt pages free nothing)
        // waits for them instead, and the request's own match is kept for when they are done; with none running,
        // every page not free is the cache's.
        while (available() < maxPages - m.tokens() / pageTokens) {
            int shortBy = maxPages - m.tokens() / pageTokens - available();
            boolean hopeless = !running.isEmpty() && cache.pagesExcept(m.entry(), pool) < shortBy;
            if (hopeless || !cache.evictLeastRecent(m.entry())) {
                if (m.entry() == null || !running.isEmpty()) {
                    return false;
                }
                cache.remove(m.entry());
                m = new PrefixCache.Match(null, 0);
            }
        }
        BackendSequence seq;
        try {
            seq = m.entry() != null ? pool.fork(m.entry().seq, m.tokens(), config.contextLength())
                    : pool.newSequence(config.contextLength());
        } catch (VirtualMachineError e) {   // out of memory and the like: the engine's own state is in doubt
            throw e;
        } catch (RuntimeException | Error e) {   // an assertion or a linkage error: this step's requests fail
            deliver(p, new GenerationEvent.Failed("could not start the sequence: " + e.getMessage(), false));
            leave(p.handle);
            return true;
        }
        Active a;
        try {
            a = new Active(p, seq, m.tokens());   // runs the request's own ban predicate over the vocabulary
        } catch (VirtualMachineError e) {
            throw e;
        } catch (RuntimeException | Error e) {   // the request's code failed: it alone fails, its pages go back
            seq.close();
            deliver(p, new GenerationEvent.Failed("the request's banned-token predicate failed: " + e, false));
            leave(p.handle);
            return true;
        }
        running.add(a);
        runningCount = running.size();
        promptTokens += prompt.length;
        cachedTokens += m.tokens();
        if (m.entry() != null) {
            prefixHits++;
        } else {
            prefixMisses++;
        }
        deliver(p, new GenerationEvent.Started(prompt.length, m.tokens()));
        return true;
    }

    /** Free pages less those the running sequences may still take. */
    private int available() {
        int owed = 0;
        for (Active a : running) {
            owed += a.outstandingPages();
        }
        return pool.freePages() - owed;
    }

    private void step() {
        steps++;
        long rows = decodeRows;
        decodeStep();
        if (decodeRows > rows) {
            decodeSteps++;
        }
        prefillStep();
        removeDone();
    }

    /**
     * Collects each cohort's step and starts its next one with the decoding sequences not in flight (an even share
     * of them); with one cohort the step is started and collected at once.
     */
    private void decodeStep() {
        int decoding = 0;
        for (Active a : running) {
            if (a.decoding && !a.done) {
                decoding++;
            }
        }
        int share = (decoding + cohorts.length - 1) / cohorts.length;
        for (Cohort c : cohorts) {
            collect(c);
            start(c, share);
        }
        if (cohorts.length == 1) {
            collect(cohorts[0]);
        }
    }

    /**
     * Starts the cohort's step over up to share decoding sequences that are not in flight. Each sequence's token is
     * chosen the same way whatever the batch: greedy ones (no banned token) take the step's largest logit; on a
     * backend that draws where it runs, those it can draw are drawn there, from their samplers' keys, and greedy ones
     * with a few banned tokens take the largest other logit there; every other one draws on the host from its row of
     * the logits, which the step then copies out.
     */
    private void start(Cohort c, int share) {
        int n = 0;
        boolean drawsThere = backend.drawsWhereItRuns();
        boolean anyDrawn = false;
        boolean anyHost = false;
        for (Active a : running) {
            if (n < share && n < c.members.length && a.decoding && !a.done && !a.stepping) {
                boolean greedy = a.sampler.argmaxSuffices() && a.banned == null;
                boolean fewBanned = a.banned == null || a.banned.length <= Draws.MAX_BANNED;
                boolean drawn = drawsThere && fewBanned && !greedy
                        && (a.sampler.drawsWhereTheModelRuns(vocab) || a.sampler.argmaxSuffices());
                c.byId[n] = greedy || drawn;
                c.members[n++] = a;
                anyDrawn |= drawn;
                anyHost |= !greedy && !drawn;
            }
        }
        if (n == 0) {
            return;
        }
        if (anyHost && !drawsThere) {
            Arrays.fill(c.byId, 0, n, false);   // this backend's step gives ids only where it copies no logits
        }
        BackendSequence[] seqs = new BackendSequence[n];
        int[] tokens = new int[n];
        for (int i = 0; i < n; i++) {
            seqs[i] = c.members[i].seq;
            tokens[i] = c.members[i].next;
        }
        Draws draws = null;
        if (drawsThere && (anyDrawn || anyHost)) {   // the ids of greedy and drawn sequences, logits or not
            float[] temperature = new float[n];
            long[] keys = new long[n];
            int[][] banned = new int[n][];
            int[] topK = new int[n];
            float[] topP = new float[n];
            float[] minP = new float[n];
            Draws.Penalty[] penalty = new Draws.Penalty[n];
            for (int i = 0; i < n; i++) {
                Sampler s = c.members[i].sampler;
                topP[i] = 1f;
                if (c.byId[i] && s.drawsWhereTheModelRuns(vocab)) {
                    Draws d = s.nextDraw(vocab);
                    temperature[i] = d.temperature()[0];
                    keys[i] = d.key()[0];
                    topK[i] = d.topK()[0];
                    topP[i] = d.topP()[0];
                    minP[i] = d.minP()[0];
                    penalty[i] = d.penalty()[0];
                }
                banned[i] = c.byId[i] ? c.members[i].banned : null;
            }
            draws = new Draws(temperature, keys, banned, topK, topP, minP, penalty);
        }
        float[] logits = anyHost ? c.logits : null;
        try {
            c.step = draws != null ? backend.startDecodeDrawn(seqs, tokens, draws, logits)
                    : backend.startDecode(seqs, tokens, logits);
        } catch (VirtualMachineError e) {   // out of memory and the like: the engine's own state is in doubt
            throw e;
        } catch (RuntimeException | Error e) {   // an assertion or a linkage error too
            // a refused start changed nothing: each sequence alone, so that only the one at fault fails (alone it
            // gets the bits it gets in a batch, and its token is chosen as in the batch, from the same key)
            for (int i = 0; i < n; i++) {
                Active a = c.members[i];
                c.members[i] = null;
                if (n == 1) {
                    fail(a, "the decode step failed: " + e.getMessage());
                } else {
                    stepAlone(a, c.byId[i], draws == null ? null : draws.one(i), c.logits);
                }
            }
            return;
        }
        c.size = n;
        for (int i = 0; i < n; i++) {
            c.members[i].stepping = true;
        }
    }

    /**
     * One decode step of a alone, started and collected at once, its token chosen as in its batch: byId, the step's
     * (greedy, or drawn as draw says, from the batch's key); else drawn on the host. A failure fails a alone.
     */
    private void stepAlone(Active a, boolean byId, Draws draw, float[] scratch) {
        float[] logits = byId ? null : scratch;
        int[] ids;
        try {
            BackendSequence[] one = {a.seq};
            int[] token = {a.next};
            ids = (draw != null && byId ? backend.startDecodeDrawn(one, token, draw, null)
                    : backend.startDecode(one, token, logits)).await();
        } catch (VirtualMachineError e) {
            throw e;
        } catch (RuntimeException | Error e) {
            fail(a, "the decode step failed: " + e.getMessage());
            return;
        }
        decodeRows++;
        if (a.p.handle.isCancelled()) {
            finish(a, FinishReason.CANCELLED);
        } else if (logits == null) {
            take(a, ids[0]);
        } else {
            sampleNext(a, logits, 0);
        }
    }

    /** Waits for the cohort's step, if one is in flight, and hands each sequence its next token. */
    private void collect(Cohort c) {
        if (c.step == null) {
            return;
        }
        PendingDecode step = c.step;
        c.step = null;
        for (int i = 0; i < c.size; i++) {
            c.members[i].stepping = false;
        }
        int[] ids;
        try {
            ids = step.await();
        } catch (VirtualMachineError e) {   // out of memory and the like: the engine's own state is in doubt
            throw e;
        } catch (RuntimeException | Error e) {   // an assertion or a linkage error: this step's requests fail
            for (int i = 0; i < c.size; i++) {
                fail(c.members[i], "the decode step failed: " + e.getMessage());
            }
            return;
        }
        decodeRows += c.size;
        int[] drawn = null;
        Throwable[] failed = null;
        int onHost = 0;
        for (int i = 0; i < c.size; i++) {
            onHost += c.byId[i] ? 0 : 1;
        }
        if (onHost > 1 && drawThreads != null) {
            drawn = new int[c.size];
            failed = new Throwable[c.size];
            drawSideBySide(c, drawn, failed);
        }
        for (int i = 0; i < c.size; i++) {
            Active a = c.members[i];
            c.members[i] = null;
            if (a.p.handle.isCancelled()) {
                finish(a, FinishReason.CANCELLED);
            } else if (c.byId[i]) {
                take(a, ids[i]);
            } else if (drawn == null) {
                sampleNext(a, c.logits, i * vocab);
            } else if (failed[i] instanceof VirtualMachineError e) {
                throw e;
            } else if (failed[i] != null) {
                fail(a, "sampling failed: " + failed[i].getMessage());
            } else {
                take(a, drawn[i]);
            }
        }
    }

    /**
     * The tokens of the cohort's members drawn on the host (not cancelled), from their rows of its logits on the draw
     * threads, each by its own sampler: drawn[i], or what the draw threw in failed[i].
     */
    private void drawSideBySide(Cohort c, int[] drawn, Throwable[] failed) {
        List<RecursiveAction> tasks = new ArrayList<>(c.size);
        for (int i = 0; i < c.size; i++) {
            Active a = c.members[i];
            if (c.byId[i] || a.p.handle.isCancelled()) {
                continue;
            }
            int m = i;
            tasks.add(new RecursiveAction() {
                @Override
                protected void compute() {
                    try {
                        drawn[m] = draw(a, c.logits, m * vocab, drawRow.get());
                    } catch (Throwable e) {   // handed to the engine thread, which fails the request or itself
                        failed[m] = e;
                    }
                }
            });
        }
        drawThreads.invoke(new RecursiveAction() {
            @Override
            protected void compute() {
                ForkJoinTask.invokeAll(tasks);
            }
        });
    }

    /** Waits for every step in flight, their results dropped (the engine is failing what it runs). */
    private void drain() {
        for (Cohort c : cohorts) {
            if (c.step != null) {
                PendingDecode step = c.step;
                c.step = null;   // awaited once, whatever it throws
                try {
                    step.await();
                } catch (VirtualMachineError e) {
                    throw e;
                } catch (RuntimeException | Error e) {
                    // the sequences fail anyway
                }
                for (int i = 0; i < c.size; i++) {
                    c.members[i].stepping = false;
                    c.members[i] = null;
                }
            }
        }
    }

    /** One chunk of the next sequence (in turn) still reading its prompt. */
    private void prefillStep() {
        int count = running.size();
        Active a = null;
        for (int k = 0; k < count; k++) {
            Active c = running.get((prefillTurn + k) % count);
            if (!c.decoding && !c.done) {
                a = c;
                prefillTurn = (prefillTurn + k + 1) % count;
                break;
            }
        }
        if (a == null) {
            return;
        }
        int[] prompt = a.prompt();
        int n = Math.min(config.prefillChunk(), prompt.length - a.fed);
        try {
            a.seq.forward(prompt, a.fed, n, false, prefillLogits);
        } catch (VirtualMachineError e) {   // out of memory and the like: the engine's own state is in doubt
            throw e;
        } catch (RuntimeException | Error e) {   // an assertion or a linkage error: this step's requests fail
            fail(a, "reading the prompt failed: " + e.getMessage());
            return;
        }
        a.fed += n;
        if (a.fed == prompt.length) {
            keepPromptPages(a);
            sampleNext(a, prefillLogits, 0);
        }
    }

    /**
     * Lends the prompt's whole pages to the prefix cache (a fork at a page boundary copies nothing); where only whole
     * chunks are reused, the whole pages within its whole chunks (a match is cut to whole chunks anyway; cut to them
     * here, where a chunk does not divide a page, the fork would end inside a page and copy it: a page no request was
     * admitted with).
     */
    private void keepPromptPages(Active a) {
        int whole = reusable(a) / pageTokens * pageTokens;
        if (!reusePrefixes || whole < PrefixCache.MIN_MATCH || whole <= a.cached) {
            return;
        }
        try {
            cache.insert(Arrays.copyOf(a.prompt(), whole), pool.fork(a.seq, whole, whole));
        } catch (RuntimeException e) {
            // Sharing is an optimisation: a prompt that cannot be kept is simply not reused.
        }
    }

    private void sampleNext(Active a, float[] logits, int off) {
        int t;
        try {
            t = draw(a, logits, off, row);
        } catch (VirtualMachineError e) {   // out of memory and the like: the engine's own state is in doubt
            throw e;
        } catch (RuntimeException | Error e) {   // an assertion or a linkage error: this step's requests fail
            fail(a, "sampling failed: " + e.getMessage());
            return;
        }
        take(a, t);
    }

    /** The token a's sampler draws from logits[off..off+vocab), its banned tokens left out; row: scratch. */
    private int draw(Active a, float[] logits, int off, float[] row) {
        System.arraycopy(logits, off, row, 0, vocab);
        if (a.banned != null) {
            for (int b : a.banned) {
                row[b] = Float.NEGATIVE_INFINITY;
            }
        }
        return a.sampler.sample(row, vocab);
    }

    /** The sequence's next token is t: stop, or deliver it and go on. */
    private void take(Active a, int t) {
        boolean stop;
        try {
            stop = a.p.request.stopsAt(t);
        } catch (VirtualMachineError e) {
            throw e;
        } catch (RuntimeException | Error e) {   // the request's own predicate: it alone fails
            fail(a, "the request's stop predicate failed: " + e);
            return;
        }
        if (stop) {
            finish(a, FinishReason.STOP);
            return;
        }
        a.addGenerated(t);
        a.sampler.accept(t);
        generatedTokens++;
        deliver(a.p, new GenerationEvent.Token(t));
        if (a.generatedCount >= a.p.request.maxTokens()) {
            finish(a, FinishReason.LENGTH);
        } else if (a.seq.length() >= config.contextLength()) {
            finish(a, FinishReason.CONTEXT);
        } else {
            a.next = t;
            a.decoding = true;
        }
    }

    private void finish(Active a, FinishReason reason) {
        if (a.done) {
            return;
        }
        a.done = true;
        // Pages first, so that a caller who sees the end sees the pages back too.
        release(a, true);
        deliver(a.p, new GenerationEvent.Finished(reason, a.prompt().length, a.cached, a.generatedCount));
    }

    private void fail(Active a, String message) {
        if (a.done) {
            return;
        }
        a.done = true;
        release(a, false);
        deliver(a.p, new GenerationEvent.Failed(message, false));
    }

    /** Returns the sequence: to the prefix cache when its contents can be trusted, else to the pool. */
    private void release(Active a, boolean keep) {
        leave(a.p.handle);
        int reusable = reusable(a);
        if (keep && reusePrefixes && reusable >= PrefixCache.MIN_MATCH && !stopping) {
            try {
                if (reusable < a.seq.length()) {   // rows no fork may take: their pages go back now
                    a.seq.truncate(reusable);
                }
            } catch (RuntimeException e) {
                a.seq.close();
                return;
            }
            try {
                cache.insert(a.heldTokens(), a.seq);
                return;
            } catch (RuntimeException e) {
                // closed by insert
                return;
            }
        }
        a.seq.close();
    }

    private void removeDone() {
        running.removeIf(a -> a.done);
        runningCount = running.size();
    }

    /** Fails every request the engine holds; shuttingDown: as a shutdown does (503), else as an internal error (500). */
    private void failAll(String message) {
        failAll(message, true);
    }

    private void failAll(String message, boolean shuttingDown) {
        drain();
        for (Active a : running) {
            if (!a.done) {
                a.done = true;
                leave(a.p.handle);
                a.seq.close();
                deliver(a.p, new GenerationEvent.Failed(message, shuttingDown));
            }
        }
        running.clear();
        runningCount = 0;
        for (Pending p : waiting) {
            deliver(p, new GenerationEvent.Failed(message, shuttingDown));
            leave(p.handle);
        }
        waiting.clear();
        for (Object m = inbox.poll(); m != null; m = inbox.poll()) {
            if (m instanceof Pending p) {
                deliver(p, new GenerationEvent.Failed(message, shuttingDown));
                leave(p.handle);
            } else if (m instanceof Runnable r) {
                r.run();
            }
        }
    }

    /** Hands an event to the request's listener; a listener that throws cancels its own request, nothing else. */
    private void deliver(Pending p, GenerationEvent e) {
        try {
            p.listener.accept(e);
        } catch (VirtualMachineError ex) {   // out of memory and the like: the engine's own state is in doubt
            throw ex;
        } catch (RuntimeException | Error ex) {   // an assertion in a listener is that request's, not the engine's
            p.handle.cancel();
        }
    }

    /** The most tokens a request's sequence will hold: the prompt and all generated tokens but the last. */
    private int maxLength(GenerationRequest r) {
        return (int) Math.min((long) r.prompt().length + r.maxTokens() - 1, config.contextLength());
    }

    private int pages(int tokens) {
        return (int) (((long) tokens + pageTokens - 1) / pageTokens);
    }
}
