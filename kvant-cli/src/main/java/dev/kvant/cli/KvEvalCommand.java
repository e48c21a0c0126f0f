package dev.kvant.cli;

import dev.kvant.engine.Session;
import dev.kvant.kv.HalfFormat;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvEval;
import dev.kvant.kv.KvFormat;
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
                ModelRows kv = modelRows(m);
                // the outlier queries weigh the channel pairs this model's RoPE rotates together
                boolean neox = geometry.rope().mode() == dev.kvant.model.Rope.Mode.NEOX;
                for (int which = 0; which < 2; which++) {
                    int d = which == 0 ? geometry.headDimK() : geometry.headDimV();
                    // keys also with the model's own queries (a value's error reaches the output through the
                    // probabilities, not a logit)
                    KvEval.ModelQueries q = which == 0 ? kv.queries() : null;
                    for (KvEval.Row r : KvEval.evaluate(formats, which == 0 ? kv.k() : kv.v(), d, seed, "model", neox,
                            q)) {
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
                for (KvEval.Row r : KvEval.evaluateCentered(centered, kv.k(), geometry.layers(), geometry.kvHeads(),
                        geometry.headDimK(), seed, "model", neox, kv.queries())) {
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

    /** Query positions a layer's model queries are taken at, spread evenly over the text. */
    static final int QUERY_POSITIONS = 16;

    /** The K and V rows a model wrote ([layer][position][kv head]) and queries of its layers. */
    record ModelRows(float[][] k, float[][] v, KvEval.ModelQueries queries) {
    }

    /**
     * Reads the text and returns every K row and every V row the model wrote, as the model computed them (taken
     * before the cache stores them, so exact), and the queries of {@value #QUERY_POSITIONS} positions spread over the
     * text, each layer's query heads grouped by the kv head they attend with.
     */
    private ModelRows modelRows(LlamaModel m) {
        String text = TextFiles.read(file);
        int[] ids = m.tokenizer().encode(text, true, false);
        int n = Math.min(tokens, Math.min(ids.length, m.config().contextLength()));
        if (n < 2) {
            throw new IllegalArgumentException(file + " has " + ids.length + " token(s): kv-eval needs at least 2");
        }
        tokensRead = n;
        ModelConfig c = m.config();
        int kvHeads = c.kvHeads(), group = c.heads() / kvHeads, dK = c.headDimK(), dV = c.headDimV();
        int positions = Math.min(QUERY_POSITIONS, n);
        float[][] k = new float[c.layers() * kvHeads * n][dK];
        float[][] v = new float[c.layers() * kvHeads * n][dV];
        float[][][][] q = new float[c.layers()][kvHeads][positions * group][dK];
        int[] slot = new int[n];   // the query slot of a sampled position: the last of each of equal spans
        Arrays.fill(slot, -1);
        for (int j = 0; j < positions; j++) {
            slot[(int) ((long) (j + 1) * n / positions) - 1] = j;
        }
        KvFormat f16 = KvFormat.parse("f16");
        m.setKvRowHook((seq, layer, position, count, qs, qOffset, ks, kOffset, vs, vOffset) -> {
            for (int t = 0; t < count; t++) {
                int pos = position + t;
                for (int h = 0; h < kvHeads; h++) {
                    int row = (layer * n + pos) * kvHeads + h;
                    System.arraycopy(ks, kOffset + (t * kvHeads + h) * dK, k[row], 0, dK);
                    System.arraycopy(vs, vOffset + (t * kvHeads + h) * dV, v[row], 0, dV);
                }
                int j = slot[pos];
                if (j >= 0) {
                    for (int hq = 0; hq < kvHeads * group; hq++) {
                        System.arraycopy(qs, qOffset + (t * kvHeads * group + hq) * dK,
                                q[layer][hq / group][j * group + hq % group], 0, dK);
                    }
                }
            }
        });
        try (Parallel pool = new Parallel(threads); Session s = new Session(m, n, f16, f16, 512, pool)) {
            s.prefill(Arrays.copyOf(ids, n));
        } finally {
            m.setKvRowHook(null);
        }
        return new ModelRows(k, v, new KvEval.ModelQueries(q, n, kvHeads));
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
                                + "\"ip_err_rel\":%.6e,\"ip_err_rel_outlier_q\":%.6e,\"ip_err_rel_model_q\":%s,"
                                + "\"source\":\"%s\",\"tensor\":\"%s\"}",
                        r.format(), r.bitsPerValue(),
                        l.bytesPerToken() < 0 ? "null" : Long.toString(l.bytesPerToken()),   // no model: none
                        r.mseRel(), r.ipErrRel(), r.ipErrRelOutlierQ(),
                        Double.isNaN(r.ipErrRelModelQ()) ? "null"   // no model queries (random rows, V rows)
                                : String.format(Locale.ROOT, "%.6e", r.ipErrRelModelQ()),
                        l.source(), l.tensor()));
            }
            System.out.println(sb.append("\n]"));
            return;
        }
        System.out.printf(Locale.ROOT, "kv-format v%d; random rows: %d x head_dim %d, seed %d%s%n", KvFormat.VERSION,
                rows, headDim, seed, geometry != null ? "; model rows: " + model + ", " + tokensRead + " tokens of "
                        + file : "");
        System.out.println();
        System.out.println("| format | source | tensor | bits/value | bytes/token | rel. MSE | rel. IP error "
                + "| IP error, outlier q | IP error, model's q | paper: unit-vector MSE |");
        System.out.println("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (Line l : lines) {
            KvEval.Row r = l.row();
            String paper = switch (r.format()) {
                case "turbo2" -> String.format(Locale.ROOT, "%.4f", KvEval.lloydMaxGaussianMse(2));
                case "turbo3" -> String.format(Locale.ROOT, "%.4f", KvEval.lloydMaxGaussianMse(3));
                case "turbo4" -> String.format(Locale.ROOT, "%.4f", KvEval.lloydMaxGaussianMse(4));
                default -> "";
            };
            System.out.printf(Locale.ROOT, "| %s | %s | %s | %.3f | %s | %.3e | %.3e | %.3e | %s | %s |%n", r.format(),
                    l.source(), l.tensor(), r.bitsPerValue(), l.bytesPerToken() < 0 ? "" : l.bytesPerToken(),
                    r.mseRel(), r.ipErrRel(), r.ipErrRelOutlierQ(), Double.isNaN(r.ipErrRelModelQ()) ? ""
                            : String.format(Locale.ROOT, "%.3e", r.ipErrRelModelQ()), paper);
        }
        System.out.println();
        System.out.println("paper bound sqrt(3)*pi/2*4^-b: " + String.format(Locale.ROOT, "2 bits %.4f, 3 bits %.4f, "
                + "4 bits %.4f", KvEval.paperMseBound(2), KvEval.paperMseBound(3), KvEval.paperMseBound(4)));
    }
}
