package dev.kvant.select;

import dev.kvant.engine.Session;
import dev.kvant.tokenizer.StreamDecoder;
import dev.kvant.tokenizer.Tokenizer;

import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.function.Consumer;

/**
 * Runs needle probes greedily and counts recall per (length, depth) cell: a probe is correct when its continuation
 * starts with the expected text; generation stops as soon as the text is no longer a prefix of it.
 */
public final class NeedleEval {

    /** One probe's outcome: what the model wrote (up to where it was decided). */
    public record Outcome(NeedleProbe probe, boolean correct, String got, int promptTokens) {
    }

    /** A (length, depth) cell. */
    public record Cell(int length, double depth, int n, int correct) {
        public String toJson() {
            return String.format(Locale.ROOT, "{\"n_ctx\":%d,\"depth\":%s,\"n\":%d,\"correct\":%d}", length,
                    fmt(depth), n, correct);
        }
    }

    /** All outcomes and the cells they fall in, ordered by length, then depth. */
    public record Result(List<Outcome> outcomes, List<Cell> cells) {
        public double accuracy() {
            return outcomes.isEmpty() ? 0 : outcomes.stream().filter(Outcome::correct).count()
                    / (double) outcomes.size();
        }

        public String toJson() {
            StringBuilder sb = new StringBuilder(String.format(Locale.ROOT, "{\"accuracy\":%.4f,\"n\":%d,\"cells\":[",
                    accuracy(), outcomes.size()));
            for (int i = 0; i < cells.size(); i++) {
                sb.append(i == 0 ? "" : ",").append(cells.get(i).toJson());
            }
            return sb.append("]}").toString();
        }

        /** A markdown table: lengths down, depths across, correct/n in each cell. */
        public String table() {
            List<Double> depths = cells.stream().map(Cell::depth).distinct().sorted().toList();
            List<Integer> lengths = cells.stream().map(Cell::length).distinct().sorted().toList();
            StringBuilder sb = new StringBuilder("| length \\ depth |");
            for (double d : depths) {
                sb.append(' ').append(Math.round(d * 100)).append("% |");
            }
            sb.append("\n| --- |").append(" ---: |".repeat(depths.size())).append('\n');
            for (int len : lengths) {
                sb.append("| ").append(len).append(" |");
                for (double d : depths) {
                    String v = cells.stream().filter(c -> c.length() == len && c.depth() == d)
                            .map(c -> c.correct() + "/" + c.n()).findFirst().orElse("-");
                    sb.append(' ').append(v).append(" |");
                }
                sb.append('\n');
            }
            return sb.append(String.format(Locale.ROOT, "\noverall: %d/%d = %.1f%%%n",
                    outcomes.stream().filter(Outcome::correct).count(), outcomes.size(), 100 * accuracy())).toString();
        }
    }

    private NeedleEval() {
    }

    /**
     * Runs every probe from an empty cache of the session, greedy, at most maxNew generated tokens each.
     *
     * @param progress told each outcome as it is decided
     */
    public static Result run(Session session, Tokenizer tok, List<NeedleProbe> probes, int maxNew,
                             Consumer<Outcome> progress) {
        List<Outcome> outcomes = new ArrayList<>();
        for (NeedleProbe p : probes) {
            int[] prompt = tok.encode(p.prompt(), true, p.chat(), p.plainRanges());
            // the last generated token is never fed back: maxNew - 1 of them enter the cache
            if (prompt.length + maxNew - 1 > session.contextLength()) {
                throw new IllegalArgumentException("probe " + p.id() + " needs " + (prompt.length + maxNew - 1)
                        + " tokens of context but the session holds " + session.contextLength());
            }
            session.truncate(0);
            int next = session.prefillGreedy(prompt);
            // the continuation as the model wrote it, every space kept: Tokenizer.decode renders a sequence from its
            // start and drops a SentencePiece first token's leading space, which would score a wrong " key" right
            StreamDecoder stream = tok.streamDecoder();
            StringBuilder generated = new StringBuilder();
            boolean correct = false;
            String text = "";
            for (int step = 0; step < maxNew; step++) {
                text = generated.append(stream.feed(next)).toString();
                String t = p.chat() ? text.stripLeading() : text;
                Boolean verdict = verdict(t, p.expected(), step == maxNew - 1);
                if (verdict != null) {
                    correct = verdict;
                    break;
                }
                next = session.decodeGreedy(next);
            }
            Outcome o = new Outcome(p, correct, text, prompt.length);
            outcomes.add(o);
            progress.accept(o);
        }
        return new Result(outcomes, cells(outcomes));
    }

    /**
     * Whether the text generated so far answers the probe: true, false, or null while it cannot tell yet (the text is
     * still a beginning of the answer, or — for an answer ending in a digit — exactly the answer, whose number the
     * next token may go on: "123456" does not answer "12345"). last: no token follows.
     */
    static Boolean verdict(String text, String expected, boolean last) {
        if (text.startsWith(expected)) {
            boolean open = !expected.isEmpty() && Character.isDigit(expected.charAt(expected.length() - 1));
            if (!open || text.length() > expected.length()) {
                return !open || !Character.isDigit(text.charAt(expected.length()));
            }
            return last ? Boolean.TRUE : null;   // out of tokens right at the answer: counted
        }
        return expected.startsWith(text) && !last ? null : Boolean.FALSE;
    }

    static List<Cell> cells(List<Outcome> outcomes) {
        Map<Integer, Map<Double, int[]>> m = new TreeMap<>();
        for (Outcome o : outcomes) {
            int[] c = m.computeIfAbsent(o.probe().length(), k -> new TreeMap<>())
                    .computeIfAbsent(o.probe().depth(), k -> new int[2]);
            c[0]++;
            c[1] += o.correct() ? 1 : 0;
        }
        List<Cell> cells = new ArrayList<>();
        m.forEach((len, byDepth) -> byDepth.forEach((d, c) -> cells.add(new Cell(len, d, c[0], c[1]))));
        return cells;
    }

    private static String fmt(double d) {
        return d == Math.rint(d) ? Long.toString((long) d) : Double.toString(d);
    }
}
