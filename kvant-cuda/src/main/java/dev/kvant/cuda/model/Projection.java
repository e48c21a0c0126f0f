package dev.kvant.cuda.model;

import dev.kvant.cuda.CublasLt;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaDataType;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.tensor.WeightMatrix;

import java.util.ArrayList;
import java.util.List;

/**
 * A linear layer made of one or more weight matrices whose outputs sit side by side (q|k|v, gate|up). Matrices of
 * one format are stacked into one {@link DeviceMatrix} (one launch); a change of format starts a new part.
 */
final class Projection implements AutoCloseable {
    private final List<DeviceMatrix> parts;
    private final int[] offsets;
    private final int rows;
    private final int cols;

    /** The parts as uploaded, side by side in this order (tests build them without a device). */
    Projection(List<DeviceMatrix> parts) {
        this.parts = parts;
        this.offsets = new int[parts.size()];
        int r = 0;
        for (int i = 0; i < parts.size(); i++) {
            offsets[i] = r;
            r += parts.get(i).rows();
        }
        this.rows = r;
        this.cols = parts.getFirst().cols();
    }

    static Projection upload(CudaContext context, WeightMatrix... matrices) {
        List<DeviceMatrix> parts = new ArrayList<>();
        try {
            int i = 0;
            while (i < matrices.length) {
                int j = i + 1;
                while (j < matrices.length && matrices[j].format().type() == matrices[i].format().type()) {
                    j++;
                }
                WeightMatrix[] run = new WeightMatrix[j - i];
                System.arraycopy(matrices, i, run, 0, run.length);
                parts.add(DeviceMatrix.upload(context, run));
                i = j;
            }
        } catch (RuntimeException | Error e) {
            parts.forEach(DeviceMatrix::close);
            throw e;
        }
        return new Projection(parts);
    }

    int rows() {
        return rows;
    }

    int cols() {
        return cols;
    }

    /** The stacked matrices side by side: one per run of a format. */
    int parts() {
        return parts.size();
    }

    /** One stacked matrix: a single launch serves every output. */
    boolean single() {
        return parts.size() == 1;
    }

    DeviceMatrix only() {
        return parts.getFirst();
    }

    long byteSize() {
        long b = 0;
        for (DeviceMatrix m : parts) {
            b += m.byteSize();
        }
        return b;
    }

    /** out[v][offset + r] (stride outStride) = W x[v] (+ bias), MV_STORE or MV_ADD. */
    void matvec(ModelKernels k, ModelKernels.Vectors x, int nvec, DeviceBuffer out, int outStride,
                DeviceBuffer bias, int mode, CudaStream stream) {
        for (int i = 0; i < parts.size(); i++) {
            DeviceMatrix m = parts.get(i);
            long off = 4L * offsets[i];
            k.matvec(m, m.rows(), x, nvec, out.slice(off, out.byteSize() - off), outStride,
                    bias == null ? null : bias.slice(off, bias.byteSize() - off), mode, 0, stream);
        }
    }

    /** Some part's products read the vectors' 8-bit form. */
    boolean readsQ8() {
        for (DeviceMatrix m : parts) {
            if (m.layout().q8Vectors) {
                return true;
            }
        }
        return false;
    }

    /**
     * Prompt chunks of at most this many tokens multiply the quantized weights directly ({@link
     * ModelKernels#matmulHalf}: each weight read from memory and decoded once per 32 tokens) instead of writing an
     * f16 copy of every weight for cuBLASLt, which costs the same whatever the chunk (docs/BENCHMARKS.md, "Short
     * prompt chunks"). The system property {@code kvant.cuda.fusedGemmTokens} overrides it (0: always cuBLASLt),
     * for side-by-side measurements.
     */
    static final int FUSED_GEMM_TOKENS = Integer.getInteger("kvant.cuda.fusedGemmTokens", 64);

    /** A chunk of n tokens goes through the dequantizing products: at most {@link #FUSED_GEMM_TOKENS}, 8-bit parts. */
    boolean fused(int n) {
        return n <= FUSED_GEMM_TOKENS && parts.stream().allMatch(m -> m.layout().q8Vectors);
    }

    /** The weights are the GEMM's f16 operand as uploaded: one F16 matrix, rows of halves one after another. */
    boolean inPlace() {
        return single() && only().layout() == WeightLayout.F16;
    }

    /**
     * out f32 [n][rows] = xh (f16 [n][cols]) · Wᵀ, or out += that when accumulate. Short chunks of quantized weights
     * go through {@link ModelKernels#matmulHalf} (its partial sums in {@code scratch}); F16 weights go to cuBLASLt
     * as they are; the others through {@code scratch} as f16 (rows x cols), dequantized part by part. Either way
     * the weights' f16 values are the same.
     */
    void gemm(ModelKernels k, CublasLt blas, DeviceBuffer xh, int n, DeviceBuffer out, boolean accumulate,
              DeviceBuffer scratch, CudaStream stream) {
        if (fused(n)) {
            for (int i = 0; i < parts.size(); i++) {
                long off = 4L * offsets[i];
                k.matmulHalf(parts.get(i), xh, n, out.slice(off, out.byteSize() - off), rows, accumulate, scratch,
                        stream);
            }
            return;
        }
        if (inPlace()) {
            blas.gemm(xh, only().data(), out, n, rows, cols, CudaDataType.F16, CudaDataType.F32, accumulate, stream);
            return;
        }
        for (int i = 0; i < parts.size(); i++) {
            DeviceMatrix m = parts.get(i);
            long off = 2L * offsets[i] * cols;
            k.dequantize(m, scratch.slice(off, 2L * m.rows() * cols), stream);
        }
        blas.gemm(xh, scratch, out, n, rows, cols, CudaDataType.F16, CudaDataType.F32, accumulate, stream);
    }

    /**
     * The scratch {@link #gemm} needs for chunks of up to maxTokens: none for F16 weights, the partial sums of the
     * dequantizing products for short chunks of 8-bit formats (up to {@link ModelKernels#MH_MAX_SPLITS} column
     * ranges of the chunk's tokens), else an f16 copy of the weights (rows x cols).
     */
    long gemmScratchBytes(int maxTokens) {
        if (inPlace()) {
            return 0;
        }
        long copy = 2L * rows * cols;
        if (!fused(1)) {
            return copy;
        }
        long partial = 4L * ModelKernels.MH_MAX_SPLITS * Math.min(maxTokens, FUSED_GEMM_TOKENS) * rows;
        return maxTokens <= FUSED_GEMM_TOKENS ? partial : Math.max(partial, copy);
    }

    @Override
    public void close() {
        parts.forEach(DeviceMatrix::close);
    }
}
