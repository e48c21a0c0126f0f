package dev.kvant.cuda;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** How NVRTC and cuBLASLt are looked for, and what the error says when they are not found. */
class NativeLibraryTest {

    @Test
    void overrideFolderComesFirstThenSonamesThroughTheLoader(@TempDir Path dir) {
        List<String> c = NativeLibrary.toolkitCandidates(Nvrtc.ENV, Nvrtc.SONAMES, Nvrtc.PIP_FOLDERS,
                Map.of("KVANT_NVRTC", dir.toString())::get);
        assertEquals(List.of(dir.resolve("libnvrtc.so").toString(), dir.resolve("libnvrtc.so.13").toString(),
                dir.resolve("libnvrtc.so.12").toString(), "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"),
                c.subList(0, 6));
    }

    @Test
    void overrideNamingAFileIsTriedAsIs() {
        List<String> c = NativeLibrary.toolkitCandidates(CublasLt.ENV, CublasLt.SONAMES, CublasLt.PIP_FOLDERS,
                Map.of("KVANT_CUBLASLT", "/opt/x/libcublasLt.so.13.1")::get);
        assertEquals("/opt/x/libcublasLt.so.13.1", c.get(0));
        assertEquals("libcublasLt.so", c.get(1));
    }

    @Test
    void pipWheelFoldersInSitePackagesAreSearched(@TempDir Path home) throws IOException {
        Path cu13 = Files.createDirectories(home.resolve(".local/lib/python3.12/site-packages/nvidia/cu13/lib"));
        Path cu12 = Files.createDirectories(home.resolve(".local/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib"));
        List<String> c = NativeLibrary.toolkitCandidates(Nvrtc.ENV, Nvrtc.SONAMES, Nvrtc.PIP_FOLDERS,
                Map.of("HOME", home.toString())::get);
        assertTrue(c.contains(cu13.resolve("libnvrtc.so.13").toString()), c.toString());
        assertTrue(c.indexOf(cu13.resolve("libnvrtc.so.13").toString())
                < c.indexOf(cu12.resolve("libnvrtc.so.12").toString()), "CUDA 13's wheel before 12's: " + c);
        assertFalse(c.stream().anyMatch(s -> s.contains("python3.12/dist-packages")), "only folders that exist");
    }

    @Test
    void failureListsEveryCandidateTriedAndHowToPointElsewhere(@TempDir Path dir) throws IOException {
        Path notALibrary = Files.writeString(dir.resolve("libnvrtc.so.13"), "text, not ELF");
        CudaUnavailableException e = assertThrows(CudaUnavailableException.class, () -> NativeLibrary.load("libnvrtc",
                List.of("libkvant-absent.so", notALibrary.toString(), "/nonexistent/libnvrtc.so"),
                NativeLibrary.toolkitSearchNote(Nvrtc.ENV, Nvrtc.PIP_FOLDERS)));
        assertEquals("libnvrtc could not be loaded (tried libkvant-absent.so, " + notALibrary
                + "; searched the dynamic loader path, /usr/local/cuda*/lib64 and python site-packages "
                + "nvidia/cu13/lib, nvidia/cuda_nvrtc/lib; set KVANT_NVRTC to the library or its folder)", e.getMessage());
    }

    @Test
    void aLibraryThatLoadsIsFoundAndItsMissingFunctionsAreNamed() {
        // libc is on every Linux machine: it loads, and has no CUDA symbols.
        NativeLibrary libc = NativeLibrary.load("libc", List.of("libkvant-absent.so", "libc.so.6"), "");
        assertEquals("libc.so.6", libc.loadedFrom());
        CudaUnavailableException e = assertThrows(CudaUnavailableException.class,
                () -> libc.function("cuInit", java.lang.foreign.FunctionDescriptor.of(java.lang.foreign.ValueLayout.JAVA_INT)));
        assertEquals("libc (libc.so.6) has no function cuInit: the library is older than kvant needs", e.getMessage());
    }

    /** NVRTC 12.0 cannot assemble the kernels' PTX 8.1 (cvt.rn.satfinite.f16): refused when loaded, by name. */
    @Test
    void anNvrtcOlderThanTheKernelsNeedIsRefusedNamingWhatItNeeds() {
        CudaUnavailableException e = assertThrows(CudaUnavailableException.class,
                () -> Nvrtc.requireSupported(12, 0, "/opt/cuda-12.0/lib64/libnvrtc.so.12"));
        assertEquals("libnvrtc at /opt/cuda-12.0/lib64/libnvrtc.so.12 is NVRTC 12.0; kvant's kernels need NVRTC 12.1"
                + " or later (PTX ISA 8.1); point KVANT_NVRTC at a newer one", e.getMessage());
        assertThrows(CudaUnavailableException.class, () -> Nvrtc.requireSupported(11, 8, "x"));
        Nvrtc.requireSupported(12, 1, "x");
        Nvrtc.requireSupported(13, 0, "x");
    }
}
