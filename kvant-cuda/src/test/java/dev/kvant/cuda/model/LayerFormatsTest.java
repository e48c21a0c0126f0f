package dev.kvant.cuda.model;

import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import org.junit.jupiter.api.Test;

/** The device caches keep one format pair for all layers: layers of their own are refused before anything is made. */
class LayerFormatsTest {
    @Test
    void layersOfTheirOwnAreRefusedWithTheWayOut() {
        KvFormat turbo3 = KvFormat.parse("turbo3");
        KvLayerFormats mixed = KvLayerFormats.of(turbo3, turbo3).withK(-1, KvFormat.parse("q8_0"));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> CudaBackend.uniform(mixed));
        assertTrue(e.getMessage().contains("--backend cpu") && e.getMessage().contains("layer -1: q8_0/turbo3"),
                e.getMessage());
        KvLayerFormats same = KvLayerFormats.of(turbo3, turbo3).withK(-1, turbo3);
        assertSame(same, CudaBackend.uniform(same));
    }
}
