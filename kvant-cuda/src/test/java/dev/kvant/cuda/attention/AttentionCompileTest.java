package dev.kvant.cuda.attention;

import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.cuda.CudaUnavailableException;
import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.Nvrtc;
import java.nio.file.Path;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Every standard attention module compiles with NVRTC for sm_90 (no GPU needed, only the library). Slow (about a minute
 * on two shared cores), so it runs with -Pslow; skipped without NVRTC.
 */
@Tag("slow")
class AttentionCompileTest {
    @TempDir
    Path dir;

    @Test
    void everyStandardModuleCompilesForSm90() {
        Nvrtc nvrtc;
        try {
            nvrtc = Nvrtc.load();
        } catch (CudaUnavailableException e) {
            Assumptions.abort("no NVRTC: " + e.getMessage());
            return;
        }
        KernelCache cache = new KernelCache(dir, nvrtc, 13000);
        AttentionPrecompile.compile(cache, "sm_90", AttentionPrecompile.standardShapes(),
                Runtime.getRuntime().availableProcessors());
        assertTrue(cache.stats().compiles() == AttentionPrecompile.standardShapes().size(), cache.stats().toString());
    }
}
