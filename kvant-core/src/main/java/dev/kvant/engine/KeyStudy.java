package dev.kvant.engine;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvSequence;
import dev.kvant.model.KeyRowHook;
import dev.kvant.model.LlamaModel;
import dev.kvant.tensor.Parallel;
import dev.kvant.tokenizer.Tokenizer;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collections;
import java.util.Locale;
import java.util.Map;
import java.util.WeakHashMap;

/**
 * A study of key encodings by perplexity: every K row passes through a format's encode and decode (optionally
 * centered on a mean first, the mean given back exactly after decoding) before a q8_0 K cache, V rows going to a
 * cache of that format as usual — so the perplexity shows what the format costs on the K side, and what a key offset
 * would win back (softmax is invariant to an offset shared by the keys of one query's sum, so a cache may store
 * k − μ and give q·μ back). docs/KV_FORMATS.md records the results.
 *
 * <pre>java ... dev.kvant.engine.KeyStudy MODEL.gguf TEXT FORMAT MODE [ctx 4096] [chunks 16] [threads 2]
 *   MODE: none | prev64 (the previous 64 keys' mean) | block64 (each 64-key block's own mean)</pre>
 */
public final class KeyStudy {
    private static final int BLOCK = 64;

    private KeyStudy() {
    }

    /** How a key is centered before the format's encode. */
    public enum Mode { NONE, PREV64, BLOCK64 }

    /** The hook: K rows through {@code format}, centered per {@code mode}; state per sequence and layer. */
    public static KeyRowHook hook(KvFormat format, Mode mode, int layers, int kvHeads, int headDim) {
        Map<KvSequence, double[][]> sums = Collections.synchronizedMap(new WeakHashMap<>());
        Map<KvSequence, float[][]> means = Collections.synchronizedMap(new WeakHashMap<>());
        int kvDim = kvHeads * headDim;
        return (seq, layer, position, n, k, kOffset) -> {
            double[] sum = sums.computeIfAbsent(seq, s -> new double[layers][kvDim + 1])[layer];
            float[] prev = means.computeIfAbsent(seq, s -> new float[layers][kvDim])[layer];
            if (position == 0) {
                java.util.Arrays.fill(sum, 0);
                java.util.Arrays.fill(prev, 0f);
            }
            MemorySegment buf = MemorySegment.ofArray(new byte[(int) format.rowBytes(headDim)]);
            float[] row = new float[format.domainDim(headDim)];
            float[] centered = new float[headDim];
            float[] mu = new float[kvDim];
            for (int t = 0; t < n; t++) {
                int p = position + t;
                int o = kOffset + t * kvDim;
                if (mode == Mode.PREV64 && p % BLOCK == 0 && p > 0 && sum[kvDim] > 0) {
                    for (int i = 0; i < kvDim; i++) {
                        prev[i] = (float) (sum[i] / sum[kvDim]);
                    }
                    java.util.Arrays.fill(sum, 0);
                }
                if (mode == Mode.PREV64) {
                    System.arraycopy(prev, 0, mu, 0, kvDim);
                } else if (mode == Mode.BLOCK64 && (t == 0 || p % BLOCK == 0)) {
                    // the mean of this row's block within this write (its rows from p to the block's end)
                    int end = Math.min(n, t + BLOCK - p % BLOCK);
                    java.util.Arrays.fill(mu, 0f);
                    for (int u = t; u < end; u++) {
                        for (int i = 0; i < kvDim; i++) {
                            mu[i] += k[kOffset + u * kvDim + i] / (end - t);
                        }
                    }
                }
                for (int h = 0; h < kvHeads; h++) {
                    for (int i = 0; i < headDim; i++) {
                        centered[i] = k[o + h * headDim + i] - mu[h * headDim + i];
                    }
                    format.encode(centered, 0, headDim, buf, 0);
                    format.decode(buf, 0, headDim, row, 0);
                    format.unrotate(row, 0, headDim);
                    for (int i = 0; i < headDim; i++) {
                        k[o + h * headDim + i] = row[i] + mu[h * headDim + i];
                    }
                }
                for (int i = 0; i < kvDim; i++) {
                    sum[i] += k[o + i];
                }
                sum[kvDim] += 1;
            }
        };
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 4) {
            System.err.println("usage: KeyStudy MODEL.gguf TEXT FORMAT none|prev64|block64 [ctx] [chunks] [threads]");
            System.exit(2);
        }
        KvFormat format = KvFormat.parse(args[2]);
        Mode mode = Mode.valueOf(args[3].toUpperCase(Locale.ROOT));
        int ctx = args.length > 4 ? Integer.parseInt(args[4]) : 4096;
        int chunks = args.length > 5 ? Integer.parseInt(args[5]) : 16;
        int threads = args.length > 6 ? Integer.parseInt(args[6]) : 2;
        try (LlamaModel model = LlamaModel.load(Path.of(args[0])); Parallel pool = new Parallel(threads)) {
            var c = model.config();
            model.setKeyRowHook(hook(format, mode, c.layers(), c.kvHeads(), c.headDimK()));
            Tokenizer tok = model.tokenizer();
            int[] tokens = tok.encode(Files.readString(Path.of(args[1])), true, false);
            // block64 sees whole blocks when prompts are written in chunks of 64
            int chunk = mode == Mode.BLOCK64 ? BLOCK : 512;
            try (Session s = new Session(model, ctx, KvFormat.parse("q8_0"), format, chunk, pool)) {
                Perplexity.Result r = Perplexity.evaluate(s, tokens, ctx, tok.addBos() ? tok.bos() : -1, chunks,
                        done -> { });
                System.out.printf(Locale.ROOT, "K through %s, %s: PPL %.4f ± %.4f (%d chunks of %d, %.1f s)%n",
                        format.name(), mode.name().toLowerCase(Locale.ROOT), r.ppl(), r.pplError(), r.chunks(), ctx,
                        r.seconds());
            }
        }
    }
}
