package dev.kvant.server;

import java.util.List;

/**
 * Finds the client's stop strings in text that arrives piece by piece. Text that could still turn out to be the start
 * of a stop string is held back until it cannot; the stop string itself and everything after it are never sent.
 */
final class StopStrings {
    private final List<String> stops;
    private final StringBuilder pending = new StringBuilder();
    private boolean matched;

    StopStrings(List<String> stops) {
        this.stops = stops;
    }

    /** Adds a piece; returns the text that can be sent now. */
    String push(String piece) {
        if (matched) {
            return "";
        }
        if (stops.isEmpty()) {
            return piece;
        }
        pending.append(piece);
        int cut = -1;
        for (String s : stops) {
            int i = pending.indexOf(s);
            if (i >= 0 && (cut < 0 || i < cut)) {
                cut = i;
            }
        }
        if (cut >= 0) {
            matched = true;
            String out = pending.substring(0, cut);
            pending.setLength(0);
            return out;
        }
        int keep = heldSuffix();
        int send = pending.length() - keep;
        if (send > 0 && Character.isHighSurrogate(pending.charAt(send - 1))) {
            send--;
        }
        String out = pending.substring(0, send);
        pending.delete(0, send);
        return out;
    }

    /** The generation ended: what was held back and was no stop string after all. */
    String finish() {
        String out = matched ? "" : pending.toString();
        pending.setLength(0);
        return out;
    }

    boolean matched() {
        return matched;
    }

    /** The length of the longest end of pending that begins some stop string. */
    private int heldSuffix() {
        int n = pending.length();
        for (int k = Math.min(n, maxStopLength() - 1); k > 0; k--) {
            for (String s : stops) {
                if (k < s.length() && pending.substring(n - k).regionMatches(0, s, 0, k)) {
                    return k;
                }
            }
        }
        return 0;
    }

    private int maxStopLength() {
        int m = 0;
        for (String s : stops) {
            m = Math.max(m, s.length());
        }
        return m;
    }
}
