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
 * decode of every token in one launch (at most {@link AttentionPlan#MAX_QUERIES}), and prefill.
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

    private static AttentionKernel kernel(String name, CudaContext context, KernelCache cache, Mode mode) {
        return new AttentionKernel() {
            @Override
            public String name() {
                return name;
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
