package dev.kvant.cuda;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class CudaExceptionTest {

    @Test
    void messageNamesTheCallTheErrorNameAndItsDescription() {
        CudaException e = new CudaException("cuMemAlloc_v2(17179869184 bytes)", 2, "CUDA_ERROR_OUT_OF_MEMORY",
                "out of memory");
        assertEquals("cuMemAlloc_v2(17179869184 bytes) failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)",
                e.getMessage());
        assertEquals(2, e.code());
        assertEquals("CUDA_ERROR_OUT_OF_MEMORY", e.errorName());
        assertEquals("cuMemAlloc_v2(17179869184 bytes)", e.call());
    }

    @Test
    void descriptionThatRepeatsTheNameIsLeftOut() {
        assertEquals("nvrtcGetCUBIN(x.cu) failed: NVRTC_ERROR_INVALID_PROGRAM",
                new CudaException("nvrtcGetCUBIN(x.cu)", 4, "NVRTC_ERROR_INVALID_PROGRAM", null).getMessage());
        assertEquals("f() failed: X", new CudaException("f()", 1, "X", "X").getMessage());
    }

    @Test
    void compileFailureCarriesTheWholeLog() {
        String log = "bad.cu(3): error: identifier \"oops\" is undefined\n\n1 error detected in the compilation of \"bad.cu\".\n";
        KernelCompileException e = new KernelCompileException("bad.cu", List.of("--gpu-architecture=sm_90", "--std=c++17"),
                6, "NVRTC_ERROR_COMPILATION", log);
        assertTrue(e.getMessage().startsWith(
                "nvrtcCompileProgram(bad.cu, --gpu-architecture=sm_90 --std=c++17) failed: NVRTC_ERROR_COMPILATION\n"),
                e.getMessage());
        assertTrue(e.getMessage().contains("identifier \"oops\" is undefined"), e.getMessage());
        assertTrue(e.getMessage().contains("1 error detected"), e.getMessage());
        assertEquals(log, e.log());
    }
}
