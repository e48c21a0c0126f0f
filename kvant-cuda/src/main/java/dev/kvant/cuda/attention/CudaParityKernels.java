package dev.kvant.cuda.attention;

import dev.kvant.attention.AttentionKernel;
import dev.kvant.attention.AttentionOptions;
import dev.kvant.attention.AttentionProblem;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;

import java.lang.foreign.MemorySegment;
import java.util.List;

/**
 * The CUDA attention kernels as {@code kvant parity} runs them: the problem's host cache is mirrored to the device
 * byte for byte and each kernel computes all of the problem's outputs — decode one token at a time, multi-query
 * decode of every token in one launch (at most {@link AttentionPlan#MAX_QUERIES}), and prefill. They multiply f16
 * (bf16 for a bf16 cache) operands on the tensor cores with f32 accumulation, so their bound against the float64
 * reference is the GPU tests' (AttentionGpuTest): NMSE 2e-5, 2e-4 with a bf16 cache.
 */
public final class CudaParityKernels {
    private CudaParityKernels() {
    }

    public static List<AttentionKernel> kernels(CudaContext context) {
        KernelCache cache = KernelCache.open(context);
        return List.of(kernel("cuda-decode", context, cache, Mode.DECODE),
                kernel("cuda-multi-query", context, cache, Mode.MULTI),
                kernel("cuda-prefill", context, cache, Mode.PREFILL));
    }

    private enum Mode { DECODE, MULTI, PREFILL }

    /** NMSE bound of the tensor-core kernels (f16 operands), and with a bf16 cache. */
    static final double BOUND = 2e-5;
    static final double BOUND_BF16 = 2e-4;

    private static AttentionKernel kernel(String name, CudaContext context, KernelCache cache, Mode mode) {
        return new AttentionKernel() {
            private boolean bf16;

            @Override
            public String name() {
                return name;
            }

            @Override
            public int maxQueries() {
                return mode == Mode.MULTI ? AttentionPlan.MAX_QUERIES : Integer.MAX_VALUE;
            }

            @Override
            public double nmseBound(double cpuBound) {
                return Math.max(cpuBound, bf16 ? BOUND_BF16 : BOUND);
            }

            @Override
            public void run(AttentionProblem p, AttentionOptions o, float[] out) {
                if (o.softCap() != 0f) {
                    throw new IllegalArgumentException("the CUDA attention kernels have no logit soft-cap yet");
                }
                int n = p.n();
                if (mode == Mode.MULTI && n > AttentionPlan.MAX_QUERIES) {
                    throw new IllegalArgumentException("multi-query decode takes at most " + AttentionPlan.MAX_QUERIES
                            + " queries, the problem has " + n);
                }
                int total = p.start() + n;
                AttentionShape shape = AttentionShape.of(p.cache(), p.heads());
                bf16 = shape.kFormat().name().equals("bf16") || shape.vFormat().name().equals("bf16");
                AttentionPlan plan = AttentionPlan.of(1, Math.min(n, AttentionPlan.MAX_QUERIES), total, n);
                int hq = p.heads() * shape.headDimK();
                int hv = p.heads() * shape.headDimV();
                CudaStream stream = context.defaultStream();
                try (CudaAttention attention = CudaAttention.create(context, cache, shape, plan, p.scale(), o.sparseV());
                     CudaKvCache kv = CudaKvCache.mirror(context, p.cache());
                     DeviceBatch batch = DeviceBatch.allocate(context, 1, p.seq().pageCount());
                     DeviceBuffer q = context.allocate(4L * n * hq);
                     DeviceBuffer result = context.allocate(4L * n * hv)) {
                    batch.set(0, p.seq());
                    q.copyFromHost(MemorySegment.ofArray(p.queries()));
                    switch (mode) {
                        case DECODE -> {
                            for (int t = 0; t < n; t++) {
                                batch.setLength(0, p.start() + t + 1);
                                batch.upload();
                                attention.decode(kv, 0, q.slice(4L * t * hq, 4L * hq), batch, 1,
                                        result.slice(4L * t * hv, 4L * hv), stream);
                            }
                            context.synchronize();
                            result.copyToHost(MemorySegment.ofArray(out).asSlice(0, 4L * n * hv));
                        }
                        case MULTI -> {
                            batch.setLength(0, total);
                            batch.upload();
                            attention.decodeMulti(kv, 0, q, batch, 1, n, result, stream);
                            context.synchronize();
                            result.copyToHost(MemorySegment.ofArray(out).asSlice(0, 4L * n * hv));
                        }
                        case PREFILL -> {
                            batch.setLength(0, total);
                            batch.upload();
                            attention.prefill(kv, 0, q, batch, 0, p.start(), n, result, stream);
                            context.synchronize();
                            result.copyToHost(MemorySegment.ofArray(out).asSlice(0, 4L * n * hv));
                        }
                    }
                }
            }
        };
    }
}
