package dev.kvant.cuda.model;

import dev.kvant.cuda.Owned;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.model.LlamaWeights;
import dev.kvant.model.ModelConfig;
import dev.kvant.model.Rope;

import java.lang.foreign.MemorySegment;

/**
 * A model's weights on one device, uploaded once: matrices in their compressed formats (q|k|v and gate|up stacked
 * where their formats agree), norms and biases as f32, RoPE frequencies as f64. A device of a layer split holds
 * layers [from, to), the embedding table when it is the first and the output when it is the last; a model whose
 * output is its embedding table (tied, no output.weight) holds it once where one device has both.
 */
final class DeviceWeights implements AutoCloseable {

    /** One transformer block. Biases and q/k norms are null where the architecture has none. */
    record Layer(DeviceBuffer attnNorm, Projection qkv, DeviceBuffer qkvBias, DeviceBuffer qNorm, DeviceBuffer kNorm,
                 Projection wo, DeviceBuffer ffnNorm, Projection gateUp, Projection down) {
    }

    /** null unless this device runs the first layers; the output's matrix when {@link #tied}. */
    final DeviceMatrix embedding;
    /** null unless this device runs the last layers. */
    final DeviceBuffer outputNorm;
    final Projection output;
    /** The embedding table serves as the output too (one upload). */
    final boolean tied;
    /** layers[i] is model layer from + i. */
    final Layer[] layers;
    final int from;
    /** Angular frequency of each rotated pair (dev.kvant.model.Rope#frequency), f64. */
    final DeviceBuffer ropeFreqs;
    private final Owned owned = new Owned();

    DeviceWeights(CudaContext context, ModelConfig c, LlamaWeights w, int from, int to) {
        this.from = from;
        try {
            boolean first = from == 0;
            boolean last = to == c.layers();
            tied = first && last && w.output() == w.tokenEmbedding();
            outputNorm = last ? floats(context, w.outputNorm()) : null;
            output = last ? own(Projection.upload(context, w.output())) : null;
            embedding = tied ? output.only() : first ? own(DeviceMatrix.upload(context, w.tokenEmbedding())) : null;
            layers = new Layer[to - from];
            for (int l = from; l < to; l++) {
                LlamaWeights.Layer x = w.layers()[l];
                DeviceBuffer bias = null;
                if (x.bq() != null) {
                    float[] all = new float[x.bq().length + x.bk().length + x.bv().length];
                    System.arraycopy(x.bq(), 0, all, 0, x.bq().length);
                    System.arraycopy(x.bk(), 0, all, x.bq().length, x.bk().length);
                    System.arraycopy(x.bv(), 0, all, x.bq().length + x.bk().length, x.bv().length);
                    bias = floats(context, all);
                }
                layers[l - from] = new Layer(floats(context, x.attnNorm()),
                        own(Projection.upload(context, x.wq(), x.wk(), x.wv())), bias,
                        x.qNorm() == null ? null : floats(context, x.qNorm()),
                        x.kNorm() == null ? null : floats(context, x.kNorm()),
                        own(Projection.upload(context, x.wo())), floats(context, x.ffnNorm()),
                        own(Projection.upload(context, x.wGate(), x.wUp())),
                        own(Projection.upload(context, x.wDown())));
            }
            Rope rope = c.rope();
            double[] freqs = new double[Math.max(1, rope.ropeDim() / 2)];
            for (int i = 0; i < rope.ropeDim() / 2; i++) {
                freqs[i] = rope.frequency(i);
            }
            ropeFreqs = own(context.allocate(8L * freqs.length));
            ropeFreqs.copyFromHost(MemorySegment.ofArray(freqs));
        } catch (RuntimeException | Error e) {
            close();
            throw e;
        }
    }

    private <T extends AutoCloseable> T own(T resource) {
        return owned.add(resource);
    }

    private DeviceBuffer floats(CudaContext context, float[] values) {
        DeviceBuffer b = own(context.allocate(4L * values.length));
        b.copyFromHost(MemorySegment.ofArray(values));
        return b;
    }

    /** Device bytes of the weights. */
    long byteSize() {
        long b = (embedding == null || tied ? 0 : embedding.byteSize()) + (output == null ? 0 : output.byteSize());
        for (Layer l : layers) {
            b += l.qkv().byteSize() + l.wo().byteSize() + l.gateUp().byteSize() + l.down().byteSize();
        }
        return b;
    }

    /**
     * Bytes a decode step reads: every matrix but the embedding table (of which it reads one row per token), unless
     * it is the output too.
     */
    long bytesPerToken() {
        return byteSize() - (embedding == null || tied ? 0 : embedding.byteSize());
    }

    /** Multiply-adds of the matrices one token goes through here. */
    long elementsPerToken() {
        long n = output == null ? 0 : (long) output.rows() * output.cols();
        for (Layer l : layers) {
            for (Projection p : new Projection[] {l.qkv(), l.wo(), l.gateUp(), l.down()}) {
                n += (long) p.rows() * p.cols();
            }
        }
        return n;
    }

    /** The scratch a prefill chunk of up to maxTokens needs: Projection.gemmScratchBytes, the most of any layer's. */
    long gemmScratchBytes(int maxTokens) {
        long max = 0;
        for (Layer l : layers) {
            for (Projection p : new Projection[] {l.qkv(), l.wo(), l.gateUp(), l.down()}) {
                max = Math.max(max, p.gemmScratchBytes(maxTokens));
            }
        }
        return max;
    }

    @Override
    public void close() {
        owned.close();
    }
}
