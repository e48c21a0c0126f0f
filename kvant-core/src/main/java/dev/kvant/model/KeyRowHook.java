package dev.kvant.model;

import dev.kvant.kv.KvSequence;

/**
 * Sees, and may change, the K rows of one layer just before a forward call writes them to a sequence's cache: the
 * instrumentation point of studies of key encodings ({@link dev.kvant.engine.KeyStudy}). Not for production paths.
 */
@FunctionalInterface
public interface KeyRowHook {
    /**
     * @param k rows [n][kvHeads][headDimK] from {@code kOffset}, unrotated, for positions position .. position+n-1
     */
    void beforeWrite(KvSequence seq, int layer, int position, int n, float[] k, int kOffset);
}
