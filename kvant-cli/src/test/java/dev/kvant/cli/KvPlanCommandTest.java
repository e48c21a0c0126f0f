package dev.kvant.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class KvPlanCommandTest {

    /**
     * Every layer's turbo K and V one format richer and one leaner are scored (the last layer's keys, given q8_0, are
     * left alone), the plan keeps the bytes a token, its options keep the given layer and name every trade, and
     * `kvant perplexity` with those options gives the plan's perplexity; at z = 0 any mean gain trades, so on
     * tinycode's eight layers some trade is made.
     */
    @Test
    void aPlanKeepsTheBytesAndItsOptionsGiveItsPerplexity(@TempDir Path dir) throws Exception {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        Path text = SparseCommandsTest.evalText(dir, 6000);
        MainTest.Run r = MainTest.run("kv-plan", "-m", model.toString(), "-f", text.toString(), "-c", "128",
                "--chunks", "4", "-t", "2", "--backend", "cpu", "--ctk", "turbo3+mean", "--ctv", "turbo3",
                "--ctk-layer", "-1=q8_0", "--z", "0", "--json");
        assertEquals(0, r.code(), r.err());
        String json = r.out().strip();
        Matcher head = Pattern.compile("\\{\"kv\":\"turbo3\\+mean/turbo3, layer -1: q8_0/turbo3\","
                + "\"bytes_per_token\":(\\d+),"
                + "\"ppl\":([0-9.]+),\"changes\":\\[(.*)],\"trades\":\\[(.*)],\"plan_ppl\":([0-9.]+),"
                + "\"plan_bytes_per_token\":(\\d+),"
                + "\"options\":\"([^\"]+)\"}").matcher(json);
        assertTrue(head.matches(), json);
        assertEquals(head.group(1), head.group(6), "the plan keeps the bytes a token");
        // 8 layers x (K richer, K leaner, V richer, V leaner), but the last layer's q8_0 keys
        assertEquals(30, head.group(3).split("\\},\\{").length, json);
        assertTrue(!head.group(3).contains("{\"layer\":7,\"rows\":\"K\""), json);
        assertTrue(head.group(3).startsWith("{\"layer\":0,\"rows\":\"K\",\"to\":\"turbo4+mean\","), json);
        assertTrue(!head.group(4).isEmpty(), "at z = 0 some trade pays: " + json);
        String options = head.group(7);
        assertTrue(options.startsWith("--ctk turbo3+mean --ctv turbo3 --ctk-layer -1=q8_0 --ct"), options);

        List<String> args = new java.util.ArrayList<>(List.of("perplexity", "-m", model.toString(), "-f",
                text.toString(), "-c", "128", "--chunks", "4", "-t", "2", "--backend", "cpu", "--json"));
        args.addAll(List.of(options.split(" ")));
        MainTest.Run p = MainTest.run(args.toArray(String[]::new));
        assertEquals(0, p.code(), p.err());
        Matcher ppl = Pattern.compile("\\{\"ppl\":([0-9.]+),.*").matcher(p.out().strip());
        assertTrue(ppl.matches(), p.out());
        assertEquals(Double.parseDouble(head.group(5)), Double.parseDouble(ppl.group(1)), 1e-5, options);
    }

    /**
     * Formats off the turbo ladder have nothing to trade, a paired judgement needs two chunks, and a --check text too
     * short for the context is refused before any perplexity is run.
     */
    @Test
    void nothingToTradeAndOneChunkAreRefused(@TempDir Path dir) throws Exception {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        Path text = SparseCommandsTest.evalText(dir, 4000);
        MainTest.Run q8 = MainTest.run("kv-plan", "-m", model.toString(), "-f", text.toString(), "-c", "128",
                "-t", "2", "--backend", "cpu", "--ctk", "q8_0", "--ctv", "f16");
        assertEquals(2, q8.code(), q8.err());
        assertTrue(q8.err().contains("kv-plan trades bits between the turbo formats"), q8.err());
        MainTest.Run one = MainTest.run("kv-plan", "-m", model.toString(), "-f", text.toString(), "-c", "128",
                "--chunks", "1", "-t", "2", "--backend", "cpu", "--ctk", "turbo3", "--ctv", "turbo3");
        assertEquals(2, one.code(), one.err());
        assertTrue(one.err().contains("--chunks must be at least 2"), one.err());
        Path tiny = dir.resolve("tiny.txt");
        Files.writeString(tiny, "int x = 1;\n");
        MainTest.Run shortCheck = MainTest.run("kv-plan", "-m", model.toString(), "-f", text.toString(), "--check",
                tiny.toString(), "-c", "128", "-t", "2", "--backend", "cpu", "--ctk", "turbo3", "--ctv", "turbo3");
        assertEquals(2, shortCheck.code(), shortCheck.err());
        assertTrue(shortCheck.err().contains("too short for perplexity at -c 128"), shortCheck.err());
    }
}
