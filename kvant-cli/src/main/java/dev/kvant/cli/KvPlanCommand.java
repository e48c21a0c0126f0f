package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.engine.Perplexity;
import dev.kvant.engine.Session;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.kv.KvLayerPlan;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.tensor.Parallel;
import dev.kvant.tokenizer.Tokenizer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Spends the cache's bytes unevenly over the layers where a text says it pays ({@link KvLayerPlan}): each layer's K
 * and V one turbo format richer and one leaner are scored alone by perplexity, the best gains paired with the
 * cheapest losses of the same bytes, and the plan measured as a whole — on a second text too with {@code --check}.
 * Prints the options that make the plan.
 */
@Command(name = "kv-plan", mixinStandardHelpOptions = true,
        description = "Per-layer K/V formats at the same bytes a token: each layer's turbo K and V one format richer "
                + "and one leaner scored by perplexity, the best gains traded for the cheapest losses.")
final class KvPlanCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Option(names = {"-f", "--file"}, required = true, paramLabel = "FILE",
            description = "text (UTF-8) the changes are scored on")
    Path file;

    @Option(names = "--check", paramLabel = "FILE",
            description = "another text on which the plan and the formats it starts from are measured too: the plan "
                    + "was chosen on FILE, so this says what it is worth on text it has not seen")
    Path check;

    @Option(names = {"-c", "--ctx-size"}, paramLabel = "N", defaultValue = "4096",
            description = "tokens per perplexity chunk (default ${DEFAULT-VALUE}: one layer's change moves the "
                    + "perplexity by tenths of a percent, which short or few chunks cannot resolve)")
    int ctx;

    @Option(names = "--chunks", paramLabel = "N", defaultValue = "16",
            description = "chunks scored for each change (default ${DEFAULT-VALUE}; the plan and --check use as many)")
    int chunks;

    @Option(names = "--z", paramLabel = "Z", defaultValue = "2",
            description = "a trade is made only when its gain, chunk by chunk, is more than Z standard errors of its "
                    + "mean above zero (default ${DEFAULT-VALUE}): the text's chunks, not the changes, must not be "
                    + "what it found")
    double z;

    @Option(names = "--json", description = "print one JSON object")
    boolean json;

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if (ctx < 4) {
            throw new UsageException("-c must be at least 4 (the second half of a chunk is scored), got " + ctx);
        }
        if (chunks < 2) {
            throw new UsageException("--chunks must be at least 2: trades are judged chunk by chunk, got " + chunks);
        }
        if (!(z >= 0)) {
            throw new UsageException("--z must be 0 or more, got " + z);
        }
        opts.checkOptions();
        String text = TextFiles.read(file);
        String checkText = check == null ? null : TextFiles.read(check);
        Progress progress = new Progress(json);
        progress.update("loading " + opts.model);
        try (LlamaModel model = opts.load();
             Parallel pool = new Parallel(opts.threads)) {
            ModelConfig c = model.config();
            int layers = c.layers();
            KvLayerFormats base = opts.kvFormats();
            base.check(layers);
            List<KvLayerPlan.Change> probes = KvLayerPlan.probes(base, layers, c.kvHeads(), c.headDimK(),
                    c.headDimV());
            if (probes.isEmpty()) {
                throw new UsageException("kv-plan trades bits between the turbo formats (turbo2, turbo3, turbo4, with "
                        + "or without +mean); " + base.name() + " has none to trade");
            }
            // before any work: the texts are long enough, and --kv-mem holds the richest run (a richer probe)
            Tokenizer tok = model.tokenizer();
            Text scored = new Text(tok, text);
            Text other = checkText == null ? null : new Text(tok, checkText);
            opts.checkBudget(model, base, ctx, "kv-plan at -c " + ctx);
            for (KvLayerPlan.Change p : probes) {
                opts.checkBudget(model, p.applyTo(base, layers), ctx, "kv-plan at -c " + ctx + " (" + p.option()
                        + ")");
            }
            try (Backend backend = opts.openBackend(model, pool)) {
                plan(model, backend, progress, base, probes, scored, other);
            }
        }
    }

    /**
     * Scores the formats as given and each probe, pairs the trades, measures the plan (and both on the --check text)
     * and prints it all.
     */
    private void plan(LlamaModel model, Backend backend, Progress progress, KvLayerFormats base,
                      List<KvLayerPlan.Change> probes, Text scored, Text other) {
        ModelConfig c = model.config();
        int layers = c.layers();
        Scorer scorer = new Scorer(backend, progress);
        Perplexity.Result given = scorer.score(base, scored, "the formats as given");
        double basePpl = given.ppl();
        List<KvLayerPlan.Scored> results = new ArrayList<>();
        for (int i = 0; i < probes.size(); i++) {
            KvLayerPlan.Change p = probes.get(i);
            results.add(new KvLayerPlan.Scored(p, scorer.score(p.applyTo(base, layers), scored,
                    "change " + (i + 1) + "/" + probes.size() + ": " + p.option()).chunkNll()));
        }
        List<KvLayerPlan.Trade> trades = KvLayerPlan.plan(given.chunkNll(), results, z);
        KvLayerFormats plan = KvLayerPlan.apply(base, trades, layers);
        double planPpl = trades.isEmpty() ? basePpl : scorer.score(plan, scored, "the plan").ppl();
        double checkBase = Double.NaN;
        double checkPlan = Double.NaN;
        if (other != null) {
            checkBase = scorer.score(base, other, "--check, the formats as given").ppl();
            checkPlan = trades.isEmpty() ? checkBase : scorer.score(plan, other, "--check, the plan").ppl();
        }
        progress.done();
        long bytes = Session.kvBytesPerToken(c, base);
        long planBytes = Session.kvBytesPerToken(c, plan);
        String options = options(plan);
        if (json) {
            System.out.println(json(base, basePpl, results, trades, planPpl, bytes, planBytes, options,
                    checkBase, checkPlan));
        } else {
            print(model, base, basePpl, results, trades, planPpl, bytes, planBytes, options, checkBase, checkPlan);
        }
    }

    /** A text tokenized for perplexity, as {@code kvant perplexity} takes it. */
    private final class Text {
        final int[] tokens;
        final int bos;

        Text(Tokenizer tok, String text) {
            int[] t = PerplexityCommand.scoredTokens(tok, text);
            if (t.length < 2 * ctx) {
                throw new UsageException("a text of " + t.length + " tokens is too short for perplexity at -c " + ctx
                        + " (at least " + 2 * ctx + ")");
            }
            this.tokens = t;
            this.bos = tok.addBos() ? tok.bos() : -1;
        }
    }

    /** Perplexity of one text through a fresh session of the given formats (whose budget was checked first). */
    private final class Scorer {
        private final Backend backend;
        private final Progress progress;

        Scorer(Backend backend, Progress progress) {
            this.backend = backend;
            this.progress = progress;
        }

        Perplexity.Result score(KvLayerFormats formats, Text text, String what) {
            progress.update(what);
            try (Session session = new Session(backend, ctx, formats, opts.prefillChunk(backend))) {
                return Perplexity.evaluate(session, text.tokens, ctx, text.bos, chunks, done -> { });
            }
        }
    }

    /**
     * The command-line options of the plan's formats: --ctk and --ctv, then every layer of its own (the given ones,
     * as replaced by the trades), K then V, each by the index it is kept under.
     */
    private static String options(KvLayerFormats plan) {
        StringBuilder s = new StringBuilder("--ctk " + plan.k().name() + " --ctv " + plan.v().name());
        new java.util.TreeMap<>(plan.kLayers()).forEach((l, f) -> s.append(" --ctk-layer ").append(l).append('=')
                .append(f.name()));
        new java.util.TreeMap<>(plan.vLayers()).forEach((l, f) -> s.append(" --ctv-layer ").append(l).append('=')
                .append(f.name()));
        return s.toString();
    }

    private static double pct(double ppl, double base) {
        return 100 * (ppl / base - 1);
    }

    private static void print(LlamaModel model, KvLayerFormats base, double basePpl,
                              List<KvLayerPlan.Scored> results, List<KvLayerPlan.Trade> trades, double planPpl,
                              long bytes, long planBytes, String options, double checkBase, double checkPlan) {
        System.out.printf(Locale.ROOT, "model %s, kv %s, %,d bytes a token: PPL %.4f%n", model.name(), base.name(),
                bytes, basePpl);
        System.out.println("| layer | rows | to | PPL | vs the formats as given |");
        System.out.println("| ---: | --- | --- | ---: | ---: |");
        for (KvLayerPlan.Scored r : results) {
            KvLayerPlan.Change ch = r.change();
            System.out.printf(Locale.ROOT, "| %d | %s | %s | %.4f | %+.2f%% |%n", ch.layer(), ch.side(), ch.to().name(),
                    r.ppl(), pct(r.ppl(), basePpl));
        }
        if (trades.isEmpty()) {
            System.out.println("no trade pays: the formats as given stay");
        }
        for (KvLayerPlan.Trade t : trades) {
            System.out.printf(Locale.ROOT, "trade: %s (%+.2f%%) for %s (%+.2f%%): NLL %.5f ± %.5f a token less%n",
                    t.richer().change().option(), pct(t.richer().ppl(), basePpl), t.leaner().change().option(),
                    pct(t.leaner().ppl(), basePpl), t.meanGain(), t.gainError());
        }
        System.out.printf(Locale.ROOT, "plan: PPL %.4f (%+.2f%%), %,d bytes a token%n", planPpl, pct(planPpl, basePpl),
                planBytes);
        if (planPpl > basePpl) {
            System.out.println("the trades, measured together, lose: keep the formats as given");
        }
        if (!Double.isNaN(checkBase)) {
            System.out.printf(Locale.ROOT, "check: PPL %.4f as given, %.4f planned (%+.2f%%)%n", checkBase, checkPlan,
                    pct(checkPlan, checkBase));
        }
        System.out.println("options: " + options);
    }

    private static String json(KvLayerFormats base, double basePpl, List<KvLayerPlan.Scored> results,
                               List<KvLayerPlan.Trade> trades, double planPpl, long bytes, long planBytes,
                               String options, double checkBase, double checkPlan) {
        StringBuilder s = new StringBuilder();
        s.append(String.format(Locale.ROOT, "{\"kv\":\"%s\",\"bytes_per_token\":%d,\"ppl\":%.6f,\"changes\":[",
                base.name(), bytes, basePpl));
        for (int i = 0; i < results.size(); i++) {
            KvLayerPlan.Scored r = results.get(i);
            s.append(i == 0 ? "" : ",").append(String.format(Locale.ROOT,
                    "{\"layer\":%d,\"rows\":\"%s\",\"to\":\"%s\",\"ppl\":%.6f}", r.change().layer(), r.change().side(),
                    r.change().to().name(), r.ppl()));
        }
        s.append("],\"trades\":[");
        for (int i = 0; i < trades.size(); i++) {
            KvLayerPlan.Trade t = trades.get(i);
            s.append(i == 0 ? "" : ",").append(String.format(Locale.ROOT,
                    "{\"richer\":\"%s\",\"leaner\":\"%s\",\"nll_gain\":%.6f,\"nll_gain_error\":%.6f}",
                    t.richer().change().option(), t.leaner().change().option(), t.meanGain(), t.gainError()));
        }
        s.append(String.format(Locale.ROOT, "],\"plan_ppl\":%.6f,\"plan_bytes_per_token\":%d,\"options\":\"%s\"",
                planPpl, planBytes, options));
        if (!Double.isNaN(checkBase)) {
            s.append(String.format(Locale.ROOT, ",\"check_ppl\":%.6f,\"check_plan_ppl\":%.6f", checkBase, checkPlan));
        }
        return s.append('}').toString();
    }
}
