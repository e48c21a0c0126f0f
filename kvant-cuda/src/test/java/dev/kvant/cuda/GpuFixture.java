package dev.kvant.cuda;

import org.junit.jupiter.api.Assumptions;


/**
 * What the GPU-tagged tests share: the assumptions that make them skip (not fail) without CUDA or NVRTC, and seeded
 * randomness whose seed goes into every assertion message.
 */
final class GpuFixture {
    private GpuFixture() {
    }

    /** Skips the calling test unless a CUDA device can be used. */
    static void assumeCuda() {
        CudaAvailability a = Cuda.available();
        Assumptions.assumeTrue(a.ok(), () -> "no CUDA GPU: " + a.reason());
    }

    /** NVRTC, or skips the calling test when the library cannot be found. NVRTC needs no GPU. */
    static Nvrtc assumeNvrtc() {
        try {
            return Nvrtc.load();
        } catch (CudaUnavailableException e) {
            Assumptions.abort("no NVRTC: " + e.getMessage());
            throw e;
        }
    }

    /** A fresh seed, printed so a failure can be replayed. */
    static long seed(String test) {
        long seed = TestSeed.next();
        System.out.println(test + ": seed " + seed);
        return seed;
    }

    /** A compiler that counts its runs: a cache hit is a request that did not reach it. */
    static final class CountingCompiler implements KernelCompiler {
        private final KernelCompiler delegate;
        int calls;

        CountingCompiler(KernelCompiler delegate) {
            this.delegate = delegate;
        }

        @Override
        public byte[] compile(KernelSource source, java.util.List<String> options) {
            calls++;
            return delegate.compile(source, options);
        }

        @Override
        public String version() {
            return delegate.version();
        }
    }
}
