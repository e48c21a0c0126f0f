package dev.kvant.cli;

import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

class MainTest {

    record Run(int code, String out, String err) {
    }

    static synchronized Run run(String... args) {
        PrintStream oldOut = System.out;
        PrintStream oldErr = System.err;
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        try {
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            int code = Main.execute(args);
            return new Run(code, out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
        } finally {
            System.setOut(oldOut);
            System.setErr(oldErr);
        }
    }

    /** -V and --version, which every command takes, print the version there too (they printed nothing, exit 0). */
    @Test
    void everyCommandPrintsTheVersion() {
        String version = run("--version").out();
        assertTrue(version.startsWith("kvant "), version);
        for (String command : new String[] {"run", "chat", "serve", "perplexity", "bench", "info", "needle"}) {
            Run r = run(command, "-V");
            assertEquals(0, r.code(), r.err());
            assertEquals(version, r.out(), command + " -V");
        }
    }

    @Test
    void benchOnSyntheticModelPrintsOneJsonRowPerTest() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "16", "-n", "4", "-d", "0,8", "-r", "2", "-t", "2",
                "--json");
        assertEquals(0, r.code(), r.err());
        Matcher m = Pattern.compile("\\{\"model\":\"[^\"]+\",\"backend\":\"cpu\",\"threads\":2,\"kv\":\"f16/f16\","
                + "\"test\":\"(pp16|tg4)\",\"depth\":(0|8),\"reps\":2,\"tps_mean\":([0-9.]+),\"tps_sd\":([0-9.]+)}")
                .matcher(r.out());
        int rows = 0;
        while (m.find()) {
            rows++;
            assertTrue(Double.parseDouble(m.group(3)) > 0, r.out());
        }
        assertEquals(4, rows, r.out());
        assertTrue(r.out().strip().startsWith("[") && r.out().strip().endsWith("]"), r.out());
    }

    /** info prints the header, every metadata key with its value (long ones cut), and with --tensors each tensor. */
    @Test
    void infoListsTheMetadataAndTheTensors(@org.junit.jupiter.api.io.TempDir java.nio.file.Path dir) {
        java.nio.file.Path file = dir.resolve("small.gguf");
        try (java.lang.foreign.Arena arena = java.lang.foreign.Arena.ofConfined()) {
            java.lang.foreign.MemorySegment data = arena.allocate(4L * 6, 32);
            new dev.kvant.gguf.GgufWriter()
                    .putString("general.architecture", "llama")
                    .putU32("llama.block_count", 2)
                    .putString("tokenizer.chat_template", "x".repeat(500))
                    .putStringArray("tokenizer.ggml.tokens", java.util.List.of("a", "b", "c"))
                    .addTensor("blk.0.attn_norm.weight", dev.kvant.gguf.GgmlType.F32, new long[] {3, 2}, data)
                    .write(file);
        }
        Run r = run("info", "-m", file.toString(), "--tensors");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("  general.architecture = \"llama\""), r.out());
        assertTrue(r.out().contains("  llama.block_count = 2"), r.out());
        assertTrue(r.out().contains("... (502 characters)"), r.out());
        assertTrue(r.out().contains("tokenizer.ggml.tokens = array<string>[3] [\"a\", \"b\", \"c\"]"), r.out());
        assertTrue(r.out().matches("(?s).*  blk\\.0\\.attn_norm\\.weight +F32 +3 x 2 +24 bytes.*"), r.out());
    }

    /**
     * Options that leave nothing to do or name nothing that exists are one-line errors, not stack traces: exit 2 for
     * a command line that cannot work, 1 for what goes wrong while running.
     */
    @Test
    void emptyOrImpossibleRequestsAreOneLineErrors() {
        Object[][] cases = {
                {new String[] {"bench", "--synthetic", "tiny", "-p", "0", "-n", "0", "-r", "1"},
                        "nothing to run: every -p and -n is 0", 2},
                {new String[] {"bench-attention", "--kv-heads", "0", "--ctx", "64", "-r", "1"},
                        "--heads and --kv-heads must be at least 1", 2},
                {new String[] {"bench-attention", "--ctx", "0", "-r", "1"}, "--ctx must be at least 1, got 0", 2},
                {new String[] {"bench-attention", "--ctx", "64", "-r", "1", "--select-coarse", "64"},
                        "--select-coarse shapes a selection: give --select-budget too", 2},
                {new String[] {"perplexity", "-m", "none.gguf", "-f", "none.txt", "--chunks", "-1"},
                        "--chunks must not be negative", 2},
                {new String[] {"perplexity", "-m", "none.gguf", "-f", "no-such-text.txt"},
                        "cannot read no-such-text.txt: no such file", 1},
                // --kv-mem is a limit for the commands that fix their context, not a hint they ignore
                {new String[] {"bench", "--synthetic", "tiny", "-p", "64", "-n", "0", "-d", "4096", "--kv-mem", "1M",
                        "-r", "1"}, "-d 4096 plus -p/-n 64 needs 4160 tokens of KV cache; --kv-mem 1M holds 128", 2},
                // -np caches of whole pages: 3 x 33 tokens are 3 pages, more than the 2 that 1M holds
                {new String[] {"bench", "--synthetic", "tiny", "-p", "33", "-n", "0", "-np", "3", "--kv-mem", "1M",
                        "-r", "1"}, "needs 192 tokens of KV cache; --kv-mem 1M holds 128", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "--kv", "f16,turbo3", "--kv-mem",
                        "1M", "-r", "1"}, "give one format at a time by --ctk/--ctv with --kv-mem", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "--kv-mem", "1K", "-r", "1"},
                        "holds less than one page", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "--kv-mem", "9999999T", "-r",
                        "1"}, "is more bytes than a size can hold", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "--kv-mem", "lots", "-r", "1"},
                        "cannot read 'lots' as a size", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "-np", "0"}, "--parallel must be between 1", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "--mode", "x"}, "--mode must be batching", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "-np", "4", "-c", "4096", "--kv-mem", "1M"},
                        "--parallel 4 x -c 4096 needs 16384 tokens of KV cache", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "--mode", "prefix", "-c", "128", "--kv-mem",
                        "1M"}, "--mode prefix's 2 x -c 128 needs 256 tokens of KV cache", 2},
                {new String[] {"perplexity", "-m", "none.gguf", "-f", "none.txt", "-c", "0"}, "-c must be at least 4", 2},
                // bench-serve's and serve's own options, before the model is built
                {new String[] {"bench-serve", "--synthetic", "tiny", "--clients", "0"},
                        "--clients and --requests must be at least 1", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "-p", "0"}, "-p and -n must be at least 1", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "--cancel", "5"},
                        "--cancel must be a fraction from 0 to 1", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "--repeat-penalty", "0"},
                        "--repeat-penalty must be above 0 and at most 10", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "-c", "64", "-p", "60", "-n", "8"},
                        "-p 60 + -n 8 tokens a request do not fit in -c 64", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "--mode", "load", "-c", "64", "-n", "100"},
                        "--mode load's prompts run from 8 tokens", 2},
                {new String[] {"bench-serve", "--synthetic", "tiny", "-np", "2", "-c", "2147483647"},
                        "more tokens of KV cache than one pool holds", 2},
                {new String[] {"serve", "--synthetic", "tiny", "--shutdown-grace", "-5"},
                        "--shutdown-grace must not be negative", 2},
                {new String[] {"serve", "--synthetic", "tiny", "--max-queue", "-1"},
                        "--max-queue must not be negative", 2},
                {new String[] {"run", "-m", "none.gguf", "-p", "x", "--temp", "0", "--top-p", "5"},
                        "--top-p must be in [0, 1]", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--kv",
                        "turbo3+mean"}, "--kv turbo3+mean: each --kv format serves K and V", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend", "foo"},
                        "--backend: unknown backend 'foo'", 2},
                {new String[] {"bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--prefill-chunk",
                        "0"}, "--prefill-chunk must be positive", 2},
                {new String[] {"needle", "-m", "none.gguf", "--haystack", "none.txt", "--per-cell", "-3"},
                        "--per-cell must not be negative", 2},
                // picocli's own: the same one line, and where the options are listed
                {new String[] {"bench", "-np", "x"}, "'x' is not an int (kvant bench --help lists the options)", 2},
                // a synthetic model's weight format does not silently go with a model file
                {new String[] {"bench", "-m", "none.gguf", "--weights", "q4_0", "-p", "8", "-n", "0", "-r", "1"},
                        "--weights sets a synthetic model's weights", 2},
                {new String[] {"bench-serve", "-m", "none.gguf", "--synthetic", "tiny"},
                        "give either -m or --synthetic, not both", 2},
        };
        for (Object[] c : cases) {
            Run r = run((String[]) c[0]);
            // 2: a usage error (options out of range or that do not go together); 1: one met while running
            assertEquals((int) c[2], r.code(), String.join(" ", (String[]) c[0]) + ": " + r.err());
            assertTrue(r.err().strip().startsWith("kvant: ") && r.err().contains((String) c[1])
                    && r.err().strip().lines().count() == 1, r.err());
        }
    }

    @Test
    void benchMedianReportsTheRepetitionsQuartiles() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "2", "-r", "5", "--median", "--json");
        assertEquals(0, r.code(), r.err());
        Matcher m = Pattern.compile("\"tps_mean\":[0-9.]+,\"tps_sd\":[0-9.]+,\"tps_median\":([0-9.]+),"
                + "\"tps_q1\":([0-9.]+),\"tps_q3\":([0-9.]+)}").matcher(r.out());
        int rows = 0;
        while (m.find()) {
            rows++;
            double q1 = Double.parseDouble(m.group(2)), med = Double.parseDouble(m.group(1));
            assertTrue(q1 > 0 && q1 <= med && med <= Double.parseDouble(m.group(3)), r.out());
        }
        assertEquals(2, rows, r.out());
        Run table = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "3", "--median");
        assertEquals(0, table.code(), table.err());
        assertTrue(table.out().contains("| t/s median (q1 - q3) |"), table.out());
    }

    @Test
    void benchPrintsMarkdownTableByDefault() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "2", "-r", "1", "--ctk", "q8_0", "--ctv",
                "turbo3");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("| model | backend | threads | kv | test | t/s |"), r.out());
        assertTrue(r.out().contains("q8_0/turbo3") && r.out().contains("| pp8 |") && r.out().contains("| tg2 |"),
                r.out());
    }

    @Test
    void benchFillsTheDepthWithRandomRowsWhenAsked() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "0", "-n", "2", "-d", "200", "-r", "1",
                "--depth-fill", "random");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("| tg2 @ d200 |"), r.out());
        assertTrue(r.err().contains("random K/V rows"), r.err());
        Run bad = run("bench", "--synthetic", "tiny", "-p", "0", "-n", "2", "-d", "8", "-r", "1", "--depth-fill", "x");
        assertEquals(2, bad.code());   // a usage error
        assertTrue(bad.err().contains("--depth-fill"), bad.err());
    }

    @Test
    void coarseSelectionOptionsNeedATopKSelection() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--select-coarse", "256");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("--select topk"), r.err());
        Run bad = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--select", "topk",
                "--select-coarse", "100");
        assertEquals(2, bad.code());
        assertTrue(bad.err().contains("--select-coarse"), bad.err());
    }

    /**
     * Options out of range are usage errors (exit 2), found before any model is read: the model path here does not
     * exist, so a check after loading would say that instead.
     */
    @Test
    void optionsOutOfRangeAreUsageErrorsBeforeTheModelIsRead() {
        String[][] cases = {
                {"run", "--top-k", "-3"}, {"run", "--top-p", "2"}, {"run", "--min-p", "-1"},
                {"run", "--repeat-last-n", "-5"}, {"run", "--sparse-v", "2"}, {"run", "--ctv", "turbo3+mean"},
                {"run", "--ctv-layer", "-1=turbo3+mean"}, {"chat", "--chat-template", "bogus"},
                {"serve", "--port", "70000"}, {"perplexity", "--sparse-v", "-1", "-f", "x.txt"}};
        for (String[] c : cases) {
            String[] args = new String[c.length + 4];
            System.arraycopy(c, 0, args, 0, c.length);
            System.arraycopy(new String[] {"-m", "/nonexistent/model.gguf", "-p", "hi"}, 0, args, c.length, 4);
            if (!c[0].equals("run")) {   // only run takes -p
                args = java.util.Arrays.copyOf(args, args.length - 2);
            }
            Run r = run(args);
            assertEquals(2, r.code(), String.join(" ", c) + ": " + r.err());
            assertFalse(r.err().contains("not found"), String.join(" ", c) + ": " + r.err());
        }
        Run weights = run("bench", "--synthetic", "tiny", "--weights", "q2_k", "-p", "8", "-n", "0", "-r", "1");
        assertEquals(2, weights.code(), weights.err());
        Run directory = run("run", "-m", System.getProperty("java.io.tmpdir"), "-p", "hi");
        assertEquals(1, directory.code());
        assertTrue(directory.err().contains("is a directory"), directory.err());
    }

    @Test
    void missingModelFileIsAClearError() {
        Run r = run("run", "-m", "/nonexistent/model.gguf", "-p", "hi");
        assertEquals(1, r.code());
        assertTrue(r.err().contains("model file not found: /nonexistent/model.gguf"), r.err());
    }

    @Test
    void backendChoicesThatCannotWorkAreClearErrors() {
        Run gpusOnCpu = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend", "cpu",
                "--gpus", "0,1");
        assertEquals(2, gpusOnCpu.code());
        assertTrue(gpusOnCpu.err().contains("--gpus"), gpusOnCpu.err());
        Run negative = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend", "cuda",
                "--gpus", "0,-1");
        assertEquals(2, negative.code());
        assertTrue(negative.err().contains("GPU ordinals"), negative.err());
        Run unknown = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend", "tpu");
        assertEquals(2, unknown.code());
        assertTrue(unknown.err().contains("tpu") && unknown.err().contains("cuda"), unknown.err());
        Run split = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--layer-split", "4,4");
        assertEquals(2, split.code());
        assertTrue(split.err().contains("--layer-split") || split.err().contains("cuda"), split.err());
    }

    @Test
    void layersTakeFormatsOfTheirOwn() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "2", "-r", "1", "--backend", "cpu", "--ctk",
                "turbo3", "--ctv", "turbo3", "--ctk-layer", "-1=q8_0", "--ctv-layer", "-1=q8_0");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("turbo3/turbo3, layer -1: q8_0/q8_0") && r.out().contains("| tg2 |"), r.out());
        // through a block selection too: each layer's summaries and queries in its own K domain
        Run selected = run("bench", "--synthetic", "tiny", "-p", "300", "-n", "2", "-r", "1", "--backend", "cpu",
                "--ctk", "turbo3", "--ctk-layer", "0=q8_0", "--select", "topk", "--select-budget", "128",
                "--select-sink", "16", "--select-recent", "32", "--select-dense-layers", "0");
        assertEquals(0, selected.code(), selected.err());
        assertTrue(selected.out().contains("turbo3/f16, layer 0: q8_0/f16"), selected.out());
        Run outside = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend", "cpu",
                "--ctk-layer", "99=q8_0");
        assertEquals(2, outside.code(), outside.err());   // a usage error like a malformed one, known once loaded
        assertTrue(outside.err().contains("layer 99") && outside.err().contains("layers"), outside.err());
        Run malformed = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend", "cpu",
                "--ctk-layer", "last:q8_0");
        assertEquals(2, malformed.code());
        assertTrue(malformed.err().contains("LAYER=FORMAT"), malformed.err());
    }

    @Test
    void unknownKvFormatIsAClearError() {
        Run r = run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--ctk", "q3_x");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("q3_x"), r.err());
    }

    @Test
    void unknownSyntheticShapeListsTheKnownOnes() {
        Run r = run("bench", "--synthetic", "gpt5", "-r", "1");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("llama3-8b") && r.err().contains("tiny"), r.err());
    }
}
