package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/** One kernel of a {@link CudaModule}, launched with typed arguments. */
public final class CudaFunction {
    /** Threads per block CUDA allows on every architecture kvant targets. */
    public static final int MAX_THREADS_PER_BLOCK = 1024;

    private final CudaModule module;
    private final String name;
    private final MemorySegment handle;
    private volatile boolean plain;

    CudaFunction(CudaModule module, String name, MemorySegment handle) {
        this.module = module;
        this.name = name;
        this.handle = handle;
    }

    public String name() {
        return name;
    }

    /**
     * Queues one launch on {@code stream}.
     *
     * @param sharedBytes dynamic shared memory per block; above 48 KiB needs {@link #setMaxDynamicSharedMemory} first
     * @param args        the kernel's parameters in order, typed as {@link KernelParams} describes
     */
    public void launch(Dim3 grid, Dim3 block, int sharedBytes, CudaStream stream, Object... args) {
        module.checkOpen();
        if (block.volume() > MAX_THREADS_PER_BLOCK) {
            throw new IllegalArgumentException("kernel " + name + ": block " + block + " has " + block.volume()
                    + " threads; CUDA allows at most " + MAX_THREADS_PER_BLOCK);
        }
        if (sharedBytes < 0) {
            throw new IllegalArgumentException("kernel " + name + ": shared memory of " + sharedBytes + " bytes");
        }
        CudaContext context = module.context();
        context.makeCurrent();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment params = KernelParams.pack(arena, args);
            if (!plain && module.launchesOverlapped(stream)) {
                context.driver().launchKernelOverlapped(handle, grid, block, sharedBytes, stream.handle(), params,
                        module.name() + ":" + name);
            } else {
                context.driver().launchKernel(handle, grid, block, sharedBytes, stream.handle(), params,
                        module.name() + ":" + name);
            }
        }
    }

    /**
     * Makes every later launch of this kernel a plain one, which starts only when the kernel before it has finished,
     * even in an overlappable module. Measured on the H200 for decode attention: overlapped, turbo3 at 32K tokens
     * ran 14% slower (tg128 181 against 211 t/s), whether or not the kernel let its own successor in early; a
     * compute-bound kernel sized for two 110 KiB blocks per SM does not want to be placed while its predecessor
     * still holds the SMs.
     */
    public CudaFunction plainLaunches() {
        plain = true;
        return this;
    }

    /**
     * Allows launches with up to {@code bytes} of dynamic shared memory per block (cuFuncSetAttribute
     * MAX_DYNAMIC_SHARED_SIZE_BYTES); needed above the default 48 KiB, up to
     * {@link CudaContext#maxSharedMemoryPerBlockOptin()} minus the kernel's static shared memory.
     */
    public void setMaxDynamicSharedMemory(int bytes) {
        module.checkOpen();
        module.context().makeCurrent();
        module.context().driver().funcSetAttribute(handle, CudaDriver.FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes,
                module.name() + ":" + name);
    }

    /** A CUfunction_attribute value, e.g. {@link CudaDriver#FUNC_NUM_REGS}. */
    public int attribute(int attribute) {
        module.checkOpen();
        module.context().makeCurrent();
        return module.context().driver().funcGetAttribute(attribute, handle, module.name() + ":" + name);
    }

    /** Registers per thread, as compiled. */
    public int registers() {
        return attribute(CudaDriver.FUNC_NUM_REGS);
    }

    /** The most threads per block this kernel can launch with (register pressure may lower it below 1024). */
    public int maxThreadsPerBlock() {
        return attribute(CudaDriver.FUNC_MAX_THREADS_PER_BLOCK);
    }
}
