package dev.kvant.cli;

import dev.kvant.backend.Backend;
import dev.kvant.engine.Generator;
import dev.kvant.engine.Session;
import dev.kvant.model.LlamaModel;
import dev.kvant.sample.Sampler;
import dev.kvant.tensor.Parallel;
import dev.kvant.tokenizer.ChatMessage;
import dev.kvant.tokenizer.ChatTemplate;
import dev.kvant.tokenizer.Tokenizer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Interactive chat with history. Each turn renders the whole conversation with the model's chat template; the
 * cache keeps the tokens the new rendering shares with what it already holds, so only the new turn is computed.
 */
@Command(name = "chat", mixinStandardHelpOptions = true,
        description = "Interactive chat with the model's chat template (type /exit or end input to stop).")
final class ChatCommand implements Runnable {

    @Mixin
    ModelOptions opts;

    @Mixin
    SamplingOptions sampling;

    @Option(names = {"-c", "--ctx-size"}, paramLabel = "N",
            description = "context length in tokens (default 4096, or what --kv-mem holds)")
    Integer ctx;

    @Option(names = {"-n", "--n-predict"}, paramLabel = "N", defaultValue = "512",
            description = "most tokens per reply (default ${DEFAULT-VALUE})")
    int nPredict;

    @Option(names = "--system", paramLabel = "TEXT", description = "system prompt")
    String system;

    @Option(names = "--chat-template", paramLabel = "NAME",
            description = "override the template detected from the model: llama3, llama3.1, llama3.2, llama2,"
                    + " chatml, qwen2, qwen2.5, qwen3, qwen3-thinking, mistral, mistral-v1, mistral-v3,"
                    + " mistral-v3-tekken, mistral-v7, mistral-v7-tekken, gemma, raw")
    String template;

    @Override
    public void run() {
        ModelOptions.checkThreads(opts.threads);
        if (nPredict < 0) {
            throw new UsageException("-n must not be negative");
        }
        sampling.check();   // the model's own options are checked by opts.load(), before it reads the file
        if (template != null) {
            UsageException.parsing(() -> ChatTemplate.named(template));
        }
        PrintStream out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        Progress loading = new Progress(false);
        loading.update("loading " + opts.model);
        try (LlamaModel model = opts.load();
             Parallel pool = new Parallel(opts.threads);
             Backend backend = opts.openBackend(model, pool);
             Session session = new Session(backend, opts.contextLength(model, ctx, 4096), opts.kvFormats(),
                     opts.prefillChunk(backend))) {
            loading.done();
            Tokenizer tok = model.tokenizer();
            ChatTemplate tpl = ChatTemplate.detect(model.chatTemplate(), template);
            if (tpl == ChatTemplate.RAW && template == null) {
                System.err.println("kvant chat: the model has no chat template (tokenizer.chat_template): messages are"
                        + " joined with no turn markers; choose a format with --chat-template NAME");
            }
            Sampler sampler = new Sampler(sampling.config(session.contextLength()));
            List<ChatMessage> history = new ArrayList<>();
            if (system != null) {
                history.add(new ChatMessage("system", system));
            }
            int[] cached = new int[0];
            while (true) {
                out.print("> ");
                out.flush();
                String line = in.readLine();
                if (line == null || line.strip().equals("/exit")) {
                    break;
                }
                if (line.isBlank()) {
                    continue;
                }
                history.add(new ChatMessage("user", line));
                int[] all = render(tpl, tok, history);
                // The conversation keeps to the context, with room for a reply (-n, at most a quarter of it): its
                // oldest turns after the system prompt go first, a user message with the reply that followed it.
                int reserve = Math.min(Math.max(1, nPredict), Math.max(1, session.contextLength() / 4));
                int first = system != null ? 1 : 0;
                int dropped = 0;
                while (all.length + reserve > session.contextLength() && history.size() - 1 > first) {
                    history.remove(first);
                    if (history.size() - 1 > first && history.get(first).role().equals("assistant")) {
                        history.remove(first);
                    }
                    dropped++;
                    all = render(tpl, tok, history);
                }
                if (dropped > 0) {
                    System.err.println("kvant chat: the conversation outgrew the context (-c "
                            + session.contextLength() + "): its " + dropped + " oldest exchange"
                            + (dropped == 1 ? " was" : "s were") + " dropped");
                }
                int keep = commonPrefix(cached, all, session.position());
                session.truncate(keep);
                int[] fresh = java.util.Arrays.copyOfRange(all, keep, all.length);
                if (fresh.length == 0) {
                    session.truncate(keep - 1);
                    fresh = new int[] {all[keep - 1]};
                }
                // the repetition window: the context as it now is (dropped turns out), before the new tokens
                sampler.restartWindow(all, all.length - fresh.length);
                StringBuilder reply = new StringBuilder();
                Generator.Stats st;
                try {
                    st = Generator.generate(session, tok, fresh, nPredict, sampler, piece -> {
                        reply.append(piece);
                        out.print(piece);
                        RunCommand.checkWritten(out);
                    });
                } catch (dev.kvant.engine.ContextFullException | dev.kvant.kv.KvCacheFullException e) {
                    // the conversation goes on without this message: the cache keeps what it held before it
                    System.err.println("kvant chat: " + e.getMessage() + "; the message was dropped (it needs a"
                            + " larger -c)");
                    history.remove(history.size() - 1);
                    int held = Math.min(keep, session.position());
                    session.truncate(held);
                    cached = java.util.Arrays.copyOf(all, held);
                    continue;
                }
                out.println();
                if ("context".equals(st.stopReason())) {
                    System.err.println("kvant chat: (the reply was cut: the context is full; the next message drops"
                            + " the oldest exchanges)");
                }
                System.err.printf(Locale.ROOT, "[%d new prompt tokens, %.1f t/s; %d generated, %s t/s]%n",
                        st.promptTokens(), st.promptRate(), st.generatedTokens(),
                        RunCommand.rate(st.generateRate(), 1));
                history.add(new ChatMessage("assistant", reply.toString()));
                // The cache holds the prompt and the reply tokens that were fed back (all but the last sampled).
                cached = java.util.Arrays.copyOf(all, session.position());
                System.arraycopy(st.tokens(), 0, cached, all.length, session.position() - all.length);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The conversation's tokens, the messages' text read as plain text (no special tokens from users). */
    private static int[] render(ChatTemplate tpl, Tokenizer tok, List<ChatMessage> history) {
        var rendered = tpl.renderMarked(history, true);
        return tok.encode(rendered.text(), true, true, rendered.contentRanges());
    }

    private static int commonPrefix(int[] a, int[] b, int limit) {
        int n = Math.min(Math.min(a.length, b.length), limit);
        int i = 0;
        while (i < n && a[i] == b[i]) {
            i++;
        }
        return i;
    }
}
