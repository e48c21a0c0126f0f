package dev.kvant.engine;

import dev.kvant.sample.Sampler;
import dev.kvant.tokenizer.StreamDecoder;
import dev.kvant.tokenizer.Tokenizer;

import java.util.function.Consumer;

/** Prompt in, streamed text out: prefill, then sample and decode one token at a time until a stop. */
public final class Generator {

    /**
     * Timings of one generation; rates in tokens per second. The first generated token comes from the prompt's
     * logits, so the generation's time is that of {@code decodes} forward passes: one fewer than the tokens when it
     * stopped at the length or the context, as many when an end-of-generation token (not counted) came after them.
     */
    public record Stats(int promptTokens, double promptSeconds, int[] tokens, int decodes, double generateSeconds,
                        String stopReason) {
        public int generatedTokens() {
            return tokens.length;
        }

        public double promptRate() {
            return promptTokens / Math.max(promptSeconds, 1e-9);
        }

        /** Forward passes a second while generating; NaN when there were none (a reply of one token). */
        public double generateRate() {
            return decodes == 0 ? Double.NaN : decodes / Math.max(generateSeconds, 1e-9);
        }
    }

    private Generator() {
    }

    /**
     * Generates up to maxTokens after the prompt (or until an end-of-generation token, or the context is full),
     * handing each complete piece of text to out as soon as it is known.
     */
    public static Stats generate(Session session, Tokenizer tokenizer, int[] prompt, int maxTokens, Sampler sampler,
                                 Consumer<String> out) {
        if (prompt.length == 0) {
            throw new IllegalArgumentException("the prompt is empty");
        }
        if (session.position() + prompt.length > session.contextLength()) {
            throw new ContextFullException("the prompt has " + prompt.length + " tokens but the context holds "
                    + (session.contextLength() - session.position()) + " more"
                    + " (raise -c, or --kv-mem where it set the context)");
        }
        for (int t : prompt) {
            sampler.accept(t);
        }
        // a greedy sampler's choice, and a decode step's draw where the sampler allows it, are made by the backend: a
        // device backend then copies back one id a token
        long t0 = System.nanoTime();
        int next = session.prefillSampled(prompt, sampler);
        long t1 = System.nanoTime();
        StreamDecoder decoder = tokenizer.streamDecoder();
        int generated = 0;
        int decodes = 0;
        int[] ids = new int[Math.max(0, Math.min(maxTokens, session.contextLength()))];
        String stop = "length";
        while (generated < maxTokens) {
            if (tokenizer.isEndOfGeneration(next)) {
                stop = "eog";
                break;
            }
            ids[generated++] = next;
            sampler.accept(next);
            String piece = decoder.feed(next);
            if (!piece.isEmpty()) {
                out.accept(piece);
            }
            if (generated == maxTokens) {
                break;
            }
            if (session.position() >= session.contextLength()) {
                stop = "context";
                break;
            }
            next = session.decodeSampled(next, sampler);
            decodes++;
        }
        String rest = decoder.flush();
        if (!rest.isEmpty()) {
            out.accept(rest);
        }
        long t2 = System.nanoTime();
        return new Stats(prompt.length, (t1 - t0) / 1e9, java.util.Arrays.copyOf(ids, generated), decodes,
                (t2 - t1) / 1e9, stop);
    }
}
