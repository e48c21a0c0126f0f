package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.HashMap;
import java.util.Map;

/** A loaded cubin: the kernels of one {@code .cu} source, compiled for this device. */
public final class CudaModule implements AutoCloseable {
    private final CudaContext context;
    private final String name;
    private final MemorySegment handle;
    private final boolean overlappable;
    private final Map<String, CudaFunction> functions = new HashMap<>();
    private volatile boolean closed;

    private CudaModule(CudaContext context, String name, MemorySegment handle, boolean overlappable) {
        this.context = context;
        this.name = name;
        this.handle = handle;
        this.overlappable = overlappable;
    }

    /** @param overlappable every kernel waits for its predecessor itself ({@link KernelSource#overlappable}) */
    static CudaModule load(CudaContext context, String name, byte[] image, boolean overlappable) {
        if (image.length == 0) {
            throw new IllegalArgumentException("module " + name + ": the image is empty");
        }
        context.makeCurrent();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment copy = arena.allocate(image.length, 16);
            MemorySegment.copy(image, 0, copy, ValueLayout.JAVA_BYTE, 0, image.length);
            return new CudaModule(context, name, context.driver().moduleLoadData(copy, name), overlappable);
        }
    }

    /** The kernel {@code extern "C" __global__ void name(...)} of this module. */
    public synchronized CudaFunction function(String kernel) {
        checkOpen();
        return functions.computeIfAbsent(kernel, k -> {
            context.makeCurrent();
            return new CudaFunction(this, k, context.driver().moduleGetFunction(handle, k));
        });
    }

    public String name() {
        return name;
    }

    /** Whether a launch of this module's kernels on {@code stream} overlaps its predecessor. */
    boolean launchesOverlapped(CudaStream stream) {
        return overlappable && context.overlapsLaunches(stream);
    }

    public CudaContext context() {
        return context;
    }

    void checkOpen() {
        if (closed) {
            throw new IllegalStateException("CUDA module " + name + " was used after close()");
        }
    }

    /** Unloads the module; its functions refuse launches afterwards. Idempotent. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        context.release(() -> context.driver().moduleUnload(handle));
    }
}
