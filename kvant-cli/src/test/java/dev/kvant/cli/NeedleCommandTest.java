package dev.kvant.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class NeedleCommandTest {

    /**
     * --lengths and --depths that pick no cell of a probe file say which cells the file has (it said only "no probes
     * to run": --lengths 1000 for the fixture's 1024, --depths 33 for its 10, 50 and 90).
     */
    @Test
    void cellsThatAreNotInTheFileAreNamed(@TempDir Path dir) throws Exception {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        Path two = dir.resolve("two.jsonl");
        Files.write(two, Files.readAllLines(SparseCommandsTest.tinycode("needle-probes.jsonl")).subList(0, 2));
        for (String[] pick : new String[][] {{"--lengths", "1000"}, {"--depths", "33"}}) {
            MainTest.Run r = MainTest.run("needle", "-m", model.toString(), "--probes", two.toString(), "-t", "2",
                    "--backend", "cpu", pick[0], pick[1]);
            assertEquals(1, r.code(), r.err());
            assertTrue(r.err().contains("kvant: no probe of " + two + " is in the cells --lengths and --depths pick:"
                    + " its probes have lengths 1024 and depths 10"), r.err());
        }
    }
}
