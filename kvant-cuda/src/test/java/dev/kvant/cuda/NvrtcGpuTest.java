package dev.kvant.cuda;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * NVRTC through FFM. Needs the NVRTC library but no GPU: it runs wherever libnvrtc is found (KVANT_NVRTC may point
 * at one) and targets the device's architecture when there is a device, sm_90 otherwise.
 */
@Tag("gpu")
class NvrtcGpuTest {
    private static Nvrtc nvrtc;
    private static String arch;

    @BeforeAll
    static void loadNvrtc() {
        try {
            nvrtc = Nvrtc.load();
        } catch (CudaUnavailableException e) {
            return;
        }
        arch = "sm_90";
        if (Cuda.available().ok()) {
            try (CudaContext context = CudaContext.open()) {
                arch = context.computeCapability().arch();
            }
        }
        System.out.println("NVRTC " + nvrtc.version() + " from " + nvrtc.loadedFrom() + ", compiling for " + arch);
    }

    @BeforeEach
    void requireNvrtc() {
        GpuFixture.assumeNvrtc();
    }

    @Test
    void versionIsThirteenOrTwelve() {
        assertTrue(nvrtc.major() == 13 || nvrtc.major() == 12, nvrtc.version());
    }

    @Test
    void syntaxErrorThrowsWithTheCompilerLog() {
        KernelSource broken = new KernelSource("broken.cu", """
                extern "C" __global__ void broken(float* out) {
                    out[threadIdx.x] = kvant_undefined_name * 2.0f;
                }
                """);
        List<String> options = KernelCache.options(arch, Map.of());
        KernelCompileException e = assertThrows(KernelCompileException.class, () -> nvrtc.compile(broken, options));
        assertEquals("NVRTC_ERROR_COMPILATION", e.errorName());
        assertTrue(e.log().contains("kvant_undefined_name"), e.log());
        assertTrue(e.log().contains("broken.cu"), "the log names the file: " + e.log());
        assertTrue(e.getMessage().contains(e.log().strip()), "the message carries the whole log: " + e.getMessage());
        assertTrue(e.getMessage().startsWith("nvrtcCompileProgram(broken.cu, --gpu-architecture=" + arch),
                e.getMessage());
    }

    @Test
    void kvantKernelsCompileToCubinForARealArchitecture() {
        for (String name : List.of("copy.cu", "fill_check.cu")) {
            byte[] cubin = nvrtc.compile(KernelSource.resource(name), KernelCache.options(arch, Map.of()));
            assertTrue(cubin.length > 1000, name + ": " + cubin.length + " bytes");
            assertEquals(0x7F, cubin[0] & 0xFF, name + " is an ELF image (a cubin, not PTX)");
            assertEquals('E', cubin[1], name);
            assertEquals('L', cubin[2], name);
            assertEquals('F', cubin[3], name);
        }
    }

    @Test
    void definesReachTheSource() {
        KernelSource needsDefine = new KernelSource("define.cu", """
                #if KVANT_TILE != 64
                #error KVANT_TILE must be 64
                #endif
                extern "C" __global__ void k(float* out) { out[threadIdx.x] = KVANT_TILE; }
                """);
        assertTrue(nvrtc.compile(needsDefine, KernelCache.options(arch, Map.of("KVANT_TILE", "64"))).length > 0);
        KernelCompileException e = assertThrows(KernelCompileException.class,
                () -> nvrtc.compile(needsDefine, KernelCache.options(arch, Map.of("KVANT_TILE", "32"))));
        assertTrue(e.log().contains("KVANT_TILE must be 64"), e.log());
    }

    @Test
    void optimisationFlagO3IsRejectedAsNvrtcDoes() {
        KernelSource ok = new KernelSource("ok.cu", "extern \"C\" __global__ void k() {}");
        CudaException e = assertThrows(CudaException.class,
                () -> nvrtc.compile(ok, List.of("--gpu-architecture=" + arch, "-O3")));
        assertEquals("NVRTC_ERROR_INVALID_OPTION", e.errorName(), e.getMessage());
    }
}
