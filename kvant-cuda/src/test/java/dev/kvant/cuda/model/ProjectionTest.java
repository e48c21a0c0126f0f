package dev.kvant.cuda.model;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Which prefill path a projection takes and the scratch it needs, without a device: the parts are descriptions
 * only (no buffers), as the host logic reads nothing else.
 */
class ProjectionTest {
    private static DeviceMatrix part(WeightLayout layout, int rows, int cols) {
        return new DeviceMatrix(layout, null, 0, 0, rows, cols);
    }

    @Test
    void shortChunksOf8BitFormatsTakeTheDequantizingProductsEvenWhenThePartsDiffer() {
        // Q4_K_M's usual q|k|v: q and k in Q4_K, v in Q6_K
        Projection qkv = new Projection(List.of(part(WeightLayout.Q4_K, 5120, 4096), part(WeightLayout.Q6_K, 1024,
                4096)));
        assertTrue(qkv.fused(1));
        assertTrue(qkv.fused(Projection.FUSED_GEMM_TOKENS));
        assertFalse(qkv.fused(Projection.FUSED_GEMM_TOKENS + 1), "past the limit: cuBLASLt");
        assertFalse(qkv.inPlace());
        // partial sums: up to 8 column splits of the chunk's tokens (at most the limit) for every row
        long partial = 4L * ModelKernels.MH_MAX_SPLITS * Projection.FUSED_GEMM_TOKENS * 6144;
        assertEquals(partial, qkv.gemmScratchBytes(Projection.FUSED_GEMM_TOKENS), "short chunks only");
        assertEquals(4L * ModelKernels.MH_MAX_SPLITS * 16 * 6144, qkv.gemmScratchBytes(16));
        assertEquals(Math.max(partial, 2L * 6144 * 4096), qkv.gemmScratchBytes(512), "and the f16 copy past them");
    }

    @Test
    void f16WeightsAreTheGemmsOperandAsUploaded() {
        Projection gateUp = new Projection(List.of(part(WeightLayout.F16, 28672, 4096)));
        assertTrue(gateUp.inPlace());
        assertFalse(gateUp.fused(1), "no dequantizing products for floats");
        assertEquals(0, gateUp.gemmScratchBytes(8));
        assertEquals(0, gateUp.gemmScratchBytes(512));
    }

    @Test
    void otherFloatFormatsAndMixturesGoThroughAnF16Copy() {
        Projection bf16 = new Projection(List.of(part(WeightLayout.BF16, 4096, 4096)));
        assertFalse(bf16.inPlace());
        assertFalse(bf16.fused(1));
        assertEquals(2L * 4096 * 4096, bf16.gemmScratchBytes(8));
        // F16 beside Q8_0: two parts, so neither in place nor fused
        Projection mixed = new Projection(List.of(part(WeightLayout.F16, 4096, 4096), part(WeightLayout.Q8_0, 2048,
                4096)));
        assertFalse(mixed.inPlace());
        assertFalse(mixed.fused(1));
        assertEquals(2L * 6144 * 4096, mixed.gemmScratchBytes(8));
    }
}
