package dev.kvant.cli;

import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
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
    /** bench warns as run does when a test's context is past the model's trained length (tinycode: 8,192). */
    @Test
    void benchWarnsPastTheTrainedLength() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        MainTest.Run r = MainTest.run("bench", "-m", model.toString(), "-p", "4", "-n", "0", "-d", "8200",
                "--depth-fill", "random", "-r", "1", "-t", "2", "--backend", "cpu");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.err().contains("warning: the deepest test's context 8204 is more than the 8192 tokens the model"
                + " was trained on"), r.err());
    }

    @Test
    void aSingleTokenHasNoGenerationRate() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        MainTest.Run r = MainTest.run("run", "-m", model.toString(), "-p", "def foo", "-n", "1", "--temp", "0",
                "-t", "2", "--backend", "cpu");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.err().contains("generation: 1 tokens, - tokens/s"), r.err());
    }

    /**
     * A reader that goes away ({@code kvant run ... | head -c 20}) stops the generation with a failure, instead of a
     * PrintStream swallowing every write's error while all -n tokens are generated for no one.
     */
    @Test
    void aClosedStdoutStopsTheGeneration() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        int[] writes = {0};
        OutputStream closed = new OutputStream() {
            @Override
            public void write(int b) throws IOException {
                write(new byte[] {(byte) b}, 0, 1);
            }

            @Override
            public void write(byte[] b, int off, int len) throws IOException {
                writes[0]++;
                throw new IOException("Broken pipe");
            }
        };
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int code;
        synchronized (MainTest.class) {   // as MainTest.run, which swaps the same streams
            PrintStream oldOut = System.out;
            PrintStream oldErr = System.err;
            try {
                System.setOut(new PrintStream(closed, true, StandardCharsets.UTF_8));
                System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
                code = Main.execute("run", "-m", model.toString(), "-p", "def f(x):", "-n", "300", "--temp", "0",
                        "-t", "2", "--backend", "cpu");
            } finally {
                System.setOut(oldOut);
                System.setErr(oldErr);
            }
        }
        String e = err.toString(StandardCharsets.UTF_8);
        assertEquals(1, code, e);
        assertTrue(e.contains("kvant: the generated text could not be written to stdout"), e);
        assertEquals(1, writes[0], "writes after the first failed: " + writes[0]);
    }
}
