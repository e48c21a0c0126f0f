package dev.kvant.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class PerplexityCommandTest {

    /**
     * `--json --chunk-nll` adds each chunk's mean NLL to the JSON object, whose mean is the log of the printed
     * perplexity; without `--chunk-nll` the object keeps its five fields (a contract: other tools parse it).
     */
    @Test
    void chunkNllGivesEachChunksMeanWhoseMeanIsTheLogPerplexity(@TempDir Path dir) throws Exception {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        Path text = SparseCommandsTest.evalText(dir, 4000);
        MainTest.Run r = MainTest.run("perplexity", "-m", model.toString(), "-f", text.toString(), "-c", "128",
                "--chunks", "3", "-t", "2", "--backend", "cpu", "--json", "--chunk-nll");
        assertEquals(0, r.code(), r.err());
        Matcher m = Pattern.compile("\\{\"ppl\":([0-9.]+),\"ppl_err\":[0-9.]+,\"chunks\":3,\"ctx\":128,"
                + "\"tokens_scored\":189,\"chunk_nll\":\\[([0-9.]+),([0-9.]+),([0-9.]+)]}").matcher(r.out().strip());
        assertTrue(m.matches(), r.out());
        double mean = (Double.parseDouble(m.group(2)) + Double.parseDouble(m.group(3))
                + Double.parseDouble(m.group(4))) / 3;
        assertEquals(Double.parseDouble(m.group(1)), Math.exp(mean), 1e-5, r.out());

        MainTest.Run plain = MainTest.run("perplexity", "-m", model.toString(), "-f", text.toString(), "-c",
                "128", "--chunks", "3", "-t", "2", "--backend", "cpu", "--json");
        assertEquals(0, plain.code(), plain.err());
        assertTrue(plain.out().strip().matches("\\{\"ppl\":" + Pattern.quote(m.group(1))
                + ",\"ppl_err\":[0-9.]+,\"chunks\":3,\"ctx\":128,\"tokens_scored\":189}"), plain.out());
    }

    /** With --kv-mem, a -c the budget cannot hold is refused before any work (and one it holds runs). */
    @Test
    void aContextTheKvBudgetCannotHoldIsRefused(@TempDir Path dir) throws Exception {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        Path text = SparseCommandsTest.evalText(dir, 4000);
        MainTest.Run over = MainTest.run("perplexity", "-m", model.toString(), "-f", text.toString(), "-c", "4096",
                "--chunks", "1", "-t", "2", "--backend", "cpu", "--kv-mem", "1M");
        assertEquals(2, over.code(), over.err());
        assertTrue(over.err().contains("perplexity at -c 4096 needs 4096 tokens of KV cache; --kv-mem 1M holds"),
                over.err());
        MainTest.Run fits = MainTest.run("perplexity", "-m", model.toString(), "-f", text.toString(), "-c", "128",
                "--chunks", "1", "-t", "2", "--backend", "cpu", "--kv-mem", "1M", "--json");
        assertEquals(0, fits.code(), fits.err());
    }
}
