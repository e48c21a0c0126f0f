package dev.kvant.cuda;

import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * kvant's kernels may be launched to overlap the kernel before them ({@link CudaDriver#launchKernelOverlapped}):
 * that is only safe when each one waits for its predecessor before it touches memory. Every kernel of every file
 * therefore opens with {@code KVANT_GRID_ENTER()} (or a prefetch of weights, then it); this test reads the files and
 * holds them to it.
 */
class KernelSourceTest {
    /** Every kernel file on the class path (a new one must be added here and to its loader). */
    private static final List<String> FILES = List.of("copy.cu", "fill_check.cu", "model/model.cu",
            "attention/kv_write.cu", "attention/attention.cu", "attention/select.cu");
    private static final Pattern GLOBAL = Pattern.compile("__global__");
    /** The mark of a kernel whose first statement calls a function that waits after its prologue. */
    private static final Pattern WAITS_IN = Pattern.compile("// KVANT_GRID_WAIT\\(\\) in (\\w+),");
    /**
     * A call that may come before KVANT_GRID_ENTER(): it reads nothing but the kernel's parameters and asks L2 for
     * weights, which never change under a step (model.cu's prefetch_warp_rows).
     */
    private static final Pattern PROLOGUE = Pattern.compile("prefetch_warp_rows<[^;]*;[\\s\\\\]+");

    @Test
    void everyKernelWaitsForItsPredecessorFirst() throws IOException {
        int kernels = 0;
        for (String file : FILES) {
            String code = read(file);
            Matcher m = GLOBAL.matcher(code);
            while (m.find()) {
                int body = bodyStart(code, m.end());
                String first = code.substring(body + 1).replaceFirst("^[\\s\\\\]+", "");
                Matcher prologue = PROLOGUE.matcher(first);
                if (prologue.lookingAt()) {
                    first = first.substring(prologue.end());
                }
                String where = file + " line " + (code.substring(0, m.start()).split("\n", -1).length);
                Matcher later = WAITS_IN.matcher(first);
                if (later.lookingAt()) {
                    // a kernel that waits later, in the named function, after a prologue that may come first
                    int def = code.indexOf("void " + later.group(1) + "(");
                    assertTrue(def >= 0, where + ": no function " + later.group(1));
                    int end = code.indexOf("__global__", def);
                    assertTrue(code.substring(def, end < 0 ? code.length() : end).contains("KVANT_GRID_WAIT();"),
                            where + ": " + later.group(1) + " never calls KVANT_GRID_WAIT()");
                    kernels++;
                    continue;
                }
                assertTrue(first.startsWith("KVANT_GRID_ENTER();") || first.startsWith("KVANT_GRID_WAIT();"),
                        where + ": the kernel's first statement is neither KVANT_GRID_ENTER() nor KVANT_GRID_WAIT(): "
                        + first.substring(0, Math.min(60, first.length())));
                kernels++;
            }
        }
        assertTrue(kernels >= 30, "found only " + kernels + " kernels");
    }

    @Test
    void kvantSourcesCarryTheGridEnterMacroAndOverlapOthersDoNot() {
        KernelSource copy = KernelSource.resource("copy.cu");
        assertTrue(copy.overlappable());
        assertTrue(copy.code().startsWith(KernelSource.GRID_ENTER), "the macro comes first");
        assertTrue(copy.code().contains("#line 1 \"copy.cu\""), "compiler messages keep the file's line numbers");
        KernelSource foreign = new KernelSource("k.cu", "extern \"C\" __global__ void k() {}");
        assertFalse(foreign.overlappable());
        assertEquals("extern \"C\" __global__ void k() {}", foreign.code());
    }

    @Test
    void overlapModeComesFromTheEnvironmentAndRejectsNonsense() {
        assertEquals(CudaContext.LaunchOverlap.MARKED, CudaContext.LaunchOverlap.fromEnvironment(null));
        assertEquals(CudaContext.LaunchOverlap.MARKED, CudaContext.LaunchOverlap.fromEnvironment("1"));
        assertEquals(CudaContext.LaunchOverlap.NONE, CudaContext.LaunchOverlap.fromEnvironment("0"));
        assertEquals(CudaContext.LaunchOverlap.ALL, CudaContext.LaunchOverlap.fromEnvironment("all"));
        IllegalArgumentException e = org.junit.jupiter.api.Assertions.assertThrows(IllegalArgumentException.class,
                () -> CudaContext.LaunchOverlap.fromEnvironment("yes"));
        assertEquals("KVANT_CUDA_OVERLAP='yes': use 0, 1 or all", e.getMessage());
    }

    /** The '{' that opens the function body: the first one outside parentheses after __global__. */
    private static int bodyStart(String code, int from) {
        int depth = 0;
        for (int i = from; i < code.length(); i++) {
            char c = code.charAt(i);
            if (c == '(') {
                depth++;
            } else if (c == ')') {
                depth--;
            } else if (c == '{' && depth == 0) {
                return i;
            }
        }
        fail("no body after __global__ at " + from);
        return -1;
    }

    private static String read(String file) throws IOException {
        try (InputStream in = KernelSourceTest.class.getResourceAsStream(KernelSource.RESOURCE_FOLDER + file)) {
            if (in == null) {
                fail(file + " is not on the class path");
            }
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
    }
}
