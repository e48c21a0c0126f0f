package dev.kvant.kv;

/**
 * The shape of a model's KV cache: layers, kv heads per layer, and the K and V head sizes (which may differ).
 */
public record KvGeometry(int layers, int kvHeads, int headDimK, int headDimV) {
    public KvGeometry {
        if (layers <= 0 || kvHeads <= 0 || headDimK <= 0 || headDimV <= 0) {
            throw new IllegalArgumentException("KV geometry needs positive sizes, got layers=" + layers + " kvHeads="
                    + kvHeads + " headDimK=" + headDimK + " headDimV=" + headDimV);
        }
    }
}
