package dev.kvant.model;

import dev.kvant.gguf.GgmlType;
import dev.kvant.gguf.GgufFile;
import dev.kvant.gguf.GgufWriter;
import dev.kvant.tensor.WeightFormat;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;
import java.util.function.Consumer;

/**
 * Small models of every supported architecture, written with the GGUF writer, and the exact float weights they hold
 * (after quantization), for the float64 reference.
 */
public final class TinyModels {

    static final int DIM = 256;
    static final int LAYERS = 2;
    static final int HEADS = 4;
    static final int KV_HEADS = 2;
    static final int HEAD_DIM = 64;
    static final int FFN = 512;
    public static final int VOCAB = 300;

    /** A written model: its GGUF image and the dequantized value of every tensor. */
    public record Built(GgufFile file, Map<String, float[]> tensors, String arch) {
        float[] t(String name) {
            float[] v = tensors.get(name);
            if (v == null) {
                throw new IllegalArgumentException("no tensor " + name);
            }
            return v;
        }
    }

    public static Built build(String arch, GgmlType weights, long seed, Arena arena) {
        return build(arch, weights, seed, arena, w -> { });
    }

    /** As above, {@code metadata} putting (or replacing) keys last: a hostile or unusual file. */
    public static Built build(String arch, GgmlType weights, long seed, Arena arena, Consumer<GgufWriter> metadata) {
        Random r = new Random(seed);
        WeightFormat fmt = WeightFormat.of(weights);
        GgufWriter w = new GgufWriter();
        w.putString("general.architecture", arch);
        w.putU32(arch + ".embedding_length", DIM);
        w.putU32(arch + ".block_count", LAYERS);
        w.putU32(arch + ".feed_forward_length", FFN);
        w.putU32(arch + ".attention.head_count", HEADS);
        w.putU32(arch + ".attention.head_count_kv", KV_HEADS);
        w.putU32(arch + ".context_length", 256);
        w.putF32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
        w.putF32(arch + ".rope.freq_base", 10000f);
        Map<String, float[]> values = new LinkedHashMap<>();
        matrix(w, values, fmt, "token_embd.weight", VOCAB, DIM, 0.5, r, arena);
        for (int l = 0; l < LAYERS; l++) {
            String p = "blk." + l + ".";
            vector(w, values, p + "attn_norm.weight", DIM, 1.0, 0.2, r);
            matrix(w, values, fmt, p + "attn_q.weight", HEADS * HEAD_DIM, DIM, 0.08, r, arena);
            matrix(w, values, fmt, p + "attn_k.weight", KV_HEADS * HEAD_DIM, DIM, 0.08, r, arena);
            matrix(w, values, fmt, p + "attn_v.weight", KV_HEADS * HEAD_DIM, DIM, 0.08, r, arena);
            matrix(w, values, fmt, p + "attn_output.weight", DIM, HEADS * HEAD_DIM, 0.06, r, arena);
            if (arch.equals("qwen2")) {
                vector(w, values, p + "attn_q.bias", HEADS * HEAD_DIM, 0, 0.1, r);
                vector(w, values, p + "attn_k.bias", KV_HEADS * HEAD_DIM, 0, 0.1, r);
                vector(w, values, p + "attn_v.bias", KV_HEADS * HEAD_DIM, 0, 0.1, r);
            }
            if (arch.equals("qwen3")) {
                vector(w, values, p + "attn_q_norm.weight", HEAD_DIM, 1.0, 0.2, r);
                vector(w, values, p + "attn_k_norm.weight", HEAD_DIM, 1.0, 0.2, r);
            }
            vector(w, values, p + "ffn_norm.weight", DIM, 1.0, 0.2, r);
            matrix(w, values, fmt, p + "ffn_gate.weight", FFN, DIM, 0.08, r, arena);
            matrix(w, values, fmt, p + "ffn_up.weight", FFN, DIM, 0.08, r, arena);
            matrix(w, values, fmt, p + "ffn_down.weight", DIM, FFN, 0.06, r, arena);
        }
        vector(w, values, "output_norm.weight", DIM, 1.0, 0.2, r);
        if (!arch.equals("qwen3")) {
            // qwen3 here ties its output to the embedding, to cover that path.
            matrix(w, values, fmt, "output.weight", VOCAB, DIM, 0.1, r, arena);
        }
        metadata.accept(w);
        GgufFile file = GgufFile.of(w.writeToSegment(arena), "tiny-" + arch + "-" + weights);
        return new Built(file, values, arch);
    }

    private static void matrix(GgufWriter w, Map<String, float[]> values, WeightFormat fmt, String name, int rows,
                               int cols, double std, Random r, Arena arena) {
        float[] v = new float[rows * cols];
        for (int i = 0; i < v.length; i++) {
            v[i] = (float) (r.nextGaussian() * std);
        }
        MemorySegment seg = arena.allocate(fmt.type().rowBytes(cols) * rows, 32);
        fmt.quantize(v, 0, v.length, seg, 0);
        float[] back = new float[v.length];
        fmt.dequantize(seg, 0, back, 0, v.length);
        values.put(name, back);
        w.addTensor(name, fmt.type(), new long[] {cols, rows}, seg);
    }

    private static void vector(GgufWriter w, Map<String, float[]> values, String name, int n, double mean,
                               double std, Random r) {
        float[] v = new float[n];
        for (int i = 0; i < n; i++) {
            v[i] = (float) (mean + r.nextGaussian() * std);
        }
        MemorySegment seg = Arena.ofAuto().allocate(4L * n, 32);
        MemorySegment.copy(v, 0, seg, java.lang.foreign.ValueLayout.JAVA_FLOAT_UNALIGNED, 0, n);
        values.put(name, v);
        w.addTensor(name, GgmlType.F32, new long[] {n}, seg);
    }

    private TinyModels() {
    }
}
