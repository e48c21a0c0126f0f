package dev.kvant.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvant.select.Selection;
import dev.kvant.select.SelectionLog;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class SparseCommandsTest {

    @Test
    void benchSizesWhoseCacheOverflowsAndNeedleWithNoAnswerAreRefused() {
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "-np", "256", "-d", "9000000", "-p", "0", "-n",
                "1");
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains("-d 9000000") && r.err().contains("too many"), r.err());
        MainTest.Run n = MainTest.run("needle", "-m", "/nonexistent.gguf", "--haystack", "x", "--max-new", "0");
        assertEquals(2, n.code(), n.err());
        assertTrue(n.err().contains("--max-new"), n.err());
        MainTest.Run p = MainTest.run("needle", "-m", "/nonexistent.gguf", "--probes", "/nonexistent.jsonl");
        assertTrue(p.err().contains("--probes: cannot read"), p.err());
    }

    @Test
    void aMalformedKvMemIsRefusedOnTheCpuToo() {
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "--backend", "cpu", "-p", "8", "-n", "0", "-r",
                "1", "--kv-mem", "garbage");
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains("--kv-mem"), r.err());
    }

    /** An option of the top-k selection given without --select topk is refused, not ignored. */
    @Test
    void selectionOptionsWithoutTopkAreRefused() {
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1",
                "--select-budget", "64");
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains("add --select topk"), r.err());
    }

    /**
     * A budget the always-attended windows fill, counted in whole pages as the selector counts them, is refused:
     * the selection would choose nothing and the windows would exceed it. bench-attention, whose windows are not
     * options, says what they are (its --select-budget 100 attended about 336 tokens under the label topk100).
     */
    @Test
    void aBudgetBelowItsWindowsIsRefused() {
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1",
                "--select", "topk", "--select-budget", "128");
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains("--select-budget 128 is 8 pages of --select-page 16") && r.err().contains(
                "= 22 pages, a budget of at least 352 tokens"), r.err());
        MainTest.Run b = MainTest.run("bench-attention", "--select-budget", "100", "--formats", "f16", "--ctx", "64");
        assertEquals(2, b.code(), b.err());
        assertTrue(b.err().contains("--select-budget 100 is below 352 tokens"), b.err());
    }

    /**
     * Dense layers that are all the model's are refused: selection was silently off (tinycode's 8 layers with
     * --select-dense-layers 9 gave the dense perplexity, an empty dump, and a report that said topk).
     */
    @Test
    void denseLayersCoveringTheModelAreRefused() {
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend",
                "cpu", "--select", "topk", "--select-dense-layers", "8");
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains("--select-dense-layers 8 makes all 8 layers of the model dense")
                && r.err().contains("at most 7"), r.err());
    }

    /**
     * A run that fails leaves the file --dump-selection names as it was (the dump goes into place when the run is
     * over), and a dump onto the run's own input is refused.
     */
    @Test
    void aFailedRunLeavesTheDumpFileAsItWas(@TempDir Path dir) throws Exception {
        Path f = dir.resolve("sel.txt");
        java.nio.file.Files.writeString(f, "keep");
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--kv",
                "f16,nonsense", "--select", "topk", "--select-budget", "80", "--select-sink", "16", "--select-recent", "32",
                "--dump-selection", f.toString());
        assertEquals(2, r.code(), r.err());
        assertEquals("keep", java.nio.file.Files.readString(f), r.err());
        try (var files = java.nio.file.Files.list(dir)) {
            assertEquals(1, files.count(), "no partial file left");
        }
        MainTest.Run ok = MainTest.run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1",
                "--backend", "cpu", "--select", "topk", "--select-budget", "80", "--select-sink", "16", "--select-recent",
                "32", "--dump-selection", f.toString());
        assertEquals(0, ok.code(), ok.err());
        assertTrue(!java.nio.file.Files.readString(f).equals("keep"), "the dump went into place");
    }

    /** A --dump-selection naming a directory is refused before the run (its move failed after the whole run). */
    @Test
    void aDumpOntoADirectoryIsRefusedBeforeTheRun(@TempDir Path dir) throws Exception {
        Path d = Files.createDirectory(dir.resolve("out"));
        MainTest.Run r = MainTest.run("bench", "--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--backend",
                "cpu", "--select", "topk", "--select-budget", "80", "--select-sink", "16", "--select-recent", "32",
                "--dump-selection", d.toString());
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains(d + " is a directory"), r.err());
        assertTrue(!r.out().contains("| pp8 |"), "no run: " + r.out());
        try (var files = Files.list(dir)) {
            assertEquals(1, files.count(), "no partial file left");
        }
    }

    @Test
    void needleNeedsProbesOrAHaystack() {
        MainTest.Run r = MainTest.run("needle", "-m", "/nonexistent.gguf");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("--probes FILE.jsonl and --haystack TEXT"), r.err());
    }

    @Test
    void anUnknownSelectionIsAClearError(@TempDir Path dir) throws Exception {
        Path probes = Files.writeString(dir.resolve("p.jsonl"), "");
        MainTest.Run r = MainTest.run("needle", "-m", "/nonexistent.gguf", "--probes", probes.toString(), "--select",
                "random");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("unknown selection 'random' (dense, topk)"), r.err());
    }

    @Test
    void replayPrintsTheSameChecksumOnEveryRun(@TempDir Path dir) {
        Path f = dir.resolve("sel.txt");
        try (SelectionLog.Writer w = SelectionLog.writer(f, new SelectionLog.Header(1, 4, 2, 64, 64, 16))) {
            w.record(0, Selection.of(16, 700, 1, new int[][][] {{{0, 3, 20, 43}, {1, 2, 43}}}));
            w.record(0, Selection.of(16, 701, 1, new int[][][] {{{0, 43}, {5, 6, 7, 43}}}));
            w.commit();
        }
        String[] args = {"bench-attention", "--replay-selection", f.toString(), "--formats", "turbo3", "-t", "1",
                "--json"};
        MainTest.Run a = MainTest.run(args);
        MainTest.Run b = MainTest.run(args);
        assertEquals(0, a.code(), a.err());
        Pattern row = Pattern.compile("\\{\"kv\":\"turbo3\",\"threads\":1,\"calls\":2,\"ctx\":702,\"ms\":[0-9.]+,"
                + "\"dense_ms\":[0-9.]+,\"mean_selected_tokens\":[0-9.]+,\"checksum\":\"([0-9a-f]{16})\"}");
        Matcher ma = row.matcher(a.out());
        Matcher mb = row.matcher(b.out());
        assertTrue(ma.find() && mb.find(), a.out());
        assertEquals(ma.group(1), mb.group(1));
    }

    /**
     * A replay takes --sparse-v (and -r): --sparse-v 0 and 0.05 printed the same checksum, the replay ran with the
     * default attention options whatever was given.
     */
    @Test
    void replayAttendsWithTheSparseVThresholdGiven(@TempDir Path dir) {
        Path f = twoRecords(dir);
        String exact = replayChecksum(f, "--sparse-v", "0", "-r", "1");
        String sparse = replayChecksum(f, "--sparse-v", "0.05", "-r", "1");
        assertEquals(exact, replayChecksum(f));
        assertTrue(!exact.equals(sparse), "--sparse-v 0.05 left the checksum " + exact);
    }

    /**
     * An option the replay would ignore is refused: the random problems' shape with --replay-selection (--ctx was
     * ignored and --heads still checked), and the replay's record choice without it.
     */
    @Test
    void optionsAReplayWouldIgnoreAreRefused(@TempDir Path dir) {
        Path f = twoRecords(dir);
        MainTest.Run ctx = MainTest.run("bench-attention", "--replay-selection", f.toString(), "--ctx", "4096");
        assertEquals(2, ctx.code(), ctx.err());
        assertTrue(ctx.err().contains("--ctx shapes the random problems; --replay-selection takes the geometry"),
                ctx.err());
        MainTest.Run shape = MainTest.run("bench-attention", "--replay-selection", f.toString(), "--heads", "3",
                "--select-budget", "2048");
        assertEquals(2, shape.code(), shape.err());
        assertTrue(shape.err().contains("--heads, --select-budget shape the random problems"), shape.err());
        MainTest.Run limit = MainTest.run("bench-attention", "--formats", "f16", "--ctx", "64", "--replay-limit", "1");
        assertEquals(2, limit.code(), limit.err());
        assertTrue(limit.err().contains("give --replay-selection FILE too"), limit.err());
        MainTest.Run decode = MainTest.run("bench-attention", "--formats", "f16", "--ctx", "64", "--replay-decode");
        assertEquals(2, decode.code(), decode.err());
    }

    private static Path twoRecords(Path dir) {
        Path f = dir.resolve("sel.txt");
        try (SelectionLog.Writer w = SelectionLog.writer(f, new SelectionLog.Header(1, 4, 2, 64, 64, 16))) {
            w.record(0, Selection.of(16, 700, 1, new int[][][] {{{0, 3, 20, 43}, {1, 2, 43}}}));
            w.record(0, Selection.of(16, 701, 1, new int[][][] {{{0, 43}, {5, 6, 7, 43}}}));
            w.commit();
        }
        return f;
    }

    private static String replayChecksum(Path f, String... more) {
        String[] args = java.util.stream.Stream.concat(java.util.stream.Stream.of("bench-attention",
                "--replay-selection", f.toString(), "--formats", "f16", "-t", "1", "--json"),
                java.util.Arrays.stream(more)).toArray(String[]::new);
        MainTest.Run r = MainTest.run(args);
        assertEquals(0, r.code(), r.err());
        Matcher m = Pattern.compile("\"checksum\":\"([0-9a-f]{16})\"").matcher(r.out());
        assertTrue(m.find(), r.out());
        return m.group(1);
    }

    /** The tinycode fixture beside the repository, searched upward from the working directory. */
    static Path tinycode(String name) {
        for (Path d = Path.of("").toAbsolutePath(); d != null; d = d.getParent()) {
            Path p = d.resolve("shared/fixtures/tinycode").resolve(name);
            if (Files.isRegularFile(p)) {
                return p;
            }
        }
        assumeTrue(false, "tinycode fixture " + name + " not found above " + Path.of("").toAbsolutePath());
        return null;
    }

    /** The first {@code bytes} bytes of tinycode's eval text as {@code dir}/text.txt (skips without the fixture). */
    static Path evalText(Path dir, int bytes) throws java.io.IOException {
        Path text = dir.resolve("text.txt");
        Files.write(text, java.util.Arrays.copyOf(Files.readAllBytes(tinycode("eval-heldout.txt")), bytes));
        return text;
    }

    @Test
    @Tag("slow")
    void needleOnTinycodeReportsCellsAsJson(@TempDir Path dir) throws Exception {
        Path model = tinycode("tinycode-f16.gguf");
        Path all = tinycode("needle-probes.jsonl");
        Path two = dir.resolve("two.jsonl");
        Files.write(two, Files.readAllLines(all).subList(0, 2));
        MainTest.Run r = MainTest.run("needle", "-m", model.toString(), "--probes", two.toString(), "-t", "2",
                "--select", "topk", "--select-budget", "256", "--select-recent", "128", "--json");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("\"cells\":[{\"n_ctx\":1024,\"depth\":0.1,\"n\":2,\"correct\":"), r.out());
    }
}
