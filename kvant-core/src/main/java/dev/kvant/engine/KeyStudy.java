package dev.kvant.engine;

import dev.kvant.kv.Codebook;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.kv.Rotation;
import dev.kvant.kv.TurboFormat;
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
import java.util.SplittableRandom;
import java.util.concurrent.ConcurrentHashMap;
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
 *   VMODE cache (the default): V rows go to a cache of FORMAT as usual
 *   -Dkvant.study.pairs=trained|product [-Dkvant.study.group=2|4]: turbo rows through a codebook of groups
 *   -Dkvant.study.vgain=lsq: with pairs, V rows keep the least-squares gain</pre>
 */
public final class KeyStudy {
    /** Positions per mean block (64: a page); -Dkvant.study.block=N studies other sizes. */
    private static final int BLOCK = Integer.getInteger("kvant.study.block", 64);
    /** Positions kept exact at the start of a sequence (attention sinks); -Dkvant.study.sink=N studies them. */
    private static final int SINK = Integer.getInteger("kvant.study.sink", 0);
    /** The same for V rows passed through a format; -Dkvant.study.vsink=N (default: as K). */
    private static final int VSINK = Integer.getInteger("kvant.study.vsink", SINK);
    /**
     * A codebook for groups of a turbo format's rotated values, in place of the format's encoder
     * ({@code -Dkvant.study.pairs=trained|product}): the block's unit vector is cut into groups of {@link #GROUP}
     * consecutive values (pairs by default), each group goes to the nearest of 2^(GROUP·bits) points, and the block
     * keeps its corrected norm (norm / length of the decoded unit vector, through fp16). "product": the points are
     * the scalar codebook's centroid tuples, so the codes are the format's nearest centroids without its gain
     * search; "trained": Lloyd iterations on groups of a uniform unit vector's coordinates move them to the
     * groups' own optimum. The study of a format change (docs/KV_FORMATS.md), not a format: nothing else reads
     * these codes.
     */
    private static final String PAIRS = System.getProperty("kvant.study.pairs", "");
    /** Coordinates a point of {@link #PAIRS} covers: 2 (pairs), or 4 ({@code -Dkvant.study.group=4}). */
    private static final int GROUP = Integer.getInteger("kvant.study.group", 2);
    /**
     * The gain {@link #PAIRS} stores for V rows ({@code -Dkvant.study.vgain=lsq}): the least-squares one, norm · cos
     * / length of the decoded unit vector, in place of the length-exact norm / length (keys keep that one).
     */
    private static final boolean V_LSQ = "lsq".equals(System.getProperty("kvant.study.vgain", ""));

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
        Through k = new Through(format, kMode, layers, kvHeads, headDimK, SINK, false);
        Through v = vMode == null ? null : new Through(format, vMode, layers, kvHeads, headDimV, VSINK, V_LSQ);
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
        private final PairCodebook pairs;
        private final boolean lsq;

        Through(KvFormat format, Mode mode, int layers, int heads, int dim, int sink, boolean lsq) {
            this.sink = sink;
            this.lsq = lsq;
            this.pairs = PAIRS.isEmpty() ? null : PairCodebook.of(format, PAIRS, Rotation.blockSize(dim));
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
                    if (pairs != null) {
                        pairs.through(centered, dim, row, lsq);
                    } else {
                        format.encode(centered, 0, dim, buf, 0);
                        format.decode(buf, 0, dim, row, 0);
                    }
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

    /** {@link #PAIRS}: 2^(D·bits) points for groups of D coordinates of a unit vector in blocks of n. */
    private record PairCodebook(float[][] points, int d, int n) {
        /** Built once per format and block size: K's and V's rows share it when both pass through. */
        private static final Map<String, PairCodebook> BUILT = new ConcurrentHashMap<>();

        static PairCodebook of(KvFormat format, String kind, int n) {
            return BUILT.computeIfAbsent(format.name() + "/" + kind + "/" + n, key -> build(format, kind, n));
        }

        private static PairCodebook build(KvFormat format, String kind, int n) {
            if (!(format instanceof TurboFormat t)) {
                throw new IllegalArgumentException("kvant.study.pairs needs a turbo format, got " + format.name());
            }
            int d = GROUP;
            float[] c = Codebook.sphere(t.bits(), n).centroidsAsFloat();
            int m = 1;
            for (int i = 0; i < d; i++) {
                m *= c.length;
            }
            float[][] points = new float[m][d];
            for (int k = 0; k < m; k++) {
                for (int i = 0, r = k; i < d; i++, r /= c.length) {
                    points[k][i] = c[r % c.length];
                }
            }
            if (kind.equals("trained")) {
                train(points, d, n);
            } else if (!kind.equals("product")) {
                throw new IllegalArgumentException("kvant.study.pairs is trained or product, got " + kind);
            }
            double mse = 0;
            float[] u = sample(n, 20_000 * d, 7);
            for (int i = 0; i < u.length; i += d) {
                float[] p = points[nearest(points, u, i)];
                for (int j = 0; j < d; j++) {
                    mse += (u[i + j] - p[j]) * (u[i + j] - p[j]);
                }
            }
            System.err.printf(Locale.ROOT, "%d-d codebook %s, %d points: %.5f squared error a value (x n: %.5f)%n",
                    d, kind, m, mse / u.length, mse / u.length * n);
            return new PairCodebook(points, d, n);
        }

        /** Lloyd iterations from the product codebook on groups of a uniform unit vector's coordinates. */
        private static void train(float[][] points, int d, int n) {
            float[] u = sample(n, Math.max(200_000, 400 * points.length) * d, 3);
            int m = points.length;
            for (int it = 0; it < 60; it++) {
                double[][] sum = new double[m][d];
                int[] count = new int[m];
                for (int i = 0; i < u.length; i += d) {
                    int k = nearest(points, u, i);
                    for (int j = 0; j < d; j++) {
                        sum[k][j] += u[i + j];
                    }
                    count[k]++;
                }
                for (int k = 0; k < m; k++) {
                    for (int j = 0; j < d && count[k] > 0; j++) {
                        points[k][j] = (float) (sum[k][j] / count[k]);
                    }
                }
            }
        }

        /** `values` coordinates of Gaussian vectors of n, each normalized (a uniform unit vector's). */
        private static float[] sample(int n, int values, long seed) {
            SplittableRandom r = new SplittableRandom(seed);
            float[] u = new float[values];
            double[] g = new double[n];
            for (int at = 0; at < u.length; ) {
                double norm = 0;
                for (int i = 0; i < n; i++) {
                    g[i] = r.nextGaussian();
                    norm += g[i] * g[i];
                }
                norm = Math.sqrt(norm);
                for (int i = 0; i < n && at < u.length; i++) {
                    u[at++] = (float) (g[i] / norm);
                }
            }
            return u;
        }

        private static int nearest(float[][] points, float[] u, int at) {
            int best = 0;
            float bd = Float.POSITIVE_INFINITY;
            for (int k = 0; k < points.length; k++) {
                float dist = 0;
                for (int j = 0; j < points[k].length; j++) {
                    float e = u[at + j] - points[k][j];
                    dist += e * e;
                }
                if (dist < bd) {
                    bd = dist;
                    best = k;
                }
            }
            return best;
        }

        /** One row (unrotated, dim values) into rotated-domain values in {@code out}, as the format's decode gives. */
        void through(float[] src, int dim, float[] out, boolean lsq) {
            int padded = Rotation.paddedDim(dim);
            System.arraycopy(src, 0, out, 0, dim);
            Rotation.forwardRow(out, 0, dim);
            float[] u = new float[n];
            for (int b = 0; b < padded; b += n) {
                double s = 0;
                for (int i = b; i < b + n; i++) {
                    s += (double) out[i] * out[i];
                }
                s = Math.sqrt(s);
                for (int i = 0; i < n; i++) {
                    u[i] = s > 0 ? (float) (out[b + i] / s) : 0f;
                }
                double len = 0, dot = 0;
                for (int i = 0; i < n; i += d) {
                    float[] p = points[nearest(points, u, i)];
                    for (int j = 0; j < d; j++) {
                        out[b + i + j] = p[j];
                        len += (double) p[j] * p[j];
                        dot += (double) p[j] * u[i + j];
                    }
                }
                double g = lsq ? s * dot / len : s / Math.sqrt(len);
                float gain = Float.float16ToFloat(Float.floatToFloat16((float) g));
                for (int i = b; i < b + n; i++) {
                    out[i] *= gain;
                }
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
