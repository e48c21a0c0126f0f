package dev.kvant.cuda;

/** A device's compute capability, e.g. 9.0 for H100/H200. Kernels are compiled for exactly this (real) arch. */
public record ComputeCapability(int major, int minor) {
    public ComputeCapability {
        if (major < 1 || minor < 0 || minor > 9) {
            throw new IllegalArgumentException("compute capability " + major + "." + minor + " is not a real one");
        }
    }

    /** The oldest architecture kvant's own kernels run on: int8 and bf16 tensor-core mma, cp.async (Ampere). */
    public static final ComputeCapability KVANT_MINIMUM = new ComputeCapability(8, 0);

    public boolean atLeast(ComputeCapability other) {
        return major > other.major || (major == other.major && minor >= other.minor);
    }

    /**
     * Throws unless kvant's own kernels can run on a device of this capability, naming the device and what it
     * lacks, before NVRTC would fail on the first tensor-core or cp.async instruction with a compile log.
     */
    public void requireKvantKernels(String device) {
        if (!atLeast(KVANT_MINIMUM)) {
            throw new CudaUnavailableException(device + " has compute capability " + this + "; kvant's CUDA kernels"
                    + " need " + KVANT_MINIMUM + " or newer (Ampere, Ada, Hopper, Blackwell: int8 and bf16 tensor-core"
                    + " products, asynchronous copies). Use --backend cpu.");
        }
    }

    /**
     * The NVRTC/PTXAS name of the real architecture: {@code sm_86}; on 9.0 (H100, H200) {@code sm_90a}, the same
     * architecture with its own instructions (wgmma, which the prefill attention uses): a cubin for it runs on 9.0
     * devices only, which is all a cubin for a real architecture ever does here.
     */
    public String arch() {
        return "sm_" + major + minor + (major == 9 && minor == 0 ? "a" : "");
    }

    @Override
    public String toString() {
        return major + "." + minor;
    }
}
