package dev.kvant.cli;

import org.junit.jupiter.api.Test;

import java.nio.file.Path;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class RunCommandTest {

    /**
     * Without -c a --kv-mem budget makes the context what it holds up to the model's trained length (tinycode: 8K;
     * 1G would hold 128K tokens); -c past the trained length is taken, with a warning.
     */
    @Test
    void aBudgetWithoutCStopsAtTheTrainedLength() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        MainTest.Run r = MainTest.run("run", "-m", model.toString(), "--kv-mem", "1G", "-p", "def foo", "-n", "1",
                "--temp", "0", "-t", "2", "--backend", "cpu");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.err().contains("holds 131072 tokens; context 8192 (the model's trained length"), r.err());
        MainTest.Run longer = MainTest.run("run", "-m", model.toString(), "--kv-mem", "1G", "-c", "9000", "-p",
                "def foo", "-n", "1", "--temp", "0", "-t", "2", "--backend", "cpu");
        assertEquals(0, longer.code(), longer.err());
        assertTrue(longer.err().contains("warning: -c 9000 is more than the 8192 tokens the model was trained on")
                && longer.err().contains("context 9000"), longer.err());
    }

    /** One generated token takes no decode after the prompt: its rate is "-", not a figure. */
    @Test
    void aSingleTokenHasNoGenerationRate() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        MainTest.Run r = MainTest.run("run", "-m", model.toString(), "-p", "def foo", "-n", "1", "--temp", "0",
                "-t", "2", "--backend", "cpu");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.err().contains("generation: 1 tokens, - tokens/s"), r.err());
    }
}
