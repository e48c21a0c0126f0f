package dev.kvant.backend;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.LlamaModel;

/**
 * Where a model's arithmetic runs. The model ({@link LlamaModel}: configuration, host weights, tokenizer) says what
 * to compute; a backend computes it and owns the KV caches of its sequences. {@link CpuBackend} runs on the host;
 * the CUDA backend (module kvant-cuda) keeps the weights and caches on a GPU.
 */
public interface Backend extends AutoCloseable {

    /** "cpu", "cuda", ... as reported by benchmarks. */
    String name();

    /** The model this backend runs; its configuration and tokenizer. */
    LlamaModel model();

    /** Worker threads of the host side (reported by benchmarks). */
    int threads();

    /**
     * A new empty sequence with room for contextLength tokens, its keys and values stored in each layer's formats.
     *
     * @throws IllegalArgumentException when the backend cannot hold that context (says how much it can), or keeps
     *                                  no cache in those formats (says which it keeps)
     */
    BackendSequence newSequence(int contextLength, KvLayerFormats formats);

    /** As {@link #newSequence(int, KvLayerFormats)} with keys stored as kFormat and values as vFormat in every layer. */
    default BackendSequence newSequence(int contextLength, KvFormat kFormat, KvFormat vFormat) {
        return newSequence(contextLength, KvLayerFormats.of(kFormat, vFormat));
    }

    /**
     * One decode step for several sequences together: tokens[i] is appended to seqs[i] and the logits after it are
     * written to logits[i*vocab .. (i+1)*vocab). Each row equals what {@code seqs[i].forward} gives alone, bit for
     * bit. The sequences must be distinct and belong to this backend.
     */
    void decodeBatch(BackendSequence[] seqs, int[] tokens, float[] logits);

    /**
     * As {@link #decodeBatch} but returning, per sequence, the id of its largest logit (the lowest among equal ones)
     * instead of the logits: a device backend chooses there and copies back one id per sequence.
     */
    default int[] decodeBatchGreedy(BackendSequence[] seqs, int[] tokens) {
        int vocab = model().config().vocabSize();
        float[] logits = new float[seqs.length * vocab];
        decodeBatch(seqs, tokens, logits);
        int[] ids = new int[seqs.length];
        float[] row = new float[vocab];
        for (int i = 0; i < seqs.length; i++) {
            System.arraycopy(logits, i * vocab, row, 0, vocab);
            ids[i] = dev.kvant.sample.Sampler.argmax(row, vocab);
        }
        return ids;
    }

    /**
     * How many decode steps of different sequences may be in flight at once ({@link #startDecode}) to keep every
     * device busy: the stages of a layer split over several GPUs, so that while one GPU runs its layers for some
     * sequences the next runs its layers for others; 1 where one step at a time keeps the hardware busy.
     */
    default int pipelineDepth() {
        return 1;
    }

    /**
     * Starts one decode step, as {@link #decodeBatch} when logits is given (the rows land there by the time the
     * step's {@link PendingDecode#await} returns; the caller leaves the array alone until then) and as {@link
     * #decodeBatchGreedy} when it is null. A device backend queues the work and returns at once; this default
     * computes the step before returning. Until the step is awaited its sequences take no other work (a backend
     * refuses it), and at most {@link #pipelineDepth} steps are pending at once.
     */
    default PendingDecode startDecode(BackendSequence[] seqs, int[] tokens, float[] logits) {
        if (logits != null) {
            decodeBatch(seqs, tokens, logits);
            return () -> null;
        }
        int[] ids = decodeBatchGreedy(seqs, tokens);
        return () -> ids;
    }

    /**
     * Whether {@link #startDecodeDrawn} draws tokens at a temperature where the model runs (a device backend then
     * copies back one id a sequence, not its logits).
     */
    default boolean drawsWhereItRuns() {
        return false;
    }

    /**
     * Starts one decode step as {@link #startDecode(BackendSequence[], int[], float[])}, and its {@link
     * PendingDecode#await} returns an id a sequence chosen as {@code draws} says: the largest logit, or a draw at a
     * temperature made where the model runs. With logits given, every row's logits land there too (for the
     * sequences drawn on the host; a row whose draw has a penalty lands penalized). Only where {@link
     * #drawsWhereItRuns}.
     */
    default PendingDecode startDecodeDrawn(BackendSequence[] seqs, int[] tokens, Draws draws, float[] logits) {
        throw new UnsupportedOperationException("the " + name() + " backend draws no tokens where it runs");
    }

    /**
     * One KV page pool with room for this many tokens (summed over its sequences), shared by the sequences made from
     * it, so that prefixes can be shared and pages counted; what a server runs on.
     *
     * @throws UnsupportedOperationException on a backend that has no shared pool yet
     */
    default SequencePool newSequencePool(int tokens, KvLayerFormats formats) {
        throw new UnsupportedOperationException("the " + name() + " backend cannot share one KV page pool between"
                + " sequences yet (kvant serve needs that); use --backend cpu");
    }

    /** As {@link #newSequencePool(int, KvLayerFormats)} with one K and one V format in every layer. */
    default SequencePool newSequencePool(int tokens, KvFormat kFormat, KvFormat vFormat) {
        return newSequencePool(tokens, KvLayerFormats.of(kFormat, vFormat));
    }

    @Override
    void close();
}
