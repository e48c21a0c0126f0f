package dev.kvant.model;

import dev.kvant.gguf.GgmlType;
import dev.kvant.tensor.LargePages;
import dev.kvant.tensor.WeightFormat;
import dev.kvant.tensor.WeightMatrix;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Arrays;
import java.util.SplittableRandom;

/**
 * Models of real shapes with random weights, built in memory, for benchmarks that need no model file. The weights
 * are valid blocks of the chosen format (quantized from Gaussian values), so every kernel runs its real path.
 */
public final class SyntheticModel {

    /** The built-in shapes; names are what {@code --synthetic} accepts. */
    public enum Shape {
        LLAMA3_8B("llama3-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 8192, 500000f),
        LLAMA3_2_1B("llama3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 8192, 500000f),
        QWEN2_5_7B("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 128, 18944, 152064, 8192, 1000000f),
        /** The geometry of the tinycode test model. */
        TINY("tiny", "llama", 512, 8, 4, 2, 128, 1536, 4096, 8192, 100000f),
        /** The tiny geometry as qwen2 (NEOX RoPE, q/k/v biases) and qwen3 (NEOX RoPE, q/k norms): backend tests. */
        TINY_QWEN2("tiny-qwen2", "qwen2", 512, 4, 4, 2, 128, 1536, 4096, 8192, 1000000f),
        TINY_QWEN3("tiny-qwen3", "qwen3", 512, 4, 4, 2, 128, 1536, 4096, 8192, 1000000f);

        public final String id;
        final String arch;
        final int dim;
        final int layers;
        final int heads;
        final int kvHeads;
        final int headDim;
        final int ffnDim;
        final int vocab;
        final int context;
        final float ropeBase;

        Shape(String id, String arch, int dim, int layers, int heads, int kvHeads, int headDim, int ffnDim, int vocab,
              int context, float ropeBase) {
            this.id = id;
            this.arch = arch;
            this.dim = dim;
            this.layers = layers;
            this.heads = heads;
            this.kvHeads = kvHeads;
            this.headDim = headDim;
            this.ffnDim = ffnDim;
            this.vocab = vocab;
            this.context = context;
            this.ropeBase = ropeBase;
        }

        public static Shape parse(String id) {
            for (Shape s : values()) {
                if (s.id.equals(id)) {
                    return s;
                }
            }
            throw new IllegalArgumentException("unknown synthetic shape '" + id + "' (known: "
                    + String.join(", ", Arrays.stream(values()).map(s -> s.id).toList()) + ")");
        }

        public ModelConfig config() {
            boolean qwen = arch.startsWith("qwen");
            Rope rope = new Rope(qwen ? Rope.Mode.NEOX : Rope.Mode.NORMAL, headDim, ropeBase, 1f, null);
            return new ModelConfig(arch, dim, layers, heads, kvHeads, headDim, headDim, ffnDim, vocab, context,
                    1e-5f, rope, arch.equals("qwen2"), arch.equals("qwen3"));
        }
    }

    private SyntheticModel() {
    }

    /**
     * Builds a model of the shape with every 2-D weight in the given format (norms and biases in f32), but the output
     * head, which is Q6_K where the format is Q4_0, Q4_K or Q5_K (and the rows are whole Q6_K blocks), as llama.cpp's
     * quantizer leaves a model file of those types — and so the bytes a token reads are those of a real file (a tied
     * embedding is the output head too).
     */
    public static LlamaModel build(Shape shape, GgmlType weightType, long seed) {
        // Llama 3.2 1B ties its output to the embedding
        return build("synthetic " + shape.id + " " + weightType, shape.config(), weightType, seed,
                shape == Shape.LLAMA3_2_1B);
    }

    /**
     * A model of any configuration (every size, RoPE's scaling and frequency factors, biases, q/k norms as c says),
     * its weights as {@link #build(Shape, GgmlType, long)} makes them; tied: the output head is the embedding.
     */
    public static LlamaModel build(String name, ModelConfig c, GgmlType weightType, long seed, boolean tied) {
        WeightFormat format = WeightFormat.of(weightType);
        GgmlType headType = headType(weightType, c.dim());
        boolean q6Head = headType != weightType;
        Arena arena = Arena.ofShared();
        try {
            Filler fill = new Filler(format, seed, arena);
            Filler headFill = q6Head ? new Filler(WeightFormat.of(headType), seed + 1, arena) : fill;
            WeightMatrix embedding = (tied ? headFill : fill).matrix("token_embd.weight", c.vocabSize(), c.dim());
            LlamaWeights.Layer[] layers = new LlamaWeights.Layer[c.layers()];
            for (int i = 0; i < c.layers(); i++) {
                String p = "blk." + i + ".";
                layers[i] = new LlamaWeights.Layer(
                        fill.norm(c.dim()),
                        fill.matrix(p + "attn_q.weight", c.qDim(), c.dim()),
                        fill.matrix(p + "attn_k.weight", c.kvDimK(), c.dim()),
                        fill.matrix(p + "attn_v.weight", c.kvDimV(), c.dim()),
                        fill.matrix(p + "attn_output.weight", c.dim(), c.heads() * c.headDimV()),
                        c.qkvBias() ? fill.bias(c.qDim()) : null,
                        c.qkvBias() ? fill.bias(c.kvDimK()) : null,
                        c.qkvBias() ? fill.bias(c.kvDimV()) : null,
                        c.qkNorm() ? fill.norm(c.headDimK()) : null,
                        c.qkNorm() ? fill.norm(c.headDimK()) : null,
                        fill.norm(c.dim()),
                        fill.matrix(p + "ffn_gate.weight", c.ffnDim(), c.dim()),
                        fill.matrix(p + "ffn_up.weight", c.ffnDim(), c.dim()),
                        fill.matrix(p + "ffn_down.weight", c.dim(), c.ffnDim()));
            }
            WeightMatrix output = tied ? embedding : headFill.matrix("output.weight", c.vocabSize(), c.dim());
            LlamaWeights w = new LlamaWeights(embedding, fill.norm(c.dim()), output, layers, c.rope().freqFactors());
            return new LlamaModel(name, c, w, null, arena);
        } catch (RuntimeException | OutOfMemoryError e) {
            arena.close();
            throw e;
        }
    }

    /** The output head's type in a model file of weightType with rows of dim values (llama.cpp's quantizer's choice). */
    static GgmlType headType(GgmlType weightType, int dim) {
        boolean q6 = weightType == GgmlType.Q4_0 || weightType == GgmlType.Q4_K || weightType == GgmlType.Q5_K;
        return q6 && dim % GgmlType.Q6_K.blockSize == 0 ? GgmlType.Q6_K : weightType;
    }

    /** Fills tensors from a pool of valid random blocks, copying whole blocks to random places: fast and valid. */
    private static final class Filler {
        private static final int POOL_BLOCKS = 4096;
        private final WeightFormat format;
        private final SplittableRandom random;
        private final Arena arena;
        private final MemorySegment pool;

        Filler(WeightFormat format, long seed, Arena arena) {
            this.format = format;
            this.random = new SplittableRandom(seed);
            this.arena = arena;
            int n = POOL_BLOCKS * format.blockSize();
            float[] values = new float[n];
            for (int i = 0; i < n; i++) {
                values[i] = (float) (random.nextGaussian() * 0.02);
            }
            this.pool = arena.allocate((long) POOL_BLOCKS * format.blockBytes(), 64);
            format.quantize(values, 0, n, pool, 0);
        }

        WeightMatrix matrix(String name, int rows, int cols) {
            long rowBytes = format.type().rowBytes(cols);
            if (rowBytes < 0) {
                throw new IllegalArgumentException(name + ": " + cols + " columns are not a whole number of "
                        + format.type() + " blocks");
            }
            long bytes = rowBytes * rows;
            // every byte is written below: no need for the zeroing (and first touch of every small page) of
            // Arena.allocate, which took most of a large shape's build time
            MemorySegment seg = LargePages.allocate(bytes, arena);
            long chunk = (long) (POOL_BLOCKS / 2) * format.blockBytes();
            for (long off = 0; off < bytes; off += chunk) {
                long len = Math.min(chunk, bytes - off);
                long src = (long) random.nextInt(POOL_BLOCKS / 2) * format.blockBytes();
                MemorySegment.copy(pool, src, seg, off, len);
            }
            return new WeightMatrix(name, format, seg, rows, cols);
        }

        float[] norm(int n) {
            float[] v = new float[n];
            for (int i = 0; i < n; i++) {
                v[i] = (float) (1.0 + 0.1 * random.nextGaussian());
            }
            return v;
        }

        float[] bias(int n) {
            float[] v = new float[n];
            for (int i = 0; i < n; i++) {
                v[i] = (float) (0.02 * random.nextGaussian());
            }
            return v;
        }
    }
}
