package dev.kvant.engine;

import java.util.function.IntConsumer;

/**
 * Perplexity as llama.cpp's {@code llama-perplexity} computes it: the token stream is cut into non-overlapping chunks
 * of ctx tokens, each chunk starts with BOS (when the vocabulary adds one) and is evaluated from an empty cache, and
 * the second half of each chunk is scored: the logits at positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1.
 */
public final class Perplexity {

    /**
     * @param ppl          exp(mean negative log-likelihood)
     * @param pplError     standard error of ppl (delta method: ppl times the standard error of the mean NLL)
     * @param tokensScored how many predictions were scored
     * @param chunkNll     each chunk's mean negative log-likelihood, in chunk order: two runs over the same text
     *                     (two backends, two cache formats) compared chunk by chunk give a paired difference whose
     *                     standard error is far smaller than either perplexity's own
     */
    public record Result(double ppl, double pplError, int chunks, int ctx, long tokensScored, double seconds,
                         double[] chunkNll) {
        public String toJson() {
            return toJson(false);
        }

        /** One JSON object; with {@code withChunks} also {@code "chunk_nll":[...]} (each to 9 decimals). */
        public String toJson(boolean withChunks) {
            StringBuilder b = new StringBuilder("{\"ppl\":").append(number(ppl, 6)).append(",\"ppl_err\":")
                    .append(number(pplError, 6)).append(String.format(java.util.Locale.ROOT,
                            ",\"chunks\":%d,\"ctx\":%d,\"tokens_scored\":%d", chunks, ctx, tokensScored));
            if (withChunks) {
                b.append(",\"chunk_nll\":[");
                for (int c = 0; c < chunkNll.length; c++) {
                    b.append(c == 0 ? "" : ",").append(number(chunkNll[c], 9));
                }
                b.append(']');
            }
            return b.append('}').toString();
        }
    }

    private Perplexity() {
    }

    /** A JSON number to this many decimals; null for NaN or an infinity (a NaN logit), which JSON cannot hold. */
    static String number(double v, int decimals) {
        return Double.isFinite(v) ? String.format(java.util.Locale.ROOT, "%." + decimals + "f", v) : "null";
    }

    /**
     * @param tokens    the whole tokenized text, BOS first when the vocabulary adds one
     * @param bos       BOS id, or -1 when the vocabulary adds none
     * @param maxChunks at most this many chunks (0 or less: all that fit)
     * @param progress  called with the number of chunks done after each chunk
     */
    public static Result evaluate(Session session, int[] tokens, int ctx, int bos, int maxChunks,
                                  IntConsumer progress) {
        if (ctx < 4) {
            throw new IllegalArgumentException("perplexity context must be at least 4, got " + ctx);
        }
        if (ctx > session.contextLength()) {
            throw new IllegalArgumentException("perplexity context " + ctx + " exceeds the session's context "
                    + session.contextLength());
        }
        int available = tokens.length / ctx;
        if (tokens.length < 2 * ctx) {   // llama.cpp's rule
            throw new IllegalArgumentException("the text has " + tokens.length + " tokens; perplexity at -c " + ctx
                    + " needs at least 2 x " + ctx + " = " + 2 * ctx + " (use a smaller -c or a longer file)");
        }
        int chunks = maxChunks > 0 ? Math.min(maxChunks, available) : available;
        int vocab = session.model().config().vocabSize();
        int first = ctx / 2;
        int[] chunk = new int[ctx];
        // the sums in position order, chunk after chunk (the same order whatever the prefill's chunk size)
        double[] sums = new double[3];   // nll, nll², this chunk's nll
        double[] chunkNll = new double[chunks];
        long t0 = System.nanoTime();
        for (int c = 0; c < chunks; c++) {
            System.arraycopy(tokens, c * ctx, chunk, 0, ctx);
            if (bos >= 0) {
                chunk[0] = bos;
            }
            session.truncate(0);
            sums[2] = 0;
            // each prefill chunk's logits scored as they come: positions first .. ctx - 2 predict the next token
            session.prefillLogits(chunk, 0, ctx, (start, n, logits) -> {
                for (int j = Math.max(start, first); j < Math.min(start + n, ctx - 1); j++) {
                    double v = -logSoftmax(logits, (j - start) * vocab, vocab, chunk[j + 1]);
                    sums[0] += v;
                    sums[1] += v * v;
                    sums[2] += v;
                }
            });
            chunkNll[c] = sums[2] / (ctx - 1 - first);
            progress.accept(c + 1);
        }
        long count = (long) chunks * (ctx - 1 - first);
        double nll = sums[0];
        double nll2 = sums[1];
        double mean = nll / count;
        double var = nll2 / count - mean * mean;
        double err = count > 1 ? Math.sqrt(Math.max(var, 0) / (count - 1)) : 0;
        double ppl = Math.exp(mean);
        return new Result(ppl, ppl * err, chunks, ctx, count, (System.nanoTime() - t0) / 1e9, chunkNll);
    }

    /** log p(target) under softmax(logits[off .. off+vocab)), in double. */
    static double logSoftmax(float[] logits, int off, int vocab, int target) {
        float max = Float.NEGATIVE_INFINITY;
        for (int i = 0; i < vocab; i++) {
            max = Math.max(max, logits[off + i]);
        }
        double sum = 0;
        for (int i = 0; i < vocab; i++) {
            sum += Math.exp(logits[off + i] - max);
        }
        return logits[off + target] - max - Math.log(sum);
    }
}
