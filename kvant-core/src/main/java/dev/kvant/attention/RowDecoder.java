package dev.kvant.attention;

import dev.kvant.kv.HalfFormat;
import dev.kvant.kv.Int8Format;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.kv.Q4Format;
import dev.kvant.kv.TurboFormat;

/**
 * Reads rows of one KV format, as they lie in the cache, into a float tile: the only uncompressed copy attention
 * makes, a few dozen rows that stay in L1. One implementation per format family, each vectorized for its layout
 * and bit for bit equal to {@link KvFormat#decode} (a test checks it): f16 widens runs of adjacent rows with the
 * hardware's conversion (through C2) or single rows by exponent arithmetic, q8_0/int8
 * convert bytes and scale per block, q4_0 splits nibbles, turbo formats look their codes up in a register-resident
 * centroid table.
 */
sealed interface RowDecoder permits HalfRows, Int8Rows, Q4Rows, TurboRows {

    static RowDecoder of(KvFormat format, int headDim) {
        return switch (format) {
            case HalfFormat h -> new HalfRows(h == HalfFormat.BF16, headDim);
            case Int8Format f -> new Int8Rows(f.blockSize(), headDim);
            case Q4Format f -> new Q4Rows(f.domainDim(headDim));
            case TurboFormat t -> new TurboRows(t, headDim);
            case PageMeanFormat m -> of(m.base(), headDim);   // the means are the caller's (PartitionWorker)
        };
    }

    /** Floats written per row: the format's domain dimension. */
    int dim();

    /**
     * Decodes the rows at byte offsets {@code offs[0..count)} of src into {@code dst[k·stride, k·stride + dim())};
     * the rest of each tile row is left alone. src holds cache bytes staged from the pool: vector loads from a heap
     * array measured 2.5x faster than the same loads from a native segment (14 vs 5.5 ns per q8_0 row).
     */
    void decode(byte[] src, int[] offs, int count, float[] dst, int stride);
}
