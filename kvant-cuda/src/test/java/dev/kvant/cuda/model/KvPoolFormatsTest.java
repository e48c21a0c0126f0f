package dev.kvant.cuda.model;

import static org.junit.jupiter.api.Assertions.assertSame;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import org.junit.jupiter.api.Test;

/** The formats a stage of a layer split gives its layers (no GPU needed). */
class KvPoolFormatsTest {
    @Test
    void aStageNumbersItsLayersFromZeroAndKeepsTheModelsIndices() {
        KvFormat turbo3 = KvFormat.parse("turbo3");
        KvFormat q8 = KvFormat.parse("q8_0");
        KvFormat f16 = KvFormat.parse("f16");
        // model of 8 layers: layer 0 K q8_0, the last K and V q8_0, layer 5 V f16
        KvLayerFormats model = KvLayerFormats.of(turbo3, turbo3).withK(0, q8).withK(-1, q8).withV(-1, q8)
                .withV(5, f16);
        // stage of layers 4..7
        KvLayerFormats stage = KvPool.stageFormats(model, 4, 4, 8);
        for (int l = 0; l < 4; l++) {
            assertSame(model.k(4 + l, 8), stage.k(l, 4), "K of model layer " + (4 + l));
            assertSame(model.v(4 + l, 8), stage.v(l, 4), "V of model layer " + (4 + l));
        }
        assertSame(q8, stage.k(3, 4));
        assertSame(f16, stage.v(1, 4));
        // stage of layers 0..3: the model's last layer is not in it
        KvLayerFormats first = KvPool.stageFormats(model, 0, 4, 8);
        assertSame(q8, first.k(0, 4));
        assertSame(turbo3, first.k(3, 4));
        assertSame(turbo3, first.v(3, 4));
    }
}
