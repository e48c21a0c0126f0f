package dev.kvant.cuda;

import java.util.List;

/**
 * Turns CUDA source into a cubin. {@link Nvrtc} is the real one; the interface exists so that {@link KernelCache}
 * can be tested without a CUDA toolkit.
 */
public interface KernelCompiler {

    /**
     * Compiles {@code source} with {@code options} (which name the target architecture).
     *
     * @throws KernelCompileException with the compiler's log, when the source does not compile
     */
    byte[] compile(KernelSource source, List<String> options);

    /** Identifies the compiler build, e.g. {@code nvrtc 13.0}: a new compiler must not reuse old cubins. */
    String version();
}
