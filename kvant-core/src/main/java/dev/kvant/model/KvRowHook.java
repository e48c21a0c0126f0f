package dev.kvant.model;

import dev.kvant.kv.KvSequence;

/**
 * Sees, and may change, the K and V rows of one layer just before a forward call writes them to a sequence's cache: the
 * instrumentation point of studies of key encodings ({@link dev.kvant.engine.KeyStudy}). Not for production paths.
 */
@FunctionalInterface
public interface KvRowHook {
    /**
     * @param q the queries of those positions, [n][heads][headDimK] from {@code qOffset} (read only)
     * @param k rows [n][kvHeads][headDimK] from {@code kOffset}, unrotated, for positions position .. position+n-1
     * @param v rows [n][kvHeads][headDimV] from {@code vOffset}
     */
    void beforeWrite(KvSequence seq, int layer, int position, int n, float[] q, int qOffset, float[] k, int kOffset,
                     float[] v, int vOffset);
}
