package dev.kvant.cuda.attention;

import dev.kvant.cuda.DeviceBuffer;

/**
 * The q, k and v rows of {@code n} vectors as the fused q|k|v projection leaves them ({@code qkv}: [n][heads·headDim
 * + kvHeads·(headDim + headDimV)]) and what RoPE needs to rotate q and k: model.cu's kvant_rope_split splits them
 * into {@code q}, {@code k} and {@code v}; {@link CudaAttention#writeRoped} rotates them straight into the cache.
 *
 * @param positions  int32 [n], vector t's position; or null for {@code start + t} (one sequence's prefill)
 * @param angles     (cos, sin) of each pair at each vector's position (model.cu's kvant_rope_angles)
 * @param qNorm      per-head RMSNorm weights of q (qwen3), or null; likewise {@code kNorm}
 * @param tables     page tables: vector t's at tables + t·seqStride·tableStride
 * @param slots      int32 [n] that gets each vector's cache slot, or null where this step's slots are already
 *                   written (each stage's first local layer writes them for its others)
 * @param prevPages  int32 [n] for a centered K format's page means (kv_write.cu's kvant_kv_page_means), or null
 */
public record RopeRows(DeviceBuffer qkv, int n, DeviceBuffer positions, int start, DeviceBuffer q, DeviceBuffer k,
                       DeviceBuffer v, DeviceBuffer angles, int ropeDim, boolean neox, int heads, int kvHeads,
                       int headDim, int headDimV, DeviceBuffer qNorm, DeviceBuffer kNorm, float eps,
                       DeviceBuffer tables, int tableStride, int seqStride, int pageTokens, DeviceBuffer slots,
                       DeviceBuffer prevPages) {
}
