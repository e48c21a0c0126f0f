package dev.kvant.cuda;

import java.lang.foreign.MemorySegment;
import java.util.HashMap;
import java.util.Map;

/**
 * One CUDA device and its primary context: the owner of every buffer, stream, event and module made from it.
 *
 * <p>The primary context is the one the CUDA runtime (and so cuBLASLt) also uses, so library calls and our own
 * kernels share memory and streams. CUDA binds a context to an OS thread; every operation here first makes this
 * context current on the calling thread (a thread-local check, one cuCtxSetCurrent the first time on a thread, and
 * on every call from a virtual thread, whose carrier may change between calls).
 *
 * <p>Every context open on a device in this process shares one retain of its primary context ({@link Primary}): a
 * buffer, stream, event, module or graph made from one context is freed when it is closed as long as any context of
 * its device is still open (a pool made by one backend and closed after it, while another backend keeps the device,
 * gives its memory back), and skips its free only once the last one has closed — releasing the primary context frees
 * whatever was still allocated in it.
 */
public final class CudaContext implements AutoCloseable {
    private static final ThreadLocal<CudaContext> CURRENT = new ThreadLocal<>();
    /** The retained primary contexts, by device; guarded by itself. */
    private static final Map<Integer, Primary> PRIMARIES = new HashMap<>();

    /**
     * A device's primary context, retained once while any {@link CudaContext} of it is open (holders). Once released
     * it stays released: a later open retains a new one, in which nothing made in this one exists.
     */
    private static final class Primary {
        final MemorySegment handle;
        int holders;
        boolean released;

        Primary(MemorySegment handle) {
            this.handle = handle;
        }
    }

    private final CudaDriver driver;
    private final Primary primary;
    private final int ordinal;
    private final int device;
    private final MemorySegment handle;
    private final String name;
    private final ComputeCapability computeCapability;
    private final int multiprocessors;
    private final long totalMemory;
    private final int maxSharedMemoryPerBlockOptin;
    private final int driverVersion;
    private final CudaStream defaultStream;
    private final boolean canOverlap;
    private volatile LaunchOverlap overlap;
    private volatile boolean closed;

    private CudaContext(CudaDriver driver, int ordinal) {
        this.driver = driver;
        this.ordinal = ordinal;
        this.device = driver.deviceGet(ordinal);
        this.name = driver.deviceGetName(device);
        this.computeCapability = new ComputeCapability(
                driver.deviceGetAttribute(CudaDriver.ATTR_COMPUTE_CAPABILITY_MAJOR, device),
                driver.deviceGetAttribute(CudaDriver.ATTR_COMPUTE_CAPABILITY_MINOR, device));
        this.multiprocessors = driver.deviceGetAttribute(CudaDriver.ATTR_MULTIPROCESSOR_COUNT, device);
        this.maxSharedMemoryPerBlockOptin =
                driver.deviceGetAttribute(CudaDriver.ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
        this.totalMemory = driver.deviceTotalMem(device);
        this.driverVersion = driver.driverGetVersion();
        // read before the context is retained: a bad value then leaves nothing behind
        this.overlap = LaunchOverlap.fromEnvironment(System.getenv("KVANT_CUDA_OVERLAP"));
        synchronized (PRIMARIES) {
            Primary p = PRIMARIES.get(device);
            if (p == null) {
                p = new Primary(driver.devicePrimaryCtxRetain(device));
                PRIMARIES.put(device, p);
            }
            p.holders++;
            this.primary = p;
        }
        this.handle = primary.handle;
        this.defaultStream = CudaStream.legacyDefault(this);
        this.canOverlap = computeCapability.major() >= 9 && driver.canLaunchOverlapped();
        makeCurrent();
    }

    /**
     * Which launches of overlappable kernels ({@link KernelSource#overlappable}) start as programmatic dependents
     * of the kernel before them, hiding their launch behind its tail ({@link CudaDriver#launchKernelOverlapped}).
     */
    public enum LaunchOverlap {
        /** None: every launch waits for its predecessor to finish. */
        NONE,
        /** Launches on streams marked with {@link CudaStream#overlapLaunches} (the default: the decode step's). */
        MARKED,
        /** Every launch of an overlappable kernel. */
        ALL;

        /** {@code KVANT_CUDA_OVERLAP}: 0 (none), all, or unset / 1 / marked (the default). */
        static LaunchOverlap fromEnvironment(String value) {
            if (value == null || value.isBlank() || value.equals("1") || value.equalsIgnoreCase("marked")) {
                return MARKED;
            }
            if (value.equals("0") || value.equalsIgnoreCase("none")) {
                return NONE;
            }
            if (value.equalsIgnoreCase("all")) {
                return ALL;
            }
            throw new IllegalArgumentException("KVANT_CUDA_OVERLAP='" + value + "': use 0, 1 or all");
        }
    }

    /** Sets which launches overlap from now on (comparisons and tests; the default comes from the environment). */
    public void setLaunchOverlap(LaunchOverlap overlap) {
        this.overlap = java.util.Objects.requireNonNull(overlap, "overlap");
    }

    public LaunchOverlap launchOverlap() {
        return overlap;
    }

    /** Whether a launch of an overlappable kernel on {@code stream} overlaps its predecessor (sm_90 and later). */
    boolean overlapsLaunches(CudaStream stream) {
        LaunchOverlap o = overlap;
        return canOverlap && (o == LaunchOverlap.ALL || o == LaunchOverlap.MARKED && stream.overlapsLaunches());
    }

    /** Opens device {@code $KVANT_CUDA_DEVICE}, or device 0. */
    public static CudaContext open() {
        return open(deviceFromEnvironment(System.getenv()));
    }

    /**
     * Opens device {@code ordinal} (0-based, in the driver's order, which CUDA_VISIBLE_DEVICES filters).
     *
     * @throws CudaUnavailableException where CUDA cannot run here
     * @throws IllegalArgumentException where the device does not exist
     */
    public static CudaContext open(int ordinal) {
        CudaDriver driver = Cuda.driver();
        int count = driver.deviceGetCount();
        if (ordinal < 0 || ordinal >= count) {
            throw new IllegalArgumentException("CUDA device " + ordinal + " does not exist: the driver reports "
                    + count + (count == 1 ? " device (ordinal 0)" : " devices (ordinals 0.." + (count - 1) + ")"));
        }
        return new CudaContext(driver, ordinal);
    }

    static int deviceFromEnvironment(Map<String, String> env) {
        String value = env.get("KVANT_CUDA_DEVICE");
        if (value == null || value.isBlank()) {
            return 0;
        }
        try {
            return Integer.parseInt(value.strip());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("KVANT_CUDA_DEVICE='" + value + "' is not a device ordinal (0, 1, ...)");
        }
    }

    /** Makes this context current on the calling thread (cheap when it already is). */
    public void makeCurrent() {
        if (closed) {
            throw new IllegalStateException("the CUDA context of device " + ordinal + " (" + name + ") is closed");
        }
        if (Thread.currentThread().isVirtual()) {
            driver.ctxSetCurrent(handle);
        } else if (CURRENT.get() != this) {
            driver.ctxSetCurrent(handle);
            CURRENT.set(this);
        }
    }

    public CudaDriver driver() {
        return driver;
    }

    /** The device ordinal this context was opened on. */
    public int ordinal() {
        return ordinal;
    }

    /** e.g. "NVIDIA H200". */
    public String deviceName() {
        return name;
    }

    public ComputeCapability computeCapability() {
        return computeCapability;
    }

    public int multiprocessors() {
        return multiprocessors;
    }

    /** Device memory in bytes. */
    public long totalMemory() {
        return totalMemory;
    }

    /** The most dynamic shared memory one block may opt in to (see {@link CudaFunction#setMaxDynamicSharedMemory}). */
    public int maxSharedMemoryPerBlockOptin() {
        return maxSharedMemoryPerBlockOptin;
    }

    /** The driver's CUDA version, 1000 * major + 10 * minor. */
    public int driverVersion() {
        return driverVersion;
    }

    /** Free and total device memory now. */
    public CudaDriver.MemoryInfo memoryInfo() {
        makeCurrent();
        return driver.memGetInfo();
    }

    /** Device memory from cuMemAlloc (256-byte aligned); not for the hot path, see {@link DevicePool}. */
    public DeviceBuffer allocate(long bytes) {
        if (bytes <= 0) {
            throw new IllegalArgumentException("device allocation of " + bytes + " bytes: the size must be positive");
        }
        makeCurrent();
        return DeviceBuffer.owned(this, driver.memAlloc(bytes), bytes);
    }

    /** Page-locked host memory, the kind asynchronous copies need to overlap with the host. */
    public PinnedBuffer allocatePinned(long bytes) {
        return new PinnedBuffer(this, bytes);
    }

    /** A bump allocator over one {@code capacity}-byte device allocation, for per-step scratch. */
    public DevicePool createPool(long capacity) {
        return new DevicePool(this, capacity);
    }

    /** A new stream that does not synchronise with the legacy default stream. */
    public CudaStream createStream() {
        makeCurrent();
        return new CudaStream(this, driver.streamCreate(CudaDriver.STREAM_NON_BLOCKING), true);
    }

    /** The legacy default (NULL) stream: ordered with every blocking stream; cannot be captured into a graph. */
    public CudaStream defaultStream() {
        return defaultStream;
    }

    /** An event that records time (for {@link CudaEvent#elapsedMillis}). */
    public CudaEvent createEvent() {
        makeCurrent();
        return new CudaEvent(this, driver.eventCreate(CudaDriver.EVENT_DEFAULT));
    }

    /** Loads a compiled image (cubin). */
    public CudaModule loadModule(String name, byte[] cubin) {
        return CudaModule.load(this, name, cubin, false);
    }

    /** Compiles (or takes from the cache) {@code source} for this device's architecture and loads it. */
    public CudaModule loadModule(KernelCache cache, KernelSource source, Map<String, String> defines) {
        if (source.overlappable()) {  // one of kvant's own sources
            computeCapability.requireKvantKernels(toString());
        }
        return cache.load(source, computeCapability.arch(), defines,
                cubin -> CudaModule.load(this, source.name(), cubin, source.overlappable()));
    }

    public CudaModule loadModule(KernelCache cache, KernelSource source) {
        return loadModule(cache, source, Map.of());
    }

    /**
     * Lets this context read and write {@code peer}'s memory directly where the devices allow it (NVLink, PCIe
     * P2P); returns whether they do. Copies between them work either way (through the host otherwise).
     */
    public boolean enablePeerAccess(CudaContext peer) {
        if (peer.ordinal == ordinal) {
            return true;
        }
        if (!driver.deviceCanAccessPeer(device, peer.device)) {
            return false;
        }
        makeCurrent();
        driver.ctxEnablePeerAccess(peer.handle);
        return true;
    }

    /** Waits for all work in this context. */
    public void synchronize() {
        makeCurrent();
        driver.ctxSynchronize();
    }

    public boolean isClosed() {
        return closed;
    }

    /**
     * Runs {@code free} (a destroy or free call of something made from this context) with the primary context
     * current, if it is still retained — by this context or another open one of the device; otherwise the release
     * of the primary context has already freed it, and {@code free} does not run. Holds the contexts' lock, so the
     * last context cannot close in between.
     */
    void release(Runnable free) {
        synchronized (PRIMARIES) {
            if (primary.released) {
                return;
            }
            driver.ctxSetCurrent(handle);
            CURRENT.remove();   // the next makeCurrent sets its context again
            free.run();
        }
    }

    /** Closes this context; the last one open on the device releases the primary context. Idempotent. */
    @Override
    public void close() {
        synchronized (PRIMARIES) {
            if (closed) {
                return;
            }
            closed = true;
            if (CURRENT.get() == this) {
                CURRENT.remove();
            }
            if (--primary.holders == 0) {
                primary.released = true;
                PRIMARIES.remove(device);
                driver.devicePrimaryCtxRelease(device);
            }
        }
    }

    MemorySegment handle() {
        return handle;
    }

    @Override
    public String toString() {
        return "CUDA device " + ordinal + " (" + name + ", sm_" + computeCapability.major() + computeCapability.minor()
                + ", " + multiprocessors + " SMs, " + (totalMemory >> 20) + " MiB)";
    }
}
