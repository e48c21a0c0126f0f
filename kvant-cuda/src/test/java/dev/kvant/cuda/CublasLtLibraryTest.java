package dev.kvant.cuda;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertTrue;

/** The cuBLASLt library binds (every function kvant uses is exported). Needs the library, not a GPU. */
@Tag("gpu")
class CublasLtLibraryTest {

    @Test
    void everyFunctionBindsAndTheVersionIsThirteenOrTwelve() {
        long version;
        try {
            version = CublasLt.libraryVersion();
        } catch (CudaUnavailableException e) {
            Assumptions.abort("no cuBLASLt: " + e.getMessage());
            return;
        }
        System.out.println("cuBLASLt " + version + " from " + CublasLt.libraryPath());
        assertTrue(version / 10000 == 13 || version / 10000 == 12, "version " + version);
    }
}
