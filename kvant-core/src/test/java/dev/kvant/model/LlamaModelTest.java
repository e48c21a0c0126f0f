package dev.kvant.model;

import dev.kvant.engine.Session;
import dev.kvant.gguf.GgmlType;
import dev.kvant.gguf.GgufException;
import dev.kvant.gguf.GgufWriter;
import dev.kvant.kv.KvFormat;
import dev.kvant.tensor.Parallel;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;
import org.junit.jupiter.params.provider.ValueSource;

import java.lang.foreign.Arena;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.function.Consumer;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class LlamaModelTest {

    static Stream<Arguments> architecturesAndFormats() {
        Stream.Builder<Arguments> b = Stream.builder();
        for (String arch : new String[] {"llama", "qwen2", "qwen3"}) {
            for (GgmlType t : new GgmlType[] {GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q8_0,
                    GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.Q5_K, GgmlType.Q6_K}) {
                b.add(Arguments.of(arch, t));
            }
        }
        return b.build();
    }

    @ParameterizedTest(name = "{0} {1}")
    @MethodSource("architecturesAndFormats")
    void logitsMatchFloat64ReferenceForward(String arch, GgmlType weights) {
        long seed = new Random().nextLong();
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built built = TinyModels.build(arch, weights, seed, arena);
            LlamaModel model = LlamaModel.fromGguf(built.file());
            int[] prompt = randomTokens(seed, 7);
            int vocab = TinyModels.VOCAB;
            ReferenceForward ref = new ReferenceForward(built);
            double[][] expected = new double[prompt.length + 2][];
            for (int i = 0; i < prompt.length; i++) {
                expected[i] = ref.step(prompt[i]);
            }
            int next1 = prompt[0];
            int next2 = prompt[1];
            expected[prompt.length] = ref.step(next1);
            expected[prompt.length + 1] = ref.step(next2);

            try (Parallel pool = new Parallel(2);
                 Session s = new Session(model, 64, KvFormat.parse("f16"), KvFormat.parse("f16"), 3, pool)) {
                float[] all = new float[prompt.length * vocab];
                Arrays.fill(all, Float.NaN);
                s.prefillAllLogits(prompt, 0, prompt.length, all);
                double bound = weights == GgmlType.F32 ? 1e-6 : 1e-5;
                for (int i = 0; i < prompt.length; i++) {
                    double e = nmse(expected[i], all, i * vocab);
                    assertTrue(e < bound, arch + " " + weights + " token " + i + ": NMSE " + e + " (seed " + seed
                            + ")");
                }
                double e1 = nmse(expected[prompt.length], s.decode(next1), 0);
                double e2 = nmse(expected[prompt.length + 1], s.decode(next2), 0);
                assertTrue(e1 < bound && e2 < bound, "decode NMSE " + e1 + ", " + e2 + " (seed " + seed + ")");
            }
        }
    }

    /**
     * RoPE scaling against the float64 forward pass: Llama 3's per-pair frequency factors (rope_freqs.weight, NORM
     * pairs) and linear position scaling (NORM and NEOX pairs), through prefill and decode.
     */
    @ParameterizedTest(name = "{0} {1}")
    @org.junit.jupiter.params.provider.CsvSource({"llama,llama3", "llama,linear", "qwen2,linear"})
    void scaledRopeMatchesFloat64ReferenceForward(String arch, String scaling) {
        long seed = new Random().nextLong();
        int pairs = TinyModels.HEAD_DIM / 2;
        float[] factors = new float[pairs];
        for (int i = 0; i < pairs; i++) {
            factors[i] = 1f + (i * 7 % pairs) * 0.5f;   // 1 .. 16.5, not monotone: each pair its own
        }
        float linear = arch.equals("qwen2") ? 2f : 4f;
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built built = TinyModels.build(arch, GgmlType.F32, seed, arena, w -> {
                w.putString(arch + ".rope.scaling.type", scaling);
                if (scaling.equals("llama3")) {
                    byte[] bytes = new byte[4 * pairs];
                    java.nio.ByteBuffer.wrap(bytes).order(java.nio.ByteOrder.LITTLE_ENDIAN).asFloatBuffer().put(factors);
                    w.addTensor("rope_freqs.weight", GgmlType.F32, new long[] {pairs}, bytes);
                } else {
                    w.putF32(arch + ".rope.scaling.factor", linear);
                }
            });
            LlamaModel model = LlamaModel.fromGguf(built.file());
            ReferenceForward ref = scaling.equals("llama3") ? new ReferenceForward(built, 1, factors)
                    : new ReferenceForward(built, linear, null);
            ReferenceForward plain = new ReferenceForward(built);
            int[] prompt = randomTokens(seed, 40);
            int vocab = TinyModels.VOCAB;
            double[][] expected = new double[prompt.length + 1][];
            double[] unscaled = null;
            for (int i = 0; i < prompt.length; i++) {
                expected[i] = ref.step(prompt[i]);
                unscaled = plain.step(prompt[i]);
            }
            expected[prompt.length] = ref.step(prompt[0]);
            try (Parallel pool = new Parallel(2);
                 Session s = new Session(model, 64, KvFormat.parse("f16"), KvFormat.parse("f16"), 16, pool)) {
                float[] all = new float[prompt.length * vocab];
                s.prefillAllLogits(prompt, 0, prompt.length, all);
                for (int i = 0; i < prompt.length; i++) {
                    double e = nmse(expected[i], all, i * vocab);
                    assertTrue(e < 1e-6, arch + " " + scaling + " token " + i + ": NMSE " + e + " (seed " + seed + ")");
                }
                // the scaling matters at these positions: the unscaled forward is far from it
                double apart = nmse(unscaled, all, (prompt.length - 1) * vocab);
                assertTrue(apart > 1e-4, "unscaled RoPE gives nearly the same logits (NMSE " + apart + ")");
                double e = nmse(expected[prompt.length], s.decode(prompt[0]), 0);
                assertTrue(e < 1e-6, "decode NMSE " + e + " (seed " + seed + ")");
            }
        }
    }

    @Test
    void logitsAreBitIdenticalAtOneTwoAndThreeThreads() {
        long seed = new Random().nextLong();
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built built = TinyModels.build("qwen2", GgmlType.Q8_0, seed, arena);
            LlamaModel model = LlamaModel.fromGguf(built.file());
            int[] prompt = randomTokens(seed, 150);
            float[][] results = new float[3][];
            for (int threads = 1; threads <= 3; threads++) {
                try (Parallel pool = new Parallel(threads);
                     Session s = new Session(model, 256, KvFormat.parse("f16"), KvFormat.parse("f16"), 64, pool)) {
                    float[] all = new float[prompt.length * TinyModels.VOCAB];
                    s.prefillAllLogits(prompt, 0, prompt.length, all);
                    float[] dec = s.decode(prompt[3]).clone();
                    float[] joined = Arrays.copyOf(all, all.length + dec.length);
                    System.arraycopy(dec, 0, joined, all.length, dec.length);
                    results[threads - 1] = joined;
                }
            }
            assertArrayEquals(results[0], results[1], "1 vs 2 threads (seed " + seed + ")");
            assertArrayEquals(results[0], results[2], "1 vs 3 threads (seed " + seed + ")");
        }
    }

    /** A byte-level BPE vocabulary of n tokens (the 256 bytes, then fillers) for the tiny models. */
    private static void bpeTokenizer(GgufWriter w, int n) {
        List<String> tokens = new ArrayList<>();
        int extra = 0;
        for (int b = 0; b < 256; b++) {   // GPT-2's byte-level characters: printable bytes stand for themselves
            boolean printable = b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE;
            tokens.add(String.valueOf((char) (printable ? b : 256 + extra++)));
        }
        for (int i = 256; i < n; i++) {
            tokens.add("<|filler" + i + "|>");
        }
        w.putString("tokenizer.ggml.model", "gpt2");
        w.putStringArray("tokenizer.ggml.tokens", tokens.subList(0, n));
        w.putStringArray("tokenizer.ggml.merges", List.of());
    }

    static Stream<Arguments> hostileSettings() {
        return Stream.of(
                Arguments.of("no query heads", (Consumer<GgufWriter>) w -> w.putU32("llama.attention.head_count", 0),
                        "llama.attention.head_count is 0"),
                Arguments.of("a RoPE wider than the head",
                        (Consumer<GgufWriter>) w -> w.putU32("llama.rope.dimension_count", 128),
                        "rope dimension (128) exceeds the key head size (64)"),
                Arguments.of("an odd RoPE dimension", (Consumer<GgufWriter>) w ->
                        w.putU32("llama.rope.dimension_count", 33), "llama.rope.dimension_count is 33; the rope"
                        + " dimension must be positive and even"),
                Arguments.of("a RoPE dimension of 0", (Consumer<GgufWriter>) w ->
                        w.putU32("llama.rope.dimension_count", 0), "llama.rope.dimension_count is 0"),
                Arguments.of("two billion blocks", (Consumer<GgufWriter>) w -> w.putU32("llama.block_count", 2_000_000_000L),
                        "block_count 2000000000 is more than the file's"),
                Arguments.of("two billion blocks, the last one's norm there", (Consumer<GgufWriter>) w -> {
                    w.putU32("llama.block_count", 2_000_000_000L);
                    w.addTensor("blk.1999999999.attn_norm.weight", GgmlType.F32, new long[] {256}, new byte[1024]);
                }, "block_count 2000000000 is more than the file's"),
                Arguments.of("heads whose widths overflow an int", (Consumer<GgufWriter>) w -> {
                    w.putU32("llama.attention.head_count", 65536);
                    w.putU32("llama.attention.head_count_kv", 65536);
                    w.putU32("llama.attention.key_length", 32768);
                    w.putU32("llama.attention.value_length", 32768);
                    w.putU32("llama.rope.dimension_count", 64);
                }, "makes a layer wider than"),
                Arguments.of("an embedding table narrower than embedding_length", (Consumer<GgufWriter>) w -> {
                    w.putU32("llama.embedding_length", 512);
                    w.putU32("llama.attention.key_length", 64);
                }, "token_embd.weight has rows of 256 values, but embedding_length is 512"),
                Arguments.of("a head size that does not divide", (Consumer<GgufWriter>) w ->
                        w.putU32("llama.embedding_length", 258), "is not a multiple of llama.attention.head_count 4"),
                Arguments.of("a RoPE base of 0", (Consumer<GgufWriter>) w -> w.putF32("llama.rope.freq_base", 0f),
                        "llama.rope.freq_base is 0.0"),
                Arguments.of("a negative linear RoPE scale", (Consumer<GgufWriter>) w -> {
                    w.putString("llama.rope.scaling.type", "linear");
                    w.putF32("llama.rope.scaling.factor", -2f);
                }, "llama.rope.scaling.factor is -2.0"),
                Arguments.of("a RoPE frequency factor of 0", (Consumer<GgufWriter>) w -> w.addTensor("rope_freqs.weight",
                        GgmlType.F32, new long[] {32}, new byte[128]), "rope_freqs factor 0 is 0.0"),
                // keys llama.cpp requires: a default would run the model on values it was not trained with
                Arguments.of("no RMSNorm epsilon", (Consumer<GgufWriter>) w ->
                        w.remove("llama.attention.layer_norm_rms_epsilon"), "llama.attention.layer_norm_rms_epsilon"),
                Arguments.of("no context length", (Consumer<GgufWriter>) w -> w.remove("llama.context_length"),
                        "llama.context_length"),
                Arguments.of("a mixture of experts", (Consumer<GgufWriter>) w -> w.putU32("llama.expert_count", 8),
                        "mixture-of-experts models are not supported"),
                Arguments.of("attention biases on a llama file", (Consumer<GgufWriter>) w -> w.addTensor(
                        "blk.0.attn_output.bias", GgmlType.F32, new long[] {256}, new byte[1024]),
                        "blk.0.attn_output.bias is present"),
                Arguments.of("a million RoPE frequency factors", (Consumer<GgufWriter>) w -> w.addTensor(
                        "rope_freqs.weight", GgmlType.F32, new long[] {1 << 20}, new byte[4 << 20]),
                        "rope_freqs.weight has 1048576 factors"),
                Arguments.of("a context of 0", (Consumer<GgufWriter>) w -> w.putU32("llama.context_length", 0),
                        "must be positive"),
                // what llama.cpp computes and kvant would drop: refused rather than wrong logits
                Arguments.of("a feed-forward bias (llama.cpp adds it; kvant would drop it)", (Consumer<GgufWriter>) w -> w.addTensor(
                        "blk.0.ffn_up.bias", GgmlType.F32, new long[] {512}, new byte[2048]),
                        "blk.0.ffn_up.bias is present but a llama model"),
                Arguments.of("Llama-3 RoPE scaling without its frequency factors", (Consumer<GgufWriter>) w -> {
                    w.putString("llama.rope.scaling.type", "llama3");
                    w.putF32("llama.rope.scaling.factor", 8f);
                }, "rope scaling 'llama3' needs the rope_freqs.weight tensor"),
                Arguments.of("a RoPE attention factor", (Consumer<GgufWriter>) w ->
                        w.putF32("llama.rope.scaling.attn_factor", 1.2f), "attn_factor is 1.2"),
                Arguments.of("partial rotary on a llama model", (Consumer<GgufWriter>) w ->
                        w.putU32("llama.rope.dimension_count", 32), "invalid n_rot"),
                // an id outside the vocabulary is left unset (llama.cpp warns and goes on); one the model must add is
                // an error
                Arguments.of("a tokenizer whose BOS, to be added, is no token", (Consumer<GgufWriter>) w -> {
                    bpeTokenizer(w, TinyModels.VOCAB);
                    w.putU32("tokenizer.ggml.bos_token_id", 5000);
                    w.putBool("tokenizer.ggml.add_bos_token", true);
                }, "outside the vocabulary"),
                Arguments.of("fewer tokens than embedding rows", (Consumer<GgufWriter>) w -> bpeTokenizer(w, 256),
                        "the tokenizer has 256 tokens but token_embd.weight has 300 rows"));
    }

    /**
     * A file whose settings the weights or the tokenizer cannot honour is refused at load with a message naming what
     * is wrong: before this, such files loaded and then failed deep inside a forward pass (a RoPE past the head, a
     * sampled id with no token), divided by zero, or ran out of memory sizing two billion blocks.
     */
    @ParameterizedTest(name = "{0}")
    @MethodSource("hostileSettings")
    void settingsTheModelCannotHonourAreRefusedAtLoad(String what, Consumer<GgufWriter> setting, String message) {
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built built = TinyModels.build("llama", GgmlType.F32, 1, arena, setting);
            GgufException e = assertThrows(GgufException.class, () -> LlamaModel.fromGguf(built.file()), what);
            assertTrue(e.getMessage().contains(message), what + ": " + e.getMessage());
            assertTrue(e.getMessage().contains(built.file().name()), what + ": the message names the file: "
                    + e.getMessage());
        }
    }

    /**
     * What llama.cpp refuses in a qwen2 or qwen3 file is refused here too: RoPE frequency factors (its graphs take
     * none: they were dropped before, the model running unscaled) and partial rotary or value heads of another size
     * (its graphs assert all three equal).
     */
    @ParameterizedTest
    @ValueSource(strings = {"qwen2", "qwen3"})
    void frequencyFactorsAndPartialRotaryAreRefusedOnQwenFiles(String arch) {
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built factors = TinyModels.build(arch, GgmlType.F32, 1, arena, w -> w.addTensor(
                    "rope_freqs.weight", GgmlType.F32, new long[] {32}, floatBytes(32, 1f)));
            GgufException e = assertThrows(GgufException.class, () -> LlamaModel.fromGguf(factors.file()));
            assertTrue(e.getMessage().contains("rope_freqs.weight holds RoPE frequency factors"), e.getMessage());
            TinyModels.Built partial = TinyModels.build(arch, GgmlType.F32, 1, arena,
                    w -> w.putU32(arch + ".rope.dimension_count", 32));
            e = assertThrows(GgufException.class, () -> LlamaModel.fromGguf(partial.file()));
            assertTrue(e.getMessage().contains("the three must be equal"), e.getMessage());
        }
    }

    /**
     * As llama.cpp reads them: a RoPE factor with scaling type none is no scaling, and a linear factor of 0 is none;
     * a sliding window shorter than the trained context is the context (attention to every position is the model's
     * only up to its window).
     */
    @Test
    void ropeFactorsLlamaCppIgnoresAreIgnoredAndASlidingWindowIsTheContext() {
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built none = TinyModels.build("llama", GgmlType.F32, 1, arena, w -> {
                w.putString("llama.rope.scaling.type", "none");
                w.putF32("llama.rope.scale_linear", 4f);
            });
            try (LlamaModel m = LlamaModel.fromGguf(none.file())) {
                assertEquals(1f, m.config().rope().linearScale());
            }
            TinyModels.Built zero = TinyModels.build("llama", GgmlType.F32, 1, arena, w -> {
                w.putString("llama.rope.scaling.type", "linear");
                w.putF32("llama.rope.scaling.factor", 0f);
            });
            try (LlamaModel m = LlamaModel.fromGguf(zero.file())) {
                assertEquals(1f, m.config().rope().linearScale());
            }
            TinyModels.Built window = TinyModels.build("llama", GgmlType.F32, 1, arena,
                    w -> w.putU32("llama.attention.sliding_window", 64));
            try (LlamaModel m = LlamaModel.fromGguf(window.file())) {
                assertEquals(64, m.config().contextLength());
            }
        }
    }

    private static byte[] floatBytes(int n, float value) {
        java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(4 * n).order(java.nio.ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < n; i++) {
            b.putFloat(value);
        }
        return b.array();
    }

    /** Older files name the linear RoPE factor rope.scale_linear and give no scaling type: linear, as llama.cpp. */
    @Test
    void aRopeFactorWithoutAScalingTypeIsLinear() {
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built built = TinyModels.build("llama", GgmlType.F32, 1, arena,
                    w -> w.putF32("llama.rope.scale_linear", 4f));
            try (LlamaModel m = LlamaModel.fromGguf(built.file())) {
                assertEquals(4f, m.config().rope().linearScale());
            }
        }
    }

    @Test
    void aTokenizerOfTheEmbeddingTablesSizeLoads() {
        try (Arena arena = Arena.ofShared()) {
            TinyModels.Built built = TinyModels.build("llama", GgmlType.F32, 1, arena,
                    w -> bpeTokenizer(w, TinyModels.VOCAB));
            try (LlamaModel model = LlamaModel.fromGguf(built.file())) {
                assertEquals(TinyModels.VOCAB, model.tokenizer().vocabSize());
            }
        }
    }

    static int[] randomTokens(long seed, int n) {
        Random r = new Random(seed ^ 0x5DEECE66DL);
        int[] t = new int[n];
        for (int i = 0; i < n; i++) {
            t[i] = r.nextInt(TinyModels.VOCAB);
        }
        return t;
    }

    static double nmse(double[] expected, float[] actual, int off) {
        double num = 0;
        double den = 0;
        for (int i = 0; i < expected.length; i++) {
            double d = actual[off + i] - expected[i];
            num += d * d;
            den += expected[i] * expected[i];
        }
        return Double.isNaN(num) ? Double.POSITIVE_INFINITY : num / den;
    }
}
