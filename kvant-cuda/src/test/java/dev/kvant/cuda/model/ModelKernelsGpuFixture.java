package dev.kvant.cuda.model;

import dev.kvant.cuda.Cuda;
import dev.kvant.cuda.CudaAvailability;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;

/**
 * What the model-kernel GPU tests share: a context, its kernel cache, model.cu's kernels and a stream, opened before
 * a test class that extends this (skipped where there is no GPU) and closed after it; and copies of host arrays to
 * and from the device.
 */
abstract class ModelKernelsGpuFixture {
    static CudaContext context;
    static KernelCache cache;
    static ModelKernels kernels;
    static CudaStream stream;

    @BeforeAll
    static void open() {
        CudaAvailability a = Cuda.available();
        Assumptions.assumeTrue(a.ok(), () -> "no CUDA GPU: " + a.reason());
        context = CudaContext.open();
        cache = KernelCache.open(context);
        kernels = new ModelKernels(context, cache);
        stream = context.createStream();
    }

    @AfterAll
    static void close() {
        if (context != null) {
            stream.close();
            kernels.close();
            context.close();
            context = null;
        }
    }

    /** A new device buffer holding host's bytes, e.g. {@code upload(MemorySegment.ofArray(floats))}. */
    static DeviceBuffer upload(MemorySegment host) {
        DeviceBuffer b = context.allocate(host.byteSize());
        b.copyFromHost(host);
        return b;
    }

    /** All of b's bytes in host memory (16-byte aligned: any {@code toArray} layout reads it). */
    static MemorySegment download(DeviceBuffer b) {
        MemorySegment host = Arena.ofAuto().allocate(b.byteSize(), 16);
        b.copyToHost(host);
        return host;
    }
}
