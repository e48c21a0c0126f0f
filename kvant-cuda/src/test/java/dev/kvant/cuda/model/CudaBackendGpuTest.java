package dev.kvant.cuda.model;

import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.CpuBackend;
import dev.kvant.backend.PendingDecode;
import dev.kvant.cuda.Cuda;
import dev.kvant.cuda.CudaAvailability;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.TestSeed;
import dev.kvant.engine.ContextFullException;
import dev.kvant.engine.Session;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvCacheFullException;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.LlamaWeights;
import dev.kvant.model.ModelConfig;
import dev.kvant.model.Rope;
import dev.kvant.model.SyntheticModel;
import dev.kvant.sample.Sampler;
import dev.kvant.sample.SamplerConfig;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.EnumSource;
import org.junit.jupiter.params.provider.MethodSource;

import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The whole model on the GPU against the CPU backend (itself checked against a float64 forward pass): every weight
 * format, the three architectures, prefill in chunks and decode; batched decode against single decode bit for bit.
 */
@Tag("gpu")
class CudaBackendGpuTest {
    private static final KvFormat F16 = KvFormat.parse("f16");
    private static final KvFormat TURBO3 = KvFormat.parse("turbo3");
    private static Parallel pool;

    @BeforeAll
    static void openPool() {
        pool = new Parallel(Math.min(8, Runtime.getRuntime().availableProcessors()));
    }

    @AfterAll
    static void closePool() {
        pool.close();
    }

    @BeforeEach
    void requireGpu() {
        CudaAvailability a = Cuda.available();
        Assumptions.assumeTrue(a.ok(), () -> "no CUDA GPU: " + a.reason());
    }

    static Stream<Arguments> shapesAndFormats() {
        Stream.Builder<Arguments> b = Stream.builder();
        for (GgmlType t : new GgmlType[] {GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q8_0, GgmlType.Q4_0,
                GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K}) {
            b.add(Arguments.of("tiny", t));
        }
        b.add(Arguments.of("tiny-qwen2", GgmlType.Q8_0));
        b.add(Arguments.of("tiny-qwen3", GgmlType.Q4_K));
        return b.build();
    }

    /**
     * Overlapped launches (each kernel placed while its predecessor finishes, then waiting for it on the device)
     * must change nothing: a prompt in two prefill chunks and 30 decode steps, Q4_0 weights (8-bit vector
     * products), centered turbo3 keys (page means) and turbo3 values, give the same logits and the same cache bytes
     * with no overlap, with the decode step's (the default) and with every launch overlapped.
     */
    @Test
    void overlappedLaunchesGiveThePlainLaunchesBits() {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.Q4_0, seed)) {
            List<float[]> plain = overlapRun(model, CudaContext.LaunchOverlap.NONE, seed);
            for (CudaContext.LaunchOverlap mode : List.of(CudaContext.LaunchOverlap.MARKED,
                    CudaContext.LaunchOverlap.ALL)) {
                List<float[]> got = overlapRun(model, mode, seed);
                for (int i = 0; i < plain.size(); i++) {
                    String what = i < 31 ? "logits of step " + i : "keys of layer " + (i - 31);
                    assertArrayEquals(plain.get(i), got.get(i), mode + ": " + what + " differ (seed " + seed + ")");
                }
            }
        }
    }

    /** Logits after the prompt and after each of 30 decode steps, then every layer's K pool (as floats of bits). */
    private static List<float[]> overlapRun(LlamaModel model, CudaContext.LaunchOverlap mode, long seed) {
        SplittableRandom r = new SplittableRandom(seed);
        List<float[]> out = new java.util.ArrayList<>();
        try (CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, 64, 0))) {
            gpu.setLaunchOverlap(mode);
            int vocab = model.config().vocabSize();
            int[] prompt = r.ints(100, 0, vocab).toArray();
            try (BackendSequence g = gpu.newSequence(256, KvFormat.parse("turbo3+mean"), KvFormat.parse("turbo3"))) {
                float[] logits = new float[vocab];
                g.forward(prompt, 0, 64, false, logits);
                g.forward(prompt, 64, 36, false, logits);
                out.add(logits.clone());
                for (int step = 0; step < 30; step++) {
                    g.forward(new int[] {r.nextInt(vocab)}, 0, 1, false, logits);
                    out.add(logits.clone());
                }
                CudaBackend.Sequence gs = (CudaBackend.Sequence) g;
                KvPool.Part part = gs.pool().parts().get(0);
                try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
                    for (int l = 0; l < model.config().layers(); l++) {
                        java.lang.foreign.MemorySegment dev = arena.allocate(part.cache().kPool(l).byteSize(), 4);
                        part.cache().downloadK(l, dev);
                        out.add(dev.toArray(java.lang.foreign.ValueLayout.JAVA_FLOAT));
                    }
                }
            }
        }
        return out;
    }

    /**
     * A server's greedy request gives the same tokens whatever its engine holds cached: the same prompt twice, and a
     * conversation's next turn, against a fresh engine without a prefix cache. On the GPU a row's bits depend on how
     * it was computed (a prompt chunk's GEMM, chosen by the chunk's length, or a decode step's product), so the engine
     * reuses whole prompt chunks only ({@code forksKeepBits} false; reusing any prefix, a review saw greedy outputs
     * change with Q8_0 weights and a turbo3 cache): both requests after the first fork its four whole chunks.
     */
    @Test
    void greedyRequestsGiveTheSameTokensWhateverTheEngineHasCached() throws Exception {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.Q8_0, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, 64, 0))) {
            int vocab = model.config().vocabSize();
            SplittableRandom r = new SplittableRandom(seed);
            int[] turn1 = r.ints(300, 0, vocab).toArray();
            int[] first;
            int[] again;
            int[] turn2;
            int[] second;
            try (dev.kvant.backend.SequencePool pool = gpu.newSequencePool(4096, F16, TURBO3);
                 dev.kvant.engine.Engine engine = new dev.kvant.engine.Engine(gpu, pool,
                         new dev.kvant.engine.EngineConfig(4, 1024, 64, 8, true))) {
                assertEquals(64, engine.prefixReuseStep());
                first = greedyTokens(engine, turn1, 16);
                again = greedyTokens(engine, turn1, 16);
                turn2 = java.util.stream.IntStream.concat(java.util.stream.IntStream.concat(Arrays.stream(turn1),
                        Arrays.stream(first)), r.ints(40, 0, vocab)).toArray();
                second = greedyTokens(engine, turn2, 16);
                assertEquals(2, engine.stats().prefixHits());
                assertEquals(2 * 256, engine.stats().cachedTokens());
            }
            try (dev.kvant.backend.SequencePool pool = gpu.newSequencePool(4096, F16, TURBO3);
                 dev.kvant.engine.Engine fresh = new dev.kvant.engine.Engine(gpu, pool,
                         new dev.kvant.engine.EngineConfig(4, 1024, 64, 8, false))) {
                assertArrayEquals(first, again, "the same prompt twice (seed " + seed + ")");
                assertArrayEquals(greedyTokens(fresh, turn2, 16), second, "the next turn (seed " + seed + ")");
            }
        }
    }

    /**
     * Why the engine reuses whole prompt chunks on the GPU: a sequence forked at a chunk boundary, the rest of the
     * prompt read in chunks from there, gives the logits of the prompt read afresh bit for bit — its chunks' products
     * (cuBLASLt for chunks of 128, the dequantizing products for the last 7 tokens) and attention are the fresh
     * computation's — for quantized and f16 weights, plain, rotated and centered caches; what the parent wrote past the
     * fork (a shorter chunk, decode steps) is not taken.
     */
    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"Q4_0", "Q8_0", "F16"})
    void aForkAtAWholePromptChunkGivesTheFreshLogitsBitForBit(GgmlType weights) {
        long seed = TestSeed.next();
        int chunk = 128;
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), weights, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, chunk, 0))) {
            int vocab = model.config().vocabSize();
            int[] prompt = new SplittableRandom(seed).ints(4 * chunk + 7, 0, vocab).toArray();
            for (String[] kv : new String[][] {{"f16", "f16"}, {"turbo3", "turbo3"}, {"turbo3+mean", "turbo3"},
                    {"q8_0", "turbo3"}}) {
                try (dev.kvant.backend.SequencePool pool = gpu.newSequencePool(4096, KvFormat.parse(kv[0]),
                        KvFormat.parse(kv[1]));
                     BackendSequence fresh = pool.newSequence(1024);
                     BackendSequence parent = pool.newSequence(1024)) {
                    float[] expected = readInChunks(fresh, prompt, 0, chunk, vocab);
                    readInChunks(parent, Arrays.copyOf(prompt, 2 * chunk + 5), 0, chunk, vocab);
                    float[] logits = new float[vocab];
                    for (int t = 0; t < 3; t++) {   // decode steps past the fork
                        parent.forward(new int[] {t + 1}, 0, 1, false, logits);
                    }
                    try (BackendSequence child = pool.fork(parent, 2 * chunk, 1024)) {
                        float[] got = readInChunks(child, prompt, 2 * chunk, chunk, vocab);
                        for (int i = 0; i < vocab; i++) {
                            if (Float.floatToRawIntBits(got[i]) != Float.floatToRawIntBits(expected[i])) {
                                throw new AssertionError(weights + " " + kv[0] + "/" + kv[1] + ": logit " + i + " "
                                        + got[i] + " forked, " + expected[i] + " afresh (seed " + seed + ")");
                            }
                        }
                    }
                }
            }
        }
    }

    /**
     * A session's sampled decode steps draw on the device where the sampler allows it ({@code Session.decodeSampled},
     * what {@code kvant run} and {@code chat} generate through): with top-k 1 every draw is the largest logit, so the
     * tokens are greedy's, bit for bit; with the CLI's defaults (top-k 40, top-p 0.95, min-p 0.05) a seed gives the
     * same tokens twice; greedy with repetition penalties (penalized on the device) gives the tokens of the host
     * sampler's penalized argmax over the same logits copied out.
     */
    @Test
    void aSessionsSampledStepsDrawOnTheDevice() {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.Q8_0, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(1, 64, 0))) {
            int vocab = model.config().vocabSize();
            int[] prompt = new SplittableRandom(seed).ints(100, 0, vocab).toArray();
            SamplerConfig topOne = new SamplerConfig(0.8f, 1, 1f, 0f, 1f, 64, seed);
            SamplerConfig defaults = SamplerConfig.defaults(seed);
            assertTrue(new Sampler(topOne).drawsWhereTheModelRuns(vocab)
                    && new Sampler(defaults).drawsWhereTheModelRuns(vocab));
            assertArrayEquals(sessionTokens(gpu, prompt, SamplerConfig.greedy()), sessionTokens(gpu, prompt, topOne),
                    "top-k 1 against greedy (seed " + seed + ")");
            assertArrayEquals(sessionTokens(gpu, prompt, defaults), sessionTokens(gpu, prompt, defaults),
                    "the same seed twice (seed " + seed + ")");
            SamplerConfig penalized = new SamplerConfig(0f, 0, 1f, 0f, 1.5f, 64, 0.2f, 0.3f, seed);
            assertTrue(new Sampler(penalized).drawsWhereTheModelRuns(vocab));
            int[] device = sessionTokens(gpu, prompt, penalized);
            Sampler host = new Sampler(penalized);
            for (int t : prompt) {
                host.accept(t);
            }
            try (Session s = new Session(gpu, 512, KvLayerFormats.of(KvFormat.parse("turbo3"),
                    KvFormat.parse("turbo3")), 64)) {
                int next = host.sample(s.prefill(prompt), vocab);
                for (int i = 0; i < device.length; i++) {
                    assertEquals(next, device[i], "token " + i + " of greedy with penalties (seed " + seed + ")");
                    host.accept(next);
                    if (i + 1 < device.length) {
                        next = host.sample(s.decode(next), vocab);
                    }
                }
            }
        }
    }

    /**
     * 40 tokens after prompt on a fresh turbo3 session of gpu, chosen as config says, the sampler seeing the prompt
     * and each token (a penalty's window, as Generator keeps it).
     */
    private static int[] sessionTokens(CudaBackend gpu, int[] prompt, SamplerConfig config) {
        Sampler sampler = new Sampler(config);
        for (int t : prompt) {
            sampler.accept(t);
        }
        try (Session s = new Session(gpu, 512, KvLayerFormats.of(KvFormat.parse("turbo3"), KvFormat.parse("turbo3")),
                64)) {
            int[] out = new int[40];
            out[0] = s.prefillSampled(prompt, sampler);
            sampler.accept(out[0]);
            for (int i = 1; i < out.length; i++) {
                out[i] = s.decodeSampled(out[i - 1], sampler);
                sampler.accept(out[i]);
            }
            return out;
        }
    }

    /** Reads prompt[from..) into seq in pieces of chunk tokens; the last token's logits. */
    private static float[] readInChunks(BackendSequence seq, int[] prompt, int from, int chunk, int vocab) {
        float[] logits = new float[vocab];
        for (int off = from; off < prompt.length; off += chunk) {
            seq.forward(prompt, off, Math.min(chunk, prompt.length - off), false, logits);
        }
        return logits;
    }

    /**
     * Sampled requests are drawn on the device ({@code startDecodeDrawn}: one id a sequence comes back), at a
     * temperature alone or with the CLI's top-k 40, top-p 0.95 and min-p 0.05: each gets the same tokens in a batch of
     * four as on an engine of one slot, and again the second time — one of them with a repetition penalty, applied on
     * the device too; and a request with a penalty over a longer window, drawn on the host from the copied logits, is
     * served beside them.
     */
    @Test
    void sampledRequestsDrawnOnTheDeviceGiveTheSameTokensBatchedOrAlone() throws Exception {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.Q8_0, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, 64, 0))) {
            assertTrue(gpu.drawsWhereItRuns());
            int vocab = model.config().vocabSize();
            SplittableRandom r = new SplittableRandom(seed);
            dev.kvant.engine.GenerationRequest[] requests = new dev.kvant.engine.GenerationRequest[5];
            for (int i = 0; i < requests.length; i++) {
                dev.kvant.sample.SamplerConfig sampling = i == 2 ? dev.kvant.sample.SamplerConfig.defaults(seed + i)
                        : new dev.kvant.sample.SamplerConfig(0.6f + 0.2f * i, 0, 1f, 0f, i >= 3 ? 1.3f : 1f,
                        i == 4 ? 100 : 64, seed + i);
                requests[i] = new dev.kvant.engine.GenerationRequest(r.ints(20 + 37 * i, 0, vocab).toArray(), 24,
                        sampling, null);
            }
            int[][] together = new int[requests.length][];
            try (dev.kvant.backend.SequencePool pool = gpu.newSequencePool(4096, F16, TURBO3);
                 dev.kvant.engine.Engine engine = new dev.kvant.engine.Engine(gpu, pool,
                         new dev.kvant.engine.EngineConfig(4, 1024, 64, 8, false))) {
                List<java.util.concurrent.BlockingQueue<dev.kvant.engine.GenerationEvent>> events =
                        new java.util.ArrayList<>();
                for (var q : requests) {
                    var e = new java.util.concurrent.LinkedBlockingQueue<dev.kvant.engine.GenerationEvent>();
                    engine.submit(q, e::add);
                    events.add(e);
                }
                for (int i = 0; i < requests.length; i++) {
                    together[i] = tokensOf(events.get(i));
                }
                assertTrue(engine.stats().decodeRows() > engine.stats().decodeSteps(), "batched steps");
            }
            try (dev.kvant.backend.SequencePool pool = gpu.newSequencePool(4096, F16, TURBO3);
                 dev.kvant.engine.Engine engine = new dev.kvant.engine.Engine(gpu, pool,
                         new dev.kvant.engine.EngineConfig(1, 1024, 64, 8, false))) {
                for (int i = 0; i < requests.length; i++) {
                    for (int round = 0; round < 2; round++) {
                        var e = new java.util.concurrent.LinkedBlockingQueue<dev.kvant.engine.GenerationEvent>();
                        engine.submit(requests[i], e::add);
                        assertArrayEquals(together[i], tokensOf(e), "request " + i + ", round " + round + " (seed "
                                + seed + ")");
                    }
                }
            }
            assertEquals(24, together[0].length);
        }
    }

    /** The tokens of one request's events, once it has finished. */
    private static int[] tokensOf(java.util.concurrent.BlockingQueue<dev.kvant.engine.GenerationEvent> events)
            throws InterruptedException {
        List<Integer> tokens = new java.util.ArrayList<>();
        while (true) {
            var e = events.poll(120, java.util.concurrent.TimeUnit.SECONDS);
            assertTrue(e != null, "no event within 120 s");
            switch (e) {
                case dev.kvant.engine.GenerationEvent.Token t -> tokens.add(t.id());
                case dev.kvant.engine.GenerationEvent.Finished f -> {
                    return tokens.stream().mapToInt(Integer::intValue).toArray();
                }
                case dev.kvant.engine.GenerationEvent.Failed f -> throw new AssertionError(f.message());
                default -> { }
            }
        }
    }

    /** The tokens of one greedy request, run alone on the engine. */
    private static int[] greedyTokens(dev.kvant.engine.Engine engine, int[] prompt, int n) throws Exception {
        var events = new java.util.concurrent.LinkedBlockingQueue<dev.kvant.engine.GenerationEvent>();
        engine.submit(new dev.kvant.engine.GenerationRequest(prompt, n, dev.kvant.sample.SamplerConfig.greedy(), null),
                events::add);
        return tokensOf(events);
    }

    /**
     * A model whose output is its embedding table (no output.weight, as Llama 3.2 1B) holds the table once on the
     * device — the weights' bytes those of the model with a separate output, less one table — and gives the CPU's
     * logits through it, from the embedding lookup to the output product.
     */
    @Test
    void aTiedEmbeddingTableIsUploadedOnceAndServesBothEnds() {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.Q8_0, seed)) {
            LlamaWeights w = model.weights();
            LlamaModel tied = new LlamaModel("tied " + model.name(), model.config(), new LlamaWeights(
                    w.tokenEmbedding(), w.outputNorm(), w.tokenEmbedding(), w.layers(), w.ropeFreqFactors()), null,
                    () -> { });
            int layers = model.config().layers();
            long table = w.tokenEmbedding().data().byteSize();
            assertEquals(CudaBackend.stageWeightBytes(model, 0, layers) - table,
                    CudaBackend.stageWeightBytes(tied, 0, layers), "planned bytes");
            long untiedBytes;
            try (CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, 64, 0))) {
                untiedBytes = gpu.weightBytes();
            }
            try (CudaBackend gpu = CudaBackend.open(tied, new CudaBackend.Options(4, 64, 0))) {
                assertEquals(untiedBytes - table, gpu.weightBytes(), "device bytes");
                assertEquals(gpu.weightBytes(), gpu.weightBytesPerToken(), "a step reads the table as the output");
            }
            matchCpu(tied, "tiny Q8_0 tied", seed, 100, 4, 1e-3);
        }
    }

    /**
     * A 100-token prompt in chunks of 64 (tensor-core GEMMs, f16 operands; for quantized weights chunks of at most
     * {@link Projection#FUSED_GEMM_TOKENS} tokens, so the dequantizing products) and four decode steps (f32
     * matrix-vector kernels) give the CPU's logits: NMSE below 1e-4 for prefill rows, 1e-5 for decode steps (whose
     * attention reads the K/V rows the prefill wrote, so they inherit its f16 rounding; measured about 1e-6), 1e-3 for
     * decode with quantized weights, whose products read 8-bit vectors.
     */
    @ParameterizedTest(name = "{0} {1}")
    @MethodSource("shapesAndFormats")
    void logitsMatchTheCpuBackend(String shape, GgmlType type) {
        long seed = TestSeed.next();
        boolean q8Vectors = type != GgmlType.F32 && type != GgmlType.F16 && type != GgmlType.BF16;
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse(shape), type, seed)) {
            matchCpu(model, shape + " " + type, seed, 100, 4, q8Vectors ? 1e-3 : 1e-5);
        }
    }

    /**
     * Shapes of real models that the tiny ones leave out, through the same comparison with the CPU: a Qwen2.5-0.5B
     * layout (a residual of 896, not a multiple of 256; 14 heads of 64 over 2 kv heads; biases; NEOX RoPE with a
     * linear scale of 2) and a Llama layout whose query width is not the residual's (6 heads of 128 keys over a
     * residual of 512), whose value heads are half its key heads (64) and whose RoPE has Llama 3's frequency
     * factors; both with a vocabulary of 4,099 (no multiple of anything).
     */
    @ParameterizedTest(name = "{0} {1}")
    @MethodSource("realShapes")
    void realModelShapesMatchTheCpuBackend(String shape, GgmlType type) {
        long seed = TestSeed.next();
        ModelConfig c = switch (shape) {
            case "qwen2.5-0.5b-like" -> new ModelConfig("qwen2", 896, 2, 14, 2, 64, 64, 4864, 4099, 8192, 1e-6f,
                    new Rope(Rope.Mode.NEOX, 64, 1000000f, 2f, null), true, false);
            case "llama-wide-q" -> {
                float[] factors = new float[64];
                for (int i = 0; i < factors.length; i++) {
                    factors[i] = 1f + 7f * i / (factors.length - 1);   // 1 (fast pairs) .. 8 (slow ones)
                }
                yield new ModelConfig("llama", 512, 2, 6, 2, 128, 64, 1536, 4099, 8192, 1e-5f,
                        new Rope(Rope.Mode.NORMAL, 128, 500000f, 1f, factors), false, false);
            }
            default -> throw new IllegalArgumentException(shape);
        };
        boolean q8Vectors = type != GgmlType.F32 && type != GgmlType.F16 && type != GgmlType.BF16;
        try (LlamaModel model = SyntheticModel.build(shape + " " + type, c, type, seed, false)) {
            matchCpu(model, shape + " " + type, seed, 100, 4, q8Vectors ? 1e-3 : 1e-5);
        }
    }

    static Stream<Arguments> realShapes() {
        return Stream.of(Arguments.of("qwen2.5-0.5b-like", GgmlType.Q8_0), Arguments.of("qwen2.5-0.5b-like",
                GgmlType.Q4_0), Arguments.of("llama-wide-q", GgmlType.F16), Arguments.of("llama-wide-q",
                GgmlType.Q8_0));
    }

    /**
     * Quantized weights, the prompt in one chunk of 100 tokens: past {@link Projection#FUSED_GEMM_TOKENS}, so the
     * weights go to f16 for cuBLASLt (the test above takes the dequantizing products); the CPU's logits as above.
     */
    @ParameterizedTest
    @EnumSource(value = GgmlType.class, names = {"Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"})
    void quantizedWeightsInLongChunksMatchTheCpuBackend(GgmlType type) {
        long seed = TestSeed.next();
        assertTrue(100 > Projection.FUSED_GEMM_TOKENS, "the chunk must be past the dequantizing products");
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), type, seed)) {
            matchCpu(model, "tiny " + type + " one chunk of 100", seed, 100, 4, F16, F16, 1e-4, 1e-3, 128);
        }
    }

    /**
     * A prompt of promptTokens in chunks of 64 and then decodeSteps single tokens, on the GPU and on the CPU: prefill
     * logits within NMSE 1e-4, each decode step's within decodeBound.
     */
    private static void matchCpu(LlamaModel model, String what, long seed, int promptTokens, int decodeSteps,
                                 double decodeBound) {
        matchCpu(model, what, seed, promptTokens, decodeSteps, F16, F16, 1e-4, decodeBound);
    }

    private static void matchCpu(LlamaModel model, String what, long seed, int promptTokens, int decodeSteps,
                                 KvFormat kFormat, KvFormat vFormat, double prefillBound, double decodeBound) {
        matchCpu(model, what, seed, promptTokens, decodeSteps, kFormat, vFormat, prefillBound, decodeBound, 64);
    }

    private static void matchCpu(LlamaModel model, String what, long seed, int promptTokens, int decodeSteps,
                                 KvFormat kFormat, KvFormat vFormat, double prefillBound, double decodeBound,
                                 int maxPrefill) {
        matchCpu(model, what, seed, promptTokens, decodeSteps, KvLayerFormats.of(kFormat, vFormat), prefillBound,
                decodeBound, maxPrefill);
    }

    private static void matchCpu(LlamaModel model, String what, long seed, int promptTokens, int decodeSteps,
                                 KvLayerFormats formats, double prefillBound, double decodeBound, int maxPrefill) {
        SplittableRandom r = new SplittableRandom(seed);
        try (CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, maxPrefill, 0))) {
            CpuBackend cpu = new CpuBackend(model, pool);
            int vocab = model.config().vocabSize();
            int[] prompt = r.ints(promptTokens, 0, vocab).toArray();
            try (BackendSequence g = gpu.newSequence(256, formats);
                 BackendSequence c = cpu.newSequence(256, formats)) {
                float[] gl = poisoned(prompt.length * vocab);
                float[] cl = new float[prompt.length * vocab];
                g.forward(prompt, 0, prompt.length, true, gl);
                c.forward(prompt, 0, prompt.length, true, cl);
                double e = nmse(gl, cl);
                assertTrue(e < prefillBound, what + " prefill NMSE " + e + " (seed " + seed + ")");
                for (int step = 0; step < decodeSteps; step++) {
                    int[] t = {r.nextInt(vocab)};
                    float[] gd = poisoned(vocab);
                    float[] cd = new float[vocab];
                    g.forward(t, 0, 1, false, gd);
                    c.forward(t, 0, 1, false, cd);
                    double ed = nmse(gd, cd);
                    assertTrue(ed < decodeBound, what + " decode step " + step + " NMSE " + ed + " (seed " + seed
                            + ")");
                }
                assertEquals(promptTokens + decodeSteps, g.length());
            }
        }
    }

    /**
     * Keys centered on their page's mean (turbo3+mean): a 100-token prompt (a whole page, then 36 rows: own means)
     * and 40 decode steps (the one at position 128 opens a page with the previous page's mean) follow the CPU. The
     * backends' K rows differ in their last bits (f16 GEMMs), which can move a 3-bit code, hence the looser bounds:
     * a few moved codes of the random tiny model cost up to about 1.5e-2 (prefill rows, seed -9046947068963699815),
     * where a wrong centering rule misses by the size of the keys themselves (NMSE of order 1).
     */
    @Test
    void centeredKeysFollowTheCpu() {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.F16, seed)) {
            matchCpu(model, "tiny F16 turbo3+mean/turbo3", seed, 100, 40, KvFormat.parse("turbo3+mean"),
                    KvFormat.parse("turbo3"), 5e-2, 5e-2);
        }
    }

    /**
     * Layers of their own (--ctk-layer/--ctv-layer): the tiny model's first layer in q8_0/f16, its last in
     * turbo3+mean/q8_0, the others turbo3/turbo3 — three attention modules over one page numbering — follow the CPU
     * as closely as the centered keys alone do (the bounds of centeredKeysFollowTheCpu).
     */
    @Test
    void layersOfTheirOwnFollowTheCpu() {
        long seed = TestSeed.next();
        KvFormat turbo3 = KvFormat.parse("turbo3");
        KvFormat q8 = KvFormat.parse("q8_0");
        KvLayerFormats formats = KvLayerFormats.of(turbo3, turbo3).withK(0, q8).withV(0, F16)
                .withK(-1, KvFormat.parse("turbo3+mean")).withV(-1, q8);
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.F16, seed)) {
            matchCpu(model, "tiny F16 " + formats.name(), seed, 100, 40, formats, 5e-2, 5e-2, 64);
        }
    }

    /**
     * The page means the device gives a prompt's pages (its own rows; kvant_rope_split's prevPages = -1 / -2) and
     * a page a decode step opens (the previous page's keys: prevPages = that page) are the CPU's: equal to the fp16
     * rounding of the backends' slightly different K rows (NMSE below 1e-4 per page and head), where a wrong rule
     * (0, or a row's own key) would miss by the size of the mean itself.
     */
    @Test
    void pageMeansOfPromptAndDecodeAreTheCpus() {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        KvFormat k = KvFormat.parse("turbo3+mean");
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.parse("tiny"), GgmlType.F16, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, 64, 0))) {
            CpuBackend cpu = new CpuBackend(model, pool);
            int vocab = model.config().vocabSize();
            int[] prompt = r.ints(100, 0, vocab).toArray();
            try (BackendSequence g = gpu.newSequence(256, k, KvFormat.parse("turbo3"));
                 CpuBackend.Sequence c = cpu.newSequence(256, k, KvFormat.parse("turbo3"))) {
                float[] gl = new float[vocab];
                float[] cl = new float[vocab];
                // 64-token device steps: the prompt's second piece (36 rows) opens page 1 with its own rows
                g.forward(prompt, 0, 64, false, gl);
                g.forward(prompt, 64, 36, false, gl);
                c.forward(prompt, 0, 64, false, cl);
                c.forward(prompt, 64, 36, false, cl);
                for (int step = 0; step < 30; step++) {   // position 128 opens page 2
                    int[] t = {r.nextInt(vocab)};
                    g.forward(t, 0, 1, false, gl);
                    c.forward(t, 0, 1, false, cl);
                }
                CudaBackend.Sequence gs = (CudaBackend.Sequence) g;
                dev.kvant.kv.KvCache host = c.kv().cache();
                int kvHeads = model.config().kvHeads();
                int dom = k.domainDim(model.config().headDimK());
                KvPool.Part part = gs.pool().parts().get(0);
                try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
                    for (int l = 0; l < model.config().layers(); l++) {
                        java.lang.foreign.MemorySegment dev = arena.allocate(part.cache().kPool(l).byteSize());
                        part.cache().downloadK(l, dev);
                        for (int lp = 0; lp < 3; lp++) {
                            for (int h = 0; h < kvHeads; h++) {
                                float[] want = new float[dom];
                                host.keyMean(l, c.kv().page(lp), h, want, 0);
                                long at = gs.page(lp) * part.cache().kPageBytes(l) + host.kMeanOffset(h);
                                double num = 0, meanEnergy = 0;
                                for (int i = 0; i < dom; i++) {
                                    float got = Float.float16ToFloat(dev.get(java.lang.foreign.ValueLayout
                                            .JAVA_SHORT_UNALIGNED.withOrder(java.nio.ByteOrder.LITTLE_ENDIAN),
                                            at + 2L * i));
                                    num += (got - want[i]) * (double) (got - want[i]);
                                    meanEnergy += want[i] * (double) want[i];
                                }
                                assertTrue(meanEnergy > 0, "layer " + l + " page " + lp + " head " + h
                                        + ": the CPU's mean is 0 (seed " + seed + ")");
                                // against the energy of the page's keys (mean + centered rows): the scale the
                                // scores see. The mean of random rows is small, so against its own energy the
                                // device's rounding (earlier layers; decoded keys for a decode-opened page) shows
                                // up enlarged. Layer 0 (the same input rows up to the projection's rounding): 1e-4
                                // of the keys', 5e-3 of its own (a page opened by decode takes the previous page's
                                // decoded keys, so one turbo3 code that rounds the other way moves it: 1.29e-3 of its
                                // own, 6.8e-6 of the keys', at layer 0 page 2, seed -8619726752137282217); deeper
                                // layers, whose input drifts through the random model (measured up to 1.2e-3 of the
                                // keys' and 2.1e-3 of its own over eight seeds, 7.8e-3 and 1.4e-2 at seed
                                // -182622110713900267 with products rounded without FMAs): 2e-2 and 5e-2. A wrong
                                // mean (zero, one row) misses by about 1 of its own energy.
                                int rows = Math.min(64, 130 - 64 * lp);
                                double spread = 0;
                                float[] row = new float[model.config().headDimK()];
                                for (int t = 0; t < rows; t++) {
                                    PageMeanFormat.rows(k).decode(host.kPage(l, c.kv().page(lp)),
                                            host.kRowOffset(t, h), row.length, row, 0);
                                    for (float x : row) {
                                        spread += x * (double) x;
                                    }
                                }
                                double den = meanEnergy + spread / rows;
                                assertTrue(l == 0 ? num / den < 1e-4 && num / meanEnergy < 5e-3
                                        : num / den < 2e-2 && num / meanEnergy < 5e-2, "layer " + l
                                        + " page " + lp + " head " + h + ": mean error " + num / den + " of the keys' "
                                        + "energy, " + num / meanEnergy + " of the mean's (seed " + seed + ")");
                            }
                        }
                    }
                }
            }
        }
    }

    /**
     * A model whose projections mix formats, as quantized GGUF files do (Q4_K q/k with a Q8_0 v, a Q6_K up and
     * down): stacks split into parts of one format each, 8-bit and float products side by side in one layer.
     */
    @Test
    void mixedFormatProjectionsMatchTheCpuBackend() {
        long seed = TestSeed.next();
        try (LlamaModel k = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q4_K, seed);
             LlamaModel q8 = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, seed + 1);
             LlamaModel q6 = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q6_K, seed + 2)) {
            dev.kvant.model.LlamaWeights.Layer[] layers =
                    new dev.kvant.model.LlamaWeights.Layer[k.config().layers()];
            for (int l = 0; l < layers.length; l++) {
                var a = k.weights().layers()[l];
                layers[l] = new dev.kvant.model.LlamaWeights.Layer(a.attnNorm(), a.wq(), a.wk(),
                        q8.weights().layers()[l].wv(), a.wo(), null, null, null, null, null, a.ffnNorm(), a.wGate(),
                        q6.weights().layers()[l].wUp(), q6.weights().layers()[l].wDown());
            }
            var w = new dev.kvant.model.LlamaWeights(k.weights().tokenEmbedding(), k.weights().outputNorm(),
                    q8.weights().output(), layers, null);
            LlamaModel mixed = new LlamaModel("mixed", k.config(), w, null, () -> { });
            matchCpu(mixed, "mixed formats", seed, 80, 3, 1e-3);
        }
    }

    /**
     * Decode through a query-aware selection: with a budget that covers the context every list holds every block
     * and the logits are dense decode's bit for bit; with a budget of 64 tokens (one round, and two rounds over coarse
     * blocks of 64) the logits differ from dense (beyond rounding) and follow the CPU backend's selected decode step
     * by step (NMSE below 1e-3 in at least 90% of the steps: a block whose bound ties with the k-th best within
     * rounding may be chosen on one side only, as the CPU's and the device's K rows round to f16 apart now and then).
     */
    @Test
    void selectedDecodeFollowsTheCpuAndCoversDenseWhenTheBudgetDoes() {
        long seed = TestSeed.next();
        int steps = 150;
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.F32, seed)) {
            int vocab = model.config().vocabSize();
            int[] tokens = new SplittableRandom(seed).ints(steps, 0, vocab).toArray();
            float[][] dense = decodeSteps(model, null, tokens, true);
            float[][] wide = decodeSteps(model, new dev.kvant.select.SelectionConfig(4096, 16, 16, 16, 1), tokens,
                    true);
            for (int i = 0; i < steps; i++) {
                assertArrayEquals(dense[i], wide[i], "step " + i + ": a selection of every block must give dense"
                        + " decode's bits (seed " + seed + ")");
            }
            for (dev.kvant.select.SelectionConfig narrow : java.util.List.of(
                    new dev.kvant.select.SelectionConfig(64, 16, 16, 16, 1),
                    new dev.kvant.select.SelectionConfig(64, 16, 16, 16, 1, 64, 1))) {
                float[][] gpu = decodeSteps(model, narrow, tokens, true);
                float[][] cpu = decodeSteps(model, narrow, tokens, false);
                int close = 0;
                double differs = 0;
                for (int i = 0; i < steps; i++) {
                    assertTrue(allFinite(gpu[i]), "step " + i + " (seed " + seed + ")");
                    close += nmse(gpu[i], cpu[i]) < 1e-3 ? 1 : 0;
                    differs = Math.max(differs, nmse(gpu[i], dense[i]));
                }
                System.out.printf("selected decode (%s): %d of %d steps within NMSE 1e-3 of the CPU; largest NMSE"
                        + " against dense %.3e%n", narrow, close, steps, differs);
                assertTrue(close >= steps * 9 / 10, narrow + ": " + close + " of " + steps + " steps follow the CPU"
                        + " (seed " + seed + ")");
                // how far a 64-token budget moves the logits depends on the random model (2.7e-4 at seed
                // 7244613641271115911, 0.13-0.35 at four others); anything above rounding shows the lists bit
                assertTrue(differs > 1e-6, "a 64-token budget left the logits as dense ones (seed " + seed + ")");
            }
        }
    }

    /**
     * A random fill (bench's --depth-fill random) appends rows on every stage: the same seed gives the same next
     * logits, a fill past the context is refused without change, and a selected decode after it reads summaries
     * the fill kept (a list of every block gives dense decode's bits).
     */
    @Test
    void randomFillAppendsRowsAndKeepsSummaries() {
        long seed = TestSeed.next();
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.F32, seed)) {
            int vocab = model.config().vocabSize();
            float[][] out = new float[2][];
            for (int run = 0; run < 2; run++) {
                model.setSelection(run == 0 ? null : new dev.kvant.select.SelectionConfig(4096, 16, 16, 16, 1));
                try (CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(2, 64, 0));
                     BackendSequence s = gpu.newSequence(256, TURBO3, TURBO3)) {
                    s.fillRandom(200, 5);
                    assertEquals(200, s.length());
                    out[run] = poisoned(vocab);
                    s.forward(new int[] {7}, 0, 1, false, out[run]);
                    assertTrue(allFinite(out[run]), "seed " + seed);
                    assertThrows(dev.kvant.engine.ContextFullException.class, () -> s.fillRandom(56, 6));
                    assertEquals(201, s.length());
                } finally {
                    model.setSelection(null);
                }
            }
            assertArrayEquals(out[0], out[1], "seed " + seed);
        }
    }

    /** Logits after each token fed one decode step at a time, f16 cache, with the model's selection set. */
    private static float[][] decodeSteps(LlamaModel model, dev.kvant.select.SelectionConfig selection, int[] tokens,
                                         boolean onGpu) {
        model.setSelection(selection);
        int vocab = model.config().vocabSize();
        float[][] out = new float[tokens.length][];
        try (CudaBackend gpu = onGpu ? CudaBackend.open(model, new CudaBackend.Options(2, 64, 0)) : null) {
            dev.kvant.backend.Backend b = onGpu ? gpu : new CpuBackend(model, pool);
            try (BackendSequence s = b.newSequence(256, F16, F16)) {
                for (int i = 0; i < tokens.length; i++) {
                    out[i] = poisoned(vocab);
                    s.forward(tokens, i, 1, false, out[i]);
                }
            }
        } finally {
            model.setSelection(null);
        }
        return out;
    }

    /**
     * Batches of 8, 5 and 2 sequences (the eight-vector kernels) give each sequence's logits alone (the one-vector
     * kernels) bit for bit, for the formats read with 8-bit vectors (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) and with floats
     * (F16).
     */
    @ParameterizedTest
    @org.junit.jupiter.params.provider.EnumSource(value = GgmlType.class,
            names = {"Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16"})
    void batchedDecodeEqualsEachSequenceAloneBitForBitAndGreedyIsTheArgmax(GgmlType type) {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, type, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(8, 64, 0))) {
            int vocab = model.config().vocabSize();
            int[] lengths = {1, 70, 300, 5, 64, 129, 2, 33};
            int n = lengths.length;
            BackendSequence[] batch = new BackendSequence[n];
            BackendSequence[] alone = new BackendSequence[n];
            for (int i = 0; i < n; i++) {
                batch[i] = gpu.newSequence(512, TURBO3, TURBO3);
                alone[i] = gpu.newSequence(512, TURBO3, TURBO3);
                int[] prompt = r.ints(lengths[i], 0, vocab).toArray();
                batch[i].forwardGreedy(prompt, 0, prompt.length);
                alone[i].forwardGreedy(prompt, 0, prompt.length);
            }
            for (int m : new int[] {8, 5, 2}) {
                int[] tokens = r.ints(m, 0, vocab).toArray();
                float[] batched = poisoned(m * vocab);
                gpu.decodeBatch(Arrays.copyOf(batch, m), tokens, batched);
                for (int i = 0; i < m; i++) {
                    float[] one = poisoned(vocab);
                    alone[i].forward(tokens, i, 1, false, one);
                    assertArrayEquals(one, Arrays.copyOfRange(batched, i * vocab, (i + 1) * vocab),
                            type + ", batch of " + m + ", sequence " + i + " (seed " + seed + ")");
                }
            }
            // greedy on the device = argmax of the same step's logits on the host
            for (int i = 0; i < n; i++) {
                int t = r.nextInt(vocab);
                float[] logits = poisoned(vocab);
                alone[i].forward(new int[] {t}, 0, 1, false, logits);
                int id = batch[i].forwardGreedy(new int[] {t}, 0, 1);
                assertEquals(Sampler.argmax(logits, vocab), id, "sequence " + i + " (seed " + seed + ")");
            }
            for (int i = 0; i < n; i++) {
                batch[i].close();
                alone[i].close();
            }
        }
    }

    @Test
    void fullContextFullPoolAndBadTokensAreRefusedWithoutHarm() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, 5);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(2, 64, 192))) {
            int vocab = model.config().vocabSize();
            float[] logits = new float[vocab];
            try (BackendSequence a = gpu.newSequence(128, F16, F16);
                 BackendSequence b = gpu.newSequence(128, F16, F16)) {
                a.forward(new int[] {1, 2, 3}, 0, 3, false, logits);
                assertThrows(IllegalArgumentException.class, () -> a.forward(new int[] {vocab}, 0, 1, false, logits));
                assertThrows(IllegalArgumentException.class, () -> a.forward(new int[] {-1, 2}, 0, 2, false, logits));
                assertEquals(3, a.length());
                assertThrows(ContextFullException.class, () -> a.forwardGreedy(new int[126], 0, 126));
                a.forwardGreedy(new int[125], 0, 125);  // 128 tokens: two pages of the pool's three
                // b gets the last page, then the pool is out of pages
                b.forwardGreedy(new int[64], 0, 64);
                KvCacheFullException full = assertThrows(KvCacheFullException.class,
                        () -> b.forwardGreedy(new int[] {7}, 0, 1));
                assertEquals(64, b.length(), full.getMessage());
                a.truncate(10);  // gives a page back
                int id = b.forwardGreedy(new int[] {7}, 0, 1);
                assertTrue(id >= 0 && id < vocab, "greedy id " + id);
                assertEquals(65, b.length());
            }
        }
    }

    /**
     * A step that a later group of a batch (more sequences than maxBatch) or a later chunk of a prompt (more tokens than
     * maxPrefill) would refuse (a bad token id, no free page) is refused before any of it runs: no sequence is counted
     * on, and the next step gives the bits of sequences that never saw the refusal.
     */
    @Test
    void aStepRefusedInALaterGroupOrChunkCountsNoTokenIn() {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(2, 32, 192));
             CudaBackend ref = CudaBackend.open(model, new CudaBackend.Options(2, 32, 0))) {
            int vocab = model.config().vocabSize();
            int[] lengths = {63, 63, 64};  // the pool's three pages, all in use; the third sequence's next token needs a fourth
            BackendSequence[] s = new BackendSequence[3];
            BackendSequence[] alone = new BackendSequence[3];
            for (int i = 0; i < 3; i++) {
                s[i] = gpu.newSequence(128, F16, F16);
                alone[i] = ref.newSequence(128, F16, F16);
                int[] prompt = r.ints(lengths[i], 0, vocab).toArray();
                s[i].forwardGreedy(prompt, 0, prompt.length);
                alone[i].forwardGreedy(prompt, 0, prompt.length);
            }
            int[] tokens = r.ints(3, 0, vocab).toArray();
            // groups {0, 1} and {2}: the second group has no page
            assertThrows(KvCacheFullException.class, () -> gpu.decodeBatch(s, tokens, new float[3 * vocab]));
            assertThrows(KvCacheFullException.class, () -> gpu.decodeBatchGreedy(s, tokens));
            assertThrows(KvCacheFullException.class, () -> gpu.startDecode(s, tokens, null));
            int[] badLast = {tokens[0], tokens[1], vocab};
            assertThrows(IllegalArgumentException.class, () -> gpu.decodeBatch(s, badLast, new float[3 * vocab]));
            assertThrows(IllegalArgumentException.class, () -> gpu.startDecode(s, badLast, new float[3 * vocab]));
            for (int i = 0; i < 3; i++) {
                assertEquals(lengths[i], s[i].length(), "sequence " + i + " (seed " + seed + ")");
            }
            // a prompt of two chunks (32 + 18) whose second chunk holds a bad id, on a sequence with room
            s[2].truncate(10);
            alone[2].truncate(10);
            int[] prompt = r.ints(50, 0, vocab).toArray();
            int[] badLate = prompt.clone();
            badLate[40] = -1;
            assertThrows(IllegalArgumentException.class, () -> s[2].forward(badLate, 0, 50, true,
                    new float[50 * vocab]));
            assertEquals(10, s[2].length(), "seed " + seed);
            s[2].forwardGreedy(prompt, 0, 50);
            alone[2].forwardGreedy(prompt, 0, 50);
            float[] got = poisoned(3 * vocab);
            float[] want = poisoned(3 * vocab);
            gpu.decodeBatch(s, tokens, got);
            ref.decodeBatch(alone, tokens, want);
            assertArrayEquals(want, got, "seed " + seed);
            for (int i = 0; i < 3; i++) {
                s[i].close();
                alone[i].close();
            }
        }
    }

    /**
     * A decode batch whose sequences together need more pages than are free takes none of them, though the first
     * alone would fit: here a parent writing into a page it shares with a fork (a copy) and a sequence at a page's end
     * (a new page), with one page free.
     */
    @Test
    void aBatchTheFreePagesCannotHoldTakesNoneOfThem() {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(2, 64, 0));
             dev.kvant.backend.SequencePool pool = gpu.newSequencePool(256, F16, F16)) {
            int vocab = model.config().vocabSize();
            assertEquals(4, pool.totalPages());
            BackendSequence parent = pool.newSequence(256);
            parent.forwardGreedy(r.ints(128, 0, vocab).toArray(), 0, 128);        // pages 0, 1
            BackendSequence fork = pool.fork(parent, 128, 256);                     // shares them
            BackendSequence full = pool.newSequence(256);
            full.forwardGreedy(r.ints(64, 0, vocab).toArray(), 0, 64);             // a third page, full
            parent.truncate(100);                                                   // its next token: a copy
            assertEquals(1, pool.freePages());
            BackendSequence[] batch = {parent, full};
            int[] tokens = r.ints(2, 0, vocab).toArray();
            assertThrows(KvCacheFullException.class, () -> gpu.decodeBatchGreedy(batch, tokens));
            assertThrows(KvCacheFullException.class, () -> gpu.decodeBatch(batch, tokens, new float[2 * vocab]));
            assertThrows(KvCacheFullException.class, () -> gpu.startDecode(batch, tokens, null));
            assertEquals(1, pool.freePages(), "no page taken (seed " + seed + ")");
            assertEquals(100, parent.length());
            assertEquals(64, full.length());
            full.close();                                                           // two free now: it runs
            int id = gpu.decodeBatchGreedy(new BackendSequence[] {parent}, tokens)[0];
            assertTrue(id >= 0 && id < vocab, "greedy id " + id);
            assertEquals(101, parent.length());
            assertEquals(128, fork.length());
            parent.close();
            fork.close();
        }
    }

    /**
     * A fork shares the parent's whole pages and copies the one its prefix ends inside; it continues exactly as a
     * sequence fed the same tokens, and a parent that rewrites a shared page (after truncating into it) copies the page
     * first, so the fork never sees the rewrite. Every page comes back when the sequences close.
     */
    @Test
    void forksSharePagesAndNeverSeeEachOthersWrites() {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, seed);
             CudaBackend gpu = CudaBackend.open(model, new CudaBackend.Options(4, 64, 0));
             dev.kvant.backend.SequencePool pool = gpu.newSequencePool(2048, TURBO3, TURBO3)) {
            int vocab = model.config().vocabSize();
            int total = pool.totalPages();
            int[] prompt = r.ints(150, 0, vocab).toArray();
            BackendSequence parent = pool.newSequence(512);
            BackendSequence reference = pool.newSequence(512);
            for (BackendSequence s : new BackendSequence[] {parent, reference}) {
                s.forwardGreedy(prompt, 0, 128);  // two whole prefill chunks
                for (int t = 128; t < 140; t++) {
                    s.forwardGreedy(prompt, t, 1);  // decode steps: the same K/V bits in both
                }
            }
            for (int t = 140; t < 150; t++) {
                parent.forwardGreedy(prompt, t, 1);
            }
            int free = pool.freePages();
            BackendSequence child = pool.fork(parent, 140, 512);
            assertEquals(free - 1, pool.freePages(), "a fork at 140 copies one page and shares two (seed " + seed + ")");
            assertEquals(140, child.length());
            int[] next = r.ints(3, 0, vocab).toArray();
            for (int i = 0; i < next.length; i++) {
                float[] a = poisoned(vocab);
                float[] b = poisoned(vocab);
                child.forward(next, i, 1, false, a);
                reference.forward(next, i, 1, false, b);
                assertArrayEquals(b, a, "fork step " + i + " (seed " + seed + ")");
            }
            // the parent rewrites positions 100.. (page 1, shared with the child) with other tokens
            parent.truncate(100);
            parent.forwardGreedy(r.ints(40, 0, vocab).toArray(), 0, 40);
            float[] a = poisoned(vocab);
            float[] b = poisoned(vocab);
            child.forward(new int[] {5}, 0, 1, false, a);
            reference.forward(new int[] {5}, 0, 1, false, b);
            assertArrayEquals(b, a, "after the parent's rewrite (seed " + seed + ")");
            parent.close();
            child.close();
            reference.close();
            assertEquals(total, pool.freePages(), "pages leaked (seed " + seed + ")");
        }
    }

    /**
     * The layers split over two stages (two contexts of this one GPU: the multi-GPU code path, peer copies and event
     * waits included) give the logits and choices of the unsplit model bit for bit: prefill of every row, decode,
     * batched decode.
     */
    @Test
    void layerSplitGivesTheSameBitsAsOneStage() {
        checkSplit(new int[] {0, 0});
    }

    /** The same over two real GPUs (a multi-GPU machine only). */
    @Test
    void layerSplitOverTwoGpusGivesTheSameBitsAsOneGpu() {
        Assumptions.assumeTrue(Cuda.available().deviceCount() >= 2, "needs two GPUs");
        checkSplit(new int[] {0, 1});
    }

    private static void checkSplit(int[] devices) {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q4_0, seed);
             CudaBackend one = CudaBackend.open(model, new CudaBackend.Options(2, 64, 0));
             CudaBackend split = CudaBackend.open(model, new CudaBackend.Options(2, 64, 0, devices,
                     new int[] {3, 5}))) {
            assertArrayEquals(new int[] {3, 5}, split.layerSplit());
            int vocab = model.config().vocabSize();
            int[] prompt = r.ints(100, 0, vocab).toArray();
            BackendSequence[] a = {one.newSequence(256, TURBO3, TURBO3), one.newSequence(256, TURBO3, TURBO3)};
            BackendSequence[] b = {split.newSequence(256, TURBO3, TURBO3), split.newSequence(256, TURBO3, TURBO3)};
            float[] la = poisoned(prompt.length * vocab);
            float[] lb = poisoned(prompt.length * vocab);
            a[0].forward(prompt, 0, prompt.length, true, la);
            b[0].forward(prompt, 0, prompt.length, true, lb);
            assertArrayEquals(la, lb, "prefill logits (seed " + seed + ")");
            assertEquals(a[1].forwardGreedy(prompt, 0, 37), b[1].forwardGreedy(prompt, 0, 37));
            for (int step = 0; step < 3; step++) {
                int[] t = r.ints(2, 0, vocab).toArray();
                float[] da = poisoned(2 * vocab);
                float[] db = poisoned(2 * vocab);
                one.decodeBatch(a, t, da);
                split.decodeBatch(b, t, db);
                assertArrayEquals(da, db, "decode step " + step + " (seed " + seed + ")");
                assertArrayEquals(one.decodeBatchGreedy(a, t), split.decodeBatchGreedy(b, t));
            }
            for (int i = 0; i < 2; i++) {
                a[i].close();
                b[i].close();
            }
        }
    }

    /**
     * Decode steps of two batches in flight over a layer split (as the engine keeps them: one batch's next step
     * starts while the other's runs) give the bits of one step at a time on one GPU; an in-flight sequence takes no
     * other work, a third step is refused, and closing a sequence in flight waits for its step.
     */
    @Test
    void pipelinedStepsOverASplitGiveTheBitsOfOneStepAtATime() {
        checkPipeline(new int[] {0, 0});
    }

    /** The same over two real GPUs (a multi-GPU machine only). */
    @Test
    void pipelinedStepsOverTwoGpusGiveTheBitsOfOneStepAtATime() {
        Assumptions.assumeTrue(Cuda.available().deviceCount() >= 2, "needs two GPUs");
        checkPipeline(new int[] {0, 1});
    }

    private static void checkPipeline(int[] devices) {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        String why = "seed " + seed;
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q4_0, seed);
             CudaBackend one = CudaBackend.open(model, new CudaBackend.Options(3, 64, 0));
             CudaBackend split = CudaBackend.open(model, new CudaBackend.Options(3, 64, 0, devices,
                     new int[] {3, 5}))) {
            assertEquals(1, one.pipelineDepth());
            assertEquals(2, split.pipelineDepth());
            int vocab = model.config().vocabSize();
            BackendSequence[] a = new BackendSequence[6];
            BackendSequence[] b = new BackendSequence[6];
            for (int i = 0; i < 6; i++) {
                int[] prompt = r.ints(1 + r.nextInt(90), 0, vocab).toArray();
                a[i] = one.newSequence(256, TURBO3, TURBO3);
                b[i] = split.newSequence(256, TURBO3, TURBO3);
                assertEquals(a[i].forwardGreedy(prompt, 0, prompt.length),
                        b[i].forwardGreedy(prompt, 0, prompt.length), why);
            }
            // batch X: sequences 0..3 with logits (more than maxBatch: two launches a step); batch Y: 4, 5 greedy
            BackendSequence[] x1 = Arrays.copyOfRange(a, 0, 4);
            BackendSequence[] y1 = Arrays.copyOfRange(a, 4, 6);
            BackendSequence[] x2 = Arrays.copyOfRange(b, 0, 4);
            BackendSequence[] y2 = Arrays.copyOfRange(b, 4, 6);
            int steps = 6;
            int[][] tx = new int[steps][];
            int[][] ty = new int[steps][];
            for (int k = 0; k < steps; k++) {
                tx[k] = r.ints(4, 0, vocab).toArray();
                ty[k] = r.ints(2, 0, vocab).toArray();
            }
            float[][] lx = new float[steps][];
            int[][] iy = new int[steps][];
            for (int k = 0; k < steps; k++) {
                lx[k] = poisoned(4 * vocab);
                one.decodeBatch(x1, tx[k], lx[k]);
                iy[k] = one.decodeBatchGreedy(y1, ty[k]);
            }
            BackendSequence idle = split.newSequence(256, TURBO3, TURBO3);
            float[] out = poisoned(4 * vocab);
            PendingDecode px = split.startDecode(x2, tx[0], out);
            PendingDecode py = split.startDecode(y2, ty[0], null);
            assertThrows(IllegalStateException.class, () -> split.startDecode(new BackendSequence[] {b[0]},
                    new int[] {1}, null), "a sequence in flight");
            assertThrows(IllegalStateException.class, () -> b[1].forwardGreedy(new int[] {1}, 0, 1));
            assertThrows(IllegalStateException.class, () -> b[2].truncate(0));
            for (int k = 0; k < steps; k++) {
                assertEquals(null, px.await());
                assertArrayEquals(lx[k], out, "logits of batch X, step " + k + " (" + why + ")");
                if (k + 1 < steps) {
                    out = poisoned(4 * vocab);
                    px = split.startDecode(x2, tx[k + 1], out);
                    assertThrows(IllegalStateException.class, () -> split.startDecode(new BackendSequence[] {idle},
                            new int[] {1}, null), "a third step in flight");
                }
                assertArrayEquals(iy[k], py.await(), "ids of batch Y, step " + k + " (" + why + ")");
                assertArrayEquals(iy[k], py.await(), "a second await gives the same ids");
                if (k + 1 < steps) {
                    py = split.startDecode(y2, ty[k + 1], null);
                }
            }
            for (int i = 0; i < 6; i++) {
                assertEquals(a[i].length(), b[i].length());
            }
            // a sequence closed with its step in flight gives its pages back after the step
            b[4].close();
            py = split.startDecode(new BackendSequence[] {b[5]}, new int[] {7}, null);
            b[5].close();
            assertThrows(IllegalStateException.class, () -> b[5].forwardGreedy(new int[] {1}, 0, 1), "closed");
            idle.close();
            for (int i = 0; i < 6; i++) {
                a[i].close();
                b[i].close();
            }
        }
    }

    /**
     * A pool of other formats that no open sequence uses is closed before a new pool is made (bench --kv f16,turbo3
     * holds one cache at a time), one that a sequence still uses is kept (the sequence goes on), and formats made
     * again compute the bits they computed the first time.
     */
    @Test
    void anIdlePoolOfOtherFormatsMakesRoomAndAnOpenOneStays() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q4_0, 5);
             CudaBackend b = CudaBackend.open(model, new CudaBackend.Options(1, 64, 0))) {
            int vocab = model.config().vocabSize();
            int[] prompt = new SplittableRandom(5).ints(40, 0, vocab).toArray();
            float[] first = poisoned(vocab);
            KvPool f16Pool;
            try (BackendSequence s = b.newSequence(128, F16, F16)) {
                s.forward(prompt, 0, prompt.length, false, first);
                f16Pool = ((CudaBackend.Sequence) s).pool();
            }
            assertFalse(f16Pool.isClosed(), "a pool stays until another is made");
            try (BackendSequence t = b.newSequence(128, TURBO3, TURBO3)) {
                assertTrue(f16Pool.isClosed(), "the idle f16 pool was closed for the turbo3 one");
                KvPool turboPool = ((CudaBackend.Sequence) t).pool();
                t.forward(prompt, 0, 20, false, poisoned(vocab));
                float[] again = poisoned(vocab);
                try (BackendSequence s = b.newSequence(128, F16, F16)) {
                    s.forward(prompt, 0, prompt.length, false, again);
                }
                assertFalse(turboPool.isClosed(), "the turbo3 pool has an open sequence");
                float[] next = poisoned(vocab);
                t.forward(prompt, 20, 20, false, next);
                assertTrue(allFinite(next));
                assertArrayEquals(first, again, "f16 made again gives the bits it gave the first time");
            }
        }
    }

    /** A pool made by newSequence holds maxBatch sequences of the full context, however the context meets the pages. */
    @Test
    void aPoolHoldsMaxBatchFullContextsOfAnyLength() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q4_0, 3);
             CudaBackend b = CudaBackend.open(model, new CudaBackend.Options(3, 64, 0))) {
            BackendSequence[] s = new BackendSequence[3];
            for (int i = 0; i < 3; i++) {
                s[i] = b.newSequence(100, TURBO3, TURBO3);
                s[i].fillRandom(100, i);
            }
            for (BackendSequence q : s) {
                assertEquals(100, q.length());
                q.close();
            }
        }
    }

    private static boolean allFinite(float[] x) {
        for (float v : x) {
            if (!Float.isFinite(v)) {
                return false;
            }
        }
        return true;
    }

    private static float[] poisoned(int n) {
        float[] a = new float[n];
        Arrays.fill(a, Float.NaN);
        return a;
    }

    /** sum (a - b)^2 / sum b^2; NaN anywhere in a (an unwritten element) makes it NaN and fails the check. */
    private static double nmse(float[] a, float[] b) {
        double num = 0, den = 0;
        for (int i = 0; i < b.length; i++) {
            double d = (double) a[i] - b[i];
            num += d * d;
            den += (double) b[i] * b[i];
        }
        return num / den;
    }
}
