package dev.kvant.cuda.model;

import org.junit.jupiter.api.Test;

import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * model.cu against the host code that launches it (no GPU needed): the launch geometry the host assumes is the one
 * the kernels were written for, and every kernel the host looks up is defined. A mismatch shows on a GPU only as
 * wrong outputs or an illegal address (a block of 4 warps launched for kernels of 8 read past its shared memory).
 */
class ModelSourceTest {
    private static final String CODE = ModelKernels.SOURCE.code();

    private static int define(String name) {
        Matcher m = Pattern.compile("(?m)^#define " + name + " (\\d+)").matcher(CODE);
        assertTrue(m.find(), "model.cu defines " + name);
        return Integer.parseInt(m.group(1));
    }

    @Test
    void launchGeometryIsTheKernels() {
        assertEquals(ModelKernels.MV_WARPS, define("MV_WARPS"), "warps a block of the float and dp4a products");
        assertEquals(ModelKernels.MT_WARPS, define("MT_WARPS"), "warps a block of the tensor-core products");
        assertEquals(ModelKernels.MT_STAGES, define("MT_STAGES"), "stages of a warp's ring");
        // the tensor-core kernel adds its sums in the one-vector kernel's order only with 4 warps of 8-block groups
        assertEquals(4, ModelKernels.MT_WARPS);
        assertEquals(272, define("MT_XSTRIDE"), "a vector's codes in a stage (ModelKernels.mtSharedBytes)");
        assertEquals(ModelKernels.MH_WARPS, define("MH_WARPS"), "warps a block of the dequantizing f16 products");
        assertEquals(ModelKernels.MH_VECTORS, define("MH_VECTORS"), "vectors a block of them");
        assertEquals(ModelKernels.MH_STAGES, define("MH_STAGES"), "stages of their ring");
        assertEquals(ModelKernels.MH_ROWS, 16 * ModelKernels.MH_WARPS, "16 rows a warp");
        assertEquals(ModelKernels.MH_XSTRIDE, define("MH_XSTRIDE"), "a vector's f16 in a stage (mhSharedBytes)");
        assertTrue(CODE.contains("int o0 = (blockIdx.x * MH_WARPS + warp) * 16;"),
                "a dequantizing block's rows are 16 a warp (ModelKernels.MH_ROWS)");
    }

    @Test
    void everyKernelTheHostLooksUpIsDefined() {
        for (WeightLayout l : WeightLayout.values()) {
            assertTrue(CODE.contains("KVANT_FORMAT_KERNELS(" + l.kernelSuffix + ", "), l + ": float products");
            if (l.q8Vectors) {
                assertTrue(CODE.contains("KVANT_Q8_KERNELS(" + l.kernelSuffix + ", "), l + ": dp4a products");
                assertTrue(CODE.contains("KVANT_MT_KERNEL(" + l.kernelSuffix + ", "), l + ": tensor-core products");
                assertTrue(CODE.contains("KVANT_MH_KERNEL(" + l.kernelSuffix + ", "), l + ": dequantizing products");
            }
        }
        assertTrue(CODE.contains("kvant_mh_reduce("), "the dequantizing products' split sums");
        for (String macro : new String[] {"kvant_mq1r1_##NAME", "kvant_mq1r2_##NAME", "kvant_mt_##NAME", "kvant_mh_##NAME",
                "kvant_mv1_##NAME", "kvant_mv8_##NAME", "kvant_embed_##NAME", "kvant_dequant_##NAME"}) {
            assertTrue(CODE.contains(macro), macro);
        }
    }

    @Test
    void sharedMemoryCoversEveryStage() {
        // a stage: 16 rows at their padded stride, 8 vectors of 272 bytes, 64 scale pairs, the rows' scales
        assertEquals(4 * 2 * (16 * 144 + 8 * 272 + 512 + 256), ModelKernels.mtSharedBytes(WeightLayout.Q4_0));
        assertEquals(4 * 2 * (16 * 272 + 8 * 272 + 512 + 256), ModelKernels.mtSharedBytes(WeightLayout.Q8_0));
        assertEquals(4 * 2 * (16 * 144 + 8 * 272 + 512), ModelKernels.mtSharedBytes(WeightLayout.Q4_K));
        assertEquals(4 * 2 * (16 * 176 + 8 * 272 + 512), ModelKernels.mtSharedBytes(WeightLayout.Q5_K));
        assertEquals(4 * 2 * (16 * 208 + 8 * 272 + 512 + 32), ModelKernels.mtSharedBytes(WeightLayout.Q6_K));
        // the dequantizing products: per stage 4 warps' rows and scales, 32 vectors of 544 bytes
        assertEquals(2 * (4 * (16 * 272 + 256) + 32 * 544), ModelKernels.mhSharedBytes(WeightLayout.Q8_0));
        assertEquals(2 * (4 * (16 * 208 + 32) + 32 * 544), ModelKernels.mhSharedBytes(WeightLayout.Q6_K));
        Matcher m = Pattern.compile("RBP = F == W_Q8_0 \\? 272 : F == W_Q4_0 \\? 144 : RB;").matcher(CODE);
        assertTrue(m.find(), "MtGeom's padded strides are the ones mtSharedBytes counts");
        // the largest block asks for less than the 227 KB a block may opt in to on sm_90
        for (WeightLayout l : WeightLayout.values()) {
            if (l.q8Vectors) {
                assertTrue(ModelKernels.mtSharedBytes(l) <= 227 * 1024, l.toString());
                assertTrue(ModelKernels.mhSharedBytes(l) <= 227 * 1024, l.toString());
            }
        }
    }
}
