package dev.kvant.engine;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.CpuBackend;
import dev.kvant.backend.Draws;
import dev.kvant.backend.PendingDecode;
import dev.kvant.backend.SequencePool;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.sample.Sampler;
import dev.kvant.sample.SamplerConfig;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class EngineTest {

    private static final KvFormat F16 = KvFormat.parse("f16");
    private static final int CHUNK = 32;
    private static final int CTX = 256;
    private static Arena arena;
    private static Parallel threads;
    private static CpuBackend backend;
    private static final long SEED = new Random().nextLong();

    @BeforeAll
    static void model() {
        arena = Arena.ofShared();
        threads = new Parallel(2);
        LlamaModel model = LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, SEED, arena).file());
        backend = new CpuBackend(model, threads);
    }

    @AfterAll
    static void close() {
        threads.close();
        arena.close();
    }

    /** Collects one generation's events. */
    static final class Events {
        final LinkedBlockingQueue<GenerationEvent> queue = new LinkedBlockingQueue<>();
        final List<Integer> tokens = new ArrayList<>();
        GenerationEvent.Started started;

        GenerationEvent end() throws InterruptedException {
            while (true) {
                GenerationEvent e = queue.poll(60, TimeUnit.SECONDS);
                assertNotNull(e, "no event within 60 s (seed " + SEED + ")");
                switch (e) {
                    case GenerationEvent.Started s -> started = s;
                    case GenerationEvent.Token t -> tokens.add(t.id());
                    default -> {
                        return e;
                    }
                }
            }
        }

        int[] ids() {
            return tokens.stream().mapToInt(Integer::intValue).toArray();
        }
    }

    /** A conversation's next prompt: the parts one after another. */
    static int[] concat(int[]... parts) {
        return java.util.Arrays.stream(parts).flatMapToInt(java.util.Arrays::stream).toArray();
    }

    private static GenerationRequest greedy(int[] prompt, int maxTokens) {
        return new GenerationRequest(prompt, maxTokens, SamplerConfig.greedy(), null);
    }

    /** Greedy generation on a private sequence, prompt read in CHUNK-token pieces: what the engine must reproduce. */
    private static int[] alone(BackendSequence seq, int[] prompt, int from, int maxTokens) {
        int vocab = TinyModels.VOCAB;
        float[] logits = new float[vocab];
        for (int off = from; off < prompt.length; off += CHUNK) {
            seq.forward(prompt, off, Math.min(CHUNK, prompt.length - off), false, logits);
        }
        int[] out = new int[maxTokens];
        for (int i = 0; i < maxTokens; i++) {
            out[i] = Sampler.argmax(logits, vocab);
            if (i + 1 < maxTokens) {
                seq.forward(out, i, 1, false, logits);
            }
        }
        return out;
    }

    @Test
    void batchedRequestsGenerateWhatEachGeneratesAlone() throws Exception {
        Random r = new Random(SEED);
        int[][] prompts = {r.ints(5, 0, TinyModels.VOCAB).toArray(), r.ints(100, 0, TinyModels.VOCAB).toArray(),
                r.ints(47, 0, TinyModels.VOCAB).toArray()};
        // the first request decodes long enough that the others join it even when their submits come late (a loaded
        // machine: with 12 tokens it once finished alone before the second was in, and no step was batched)
        int[] lengths = {40, 9, 20};
        try (SequencePool pool = backend.newSequencePool(4 * CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(3, CTX, CHUNK, 8, false))) {
            Events[] ev = new Events[prompts.length];
            for (int i = 0; i < prompts.length; i++) {
                ev[i] = new Events();
                engine.submit(greedy(prompts[i], lengths[i]), ev[i].queue::add);
            }
            for (int i = 0; i < prompts.length; i++) {
                GenerationEvent end = ev[i].end();
                GenerationEvent.Finished f = assertInstanceOf(GenerationEvent.Finished.class, end);
                assertEquals(FinishReason.LENGTH, f.reason());
                assertEquals(lengths[i], f.generatedTokens());
                try (BackendSequence seq = pool.newSequence(CTX)) {
                    assertArrayEquals(alone(seq, prompts[i], 0, lengths[i]), ev[i].ids(),
                            "request " + i + " (seed " + SEED + ")");
                }
            }
            EngineStats s = engine.stats();
            assertTrue(s.decodeRows() > s.steps() - prompts.length * 4, "decode steps were batched: " + s);
            assertTrue(s.decodeRows() > s.decodeSteps() && s.decodeSteps() <= s.steps(), "mean batch above 1: " + s);
            assertEquals(s.totalPages(), s.freePages(), "pages returned: " + s);
        }
    }

    /**
     * Sampled requests of one step are drawn side by side on the engine's draw threads, each by its own sampler: every
     * request gets the tokens it gets on an engine of one slot (where each draw is the engine thread's), among them
     * one with a banned token and one with a repetition penalty.
     */
    @Test
    void sampledRequestsDrawnSideBySideGiveTheTokensEachGetsAlone() throws Exception {
        Random r = new Random(SEED + 17);
        int n = 4;
        GenerationRequest[] requests = new GenerationRequest[n];
        for (int i = 0; i < n; i++) {
            SamplerConfig sampling = new SamplerConfig(0.9f, i == 1 ? 20 : 0, i == 2 ? 0.9f : 1f, 0f,
                    i == 3 ? 1.3f : 1f, 16, SEED + i);
            int banned = r.nextInt(TinyModels.VOCAB);
            requests[i] = new GenerationRequest(r.ints(10 + 30 * i, 0, TinyModels.VOCAB).toArray(), 24, sampling,
                    null, i == 0 ? t -> t == banned : null);
        }
        EngineStats s = sameTokensBatchedOrAlone(backend, backend, requests);
        assertTrue(s.decodeRows() > s.decodeSteps(), "steps of several sequences: " + s);
    }

    /**
     * Runs the requests together on an engine of as many slots over batched, then each alone on one of one slot over
     * alone, and asserts each got the same tokens both times; the batched engine's counters.
     */
    private static EngineStats sameTokensBatchedOrAlone(Backend batched, Backend alone, GenerationRequest[] requests)
            throws Exception {
        int n = requests.length;
        int[][] together = new int[n][];
        EngineStats stats;
        try (SequencePool pool = backend.newSequencePool(4 * CTX, F16, F16);
             Engine engine = new Engine(batched, pool, new EngineConfig(n, CTX, CHUNK, 8, false))) {
            Events[] ev = new Events[n];
            for (int i = 0; i < n; i++) {
                ev[i] = new Events();
                engine.submit(requests[i], ev[i].queue::add);
            }
            for (int i = 0; i < n; i++) {
                assertInstanceOf(GenerationEvent.Finished.class, ev[i].end());
                together[i] = ev[i].ids();
            }
            stats = engine.stats();
        }
        try (SequencePool pool = backend.newSequencePool(4 * CTX, F16, F16);
             Engine engine = new Engine(alone, pool, new EngineConfig(1, CTX, CHUNK, 8, false))) {
            for (int i = 0; i < n; i++) {
                Events e = new Events();
                engine.submit(requests[i], e.queue::add);
                assertInstanceOf(GenerationEvent.Finished.class, e.end());
                assertArrayEquals(e.ids(), together[i], "request " + i + " (seed " + SEED + ")");
            }
        }
        return stats;
    }

    /**
     * A backend that draws at a temperature where it runs, as the GPU's does: here on the host, from the logits of
     * {@link #decodeBatch} (a Gumbel-max draw from the key, as the device draws); it counts its drawn steps.
     */
    static final class DrawingBackend extends ForwardingBackend {
        int drawnSteps;
        int drawnRows;
        int penalizedRows;

        DrawingBackend(Backend inner) {
            super(inner);
        }

        @Override
        public boolean drawsWhereItRuns() {
            return true;
        }

        @Override
        public PendingDecode startDecodeDrawn(BackendSequence[] seqs, int[] tokens, dev.kvant.backend.Draws draws,
                                              float[] logits) {
            int vocab = model().config().vocabSize();
            float[] rows = new float[seqs.length * vocab];
            decodeBatch(seqs, tokens, rows);
            for (int i = 0; i < seqs.length; i++) {
                if (draws.penalty()[i] != null) {   // as the device: the row's logits penalized first, in place
                    dev.kvant.sample.Sampler.penalize(draws.penalty()[i], rows, i * vocab, vocab);
                    penalizedRows++;
                }
            }
            if (logits != null) {
                System.arraycopy(rows, 0, logits, 0, rows.length);
            }
            int[] ids = new int[seqs.length];
            drawnSteps++;
            for (int i = 0; i < seqs.length; i++) {
                float t = draws.temperature()[i];
                int[] banned = draws.banned()[i] == null ? new int[0] : draws.banned()[i];
                int off = i * vocab;
                // the candidates, ranked (logit descending, id ascending), banned ids left out
                Integer[] order = java.util.stream.IntStream.range(0, vocab)
                        .filter(v -> java.util.Arrays.stream(banned).noneMatch(b -> b == v)).boxed()
                        .sorted((a, b) -> rows[off + a] != rows[off + b] ? Float.compare(rows[off + b], rows[off + a])
                                : Integer.compare(a, b))
                        .toArray(Integer[]::new);
                int keep = draws.topK()[i] > 0 ? Math.min(draws.topK()[i], order.length) : order.length;
                if (t > 0) {
                    double max = rows[off + order[0]];
                    double mass = 0;
                    for (int j = 0; j < keep; j++) {
                        mass += Math.exp(rows[off + order[j]] - max);
                    }
                    double cum = 0;
                    for (int j = 0; j < keep && draws.topP()[i] < 1f; j++) {
                        cum += Math.exp(rows[off + order[j]] - max) / mass;
                        if (cum >= draws.topP()[i]) {
                            keep = j + 1;
                            break;
                        }
                    }
                    int k = 1;
                    while (k < keep && Math.exp(rows[off + order[k]] - max) >= draws.minP()[i]) {
                        k++;
                    }
                    keep = k;
                }
                int best = -1;
                double top = Double.NEGATIVE_INFINITY;
                for (int j = 0; j < keep; j++) {
                    int v = order[j];
                    double score = t == 0 ? rows[off + v] : rows[off + v] / t + gumbel(draws.key()[i], v);
                    if (score > top) {
                        top = score;
                        best = v;
                    }
                }
                ids[i] = best;
                drawnRows += t > 0 ? 1 : 0;
            }
            return () -> ids;
        }

        private static double gumbel(long key, int id) {
            long z = key + (id + 1L) * 0x9E3779B97F4A7C15L;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            z ^= z >>> 31;
            double u = ((z >>> 41) + 0.5) / (1 << 23);
            return -Math.log(-Math.log(u));
        }
    }

    /**
     * On a backend that draws where it runs, a request it can draw is drawn there (with its banned tokens and its
     * repetition penalty too) and one with a longer penalty window on the host, whatever shares its step: each of seven
     * requests (sampled; with top-k, top-p and min-p; greedy; with a penalty; greedy with a banned token; sampled with
     * one; with a penalty over 100 tokens) gets the tokens it gets on an engine of one slot, batched with the others.
     */
    @Test
    void drawsWhereTheModelRunsAreTheSameBatchedOrAlone() throws Exception {
        Random r = new Random(SEED + 19);
        int n = 7;
        GenerationRequest[] requests = new GenerationRequest[n];
        for (int i = 0; i < n; i++) {
            SamplerConfig sampling = switch (i) {
                case 1 -> new SamplerConfig(0.9f, 20, 0.9f, 0.05f, 1f, 16, SEED + i);
                case 2, 4 -> SamplerConfig.greedy();
                case 3 -> new SamplerConfig(0.8f, 0, 1f, 0f, 1.3f, 16, SEED + i);
                case 6 -> new SamplerConfig(0.8f, 40, 1f, 0f, 1.3f, 100, SEED + i);
                default -> new SamplerConfig(0.8f, 0, 1f, 0f, 1f, 16, SEED + i);
            };
            int[] prompt = r.ints(12 + 25 * i, 0, TinyModels.VOCAB).toArray();
            int banned = r.nextInt(TinyModels.VOCAB);
            requests[i] = new GenerationRequest(prompt, 20, sampling, null, i == 4 || i == 5
                    ? t -> t == banned : null);
        }
        DrawingBackend drawing = new DrawingBackend(backend);
        sameTokensBatchedOrAlone(drawing, new DrawingBackend(backend), requests);
        assertTrue(drawing.drawnSteps > 0 && drawing.drawnRows > 0, "drawn where the model runs");
        assertTrue(drawing.penalizedRows > 0, "penalized where the model runs");
    }

    /**
     * A session's decode steps ({@link Session#decodeSampled}: what {@code kvant run} and {@code chat} generate
     * through) are drawn where the model runs when the backend can and the sampler allows it: on the drawing double,
     * top-k 1 at a temperature gives greedy's tokens, and the CLI's defaults are drawn there every step, with a
     * repetition penalty too; greedy with a penalty gives the host's tokens there (the largest penalized logit); a
     * penalty over a window longer than a draw takes draws on the host, and on a backend that draws nothing the same
     * sampler gives the host's tokens.
     */
    @Test
    void aSessionsSampledStepsAreDrawnWhereTheModelRuns() {
        int[] prompt = new Random(SEED + 23).ints(40, 0, TinyModels.VOCAB).toArray();
        DrawingBackend drawing = new DrawingBackend(backend);
        int[] greedy = sessionTokens(backend, prompt, SamplerConfig.greedy());
        assertArrayEquals(greedy, sessionTokens(drawing, prompt, new SamplerConfig(0.8f, 1, 1f, 0f, 1f, 16, SEED)));
        assertEquals(greedy.length - 1, drawing.drawnRows, "every decode step of top-k 1 drawn there");
        int before = drawing.drawnRows;
        sessionTokens(drawing, prompt, SamplerConfig.defaults(SEED));
        assertEquals(before + greedy.length - 1, drawing.drawnRows, "every step of the CLI's defaults drawn there");
        SamplerConfig penalized = new SamplerConfig(0.8f, 40, 0.95f, 0.05f, 1.3f, 16, SEED);
        sessionTokens(drawing, prompt, penalized);
        assertEquals(before + 2 * (greedy.length - 1), drawing.drawnRows, "a penalty drawn there");
        assertEquals(greedy.length - 1, drawing.penalizedRows, "every step penalized there");
        SamplerConfig greedyPenalized = new SamplerConfig(0f, 0, 1f, 0f, 1.3f, 16, SEED);
        assertArrayEquals(sessionTokens(backend, prompt, greedyPenalized),
                sessionTokens(drawing, prompt, greedyPenalized), "greedy with a penalty, there and on the host");
        assertEquals(2 * (greedy.length - 1), drawing.penalizedRows, "greedy's penalty applied there");
        int drawn = drawing.drawnRows;
        SamplerConfig longWindow = new SamplerConfig(0.8f, 40, 0.95f, 0.05f, 1.3f, Draws.MAX_PENALIZED + 1, SEED);
        assertArrayEquals(sessionTokens(backend, prompt, longWindow), sessionTokens(drawing, prompt, longWindow));
        assertEquals(drawn, drawing.drawnRows, "a penalty over a longer window draws on the host");
    }

    /**
     * 12 tokens after prompt on a fresh f16 session of b, chosen as config says, the sampler seeing the prompt and each
     * token (as Generator has it, so a penalty has a window).
     */
    private static int[] sessionTokens(Backend b, int[] prompt, SamplerConfig config) {
        Sampler sampler = new Sampler(config);
        for (int t : prompt) {
            sampler.accept(t);
        }
        try (Session s = new Session(b, CTX, F16, F16, CHUNK)) {
            int[] out = new int[12];
            out[0] = s.prefillSampled(prompt, sampler);
            sampler.accept(out[0]);
            for (int i = 1; i < out.length; i++) {
                out[i] = s.decodeSampled(out[i - 1], sampler);
                sampler.accept(out[i]);
            }
            return out;
        }
    }

    /** One slot: every decode step decodes one sequence, so the mean batch is exactly 1 (prompt-only steps aside). */
    @Test
    void theMeanBatchOfOneSlotIsOne() throws Exception {
        Random r = new Random(SEED + 11);
        try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, CHUNK, 8, false))) {
            Events[] ev = new Events[3];
            for (int i = 0; i < ev.length; i++) {
                ev[i] = new Events();
                engine.submit(greedy(r.ints(100, 0, TinyModels.VOCAB).toArray(), 5), ev[i].queue::add);
            }
            for (Events e : ev) {
                assertInstanceOf(GenerationEvent.Finished.class, e.end());
            }
            // the last answer arrives within its step: the counters are final once the step has let it go
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (engine.stats().running() > 0 && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            EngineStats s = engine.stats();
            assertEquals(0, s.running(), "the engine went idle: " + s);
            assertEquals(s.decodeRows(), s.decodeSteps(), "seed " + SEED + ": " + s);
            assertTrue(s.steps() > s.decodeSteps(), "the prompts' chunks took steps of their own: " + s);
        }
    }

    /**
     * A backend that keeps two decode steps in flight, as a layer split over two GPUs does: a started step computes
     * nothing until it is awaited, and the backend checks that no sequence is in two steps and no more than two are
     * pending.
     */
    static final class TwoInFlight extends ForwardingBackend {
        final java.util.Set<BackendSequence> busy = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
        int pending;
        int mostPending;
        int awaited;
        /** The await (counted from 1) that fails as a device would, or 0. */
        int failAt;
        final List<String> violations = new ArrayList<>();

        TwoInFlight(Backend inner) {
            super(inner);
        }

        @Override
        public int pipelineDepth() {
            return 2;
        }

        /** A pool whose sequences report any use while a step of theirs is in flight. */
        @Override
        public SequencePool newSequencePool(int tokens, dev.kvant.kv.KvLayerFormats formats) {
            SequencePool p = inner.newSequencePool(tokens, formats);
            return new SequencePool() {
                @Override public int pageTokens() { return p.pageTokens(); }
                @Override public int totalPages() { return p.totalPages(); }
                @Override public int freePages() { return p.freePages(); }
                @Override public int holders(int page) { return p.holders(page); }
                @Override public BackendSequence newSequence(int capacity) { return new Tracked(p.newSequence(capacity)); }
                @Override public BackendSequence fork(BackendSequence parent, int prefix, int capacity) {
                    check(parent, "forked");
                    return new Tracked(p.fork(((Tracked) parent).seq, prefix, capacity));
                }
                @Override public void close() { p.close(); }
            };
        }

        synchronized void check(BackendSequence q, String what) {
            if (busy.contains(q)) {
                violations.add("a sequence was " + what + " while in flight");
            }
        }

        final class Tracked implements BackendSequence {
            final BackendSequence seq;

            Tracked(BackendSequence seq) {
                this.seq = seq;
            }

            @Override public int length() { return seq.length(); }
            @Override public int capacity() { return seq.capacity(); }
            @Override public int[] pageIds() { return seq.pageIds(); }
            @Override public void forward(int[] t, int off, int n, boolean all, float[] out) { check(this, "fed"); seq.forward(t, off, n, all, out); }
            @Override public int forwardGreedy(int[] t, int off, int n) { check(this, "fed"); return seq.forwardGreedy(t, off, n); }
            @Override public void fillRandom(int tokens, long seed) { check(this, "filled"); seq.fillRandom(tokens, seed); }
            @Override public void truncate(int length) { check(this, "truncated"); seq.truncate(length); }
            @Override public void close() { check(this, "closed"); seq.close(); }
        }

        private static BackendSequence unwrap(BackendSequence q) {
            return q instanceof TwoInFlight.Tracked t ? t.seq : q;
        }

        @Override
        public synchronized PendingDecode startDecode(BackendSequence[] seqs, int[] tokens, float[] logits) {
            for (BackendSequence q : seqs) {
                if (!busy.add(q)) {
                    violations.add("a sequence was started while in flight");
                }
            }
            if (++pending > 2) {
                violations.add(pending + " steps pending");
            }
            mostPending = Math.max(mostPending, pending);
            BackendSequence[] s = seqs.clone();
            BackendSequence[] in = new BackendSequence[s.length];
            for (int i = 0; i < s.length; i++) {
                in[i] = unwrap(s[i]);
            }
            int[] t = tokens.clone();
            int[][] result = new int[1][];
            RuntimeException[] failure = new RuntimeException[1];
            boolean[] done = new boolean[1];
            return () -> {
                synchronized (this) {
                    if (!done[0]) {
                        done[0] = true;
                        pending--;
                        try {
                            if (++awaited == failAt) {
                                throw new IllegalStateException("injected device failure");
                            }
                            result[0] = inner.startDecode(in, t, logits).await();
                        } catch (RuntimeException e) {
                            failure[0] = e;
                        } finally {
                            for (BackendSequence q : s) {
                                busy.remove(q);
                            }
                        }
                    }
                    if (failure[0] != null) {
                        throw failure[0];
                    }
                    return result[0];
                }
            };
        }
    }

    /**
     * What evicting the prefix entries would free counts a page shared only between entries (it goes with the last
     * of them) and not one a running sequence holds too: two entries, b forked from a's first two pages and grown by
     * a page of its own, and a running sequence forked from their first page. Evicting both frees a's third page,
     * b's own page and their shared second page: 3 — where counting each entry's pages held alone gave 2; keeping b,
     * a alone frees its third page: 1. And evicting them does give that many back.
     */
    @Test
    void evictingPrefixEntriesCountsThePagesOnlyTheyShare() {
        try (SequencePool pool = backend.newSequencePool(8 * CTX, F16, F16)) {
            int pt = pool.pageTokens();
            BackendSequence a = pool.newSequence(CTX);
            a.fillRandom(3 * pt, SEED);
            BackendSequence b = pool.fork(a, 2 * pt, CTX);
            b.fillRandom(pt, SEED + 1);
            BackendSequence running = pool.fork(a, pt, CTX);
            PrefixCache cache = new PrefixCache(8);
            int[] ta = new int[3 * pt];
            int[] tb = new int[3 * pt];
            java.util.Arrays.fill(ta, 1);
            java.util.Arrays.fill(tb, 2);
            cache.insert(ta, a);
            cache.insert(tb, b);
            assertEquals(3, cache.pagesExcept(null, pool));
            PrefixCache.Match kept = cache.match(java.util.Arrays.copyOf(tb, 2 * pt + 1), 1);
            assertEquals(2 * pt, kept.tokens());
            assertEquals(1, cache.pagesExcept(kept.entry(), pool));
            int free = pool.freePages();
            while (cache.evictLeastRecent(null)) {
                // every entry
            }
            assertEquals(free + 3, pool.freePages());
            running.close();
        }
    }

    /**
     * With two steps in flight, a request cancelled mid-generation ends as cancelled, a step that fails on the device
     * fails only its own sequences, the others finish, nothing touches a sequence in flight, and every page returns.
     */
    @Test
    void cancellationAndAFailedStepInFlightHarmNoOtherRequest() throws Exception {
        Random r = new Random(SEED + 9);
        TwoInFlight two = new TwoInFlight(backend);
        two.failAt = 12;
        int requests = 5;
        try (SequencePool pool = two.newSequencePool(8 * CTX, F16, F16);
             Engine engine = new Engine(two, pool, new EngineConfig(requests, CTX, CHUNK, 8, true))) {
            assertEquals(2, engine.pipelineDepth());
            Events[] ev = new Events[requests];
            Generation[] g = new Generation[requests];
            for (int i = 0; i < requests; i++) {
                ev[i] = new Events();
                g[i] = engine.submit(greedy(r.ints(10 + 7 * i, 0, TinyModels.VOCAB).toArray(), 80), ev[i].queue::add);
            }
            // cancel the first once it has a few tokens
            while (ev[0].tokens.size() < 3) {
                GenerationEvent e = ev[0].queue.poll(30, TimeUnit.SECONDS);
                assertNotNull(e, "seed " + SEED);
                if (e instanceof GenerationEvent.Token t) {
                    ev[0].tokens.add(t.id());
                } else if (!(e instanceof GenerationEvent.Started)) {
                    break;
                }
            }
            g[0].cancel();
            int failed = 0;
            int finished = 0;
            for (int i = 0; i < requests; i++) {
                GenerationEvent end = ev[i].end();
                if (end instanceof GenerationEvent.Failed f) {
                    assertTrue(f.message().contains("injected device failure"), f.message());
                    failed++;
                } else {
                    GenerationEvent.Finished f = assertInstanceOf(GenerationEvent.Finished.class, end);
                    assertEquals(i == 0 ? FinishReason.CANCELLED : FinishReason.LENGTH, f.reason(),
                            "request " + i + " (seed " + SEED + ")");
                    finished++;
                }
            }
            assertTrue(failed >= 1 && failed <= 3, failed + " failed (seed " + SEED + ")");
            assertEquals(requests, failed + finished);
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), pool.freePages(), "every page returned (seed " + SEED + ")");
        }
        assertEquals(List.of(), two.violations);
    }

    @Test
    void twoStepsInFlightGenerateWhatOneStepAtATimeDoes() throws Exception {
        Random r = new Random(SEED + 7);
        int requests = 7;
        int[][] prompts = new int[requests][];
        GenerationRequest[] reqs = new GenerationRequest[requests];
        for (int i = 0; i < requests; i++) {
            prompts[i] = r.ints(3 + r.nextInt(60), 0, TinyModels.VOCAB).toArray();
            // greedy and sampled requests mixed: a cohort of sampled ones copies logits, a greedy one ids
            reqs[i] = new GenerationRequest(prompts[i], 6 + r.nextInt(20),
                    i % 3 == 1 ? SamplerConfig.defaults(SEED + i) : SamplerConfig.greedy(), null);
        }
        int[][] expected = new int[requests][];
        for (int pass = 0; pass < 2; pass++) {
            TwoInFlight two = new TwoInFlight(backend);
            Backend b = pass == 0 ? backend : two;
            try (SequencePool pool = pass == 0 ? backend.newSequencePool(8 * CTX, F16, F16)
                    : two.newSequencePool(8 * CTX, F16, F16);
                 // asking for 3 steps in flight gets the backend's 2
                 Engine engine = new Engine(b, pool, new EngineConfig(5, CTX, CHUNK, 8, false, pass == 0 ? 0 : 3))) {
                Events[] ev = new Events[requests];
                for (int i = 0; i < requests; i++) {
                    ev[i] = new Events();
                    engine.submit(reqs[i], ev[i].queue::add);
                }
                for (int i = 0; i < requests; i++) {
                    GenerationEvent.Finished f = assertInstanceOf(GenerationEvent.Finished.class, ev[i].end());
                    assertEquals(FinishReason.LENGTH, f.reason());
                    if (pass == 0) {
                        expected[i] = ev[i].ids();
                    } else {
                        assertArrayEquals(expected[i], ev[i].ids(), "request " + i + " (seed " + SEED + ")");
                    }
                }
                assertEquals(pool.totalPages(), pool.freePages(), "pages returned");
            }
            if (pass == 1) {
                assertEquals(List.of(), two.violations);
                assertEquals(2, two.mostPending, "two steps were in flight at once");
            }
        }
    }

    @Test
    void nextTurnForksTheCachedConversationAndComputesOnlyTheRest() throws Exception {
        Random r = new Random(SEED + 1);
        int[] turn1 = r.ints(150, 0, TinyModels.VOCAB).toArray();
        try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            Events a = new Events();
            engine.submit(greedy(turn1, 10), a.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, a.end());
            assertEquals(0, a.started.cachedTokens());
            // The next turn: the whole first turn with its answer, and a new question.
            int[] reply = a.ids();
            int[] turn2 = concat(turn1, reply, r.ints(30, 0, TinyModels.VOCAB).toArray());
            Events b = new Events();
            engine.submit(greedy(turn2, 8), b.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, b.end());
            // The cache holds the first turn and every reply token but the last (never fed back).
            int held = turn1.length + reply.length - 1;
            assertEquals(held, b.started.cachedTokens(), "seed " + SEED);

            try (BackendSequence seq = pool.newSequence(CTX)) {
                alone(seq, turn1, 0, reply.length);
                seq.truncate(held);
                assertArrayEquals(alone(seq, turn2, held, 8), b.ids(), "seed " + SEED);
            }
            EngineStats s = engine.stats();
            assertEquals(1, s.prefixHits());
            assertEquals(held, s.cachedTokens());
            engine.clearPrefixCache();
            assertEquals(s.totalPages(), engine.stats().freePages(), "no page leaked");
        }
    }

    /**
     * With keys centered on their page's mean a prefix of any length would give other bits than the prompt computed
     * afresh (a page's mean comes from the write that opens it; the first turn's last pages were opened by its last,
     * shorter chunk and its decode steps), so such a pool reuses whole prompt chunks only: the next turn forks the
     * first turn's whole chunks and generates what a fresh engine generates.
     */
    @Test
    void keysCenteredOnPageMeansReuseWholeChunksAndGiveAFreshEnginesTokens() throws Exception {
        secondTurnReusesWholeChunksAndAnswersAsAFreshEngine(backend, KvFormat.parse("turbo3+mean"),
                KvFormat.parse("turbo3"), SEED);
    }

    /**
     * Why whole chunks: on a pool of centered keys a fork at a chunk boundary, the rest of the prompt read in chunks
     * from there, gives the logits of the prompt read afresh bit for bit; and a fork inside a chunk (whose rest opens
     * its pages with other spans of rows) gives other logits.
     */
    @Test
    void aForkAtAWholeChunkOfCenteredKeysGivesTheFreshLogitsAndOneInsideAChunkDoesNot() {
        Random r = new Random(SEED + 13);
        int[] prompt = r.ints(5 * CHUNK + 7, 0, TinyModels.VOCAB).toArray();
        try (SequencePool pool = backend.newSequencePool(4 * CTX, KvFormat.parse("turbo3+mean"),
                KvFormat.parse("turbo3"));
             BackendSequence first = pool.newSequence(CTX);
             BackendSequence fresh = pool.newSequence(CTX)) {
            float[] expected = readInChunks(fresh, prompt, 0);
            readInChunks(first, java.util.Arrays.copyOf(prompt, 3 * CHUNK + 5), 0);
            try (BackendSequence atChunk = pool.fork(first, 3 * CHUNK, CTX);
                 BackendSequence inside = pool.fork(first, 3 * CHUNK + 5, CTX)) {
                assertArrayEquals(bits(expected), bits(readInChunks(atChunk, prompt, 3 * CHUNK)), "seed " + SEED);
                assertFalse(java.util.Arrays.equals(bits(expected), bits(readInChunks(inside, prompt, 3 * CHUNK + 5))),
                        "a fork inside a chunk gave the fresh bits (seed " + SEED + ")");
            }
        }
    }

    /** Reads prompt[from..) into seq in CHUNK-token pieces; the last token's logits. */
    private static float[] readInChunks(BackendSequence seq, int[] prompt, int from) {
        float[] logits = new float[TinyModels.VOCAB];
        for (int off = from; off < prompt.length; off += CHUNK) {
            seq.forward(prompt, off, Math.min(CHUNK, prompt.length - off), false, logits);
        }
        return logits;
    }

    private static int[] bits(float[] x) {
        int[] out = new int[x.length];
        for (int i = 0; i < x.length; i++) {
            out[i] = Float.floatToRawIntBits(x[i]);
        }
        return out;
    }

    /**
     * Approximate prefixes: the same pool of centered keys, whose forks keep bits only at whole chunks, reuses the
     * first turn whole, its reply included, when the engine is told to ({@link EngineConfig#approximatePrefixes}): the
     * second turn forks it, computes only the rest, and every page comes back once the cache is cleared.
     */
    @Test
    void approximatePrefixesAreReusedWhereForksDoNotKeepBits() throws Exception {
        Random r = new Random(SEED + 11);
        int[] turn1 = r.ints(150, 0, TinyModels.VOCAB).toArray();
        try (SequencePool pool = backend.newSequencePool(2 * CTX, KvFormat.parse("turbo3+mean"),
                KvFormat.parse("turbo3"));
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true, 0, true))) {
            assertFalse(pool.forksKeepBits());
            assertTrue(engine.reusesPrefixes());
            assertFalse(engine.prefixesKeepBits());
            assertEquals(1, engine.prefixReuseStep());
            Events a = new Events();
            engine.submit(greedy(turn1, 20), a.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, a.end());
            int[] reply = a.ids();
            int[] turn2 = concat(turn1, reply, r.ints(30, 0, TinyModels.VOCAB).toArray());
            Events b = new Events();
            engine.submit(greedy(turn2, 8), b.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, b.end());
            assertEquals(turn1.length + reply.length - 1, b.started.cachedTokens(), "seed " + SEED);
            assertEquals(1, engine.stats().prefixHits());
            assertEquals(8, b.ids().length);
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), engine.stats().freePages(), "no page leaked");
        }
        try (SequencePool pool = backend.newSequencePool(2 * CTX, KvFormat.parse("turbo3+mean"),
                KvFormat.parse("turbo3"));
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            assertTrue(engine.reusesPrefixes());
            assertTrue(engine.prefixesKeepBits());
            assertEquals(CHUNK, engine.prefixReuseStep(), "without approximate prefixes: whole chunks");
        }
    }

    /**
     * Prompt chunks of one token: a whole chunk is any prompt prefix, but the rows decode steps wrote are still not a
     * prompt's (on the GPU they come from other products): the next turn forks the first turn's prompt, not its reply,
     * and the engine says that its reuse keeps the bits.
     */
    @Test
    void chunksOfOneTokenReuseThePromptButNotTheReply() throws Exception {
        Random r = new Random(SEED + 19);
        int[] turn1 = r.ints(40, 0, TinyModels.VOCAB).toArray();
        try (SequencePool pool = backend.newSequencePool(2 * CTX, KvFormat.parse("turbo3+mean"),
                KvFormat.parse("turbo3"));
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, 1, 8, true))) {
            assertTrue(engine.prefixesKeepBits(), "no approximate prefixes asked for");
            Events a = new Events();
            engine.submit(greedy(turn1, 10), a.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, a.end());
            int[] reply = a.ids();
            int[] turn2 = concat(turn1, reply, r.ints(5, 0, TinyModels.VOCAB).toArray());
            Events b = new Events();
            engine.submit(greedy(turn2, 4), b.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, b.end());
            assertEquals(turn1.length, b.started.cachedTokens(), "seed " + SEED);
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), engine.stats().freePages(), "no page leaked");
        }
    }

    /**
     * A prompt's kept pages cost no page even where the chunk does not divide the page (chunks of 24 tokens, pages of
     * 64): they end on the last page boundary within its whole chunks. A request on a pool of one context, whose
     * 100-token prompt leaves 96 tokens of whole chunks, decodes to the end of its context; a kept prefix cut to the
     * chunks (48 tokens, inside a page) would have copied that page, and the request would run out of pages.
     */
    @Test
    void keptPromptPagesCostNoPageWhereTheChunkDoesNotDivideThePage() throws Exception {
        int chunk = 24;
        int[] prompt = new Random(SEED + 17).ints(100, 0, TinyModels.VOCAB).toArray();
        try (SequencePool pool = backend.newSequencePool(CTX, KvFormat.parse("turbo3+mean"),
                KvFormat.parse("turbo3"));
             Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, chunk, 8, true))) {
            assertEquals(chunk, engine.prefixReuseStep());
            assertEquals(CTX / CpuBackend.PAGE_TOKENS, pool.totalPages());
            Events a = new Events();
            engine.submit(greedy(prompt, CTX), a.queue::add);
            GenerationEvent end = a.end();
            assertInstanceOf(GenerationEvent.Finished.class, end, "seed " + SEED + ": " + end);
            assertEquals(FinishReason.CONTEXT, ((GenerationEvent.Finished) end).reason());
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), engine.stats().freePages(), "no page leaked");
        }
    }

    /**
     * A first turn, then a second that starts with it, on an engine with its prefix cache on: the second forks the
     * first turn's whole prompt chunks (not its last, shorter chunk nor its reply: their pages went back when the first
     * turn ended), frees every page once the cache is cleared, and generates what a fresh engine (no cache) generates
     * for it.
     */
    static void secondTurnReusesWholeChunksAndAnswersAsAFreshEngine(Backend backend, KvFormat k, KvFormat v, long seed)
            throws Exception {
        Random r = new Random(seed + 7);
        int[] turn1 = r.ints(150, 0, TinyModels.VOCAB).toArray();
        int[] question = r.ints(40, 0, TinyModels.VOCAB).toArray();
        int[] turn2;
        Events b = new Events();
        try (SequencePool pool = backend.newSequencePool(2 * CTX, k, v);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            assertEquals(CHUNK, engine.prefixReuseStep());
            assertTrue(engine.prefixesKeepBits());
            Events a = new Events();
            engine.submit(greedy(turn1, 20), a.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, a.end());
            int[] reply = a.ids();
            turn2 = concat(turn1, reply, question);
            engine.submit(greedy(turn2, 12), b.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, b.end());
            assertEquals(turn1.length / CHUNK * CHUNK, b.started.cachedTokens(), "seed " + seed);
            assertEquals(1, engine.stats().prefixHits(), "seed " + seed);
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), engine.stats().freePages(), "nothing leaked");
        }
        try (SequencePool pool = backend.newSequencePool(2 * CTX, k, v);
             Engine fresh = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, false))) {
            Events c = new Events();
            fresh.submit(greedy(turn2, 12), c.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, c.end());
            assertArrayEquals(c.ids(), b.ids(), "seed " + seed);
        }
    }

    /**
     * Requests submitted while the engine shuts down each get exactly one answer: accepted ones end (finished or
     * failed), refused ones throw. One added after the engine thread's last look at its inbox used to be accepted and
     * never answered.
     */
    @Test
    void everyRequestSubmittedDuringShutdownIsAnsweredOnce() throws Exception {
        for (int round = 0; round < 200; round++) {
            try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16)) {
                Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 64, true));
                List<Events> accepted = java.util.Collections.synchronizedList(new ArrayList<>());
                java.util.concurrent.CountDownLatch go = new java.util.concurrent.CountDownLatch(1);
                List<Thread> submitters = new ArrayList<>();
                for (int t = 0; t < 4; t++) {
                    submitters.add(Thread.ofPlatform().start(() -> {
                        try {
                            go.await();
                        } catch (InterruptedException e) {
                            return;
                        }
                        for (int i = 0; i < 100; i++) {
                            Events e = new Events();
                            try {
                                engine.submit(greedy(new int[] {1, 2, 3}, 2), e.queue::add);
                                accepted.add(e);
                            } catch (EngineBusyException refused) {
                                // refused: answered by the exception
                            }
                        }
                    }));
                }
                go.countDown();
                engine.shutdown(Duration.ZERO);
                for (Thread t : submitters) {
                    t.join();
                }
                for (Events e : accepted) {
                    GenerationEvent end = e.end();
                    assertTrue(end instanceof GenerationEvent.Finished || end instanceof GenerationEvent.Failed, "" + end);
                }
                assertEquals(0, engine.stats().waiting() + engine.stats().running(), "round " + round);
                assertEquals(pool.totalPages(), pool.freePages(), "round " + round);
            }
        }
    }

    /** A listener that throws an Error (an assertion of its own) cancels its request, not the engine. */
    /** A backend whose decode step throws the given error once (the step counted from 1), then works. */
    static final class ThrowsOnce extends ForwardingBackend {
        final int at;
        final Error error;
        int steps;

        ThrowsOnce(Backend inner, int at, Error error) {
            super(inner);
            this.at = at;
            this.error = error;
        }

        @Override
        public PendingDecode startDecode(BackendSequence[] seqs, int[] tokens, float[] logits) {
            if (++steps == at) {
                throw error;
            }
            return super.startDecode(seqs, tokens, logits);
        }
    }

    /** Refuses the first decode step of two or more sequences, and from then on every step with its first one. */
    static final class RefusesOne extends ForwardingBackend {
        BackendSequence marked;

        RefusesOne(Backend inner) {
            super(inner);
        }

        @Override
        public PendingDecode startDecode(BackendSequence[] seqs, int[] tokens, float[] logits) {
            if (marked == null && seqs.length > 1) {
                marked = seqs[0];
            }
            if (marked != null && Arrays.asList(seqs).contains(marked)) {
                throw new IllegalStateException("injected: this sequence is refused");
            }
            return super.startDecode(seqs, tokens, logits);
        }
    }

    @Test
    void aRefusedBatchFailsOnlyTheSequenceAtFault() throws Exception {
        Random r = new Random(SEED + 12);
        int[][] prompts = {r.ints(9, 0, TinyModels.VOCAB).toArray(), r.ints(11, 0, TinyModels.VOCAB).toArray()};
        int[][] alone = new int[2][];
        for (int i = 0; i < 2; i++) {
            try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
                 Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, CHUNK, 8, false))) {
                Events e = new Events();
                engine.submit(greedy(prompts[i], 100), e.queue::add);
                assertInstanceOf(GenerationEvent.Finished.class, e.end());
                alone[i] = e.ids();
            }
        }
        RefusesOne refuses = new RefusesOne(backend);
        try (SequencePool pool = refuses.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(refuses, pool, new EngineConfig(2, CTX, CHUNK, 8, false))) {
            Events[] ev = {new Events(), new Events()};
            for (int i = 0; i < 2; i++) {
                engine.submit(greedy(prompts[i], 100), ev[i].queue::add);
            }
            GenerationEvent[] end = {ev[0].end(), ev[1].end()};
            int failed = end[0] instanceof GenerationEvent.Failed ? 0 : 1;   // whichever came first in the batch
            GenerationEvent.Failed f = assertInstanceOf(GenerationEvent.Failed.class, end[failed], "one is refused");
            assertTrue(f.message().contains("injected"), f.message());
            assertInstanceOf(GenerationEvent.Finished.class, end[1 - failed], "the other goes on");
            assertArrayEquals(alone[1 - failed], ev[1 - failed].ids(), "with the tokens it gets alone");
            assertEquals(pool.totalPages(), pool.freePages(), "every page returned");
        }
    }

    @Test
    void anAssertionErrorInADecodeStepFailsThatStepsRequestsAndTheEngineGoesOn() throws Exception {
        Random r = new Random(SEED + 10);
        ThrowsOnce once = new ThrowsOnce(backend, 3, new AssertionError("an injected check failed"));
        try (SequencePool pool = once.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(once, pool, new EngineConfig(1, CTX, CHUNK, 8, true))) {
            Events first = new Events();
            engine.submit(greedy(r.ints(20, 0, TinyModels.VOCAB).toArray(), 10), first.queue::add);
            GenerationEvent.Failed f = assertInstanceOf(GenerationEvent.Failed.class, first.end());
            assertTrue(f.message().contains("an injected check failed"), f.message());
            Events after = new Events();
            engine.submit(greedy(r.ints(20, 0, TinyModels.VOCAB).toArray(), 5), after.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, after.end(), "the engine goes on");
            assertEquals(5, after.ids().length);
            assertNull(engine.failure());
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), pool.freePages(), "every page returned");
        }
    }

    @Test
    void anOutOfMemoryErrorStopsTheEngineWhichSaysWhyAndRefusesWhatComes() throws Exception {
        Random r = new Random(SEED + 11);
        ThrowsOnce once = new ThrowsOnce(backend, 2, new OutOfMemoryError("injected"));
        try (SequencePool pool = once.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(once, pool, new EngineConfig(1, CTX, CHUNK, 8, true))) {
            Events first = new Events();
            engine.submit(greedy(r.ints(20, 0, TinyModels.VOCAB).toArray(), 10), first.queue::add);
            GenerationEvent.Failed f = assertInstanceOf(GenerationEvent.Failed.class, first.end());
            assertTrue(f.message().contains("internal error"), f.message());
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (engine.failure() == null && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertInstanceOf(OutOfMemoryError.class, engine.failure());
            EngineBusyException busy = assertThrows(EngineBusyException.class, () -> engine.submit(
                    greedy(r.ints(5, 0, TinyModels.VOCAB).toArray(), 2), e -> { }));
            assertTrue(busy.getMessage().contains("internal error"), busy.getMessage());
        }
    }

    @Test
    void aListenerThrowingAnAssertionErrorCancelsOnlyItsRequest() throws Exception {
        Random r = new Random(SEED + 8);
        try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            engine.submit(greedy(r.ints(20, 0, TinyModels.VOCAB).toArray(), 50), e -> {
                if (e instanceof GenerationEvent.Token) {
                    throw new AssertionError("a listener's own check failed");
                }
            });
            Events other = new Events();
            int[] prompt = r.ints(20, 0, TinyModels.VOCAB).toArray();
            engine.submit(greedy(prompt, 10), other.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, other.end());
            assertEquals(10, other.ids().length);
            Events after = new Events();
            engine.submit(greedy(prompt, 3), after.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, after.end(), "the engine goes on");
        }
    }

    /**
     * A request that must wait for pages keeps its cached prefix: while another request runs and evicting cannot make
     * room, nothing is evicted (the queue's head used to empty the whole cache, its own match too, on every step it
     * waited), and once the other is done its entry makes way and the request forks its prefix.
     */
    @Test
    void aRequestWaitingForPagesKeepsItsCachedPrefix() throws Exception {
        Random r = new Random(SEED + 9);
        int pageTokens = 64;
        try (SequencePool pool = backend.newSequencePool(7 * pageTokens, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            assertEquals(pageTokens, pool.pageTokens());
            int[] turn1 = r.ints(150, 0, TinyModels.VOCAB).toArray();
            Events a = new Events();
            engine.submit(greedy(turn1, 20), a.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, a.end());
            int[] reply = a.ids();
            int held = turn1.length + reply.length - 1;
            // another request takes the rest of the pool for a long answer
            Events b = new Events();
            engine.submit(greedy(r.ints(10, 0, TinyModels.VOCAB).toArray(), 230), b.queue::add);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (engine.stats().running() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            int[] turn2 = Arrays.copyOf(turn1, turn1.length + reply.length + 11);
            System.arraycopy(reply, 0, turn2, turn1.length, reply.length);
            Events c = new Events();
            engine.submit(greedy(turn2, 20), c.queue::add);
            assertInstanceOf(GenerationEvent.Finished.class, b.end());
            assertInstanceOf(GenerationEvent.Finished.class, c.end());
            assertEquals(held, c.started.cachedTokens(), "seed " + SEED);
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), engine.stats().freePages(), "no page leaked");
        }
    }

    /**
     * The prompt pages kept for a running request free nothing when evicted (the request holds them too): a request
     * waiting for pages meanwhile leaves that entry alone instead of emptying the cache for no room.
     */
    @Test
    void aWaitingRequestDoesNotEvictWhatFreesNoPage() throws Exception {
        Random r = new Random(SEED + 13);
        int pageTokens = 64;
        try (SequencePool pool = backend.newSequencePool(7 * pageTokens, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            Events a = new Events();
            // three whole prompt pages, kept in the cache as soon as they are read (shared with a), and a fourth for
            // the answer: four of seven pages
            engine.submit(greedy(r.ints(3 * pageTokens, 0, TinyModels.VOCAB).toArray(), 50), a.queue::add);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
            while (engine.stats().cachedPrefixes() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            assertEquals(1, engine.stats().cachedPrefixes(), "a's prompt pages kept");
            // a whole context (four pages) does not fit beside a: it waits
            Events b = new Events();
            engine.submit(greedy(r.ints(10, 0, TinyModels.VOCAB).toArray(), CTX - 10), b.queue::add);
            while (engine.stats().waiting() == 0 && engine.stats().generatedTokens() < 50
                    && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            long steps = engine.stats().steps();
            while (engine.stats().steps() < steps + 3 && engine.stats().running() == 1
                    && System.nanoTime() < deadline) {
                Thread.sleep(1);
            }
            if (engine.stats().waiting() == 1) {   // b still waiting: a is still running, its entry must be there
                assertEquals(1, engine.stats().cachedPrefixes(), "the entry that frees nothing is kept");
            }
            assertInstanceOf(GenerationEvent.Finished.class, a.end());
            assertInstanceOf(GenerationEvent.Finished.class, b.end());
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), engine.stats().freePages(), "no page leaked");
        }
    }

    @Test
    void cancelledRequestFreesItsSequenceAndOthersGoOn() throws Exception {
        Random r = new Random(SEED + 2);
        try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 8, true))) {
            Events longOne = new Events();
            Events other = new Events();
            Generation g = engine.submit(greedy(r.ints(20, 0, TinyModels.VOCAB).toArray(), 200), longOne.queue::add);
            engine.submit(greedy(r.ints(20, 0, TinyModels.VOCAB).toArray(), 30), other.queue::add);
            while (longOne.tokens.size() < 3) {
                GenerationEvent e = longOne.queue.poll(30, TimeUnit.SECONDS);
                assertNotNull(e);
                if (e instanceof GenerationEvent.Token t) {
                    longOne.tokens.add(t.id());
                }
            }
            g.cancel();
            GenerationEvent.Finished f = assertInstanceOf(GenerationEvent.Finished.class, longOne.end());
            assertEquals(FinishReason.CANCELLED, f.reason());
            assertTrue(f.generatedTokens() < 200);
            GenerationEvent.Finished o = assertInstanceOf(GenerationEvent.Finished.class, other.end());
            assertEquals(30, o.generatedTokens());
            engine.clearPrefixCache();
            assertEquals(pool.totalPages(), pool.freePages(), "no page leaked");
        }
    }

    @Test
    void fullQueueAndTooLongPromptAreRefusedWithReasons() throws Exception {
        Random r = new Random(SEED + 3);
        try (SequencePool pool = backend.newSequencePool(CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, CHUNK, 1, false))) {
            ContextFullException tooLong = assertThrows(ContextFullException.class,
                    () -> engine.submit(greedy(new int[CTX], 1), e -> { }));
            assertTrue(tooLong.getMessage().contains(CTX + " tokens") && tooLong.getMessage().contains("holds " + CTX),
                    tooLong.getMessage());
            assertThrows(IllegalArgumentException.class,
                    () -> engine.submit(greedy(new int[] {1, TinyModels.VOCAB}, 1), e -> { }));
            Events a = new Events();
            Events b = new Events();
            Generation ga = engine.submit(greedy(r.ints(8, 0, TinyModels.VOCAB).toArray(), 100), a.queue::add);
            Generation gb = engine.submit(greedy(r.ints(8, 0, TinyModels.VOCAB).toArray(), 100), b.queue::add);
            EngineBusyException busy = assertThrows(EngineBusyException.class,
                    () -> engine.submit(greedy(new int[] {1, 2}, 1), e -> { }));
            assertTrue(busy.getMessage().contains("queued"), busy.getMessage());
            // a cancelled request stops holding its place at once, before the engine frees it at its next step (a
            // client that ends a stream on a stop string and sends the next request straight away is not refused)
            gb.cancel();
            Events c = new Events();
            Generation gc = engine.submit(greedy(new int[] {1, 2}, 1), c.queue::add);
            assertThrows(EngineBusyException.class, () -> engine.submit(greedy(new int[] {3, 4}, 1), e -> { }));
            ga.cancel();
            a.end();
            b.end();
            c.end();
            assertTrue(gc.id() > gb.id());
        }
    }

    /** Banned tokens (a request that ignores end-of-generation tokens bans them) are never generated. */
    @Test
    void bannedTokensAreNeverGeneratedEvenGreedily() throws Exception {
        Random r = new Random(SEED + 9);
        int[] prompt = r.ints(12, 0, TinyModels.VOCAB).toArray();
        try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 4, false))) {
            Events free = new Events();
            engine.submit(greedy(prompt, 24), free.queue::add);
            free.end();
            int[] chosen = free.ids();
            java.util.Set<Integer> ban = new java.util.HashSet<>();
            for (int i = 0; i < 4; i++) {
                ban.add(chosen[i]);   // what greedy picks first, and then
            }
            Events banned = new Events();
            engine.submit(new GenerationRequest(prompt, 24, SamplerConfig.greedy(), null, ban::contains),
                    banned.queue::add);
            banned.end();
            assertEquals(24, banned.ids().length);
            for (int t : banned.ids()) {
                assertFalse(ban.contains(t), "banned token " + t + " generated: " + Arrays.toString(banned.ids()));
            }
        }
    }

    @Test
    void shutdownFailsWhatIsStillRunningAtTheDeadline() throws Exception {
        Random r = new Random(SEED + 4);
        try (SequencePool pool = backend.newSequencePool(2 * CTX, F16, F16)) {
            Engine engine = new Engine(backend, pool, new EngineConfig(1, CTX, CHUNK, 4, true));
            Events running = new Events();
            Events queued = new Events();
            engine.submit(greedy(r.ints(8, 0, TinyModels.VOCAB).toArray(), 240), running.queue::add);
            engine.submit(greedy(r.ints(8, 0, TinyModels.VOCAB).toArray(), 240), queued.queue::add);
            // no grace: whatever has not ended by now fails (with any grace a fast machine may finish both)
            assertTrue(engine.shutdown(Duration.ZERO), "engine thread ended");
            assertThrows(EngineBusyException.class, () -> engine.submit(greedy(new int[] {1, 2}, 1), e -> { }));
            GenerationEvent.Failed f = assertInstanceOf(GenerationEvent.Failed.class, queued.end());
            assertTrue(f.shuttingDown());
            running.end();
            assertEquals(pool.totalPages(), pool.freePages(), "shutdown returned every page");
        }
    }

    @Test
    void requestsThatDoNotFitThePoolWaitForPagesInsteadOfFailing() throws Exception {
        Random r = new Random(SEED + 5);
        // Room for one full context: the second request waits until the first ends.
        try (SequencePool pool = backend.newSequencePool(CTX, F16, F16);
             Engine engine = new Engine(backend, pool, new EngineConfig(2, CTX, CHUNK, 4, false))) {
            Events a = new Events();
            Events b = new Events();
            engine.submit(greedy(r.ints(100, 0, TinyModels.VOCAB).toArray(), 100), a.queue::add);
            engine.submit(greedy(r.ints(100, 0, TinyModels.VOCAB).toArray(), 100), b.queue::add);
            assertEquals(100, assertInstanceOf(GenerationEvent.Finished.class, a.end()).generatedTokens());
            assertEquals(100, assertInstanceOf(GenerationEvent.Finished.class, b.end()).generatedTokens());
            assertEquals(pool.totalPages(), pool.freePages());
        }
    }
}
