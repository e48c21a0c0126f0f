package dev.kvant.cuda;

import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.SymbolLookup;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeFalse;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/** What the CUDA entry points say on a machine without a GPU (this one, CI) — and that they never crash. */
class CudaAvailabilityTest {

    @Test
    void availableNeverThrowsAndAlwaysGivesAReason() {
        CudaAvailability a = Cuda.available();
        assertFalse(a.reason().isBlank(), "a reason, available or not");
        if (!a.ok()) {
            assertEquals(0, a.deviceCount(), a.reason());
        } else {
            assertTrue(a.deviceCount() > 0, a.reason());
        }
        assertEquals(a, Cuda.available(), "probed once, the same answer every time");
    }

    @Test
    void availableIsFalseWithAReasonNamingLibcudaWhereTheDriverIsMissing() {
        assumeFalse(libcudaMayBePresent(), "a libcuda.so.1 exists on this machine");
        CudaAvailability a = Cuda.available();
        assertFalse(a.ok());
        assertTrue(a.reason().startsWith("libcuda.so.1 could not be loaded ("), a.reason());
        assertTrue(a.reason().contains("is the NVIDIA driver installed?"), a.reason());
    }

    @Test
    void requireAvailableThrowsCudaUnavailableExceptionNamingLibcuda() {
        assumeFalse(libcudaMayBePresent(), "a libcuda.so.1 exists on this machine");
        CudaUnavailableException e = assertThrows(CudaUnavailableException.class, Cuda::requireAvailable);
        assertTrue(e.getMessage().startsWith("no CUDA GPU: libcuda.so.1 could not be loaded ("), e.getMessage());
        assertThrows(CudaUnavailableException.class, Cuda::driver);
    }

    @Test
    void requireAvailableThrowsWithTheSameReasonAvailableGives() {
        CudaAvailability a = Cuda.available();
        assumeFalse(a.ok(), "CUDA is available here");
        CudaUnavailableException e = assertThrows(CudaUnavailableException.class, Cuda::requireAvailable);
        assertEquals("no CUDA GPU: " + a.reason(), e.getMessage());
    }

    @Test
    void openingAContextWithoutCudaThrowsUnavailableNotACrash() {
        assumeFalse(Cuda.available().ok(), "CUDA is available here");
        assertThrows(CudaUnavailableException.class, CudaContext::open);
        assertThrows(CudaUnavailableException.class, () -> CudaContext.open(0));
    }

    @Test
    void probeOfMissingLibrariesListsEveryCandidateTried() {
        Cuda.Probe p = Cuda.probe(List.of("libkvant-test-absent.so.1", "libkvant-test-absent.so.2",
                "/nonexistent/kvant/libcuda.so.1"));
        assertFalse(p.availability().ok());
        String reason = p.availability().reason();
        assertTrue(reason.startsWith("libcuda.so.1 could not be loaded (tried libkvant-test-absent.so.1, "
                + "libkvant-test-absent.so.2; is the NVIDIA driver installed?"), reason);
        assertEquals(null, p.driver());
    }

    @Test
    void probeOfAFileThatIsNotALibraryReportsItWithoutCrashing() throws Exception {
        Path fake = Files.createTempFile("kvant-fake-libcuda", ".so.1");
        try {
            Files.writeString(fake, "not an ELF shared object");
            Cuda.Probe p = Cuda.probe(List.of(fake.toString()));
            assertFalse(p.availability().ok());
            assertTrue(p.availability().reason().contains("tried " + fake), p.availability().reason());
        } finally {
            Files.delete(fake);
        }
    }

    @Test
    void libcudaOverrideIsTriedBeforeTheLoaderPath() {
        List<String> c = Cuda.libcudaCandidates(Map.of("KVANT_LIBCUDA", " /opt/driver/libcuda.so.1 ")::get);
        assertEquals(List.of("/opt/driver/libcuda.so.1", "libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1"), c);
        assertEquals(List.of("libcuda.so.1", "/usr/lib/wsl/lib/libcuda.so.1"), Cuda.libcudaCandidates(k -> null));
    }

    @Test
    void deviceOrdinalComesFromKvantCudaDeviceOrDefaultsToZero() {
        assertEquals(0, CudaContext.deviceFromEnvironment(Map.of()));
        assertEquals(3, CudaContext.deviceFromEnvironment(Map.of("KVANT_CUDA_DEVICE", "3")));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> CudaContext.deviceFromEnvironment(Map.of("KVANT_CUDA_DEVICE", "gpu0")));
        assertTrue(e.getMessage().contains("KVANT_CUDA_DEVICE='gpu0'"), e.getMessage());
    }

    @Test
    void versionsPrintAsMajorDotMinor() {
        assertEquals("13.0", Cuda.versionString(13000));
        assertEquals("12.8", Cuda.versionString(12080));
    }

    /**
     * Whether the dynamic loader finds a libcuda.so.1 here (then the "missing driver" tests do not apply): asked of
     * the loader itself, which searches folders a fixed list would miss (a container's compat folder, say), where a
     * driver that loads but finds no GPU gives another reason.
     */
    static boolean libcudaMayBePresent() {
        for (String candidate : Cuda.libcudaCandidates(System::getenv)) {   // the names and paths Cuda tries
            try {
                SymbolLookup.libraryLookup(candidate, Arena.ofAuto());
                return true;
            } catch (IllegalArgumentException e) {   // not there, or not loadable
            }
            if (candidate.startsWith("/") && Files.exists(Path.of(candidate))) {
                return true;   // there but not loadable: the probe's reason is then another one
            }
        }
        return false;
    }

    @Test
    void gpuFixtureSkipsRatherThanFailsWithoutCuda() {
        assumeTrue(!Cuda.available().ok(), "CUDA is available here");
        org.opentest4j.TestAbortedException e = assertThrows(org.opentest4j.TestAbortedException.class,
                GpuFixture::assumeCuda);
        assertTrue(e.getMessage().contains("libcuda") || e.getMessage().contains("device"), e.getMessage());
    }
}
