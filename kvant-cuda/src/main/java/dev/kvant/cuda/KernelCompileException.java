package dev.kvant.cuda;

import java.util.List;

/** NVRTC rejected a kernel source. The message carries the compiler's whole log; {@link #log()} returns it alone. */
public final class KernelCompileException extends CudaException {
    private final String log;

    public KernelCompileException(String source, List<String> options, int code, String errorName, String log) {
        super("nvrtcCompileProgram(" + source + ", " + String.join(" ", options) + ")", code, errorName, null,
                log.isBlank() ? " (the compiler left no log)" : "\n" + log.strip());
        this.log = log;
    }

    /** The NVRTC program log: the compiler's errors and warnings, one per line. */
    public String log() {
        return log;
    }
}
