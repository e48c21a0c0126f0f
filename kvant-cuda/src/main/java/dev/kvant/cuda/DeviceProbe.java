package dev.kvant.cuda;

import java.io.PrintStream;

/**
 * Prints what kvant sees of the GPU: driver, device, NVRTC, cuBLASLt, and the device copy bandwidth. Run by
 * {@code scripts/gpu-remote} before the GPU tests so the report says what they ran on; exits 1 where CUDA is
 * unavailable.
 *
 * <pre>java --enable-native-access=ALL-UNNAMED -cp kvant-cuda.jar dev.kvant.cuda.DeviceProbe</pre>
 */
public final class DeviceProbe {
    private DeviceProbe() {
    }

    public static void main(String[] args) {
        System.exit(run(System.out));
    }

    static int run(PrintStream out) {
        CudaAvailability availability = Cuda.available();
        out.println("cuda:       " + (availability.ok() ? "available: " : "unavailable: ") + availability.reason());
        if (!availability.ok()) {
            return 1;
        }
        try (CudaContext context = CudaContext.open()) {
            CudaDriver.MemoryInfo memory = context.memoryInfo();
            out.println("device:     " + context);
            out.println("memory:     " + (memory.free() >> 20) + " MiB free of " + (memory.total() >> 20) + " MiB");
            out.println("shared:     " + context.maxSharedMemoryPerBlockOptin() + " bytes per block (opt-in)");
            Nvrtc nvrtc;
            try {
                nvrtc = Nvrtc.load();
                out.println("nvrtc:      " + nvrtc.version() + " from " + nvrtc.loadedFrom());
            } catch (CudaUnavailableException e) {
                out.println("nvrtc:      unavailable: " + e.getMessage());
                return 1;
            }
            try {
                CublasLt.create(context).close();
                out.println("cublasLt:   " + CublasLt.libraryVersion() + " from " + CublasLt.libraryPath());
            } catch (RuntimeException e) {
                out.println("cublasLt:   unavailable: " + e.getMessage());
            }
            KernelCache cache = new KernelCache(KernelCache.defaultDirectory(), nvrtc, context.driverVersion());
            out.println("cubins:     " + cache.directory());
            long bytes = Math.min(1L << 30, memory.free() / 4) & -16L;
            try (DeviceCopy copy = DeviceCopy.load(context, cache);
                 DeviceBuffer src = context.allocate(bytes);
                 DeviceBuffer dst = context.allocate(bytes);
                 CudaStream stream = context.createStream()) {
                src.fillInts(0x3F800000);
                double gbps = copy.bandwidthGBps(src, dst, bytes, 20, stream);
                out.printf("copy:       %.0f GB/s read+write (%d MiB buffers, copy.cu, mean of 20)%n", gbps,
                        bytes >> 20);
            }
            return 0;
        }
    }
}
