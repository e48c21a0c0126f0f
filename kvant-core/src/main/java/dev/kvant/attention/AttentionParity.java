package dev.kvant.attention;

import dev.kvant.kv.KvFormat;
import dev.kvant.tensor.Parallel;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

/**
 * {@code kvant parity}: every kernel variant on the same random problem, compared with the float64 reference by
 * NMSE and max abs error, each output summarized by a checksum of its bits so that two builds (or two machines of
 * the same vector width) can be compared bit for bit without shipping outputs around.
 */
public final class AttentionParity {

    /**
     * What to run: formats, geometry, the cached positions (the queries are the last {@code queries} of them),
     * seed and options.
     */
    public record Settings(KvFormat k, KvFormat v, int ctx, int queries, int kvHeads, int heads, int headDimK,
                           int headDimV, long seed, AttentionOptions options) {
        public Settings {
            if (queries < 1 || ctx < queries) {
                throw new IllegalArgumentException("need 1 <= --queries <= --ctx, got queries=" + queries + " ctx=" + ctx);
            }
            if (kvHeads < 1 || heads % kvHeads != 0 || heads < kvHeads) {
                throw new IllegalArgumentException("--heads " + heads + " must be a positive multiple of --kv-heads "
                        + kvHeads);
            }
        }
    }

    /** One kernel's outcome; {@code bound} is the NMSE it must stay within (0 for the reference itself). */
    public record Result(String kernel, double nmse, double maxAbsError, long checksum, double bound, double millis) {
        public boolean ok() {
            return nmse <= bound;
        }

        /** As JSON; an NMSE or error that is not finite (a kernel that wrote NaN) is null, not a bare Infinity. */
        public String toJson() {
            return String.format(Locale.ROOT, "{\"kernel\":\"%s\",\"nmse\":%s,\"max_abs_err\":%s,"
                    + "\"checksum\":\"%016x\",\"bound\":%.1e,\"ms\":%.2f,\"ok\":%b}", kernel, scientific(nmse),
                    scientific(maxAbsError), checksum, bound, millis, ok());
        }

        private static String scientific(double v) {
            return Double.isFinite(v) ? String.format(Locale.ROOT, "%.3e", v) : "null";
        }
    }

    /**
     * @param skipped the kernels that do not take a problem of this shape, each with why (e.g. "cuda-multi-query: at
     *                most 8 queries")
     */
    public record Report(Settings settings, List<Result> results, List<String> skipped) {
        public boolean ok() {
            return results.stream().allMatch(Result::ok);
        }

        public String header() {
            Settings s = settings;
            return String.format(Locale.ROOT, "K %s, V %s, ctx %d, %d queries, %d heads / %d kv heads, head dim %d/%d,"
                            + " soft-cap %s, sparse-v %s, seed %d", s.k().name(), s.v().name(), s.ctx(), s.queries(),
                    s.heads(), s.kvHeads(), s.headDimK(), s.headDimV(), s.options().softCap(), s.options().sparseV(),
                    s.seed());
        }

        public String markdown() {
            StringBuilder sb = new StringBuilder(header()).append("\n\n");
            sb.append("| kernel | NMSE | max abs err | checksum | bound | ms | |\n");
            sb.append("| --- | ---: | ---: | --- | ---: | ---: | --- |\n");
            for (Result r : results) {
                sb.append(String.format(Locale.ROOT, "| %s | %.3e | %.3e | %016x | %s | %.2f | %s |%n", r.kernel(),
                        r.nmse(), r.maxAbsError(), r.checksum(), r.bound() == 0 ? "-" : String.format(Locale.ROOT,
                                "%.0e", r.bound()), r.millis(), r.ok() ? "ok" : "EXCEEDED"));
            }
            for (String k : skipped) {
                sb.append("\nnot run: ").append(k);
            }
            return sb.toString();
        }

        public String toJson() {
            Settings s = settings;
            StringBuilder sb = new StringBuilder(String.format(Locale.ROOT,
                    "{\"k\":\"%s\",\"v\":\"%s\",\"ctx\":%d,\"queries\":%d,\"heads\":%d,\"kv_heads\":%d,"
                            + "\"head_dim_k\":%d,\"head_dim_v\":%d,\"soft_cap\":%s,\"sparse_v\":%s,\"seed\":%d,"
                            + "\"ok\":%b,\"results\":[", s.k().name(), s.v().name(), s.ctx(), s.queries(), s.heads(),
                    s.kvHeads(), s.headDimK(), s.headDimV(), s.options().softCap(), s.options().sparseV(), s.seed(),
                    ok()));
            for (int i = 0; i < results.size(); i++) {
                sb.append(i == 0 ? "" : ",").append(results.get(i).toJson());
            }
            sb.append("],\"not_run\":[");
            for (int i = 0; i < skipped.size(); i++) {
                sb.append(i == 0 ? "\"" : ",\"").append(skipped.get(i)).append('"');
            }
            return sb.append("]}").toString();
        }
    }

    private AttentionParity() {
    }

    /**
     * The NMSE a kernel may show against the reference from float rounding alone: the reference decodes the same
     * rows, measured 1e-14 to 1e-11 for every format up to 128K positions; rotated formats add the float rotation of
     * query and output. With sparse V, {@link #run} adds what the rule lets the kernels keep (see there).
     */
    public static double nmseBound(KvFormat k, KvFormat v, AttentionOptions o) {
        return k.rotated() || v.rotated() ? 1e-9 : 1e-10;
    }

    /** The CPU kernel variants: decode (one token per call), multi-query (all tokens, split-K) and prefill. */
    public static List<AttentionKernel> cpuKernels(Parallel pool) {
        return List.of(
                kernel("cpu-decode", (p, o, out) -> {
                    int hq = p.heads() * p.cache().geometry().headDimK();
                    int hv = p.heads() * p.cache().geometry().headDimV();
                    float[] one = new float[hv];
                    for (int t = 0; t < p.n(); t++) {
                        float[] q = Arrays.copyOfRange(p.queries(), t * hq, (t + 1) * hq);
                        CpuAttention.decode(p.seq(), 0, q, 1, p.start() + t, p.heads(), p.scale(), o, one, pool);
                        System.arraycopy(one, 0, out, t * hv, hv);
                    }
                }),
                kernel("cpu-multi-query", (p, o, out) -> CpuAttention.decode(p.seq(), 0, p.queries(), p.n(), p.start(),
                        p.heads(), p.scale(), o, out, pool)),
                kernel("cpu-prefill", (p, o, out) -> CpuAttention.prefill(p.seq(), 0, p.queries(), p.n(), p.start(),
                        p.heads(), p.scale(), o, out, pool)));
    }

    /** What a kernel made by {@link #kernel} runs. */
    interface Body {
        void run(AttentionProblem p, AttentionOptions o, float[] out);
    }

    /** A kernel of that name that runs body (the CPU kernels; tests' deliberately wrong ones). */
    static AttentionKernel kernel(String name, Body body) {
        return new AttentionKernel() {
            @Override
            public String name() {
                return name;
            }

            @Override
            public void run(AttentionProblem problem, AttentionOptions options, float[] out) {
                body.run(problem, options, out);
            }
        };
    }

    public static Report run(Settings s, List<AttentionKernel> kernels) {
        List<Result> results = new ArrayList<>();
        List<String> skipped = new ArrayList<>();
        try (AttentionProblem p = AttentionProblem.random(s.k(), s.v(), s.kvHeads(), s.heads() / s.kvHeads(),
                s.headDimK(), s.headDimV(), s.ctx() - s.queries(), s.queries(), 64, s.seed())) {
            long t0 = System.nanoTime();
            double[] ref = AttentionReference.attend(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(), p.scale(),
                    s.options());
            double refMs = (System.nanoTime() - t0) / 1e6;
            float[] refOut = new float[ref.length];
            for (int i = 0; i < ref.length; i++) {
                refOut[i] = (float) ref[i];
            }
            results.add(new Result("reference", 0, 0, checksum(refOut), 0, refMs));
            // Sparse V: the reference drops exactly the rows whose weight is below T, a kernel a subset of them (it
            // knows only a bound of each weight, per partition or split), so its output lies between the reference's
            // and the dense one. Errors are then measured against the dense output's energy (a threshold may drop
            // every row of the reference), and the bound grows by twice the dense output's distance from the
            // reference: at short contexts, where every rule drops the same rows, it stays the rounding bound.
            double[] dense = ref;
            if (s.options().sparseV() > 0) {
                dense = AttentionReference.attend(p.seq(), 0, p.queries(), p.n(), p.start(), p.heads(), p.scale(),
                        s.options().withSparseV(0f));
            }
            double energy = 0;
            double gap = 0;
            for (int i = 0; i < ref.length; i++) {
                energy += dense[i] * dense[i];
                gap += (dense[i] - ref[i]) * (dense[i] - ref[i]);
            }
            double bound = nmseBound(s.k(), s.v(), s.options()) + 2 * gap / energy;
            for (AttentionKernel k : kernels) {
                if (s.queries() > k.maxQueries()) {
                    skipped.add(k.name() + ": at most " + k.maxQueries() + " queries");
                    continue;
                }
                float[] out = new float[ref.length];
                Arrays.fill(out, Float.NaN);
                k.run(p, s.options(), out);
                // Once more, timed: the first run pays for compilation.
                Arrays.fill(out, Float.NaN);
                long t1 = System.nanoTime();
                k.run(p, s.options(), out);
                double ms = (System.nanoTime() - t1) / 1e6;
                double num = 0;
                double max = 0;
                for (int i = 0; i < ref.length; i++) {
                    double e = out[i] - ref[i];
                    num += e * e;
                    max = Math.max(max, Math.abs(e));
                }
                double nmse = num / energy;
                if (Double.isNaN(nmse)) {
                    nmse = Double.POSITIVE_INFINITY;
                    max = Double.POSITIVE_INFINITY;
                }
                results.add(new Result(k.name(), nmse, max, checksum(out), k.nmseBound(bound), ms));
            }
        }
        return new Report(s, results, List.copyOf(skipped));
    }

    /** FNV-1a over the floats' raw bits, little-endian bytes: equal outputs give equal checksums everywhere. */
    public static long checksum(float[] x) {
        long h = 0xcbf29ce484222325L;
        for (float f : x) {
            int b = Float.floatToRawIntBits(f);
            for (int i = 0; i < 4; i++) {
                h ^= (b >>> (8 * i)) & 0xFF;
                h *= 0x100000001b3L;
            }
        }
        return h;
    }
}
