package dev.kvant.cli;

import dev.kvant.engine.Session;
import dev.kvant.kv.HalfFormat;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvEval;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

/** The error of every KV format, on random rows and on the rows a real model writes. */
@Command(name = "kv-eval", mixinStandardHelpOptions = true,
        description = {"Measure every KV cache format's bits, bytes per token and error.",
                "Relative MSE and relative inner-product error, on Gaussian rows and (with -m and -f) on the K and V",
                "rows a model writes."})
final class KvEvalCommand implements Runnable {

    @Option(names = "--head-dim", paramLabel = "N", defaultValue = "128",
            description = "head size of the random rows (default ${DEFAULT-VALUE})")
    int headDim;

    @Option(names = "--rows", paramLabel = "N", defaultValue = "4096", description = "random rows (default ${DEFAULT-VALUE})")
    int rows;

    @Option(names = "--seed", paramLabel = "S", defaultValue = "42", description = "seed (default ${DEFAULT-VALUE})")
    long seed;

    @Option(names = {"-m", "--model"}, paramLabel = "GGUF", description = "model whose K/V rows to measure")
    Path model;

    @Option(names = {"-f", "--file"}, paramLabel = "TEXT", description = "text the model reads (UTF-8)")
    Path file;

    @Option(names = "--tokens", paramLabel = "N", defaultValue = "2048",
            description = "tokens of the text to read (default ${DEFAULT-VALUE})")
    int tokens;

    @Option(names = {"-t", "--threads"}, paramLabel = "N", description = "worker threads")
    int threads = Runtime.getRuntime().availableProcessors();

    /** Tokens of the text the model read (at most --tokens). */
    private int tokensRead;

    @Option(names = "--json", description = "print a JSON array")
    boolean json;

    /** One printed row: a format's figures on one row set. */
    record Line(KvEval.Row row, String source, String tensor, long bytesPerToken) {
    }

    @Override
    public void run() {
        if ((model == null) != (file == null)) {
            throw new UsageException("give -m and -f together (the model reads the text)");
        }
        if (rows < 1 || headDim < 1 || tokens < 2) {
            throw new UsageException("--rows, --head-dim must be positive and --tokens at least 2");
        }
        ModelOptions.checkThreads(threads);
        List<KvFormat> formats = KvFormat.all();
        List<Line> lines = new ArrayList<>();
        ModelConfig geometry = null;
        if (model != null) {
            try (LlamaModel m = LlamaModel.load(model)) {
                geometry = m.config();
                float[][][] kv = modelRows(m);
                // the outlier queries weigh the channel pairs this model's RoPE rotates together
                boolean neox = geometry.rope().mode() == dev.kvant.model.Rope.Mode.NEOX;
                for (int which = 0; which < 2; which++) {
                    int d = which == 0 ? geometry.headDimK() : geometry.headDimV();
                    for (KvEval.Row r : KvEval.evaluate(formats, kv[which], d, seed, "model", neox)) {
                        lines.add(new Line(r, "model", which == 0 ? "k" : "v", bytesPerToken(geometry, r.format())));
                    }
                }
                // keys centered on their page's mean: the K rows through a cache of each quantized format + mean
                List<KvFormat> centered = new ArrayList<>();
                for (KvFormat f : formats) {
                    if (!(f instanceof HalfFormat)) {
                        centered.add(new PageMeanFormat(f));
                    }
                }
                for (KvEval.Row r : KvEval.evaluateCentered(centered, kv[0], geometry.layers(), geometry.kvHeads(),
                        geometry.headDimK(), seed, "model", neox)) {
                    lines.add(new Line(r, "model", "k", bytesPerToken(geometry, r.format())));
                }
            }
        }
        float[][] random = KvEval.gaussianRows(rows, headDim, seed);
        for (KvEval.Row r : KvEval.evaluate(formats, random, headDim, seed + 1, "gaussian")) {
            lines.add(new Line(r, "gaussian", "-", geometry != null ? bytesPerToken(geometry, r.format()) : -1));
        }
        print(lines, geometry);
    }

    /** Reads the text with an f16 cache and returns every K row and every V row the model wrote. */
    private float[][][] modelRows(LlamaModel m) {
        String text = TextFiles.read(file);
        int[] ids = m.tokenizer().encode(text, true, false);
        int n = Math.min(tokens, Math.min(ids.length, m.config().contextLength()));
        if (n < 2) {
            throw new IllegalArgumentException(file + " has " + ids.length + " token(s): kv-eval needs at least 2");
        }
        tokensRead = n;
        ModelConfig c = m.config();
        KvFormat f16 = KvFormat.parse("f16");
        try (Parallel pool = new Parallel(threads); Session s = new Session(m, n, f16, f16, 512, pool)) {
            s.prefill(Arrays.copyOf(ids, n));
            KvSequence seq = s.sequence();
            int count = c.layers() * c.kvHeads() * n;
            float[][] k = new float[count][c.headDimK()];
            float[][] v = new float[count][c.headDimV()];
            int i = 0;
            for (int l = 0; l < c.layers(); l++) {
                for (int pos = 0; pos < n; pos++) {
                    for (int h = 0; h < c.kvHeads(); h++, i++) {
                        seq.decodeK(l, pos, h, k[i], 0);
                        seq.decodeV(l, pos, h, v[i], 0);
                    }
                }
            }
            return new float[][][] {k, v};
        }
    }

    private static long bytesPerToken(ModelConfig c, String format) {
        KvFormat f = KvFormat.parse(format);
        return KvCache.bytesPerToken(new dev.kvant.kv.KvGeometry(c.layers(), c.kvHeads(), c.headDimK(),
                c.headDimV()), f, PageMeanFormat.rows(f));   // K and V alike (a centered K: its rows' V)
    }

    private void print(List<Line> lines, ModelConfig geometry) {
        if (json) {
            StringBuilder sb = new StringBuilder("[");
            for (int i = 0; i < lines.size(); i++) {
                Line l = lines.get(i);
                KvEval.Row r = l.row();
                sb.append(i == 0 ? "\n  " : ",\n  ").append(String.format(Locale.ROOT,
                        "{\"format\":\"%s\",\"bits_per_value\":%.4f,\"bytes_per_token\":%s,\"mse_rel\":%.6e,"
                                + "\"ip_err_rel\":%.6e,\"ip_err_rel_outlier_q\":%.6e,\"source\":\"%s\","
                                + "\"tensor\":\"%s\"}",
                        r.format(), r.bitsPerValue(),
                        l.bytesPerToken() < 0 ? "null" : Long.toString(l.bytesPerToken()),   // no model: none
                        r.mseRel(), r.ipErrRel(), r.ipErrRelOutlierQ(), l.source(), l.tensor()));
            }
            System.out.println(sb.append("\n]"));
            return;
        }
        System.out.printf(Locale.ROOT, "kv-format v%d; random rows: %d x head_dim %d, seed %d%s%n", KvFormat.VERSION,
                rows, headDim, seed, geometry != null ? "; model rows: " + model + ", " + tokensRead + " tokens of "
                        + file : "");
        System.out.println();
        System.out.println("| format | source | tensor | bits/value | bytes/token | rel. MSE | rel. IP error "
                + "| IP error, outlier q | paper: unit-vector MSE |");
        System.out.println("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (Line l : lines) {
            KvEval.Row r = l.row();
            String paper = switch (r.format()) {
                case "turbo2" -> String.format(Locale.ROOT, "%.4f", KvEval.lloydMaxGaussianMse(2));
                case "turbo3" -> String.format(Locale.ROOT, "%.4f", KvEval.lloydMaxGaussianMse(3));
                case "turbo4" -> String.format(Locale.ROOT, "%.4f", KvEval.lloydMaxGaussianMse(4));
                default -> "";
            };
            System.out.printf(Locale.ROOT, "| %s | %s | %s | %.3f | %s | %.3e | %.3e | %.3e | %s |%n", r.format(),
                    l.source(), l.tensor(), r.bitsPerValue(), l.bytesPerToken() < 0 ? "" : l.bytesPerToken(),
                    r.mseRel(), r.ipErrRel(), r.ipErrRelOutlierQ(), paper);
        }
        System.out.println();
        System.out.println("paper bound sqrt(3)*pi/2*4^-b: " + String.format(Locale.ROOT, "2 bits %.4f, 3 bits %.4f, "
                + "4 bits %.4f", KvEval.paperMseBound(2), KvEval.paperMseBound(3), KvEval.paperMseBound(4)));
    }
}
