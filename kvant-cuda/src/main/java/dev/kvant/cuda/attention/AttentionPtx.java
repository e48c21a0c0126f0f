package dev.kvant.cuda.attention;

import dev.kvant.cuda.KernelCache;
import dev.kvant.cuda.KernelSource;
import dev.kvant.cuda.Nvrtc;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * What NVRTC makes of the attention kernels of one format pair, read on a machine without a GPU: the module compiled
 * to PTX for a virtual architecture, and per kernel its instruction count and the counts of the instructions that
 * matter for the decode's speed (shared and global loads and stores, mma, ldmatrix, shuffles, barriers, branches).
 * Static counts of unrolled code, not executed instructions: a loop that is not unrolled shows once. Used to check,
 * before spending device time, that a change to a kernel did what it meant to the code (docs/BENCHMARKS.md: the
 * decode's dequantization loop, ~95 PTX instructions a group before it was unrolled, ~40 after).
 *
 * <pre>
 * java --enable-native-access=ALL-UNNAMED -cp kvant-cuda.jar:kvant-core.jar dev.kvant.cuda.attention.AttentionPtx \
 *     turbo3 turbo3 [--head-dim 128] [--kv-heads 8] [--heads 32] [--arch compute_90] [--ptx FILE] [--source FILE]
 * </pre>
 *
 * <p>{@code --source FILE} only writes the module's CUDA source to FILE and prints the compiler's -D options (no
 * NVRTC needed): {@code scripts/cuda-regs} compiles it with nvcc where there is one, for the registers, spills and
 * shared memory ptxas gives each kernel.
 */
public final class AttentionPtx {
    /** The instruction classes counted, by the PTX opcode prefix that marks them. */
    static final Map<String, String> CLASSES = new LinkedHashMap<>();

    static {
        CLASSES.put("ld.shared", "ld.shared");
        CLASSES.put("st.shared", "st.shared");
        CLASSES.put("ld.global", "ld.global");
        CLASSES.put("st.global", "st.global");
        CLASSES.put("cp.async", "cp.async");
        CLASSES.put("ldmatrix", "ldmatrix");
        CLASSES.put("mma", "mma");
        CLASSES.put("shfl", "shfl");
        CLASSES.put("bar", "bar");
        CLASSES.put("bra", "bra");
    }

    private static final Pattern ENTRY = Pattern.compile("^(?:\\.\\w+\\s+)*\\.entry\\s+(\\w+)\\(", Pattern.MULTILINE);
    private static final Pattern INSTRUCTION = Pattern.compile("^\\s*(?:@!?%\\w+\\s+)?([a-z][\\w.]*)");

    private AttentionPtx() {
    }

    /** One kernel's counts: all instructions, then per class of {@link #CLASSES}. */
    public record Kernel(String name, int instructions, Map<String, Integer> classes) {
    }

    /** The PTX of the attention module of a shape, for a virtual architecture such as compute_90. */
    public static String ptx(AttentionShape shape, String arch) {
        KernelSource source = AttentionSource.source(shape);
        List<String> options = new ArrayList<>();
        for (String o : KernelCache.options("sm_" + arch.replaceAll("\\D", ""), AttentionSource.defines(shape))) {
            options.add(o.startsWith("--gpu-architecture=") ? "--gpu-architecture=" + arch : o);
        }
        return Nvrtc.load().ptx(source, options);
    }

    /** Per kernel of a PTX module, its counts, in the module's order. */
    public static List<Kernel> count(String ptx) {
        List<Kernel> kernels = new ArrayList<>();
        Matcher entry = ENTRY.matcher(ptx);
        List<int[]> spans = new ArrayList<>();
        List<String> names = new ArrayList<>();
        while (entry.find()) {
            names.add(entry.group(1));
            spans.add(new int[] {entry.start(), 0});
        }
        for (int i = 0; i < spans.size(); i++) {
            int start = spans.get(i)[0];
            int end = i + 1 < spans.size() ? spans.get(i + 1)[0] : ptx.length();
            int body = ptx.indexOf('{', start);
            int instructions = 0;
            Map<String, Integer> classes = new TreeMap<>();
            for (String line : ptx.substring(body < 0 || body > end ? start : body + 1, end).split("\n")) {
                String t = line.strip();
                if (t.isEmpty() || t.startsWith("//") || t.startsWith(".") || t.startsWith("$") || t.startsWith("{")
                        || t.startsWith("}") || t.startsWith(")")) {
                    continue;
                }
                Matcher m = INSTRUCTION.matcher(t);
                if (!m.find()) {
                    continue;
                }
                String op = m.group(1);
                instructions++;
                for (Map.Entry<String, String> c : CLASSES.entrySet()) {
                    if (op.startsWith(c.getValue())) {
                        classes.merge(c.getKey(), 1, Integer::sum);
                    }
                }
            }
            kernels.add(new Kernel(names.get(i), instructions, classes));
        }
        return kernels;
    }

    public static void main(String[] args) throws IOException {
        if (args.length < 2) {
            System.err.println("usage: AttentionPtx K V [--head-dim N] [--kv-heads N] [--heads N] [--arch compute_90]"
                    + " [--ptx FILE] [--source FILE]");
            System.exit(2);
        }
        int headDim = 128;
        int kvHeads = 8;
        int heads = 32;
        String arch = "compute_90";
        Path out = null;
        Path source = null;
        for (int i = 2; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--head-dim" -> headDim = Integer.parseInt(args[i + 1]);
                case "--kv-heads" -> kvHeads = Integer.parseInt(args[i + 1]);
                case "--heads" -> heads = Integer.parseInt(args[i + 1]);
                case "--arch" -> arch = args[i + 1];
                case "--ptx" -> out = Path.of(args[i + 1]);
                case "--source" -> source = Path.of(args[i + 1]);
                default -> throw new IllegalArgumentException("unknown option " + args[i]);
            }
        }
        AttentionShape shape = new AttentionShape(new KvGeometry(1, kvHeads, headDim, headDim), heads,
                KvFormat.parse(args[0]), KvFormat.parse(args[1]), 64);
        if (source != null) {
            Files.writeString(source, AttentionSource.source(shape).code());
            // the -D options exactly as the kernel cache gives them to NVRTC
            System.out.println(String.join(" ", KernelCache.options("sm_" + arch.replaceAll("\\D", ""),
                    AttentionSource.defines(shape)).stream().filter(o -> o.startsWith("-D")).toList()));
            return;
        }
        String ptx = ptx(shape, arch);
        if (out != null) {
            Files.writeString(out, ptx);
        }
        System.out.printf(Locale.ROOT, "attention module %s/%s, head %d, %d/%d heads, %s (%s)%n%n", args[0], args[1],
                headDim, heads, kvHeads, arch, Nvrtc.load().version());
        StringBuilder header = new StringBuilder("| kernel | instructions |");
        StringBuilder rule = new StringBuilder("| --- | ---: |");
        for (String c : CLASSES.keySet()) {
            header.append(' ').append(c).append(" |");
            rule.append(" ---: |");
        }
        System.out.println(header);
        System.out.println(rule);
        for (Kernel k : count(ptx)) {
            StringBuilder row = new StringBuilder("| " + k.name() + " | " + k.instructions() + " |");
            for (String c : CLASSES.keySet()) {
                row.append(' ').append(k.classes().getOrDefault(c, 0)).append(" |");
            }
            System.out.println(row);
        }
    }
}
