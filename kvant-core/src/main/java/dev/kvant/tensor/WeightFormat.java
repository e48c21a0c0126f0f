package dev.kvant.tensor;

import dev.kvant.gguf.GgmlType;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.util.Objects;

/**
 * How the weights of one GGML tensor type are laid out in bytes, and the kernels that read them.
 *
 * <p>Layouts are bit-exact with GGUF/ggml blocks, little-endian. All offsets are byte offsets into the segment;
 * {@code n} counts values and must be a multiple of {@link #blockSize()}.
 *
 * <p><b>The one arithmetic of a dot product.</b> Every kernel that multiplies weights with a vector (here,
 * {@link WeightMatrix#matvec} and {@link WeightMatrix#matmul}) computes exactly this, so their results agree bit
 * for bit: with {@code w[k]} the value {@link #dequantize} produces (every format's dequantized value is a fixed
 * float: scale products are exact in float, and the only rounding, K-quants' {@code d*sc*q - dmin*m}, happens
 * once), the values are taken in chunks of L (L = the preferred float vector length, 16 on AVX-512): blocks in
 * order, and within a block the chunks in the format's fixed order (natural, or for packed formats the order
 * their bytes hold them in); lane {@code j} of an accumulator that starts at zero takes
 * {@code acc = fma(w[k], x[k], acc)} for the j-th value of each chunk; the lanes are then summed by the fixed
 * pairwise tree of {@code Lanes.sum}. A partial last chunk (plain float formats only) is padded with zeros.
 * Nothing in that depends on threads, tiling or call site.
 */
public sealed interface WeightFormat
        permits F32Format, F16Format, Bf16Format, Q8_0Format, Q4_0Format, Q4_KFormat, Q5_KFormat, Q6_KFormat {

    /** The format of a GGML type, or an {@link UnsupportedTensorTypeException} naming the supported ones. */
    static WeightFormat of(GgmlType type) {
        return switch (type) {
            case F32 -> F32Format.INSTANCE;
            case F16 -> F16Format.INSTANCE;
            case BF16 -> Bf16Format.INSTANCE;
            case Q8_0 -> Q8_0Format.INSTANCE;
            case Q4_0 -> Q4_0Format.INSTANCE;
            case Q4_K -> Q4_KFormat.INSTANCE;
            case Q5_K -> Q5_KFormat.INSTANCE;
            case Q6_K -> Q6_KFormat.INSTANCE;
            default -> throw new UnsupportedTensorTypeException(type);
        };
    }

    GgmlType type();

    /** Values per block. */
    default int blockSize() {
        return type().blockSize;
    }

    /** Bytes per block. */
    default int blockBytes() {
        return type().blockBytes;
    }

    /** Bytes taken by {@code n} values (n a multiple of the block size). */
    default long bytesFor(long n) {
        return n / blockSize() * blockBytes();
    }

    /** Decodes {@code n} values starting at {@code byteOffset} into {@code dst[dstOffset ..]}. */
    default void dequantize(MemorySegment src, long byteOffset, float[] dst, int dstOffset, int n) {
        Blocks.check(this, n);
        Objects.checkFromIndexSize(dstOffset, n, dst.length);
        FusedRows kernels = (FusedRows) this;
        if (!src.isNative()) {
            // a confined arena, closed after the kernel: an automatic one could be freed while the kernel reads
            // the copy through its raw address (nothing else would hold the segment)
            try (Arena arena = Arena.ofConfined()) {
                MemorySegment copy = arena.allocate(bytesFor(n), 16);
                MemorySegment.copy(src, byteOffset, copy, 0, bytesFor(n));
                kernels.decode(RawMemory.address(copy, 0, bytesFor(n)), dst, dstOffset, n);
            }
            return;
        }
        kernels.decode(RawMemory.address(src, byteOffset, bytesFor(n)), dst, dstOffset, n);
    }

    /**
     * The dot product of {@code n} weights at {@code byteOffset} with {@code x[xOffset ..]}, fused with decoding.
     * Native segments are read in place; a heap segment's bytes are copied to native memory first.
     */
    default float dot(MemorySegment w, long byteOffset, float[] x, int xOffset, int n) {
        Blocks.check(this, n);
        Objects.checkFromIndexSize(xOffset, n, x.length);
        FusedRows kernels = (FusedRows) this;
        if (!w.isNative()) {
            try (Arena arena = Arena.ofConfined()) {   // as in dequantize
                MemorySegment copy = arena.allocate(bytesFor(n), 16);
                MemorySegment.copy(w, byteOffset, copy, 0, bytesFor(n));
                return kernels.dot1(RawMemory.address(copy, 0, bytesFor(n)), x, xOffset, n);
            }
        }
        return kernels.dot1(RawMemory.address(w, byteOffset, bytesFor(n)), x, xOffset, n);
    }

    /**
     * Encodes {@code n} values. Round-to-nearest as ggml's reference quantizers do; for K-quants a plain
     * (non-imatrix) search of scales and mins. Meant for tests and synthetic models, not for speed.
     */
    void quantize(float[] src, int srcOffset, int n, MemorySegment dst, long byteOffset);
}
