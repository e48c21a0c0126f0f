package dev.kvant.engine;

import dev.kvant.backend.Backend;
import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.SequencePool;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.LlamaModel;

/**
 * A backend that hands every call to another, for tests that watch or change a few of them. Only the interface's
 * own methods are forwarded; its defaults (decodeBatchGreedy, startDecode, pipelineDepth) run here, through the
 * overridable ones. Closing it leaves the inner backend open: that one is the test's.
 */
class ForwardingBackend implements Backend {
    final Backend inner;

    ForwardingBackend(Backend inner) {
        this.inner = inner;
    }

    @Override
    public String name() {
        return inner.name();
    }

    @Override
    public LlamaModel model() {
        return inner.model();
    }

    @Override
    public int threads() {
        return inner.threads();
    }

    @Override
    public BackendSequence newSequence(int contextLength, KvLayerFormats formats) {
        return inner.newSequence(contextLength, formats);
    }

    @Override
    public void decodeBatch(BackendSequence[] seqs, int[] tokens, float[] logits) {
        inner.decodeBatch(seqs, tokens, logits);
    }

    @Override
    public SequencePool newSequencePool(int tokens, KvLayerFormats formats) {
        return inner.newSequencePool(tokens, formats);
    }

    @Override
    public void close() {
    }
}
