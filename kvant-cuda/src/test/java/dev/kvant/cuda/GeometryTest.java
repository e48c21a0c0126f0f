package dev.kvant.cuda;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.assertThrows;

/** The arithmetic of launches, pools and operand alignment: pure Java, checked without a GPU. */
class GeometryTest {

    @Test
    void poolSlicesAreRoundedUpTo256Bytes() {
        assertEquals(256, DevicePool.alignUp(1));
        assertEquals(256, DevicePool.alignUp(256));
        assertEquals(512, DevicePool.alignUp(257));
        assertEquals(1L << 40, DevicePool.alignUp((1L << 40) - 255));
    }

    @Test
    void copyGridCoversSmallCopiesAndCapsAtEightBlocksPerSm() {
        assertEquals(1, DeviceCopy.gridFor(1, 132));
        assertEquals(1, DeviceCopy.gridFor(256, 132));
        assertEquals(2, DeviceCopy.gridFor(257, 132));
        assertEquals(132 * 8, DeviceCopy.gridFor(1L << 28, 132));
        assertEquals(8, DeviceCopy.gridFor(1L << 28, 0), "a device reporting no SMs still gets a grid");
    }

    @Test
    void operandAlignmentIsTheLargestPowerOfTwoUpTo256() {
        assertEquals(256, CublasLt.alignment(0x7f0000000000L));
        assertEquals(256, CublasLt.alignment(0x7f0000000100L));
        assertEquals(128, CublasLt.alignment(0x7f0000000080L));
        assertEquals(2, CublasLt.alignment(0x7f0000000002L));
        assertEquals(256, CublasLt.alignment(0));
    }

    @Test
    void heuristicResultStructIs96Bytes() {
        // cublasLt.h: { cublasLtMatmulAlgo_t algo (uint64_t data[8]); size_t workspaceSize; cublasStatus_t state;
        //               float wavesCount; int reserved[4]; }
        assertEquals(96, CublasLt.HEURISTIC_RESULT_BYTES);
        assertEquals(64, CublasLt.HEURISTIC_WORKSPACE_OFFSET);
        assertEquals(72, CublasLt.HEURISTIC_STATE_OFFSET);
    }

    @Test
    void launchDimensionsRejectEmptyExtentsAndCountThreads() {
        assertEquals(256 * 4 * 2, new Dim3(256, 4, 2).volume());
        assertEquals(new Dim3(7, 1, 1), Dim3.of(7));
        assertThrows(IllegalArgumentException.class, () -> Dim3.of(0));
        assertThrows(IllegalArgumentException.class, () -> new Dim3(1, 1, -1));
    }

    @Test
    void computeCapabilityNamesTheRealArchitecture() {
        assertEquals("sm_90a", new ComputeCapability(9, 0).arch());
        assertEquals("sm_120", new ComputeCapability(12, 0).arch());
        assertEquals("8.9", new ComputeCapability(8, 9).toString());
    }

    @Test
    void kvantKernelsNeedAmpereOrNewerAndSaySoByName() {
        for (int[] ok : new int[][] {{8, 0}, {8, 6}, {8, 9}, {9, 0}, {10, 0}, {12, 0}}) {
            new ComputeCapability(ok[0], ok[1]).requireKvantKernels("device");  // no exception
        }
        for (int[] old : new int[][] {{7, 5}, {7, 0}, {6, 1}}) {
            CudaUnavailableException e = assertThrows(CudaUnavailableException.class,
                    () -> new ComputeCapability(old[0], old[1]).requireKvantKernels("CUDA device 0 (Tesla T4)"));
            assertTrue(e.getMessage().contains("CUDA device 0 (Tesla T4) has compute capability " + old[0] + "."
                    + old[1]), e.getMessage());
            assertTrue(e.getMessage().contains("8.0 or newer") && e.getMessage().contains("--backend cpu"),
                    e.getMessage());
        }
        assertTrue(new ComputeCapability(9, 0).atLeast(new ComputeCapability(8, 9)));
        assertTrue(!new ComputeCapability(8, 6).atLeast(new ComputeCapability(8, 9)));
    }
}
