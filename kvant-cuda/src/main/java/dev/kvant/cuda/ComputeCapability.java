package dev.kvant.cuda;

/** A device's compute capability, e.g. 9.0 for H100/H200. Kernels are compiled for exactly this (real) arch. */
public record ComputeCapability(int major, int minor) {
    public ComputeCapability {
        if (major < 1 || minor < 0 || minor > 9) {
            throw new IllegalArgumentException("compute capability " + major + "." + minor + " is not a real one");
        }
    }

    /** The NVRTC/PTXAS name of the real architecture: {@code sm_90}. */
    public String arch() {
        return "sm_" + major + minor;
    }

    @Override
    public String toString() {
        return major + "." + minor;
    }
}
