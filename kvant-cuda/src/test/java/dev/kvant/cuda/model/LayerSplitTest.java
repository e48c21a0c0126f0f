package dev.kvant.cuda.model;

import dev.kvant.gguf.GgmlType;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.LlamaWeights;
import dev.kvant.model.ModelConfig;
import dev.kvant.model.SyntheticModel;
import org.junit.jupiter.api.Test;

import java.util.Arrays;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The automatic layer split (no GPU needed). */
class LayerSplitTest {

    @Test
    void autoSplitCoversEveryLayerAndBalancesWeightBytes() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, 1)) {
            int layers = model.config().layers();
            for (int gpus = 1; gpus <= 4; gpus++) {
                int[] split = CudaBackend.autoSplit(model, gpus, 0);
                assertEquals(gpus, split.length);
                int sum = 0;
                long max = 0;
                long min = Long.MAX_VALUE;
                for (int i = 0, from = 0; i < gpus; i++) {
                    assertTrue(split[i] >= 1, java.util.Arrays.toString(split));
                    long bytes = CudaBackend.stageWeightBytes(model, from, from + split[i]);
                    max = Math.max(max, bytes);
                    min = Math.min(min, bytes);
                    from += split[i];
                    sum += split[i];
                }
                assertEquals(layers, sum);
                long layer = CudaBackend.stageWeightBytes(model, 1, 2);
                long total = CudaBackend.stageWeightBytes(model, 0, layers);
                // no GPU holds more than its share plus about one layer
                assertTrue(max <= total / gpus + layer + layer / 2,
                        gpus + " GPUs: " + java.util.Arrays.toString(split) + " max " + max + " total " + total);
            }
            assertThrows(IllegalArgumentException.class, () -> CudaBackend.autoSplit(model, layers + 1, 0));
        }
    }

    /**
     * A residual wider than the RMSNorm kernel takes is refused when the backend opens, before any device is touched
     * (it used to upload every weight and fail at the first step); so this needs no GPU.
     */
    @Test
    void aResidualTooWideForTheNormIsRefusedAtOpen() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, 1)) {
            ModelConfig c = model.config();
            int wide = ModelKernels.MAX_NORM_WIDTH + 32;
            ModelConfig wider = new ModelConfig(c.architecture(), wide, c.layers(), c.heads(), c.kvHeads(),
                    c.headDimK(), c.headDimV(), c.ffnDim(), c.vocabSize(), c.contextLength(), c.rmsEps(), c.rope(),
                    c.qkvBias(), c.qkNorm());
            LlamaModel m = new LlamaModel("wide", wider, model.weights(), null, () -> { });
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> CudaBackend.open(m, CudaBackend.Options.defaults()));
            assertTrue(e.getMessage().contains("RMSNorm") && e.getMessage().contains(Integer.toString(wide)),
                    e.getMessage());
        }
    }

    /** A tied embedding table is planned once where one stage holds both ends, and at each end of a split. */
    @Test
    void aTiedTableCountsOnceOnOneStageAndAtBothEndsOfASplit() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, 1)) {
            LlamaWeights w = model.weights();
            LlamaModel tied = new LlamaModel("tied", model.config(), new LlamaWeights(w.tokenEmbedding(),
                    w.outputNorm(), w.tokenEmbedding(), w.layers(), w.ropeFreqFactors()), null, () -> { });
            int layers = model.config().layers();
            long table = w.tokenEmbedding().data().byteSize();
            long untied = CudaBackend.stageWeightBytes(model, 0, layers);
            assertEquals(untied - table, CudaBackend.stageWeightBytes(tied, 0, layers));
            assertEquals(untied, CudaBackend.stageWeightBytes(tied, 0, 1) + CudaBackend.stageWeightBytes(tied, 1,
                    layers));
        }
    }

    @Test
    void autoSplitBalancesTheKvCacheWithTheWeights() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, 1)) {
            int layers = model.config().layers();
            long weights = CudaBackend.stageWeightBytes(model, 0, layers);
            long layer = CudaBackend.stageWeightBytes(model, 1, 2);
            for (long kv : new long[] {weights / 4, weights, 4 * weights, 1000 * weights}) {
                for (int gpus = 2; gpus <= 4; gpus++) {
                    int[] split = CudaBackend.autoSplit(model, gpus, kv);
                    double max = 0;
                    int sum = 0;
                    for (int i = 0, from = 0; i < gpus; i++) {
                        assertTrue(split[i] >= 1, java.util.Arrays.toString(split));
                        double bytes = CudaBackend.stageWeightBytes(model, from, from + split[i])
                                + (double) kv * split[i] / layers;
                        max = Math.max(max, bytes);
                        from += split[i];
                        sum += split[i];
                    }
                    assertEquals(layers, sum);
                    double perLayer = layer + (double) kv / layers;
                    assertTrue(max <= (weights + (double) kv) / gpus + 1.5 * perLayer,
                            gpus + " GPUs, KV " + kv + ": " + java.util.Arrays.toString(split));
                }
            }
            // a cache that dwarfs the weights is shared out by layer count
            int[] even = CudaBackend.autoSplit(model, 2, 1000 * weights);
            assertEquals(layers / 2, even[0], java.util.Arrays.toString(even));
        }
    }

    @Test
    void autoSplitGivesEachGpuLayersInProportionToItsRoom() {
        try (LlamaModel model = SyntheticModel.build(SyntheticModel.Shape.TINY, GgmlType.Q8_0, 1)) {
            int layers = model.config().layers();
            long weights = CudaBackend.stageWeightBytes(model, 0, layers);
            long kv = 4 * weights;  // the cache dominates: the split follows the room, layer for layer
            int[] even = CudaBackend.autoSplit(model, new long[] {1L << 30, 1L << 30}, kv);
            assertArrayEquals(CudaBackend.autoSplit(model, 2, kv), even, "equal room: the even split");
            int[] third = CudaBackend.autoSplit(model, new long[] {1L << 30, 2L << 30}, kv);
            assertEquals(layers, third[0] + third[1]);
            assertTrue(third[0] < third[1] && Math.abs(3 * third[0] - layers) <= 2,
                    "a GPU with half the room of the other holds about a third: " + Arrays.toString(third));
            int[] starved = CudaBackend.autoSplit(model, new long[] {1, 1L << 40, 1}, kv);
            assertArrayEquals(new int[] {1, layers - 2, 1}, starved, "every GPU still gets a layer");
            assertThrows(IllegalArgumentException.class,
                    () -> CudaBackend.autoSplit(model, new long[] {1L << 30, 0}, kv));
        }
    }

    @Test
    void theFitCheckCountsTheStagesActivationsBesideTheWeights() {
        ModelConfig c = SyntheticModel.Shape.LLAMA3_8B.config();
        // a prefill chunk of 2048 rows: gate|up's outputs alone are 4 B x 2048 x 2 x 14336 = 235 MB, their f16
        // operands and SwiGLU's 150 MB more, the f16 copy of gate|up (the prefill's weight scratch) 235 MB: 0.88 GiB
        // in all
        long prefill = Stage.scratchBytes(c, 2048, 8, 2048, true);
        assertTrue(prefill > 800L << 20 && prefill < 2L << 30, "scratch of a 2048-token chunk: " + prefill);
        long small = Stage.scratchBytes(c, 64, 8, 64, true);
        long middle = Stage.scratchBytes(c, 64, 8, 64, false);
        assertTrue(small < prefill / 2, small + " vs " + prefill);
        assertTrue(small - middle == 4L * 8 * c.vocabSize(), "the last stage adds the logits: " + (small - middle));
    }
}
