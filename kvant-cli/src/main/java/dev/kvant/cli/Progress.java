package dev.kvant.cli;

import java.io.PrintStream;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;

/** Progress lines on stderr, only when stderr is an interactive terminal and output is not JSON. */
final class Progress {

    /** The line shown last, until it is cleared: an error message then starts on a line of its own. */
    private static volatile Progress shown;

    private final boolean enabled;
    private final PrintStream err = System.err;
    private boolean dirty;

    Progress(boolean json) {
        this.enabled = !json && StderrTerminal.IS;
    }

    /**
     * Whether stderr, where the lines go, is a terminal. The console's {@code isTerminal()} is about stdin and stdout:
     * with {@code 2>log} and stdout on a terminal it said yes, and the log filled with carriage returns and escapes.
     */
    static boolean stderrIsTerminal() {
        try {
            Linker linker = Linker.nativeLinker();
            MethodHandle isatty = linker.downcallHandle(linker.defaultLookup().find("isatty").orElseThrow(),
                    FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.JAVA_INT));
            return (int) isatty.invokeExact(2) == 1;
        } catch (Throwable e) {   // no isatty in the C library: no progress rather than escapes in a file
            return false;
        }
    }

    /** Asked once, when the first progress line is made. */
    private static final class StderrTerminal {
        static final boolean IS = stderrIsTerminal();
    }

    void update(String message) {
        if (enabled) {
            err.print("\r\033[K" + message);
            err.flush();
            dirty = true;
            shown = this;
        }
    }

    /** Clears whatever progress line is showing (before an error message is printed). */
    static void clearShown() {
        Progress p = shown;
        if (p != null) {
            p.done();
        }
    }

    void done() {
        if (enabled && dirty) {
            err.print("\r\033[K");
            err.flush();
            dirty = false;
        }
        if (shown == this) {
            shown = null;
        }
    }
}
