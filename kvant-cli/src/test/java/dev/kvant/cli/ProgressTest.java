package dev.kvant.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Progress lines go to stderr, so they show only when stderr is a terminal: {@code kvant perplexity ... 2>log} from
 * a terminal keeps the log free of carriage returns and escapes. A child JVM runs under util-linux {@code script},
 * which gives it a terminal for stdin and stdout.
 */
class ProgressTest {

    /** Shows a progress line and clears it, then prints "done". */
    static final class Probe {
        public static void main(String[] args) {
            Progress p = new Progress(false);
            p.update("working");
            p.done();
            System.err.println("done");
        }
    }

    @Test
    void progressShowsOnlyWhenStderrIsATerminal(@TempDir Path dir) throws Exception {
        assumeTrue(underScript("true").code == 0, "util-linux script is not available here");
        String java = ProcessHandle.current().info().command().orElseThrow();
        String probe = quote(java) + " --enable-native-access=ALL-UNNAMED -cp "
                + quote(System.getProperty("java.class.path")) + " " + quote(Probe.class.getName());
        Path log = dir.resolve("err.txt");

        Result redirected = underScript(probe + " 2>" + quote(log.toString()));
        assertEquals(0, redirected.code, redirected.output);
        String err = Files.readString(log, StandardCharsets.UTF_8);
        assertTrue(err.contains("done"), err);
        assertFalse(err.contains("working") || err.contains("\r") || err.contains("\033["), err);

        Result terminal = underScript(probe);
        assertEquals(0, terminal.code, terminal.output);
        assertTrue(terminal.output.contains("\r\033[Kworking"), terminal.output);
    }

    private record Result(int code, String output) {
    }

    /** Runs a shell command with a terminal for its stdin, stdout and stderr; its output is the terminal's. */
    private static Result underScript(String command) throws Exception {
        Process p;
        try {
            p = new ProcessBuilder(List.of("script", "-qec", command, "/dev/null"))
                    .redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")))
                    .redirectErrorStream(true).start();
        } catch (java.io.IOException e) {
            return new Result(-1, e.toString());
        }
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            return new Result(-1, out);
        }
        return new Result(p.exitValue(), out);
    }

    private static String quote(String s) {
        return "'" + s.replace("'", "'\\''") + "'";
    }
}
