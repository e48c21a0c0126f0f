package dev.kvant.cuda;

/**
 * The {@code copy.cu} kernel: a 16-byte-vectorised device-to-device copy, and the device copy-bandwidth probe built
 * on it. The bandwidth it measures (bytes read + bytes written per second) is the ceiling any memory-bound kernel
 * of kvant's (attention over the KV cache, matvec over quantised weights) can reach on the device.
 */
public final class DeviceCopy implements AutoCloseable {
    public static final String SOURCE = "copy.cu";
    static final int BLOCK = 256;
    static final int BLOCKS_PER_SM = 8;

    private final CudaContext context;
    private final CudaModule module;
    private final CudaFunction kernel;

    private DeviceCopy(CudaContext context, CudaModule module) {
        this.context = context;
        this.module = module;
        this.kernel = module.function("kvant_copy16");
    }

    public static DeviceCopy load(CudaContext context, KernelCache cache) {
        return new DeviceCopy(context, context.loadModule(cache, KernelSource.resource(SOURCE)));
    }

    /**
     * Queues a copy of the first {@code bytes} of {@code src} to {@code dst}.
     *
     * @throws IllegalArgumentException unless both addresses are 16-byte aligned, {@code bytes} is a multiple of 16,
     *                                  and the buffers do not overlap
     */
    public void copy(DeviceBuffer src, DeviceBuffer dst, long bytes, CudaStream stream) {
        src.checkRange("DeviceCopy (source)", 0, bytes);
        dst.checkRange("DeviceCopy", 0, bytes);
        if (bytes % 16 != 0 || src.address() % 16 != 0 || dst.address() % 16 != 0) {
            throw new IllegalArgumentException("DeviceCopy moves 16-byte words: " + bytes + " bytes from " + src
                    + " to " + dst + " are not 16-byte aligned whole words");
        }
        if (src.address() < dst.address() + bytes && dst.address() < src.address() + bytes) {
            throw new IllegalArgumentException("DeviceCopy: " + src + " and " + dst + " overlap");
        }
        long words = bytes / 16;
        if (words == 0) {
            return;
        }
        kernel.launch(Dim3.of(gridFor(words, context.multiprocessors())), Dim3.of(BLOCK), 0, stream,
                src, dst, words);
    }

    static int gridFor(long words, int multiprocessors) {
        long needed = (words + BLOCK - 1) / BLOCK;
        return (int) Math.max(1, Math.min(needed, (long) BLOCKS_PER_SM * Math.max(1, multiprocessors)));
    }

    /**
     * Copy bandwidth in GB/s (10^9 bytes read + written per second), the mean of {@code repetitions} copies of
     * {@code bytes} timed by CUDA events after two warm-up copies.
     */
    public double bandwidthGBps(DeviceBuffer src, DeviceBuffer dst, long bytes, int repetitions, CudaStream stream) {
        if (repetitions < 1) {
            throw new IllegalArgumentException("repetitions must be at least 1");
        }
        copy(src, dst, bytes, stream);
        copy(src, dst, bytes, stream);
        try (CudaEvent start = context.createEvent(); CudaEvent end = context.createEvent()) {
            start.record(stream);
            for (int r = 0; r < repetitions; r++) {
                copy(src, dst, bytes, stream);
            }
            end.record(stream);
            double seconds = CudaEvent.elapsedMillis(start, end) / 1e3 / repetitions;
            return 2.0 * bytes / seconds / 1e9;
        }
    }

    @Override
    public void close() {
        module.close();
    }
}
