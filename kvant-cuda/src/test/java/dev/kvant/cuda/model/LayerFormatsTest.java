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
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> CudaBackend.onePair(mixed, 4));
        assertTrue(e.getMessage().contains("--backend cpu") && e.getMessage().contains("layer -1: q8_0/turbo3"),
                e.getMessage());
        // overrides that name the base format, or give every layer the same one, leave one pair
        KvFormat q8 = KvFormat.parse("q8_0");
        assertSame(turbo3, CudaBackend.onePair(KvLayerFormats.of(turbo3, turbo3).withK(-1, turbo3), 4)[0]);
        KvFormat[] all = CudaBackend.onePair(KvLayerFormats.of(turbo3, turbo3).withK(0, q8).withK(-1, q8), 2);
        assertSame(q8, all[0]);
        assertSame(turbo3, all[1]);
        // a layer the model does not have is refused as on the CPU
        assertThrows(IllegalArgumentException.class,
                () -> CudaBackend.onePair(KvLayerFormats.of(turbo3, turbo3).withK(99, turbo3), 4));
    }
}
