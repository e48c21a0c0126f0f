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
 * Every standard attention module compiles with NVRTC for sm_90a, what an H100/H200 runs (its f16 and bf16 prefill on
 * wgmma), and for sm_90, what the other architectures run (no GPU needed, only the library). Slow (about two minutes
 * on two shared cores), so it runs with -Pslow; skipped without NVRTC.
 */
@Tag("slow")
class AttentionCompileTest {
    @TempDir
    Path dir;

    @Test
    void everyStandardModuleCompilesForSm90aAndSm90() {
        Nvrtc nvrtc;
        try {
            nvrtc = Nvrtc.load();
        } catch (CudaUnavailableException e) {
            Assumptions.abort("no NVRTC: " + e.getMessage());
            return;
        }
        KernelCache cache = new KernelCache(dir, nvrtc, 13000);
        for (String arch : new String[] {"sm_90a", "sm_90"}) {
            AttentionPrecompile.compile(cache, arch, AttentionPrecompile.standardShapes(),
                    Runtime.getRuntime().availableProcessors());
        }
        int modules = AttentionPrecompile.standardShapes().size();
        assertTrue(cache.stats().compiles() == 2 * modules, cache.stats().toString());
    }
}
