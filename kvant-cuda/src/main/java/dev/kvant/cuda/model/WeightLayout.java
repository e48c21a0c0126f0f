package dev.kvant.cuda.model;

import dev.kvant.gguf.GgmlType;

/**
 * How a weight format lies in device memory, as model.cu's {@code W_*} ids and {@code dq8} read it. Q8_0, Q4_0 and
 * Q6_K are repacked into a plane of block quants and a plane of block scales (Q6_K: the super-block's 208 bytes of
 * quants and sub-block scales, then its f16 d in the scale plane), so a block's quants are aligned loads; the others
 * keep GGUF's row layout. Either way the bits are GGUF's. Decode multiplies the quantized formats by the vectors'
 * 8-bit form (integer dot products), F32, F16 and BF16 by their floats.
 */
enum WeightLayout {
    F32(0, "f32", GgmlType.F32, false, false),
    F16(1, "f16", GgmlType.F16, false, false),
    BF16(2, "bf16", GgmlType.BF16, false, false),
    Q8_0(3, "q8_0", GgmlType.Q8_0, true, true),
    Q4_0(4, "q4_0", GgmlType.Q4_0, true, true),
    Q4_K(5, "q4_k", GgmlType.Q4_K, false, true),
    Q5_K(6, "q5_k", GgmlType.Q5_K, false, true),
    Q6_K(7, "q6_k", GgmlType.Q6_K, true, true);

    final int id;
    /** Suffix of the format's kernels in model.cu. */
    final String kernelSuffix;
    final GgmlType type;
    /** Repacked into a quant plane and a scale plane. */
    final boolean planar;
    /** Decode's products read the vectors' 8-bit form (model.cu kvant_mq1r*, and kvant_mt_* for batches). */
    final boolean q8Vectors;

    WeightLayout(int id, String kernelSuffix, GgmlType type, boolean planar, boolean q8Vectors) {
        this.id = id;
        this.kernelSuffix = kernelSuffix;
        this.type = type;
        this.planar = planar;
        this.q8Vectors = q8Vectors;
    }

    static WeightLayout of(GgmlType type) {
        for (WeightLayout l : values()) {
            if (l.type == type) {
                return l;
            }
        }
        throw new IllegalArgumentException("the CUDA backend has no kernels for weights of type " + type
                + " (it takes F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)");
    }

    /** Values of one block of the planes (planar layouts): 32, or Q6_K's super-block of 256. */
    int planeBlockValues() {
        return this == Q6_K ? 256 : 32;
    }

    /** Bytes of one block's quants in the quant plane (planar layouts). */
    int planeQuantBytes() {
        return switch (this) {
            case Q8_0 -> 32;
            case Q6_K -> 208;
            default -> 16;
        };
    }

    /** Bytes of one GGUF block (planar layouts): its f16 scale and its quants. */
    int ggufBlockBytes() {
        return 2 + planeQuantBytes();
    }

    /** Where a GGUF block keeps its f16 scale: first (Q8_0, Q4_0) or last (Q6_K's d); the quants fill the rest. */
    int ggufScaleOffset() {
        return this == Q6_K ? 208 : 0;
    }
}
