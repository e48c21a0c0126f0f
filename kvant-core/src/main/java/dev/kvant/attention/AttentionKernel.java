package dev.kvant.attention;

/**
 * One way of computing attention, as the parity tool runs it: all n tokens' outputs of a problem. The CPU variants
 * are here ({@link AttentionParity#cpuKernels}); a GPU backend adds its own.
 */
public interface AttentionKernel {
    /** A short name for tables, e.g. {@code cpu-decode}. */
    String name();

    /** Writes the outputs [n][heads][headDimV] of the problem into out. */
    void run(AttentionProblem problem, AttentionOptions options, float[] out);

    /**
     * The NMSE this kernel must stay under against the float64 reference, given the CPU kernels' bound for the
     * problem's formats ({@link AttentionParity#nmseBound}): the same by default; a kernel that multiplies in lower
     * precision (f16 tensor cores) states its own.
     */
    default double nmseBound(double cpuBound) {
        return cpuBound;
    }

    /** The most queries one problem may have for this kernel (a multi-query decode takes a few); larger are skipped. */
    default int maxQueries() {
        return Integer.MAX_VALUE;
    }
}
