package dev.kvant.kv;

/**
 * Per-thread working arrays of the KV kernels (a padded, rotated row; a block's codes, and the codes an encoder tries). Kernels run per row, often
 * a few hundred times per token, and a fresh array per call made allocation their largest cost: the bench
 * measured the same turbo3 encode at 190 ns/row with a warm heap and 1.5 µs/row while the heap grew.
 * The arrays only grow; contents do not survive a kernel call.
 */
final class KernelScratch {
    private static final ThreadLocal<KernelScratch> LOCAL = ThreadLocal.withInitial(KernelScratch::new);

    private float[] row = new float[256];
    private int[] codes = new int[128];
    private int[] trialCodes = new int[128];

    private KernelScratch() {
    }

    static KernelScratch get() {
        return LOCAL.get();
    }

    /** A float array of at least n elements. */
    float[] row(int n) {
        if (row.length < n) {
            row = new float[n];
        }
        return row;
    }

    /** An int array of at least n elements. */
    int[] codes(int n) {
        if (codes.length < n) {
            codes = new int[n];
        }
        return codes;
    }

    /** A second int array of at least n elements (the codes an encoder tries while {@link #codes} holds the best). */
    int[] trialCodes(int n) {
        if (trialCodes.length < n) {
            trialCodes = new int[n];
        }
        return trialCodes;
    }
}
