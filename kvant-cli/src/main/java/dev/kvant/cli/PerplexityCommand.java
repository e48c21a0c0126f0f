package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.engine.Perplexity;
import dev.kvant.engine.Session;
import dev.kvant.model.LlamaModel;
import dev.kvant.tensor.Parallel;
import dev.kvant.tokenizer.Tokenizer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.Locale;

/** llama.cpp's perplexity measurement. */
@Command(name = "perplexity", mixinStandardHelpOptions = true,
        description = "Perplexity of a text (llama.cpp's method: chunks of -c tokens, second half of each scored).")
final class PerplexityCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Mixin
    SelectOptions selectOpts;

    @Option(names = {"-f", "--file"}, required = true, paramLabel = "FILE", description = "text file (UTF-8)")
    Path file;

    @Option(names = {"-c", "--ctx-size"}, paramLabel = "N", defaultValue = "512",
            description = "tokens per chunk (default ${DEFAULT-VALUE})")
    int ctx;

    @Option(names = "--chunks", paramLabel = "N", defaultValue = "0", description = "at most N chunks (0 = all)")
    int chunks;

    @Option(names = "--json", description = "print one JSON object")
    boolean json;

    @Option(names = "--chunk-nll", description = "also print each chunk's mean negative log-likelihood (JSON:"
            + " \"chunk_nll\"), for a paired comparison of two runs over the same text (scripts/ppl-paired.py)")
    boolean chunkNll;

    /** The model, its context checked against --kv-mem before a backend (a GPU's upload) is opened for it. */
    private LlamaModel budgeted(LlamaModel model, int context) {
        ModelOptions.warnPastTraining(model, context, "-c");
        opts.checkBudget(model, opts.kvFormats(), context, "perplexity at -c " + context);
        return model;
    }

    /** A text's tokens as perplexity scores them: BOS first where the vocabulary adds one, no EOS appended. */
    static int[] scoredTokens(Tokenizer tok, String text) {
        int[] tokens = tok.encode(text, true, false);
        if (tok.addEos() && tokens.length > 0 && tokens[tokens.length - 1] == tok.eos()) {
            // the vocabulary appends EOS to an encoded text: the file's own tokens are scored, not that one
            tokens = java.util.Arrays.copyOf(tokens, tokens.length - 1);
        }
        return tokens;
    }

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if (chunks < 0) {
            throw new UsageException("--chunks must not be negative (0 = all), got " + chunks);
        }
        if (ctx < 4) {   // Perplexity's own rule, checked before the model loads
            throw new UsageException("-c must be at least 4 (the second half of a chunk is scored), got " + ctx);
        }
        opts.checkOptions();
        String text = TextFiles.read(file);
        Progress progress = new Progress(json);
        progress.update("loading " + opts.model);
        try (LlamaModel model = opts.load();
             Parallel pool = new Parallel(opts.threads);
             var dump = selectOpts.apply(model, opts.model, file);
             Backend backend = opts.openBackend(budgeted(model, ctx), pool);
             Session session = new Session(backend, ctx, opts.kvFormats(), opts.prefillChunk(backend))) {
            if (selectOpts.dump != null && !backend.name().equals("cpu")) {
                throw new UsageException("--dump-selection records the CPU backend's selections only"
                        + " (use --backend cpu)");
            }
            Tokenizer tok = model.tokenizer();
            progress.update("tokenizing " + file);
            int[] tokens = scoredTokens(tok, text);
            int bos = tok.addBos() ? tok.bos() : -1;
            int total = chunks > 0 ? Math.min(chunks, tokens.length / ctx) : tokens.length / ctx;
            long t0 = System.nanoTime();
            Perplexity.Result r = Perplexity.evaluate(session, tokens, ctx, bos, chunks, done -> {
                double s = (System.nanoTime() - t0) / 1e9;
                progress.update(String.format(Locale.ROOT, "chunk %d/%d, %.1f s, ~%.0f s left", done, total, s,
                        s / done * (total - done)));
            });
            progress.done();
            if (json) {
                System.out.println(r.toJson(chunkNll));
            } else {
                System.out.printf(Locale.ROOT,
                        "model %s, kv %s, %s, %d tokens, ctx %d, %d chunks, %d tokens scored, %.1f s%n",
                        model.name(), opts.kvFormats().name(), selectOpts.describe(), tokens.length, r.ctx(),
                        r.chunks(), r.tokensScored(), r.seconds());
                // llama.cpp's line, which scripts look for
                System.out.printf(Locale.ROOT, "Final estimate: PPL = %.4f +/- %.5f%n", r.ppl(), r.pplError());
                if (chunkNll) {
                    for (int c = 0; c < r.chunks(); c++) {
                        System.out.printf(Locale.ROOT, "chunk %d nll %.9f%n", c, r.chunkNll()[c]);
                    }
                }
            }
            if (dump != null) {
                dump.commit();
            }
        }
    }
}
