package dev.kvant.engine;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.model.KvRowHook;
import dev.kvant.model.LlamaModel;
import dev.kvant.tensor.Parallel;
import dev.kvant.tokenizer.Tokenizer;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Collections;
import java.util.Locale;
import java.util.Map;
import java.util.WeakHashMap;

/**
 * A study of KV encodings by perplexity: every K row (and, when asked, every V row) passes through a format's encode
 * and decode, optionally centered on a mean first, the mean given back exactly after decoding; the cache then stores
 * the rows losslessly enough (K q8_0, V f16) that the perplexity shows what the format costs on that side and what
 * an offset would win back. Softmax is invariant to an offset shared by the keys of one query's sum, so a cache may
 * store k − μ and give q·μ back; an attention output is a convex sum of values, so a V offset comes back as μ.
 * docs/KV_FORMATS.md records the results.
 *
 * <pre>java ... dev.kvant.engine.KeyStudy MODEL.gguf TEXT FORMAT KMODE [VMODE|cache] [ctx 4096] [chunks 16] [threads 2]
 *   KMODE, VMODE: none | prev64 | block64 | first64 | first512   (see {@link Mode})
 *   VMODE cache (the default): V rows go to a cache of FORMAT as usual</pre>
 */
public final class KeyStudy {
    /** Positions per mean block (64: a page); -Dkvant.study.block=N studies other sizes. */
    private static final int BLOCK = Integer.getInteger("kvant.study.block", 64);
    /** Positions kept exact at the start of a sequence (attention sinks); -Dkvant.study.sink=N studies them. */
    private static final int SINK = Integer.getInteger("kvant.study.sink", 0);
    /** The same for V rows passed through a format; -Dkvant.study.vsink=N (default: as K). */
    private static final int VSINK = Integer.getInteger("kvant.study.vsink", SINK);

    private KeyStudy() {
    }

    /** How a row is centered before the format's encode. */
    public enum Mode {
        /** not at all */
        NONE,
        /** on the mean of the previous 64 positions' rows as stored (decoded), 0 for the first 64 */
        PREV64,
        /** on the mean of its 64-position block's own rows (needs the block whole: writes of 64 rows) */
        BLOCK64,
        /** on one mean per sequence, of the rows 1..64 of its first write (position 0, a sink, left out) */
        FIRST64,
        /** the same over rows 1..511 */
        FIRST512
    }

    /** The hook: K rows through {@code format} centered per {@code kMode}; V rows too unless {@code vMode} is null. */
    public static KvRowHook hook(KvFormat format, Mode kMode, Mode vMode, int layers, int kvHeads, int headDimK,
                                 int headDimV) {
        Through k = new Through(format, kMode, layers, kvHeads, headDimK, SINK);
        Through v = vMode == null ? null : new Through(format, vMode, layers, kvHeads, headDimV, VSINK);
        return (seq, layer, position, n, q, qOffset, kRows, kOffset, vRows, vOffset) -> {
            k.apply(seq, layer, position, n, kRows, kOffset);
            if (v != null) {
                v.apply(seq, layer, position, n, vRows, vOffset);
            }
        };
    }

    /** Rows of one side through a format, centered; state per sequence and layer. */
    private static final class Through {
        private final KvFormat format;
        private final Mode mode;
        private final int layers;
        private final int heads;
        private final int dim;
        private final Map<KvSequence, double[][]> sums = Collections.synchronizedMap(new WeakHashMap<>());
        private final Map<KvSequence, float[][]> means = Collections.synchronizedMap(new WeakHashMap<>());

        private final int sink;

        Through(KvFormat format, Mode mode, int layers, int heads, int dim, int sink) {
            this.sink = sink;
            this.format = format;
            this.mode = mode;
            this.layers = layers;
            this.heads = heads;
            this.dim = dim;
        }

        void apply(KvSequence seq, int layer, int position, int n, float[] x, int offset) {
            int width = heads * dim;
            double[] sum = sums.computeIfAbsent(seq, s -> new double[layers][width + 1])[layer];
            float[] fixed = means.computeIfAbsent(seq, s -> new float[layers][width])[layer];
            if (position == 0) {
                Arrays.fill(sum, 0);
                Arrays.fill(fixed, 0f);
                if (mode == Mode.FIRST64 || mode == Mode.FIRST512) {
                    int upto = Math.min(n, mode == Mode.FIRST64 ? 65 : 512);
                    for (int u = 1; u < upto; u++) {
                        for (int i = 0; i < width; i++) {
                            fixed[i] += x[offset + u * width + i] / (upto - 1);
                        }
                    }
                }
            }
            MemorySegment buf = MemorySegment.ofArray(new byte[(int) format.rowBytes(dim)]);
            float[] row = new float[format.domainDim(dim)];
            float[] centered = new float[dim];
            float[] mu = new float[width];
            for (int t = 0; t < n; t++) {
                int p = position + t;
                int o = offset + t * width;
                if (mode == Mode.PREV64 && p % BLOCK == 0 && p > 0 && sum[width] > 0) {
                    for (int i = 0; i < width; i++) {
                        fixed[i] = (float) (sum[i] / sum[width]);
                    }
                    Arrays.fill(sum, 0);
                }
                if (mode == Mode.BLOCK64) {
                    if (t == 0 || p % BLOCK == 0) {
                        // the mean of this row's block within this write (its rows from p to the block's end)
                        int end = Math.min(n, t + BLOCK - p % BLOCK);
                        Arrays.fill(mu, 0f);
                        for (int u = t; u < end; u++) {
                            for (int i = 0; i < width; i++) {
                                mu[i] += x[offset + u * width + i] / (end - t);
                            }
                        }
                    }
                } else if (mode != Mode.NONE) {
                    System.arraycopy(fixed, 0, mu, 0, width);
                }
                for (int h = 0; h < heads && p >= sink; h++) {
                    for (int i = 0; i < dim; i++) {
                        centered[i] = x[o + h * dim + i] - mu[h * dim + i];
                    }
                    format.encode(centered, 0, dim, buf, 0);
                    format.decode(buf, 0, dim, row, 0);
                    format.unrotate(row, 0, dim);
                    for (int i = 0; i < dim; i++) {
                        x[o + h * dim + i] = row[i] + mu[h * dim + i];
                    }
                }
                for (int i = 0; i < width; i++) {
                    sum[i] += x[o + i];
                }
                sum[width] += 1;
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: KeyStudy MODEL.gguf TEXT FORMAT KMODE [VMODE|cache] [ctx] [chunks] [threads]");
            System.exit(2);
        }
        KvFormat format = KvFormat.parse(args[2]);
        Mode kMode = mode(args[3]);
        Mode vMode = args.length > 4 && !args[4].equals("cache") ? mode(args[4]) : null;
        int ctx = args.length > 5 ? Integer.parseInt(args[5]) : 4096;
        int chunks = args.length > 6 ? Integer.parseInt(args[6]) : 16;
        int threads = args.length > 7 ? Integer.parseInt(args[7]) : 2;
        try (LlamaModel model = LlamaModel.load(Path.of(args[0])); Parallel pool = new Parallel(threads)) {
            var c = model.config();
            model.setKvRowHook(hook(format, kMode, vMode, c.layers(), c.kvHeads(), c.headDimK(), c.headDimV()));
            Tokenizer tok = model.tokenizer();
            int[] tokens = tok.encode(Files.readString(Path.of(args[1])), true, false);
            // block64 sees whole blocks when prompts are written in chunks of 64
            int chunk = kMode == Mode.BLOCK64 || vMode == Mode.BLOCK64 ? BLOCK : 512;
            KvFormat vCache = vMode == null ? format : KvFormat.parse("f16");
            try (Session s = new Session(model, ctx, KvFormat.parse("q8_0"), vCache, chunk, pool)) {
                Perplexity.Result r = Perplexity.evaluate(s, tokens, ctx, tok.addBos() ? tok.bos() : -1, chunks,
                        done -> { });
                System.out.printf(Locale.ROOT, "K through %s, %s; V %s: PPL %.4f ± %.4f (%d chunks of %d, %.1f s)%n",
                        format.name(), args[3], vMode == null ? "cache" : "through it, " + args[4], r.ppl(),
                        r.pplError(), r.chunks(), ctx, r.seconds());
            }
        }
    }

    private static Mode mode(String name) {
        return Mode.valueOf(name.toUpperCase(Locale.ROOT));
    }
}
