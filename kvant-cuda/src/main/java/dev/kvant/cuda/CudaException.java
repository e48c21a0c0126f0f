package dev.kvant.cuda;

/**
 * A CUDA library call (driver API, NVRTC or cuBLASLt) returned an error. The message names the call with the
 * arguments that matter, the library's symbolic error name and its description, e.g.
 * {@code cuMemAlloc_v2(17179869184 bytes) failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)}.
 */
public class CudaException extends RuntimeException {
    private final String call;
    private final int code;
    private final String errorName;

    public CudaException(String call, int code, String errorName, String description) {
        super(message(call, errorName, description));
        this.call = call;
        this.code = code;
        this.errorName = errorName;
    }

    protected CudaException(String call, int code, String errorName, String description, String detail) {
        super(message(call, errorName, description) + detail);
        this.call = call;
        this.code = code;
        this.errorName = errorName;
    }

    static String message(String call, String errorName, String description) {
        boolean describe = description != null && !description.isBlank() && !description.equals(errorName);
        return call + " failed: " + errorName + (describe ? " (" + description + ")" : "");
    }

    /** The call with its arguments, e.g. {@code cuMemAlloc_v2(17179869184 bytes)}. */
    public String call() {
        return call;
    }

    /** The numeric status the library returned (CUresult, nvrtcResult or cublasStatus_t). */
    public int code() {
        return code;
    }

    /** The library's symbolic name of the status, e.g. {@code CUDA_ERROR_OUT_OF_MEMORY}. */
    public String errorName() {
        return errorName;
    }
}
