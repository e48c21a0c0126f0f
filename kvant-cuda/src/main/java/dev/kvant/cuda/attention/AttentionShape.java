package dev.kvant.cuda.attention;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.PageMeanFormat;

/**
 * What the attention kernels are compiled and launched for: the cache's geometry, formats and page size, and the
 * number of query heads (a multiple of the kv heads; their ratio is the GQA group).
 *
 * <p>The device kernels take head sizes 64, 128 and 256 (the head sizes of the llama family and its relatives) and
 * pages of a multiple of 8 tokens, which keeps every page start 16-byte aligned for the 16-byte tile loads.
 */
public record AttentionShape(KvGeometry geometry, int heads, KvFormat kFormat, KvFormat vFormat, int pageTokens) {
    public AttentionShape {
        if (vFormat instanceof PageMeanFormat) {
            throw new IllegalArgumentException("V cache format " + vFormat.name() + ": only keys are centered on "
                    + "their page's mean");
        }
        checkHeads(heads, geometry.kvHeads(), geometry.headDimK(), geometry.headDimV());
        if (pageTokens <= 0 || pageTokens % 8 != 0) {
            throw new IllegalArgumentException("the GPU KV cache needs pages of a multiple of 8 tokens (16-byte aligned "
                    + "page starts for its tile loads), got pageTokens=" + pageTokens);
        }
        if (kFormat instanceof PageMeanFormat
                && AttentionSource.prefillSharedBytes(geometry, kFormat, vFormat) > AttentionSource.MAX_SHARED) {
            throw new IllegalArgumentException("K format " + kFormat.name() + " with V " + vFormat.name() + " and head "
                    + "size " + geometry.headDimK() + ": the prefill tiles and the staged key means do not fit in "
                    + "shared memory; use " + PageMeanFormat.rows(kFormat).name() + " keys, or a quantized V format");
        }
    }

    /** The shape of attention with {@code heads} query heads over a host cache's layout. */
    public static AttentionShape of(KvCache cache, int heads) {
        return new AttentionShape(cache.geometry(), heads, cache.kFormat(), cache.vFormat(), cache.pageTokens());
    }

    /**
     * Refuses a model whose heads the device kernels do not take (head sizes, query heads per kv head) before
     * anything of it is uploaded: the same rules as a shape of its own.
     */
    public static void checkHeads(int heads, int kvHeads, int headDimK, int headDimV) {
        if (heads <= 0 || kvHeads <= 0 || heads % kvHeads != 0) {
            throw new IllegalArgumentException("attention needs a positive multiple of the " + kvHeads
                    + " kv heads as query heads, got " + heads);
        }
        checkHeadDim("K", headDimK);
        checkHeadDim("V", headDimV);
    }

    private static void checkHeadDim(String what, int d) {
        if (d != 64 && d != 128 && d != 256) {
            throw new IllegalArgumentException("the GPU attention kernels take " + what + " head sizes 64, 128 and 256, "
                    + "got " + d);
        }
    }

    public int kvHeads() {
        return geometry.kvHeads();
    }

    /** Query heads per kv head. */
    public int group() {
        return heads / geometry.kvHeads();
    }

    public int headDimK() {
        return geometry.headDimK();
    }

    public int headDimV() {
        return geometry.headDimV();
    }

    public long kRowBytes() {
        return kFormat.rowBytes(geometry.headDimK());
    }

    public long vRowBytes() {
        return vFormat.rowBytes(geometry.headDimV());
    }

    /** A K page's bytes: its rows, and the key means of a {@link PageMeanFormat} (KvCache's layout). */
    public long kPageBytes() {
        return KvCache.kPageBytes(geometry, kFormat, pageTokens);
    }

    public long vPageBytes() {
        return (long) pageTokens * geometry.kvHeads() * vRowBytes();
    }
}
