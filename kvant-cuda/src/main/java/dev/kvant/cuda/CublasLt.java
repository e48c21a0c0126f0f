package dev.kvant.cuda;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_FLOAT;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The one cuBLASLt operation the model needs: a half-precision GEMM with fp32 accumulation, in the shape of a
 * linear layer over a batch of rows,
 *
 * <pre>  C[m, n] = A[m, k] · B[n, k]ᵀ      (all row-major, contiguous)</pre>
 *
 * where A holds m activations of width k and B holds n weight rows of width k (GGUF's layout for a projection
 * matrix). A and B are F16 or BF16 (the same); C is F32 or the input type; accumulation and scaling are fp32.
 *
 * <p>cuBLASLt is column-major. A row-major matrix is the column-major matrix of its transpose, so we ask it for
 * Cᵀ[n, m] = B[n, k] · Aᵀ[k, m]: its "A" operand is our B (column-major k×n, leading dimension k, transposed: the
 * "TN" layout tensor-core GEMMs favour), its "B" operand our A (column-major k×m, leading dimension k), and its
 * output column-major n×m with leading dimension n, which is exactly row-major C[m, n].
 *
 * <p>For each shape (and operand alignment) the descriptors and the heuristic's best algorithm are made once and
 * kept, so repeated calls, and calls under graph capture, do no host-side planning. The library is found like
 * NVRTC: {@code $KVANT_CUBLASLT}, libcublasLt.so(.13/.12), /usr/local/cuda*, pip's nvidia/cu13/lib or
 * nvidia/cublas/lib.
 */
public final class CublasLt implements AutoCloseable {
    /** Workspace the heuristic may use: 32 MiB is what NVIDIA recommends for Hopper. */
    public static final long DEFAULT_WORKSPACE_BYTES = 32L << 20;

    static final String ENV = "KVANT_CUBLASLT";
    static final List<String> SONAMES = List.of("libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12");
    static final List<String> PIP_FOLDERS = List.of("nvidia/cu13/lib", "nvidia/cublas/lib");

    // cublas_api.h / cublasLt.h enum values.
    private static final int CUBLAS_STATUS_SUCCESS = 0;
    private static final int CUBLAS_COMPUTE_32F = 68;
    private static final int CUBLAS_OP_N = 0;
    private static final int CUBLAS_OP_T = 1;
    private static final int MATMUL_DESC_TRANSA = 3;
    private static final int MATMUL_DESC_TRANSB = 4;
    private static final int PREF_MAX_WORKSPACE_BYTES = 1;
    private static final int PREF_MIN_ALIGNMENT_A_BYTES = 5;
    private static final int PREF_MIN_ALIGNMENT_B_BYTES = 6;
    private static final int PREF_MIN_ALIGNMENT_C_BYTES = 7;
    private static final int PREF_MIN_ALIGNMENT_D_BYTES = 8;
    /** sizeof(cublasLtMatmulHeuristicResult_t): algo (8 × uint64), size_t workspaceSize, int state,
     * float wavesCount, int reserved[4]. */
    static final long HEURISTIC_RESULT_BYTES = 64 + 8 + 4 + 4 + 16;
    static final long HEURISTIC_WORKSPACE_OFFSET = 64;
    static final long HEURISTIC_STATE_OFFSET = 72;

    private static final Object LOCK = new Object();
    private static volatile Api api;

    private final CudaContext context;
    private final Api lib;
    private final MemorySegment handle;
    private final DeviceBuffer workspace;
    private final Arena arena = Arena.ofShared();
    private final MemorySegment alpha;
    private final MemorySegment beta;
    private final MemorySegment one;
    private final Map<PlanKey, Plan> plans = new HashMap<>();
    private boolean closed;

    private CublasLt(CudaContext context, long workspaceBytes) {
        this.context = context;
        this.lib = api();
        context.makeCurrent();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment box = a.allocate(ADDRESS);
            lib.check((int) lib.create.invokeExact(box), "cublasLtCreate()");
            this.handle = box.get(ADDRESS, 0);
        } catch (Throwable t) {
            arena.close();
            throw CudaDriver.rethrow(t);
        }
        try {
            this.workspace = context.allocate(workspaceBytes);
        } catch (RuntimeException | Error e) {
            try {
                int ignored = (int) lib.destroy.invokeExact(handle);  // the allocation's failure is the one to report
            } catch (Throwable t) {
                e.addSuppressed(t);
            }
            arena.close();
            throw e;
        }
        this.alpha = arena.allocateFrom(JAVA_FLOAT, 1f);
        this.beta = arena.allocateFrom(JAVA_FLOAT, 0f);
        this.one = arena.allocateFrom(JAVA_FLOAT, 1f);
    }

    /** A cuBLASLt handle on {@code context} with a {@link #DEFAULT_WORKSPACE_BYTES} workspace. */
    public static CublasLt create(CudaContext context) {
        return create(context, DEFAULT_WORKSPACE_BYTES);
    }

    public static CublasLt create(CudaContext context, long workspaceBytes) {
        return new CublasLt(context, workspaceBytes);
    }

    /**
     * cuBLASLt's version number, e.g. 130101 for 13.1.1; loads the library (no GPU needed).
     *
     * @throws CudaUnavailableException naming every place the library was looked for
     */
    public static long libraryVersion() {
        try {
            return (long) api().getVersion.invokeExact();
        } catch (Throwable t) {
            throw CudaDriver.rethrow(t);
        }
    }

    /** Where the library was loaded from; loads it (no GPU needed). */
    public static String libraryPath() {
        return api().library.loadedFrom();
    }

    /**
     * Queues C[m, n] = A[m, k] · B[n, k]ᵀ on {@code stream} (row-major; see the class comment).
     *
     * @param inputType  type of A and B: F16 or BF16
     * @param outputType type of C: F32, or the input type
     */
    public void gemm(DeviceBuffer a, DeviceBuffer b, DeviceBuffer c, int m, int n, int k,
                     CudaDataType inputType, CudaDataType outputType, CudaStream stream) {
        gemm(a, b, c, m, n, k, inputType, outputType, false, stream);
    }

    /**
     * As {@link #gemm(DeviceBuffer, DeviceBuffer, DeviceBuffer, int, int, int, CudaDataType, CudaDataType,
     * CudaStream)}; with {@code accumulate} the product is added to C (C += A · Bᵀ: a residual connection for free).
     */
    public synchronized void gemm(DeviceBuffer a, DeviceBuffer b, DeviceBuffer c, int m, int n, int k,
                                  CudaDataType inputType, CudaDataType outputType, boolean accumulate,
                                  CudaStream stream) {
        if (closed) {
            throw new IllegalStateException("cuBLASLt handle was used after close()");
        }
        if (inputType == CudaDataType.F32) {
            throw new IllegalArgumentException("gemm: inputs must be F16 or BF16, not F32");
        }
        if (outputType != CudaDataType.F32 && outputType != inputType) {
            throw new IllegalArgumentException("gemm: output " + outputType + " for input " + inputType
                    + "; use F32 or " + inputType);
        }
        if (m <= 0 || n <= 0 || k <= 0) {
            throw new IllegalArgumentException("gemm: shape m=" + m + " n=" + n + " k=" + k + " must be positive");
        }
        a.checkRange("gemm A[" + m + "," + k + "]", 0, (long) m * k * inputType.bytes());
        b.checkRange("gemm B[" + n + "," + k + "]", 0, (long) n * k * inputType.bytes());
        c.checkRange("gemm C[" + m + "," + n + "]", 0, (long) m * n * outputType.bytes());
        PlanKey key = new PlanKey(m, n, k, inputType, outputType,
                alignment(a.address()), alignment(b.address()), alignment(c.address()));
        context.makeCurrent();
        Plan plan = plans.get(key);
        if (plan == null) {
            plan = plan(key);
            plans.put(key, plan);
        }
        MemorySegment betaValue = accumulate ? one : beta;
        try {
            int rc = (int) lib.matmul.invokeExact(handle, plan.operation, alpha,
                    b.address(), plan.weights, a.address(), plan.activations, betaValue,
                    c.address(), plan.output, c.address(), plan.output,
                    plan.heuristic, workspace.address(), workspace.byteSize(), stream.handle());
            if (rc != CUBLAS_STATUS_SUCCESS) {
                throw lib.error(rc, "cublasLtMatmul(" + key.describe() + ")");
            }
        } catch (Throwable t) {
            throw CudaDriver.rethrow(t);
        }
    }

    /** The largest power of two (up to 256) dividing {@code address}: what the heuristic may assume. */
    static int alignment(long address) {
        long lowest = Long.lowestOneBit(address);
        return (int) (lowest == 0 || lowest > 256 ? 256 : lowest);
    }

    record PlanKey(int m, int n, int k, CudaDataType input, CudaDataType output, int alignA, int alignB, int alignC) {
        String describe() {
            return "m=" + m + " n=" + n + " k=" + k + ", " + input + "→" + output;
        }
    }

    /** Descriptors and the chosen algorithm for one PlanKey; destroyed with the handle. */
    private record Plan(MemorySegment operation, MemorySegment weights, MemorySegment activations,
                        MemorySegment output, MemorySegment heuristic) {
    }

    /**
     * The descriptors and algorithm of key; what it created is destroyed again when a later step fails (a shape
     * with no algorithm, say), so a failed plan leaks nothing into the handle's lifetime.
     */
    private Plan plan(PlanKey key) {
        String what = key.describe();
        MemorySegment operation = null;
        MemorySegment[] layouts = new MemorySegment[3];   // weights, activations, output
        try (Arena a = Arena.ofConfined()) {
            MemorySegment box = a.allocate(ADDRESS);
            lib.check((int) lib.descCreate.invokeExact(box, CUBLAS_COMPUTE_32F, CudaDataType.F32.value),
                    "cublasLtMatmulDescCreate(" + what + ")");
            operation = box.get(ADDRESS, 0);
            setInt(lib.descSetAttribute, operation, MATMUL_DESC_TRANSA, CUBLAS_OP_T, a, "TRANSA");
            setInt(lib.descSetAttribute, operation, MATMUL_DESC_TRANSB, CUBLAS_OP_N, a, "TRANSB");
            layouts[0] = layout(box, key.input, key.k, key.n, key.k, what);
            layouts[1] = layout(box, key.input, key.k, key.m, key.k, what);
            layouts[2] = layout(box, key.output, key.n, key.m, key.n, what);
            MemorySegment weights = layouts[0], activations = layouts[1], output = layouts[2];

            lib.check((int) lib.prefCreate.invokeExact(box), "cublasLtMatmulPreferenceCreate()");
            MemorySegment preference = box.get(ADDRESS, 0);
            MemorySegment heuristic = a.allocate(HEURISTIC_RESULT_BYTES, 8);
            try {
                MemorySegment workspaceBytes = a.allocateFrom(JAVA_LONG, workspace.byteSize());
                lib.check((int) lib.prefSetAttribute.invokeExact(preference, PREF_MAX_WORKSPACE_BYTES,
                        workspaceBytes, 8L), "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
                // cuBLASLt's operand A is our B (weights), its B our A (activations).
                setInt(lib.prefSetAttribute, preference, PREF_MIN_ALIGNMENT_A_BYTES, key.alignB, a, "MIN_ALIGNMENT_A");
                setInt(lib.prefSetAttribute, preference, PREF_MIN_ALIGNMENT_B_BYTES, key.alignA, a, "MIN_ALIGNMENT_B");
                setInt(lib.prefSetAttribute, preference, PREF_MIN_ALIGNMENT_C_BYTES, key.alignC, a, "MIN_ALIGNMENT_C");
                setInt(lib.prefSetAttribute, preference, PREF_MIN_ALIGNMENT_D_BYTES, key.alignC, a, "MIN_ALIGNMENT_D");
                MemorySegment found = a.allocate(JAVA_INT);
                lib.check((int) lib.algoGetHeuristic.invokeExact(handle, operation, weights, activations, output,
                        output, preference, 1, heuristic, found), "cublasLtMatmulAlgoGetHeuristic(" + what + ")");
                int state = heuristic.get(JAVA_INT, HEURISTIC_STATE_OFFSET);
                if (found.get(JAVA_INT, 0) < 1 || state != CUBLAS_STATUS_SUCCESS) {
                    throw new CudaException("cublasLtMatmulAlgoGetHeuristic(" + what + ")", state,
                            found.get(JAVA_INT, 0) < 1 ? "no algorithm" : lib.statusName(state),
                            "cuBLASLt has no algorithm for this shape, type and alignment within a "
                                    + workspace.byteSize() + "-byte workspace");
                }
            } finally {
                int ignored = (int) lib.prefDestroy.invokeExact(preference);
            }
            // the chosen algorithm outlives this call: copied into the handle's arena only once it is good
            MemorySegment kept = arena.allocate(HEURISTIC_RESULT_BYTES, 8).copyFrom(heuristic);
            return new Plan(operation, weights, activations, output, kept);
        } catch (Throwable t) {
            try {
                for (MemorySegment l : layouts) {
                    if (l != null) {
                        int ignored = (int) lib.layoutDestroy.invokeExact(l);
                    }
                }
                if (operation != null) {
                    int ignored = (int) lib.descDestroy.invokeExact(operation);
                }
            } catch (Throwable cleanup) {
                t.addSuppressed(cleanup);
            }
            throw CudaDriver.rethrow(t);
        }
    }

    private MemorySegment layout(MemorySegment box, CudaDataType type, long rows, long cols, long ld, String what)
            throws Throwable {
        lib.check((int) lib.layoutCreate.invokeExact(box, type.value, rows, cols, ld),
                "cublasLtMatrixLayoutCreate(" + type + ", " + rows + "x" + cols + ", ld " + ld + "; " + what + ")");
        return box.get(ADDRESS, 0);
    }

    private void setInt(MethodHandle setter, MemorySegment descriptor, int attribute, int value, Arena a,
                        String name) throws Throwable {
        MemorySegment v = a.allocateFrom(JAVA_INT, value);
        lib.check((int) setter.invokeExact(descriptor, attribute, v, 4L), "cublasLt set " + name + "=" + value);
    }

    /** Destroys the plans, the workspace and the handle; idempotent. */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        try {
            context.release(() -> {
                try {
                    for (Plan p : plans.values()) {
                        int r1 = (int) lib.descDestroy.invokeExact(p.operation);
                        int r2 = (int) lib.layoutDestroy.invokeExact(p.weights);
                        int r3 = (int) lib.layoutDestroy.invokeExact(p.activations);
                        int r4 = (int) lib.layoutDestroy.invokeExact(p.output);
                    }
                    lib.check((int) lib.destroy.invokeExact(handle), "cublasLtDestroy()");
                } catch (Throwable t) {
                    throw CudaDriver.rethrow(t);
                }
            });
        } finally {
            plans.clear();
            workspace.close();
            arena.close();
        }
    }

    private static Api api() {
        Api a = api;
        if (a == null) {
            synchronized (LOCK) {
                if (api == null) {
                    api = new Api(NativeLibrary.load("libcublasLt",
                            NativeLibrary.toolkitCandidates(ENV, SONAMES, PIP_FOLDERS, System::getenv),
                            NativeLibrary.toolkitSearchNote(ENV, PIP_FOLDERS)));
                }
                a = api;
            }
        }
        return a;
    }

    /** The bound functions of libcublasLt. */
    private static final class Api {
        final NativeLibrary library;
        final MethodHandle create, destroy, getVersion, descCreate, descSetAttribute, descDestroy, layoutCreate,
                layoutDestroy, prefCreate, prefSetAttribute, prefDestroy, algoGetHeuristic, matmul;
        final Optional<MethodHandle> statusName, statusString;

        Api(NativeLibrary library) {
            this.library = library;
            create = bind("cublasLtCreate", ADDRESS);
            destroy = bind("cublasLtDestroy", ADDRESS);
            getVersion = library.function("cublasLtGetVersion", FunctionDescriptor.of(JAVA_LONG));
            descCreate = bind("cublasLtMatmulDescCreate", ADDRESS, JAVA_INT, JAVA_INT);
            descSetAttribute = bind("cublasLtMatmulDescSetAttribute", ADDRESS, JAVA_INT, ADDRESS, JAVA_LONG);
            descDestroy = bind("cublasLtMatmulDescDestroy", ADDRESS);
            layoutCreate = bind("cublasLtMatrixLayoutCreate", ADDRESS, JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG);
            layoutDestroy = bind("cublasLtMatrixLayoutDestroy", ADDRESS);
            prefCreate = bind("cublasLtMatmulPreferenceCreate", ADDRESS);
            prefSetAttribute = bind("cublasLtMatmulPreferenceSetAttribute", ADDRESS, JAVA_INT, ADDRESS, JAVA_LONG);
            prefDestroy = bind("cublasLtMatmulPreferenceDestroy", ADDRESS);
            algoGetHeuristic = bind("cublasLtMatmulAlgoGetHeuristic", ADDRESS, ADDRESS, ADDRESS, ADDRESS, ADDRESS,
                    ADDRESS, ADDRESS, JAVA_INT, ADDRESS, ADDRESS);
            // Device pointers (A, B, C, D, workspace) are passed as 64-bit integers: the same register on LP64.
            matmul = bind("cublasLtMatmul", ADDRESS, ADDRESS, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS,
                    ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, ADDRESS, JAVA_LONG, JAVA_LONG, ADDRESS);
            statusName = optional("cublasLtGetStatusName");
            statusString = optional("cublasLtGetStatusString");
        }

        private MethodHandle bind(String symbol, MemoryLayout... args) {
            return library.function(symbol, FunctionDescriptor.of(JAVA_INT, args));
        }

        private Optional<MethodHandle> optional(String symbol) {
            return library.lookup().find(symbol).map(address -> Linker.nativeLinker()
                    .downcallHandle(address, FunctionDescriptor.of(ADDRESS, JAVA_INT)));
        }

        void check(int status, String call) {
            if (status != CUBLAS_STATUS_SUCCESS) {
                throw error(status, call);
            }
        }

        CudaException error(int status, String call) {
            return new CudaException(call, status, statusName(status), text(statusString, status, null));
        }

        String statusName(int status) {
            return text(statusName, status, "cublasStatus_t " + status);
        }

        private static String text(Optional<MethodHandle> handle, int status, String fallback) {
            if (handle.isEmpty()) {
                return fallback;
            }
            try {
                MemorySegment s = (MemorySegment) handle.get().invokeExact(status);
                return s.equals(MemorySegment.NULL) ? fallback : s.reinterpret(Integer.MAX_VALUE).getString(0);
            } catch (Throwable t) {
                return fallback;
            }
        }
    }
}
