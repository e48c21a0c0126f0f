package dev.kvant.cuda;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * CUDA C++ source of one compilation unit.
 *
 * @param name         a file name for logs and the cache, e.g. {@code copy.cu}
 * @param code         the source text
 * @param overlappable every kernel of it opens with {@code KVANT_GRID_ENTER()} (see {@link #GRID_ENTER}), so its
 *                     launches may overlap the kernel before them on the stream
 */
public record KernelSource(String name, String code, boolean overlappable) {
    /**
     * Prepended to kvant's own sources ({@link #kvant}). {@code KVANT_GRID_ENTER()}, the first statement of every
     * kvant kernel, waits until the kernel before it on the stream has finished and its writes are visible
     * (griddepcontrol.wait), then lets the kernel after it launch (griddepcontrol.launch_dependents), whose
     * blocks are placed as this grid's last ones start and wait there in turn. Launched with programmatic
     * serialization ({@link CudaDriver#launchKernelOverlapped}), a chain of kernels so hides each one's launch
     * and ramp-up behind its predecessor's tail; launched plainly, or before sm_90, both instructions are
     * no-ops. {@code KVANT_GRID_WAIT()} only waits: for a kernel whose successor should not share its SMs while
     * it runs (decode attention). Before its wait a kernel may only read what cannot change under it: constants,
     * weights, what the host copied before the step, and what kernels at least two launches back wrote (the kernel
     * before it started only after they had finished and its own wait had returned) — and write its own shared
     * memory. The one-vector 8-bit products ask L2 for the start of their weight rows before it (model.cu's
     * prefetch_warp_rows), so their first loads do not wait a DRAM round trip after the kernel before them ends.
     * Dense decode works out its pages and builds its pair tables before its wait and loads its query after it (the
     * query comes from the launch right before it, a decode step's kvant_rope_write); it is launched overlapped.
     */
    public static final String GRID_ENTER = """
            #if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            #define KVANT_GRID_ENTER() asm volatile("griddepcontrol.wait; griddepcontrol.launch_dependents;" ::: "memory")
            #define KVANT_GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
            #else
            #define KVANT_GRID_ENTER() do { } while (0)
            #define KVANT_GRID_WAIT() do { } while (0)
            #endif
            """;

    /**
     * Prepended to kvant's own sources after {@link #GRID_ENTER}: the asynchronous global-to-shared copies (sm_80
     * and later; functions a source does not call generate no code). {@code cp_async16} caches in L2 only,
     * {@code cp_async16_ca} and {@code cp_async8} in L1 too; {@code cp_async_wait<N>} waits until at most N of the
     * thread's committed groups are pending.
     */
    public static final String CP_ASYNC = """
            __device__ __forceinline__ unsigned int smem_u32(const void* p) {
                unsigned int a;
                asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
                return a;
            }
            __device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
            }
            __device__ __forceinline__ void cp_async16_ca(void* smem, const void* gmem) {
                asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
            }
            __device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
                asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
            }
            __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
            template <int N>
            __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
            """;

    /** A source whose launches never overlap (a test's kernel, a foreign one). */
    public KernelSource(String name, String code) {
        this(name, code, false);
    }

    public KernelSource {
        if (name.isBlank()) {
            throw new IllegalArgumentException("a kernel source needs a name");
        }
    }

    /**
     * One of kvant's compilation units: {@link #GRID_ENTER}, {@link #CP_ASYNC} and then {@code code}, whose kernels all open with
     * {@code KVANT_GRID_ENTER()} (a test checks every kernel file), so their launches may overlap.
     */
    public static KernelSource kvant(String name, String code) {
        return new KernelSource(name, GRID_ENTER + CP_ASYNC + "#line 1 \"" + name + "\"\n" + code, true);
    }

    /** Where kvant's kernels live on the class path. */
    public static final String RESOURCE_FOLDER = "/dev/kvant/cuda/";

    /** One of kvant's kernels, {@code src/main/resources/dev/kvant/cuda/<fileName>}. */
    public static KernelSource resource(String fileName) {
        return kvant(fileName, text(fileName));
    }

    /**
     * One compilation unit of several of kvant's files (headers first), named for the last: each file's text after
     * a {@code // ---- file} line and a {@code #line} directive, so the compiler's messages name the file.
     */
    public static KernelSource resources(String... fileNames) {
        return kvant(fileNames[fileNames.length - 1], joined(List.of(fileNames)));
    }

    /** The texts of kvant's files in order, each after a {@code // ---- file} line and a {@code #line} directive. */
    public static String joined(List<String> fileNames) {
        StringBuilder code = new StringBuilder();
        for (String file : fileNames) {
            code.append("// ---- ").append(file).append("\n#line 1 \"").append(file).append("\"\n")
                    .append(text(file)).append('\n');
        }
        return code.toString();
    }

    /** The text of {@code src/main/resources/dev/kvant/cuda/<fileName>}. */
    public static String text(String fileName) {
        String path = RESOURCE_FOLDER + fileName;
        try (InputStream in = KernelSource.class.getResourceAsStream(path)) {
            if (in == null) {
                throw new IllegalArgumentException("kernel source " + path + " is not on the class path");
            }
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new UncheckedIOException("kernel source " + path + " could not be read", e);
        }
    }
}
