package dev.kvant.kv;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.SplittableRandom;

/**
 * Measures what a KV format costs and loses on a set of rows (keys or values of one head size):
 * <ul>
 * <li>{@code mseRel} = Σ‖x - x̂‖² / Σ‖x‖² over all rows, x̂ decoded and rotated back to the original domain;</li>
 * <li>{@code ipErrRel} = √(Σ(⟨q,x⟩ - ⟨q,x̂⟩)² / Σ⟨q,x⟩²) over all pairs of rows and {@value #QUERIES} queries:
 * the RMS error of attention logits relative to their RMS. Queries are N(0, I) for {@code ipErrRel}, and for
 * {@code ipErrRelOutlierQ} N(0, diag(s²)) with s = {@value #OUTLIER_SCALE} on two RoPE channel pairs (i, i +
 * headDim/2) and 1 elsewhere, like the massive channels of real queries — the two pairs where the rows themselves
 * hold the most energy, since a model's queries and keys have their massive channels in the same places. For isotropic queries ipErrRel ≈
 * √mseRel; outlier queries weigh the error in those channels, which rotation spreads evenly and per-block
 * scaling does not.</li>
 * <li>{@code ipErrRelModelQ}, for a model's K rows read with its own queries ({@link ModelQueries}): the same ratio
 * over each row and the queries of its layer and kv head (the query heads of its group at positions spread over the
 * text), so the error is weighed exactly as that model's attention logits weigh it; NaN where no queries were
 * given.</li>
 * </ul>
 * The reference figures are the TurboQuant paper's: the Lloyd-Max error per coordinate of a unit Gaussian, which
 * is the expected squared error of a quantized random unit vector, and its general upper bound √3·π/2·4^-b.
 */
public final class KvEval {
    static final int QUERIES = 16;
    static final double OUTLIER_SCALE = 10;

    /** One format's figures on one row set; bitsPerValue counts padding (rowBytes·8/headDim). */
    public record Row(String format, double bitsPerValue, long rowBytes, double mseRel, double ipErrRel,
                      double ipErrRelOutlierQ, double ipErrRelModelQ, String source) {
    }

    /**
     * A model's queries for rows laid out [layer][position][kv head] over {@code positions} positions:
     * {@code queries[layer][kvHead]} are the rows (headDim values, after RoPE, as attention takes them) of the query
     * heads of that kv head's group at the sampled positions.
     */
    public record ModelQueries(float[][][][] queries, int positions, int kvHeads) {
        public ModelQueries {
            if (positions < 1 || kvHeads < 1 || queries.length == 0 || queries[0].length != kvHeads) {
                throw new IllegalArgumentException("model queries: " + queries.length + " layers of "
                        + (queries.length == 0 ? 0 : queries[0].length) + " kv heads for " + kvHeads + " kv heads");
            }
        }

        float[][] of(int row) {
            return queries[row / (positions * kvHeads)][row % kvHeads];
        }
    }

    private KvEval() {
    }

    /** The Lloyd-Max squared error per coordinate of a unit Gaussian at 1..4 bits (Max 1960; the paper's D_mse). */
    public static double lloydMaxGaussianMse(int bits) {
        return switch (bits) {
            case 1 -> 0.3634;
            case 2 -> 0.1175;
            case 3 -> 0.03454;
            case 4 -> 0.009497;
            default -> throw new IllegalArgumentException("reference figures exist for 1 to 4 bits, not " + bits);
        };
    }

    /** The paper's upper bound on the MSE of a b-bit quantized unit vector: √3·π/2·4^-b. */
    public static double paperMseBound(int bits) {
        return Math.sqrt(3) * Math.PI / 2 * Math.pow(4, -bits);
    }

    /** n rows of independent N(0, 1) values. */
    public static float[][] gaussianRows(int n, int headDim, long seed) {
        SplittableRandom rnd = new SplittableRandom(seed);
        float[][] rows = new float[n][headDim];
        for (float[] row : rows) {
            for (int i = 0; i < headDim; i++) {
                row[i] = (float) rnd.nextGaussian();
            }
        }
        return rows;
    }

    /**
     * Rows like real keys: N(0, 1) values with two RoPE channel pairs (fixed by the seed) scaled by
     * {@value #OUTLIER_SCALE}, the outlier channels that make per-block scales coarse.
     */
    public static float[][] outlierRows(int n, int headDim, long seed) {
        float[] scale = outlierScales(headDim, new SplittableRandom(seed ^ 0x5DEECE66DL));
        float[][] rows = gaussianRows(n, headDim, seed);
        for (float[] row : rows) {
            for (int i = 0; i < headDim; i++) {
                row[i] *= scale[i];
            }
        }
        return rows;
    }

    static float[] outlierScales(int headDim, SplittableRandom rnd) {
        float[] s = new float[headDim];
        java.util.Arrays.fill(s, 1f);
        int half = Math.max(1, headDim / 2);
        for (int p = 0; p < 2; p++) {
            int c = rnd.nextInt(half);
            s[c] = (float) OUTLIER_SCALE;
            if (c + half < headDim) {
                s[c + half] = (float) OUTLIER_SCALE;
            }
        }
        return s;
    }

    /** {@link #rowOutlierScales(float[][], int, boolean)} with NEOX pairs (those of {@link #outlierRows}). */
    static float[] rowOutlierScales(float[][] rows, int headDim) {
        return rowOutlierScales(rows, headDim, true);
    }

    /**
     * {@value #OUTLIER_SCALE} on the two RoPE channel pairs with the most energy over the rows (the lower pair of
     * equal ones), 1 elsewhere: pairs (i, i + headDim/2) where RoPE rotates those together (NEOX: qwen2, qwen3),
     * else (2i, 2i + 1) (llama).
     */
    static float[] rowOutlierScales(float[][] rows, int headDim, boolean neoxPairs) {
        int half = Math.max(1, headDim / 2);
        double[] energy = new double[half];
        for (float[] row : rows) {
            for (int i = 0; i < headDim; i++) {
                energy[neoxPairs ? i % half : Math.min(i / 2, half - 1)] += (double) row[i] * row[i];
            }
        }
        float[] s = new float[headDim];
        java.util.Arrays.fill(s, 1f);
        boolean[] taken = new boolean[half];
        for (int p = 0; p < Math.min(2, half); p++) {
            int best = -1;
            for (int c = 0; c < half; c++) {
                if (!taken[c] && (best < 0 || energy[c] > energy[best])) {
                    best = c;
                }
            }
            taken[best] = true;
            int a = neoxPairs ? best : 2 * best;
            int b = neoxPairs ? best + half : 2 * best + 1;
            s[a] = (float) OUTLIER_SCALE;
            if (b < headDim) {
                s[b] = (float) OUTLIER_SCALE;
            }
        }
        return s;
    }

    /** Each format's figures over rows (all of length headDim), queries drawn from seed. */
    public static List<Row> evaluate(List<KvFormat> formats, float[][] rows, int headDim, long seed, String source) {
        return evaluate(formats, rows, headDim, seed, source, true);
    }

    /** As above, the outlier queries on channel pairs as a model's RoPE pairs them (neoxPairs: qwen2, qwen3). */
    public static List<Row> evaluate(List<KvFormat> formats, float[][] rows, int headDim, long seed, String source,
                                     boolean neoxPairs) {
        return evaluate(formats, rows, headDim, seed, source, neoxPairs, null);
    }

    /** As above, and with a model's own queries for its rows (null: none; {@link Row#ipErrRelModelQ} NaN). */
    public static List<Row> evaluate(List<KvFormat> formats, float[][] rows, int headDim, long seed, String source,
                                     boolean neoxPairs, ModelQueries queries) {
        check(rows, headDim, source);
        checkQueries(queries, rows.length, headDim);
        List<Row> out = new ArrayList<>();
        try (Arena arena = Arena.ofConfined()) {
            for (KvFormat f : formats) {
                long rb = f.rowBytes(headDim);
                MemorySegment buf = arena.allocate(rb);
                float[][] decoded = new float[rows.length][];
                for (int r = 0; r < rows.length; r++) {
                    float[] dec = new float[f.domainDim(headDim)];
                    f.encode(rows[r], 0, headDim, buf, 0);
                    f.decode(buf, 0, headDim, dec, 0);
                    f.unrotate(dec, 0, headDim);
                    decoded[r] = dec;
                }
                out.add(figures(f, rb, rows, decoded, headDim, seed, source, neoxPairs, queries));
            }
        }
        return out;
    }

    /**
     * The figures of K formats centered on their page's mean ({@link PageMeanFormat}) over a model's K rows, given
     * as [layer][position][kv head] rows of headDim: each layer's rows written to a cache of 64-token pages in
     * writes of 512 positions (a prefill's), then read back with their means.
     */
    public static List<Row> evaluateCentered(List<KvFormat> formats, float[][] rows, int layers, int kvHeads,
                                             int headDim, long seed, String source) {
        return evaluateCentered(formats, rows, layers, kvHeads, headDim, seed, source, true);
    }

    /** As above, the outlier queries on channel pairs as a model's RoPE pairs them (neoxPairs: qwen2, qwen3). */
    public static List<Row> evaluateCentered(List<KvFormat> formats, float[][] rows, int layers, int kvHeads,
                                             int headDim, long seed, String source, boolean neoxPairs) {
        return evaluateCentered(formats, rows, layers, kvHeads, headDim, seed, source, neoxPairs, null);
    }

    /** As above, and with the model's own queries for its rows (null: none). */
    public static List<Row> evaluateCentered(List<KvFormat> formats, float[][] rows, int layers, int kvHeads,
                                             int headDim, long seed, String source, boolean neoxPairs,
                                             ModelQueries queries) {
        check(rows, headDim, source);
        checkQueries(queries, rows.length, headDim);
        int n = rows.length / (layers * kvHeads);
        List<Row> out = new ArrayList<>();
        for (KvFormat f : formats) {
            float[][] decoded = new float[rows.length][];
            KvGeometry g = new KvGeometry(1, kvHeads, headDim, headDim);
            try (KvCache cache = KvCache.forTokens(g, f, HalfFormat.F16, 64, n)) {
                float[] k = new float[512 * kvHeads * headDim];
                float[] v = new float[k.length];
                for (int l = 0; l < layers; l++) {
                    try (KvSequence seq = cache.newSequence()) {
                        for (int p0 = 0; p0 < n; p0 += 512) {
                            int m = Math.min(512, n - p0);
                            for (int t = 0; t < m; t++) {
                                for (int h = 0; h < kvHeads; h++) {
                                    System.arraycopy(rows[(l * n + p0 + t) * kvHeads + h], 0, k,
                                            (t * kvHeads + h) * headDim, headDim);
                                }
                            }
                            seq.writeRows(0, p0, m, k, 0, v, 0);
                        }
                        for (int p = 0; p < n; p++) {
                            for (int h = 0; h < kvHeads; h++) {
                                float[] dec = new float[f.domainDim(headDim)];
                                seq.decodeK(0, p, h, dec, 0);
                                f.unrotate(dec, 0, headDim);
                                decoded[(l * n + p) * kvHeads + h] = dec;
                            }
                        }
                    }
                }
            }
            out.add(figures(f, f.rowBytes(headDim), rows, decoded, headDim, seed, source, neoxPairs, queries));
        }
        return out;
    }

    private static void check(float[][] rows, int headDim, String source) {
        for (float[] r : rows) {
            if (r.length != headDim) {
                throw new IllegalArgumentException("rows of " + source + " must have " + headDim + " values, one has " + r.length);
            }
        }
    }

    private static void checkQueries(ModelQueries queries, int rows, int headDim) {
        if (queries == null) {
            return;
        }
        if ((long) queries.queries().length * queries.positions() * queries.kvHeads() != rows) {
            throw new IllegalArgumentException("model queries for " + queries.queries().length + " layers x "
                    + queries.positions() + " positions x " + queries.kvHeads() + " kv heads, but " + rows + " rows");
        }
        for (float[][][] layer : queries.queries()) {
            for (float[][] head : layer) {
                if (head.length == 0) {
                    throw new IllegalArgumentException("model queries: a kv head has none");
                }
                for (float[] q : head) {
                    if (q.length != headDim) {
                        throw new IllegalArgumentException("model queries must have " + headDim + " values, one has "
                                + q.length);
                    }
                }
            }
        }
    }

    /** Relative MSE and inner-product errors of decoded rows against rows, queries drawn from seed. */
    private static Row figures(KvFormat f, long rb, float[][] rows, float[][] decoded, int headDim, long seed,
                               String source, boolean neoxPairs, ModelQueries queries) {
        SplittableRandom rnd = new SplittableRandom(seed);
        double[][] gaussQ = new double[QUERIES][headDim];
        double[][] outlierQ = new double[QUERIES][headDim];
        float[] scales = rowOutlierScales(rows, headDim, neoxPairs);
        for (int q = 0; q < QUERIES; q++) {
            for (int i = 0; i < headDim; i++) {
                gaussQ[q][i] = rnd.nextGaussian();
                outlierQ[q][i] = rnd.nextGaussian() * scales[i];
            }
        }
        double err = 0;
        double norm = 0;
        double[] ipErr = new double[3];
        double[] ipRef = new double[3];
        for (int r = 0; r < rows.length; r++) {
            float[] x = rows[r];
            float[] dec = decoded[r];
            for (int i = 0; i < headDim; i++) {
                double e = x[i] - (double) dec[i];
                err += e * e;
                norm += (double) x[i] * x[i];
            }
            for (int kind = 0; kind < 2; kind++) {
                for (double[] q : kind == 0 ? gaussQ : outlierQ) {
                    double exact = 0;
                    double approx = 0;
                    for (int i = 0; i < headDim; i++) {
                        exact += q[i] * x[i];
                        approx += q[i] * dec[i];
                    }
                    ipErr[kind] += (exact - approx) * (exact - approx);
                    ipRef[kind] += exact * exact;
                }
            }
            if (queries != null) {
                for (float[] q : queries.of(r)) {
                    double exact = 0;
                    double approx = 0;
                    for (int i = 0; i < headDim; i++) {
                        exact += (double) q[i] * x[i];
                        approx += (double) q[i] * dec[i];
                    }
                    ipErr[2] += (exact - approx) * (exact - approx);
                    ipRef[2] += exact * exact;
                }
            }
        }
        // a centered format's means: a 64-token page holds one of 16-bit values in the K domain (domainDim, past
        // headDim where a rotated head is padded), per value of the head
        double bits = 8.0 * rb / headDim + (f instanceof PageMeanFormat ? 16.0 * f.domainDim(headDim) / (64.0 * headDim)
                : 0);
        return new Row(f.name(), bits, rb, err / norm, Math.sqrt(ipErr[0] / ipRef[0]), Math.sqrt(ipErr[1] / ipRef[1]),
                queries == null ? Double.NaN : Math.sqrt(ipErr[2] / ipRef[2]), source);
    }

    /** Prints the figures of every format on Gaussian and outlier rows: {@code KvEval [headDim] [rows] [seed]}. */
    public static void main(String[] args) {
        int headDim = args.length > 0 ? Integer.parseInt(args[0]) : 128;
        int n = args.length > 1 ? Integer.parseInt(args[1]) : 4096;
        long seed = args.length > 2 ? Long.parseLong(args[2]) : 42;
        System.out.printf(Locale.ROOT, "kv-format v%d, head_dim %d, %d rows, seed %d%n", KvFormat.VERSION, headDim, n, seed);
        System.out.printf(Locale.ROOT, "%-8s %-9s %6s %9s %11s %11s %11s%n", "format", "rows", "bits", "bytes/row",
                "mseRel", "ipErrRel", "ipErrOutQ");
        for (String source : List.of("gaussian", "outlier")) {
            float[][] rows = source.equals("gaussian") ? gaussianRows(n, headDim, seed) : outlierRows(n, headDim, seed);
            for (Row r : evaluate(KvFormat.all(), rows, headDim, seed + 1, source)) {
                System.out.printf(Locale.ROOT, "%-8s %-9s %6.3f %9d %11.3e %11.3e %11.3e%n", r.format(), r.source(),
                        r.bitsPerValue(), r.rowBytes(), r.mseRel(), r.ipErrRel(), r.ipErrRelOutlierQ());
            }
        }
        int n0 = Rotation.blockSize(headDim);
        System.out.printf(Locale.ROOT, "%nunit-vector MSE E|u-c|^2 of the codebooks (n = %d) vs the paper%n", n0);
        System.out.printf(Locale.ROOT, "%-5s %12s %14s %14s %12s%n", "bits", "sphere(n)", "Lloyd-Max N(0,1)",
                "paper figure", "paper bound");
        for (int b = 2; b <= 4; b++) {
            System.out.printf(Locale.ROOT, "%-5d %12.5f %14.5f %14.5f %12.5f%n", b, Codebook.sphere(b, n0).unitVectorMse(),
                    Codebook.gaussian(b).unitVectorMse(), lloydMaxGaussianMse(b), paperMseBound(b));
        }
    }
}
