package dev.kvant.kv;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * Spends a cache's bytes unevenly over its layers: some layers' K or V rows one turbo format richer, as many others
 * one leaner, so that a token takes exactly the bytes it took before and the model loses less. Which layers gain and
 * which can give is measured, not assumed: {@link #probes} lists the single changes to score (each layer's K and V one
 * format richer and one leaner, alone), a scorer measures each (the NLL of a text's chunks: {@code kvant kv-plan}),
 * and {@link #plan} pairs the largest gains with the smallest costs while a trade's gain, chunk by chunk, stands clear
 * of the chunks' noise. The changes are taken as adding up; the plan as a whole must be measured again (the command
 * does).
 *
 * <p>The ladder is turbo2 < turbo3 < turbo4, a format's page means ({@code +mean}) kept: each step adds or takes 16
 * bytes a 128-value block. A richer and a leaner change pair up only when their bytes a token cancel exactly (K and
 * V steps pair when the K and V heads have the same size).
 */
public final class KvLayerPlan {
    private KvLayerPlan() {
    }

    /** The K or the V rows of a layer. */
    public enum Side { K, V }

    /**
     * One layer's K or V rows in {@code to} in place of {@code from}; {@code bytesPerToken} is what that adds to a
     * token's bytes (negative for a leaner format).
     */
    public record Change(int layer, Side side, KvFormat from, KvFormat to, long bytesPerToken) {
        /** Richer than {@link #from}. */
        public boolean richer() {
            return bytesPerToken > 0;
        }

        /**
         * These formats (of a model of {@code layers} layers) with this change, in place of whatever format of its
         * own the layer had (named by its index or from the end).
         */
        public KvLayerFormats applyTo(KvLayerFormats formats, int layers) {
            Map<Integer, KvFormat> k = new TreeMap<>(formats.kLayers());
            Map<Integer, KvFormat> v = new TreeMap<>(formats.vLayers());
            Map<Integer, KvFormat> m = side == Side.K ? k : v;
            m.remove(layer);
            m.remove(layer - layers);
            m.put(layer, to);
            return new KvLayerFormats(formats.k(), formats.v(), k, v);
        }

        /** The CLI option that makes it, e.g. {@code --ctk-layer 7=turbo4+mean}. */
        public String option() {
            return (side == Side.K ? "--ctk-layer " : "--ctv-layer ") + layer + "=" + to.name();
        }
    }

    /**
     * A change and what it gave alone: the mean negative log-likelihood of each scored chunk of a text (the same
     * chunks, of as many tokens each, for every change), from which the perplexity and paired differences follow.
     */
    public record Scored(Change change, double[] chunkNll) {
        public Scored {
            chunkNll = chunkNll.clone();
        }

        /** The perplexity: exp of the chunks' mean NLL. */
        public double ppl() {
            return Math.exp(mean(chunkNll));
        }
    }

    /**
     * A richer and a leaner change made together (their bytes a token cancel): the mean over the chunks of what the
     * pair is taken to take off a token's NLL, (base - richer) - (leaner - base) (their effects measured alone assumed
     * to add), and that mean's standard error.
     */
    public record Trade(Scored richer, Scored leaner, double meanGain, double gainError) {
    }

    /**
     * The turbo format one step richer (dir = +1) or leaner (dir = -1) than f on the ladder turbo2 < turbo3 < turbo4,
     * page means kept; null at either end of the ladder or for a format that is not on it.
     */
    public static KvFormat step(KvFormat f, int dir) {
        if (dir != 1 && dir != -1) {
            throw new IllegalArgumentException("a step is +1 or -1, got " + dir);
        }
        if (f instanceof PageMeanFormat m) {
            KvFormat b = step(m.base(), dir);
            return b == null ? null : new PageMeanFormat(b);
        }
        if (!(f instanceof TurboFormat t)) {
            return null;
        }
        int bits = t.bits() + dir;
        return switch (bits) {
            case 2 -> TurboFormat.TURBO2;
            case 3 -> TurboFormat.TURBO3;
            case 4 -> TurboFormat.TURBO4;
            default -> null;
        };
    }

    /**
     * Every single change of {@code formats} to score: each layer's K, then its V, one step richer and one leaner
     * where the ladder has that step, for a model of {@code layers} layers whose K and V heads take headDimK and
     * headDimV values, kvHeads of each.
     */
    public static List<Change> probes(KvLayerFormats formats, int layers, int kvHeads, int headDimK, int headDimV) {
        formats.check(layers);
        List<Change> out = new ArrayList<>();
        for (int l = 0; l < layers; l++) {
            for (Side side : Side.values()) {
                KvFormat from = side == Side.K ? formats.k(l, layers) : formats.v(l, layers);
                int dim = side == Side.K ? headDimK : headDimV;
                for (int dir : new int[] {1, -1}) {
                    KvFormat to = step(from, dir);
                    if (to != null) {
                        out.add(new Change(l, side, from, to, kvHeads * (to.rowBytes(dim) - from.rowBytes(dim))));
                    }
                }
            }
        }
        return out;
    }

    /**
     * The trades to make, best first: the richer changes by the NLL they take off the base's, each paired with the
     * cheapest leaner change of the opposite bytes whose trade's gain, chunk by chunk, is positive by more than
     * {@code z} standard errors of its mean (the chunks' spread: a paired comparison, far tighter than either
     * perplexity's own error); each layer's K or V changed once at most. The changes are chosen and judged on the same
     * chunks, and with few chunks the standard error is itself rough, so z is a guard against trading on noise, not a
     * significance level: a second text ({@code kvant kv-plan --check}) is the test of a plan.
     *
     * @param base   each chunk's mean NLL with the formats as they are
     * @param scored every probe, over the same chunks
     * @param z      standard errors a trade's mean gain must exceed (0: any mean gain)
     */
    public static List<Trade> plan(double[] base, List<Scored> scored, double z) {
        if (!(z >= 0)) {
            throw new IllegalArgumentException("z must be 0 or more, got " + z);
        }
        if (base.length < 2) {
            throw new IllegalArgumentException("a paired comparison needs two chunks or more, got " + base.length);
        }
        for (Scored s : scored) {
            if (s.chunkNll.length != base.length) {
                throw new IllegalArgumentException("change " + s.change.option() + " was scored over "
                        + s.chunkNll.length + " chunks, the base over " + base.length);
            }
        }
        double b = mean(base);
        List<Scored> richer = scored.stream().filter(s -> s.change.richer())
                .sorted(Comparator.comparingDouble(s -> mean(s.chunkNll) - b)).toList();
        List<Scored> leaner = scored.stream().filter(s -> !s.change.richer())
                .sorted(Comparator.comparingDouble(s -> mean(s.chunkNll) - b)).toList();
        Set<String> used = new HashSet<>();
        List<Trade> trades = new ArrayList<>();
        for (Scored up : richer) {
            if (used.contains(key(up.change))) {
                continue;
            }
            for (Scored down : leaner) {
                if (used.contains(key(down.change)) || key(down.change).equals(key(up.change))
                        || down.change.bytesPerToken != -up.change.bytesPerToken) {
                    continue;
                }
                double[] gain = new double[base.length];
                for (int c = 0; c < base.length; c++) {
                    gain[c] = (base[c] - up.chunkNll[c]) - (down.chunkNll[c] - base[c]);
                }
                double m = mean(gain);
                if (m <= 0) {
                    break;   // the leaner changes come cheapest first: no later one gains on average
                }
                double se = Math.sqrt(variance(gain, m) / gain.length);
                if (m > z * se) {
                    trades.add(new Trade(up, down, m, se));
                    used.add(key(up.change));
                    used.add(key(down.change));
                    break;
                }
                // a dearer leaner change with a steadier cost may still clear z
            }
        }
        return trades;
    }

    /** Sum in index order, divided by the count. */
    static double mean(double[] x) {
        double s = 0;
        for (double v : x) {
            s += v;
        }
        return s / x.length;
    }

    /** The sample variance (n - 1) around m. */
    static double variance(double[] x, double m) {
        double s = 0;
        for (double v : x) {
            s += (v - m) * (v - m);
        }
        return s / (x.length - 1);
    }

    /** formats (of a model of {@code layers} layers) with every change of the trades. */
    public static KvLayerFormats apply(KvLayerFormats formats, List<Trade> trades, int layers) {
        KvLayerFormats f = formats;
        for (Trade t : trades) {
            f = t.leaner.change.applyTo(t.richer.change.applyTo(f, layers), layers);
        }
        return f;
    }

    private static String key(Change c) {
        return c.side + "" + c.layer;
    }
}
