package dev.kvant.select;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class SelectionLogTest {

    /** A dump goes into place only when committed: a run that stops first leaves the target as it was. */
    @Test
    void anUncommittedDumpLeavesTheTargetAsItWas(@TempDir Path dir) throws Exception {
        Path f = dir.resolve("sel.txt");
        java.nio.file.Files.writeString(f, "keep");
        SelectionLog.Header h = new SelectionLog.Header(8, 4, 2, 128, 128, 16);
        try (SelectionLog.Writer w = SelectionLog.writer(f, h)) {
            w.record(5, Selection.of(16, 30, 20, new int[][][] {{{0, 1, 2}, {1, 2}}, {{0, 2, 3}, {2, 3}}}));
        }
        assertEquals("keep", java.nio.file.Files.readString(f));
        try (var files = java.nio.file.Files.list(dir)) {
            assertEquals(1, files.count(), "no partial file left");
        }
    }

    /**
     * A commit whose move fails (the target became a non-empty directory during the run) leaves the directory as it
     * was and no partial file: commit marked the writer done before moving, so close() kept the partial file.
     */
    @Test
    void aCommitThatCannotMoveLeavesNoPartialFile(@TempDir Path dir) throws Exception {
        Path f = dir.resolve("sel.txt");
        SelectionLog.Header h = new SelectionLog.Header(8, 4, 2, 128, 128, 16);
        try (SelectionLog.Writer w = SelectionLog.writer(f, h)) {
            w.record(5, Selection.of(16, 30, 20, new int[][][] {{{0, 1, 2}, {1, 2}}, {{0, 2, 3}, {2, 3}}}));
            Files.createDirectory(f);
            Files.writeString(f.resolve("inside.txt"), "keep");
            java.io.UncheckedIOException e = assertThrows(java.io.UncheckedIOException.class, w::commit);
            assertTrue(e.getMessage().contains("cannot write selection dump " + f), e.getMessage());
        }
        assertEquals("keep", Files.readString(f.resolve("inside.txt")));
        try (var files = Files.list(dir)) {
            assertEquals(List.of("sel.txt"), files.map(p -> p.getFileName().toString()).toList(), "no partial file");
        }
    }

    /** A target that is a directory is refused when the writer opens, before any run, and nothing is left beside it. */
    @Test
    void aDirectoryTargetIsRefusedWhenTheWriterOpens(@TempDir Path dir) throws Exception {
        Path d = Files.createDirectory(dir.resolve("out"));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> SelectionLog.writer(d, new SelectionLog.Header(8, 4, 2, 128, 128, 16)));
        assertTrue(e.getMessage().contains(d + " is a directory"), e.getMessage());
        try (var files = Files.list(dir)) {
            assertEquals(1, files.count(), "no partial file");
        }
    }

    @Test
    void aDumpReadsBackAsTheSelectionsWritten(@TempDir Path dir) throws Exception {
        Path f = dir.resolve("sel.txt");
        SelectionLog.Header h = new SelectionLog.Header(8, 4, 2, 128, 128, 16);
        Selection s = Selection.of(16, 30, 20, new int[][][] {{{0, 1, 2}, {1, 2}}, {{0, 2, 3}, {2, 3}}});
        try (SelectionLog.Writer w = SelectionLog.writer(f, h)) {
            w.record(5, s);
            w.commit();
        }
        SelectionLog log = SelectionLog.read(f);
        assertEquals(h, log.header());
        assertEquals(2, log.entries().size());
        SelectionLog.Entry e = log.entries().get(1);
        assertEquals(5, e.layer());
        assertEquals(46, e.position());
        assertEquals(4, e.tokens());
        assertArrayEquals(new int[] {0, 2, 3}, e.blocks()[0]);
        assertArrayEquals(new int[] {2, 3}, e.blocks()[1]);
        Selection back = e.toSelection(16);
        assertTrue(back.contains(0, 0, 2));
    }

    @Test
    void aMalformedLineIsNamed(@TempDir Path dir) throws Exception {
        Path f = dir.resolve("bad.txt");
        Files.writeString(f, "kvant-selection v1 layers=1 heads=2 kv_heads=2 head_dim_k=64 head_dim_v=64 block_tokens=16\n"
                + "0 5 1|0\n");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> SelectionLog.read(f));
        assertTrue(e.getMessage().contains("line 2") && e.getMessage().contains("2 kv head lists"), e.getMessage());
    }

    /**
     * A header count of 0, a geometry no model has, a block size no selection takes, a position past an int context,
     * a record of more than one query block or a list a replay could not attend through is named with its file and
     * line (heads=16777216 kv_heads=1 printed "Index 0 out of bounds for length 0" from the replay's arrays, 17
     * tokens and a list without its own block failed in the replay without file or line).
     */
    @Test
    void impossibleHeadersAndPositionsAreNamed(@TempDir Path dir) throws Exception {
        String good = "kvant-selection v1 layers=1 heads=2 kv_heads=2 head_dim_k=64 head_dim_v=64 block_tokens=16\n";
        String[][] cases = {
                {good.replace("kv_heads=2", "kv_heads=0") + "0 5 1||\n", "line 1", "at least 1"},
                {good.replace("heads=2 kv", "heads=3 kv") + "0 5 1|0|0\n", "line 1", "not a multiple"},
                {good.replace("heads=2 kv_heads=2", "heads=16777216 kv_heads=1") + "0 5 1|0\n", "line 1",
                        "wider than 67108864 values"},
                {good.replace("heads=2 kv_heads=2 head_dim_k=64", "heads=131072 kv_heads=1 head_dim_k=65536")
                        + "0 5 1|0\n", "line 1", "wider than"},
                {good.replace("block_tokens=16", "block_tokens=3") + "0 5 1|0|0\n", "line 1", "block_tokens=3"},
                {good.replace("block_tokens=16", "block_tokens=2048") + "0 5 1|0|0\n", "line 1", "block_tokens=2048"},
                {good + "0 2147483647 1|0|0\n", "line 2", "do not fit"},
                {good + "3 5 1|0|0\n", "line 2", "do not fit"},
                {good + "0 0 16|0|0\n0 16 17|0 1|0 1\n", "line 3", "1..16 queries, not 17"},
                {good + "0 40 1|0 2|0 1\n", "line 2", "kv head 1 lacks block 2"},
                {good + "0 40 1|2 0|2\n", "line 2", "not strictly ascending"},
                {good + "0 40 1|0 2 3|2\n", "line 2", "within [0, 3): entry 2 is 3"},
        };
        for (String[] c : cases) {
            Path f = dir.resolve("bad.txt");
            Files.writeString(f, c[0]);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> SelectionLog.read(f));
            assertTrue(e.getMessage().contains(f + ", " + c[1]) && e.getMessage().contains(c[2]), e.getMessage());
        }
    }
}
