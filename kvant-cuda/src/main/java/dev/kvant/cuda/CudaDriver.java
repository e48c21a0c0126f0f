package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_FLOAT;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * Typed bindings to the few dozen CUDA driver API functions kvant uses, downcalls into {@code libcuda.so.1}.
 * Every call is checked: a CUresult other than CUDA_SUCCESS becomes a {@link CudaException} naming the call,
 * its arguments, and the driver's error name and description.
 *
 * <p>Symbols are the versioned ones {@code cuda.h} (CUDA 13.0) maps the plain names to (cuMemAlloc → cuMemAlloc_v2,
 * cuStreamDestroy → cuStreamDestroy_v2, cuEventElapsedTime → cuEventElapsedTime_v2, ...). We use the legacy default
 * stream names (no _ptds/_ptsz variants); kvant's work runs on streams it creates.
 *
 * <p>Handles (CUcontext, CUmodule, CUfunction, CUstream, CUevent, CUgraph, CUgraphExec) are opaque pointers, held
 * as zero-length {@link MemorySegment}s; device pointers (CUdeviceptr, an unsigned 64-bit integer) are Java longs.
 * This type is the raw layer: the rest of the package wraps it in {@link CudaContext}, {@link DeviceBuffer} and
 * friends, which keep the context current and check bounds.
 */
public final class CudaDriver {
    /** cuDeviceGetAttribute attributes we read (CUdevice_attribute in cuda.h). */
    public static final int ATTR_MAX_THREADS_PER_BLOCK = 1;
    public static final int ATTR_WARP_SIZE = 10;
    public static final int ATTR_MULTIPROCESSOR_COUNT = 16;
    public static final int ATTR_MEMORY_CLOCK_RATE_KHZ = 36;
    public static final int ATTR_GLOBAL_MEMORY_BUS_WIDTH_BITS = 37;
    public static final int ATTR_L2_CACHE_SIZE = 38;
    public static final int ATTR_COMPUTE_CAPABILITY_MAJOR = 75;
    public static final int ATTR_COMPUTE_CAPABILITY_MINOR = 76;
    public static final int ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81;
    public static final int ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;

    /** cuFuncGetAttribute / cuFuncSetAttribute attributes (CUfunction_attribute). */
    public static final int FUNC_MAX_THREADS_PER_BLOCK = 0;
    public static final int FUNC_SHARED_SIZE_BYTES = 1;
    public static final int FUNC_LOCAL_SIZE_BYTES = 3;
    public static final int FUNC_NUM_REGS = 4;
    public static final int FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

    /** cuStreamCreate flags (CUstream_flags). */
    public static final int STREAM_NON_BLOCKING = 0x1;
    /** cuEventCreate flags (CUevent_flags). */
    public static final int EVENT_DEFAULT = 0x0;
    public static final int EVENT_DISABLE_TIMING = 0x2;
    /** cuStreamBeginCapture modes (CUstreamCaptureMode). */
    public static final int CAPTURE_MODE_GLOBAL = 0;
    public static final int CAPTURE_MODE_THREAD_LOCAL = 1;
    public static final int CAPTURE_MODE_RELAXED = 2;

    private static final int CUDA_SUCCESS = 0;
    /** CUlaunchAttributeID of programmatic dependent launch, and the sizes of the launch structs (64-bit). */
    private static final int LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
    private static final long LAUNCH_ATTRIBUTE_BYTES = 72;
    private static final long LAUNCH_CONFIG_BYTES = 56;
    private static final int CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;

    private final NativeLibrary library;
    private final MethodHandle cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName,
            cuDeviceGetAttribute, cuDeviceTotalMem, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease,
            cuCtxSetCurrent, cuCtxSynchronize, cuMemAlloc, cuMemFree, cuMemAllocHost, cuMemFreeHost,
            cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyDtoD, cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync,
            cuMemsetD8, cuMemsetD32, cuMemsetD8Async, cuMemsetD32Async, cuMemGetInfo, cuModuleLoadData,
            cuModuleGetFunction, cuModuleUnload, cuLaunchKernel, cuFuncSetAttribute, cuFuncGetAttribute,
            cuStreamCreate, cuStreamDestroy, cuStreamSynchronize, cuEventCreate, cuEventRecord, cuEventSynchronize,
            cuEventElapsedTime, cuEventDestroy, cuStreamBeginCapture, cuStreamEndCapture,
            cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy, cuGetErrorName,
            cuGetErrorString, cuStreamWaitEvent, cuMemcpyPeerAsync, cuCtxEnablePeerAccess, cuDeviceCanAccessPeer;
    /** cuLaunchKernelEx (driver 11.8+), or null on an older driver. */
    private final MethodHandle cuLaunchKernelEx;

    CudaDriver(NativeLibrary library) {
        this.library = library;
        cuInit = bind("cuInit", JAVA_INT);
        cuDriverGetVersion = bind("cuDriverGetVersion", ADDRESS);
        cuDeviceGetCount = bind("cuDeviceGetCount", ADDRESS);
        cuDeviceGet = bind("cuDeviceGet", ADDRESS, JAVA_INT);
        cuDeviceGetName = bind("cuDeviceGetName", ADDRESS, JAVA_INT, JAVA_INT);
        cuDeviceGetAttribute = bind("cuDeviceGetAttribute", ADDRESS, JAVA_INT, JAVA_INT);
        cuDeviceTotalMem = bind("cuDeviceTotalMem_v2", ADDRESS, JAVA_INT);
        cuDevicePrimaryCtxRetain = bind("cuDevicePrimaryCtxRetain", ADDRESS, JAVA_INT);
        cuDevicePrimaryCtxRelease = bind("cuDevicePrimaryCtxRelease_v2", JAVA_INT);
        cuCtxSetCurrent = bind("cuCtxSetCurrent", ADDRESS);
        cuCtxSynchronize = bind("cuCtxSynchronize");
        cuMemAlloc = bind("cuMemAlloc_v2", ADDRESS, JAVA_LONG);
        cuMemFree = bind("cuMemFree_v2", JAVA_LONG);
        cuMemAllocHost = bind("cuMemAllocHost_v2", ADDRESS, JAVA_LONG);
        cuMemFreeHost = bind("cuMemFreeHost", ADDRESS);
        cuMemcpyHtoD = bind("cuMemcpyHtoD_v2", JAVA_LONG, ADDRESS, JAVA_LONG);
        cuMemcpyDtoH = bind("cuMemcpyDtoH_v2", ADDRESS, JAVA_LONG, JAVA_LONG);
        cuMemcpyDtoD = bind("cuMemcpyDtoD_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG);
        cuMemcpyHtoDAsync = bind("cuMemcpyHtoDAsync_v2", JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS);
        cuMemcpyDtoHAsync = bind("cuMemcpyDtoHAsync_v2", ADDRESS, JAVA_LONG, JAVA_LONG, ADDRESS);
        cuMemcpyDtoDAsync = bind("cuMemcpyDtoDAsync_v2", JAVA_LONG, JAVA_LONG, JAVA_LONG, ADDRESS);
        cuMemsetD8 = bind("cuMemsetD8_v2", JAVA_LONG, JAVA_BYTE, JAVA_LONG);
        cuMemsetD32 = bind("cuMemsetD32_v2", JAVA_LONG, JAVA_INT, JAVA_LONG);
        cuMemsetD8Async = bind("cuMemsetD8Async", JAVA_LONG, JAVA_BYTE, JAVA_LONG, ADDRESS);
        cuMemsetD32Async = bind("cuMemsetD32Async", JAVA_LONG, JAVA_INT, JAVA_LONG, ADDRESS);
        cuMemGetInfo = bind("cuMemGetInfo_v2", ADDRESS, ADDRESS);
        cuModuleLoadData = bind("cuModuleLoadData", ADDRESS, ADDRESS);
        cuModuleGetFunction = bind("cuModuleGetFunction", ADDRESS, ADDRESS, ADDRESS);
        cuModuleUnload = bind("cuModuleUnload", ADDRESS);
        cuLaunchKernel = bind("cuLaunchKernel", ADDRESS, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT,
                JAVA_INT, ADDRESS, ADDRESS, ADDRESS);
        cuFuncSetAttribute = bind("cuFuncSetAttribute", ADDRESS, JAVA_INT, JAVA_INT);
        cuFuncGetAttribute = bind("cuFuncGetAttribute", ADDRESS, JAVA_INT, ADDRESS);
        cuStreamCreate = bind("cuStreamCreate", ADDRESS, JAVA_INT);
        cuStreamDestroy = bind("cuStreamDestroy_v2", ADDRESS);
        cuStreamSynchronize = bind("cuStreamSynchronize", ADDRESS);
        cuEventCreate = bind("cuEventCreate", ADDRESS, JAVA_INT);
        cuEventRecord = bind("cuEventRecord", ADDRESS, ADDRESS);
        cuEventSynchronize = bind("cuEventSynchronize", ADDRESS);
        // CUDA 13's cuda.h maps cuEventElapsedTime to _v2 (added in 12.8); older drivers only have the first.
        cuEventElapsedTime = library.firstFunction(FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, ADDRESS),
                "cuEventElapsedTime_v2", "cuEventElapsedTime");
        cuEventDestroy = bind("cuEventDestroy_v2", ADDRESS);
        cuStreamBeginCapture = bind("cuStreamBeginCapture_v2", ADDRESS, JAVA_INT);
        cuStreamEndCapture = bind("cuStreamEndCapture", ADDRESS, ADDRESS);
        cuGraphInstantiateWithFlags = bind("cuGraphInstantiateWithFlags", ADDRESS, ADDRESS, JAVA_LONG);
        cuGraphLaunch = bind("cuGraphLaunch", ADDRESS, ADDRESS);
        cuGraphExecDestroy = bind("cuGraphExecDestroy", ADDRESS);
        cuGraphDestroy = bind("cuGraphDestroy", ADDRESS);
        cuGetErrorName = bind("cuGetErrorName", JAVA_INT, ADDRESS);
        cuStreamWaitEvent = bind("cuStreamWaitEvent", ADDRESS, ADDRESS, JAVA_INT);
        cuMemcpyPeerAsync = bind("cuMemcpyPeerAsync", JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS);
        cuCtxEnablePeerAccess = bind("cuCtxEnablePeerAccess", ADDRESS, JAVA_INT);
        cuDeviceCanAccessPeer = bind("cuDeviceCanAccessPeer", ADDRESS, JAVA_INT, JAVA_INT);
        cuGetErrorString = bind("cuGetErrorString", JAVA_INT, ADDRESS);
        cuLaunchKernelEx = library.optionalFunction("cuLaunchKernelEx",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, ADDRESS, ADDRESS));
    }

    private MethodHandle bind(String symbol, MemoryLayout... args) {
        return library.function(symbol, FunctionDescriptor.of(JAVA_INT, args));
    }

    /** Where libcuda was loaded from (a soname or a path). */
    public String loadedFrom() {
        return library.loadedFrom();
    }

    // ---- initialisation and devices

    public void init() {
        int rc;
        try {
            rc = (int) cuInit.invokeExact(0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuInit(0)");
    }

    /** The CUDA version the driver supports, as 1000 * major + 10 * minor (13000 for 13.0). */
    public int driverGetVersion() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            int rc = (int) cuDriverGetVersion.invokeExact(out);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDriverGetVersion()");
            return out.get(JAVA_INT, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public int deviceGetCount() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            int rc = (int) cuDeviceGetCount.invokeExact(out);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDeviceGetCount()");
            return out.get(JAVA_INT, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** The CUdevice handle of device {@code ordinal}. */
    public int deviceGet(int ordinal) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            int rc = (int) cuDeviceGet.invokeExact(out, ordinal);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDeviceGet(ordinal " + ordinal + ")");
            return out.get(JAVA_INT, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public String deviceGetName(int device) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(256);
            int rc = (int) cuDeviceGetName.invokeExact(out, 256, device);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDeviceGetName(device " + device + ")");
            return out.getString(0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** One CUdevice_attribute value, e.g. {@link #ATTR_MULTIPROCESSOR_COUNT}. */
    public int deviceGetAttribute(int attribute, int device) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            int rc = (int) cuDeviceGetAttribute.invokeExact(out, attribute, device);
            if (rc != CUDA_SUCCESS) {
                throw error(rc, "cuDeviceGetAttribute(attribute " + attribute + ", device " + device + ")");
            }
            return out.get(JAVA_INT, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public long deviceTotalMem(int device) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            int rc = (int) cuDeviceTotalMem.invokeExact(out, device);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDeviceTotalMem_v2(device " + device + ")");
            return out.get(JAVA_LONG, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    // ---- contexts

    public MemorySegment devicePrimaryCtxRetain(int device) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuDevicePrimaryCtxRetain.invokeExact(out, device);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDevicePrimaryCtxRetain(device " + device + ")");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void devicePrimaryCtxRelease(int device) {
        int rc;
        try {
            rc = (int) cuDevicePrimaryCtxRelease.invokeExact(device);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuDevicePrimaryCtxRelease_v2(device " + device + ")");
    }

    public void ctxSetCurrent(MemorySegment context) {
        int rc;
        try {
            rc = (int) cuCtxSetCurrent.invokeExact(context);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuCtxSetCurrent(" + hex(context) + ")");
    }

    public void ctxSynchronize() {
        int rc;
        try {
            rc = (int) cuCtxSynchronize.invokeExact();
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuCtxSynchronize()");
    }

    // ---- memory

    /** Device memory, 256-byte aligned (the driver's guarantee). */
    public long memAlloc(long bytes) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_LONG);
            int rc = (int) cuMemAlloc.invokeExact(out, bytes);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuMemAlloc_v2(" + bytes + " bytes)");
            return out.get(JAVA_LONG, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void memFree(long devicePointer) {
        int rc;
        try {
            rc = (int) cuMemFree.invokeExact(devicePointer);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemFree_v2(" + hex(devicePointer) + ")");
    }

    /** Page-locked host memory, {@code bytes} long, as a zero-length segment (the caller sizes it). */
    public MemorySegment memAllocHost(long bytes) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuMemAllocHost.invokeExact(out, bytes);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuMemAllocHost_v2(" + bytes + " bytes)");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void memFreeHost(MemorySegment host) {
        int rc;
        try {
            rc = (int) cuMemFreeHost.invokeExact(host);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemFreeHost(" + hex(host) + ")");
    }

    public void memcpyHtoD(long dst, MemorySegment src, long bytes) {
        int rc;
        try {
            rc = (int) cuMemcpyHtoD.invokeExact(dst, src, bytes);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemcpyHtoD_v2(dst " + hex(dst) + ", " + bytes + " bytes)");
    }

    public void memcpyDtoH(MemorySegment dst, long src, long bytes) {
        int rc;
        try {
            rc = (int) cuMemcpyDtoH.invokeExact(dst, src, bytes);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemcpyDtoH_v2(src " + hex(src) + ", " + bytes + " bytes)");
    }

    public void memcpyDtoD(long dst, long src, long bytes) {
        int rc;
        try {
            rc = (int) cuMemcpyDtoD.invokeExact(dst, src, bytes);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuMemcpyDtoD_v2(dst " + hex(dst) + ", src " + hex(src) + ", " + bytes + " bytes)");
        }
    }

    /** Asynchronous with respect to the host only when {@code src} is page-locked (see {@link PinnedBuffer}). */
    public void memcpyHtoDAsync(long dst, MemorySegment src, long bytes, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuMemcpyHtoDAsync.invokeExact(dst, src, bytes, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuMemcpyHtoDAsync_v2(dst " + hex(dst) + ", " + bytes + " bytes, stream " + hex(stream) + ")");
        }
    }

    public void memcpyDtoHAsync(MemorySegment dst, long src, long bytes, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuMemcpyDtoHAsync.invokeExact(dst, src, bytes, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuMemcpyDtoHAsync_v2(src " + hex(src) + ", " + bytes + " bytes, stream " + hex(stream) + ")");
        }
    }

    public void memcpyDtoDAsync(long dst, long src, long bytes, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuMemcpyDtoDAsync.invokeExact(dst, src, bytes, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuMemcpyDtoDAsync_v2(dst " + hex(dst) + ", src " + hex(src) + ", " + bytes
                    + " bytes, stream " + hex(stream) + ")");
        }
    }

    /** Sets {@code count} bytes to {@code value}. */
    public void memsetD8(long dst, byte value, long count) {
        int rc;
        try {
            rc = (int) cuMemsetD8.invokeExact(dst, value, count);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemsetD8_v2(" + hex(dst) + ", " + count + " bytes)");
    }

    /** Sets {@code count} 32-bit words to {@code value}; {@code dst} must be 4-byte aligned. */
    public void memsetD32(long dst, int value, long count) {
        int rc;
        try {
            rc = (int) cuMemsetD32.invokeExact(dst, value, count);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemsetD32_v2(" + hex(dst) + ", " + count + " words)");
    }

    public void memsetD8Async(long dst, byte value, long count, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuMemsetD8Async.invokeExact(dst, value, count, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemsetD8Async(" + hex(dst) + ", " + count + " bytes)");
    }

    public void memsetD32Async(long dst, int value, long count, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuMemsetD32Async.invokeExact(dst, value, count, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuMemsetD32Async(" + hex(dst) + ", " + count + " words)");
    }

    /** Free and total device memory of the current context's device, in bytes. */
    public MemoryInfo memGetInfo() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment free = a.allocate(JAVA_LONG);
            MemorySegment total = a.allocate(JAVA_LONG);
            int rc = (int) cuMemGetInfo.invokeExact(free, total);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuMemGetInfo_v2()");
            return new MemoryInfo(free.get(JAVA_LONG, 0), total.get(JAVA_LONG, 0));
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** Free and total device memory in bytes. */
    public record MemoryInfo(long free, long total) {
    }

    // ---- modules and launches

    /** Loads a cubin (or fatbin) image; the image must stay readable for the duration of the call only. */
    public MemorySegment moduleLoadData(MemorySegment image, String what) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuModuleLoadData.invokeExact(out, image);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuModuleLoadData(" + what + ", " + image.byteSize() + " bytes)");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public MemorySegment moduleGetFunction(MemorySegment module, String name) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuModuleGetFunction.invokeExact(out, module, a.allocateFrom(name));
            if (rc != CUDA_SUCCESS) throw error(rc, "cuModuleGetFunction(\"" + name + "\")");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void moduleUnload(MemorySegment module) {
        int rc;
        try {
            rc = (int) cuModuleUnload.invokeExact(module);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuModuleUnload(" + hex(module) + ")");
    }

    /**
     * Launches {@code function}. {@code kernelParams} is an array of pointers, one per kernel parameter, each to the
     * parameter's value (see {@link KernelParams}); the driver copies the values before returning.
     */
    public void launchKernel(MemorySegment function, Dim3 grid, Dim3 block, int sharedMemBytes,
                             MemorySegment stream, MemorySegment kernelParams, String what) {
        int rc;
        try {
            rc = (int) cuLaunchKernel.invokeExact(function, grid.x(), grid.y(), grid.z(), block.x(), block.y(),
                    block.z(), sharedMemBytes, stream, kernelParams, MemorySegment.NULL);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuLaunchKernel(" + what + ", grid " + grid + ", block " + block + ", shared "
                    + sharedMemBytes + " bytes)");
        }
    }

    /** True when this driver can launch a kernel that overlaps its predecessor ({@link #launchKernelOverlapped}). */
    public boolean canLaunchOverlapped() {
        return cuLaunchKernelEx != null;
    }

    /**
     * Launches {@code function} as {@link #launchKernel} does, but allowed to start while the kernel before it on
     * the stream is still running (programmatic dependent launch: cuLaunchKernelEx with the attribute
     * PROGRAMMATIC_STREAM_SERIALIZATION). The kernel must wait for its predecessor itself before it touches memory
     * (every kvant kernel opens with {@code KVANT_GRID_ENTER()}, which does); a predecessor that does not signal
     * early is simply waited for at its end. Stream capture keeps the overlap as a programmatic graph edge.
     */
    public void launchKernelOverlapped(MemorySegment function, Dim3 grid, Dim3 block, int sharedMemBytes,
                                       MemorySegment stream, MemorySegment kernelParams, String what) {
        if (cuLaunchKernelEx == null) {
            throw new IllegalStateException("cuLaunchKernelEx is not available in this driver");
        }
        int rc;
        try (Arena arena = Arena.ofConfined()) {
            // CUlaunchAttribute: int id, 4 bytes of padding, a 64-byte value union (here its first int).
            MemorySegment attribute = arena.allocate(LAUNCH_ATTRIBUTE_BYTES, 8);
            attribute.set(JAVA_INT, 0, LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
            attribute.set(JAVA_INT, 8, 1);
            // CUlaunchConfig: grid x y z, block x y z, shared bytes (7 ints), stream, attrs, numAttrs.
            MemorySegment config = arena.allocate(LAUNCH_CONFIG_BYTES, 8);
            config.set(JAVA_INT, 0, grid.x());
            config.set(JAVA_INT, 4, grid.y());
            config.set(JAVA_INT, 8, grid.z());
            config.set(JAVA_INT, 12, block.x());
            config.set(JAVA_INT, 16, block.y());
            config.set(JAVA_INT, 20, block.z());
            config.set(JAVA_INT, 24, sharedMemBytes);
            config.set(ADDRESS, 32, stream);
            config.set(ADDRESS, 40, attribute);
            config.set(JAVA_INT, 48, 1);
            rc = (int) cuLaunchKernelEx.invokeExact(config, function, kernelParams, MemorySegment.NULL);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuLaunchKernelEx(" + what + ", grid " + grid + ", block " + block + ", shared "
                    + sharedMemBytes + " bytes, overlapped)");
        }
    }

    public void funcSetAttribute(MemorySegment function, int attribute, int value, String what) {
        int rc;
        try {
            rc = (int) cuFuncSetAttribute.invokeExact(function, attribute, value);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuFuncSetAttribute(" + what + ", attribute " + attribute + ", value " + value + ")");
        }
    }

    public int funcGetAttribute(int attribute, MemorySegment function, String what) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            int rc = (int) cuFuncGetAttribute.invokeExact(out, attribute, function);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuFuncGetAttribute(" + what + ", attribute " + attribute + ")");
            return out.get(JAVA_INT, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    // ---- streams and events

    public MemorySegment streamCreate(int flags) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuStreamCreate.invokeExact(out, flags);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuStreamCreate(flags " + flags + ")");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void streamDestroy(MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuStreamDestroy.invokeExact(stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuStreamDestroy_v2(" + hex(stream) + ")");
    }

    public void streamSynchronize(MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuStreamSynchronize.invokeExact(stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuStreamSynchronize(" + hex(stream) + ")");
    }

    public MemorySegment eventCreate(int flags) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuEventCreate.invokeExact(out, flags);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuEventCreate(flags " + flags + ")");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void eventRecord(MemorySegment event, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuEventRecord.invokeExact(event, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuEventRecord(" + hex(event) + ", stream " + hex(stream) + ")");
    }

    /** Makes later work on the stream wait for the event (which may belong to another device's context). */
    public void streamWaitEvent(MemorySegment stream, MemorySegment event) {
        int rc;
        try {
            rc = (int) cuStreamWaitEvent.invokeExact(stream, event, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuStreamWaitEvent(" + hex(stream) + ", " + hex(event) + ")");
    }

    /** Copies between the memory of two contexts (two devices, or one), ordered on the stream. */
    public void memcpyPeerAsync(long dst, MemorySegment dstContext, long src, MemorySegment srcContext, long bytes,
                                MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuMemcpyPeerAsync.invokeExact(dst, dstContext, src, srcContext, bytes, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) {
            throw error(rc, "cuMemcpyPeerAsync(dst " + hex(dst) + ", src " + hex(src) + ", " + bytes + " bytes)");
        }
    }

    /** Whether device {@code device} can read and write {@code peer}'s memory directly (NVLink or PCIe P2P). */
    public boolean deviceCanAccessPeer(int device, int peer) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_INT);
            int rc = (int) cuDeviceCanAccessPeer.invokeExact(out, device, peer);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuDeviceCanAccessPeer(" + device + ", " + peer + ")");
            return out.get(JAVA_INT, 0) != 0;
        } catch (CudaException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** Lets the current context access {@code peer}'s memory directly; already enabled counts as done. */
    public void ctxEnablePeerAccess(MemorySegment peer) {
        int rc;
        try {
            rc = (int) cuCtxEnablePeerAccess.invokeExact(peer, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
            throw error(rc, "cuCtxEnablePeerAccess(" + hex(peer) + ")");
        }
    }

    public void eventSynchronize(MemorySegment event) {
        int rc;
        try {
            rc = (int) cuEventSynchronize.invokeExact(event);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuEventSynchronize(" + hex(event) + ")");
    }

    /** Milliseconds between two recorded, completed events (resolution about half a microsecond). */
    public float eventElapsedTime(MemorySegment start, MemorySegment end) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(JAVA_FLOAT);
            int rc = (int) cuEventElapsedTime.invokeExact(out, start, end);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuEventElapsedTime(" + hex(start) + ", " + hex(end) + ")");
            return out.get(JAVA_FLOAT, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void eventDestroy(MemorySegment event) {
        int rc;
        try {
            rc = (int) cuEventDestroy.invokeExact(event);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuEventDestroy_v2(" + hex(event) + ")");
    }

    // ---- graphs

    public void streamBeginCapture(MemorySegment stream, int mode) {
        int rc;
        try {
            rc = (int) cuStreamBeginCapture.invokeExact(stream, mode);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuStreamBeginCapture_v2(" + hex(stream) + ", mode " + mode + ")");
    }

    /** Ends capture and returns the captured CUgraph. */
    public MemorySegment streamEndCapture(MemorySegment stream) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuStreamEndCapture.invokeExact(stream, out);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuStreamEndCapture(" + hex(stream) + ")");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public MemorySegment graphInstantiateWithFlags(MemorySegment graph, long flags) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) cuGraphInstantiateWithFlags.invokeExact(out, graph, flags);
            if (rc != CUDA_SUCCESS) throw error(rc, "cuGraphInstantiateWithFlags(" + hex(graph) + ", flags " + flags + ")");
            return out.get(ADDRESS, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    public void graphLaunch(MemorySegment graphExec, MemorySegment stream) {
        int rc;
        try {
            rc = (int) cuGraphLaunch.invokeExact(graphExec, stream);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuGraphLaunch(" + hex(graphExec) + ", stream " + hex(stream) + ")");
    }

    public void graphExecDestroy(MemorySegment graphExec) {
        int rc;
        try {
            rc = (int) cuGraphExecDestroy.invokeExact(graphExec);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuGraphExecDestroy(" + hex(graphExec) + ")");
    }

    public void graphDestroy(MemorySegment graph) {
        int rc;
        try {
            rc = (int) cuGraphDestroy.invokeExact(graph);
        } catch (Throwable t) {
            throw rethrow(t);
        }
        if (rc != CUDA_SUCCESS) throw error(rc, "cuGraphDestroy(" + hex(graph) + ")");
    }

    // ---- errors

    /** The driver's symbolic name of a CUresult, e.g. CUDA_ERROR_OUT_OF_MEMORY. */
    public String errorName(int result) {
        return errorText(cuGetErrorName, result);
    }

    /** The driver's description of a CUresult, e.g. "out of memory". */
    public String errorString(int result) {
        return errorText(cuGetErrorString, result);
    }

    private static String errorText(MethodHandle handle, int result) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ADDRESS);
            int rc = (int) handle.invokeExact(result, out);
            MemorySegment text = out.get(ADDRESS, 0);
            if (rc != CUDA_SUCCESS || text.equals(MemorySegment.NULL)) {
                return "CUresult " + result;
            }
            return text.reinterpret(Integer.MAX_VALUE).getString(0);
        } catch (Throwable t) {
            return "CUresult " + result;
        }
    }

    /** The exception for a failed call: {@code call} names the function and its arguments. */
    CudaException error(int result, String call) {
        return new CudaException(call, result, errorName(result), errorString(result));
    }

    static RuntimeException rethrow(Throwable t) {
        if (t instanceof RuntimeException r) {
            return r;
        }
        if (t instanceof Error e) {
            throw e;
        }
        return new IllegalStateException(t);
    }

    static String hex(long pointer) {
        return "0x" + Long.toHexString(pointer);
    }

    static String hex(MemorySegment handle) {
        return hex(handle.address());
    }
}
