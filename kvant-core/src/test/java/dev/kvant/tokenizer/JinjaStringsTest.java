package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.time.LocalDate;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The strings templates set, read as jinja2 3.1.2 renders them ({@code {{ x }}} after the same statements). */
class JinjaStringsTest {

    private static final LocalDate DAY = LocalDate.of(2026, 9, 6);

    private static String read(String template) {
        return JinjaStrings.find(template, "x").on(DAY);
    }

    @Test
    void literalsReadAsJinjaReadsThemWithPythonsEscapes() {
        assertEquals("a\nb\t'q' Aé😀 A \\d \"d\" \\",
                read("{% set x = 'a\\nb\\t\\'q\\' \\x41\\u00e9\\U0001F600 \\101 \\d \"d\" \\\\' %}{{ x }}"));
        assertEquals("two\nlines\nhere", read("{% set x = \"two\nlines\r\nhere\" %}{{ x }}"));
    }

    /**
     * A hostile template that doubles a name at every statement (2^40 pieces after 40) is refused as soon as a value
     * passes the bound, quickly and without taking the heap; a long literal past the bound likewise.
     */
    @Test
    void valuesThatGrowPastTheBoundAreRefused() {
        StringBuilder t = new StringBuilder("{% set a0 = 'ab' %}");
        for (int i = 1; i <= 40; i++) {
            t.append("{% set a").append(i).append(" = a").append(i - 1).append(" + a").append(i - 1).append(" %}");
        }
        t.append("{% set x = a40 %}");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> read(t.toString()));
        assertTrue(e.getMessage().contains("a40"), e.getMessage());
        String big = "x".repeat(JinjaStrings.MAX_CHARS);
        IllegalArgumentException f = assertThrows(IllegalArgumentException.class,
                () -> read("{% set x = '" + big + "' + 'y' %}"));
        assertTrue(f.getMessage().contains("longer than"), f.getMessage());
    }

    @Test
    void namesSetBeforeAndTodaysDateAddUp() {
        String t = "{%- set day = strftime_now('%d %b %Y, %A %a %B %j %y %m %u %w %% %F') -%}"
                + "{%- set x = \"Today: \" ~ day + '.' -%}{{ x }}";
        assertEquals("Today: 06 Sep 2026, Sunday Sun September 249 26 09 7 0 % 2026-09-06.", read(t));
        // the date is filled in on the day of rendering
        assertEquals("Today: 01 Jan 2027, Friday Fri January 001 27 01 5 5 % 2027-01-01.",
                JinjaStrings.find(t, "x").on(LocalDate.of(2027, 1, 1)));
        // a block that has ended leaves the statements after it at the top level
        assertEquals("a", read("{% if c %}{% set y = 'n' %}{% endif %}{%- set x = 'a' -%}"));
    }

    @Test
    void aTemplateThatDoesNotSetTheNameHasNoValue() {
        assertNull(JinjaStrings.find("{{ x }}{% set xs = 'a' %}", "x"));
    }

    @Test
    void valuesThisReadingCannotTakeAreRefusedWithTheReason() {
        String[][] cases = {
            {"{% set x = y %}", "'y' is no name set before as a string"},
            {"{% set x = 'a' | upper %}", "is more than strings added up"},
            {"{% if c %}{% set x = 'a' %}{% endif %}", "inside an if or for block"},
            {"{% for m in ms %}{% set x = 'a' %}{% endfor %}", "inside an if or for block"},
            {"{% set x = 'a' %}{% set x = 'b' %}", "set more than once"},
            {"{% set x = strftime_now('%H:%M') %}", "asks for %H"},
            {"{% set x = 'a' + now() %}", "calls now, which kvant does not run"},
            {"{% set y = z %}{% set x = 'a' + y %}", "'y' is not a string kvant can read"},
            {"{% set y = 'a' %}{% set y = 'b' %}{% set x = y %}", "'y' is not a string kvant can read"},
            {"{% set x %}a{% endset %}", "not set with '='"},
            {"{% set x = 'a %}", "not closed"},
        };
        for (String[] c : cases) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> read(c[0]), c[0]);
            assertTrue(e.getMessage().contains(c[1]), c[0] + ": " + e.getMessage());
        }
    }
}
