package dev.kvant.cuda.model;

import dev.kvant.gguf.GgmlType;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.SyntheticModel;
import org.junit.jupiter.api.Test;

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
                int[] split = CudaBackend.autoSplit(model, gpus);
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
            assertThrows(IllegalArgumentException.class, () -> CudaBackend.autoSplit(model, layers + 1));
        }
    }
}
