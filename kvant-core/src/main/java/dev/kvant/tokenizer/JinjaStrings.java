package dev.kvant.tokenizer;

import java.time.LocalDate;
import java.time.format.TextStyle;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * The string a chat template's {@code {% set name = ... %}} statement gives, read from the template's text without
 * running Jinja (kvant runs none, see {@link ChatTemplate}). The expression may add up ({@code +} or {@code ~}) string
 * literals, names set the same way before it, and {@code strftime_now("...")}, today's date, which stays a slot to
 * fill in when a prompt is rendered. That is how Mistral Small 3's template writes its default system prompt:
 *
 * <pre>{@code
 * {%- set today = strftime_now("%Y-%m-%d") %}
 * {%- set default_system_message = "You are Mistral Small 3, ...\nYour knowledge base was last updated on 2023-10-01.
 *     The current date is " + today + ".\n\nWhen you're not sure ..." %}
 * }</pre>
 *
 * Anything else (a filter, a call of another function, a set inside an {@code if} or {@code for} block, a name set
 * twice) makes the value one kvant cannot read, and {@link #find} says why.
 */
final class JinjaStrings {

    /** A string with slots for today's date: pieces of text, and strftime formats where the date goes. */
    record Value(List<Piece> pieces) {
        static Value of(String text) {
            return new Value(List.of(new Piece(text, null)));
        }

        /** The text on the given day. */
        String on(LocalDate today) {
            StringBuilder sb = new StringBuilder();
            for (Piece p : pieces) {
                sb.append(p.strftime() == null ? p.text() : strftime(p.strftime(), today));
            }
            return sb.toString();
        }

        /**
         * This value, then other's; refused past {@link #MAX_PIECES} pieces or {@link #MAX_CHARS} characters of text,
         * so that a hostile template (names set to themselves added up, doubling at every statement) cannot take the
         * heap or minutes at load.
         */
        Value plus(Value other) {
            if (pieces.size() + other.pieces.size() > MAX_PIECES || chars() + other.chars() > MAX_CHARS) {
                throw new IllegalArgumentException("the value is longer than " + MAX_CHARS + " characters or "
                        + MAX_PIECES + " pieces");
            }
            List<Piece> all = new ArrayList<>(pieces);
            all.addAll(other.pieces);
            return new Value(List.copyOf(all));
        }

        private long chars() {
            long n = 0;
            for (Piece p : pieces) {
                n += p.text() == null ? 0 : p.text().length();
            }
            return n;
        }
    }

    /** The longest value read (a default system prompt is a few hundred characters). */
    static final int MAX_CHARS = 1 << 16;
    /** The most pieces (literals, dates) a value is added up from. */
    static final int MAX_PIECES = 1 << 10;

    /** Text ({@code strftime} null), or today's date in a strftime format ({@code text} null). */
    record Piece(String text, String strftime) {
    }

    /** Statements that open a block their {@code end...} statement closes (a set without '=' does too). */
    private static final Set<String> BLOCKS = Set.of("if", "for", "macro", "call", "filter", "block", "with", "raw");

    private final String template;
    private int pos;

    private JinjaStrings(String template) {
        this.template = template;
    }

    /**
     * The value the template's top-level {@code set} statement gives {@code name}, or null when the template sets no
     * such name.
     *
     * @throws IllegalArgumentException when it sets the name to a value this reading cannot take, saying why
     */
    static Value find(String template, String name) {
        return new JinjaStrings(template).find(name);
    }

    private Value find(String name) {
        Map<String, Value> known = new HashMap<>();
        Set<String> unreadable = new HashSet<>();
        Value found = null;
        int depth = 0;
        int at = 0;
        while ((at = template.indexOf("{%", at)) >= 0) {
            pos = at + 2;
            if (pos < template.length() && (template.charAt(pos) == '-' || template.charAt(pos) == '+')) {
                pos++;
            }
            spaces();
            String keyword = identifier();
            spaces();
            String target = "set".equals(keyword) ? identifier() : null;
            spaces();
            if (target == null || !eat("=")) {
                if (BLOCKS.contains(keyword) || "set".equals(keyword) && (template.startsWith("%}", pos)
                        || template.startsWith("-%}", pos) || template.startsWith("+%}", pos))) {
                    depth++;   // {% set x %}...{% endset %} included
                } else if (keyword != null && keyword.startsWith("end")) {
                    depth = Math.max(0, depth - 1);
                }
                if (target != null) {
                    if (target.equals(name)) {
                        throw new IllegalArgumentException(name + " is not a string kvant can read: it is not set with"
                                + " '='");
                    }
                    known.remove(target);
                    unreadable.add(target);
                }
                at = pos;
                continue;
            }
            Value value = null;
            String problem;
            try {
                value = expression(known, unreadable);
                spaces();
                if (template.startsWith("-%}", pos) || template.startsWith("+%}", pos)) {
                    pos++;
                }
                if (!template.startsWith("%}", pos)) {
                    throw new IllegalArgumentException("'" + excerpt() + "' is more than strings added up");
                }
                problem = depth > 0 ? "it is set inside an if or for block" : null;
            } catch (IllegalArgumentException e) {
                problem = e.getMessage();
            }
            if (target.equals(name)) {
                if (found != null) {
                    throw new IllegalArgumentException(name + " is set more than once");
                }
                if (problem != null) {
                    throw new IllegalArgumentException(name + " is not a string kvant can read: " + problem);
                }
                found = value;
            }
            if (problem == null && !known.containsKey(target) && !unreadable.contains(target)) {
                known.put(target, value);
            } else {
                known.remove(target);
                unreadable.add(target);
            }
            int end = template.indexOf("%}", pos);
            at = end < 0 ? template.length() : end + 2;
        }
        return found;
    }

    /** Terms added up with {@code +} or {@code ~}. */
    private Value expression(Map<String, Value> known, Set<String> unreadable) {
        Value v = term(known, unreadable);
        while (true) {
            spaces();
            if (template.startsWith("+%}", pos) || !eat("+") && !eat("~")) {
                return v;
            }
            v = v.plus(term(known, unreadable));
        }
    }

    /** A string literal, a name set before, or {@code strftime_now("format")}. */
    private Value term(Map<String, Value> known, Set<String> unreadable) {
        spaces();
        if (pos < template.length() && (template.charAt(pos) == '"' || template.charAt(pos) == '\'')) {
            return Value.of(stringLiteral());
        }
        int start = pos;
        String id = identifier();
        if (id == null) {
            throw new IllegalArgumentException("'" + excerpt() + "' is no string");
        }
        spaces();
        if (id.equals("strftime_now") && eat("(")) {
            spaces();
            if (pos >= template.length() || template.charAt(pos) != '"' && template.charAt(pos) != '\'') {
                throw new IllegalArgumentException("strftime_now takes a string literal here");
            }
            String format = stringLiteral();
            spaces();
            if (!eat(")")) {
                throw new IllegalArgumentException("strftime_now takes one argument");
            }
            strftime(format, LocalDate.of(2000, 1, 1));   // refuses a format kvant does not write
            return new Value(List.of(new Piece(null, format)));
        }
        if (template.startsWith("(", pos)) {
            throw new IllegalArgumentException("it calls " + id + ", which kvant does not run");
        }
        Value v = known.get(id);
        if (v == null) {
            pos = start;
            throw new IllegalArgumentException("'" + id + "' is " + (unreadable.contains(id)
                    ? "not a string kvant can read" : "no name set before as a string"));
        }
        return v;
    }

    /**
     * A Jinja string literal from its opening quote: its text as Jinja reads it, with Python's escapes (Jinja
     * decodes literals with Python's {@code unicode-escape}) and line ends as {@code \n}.
     */
    private String stringLiteral() {
        char quote = template.charAt(pos++);
        StringBuilder sb = new StringBuilder();
        while (true) {
            if (pos >= template.length()) {
                throw new IllegalArgumentException("a string literal is not closed");
            }
            char c = template.charAt(pos++);
            if (c == quote) {
                return sb.toString();
            }
            if (c == '\r') {
                sb.append('\n');
                if (pos < template.length() && template.charAt(pos) == '\n') {
                    pos++;
                }
            } else if (c != '\\' || pos >= template.length()) {
                sb.append(c);
            } else {
                escape(sb);
            }
        }
    }

    /** The escape after a backslash, as Python's unicode-escape reads it. */
    private void escape(StringBuilder sb) {
        char e = template.charAt(pos++);
        switch (e) {
            case '\n' -> { }
            case '\\', '\'', '"' -> sb.append(e);
            case 'n' -> sb.append('\n');
            case 't' -> sb.append('\t');
            case 'r' -> sb.append('\r');
            case 'a' -> sb.append('\u0007');
            case 'b' -> sb.append('\b');
            case 'f' -> sb.append('\f');
            case 'v' -> sb.append('\u000b');
            case 'x' -> sb.appendCodePoint(hex(2));
            case 'u' -> sb.appendCodePoint(hex(4));
            case 'U' -> sb.appendCodePoint(hex(8));
            case 'N' -> {
                int close = template.indexOf('}', pos);
                if (!template.startsWith("{", pos) || close < 0) {
                    throw new IllegalArgumentException("a \\N escape without {name}");
                }
                sb.appendCodePoint(Character.codePointOf(template.substring(pos + 1, close)));
                pos = close + 1;
            }
            default -> {
                if (e >= '0' && e <= '7') {
                    int v = e - '0';
                    for (int k = 0; k < 2 && pos < template.length() && template.charAt(pos) >= '0'
                            && template.charAt(pos) <= '7'; k++) {
                        v = v * 8 + template.charAt(pos++) - '0';
                    }
                    sb.append((char) v);
                } else {
                    sb.append('\\').append(e);   // Python keeps an unknown escape as it is
                }
            }
        }
    }

    private int hex(int digits) {
        if (pos + digits > template.length()) {
            throw new IllegalArgumentException("a string literal ends inside an escape");
        }
        long v = 0;
        for (int k = 0; k < digits; k++) {
            int d = Character.digit(template.charAt(pos + k), 16);
            if (d < 0) {
                throw new IllegalArgumentException("a malformed \\x, \\u or \\U escape");
            }
            v = v * 16 + d;
        }
        if (v > Character.MAX_CODE_POINT) {
            throw new IllegalArgumentException("an escape outside Unicode");
        }
        pos += digits;
        return (int) v;
    }

    private String identifier() {
        int start = pos;
        while (pos < template.length() && (Character.isLetterOrDigit(template.charAt(pos))
                || template.charAt(pos) == '_')) {
            pos++;
        }
        return pos > start && !Character.isDigit(template.charAt(start)) ? template.substring(start, pos) : null;
    }

    private void spaces() {
        while (pos < template.length() && Character.isWhitespace(template.charAt(pos))) {
            pos++;
        }
    }

    private boolean eat(String s) {
        if (template.startsWith(s, pos)) {
            pos += s.length();
            return true;
        }
        return false;
    }

    private String excerpt() {
        String s = template.substring(pos, Math.min(template.length(), pos + 30));
        return s.replace("\n", "\\n");
    }

    /**
     * Python's {@code strftime} for a date in the C locale, the directives a date needs: %Y %y %m %d %j %b %h %B %a
     * %A %u %w %F %%.
     *
     * @throws IllegalArgumentException for any other directive (a time of day among them)
     */
    static String strftime(String format, LocalDate d) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < format.length(); i++) {
            char c = format.charAt(i);
            if (c != '%') {
                sb.append(c);
                continue;
            }
            if (++i == format.length()) {
                throw new IllegalArgumentException("strftime format '" + format + "' ends in '%'");
            }
            switch (format.charAt(i)) {
                case 'Y' -> sb.append(d.getYear());
                case 'y' -> sb.append(String.format("%02d", d.getYear() % 100));
                case 'm' -> sb.append(String.format("%02d", d.getMonthValue()));
                case 'd' -> sb.append(String.format("%02d", d.getDayOfMonth()));
                case 'j' -> sb.append(String.format("%03d", d.getDayOfYear()));
                case 'b', 'h' -> sb.append(d.getMonth().getDisplayName(TextStyle.SHORT, Locale.ENGLISH));
                case 'B' -> sb.append(d.getMonth().getDisplayName(TextStyle.FULL, Locale.ENGLISH));
                case 'a' -> sb.append(d.getDayOfWeek().getDisplayName(TextStyle.SHORT, Locale.ENGLISH));
                case 'A' -> sb.append(d.getDayOfWeek().getDisplayName(TextStyle.FULL, Locale.ENGLISH));
                case 'u' -> sb.append(d.getDayOfWeek().getValue());
                case 'w' -> sb.append(d.getDayOfWeek().getValue() % 7);
                case 'F' -> sb.append(strftime("%Y-%m-%d", d));
                case '%' -> sb.append('%');
                default -> throw new IllegalArgumentException("strftime format '" + format + "' asks for %"
                        + format.charAt(i) + "; kvant fills in dates only (%Y %y %m %d %j %b %B %a %A %u %w %F)");
            }
        }
        return sb.toString();
    }
}
