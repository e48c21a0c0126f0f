package dev.kvant.cuda;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Function;

/**
 * The door to the GPU: says whether CUDA can run in this process and hands out the driver bindings.
 *
 * <p>Nothing native is touched until {@link #available()}, {@link #requireAvailable()} or {@link #driver()} is
 * called. The first of them loads {@code libcuda.so.1} (or {@code $KVANT_LIBCUDA}), calls cuInit and counts the
 * devices, once per process. On a machine without CUDA it answers with a reason and never throws: a missing library
 * is an ordinary answer, not a crash.
 */
public final class Cuda {
    /** The driver library's soname; the NVIDIA driver installs it on the loader path. */
    public static final String LIBCUDA = "libcuda.so.1";

    private static final Object LOCK = new Object();
    private static volatile Probe probe;

    private Cuda() {
    }

    /** Whether CUDA can run here, and why not. Never throws. */
    public static CudaAvailability available() {
        return probe().availability();
    }

    /**
     * Throws unless CUDA can run here: the check behind {@code --backend cuda}.
     *
     * @throws CudaUnavailableException e.g. {@code no CUDA GPU: libcuda.so.1 could not be loaded (...)}
     */
    public static void requireAvailable() {
        CudaAvailability a = available();
        if (!a.ok()) {
            throw new CudaUnavailableException("no CUDA GPU: " + a.reason());
        }
    }

    /** The initialised driver bindings. */
    public static CudaDriver driver() {
        requireAvailable();
        return probe().driver();
    }

    private static Probe probe() {
        Probe p = probe;
        if (p == null) {
            synchronized (LOCK) {
                p = probe;
                if (p == null) {
                    p = probe(libcudaCandidates(System::getenv));
                    probe = p;
                }
            }
        }
        return p;
    }

    /** Where libcuda is looked for: $KVANT_LIBCUDA first, then the loader path, then WSL's driver folder. */
    static List<String> libcudaCandidates(Function<String, String> env) {
        List<String> out = new ArrayList<>();
        String override = env.apply("KVANT_LIBCUDA");
        if (override != null && !override.isBlank()) {
            out.add(override.strip());
        }
        out.add(LIBCUDA);
        out.add("/usr/lib/wsl/lib/" + LIBCUDA);
        return out;
    }

    /** The result of looking for a usable driver; {@code driver} is null unless the availability is ok. */
    record Probe(CudaAvailability availability, CudaDriver driver) {
    }

    /** Loads the driver from the first loadable candidate, initialises it and counts devices; never throws. */
    static Probe probe(List<String> candidates) {
        NativeLibrary library;
        try {
            library = NativeLibrary.load(LIBCUDA, candidates,
                    "is the NVIDIA driver installed? KVANT_LIBCUDA may name the library's path");
        } catch (CudaUnavailableException e) {
            return new Probe(CudaAvailability.unavailable(e.getMessage()), null);
        } catch (IllegalCallerException e) {
            return new Probe(CudaAvailability.unavailable(LIBCUDA + " could not be loaded: native access is not "
                    + "enabled; run java with --enable-native-access=ALL-UNNAMED"), null);
        }
        CudaDriver driver;
        try {
            driver = new CudaDriver(library);
        } catch (RuntimeException | LinkageError e) {
            return new Probe(CudaAvailability.unavailable(LIBCUDA + " loaded from " + library.loadedFrom()
                    + " but could not be bound: " + e.getMessage()), null);
        }
        try {
            driver.init();
        } catch (CudaException e) {
            return new Probe(CudaAvailability.unavailable("the driver found no usable GPU: " + e.getMessage()), null);
        } catch (RuntimeException | LinkageError e) {
            return new Probe(CudaAvailability.unavailable("cuInit could not be called: " + e), null);
        }
        try {
            int version = driver.driverGetVersion();
            int count = driver.deviceGetCount();
            if (count <= 0) {
                return new Probe(new CudaAvailability(false, "the driver (CUDA " + versionString(version)
                        + ") reports no CUDA device", version, 0), null);
            }
            String first = driver.deviceGetName(driver.deviceGet(0));
            String reason = count + (count == 1 ? " device (" : " devices (first: ") + first + "), driver CUDA "
                    + versionString(version) + ", " + LIBCUDA + " from " + library.loadedFrom();
            return new Probe(new CudaAvailability(true, reason, version, count), driver);
        } catch (CudaException e) {
            return new Probe(CudaAvailability.unavailable("the driver initialised but its devices cannot be listed: "
                    + e.getMessage()), null);
        } catch (RuntimeException | LinkageError e) {
            return new Probe(CudaAvailability.unavailable("the driver's devices could not be listed: " + e), null);
        }
    }

    /** 13000 → "13.0", 12080 → "12.8". */
    static String versionString(int cudaVersion) {
        return cudaVersion / 1000 + "." + (cudaVersion % 1000) / 10;
    }
}
