package dev.kvant.cli;

import java.io.PrintStream;

/** Progress lines on stderr, only when stderr is an interactive terminal and output is not JSON. */
final class Progress {

    /** The line shown last, until it is cleared: an error message then starts on a line of its own. */
    private static volatile Progress shown;

    private final boolean enabled;
    private final PrintStream err = System.err;
    private boolean dirty;

    Progress(boolean json) {
        this.enabled = !json && System.console() != null && System.console().isTerminal();
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
