package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.engine.Generator;
import dev.kvant.engine.Session;
import dev.kvant.model.LlamaModel;
import dev.kvant.sample.Sampler;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Locale;

/** Generates a continuation of a prompt. */
@Command(name = "run", mixinStandardHelpOptions = true,
        description = "Generate text from a prompt: the text to stdout, timings to stderr.")
final class RunCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Mixin
    SamplingOptions sampling;

    @Option(names = {"-p", "--prompt"}, required = true, description = "the prompt")
    String prompt;

    @Option(names = {"-n", "--n-predict"}, paramLabel = "N", defaultValue = "128",
            description = "tokens to generate (default ${DEFAULT-VALUE})")
    int nPredict;

    @Option(names = {"-c", "--ctx-size"}, paramLabel = "N",
            description = "context length in tokens (default 4096, or what --kv-mem holds)")
    Integer ctx;

    @Option(names = "--special", description = "parse special-token text (e.g. <|im_start|>) in the prompt")
    boolean special;

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if (nPredict < 0) {
            throw new UsageException("-n must not be negative");
        }
        sampling.check();   // the model's own options are checked by opts.load(), before it reads the file
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        Progress loading = new Progress(false);
        loading.update("loading " + opts.model);
        try (LlamaModel model = opts.load();
             Parallel pool = new Parallel(opts.threads);
             Backend backend = opts.openBackend(model, pool);
             Session session = new Session(backend, opts.contextLength(model, ctx, 4096), opts.kvFormats(),
                     opts.prefillChunk(backend))) {
            loading.done();
            int[] tokens = special ? model.tokenizer().encodePrompt(prompt)
                    : model.tokenizer().encode(prompt, true, false);
            Generator.Stats st = Generator.generate(session, model.tokenizer(), tokens, nPredict,
                    new Sampler(sampling.config(session.contextLength())), piece -> {
                        out.print(piece);
                        checkWritten(out);
                    });
            out.println();
            System.err.printf(Locale.ROOT,
                    "prompt: %d tokens, %.2f tokens/s | generation: %d tokens, %s tokens/s%s | %s%n",
                    st.promptTokens(), st.promptRate(), st.generatedTokens(), rate(st.generateRate()),
                    "context".equals(st.stopReason()) ? " (stopped: the context is full, raise -c)" : "",
                    backend.name().equals("cpu") ? "cpu, " + backend.threads() + " threads" : backend.name());
        }
    }

    /**
     * Flushes out and stops the generation where the text could not be written: a PrintStream keeps a write's failure
     * to itself, so {@code kvant run ... | head} went on generating every -n token for a reader long gone.
     */
    static void checkWritten(PrintStream out) {
        if (out.checkError()) {
            throw new IllegalStateException("the generated text could not be written to stdout (a reader that"
                    + " closed it, a full disk): generation stopped");
        }
    }

    /** A rate with two decimals, or "-" where there was nothing to time (NaN). */
    static String rate(double perSecond) {
        return rate(perSecond, 2);
    }

    /** A rate with the given decimals, or "-" where there was nothing to time (NaN); run's and chat's lines. */
    static String rate(double perSecond, int decimals) {
        return Double.isNaN(perSecond) ? "-" : String.format(Locale.ROOT, "%." + decimals + "f", perSecond);
    }
}
