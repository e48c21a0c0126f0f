package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.engine.Session;
import dev.kvant.model.LlamaModel;
import dev.kvant.select.NeedleEval;
import dev.kvant.select.NeedleProbe;
import dev.kvant.select.SelectionLog;
import dev.kvant.tensor.Parallel;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tokenizer.Tokenizer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;

/** Long-context recall: greedy needle probes, accuracy per (length, depth) cell. */
@Command(name = "needle", mixinStandardHelpOptions = true,
        description = {"Needle-in-a-haystack recall: runs probes greedily and reports accuracy per (length, depth).",
                "Either --probes FILE.jsonl (the fixture format: id, n_ctx_tokens, depth, name, value, prompt) or "
                        + "--haystack TEXT --lengths ... --depths ... (pass-key probes in the model's chat template)."})
final class NeedleCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Mixin
    SelectOptions selectOpts;

    @Option(names = "--probes", paramLabel = "FILE", description = "probes, one JSON object per line")
    Path probes;

    @Option(names = "--haystack", paramLabel = "TEXT", description = "filler text file for pass-key probes")
    Path haystack;

    @Spec
    CommandSpec spec;

    @Option(names = "--lengths", paramLabel = "N", split = ",", defaultValue = "8k,32k,128k",
            description = "pass-key prompt lengths in tokens, k = 1024 (default ${DEFAULT-VALUE}); with --probes, "
                    + "when given: only the probes of these nominal lengths (e.g. 1024,8000)")
    List<String> lengths;

    @Option(names = "--depths", paramLabel = "PCT", split = ",", defaultValue = "10,50,90",
            description = "pass-key depths in percent (default ${DEFAULT-VALUE}); with --probes, when given: only the "
                    + "probes of these depths")
    int[] depths;

    @Option(names = "--per-cell", paramLabel = "N", defaultValue = "0",
            description = "probes per (length, depth) cell: the first N of each cell of --probes (0 = all), "
                    + "or N pass-key probes per cell (0 = 4)")
    int perCell;

    @Option(names = "--seed", paramLabel = "N", defaultValue = "1", description = "pass-key random seed (default ${DEFAULT-VALUE})")
    long seed;

    @Option(names = "--chat-template", paramLabel = "NAME",
            description = "chat template for pass-key probes (default: detected from the model)")
    String chatTemplate;

    @Option(names = "--max-new", paramLabel = "N", defaultValue = "16",
            description = "at most N generated tokens per probe (default ${DEFAULT-VALUE})")
    int maxNew;

    @Option(names = "--verbose", description = "print every probe's outcome")
    boolean verbose;

    @Option(names = "--json", description = "print one JSON object")
    boolean json;

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if ((probes == null) == (haystack == null)) {
            throw new UsageException("give exactly one of --probes FILE.jsonl and --haystack TEXT");
        }
        selectOpts.config();
        if (maxNew < 1) {
            throw new UsageException("--max-new must be at least 1 (the answer is read from it), got " + maxNew);
        }
        if (perCell < 0) {
            throw new UsageException("--per-cell must not be negative (0 = every probe of a cell), got " + perCell);
        }
        if (probes != null && !java.nio.file.Files.isReadable(probes)) {   // before the model is loaded
            throw new IllegalArgumentException("--probes: cannot read " + probes);
        }
        Progress progress = new Progress(json);
        try (LlamaModel model = opts.load();
             Parallel pool = new Parallel(opts.threads);
             SelectionLog.Writer dump = selectOpts.apply(model, opts.model, probes, haystack);
             Backend backend = opts.openBackend(model, pool)) {
            if (selectOpts.dump != null && !backend.name().equals("cpu")) {
                throw new UsageException("--dump-selection records the CPU backend's selections only"
                        + " (use --backend cpu)");
            }
            Tokenizer tok = model.tokenizer();
            List<NeedleProbe> list = probes != null ? fromFile() : passKeys(model, tok);
            if (list.isEmpty()) {
                throw new IllegalArgumentException("no probes to run");
            }
            int longest = 0;
            for (NeedleProbe p : list) {
                // tokenized as the run will (control-token texts in plain ranges are plain text, several tokens)
                longest = Math.max(longest, tok.encode(p.prompt(), true, p.chat(), p.plainRanges()).length);
            }
            int ctx = longest + maxNew;
            ModelOptions.warnPastTraining(model, ctx, "the longest probe's context");
            opts.checkBudget(model, opts.kvFormats(), ctx, "the longest probe (" + longest + " tokens, + --max-new "
                    + maxNew + ")");
            try (Session session = new Session(backend, ctx, opts.kvFormats(), opts.prefillChunk(backend))) {
                int[] done = {0, 0};
                long t0 = System.nanoTime();
                NeedleEval.Result r = NeedleEval.run(session, tok, list, maxNew, o -> {
                    done[0]++;
                    done[1] += o.correct() ? 1 : 0;
                    if (verbose) {
                        progress.done();
                        System.err.printf(Locale.ROOT, "%s %s got %s%n", o.probe().id(), o.correct() ? "ok  " : "FAIL",
                                escape(o.got()));
                    }
                    double s = (System.nanoTime() - t0) / 1e9;
                    progress.update(String.format(Locale.ROOT, "probe %d/%d, %d correct, %.0f s", done[0], list.size(),
                            done[1], s));
                });
                progress.done();
                if (json) {
                    System.out.println(r.toJson());
                } else {
                    System.out.printf(Locale.ROOT, "model %s, kv %s, %s, %d probes, %.0f s%n%n", model.name(),
                            opts.kvFormats().name(), selectOpts.describe(), list.size(), (System.nanoTime() - t0) / 1e9);
                    System.out.print(r.table());
                }
            }
            if (dump != null) {
                dump.commit();
            }
        }
    }

    private List<NeedleProbe> fromFile() {
        List<String> lines = TextFiles.lines(probes);
        // --lengths and --depths, when given, pick cells of the file (their defaults are for pass-key probes)
        Set<Integer> pickLengths = null;
        Set<Integer> pickDepths = null;
        if (spec.commandLine().getParseResult().hasMatchedOption("--lengths")) {
            pickLengths = new HashSet<>();
            for (String l : lengths) {
                pickLengths.add(parseLength(l));
            }
        }
        if (spec.commandLine().getParseResult().hasMatchedOption("--depths")) {
            pickDepths = new HashSet<>();
            for (int d : depths) {
                pickDepths.add(d);
            }
        }
        List<NeedleProbe> out = new ArrayList<>();
        Map<String, Integer> perCellSeen = new HashMap<>();
        java.util.TreeSet<Integer> fileLengths = new java.util.TreeSet<>();
        java.util.TreeSet<Integer> fileDepths = new java.util.TreeSet<>();
        for (int i = 0; i < lines.size(); i++) {
            if (lines.get(i).isBlank()) {
                continue;
            }
            NeedleProbe p;
            try {
                p = NeedleProbe.parse(lines.get(i));
            } catch (IllegalArgumentException e) {
                throw new IllegalArgumentException(probes + ", line " + (i + 1) + ": " + e.getMessage(), e);
            }
            fileLengths.add(p.length());
            fileDepths.add((int) Math.round(p.depth() * 100));
            if (pickLengths != null && !pickLengths.contains(p.length())
                    || pickDepths != null && !pickDepths.contains((int) Math.round(p.depth() * 100))) {
                continue;
            }
            int seen = perCellSeen.merge(p.length() + "/" + p.depth(), 1, Integer::sum);
            if (perCell <= 0 || seen <= perCell) {
                out.add(p);
            }
        }
        if (out.isEmpty() && !fileLengths.isEmpty()) {   // the cells picked are none of the file's
            throw new IllegalArgumentException("no probe of " + probes + " is in the cells --lengths and --depths"
                    + " pick: its probes have lengths " + join(fileLengths) + " and depths " + join(fileDepths));
        }
        return out;
    }

    private static String join(java.util.Collection<Integer> values) {
        return values.stream().map(String::valueOf).collect(java.util.stream.Collectors.joining(","));
    }

    private List<NeedleProbe> passKeys(LlamaModel model, Tokenizer tok) {
        String text = TextFiles.read(haystack);
        ChatTemplate template = ChatTemplate.detect(model.chatTemplate(), chatTemplate);
        SplittableRandom rnd = new SplittableRandom(seed);
        int n = perCell > 0 ? perCell : 4;
        List<NeedleProbe> out = new ArrayList<>();
        for (String l : lengths) {
            int length = parseLength(l);
            for (int d : depths) {
                if (d < 0 || d > 100) {
                    throw new UsageException("--depths: " + d + " is not a percentage");
                }
                for (int k = 0; k < n; k++) {
                    out.add(NeedleProbe.passKey(tok, template, text, length, d / 100.0, rnd, k));
                }
            }
        }
        return out;
    }

    static int parseLength(String s) {
        String t = s.strip().toLowerCase(Locale.ROOT);
        int mult = 1;
        if (t.endsWith("k")) {
            mult = 1024;
            t = t.substring(0, t.length() - 1);
        } else if (t.endsWith("m")) {
            mult = 1024 * 1024;
            t = t.substring(0, t.length() - 1);
        }
        try {
            int v = Integer.parseInt(t);
            if (v <= 0) {
                throw new NumberFormatException();
            }
            return Math.multiplyExact(v, mult);
        } catch (NumberFormatException | ArithmeticException e) {
            throw new UsageException("--lengths: cannot read '" + s + "' as a token count (e.g. 8k, 32768)");
        }
    }

    private static String escape(String s) {
        return "'" + s.replace("\n", "\\n") + "'";
    }
}
