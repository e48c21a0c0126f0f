package dev.kvant.server;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

class StopStringsTest {

    @Test
    void stopStringSplitAcrossPiecesIsNeverSentNorAnythingAfterIt() {
        StopStrings s = new StopStrings(List.of("\n\nUser:", "END"));
        StringBuilder out = new StringBuilder();
        for (String piece : new String[] {"Hello", " world\n", "\nUs", "er: more", " text"}) {
            out.append(s.push(piece));
        }
        out.append(s.finish());
        assertTrue(s.matched());
        assertEquals("Hello world", out.toString());
    }

    @Test
    void textThatOnlyLookedLikeAStopStringIsReleased() {
        StopStrings s = new StopStrings(List.of("END"));
        assertEquals("a", s.push("aE"));
        assertEquals("", s.push("N"));
        assertEquals("ENx", s.push("x"));
        assertEquals("b", s.push("bEN"));
        assertEquals("EN", s.finish());
        assertFalse(s.matched());
    }

    @Test
    void withoutStopStringsEveryPiecePassesAtOnce() {
        StopStrings s = new StopStrings(List.of());
        assertEquals("abc", s.push("abc"));
        assertEquals("", s.finish());
    }
}
