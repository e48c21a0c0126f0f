package dev.kvant.cuda;

/**
 * The CUDA backend cannot run here: no driver library, no device, or a required CUDA library missing. The message
 * says which, and what was tried, e.g. {@code no CUDA GPU: libcuda.so.1 could not be loaded (...)}.
 */
public final class CudaUnavailableException extends RuntimeException {
    public CudaUnavailableException(String message) {
        super(message);
    }

    public CudaUnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
