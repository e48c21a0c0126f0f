package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.util.List;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * NVRTC, CUDA's runtime compiler: CUDA C++ source in, cubin for one real architecture out. Needs no GPU, only the
 * library ({@code libnvrtc.so}, which dlopens {@code libnvrtc-builtins.so} from its own folder).
 *
 * <p>The library is looked for in {@code $KVANT_NVRTC} (the file, or its folder), then libnvrtc.so, .so.13, .so.12
 * through the dynamic loader, then under /usr/local/cuda*, then in the pip wheels of python's site-packages
 * ({@code nvidia/cu13/lib} for CUDA 13, {@code nvidia/cuda_nvrtc/lib} for 12); the error lists what was tried.
 * Found by path, its {@code libnvrtc-builtins.so.*} is preloaded from the same folder (NVRTC opens it by soname).
 *
 * <p>Options kvant passes ({@link KernelCache#options}): {@code --gpu-architecture=sm_XY} (a real arch, so the output
 * is a cubin and nothing is left to the driver's PTX JIT), {@code --std=c++17}, {@code -default-device}, and
 * {@code -DNAME=VALUE} defines. NVRTC has no {@code -O3}; it optimises by default.
 */
public final class Nvrtc implements KernelCompiler {
    static final String ENV = "KVANT_NVRTC";
    static final List<String> SONAMES = List.of("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12");
    static final List<String> PIP_FOLDERS = List.of("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib");
    /** The builtins library NVRTC dlopens by soname (the pip wheel also ships an ".alt." variant we leave alone). */
    static final String BUILTINS_GLOB = "libnvrtc-builtins.so.[0-9]*";

    private static final int NVRTC_SUCCESS = 0;
    private static final Object LOCK = new Object();
    private static volatile Nvrtc instance;
    private static volatile CudaUnavailableException failure;

    private final NativeLibrary library;
    private final MethodHandle nvrtcVersion, nvrtcCreateProgram, nvrtcCompileProgram, nvrtcGetProgramLogSize,
            nvrtcGetProgramLog, nvrtcGetCUBINSize, nvrtcGetCUBIN, nvrtcGetPTXSize, nvrtcGetPTX, nvrtcDestroyProgram,
            nvrtcGetErrorString;
    private final int major;
    private final int minor;

    private Nvrtc(NativeLibrary library) {
        this.library = library;
        nvrtcVersion = bind("nvrtcVersion", ADDRESS, ADDRESS);
        nvrtcCreateProgram = bind("nvrtcCreateProgram", ADDRESS, ADDRESS, ADDRESS, JAVA_INT, ADDRESS, ADDRESS);
        nvrtcCompileProgram = bind("nvrtcCompileProgram", ADDRESS, JAVA_INT, ADDRESS);
        nvrtcGetProgramLogSize = bind("nvrtcGetProgramLogSize", ADDRESS, ADDRESS);
        nvrtcGetProgramLog = bind("nvrtcGetProgramLog", ADDRESS, ADDRESS);
        nvrtcGetCUBINSize = bind("nvrtcGetCUBINSize", ADDRESS, ADDRESS);
        nvrtcGetCUBIN = bind("nvrtcGetCUBIN", ADDRESS, ADDRESS);
        nvrtcGetPTXSize = bind("nvrtcGetPTXSize", ADDRESS, ADDRESS);
        nvrtcGetPTX = bind("nvrtcGetPTX", ADDRESS, ADDRESS);
        nvrtcDestroyProgram = bind("nvrtcDestroyProgram", ADDRESS);
        nvrtcGetErrorString = library.function("nvrtcGetErrorString", FunctionDescriptor.of(ADDRESS, JAVA_INT));
        try (Arena a = Arena.ofConfined()) {
            MemorySegment maj = a.allocate(JAVA_INT);
            MemorySegment min = a.allocate(JAVA_INT);
            check((int) nvrtcVersion.invokeExact(maj, min), "nvrtcVersion()");
            this.major = maj.get(JAVA_INT, 0);
            this.minor = min.get(JAVA_INT, 0);
        } catch (Throwable t) {
            throw CudaDriver.rethrow(t);
        }
        requireSupported(major, minor, library.loadedFrom());
    }

    /** The oldest NVRTC whose PTX kvant's kernels assemble with: 12.1 (PTX ISA 8.1, cvt.rn.satfinite.f16.f32). */
    static final int MIN_MAJOR = 12, MIN_MINOR = 1;

    /**
     * @throws CudaUnavailableException naming the library and what kvant needs, for an NVRTC older than
     *                                  {@link #MIN_MAJOR}.{@link #MIN_MINOR}, which would fail every kernel compile
     *                                  with a ptxas message instead
     */
    static void requireSupported(int major, int minor, String where) {
        if (major < MIN_MAJOR || major == MIN_MAJOR && minor < MIN_MINOR) {
            throw new CudaUnavailableException("libnvrtc at " + where + " is NVRTC " + major + "." + minor
                    + "; kvant's kernels need NVRTC " + MIN_MAJOR + "." + MIN_MINOR + " or later (PTX ISA 8.1);"
                    + " point " + ENV + " at a newer one");
        }
    }

    private MethodHandle bind(String symbol, MemoryLayout... args) {
        return library.function(symbol, FunctionDescriptor.of(JAVA_INT, args));
    }

    /**
     * The process-wide NVRTC, loaded on first use.
     *
     * @throws CudaUnavailableException naming every place the library was looked for
     */
    public static Nvrtc load() {
        Nvrtc n = instance;
        if (n != null) {
            return n;
        }
        synchronized (LOCK) {
            if (instance == null) {
                if (failure != null) {
                    throw failure;
                }
                try {
                    NativeLibrary library = NativeLibrary.load("libnvrtc",
                            NativeLibrary.toolkitCandidates(ENV, SONAMES, PIP_FOLDERS, System::getenv),
                            NativeLibrary.toolkitSearchNote(ENV, PIP_FOLDERS), BUILTINS_GLOB);
                    instance = new Nvrtc(library);
                } catch (CudaUnavailableException e) {
                    failure = e;
                    throw e;
                } catch (IllegalCallerException e) {
                    failure = new CudaUnavailableException("libnvrtc could not be loaded: native access is not "
                            + "enabled; run java with --enable-native-access=ALL-UNNAMED", e);
                    throw failure;
                }
            }
            return instance;
        }
    }

    /** Where the library was loaded from. */
    public String loadedFrom() {
        return library.loadedFrom();
    }

    public int major() {
        return major;
    }

    public int minor() {
        return minor;
    }

    @Override
    public String version() {
        return "nvrtc " + major + "." + minor;
    }

    /**
     * Compiles {@code source} to a cubin.
     *
     * @param options must name a real architecture ({@code --gpu-architecture=sm_90}), or there is no cubin
     * @throws KernelCompileException with the full program log, when the source does not compile
     */
    @Override
    public byte[] compile(KernelSource source, List<String> options) {
        return build(source, options, false);
    }

    /**
     * Compiles {@code source} to PTX text, for reading what the compiler made of a kernel on a machine without a GPU
     * ({@code AttentionPtx}); never loaded: kvant runs cubins only.
     *
     * @param options must name a virtual architecture ({@code --gpu-architecture=compute_90})
     */
    public String ptx(KernelSource source, List<String> options) {
        byte[] text = build(source, options, true);
        int end = 0;
        while (end < text.length && text[end] != 0) {
            end++;
        }
        return new String(text, 0, end, java.nio.charset.StandardCharsets.UTF_8);
    }

    private byte[] build(KernelSource source, List<String> options, boolean ptx) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment programBox = a.allocate(ADDRESS);
            check((int) nvrtcCreateProgram.invokeExact(programBox, a.allocateFrom(source.code()),
                    a.allocateFrom(source.name()), 0, MemorySegment.NULL, MemorySegment.NULL),
                    "nvrtcCreateProgram(" + source.name() + ")");
            MemorySegment program = programBox.get(ADDRESS, 0);
            try {
                MemorySegment optionArray = a.allocate(ADDRESS, Math.max(1, options.size()));
                for (int i = 0; i < options.size(); i++) {
                    optionArray.setAtIndex(ADDRESS, i, a.allocateFrom(options.get(i)));
                }
                int rc = (int) nvrtcCompileProgram.invokeExact(program, options.size(), optionArray);
                if (rc != NVRTC_SUCCESS) {
                    throw new KernelCompileException(source.name(), options, rc, errorName(rc), log(a, program));
                }
                MemorySegment size = a.allocate(JAVA_LONG);
                if (ptx) {
                    check((int) nvrtcGetPTXSize.invokeExact(program, size), "nvrtcGetPTXSize(" + source.name() + ")");
                    MemorySegment text = a.allocate(Math.max(1, size.get(JAVA_LONG, 0)));
                    check((int) nvrtcGetPTX.invokeExact(program, text), "nvrtcGetPTX(" + source.name() + ")");
                    return text.toArray(JAVA_BYTE);
                }
                check((int) nvrtcGetCUBINSize.invokeExact(program, size), "nvrtcGetCUBINSize(" + source.name() + ")");
                long bytes = size.get(JAVA_LONG, 0);
                if (bytes <= 0 || bytes > Integer.MAX_VALUE) {
                    throw new IllegalStateException("nvrtcGetCUBINSize(" + source.name() + ") returned " + bytes
                            + " bytes: were the options for a real architecture (--gpu-architecture=sm_XY)?");
                }
                MemorySegment cubin = a.allocate(bytes);
                check((int) nvrtcGetCUBIN.invokeExact(program, cubin), "nvrtcGetCUBIN(" + source.name() + ")");
                return cubin.toArray(JAVA_BYTE);
            } finally {
                int rc = (int) nvrtcDestroyProgram.invokeExact(programBox);
                if (rc != NVRTC_SUCCESS) {
                    System.getLogger(Nvrtc.class.getName()).log(System.Logger.Level.WARNING,
                            "nvrtcDestroyProgram(" + source.name() + ") failed: " + errorName(rc));
                }
            }
        } catch (Throwable t) {
            throw CudaDriver.rethrow(t);
        }
    }

    private String log(Arena a, MemorySegment program) throws Throwable {
        MemorySegment size = a.allocate(JAVA_LONG);
        if ((int) nvrtcGetProgramLogSize.invokeExact(program, size) != NVRTC_SUCCESS) {
            return "";
        }
        long bytes = size.get(JAVA_LONG, 0);
        if (bytes <= 1) {
            return "";
        }
        MemorySegment text = a.allocate(bytes);
        if ((int) nvrtcGetProgramLog.invokeExact(program, text) != NVRTC_SUCCESS) {
            return "";
        }
        return text.getString(0);
    }

    /** NVRTC's name for a status, e.g. NVRTC_ERROR_COMPILATION. */
    public String errorName(int result) {
        try {
            MemorySegment text = (MemorySegment) nvrtcGetErrorString.invokeExact(result);
            return text.equals(MemorySegment.NULL) ? "nvrtcResult " + result
                    : text.reinterpret(Integer.MAX_VALUE).getString(0);
        } catch (Throwable t) {
            return "nvrtcResult " + result;
        }
    }

    private void check(int rc, String call) {
        if (rc != NVRTC_SUCCESS) {
            throw new CudaException(call, rc, errorName(rc), null);
        }
    }
}
