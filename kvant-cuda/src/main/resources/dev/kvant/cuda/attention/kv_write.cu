// kv_write.cu — quantize on write (SET_ROWS): float rows of K or V into their cache slots, bit-identical to the CPU
// encoder dev.kvant.kv.KvFormat.encode of the JVM that compiled this module.
//
// kvant_kv_write_kv(k, v, rows, kvHeads, slots, kPool, vPool, pageTokens, kPageBytes, vPageBytes)
//   k, v  float [tokens][kvHeads][D] (D = DK for k, DV for v), rows = tokens * kvHeads
//   slots int32 [tokens]: physical token slot page * pageTokens + tokenInPage, read from device memory so a captured
//         graph writes wherever the slots say at replay; a negative slot skips its token (a padded batch)
//   pools the layer's K and V pools: page p at p * pageBytes, row (token t of the page, head h) at
//         (t * kvHeads + h) * rowBytes, as dev.kvant.kv.KvCache lays it out.
//
// grid:   (ceil(rows / 4), 2) blocks, y = 0 for K, 1 for V; block: 128 threads = 4 warps, one row per warp.
// shared: D bytes per warp (the codes of turbo rows, re-read to pack the bit planes); static.
// thread: lane l holds the row's elements 32j + l (j < D/32) in registers: the rotation's butterflies are warp
//         shuffles (distances 1..16) and register pairs (32, 64), block maxima are shuffle reductions, and the
//         lane writes its own bytes of the row (f16/bf16/q8_0/int8: one value per byte or pair; turbo and q4: packed
//         bytes assembled from the codes).
// exact:  every operation is the CPU's, in the CPU's order, with no contraction (__fmul_rn/__fadd_rn/__fmaf_rn
//         spell out the roundings; the CPU's mul-then-add stay two roundings): the rotation as in wht_block; q8_0,
//         int8 and q4 scales from the exact block maximum (max is order-free); the turbo norm ||y||^2 and the
//         centroid norm ||c||^2 are summed like KvLanes: KV_LANES lane-partial sums (lane p accumulates elements
//         p, p+L, p+2L, ... with fma in that order) added by the pairwise tree (lanes L/2 apart first). That order
//         depends on the CPU's vector width L (16 with AVX-512, 8 with AVX2), so Java passes its own L as KV_LANES:
//         the bytes equal the bytes of the CPU encoder of the same JVM; against a CPU of the other width a turbo
//         norm may differ in its last bit (docs/KV_FORMATS.md, Determinism).

template <int D>
__device__ __forceinline__ void load_row(const float* src, float* x, int lane) {
#pragma unroll
    for (int j = 0; j < D / 32; j++) x[j] = src[32 * j + lane];
}

// Sum of a·b over one block of N values held as a[j] = element 32j + lane, in the order of KvLanes: the partial of
// lane p (< L) is fma(a[p+(N/L-1)L], b[..], ..., fma(a[p+L], b[p+L], fma(a[p], b[p], 0))); then p and p^(L/2) are
// added, then p^(L/4), ..., as KvLanes.sumLanes does. Element p + Lk lives in register (Lk)/32 of lane (Lk)%32 + p.
template <int N>
__device__ __forceinline__ float lane_order_sum_prod(const float* a, const float* b, int lane) {
    constexpr int L = KV_LANES;
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < N / L; k++) {
        const int reg = (L * k) >> 5, src = ((L * k) & 31) + (lane % L);
        const float x = __shfl_sync(FULL_MASK, a[reg], src), y = __shfl_sync(FULL_MASK, b[reg], src);
        acc = __fmaf_rn(x, y, acc);
    }
#pragma unroll
    for (int h = L / 2; h >= 1; h >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(FULL_MASK, acc, h));
    return __shfl_sync(FULL_MASK, acc, 0);
}

template <int N>
__device__ __forceinline__ float lane_order_sum_sq(const float* v, int lane) {
    return lane_order_sum_prod<N>(v, v, lane);
}

__device__ __forceinline__ float warp_java_max(float v) {
#pragma unroll
    for (int h = 16; h >= 1; h >>= 1) v = java_max(v, __shfl_xor_sync(FULL_MASK, v, h));
    return v;
}
__device__ __forceinline__ float warp_java_min(float v) {
#pragma unroll
    for (int h = 16; h >= 1; h >>= 1) v = java_min(v, __shfl_xor_sync(FULL_MASK, v, h));
    return v;
}

// One block of 32 values (x = element lane) as q4_0: 18 bytes at blk.
__device__ __forceinline__ void encode_q4_block(float x, u8* blk, int lane) {
    const float hi = warp_java_max(x);
    const float lo = warp_java_min(x);
    const float m = (-lo > hi) ? lo : hi;
    const u16 dh = to_half_clamped(__fdiv_rn(m, -8.f));
    const float d = h2f(dh);
    const float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
    int code = __float2int_rz(__fadd_rn(__fmul_rn(x, id), 8.5f));
    code = min(max(code, 0), 15);
    const int upper = __shfl_down_sync(FULL_MASK, code, 16);
    if (lane == 0) *(u16*) blk = dh;
    if (lane < 16) blk[2 + lane] = (u8) (code | (upper << 4));
}

// ---- turbo encoding in three steps, shared by the one-warp-a-row writer (encode_row: the gains one after the
// other) and the one-block-a-row writer (write_row_gains: one gain a warp): the same operations on the same values,
// so both give the CPU's bytes.

// Lane l < 2^BITS: centroid l of the format's codebook (read with a shuffle by code).
template <int FMT, int N>
__device__ __forceinline__ float turbo_centroid(int lane) {
    constexpr int BITS = fmt_bits(FMT);
    return lane < (1 << BITS) ? kv_centroid[BITS - 2][N == 128 ? 1 : 0][lane] : 0.f;
}

// Rotates one block of N values (y[j] = element 32j + lane) into the format's domain, subtracts the page mean (mean:
// the block's N fp16 values, or null) and returns the block's norm s.
template <int N>
__device__ __forceinline__ float turbo_rotate(float* y, const u16* mean, int lane) {
    constexpr int R = N / 32;
    wht_block<N>(y, lane, false);
    if (mean != nullptr) {
#pragma unroll
        for (int j = 0; j < R; j++) y[j] = __fsub_rn(y[j], h2f(mean[32 * j + lane]));
    }
    return __fsqrt_rn(lane_order_sum_sq<N>(y, lane));
}

// Gain a of TurboFormat.GAINS: the nearest-centroid codes of y * inv under that gain's boundaries (code[j] for
// element 32j + lane), their squared norm cc, and the cosine between the decoded codes and y (returned).
template <int FMT, int N>
__device__ __forceinline__ float turbo_try_gain(const float* y, float inv, int a, float cent, int lane,
                                                int (&code)[N / 32], float& cc) {
    constexpr int R = N / 32;
    constexpr int BITS = fmt_bits(FMT);
    constexpr int NI = N == 128 ? 1 : 0;
    float c[R];
#pragma unroll
    for (int j = 0; j < R; j++) {
        const float u = __fmul_rn(y[j], inv);
        code[j] = 0;
#pragma unroll
        for (int i = 0; i < (1 << BITS) - 1; i++) code[j] += u > kv_boundary[BITS - 2][NI][a][i] ? 1 : 0;
        c[j] = __shfl_sync(FULL_MASK, cent, code[j]);
    }
    cc = lane_order_sum_sq<N>(c, lane);
    return __fdiv_rn(lane_order_sum_prod<N>(c, y, lane), __fsqrt_rn(cc));
}

// Writes one block: the corrected norm s / sqrt(cc) and the codes packed in the format's bit planes (codes: N bytes
// of shared memory of this warp, staged so that a lane can assemble its bytes from any elements).
template <int FMT, int N>
__device__ __forceinline__ void turbo_pack(const int (&code)[N / 32], float s, float cc, u8* codes, u8* blk,
                                           int lane) {
    constexpr int R = N / 32;
    constexpr int BITS = fmt_bits(FMT);
    constexpr int CODE_BYTES = N * BITS / 8;
#pragma unroll
    for (int j = 0; j < R; j++) codes[32 * j + lane] = (u8) code[j];
    const float g = __fdiv_rn(s, __fsqrt_rn(cc));
    __syncwarp();
    if (lane == 0) *(u16*) blk = to_half_clamped(g);
    for (int k = lane; k < CODE_BYTES; k += 32) {
        u32 byte = 0;
        if constexpr (BITS == 4) {
            byte = codes[k] | (codes[k + N / 2] << 4);
        } else if constexpr (BITS == 2) {
#pragma unroll
            for (int q = 0; q < 4; q++) byte |= (u32) codes[k + q * (N / 4)] << (2 * q);
        } else {
            if (k < N / 4) {
#pragma unroll
                for (int q = 0; q < 4; q++) byte |= ((u32) codes[k + q * (N / 4)] & 3u) << (2 * q);
            } else {
                const int kk = k - N / 4;
#pragma unroll
                for (int q = 0; q < 8; q++) byte |= (((u32) codes[kk + q * (N / 8)] >> 2) & 1u) << q;
            }
        }
        blk[2 + k] = (u8) byte;
    }
    __syncwarp();
}

// mean: null, or the row's page mean (D fp16 values of the format's domain, KMEAN), subtracted from the domain row
// before it is quantized, as KvSequence does before KvFormat.encodeDomainRows.
template <int FMT, int D>
__device__ void encode_regs(float (&x)[D / 32], u8* dst, u8* codes, int lane, const u16* mean) {
    if (mean != nullptr && !fmt_rotated(FMT)) {
#pragma unroll
        for (int j = 0; j < D / 32; j++) x[j] = __fsub_rn(x[j], h2f(mean[32 * j + lane]));
    }
    if constexpr (FMT == F_F16) {
#pragma unroll
        for (int j = 0; j < D / 32; j++) ((u16*) dst)[32 * j + lane] = to_half_clamped(x[j]);   // HalfFormat
    } else if constexpr (FMT == F_BF16) {
#pragma unroll
        for (int j = 0; j < D / 32; j++) {
            const u32 bits = __float_as_uint(x[j]);
            u16 b;
            if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
                b = (u16) ((bits >> 16) | 0x40u);
            } else {
                b = (u16) ((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
            }
            ((u16*) dst)[32 * j + lane] = b;
        }
    } else if constexpr (FMT == F_Q8_0 || FMT == F_INT8) {
        constexpr int B = FMT == F_Q8_0 ? 32 : 64;
        constexpr int RPB = B / 32;
        const float MAGIC = 12582912.f;   // 1.5 * 2^23, Int8Format.RINT_MAGIC
#pragma unroll
        for (int b = 0; b < D / B; b++) {
            // Int8Format's block maximum: Java's max, so a NaN in the block makes the scale NaN (the block decodes
            // to NaN, as on the CPU) instead of being dropped by fmaxf into a finite scale and codes of -127
            float amax = 0.f;
#pragma unroll
            for (int r = 0; r < RPB; r++) amax = java_max(amax, fabsf(x[b * RPB + r]));
            amax = warp_java_max(amax);
            const u16 dh = to_half_clamped(__fdiv_rn(amax, 127.f));
            const float d = h2f(dh);
            const float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
            u8* blk = dst + b * (B + 2);
            if (lane == 0) *(u16*) blk = dh;
#pragma unroll
            for (int r = 0; r < RPB; r++) {
                float q = __fsub_rn(__fadd_rn(__fmul_rn(x[b * RPB + r], id), MAGIC), MAGIC);
                q = q != q ? 0.f : fminf(fmaxf(q, -127.f), 127.f);   // Java's (byte) of NaN is 0
                blk[2 + 32 * r + lane] = (u8) (signed char) (int) q;
            }
        }
    } else if constexpr (FMT == F_Q4_0 || FMT == F_Q4_0H) {
        if constexpr (FMT == F_Q4_0H) {
            wht_row<D>(x, lane, false);
            if (mean != nullptr) {
#pragma unroll
                for (int j = 0; j < D / 32; j++) x[j] = __fsub_rn(x[j], h2f(mean[32 * j + lane]));
            }
        }
#pragma unroll
        for (int j = 0; j < D / 32; j++) encode_q4_block(x[j], dst + j * 18, lane);
    } else {
        constexpr int N = rot_block(D);
        constexpr int R = N / 32;
        const float cent = turbo_centroid<FMT, N>(lane);
#pragma unroll
        for (int b = 0; b < D / N; b++) {
            float* y = x + b * R;
            const float s = turbo_rotate<N>(y, mean != nullptr ? mean + b * N : nullptr, lane);
            const float inv = s > 0.f ? __fdiv_rn(1.f, s) : 0.f;
            // the gain whose nearest-centroid codes point closest to y (TurboFormat.encodeBlock): the first best
            float best = 0.f, bestCc = 0.f;
            int bestCode[R];
            for (int a = 0; a < KV_GAINS; a++) {
                int code[R];
                float cc;
                const float cosine = turbo_try_gain<FMT, N>(y, inv, a, cent, lane, code, cc);
                if (a == 0 || cosine > best) {
                    best = cosine;
                    bestCc = cc;
#pragma unroll
                    for (int j = 0; j < R; j++) bestCode[j] = code[j];
                }
            }
            turbo_pack<FMT, N>(bestCode, s, bestCc, codes, dst + b * (2 + N * fmt_bits(FMT) / 8), lane);
        }
    }
}

// The same for a row in memory (src: its D floats).
template <int FMT, int D>
__device__ __forceinline__ void encode_row(const float* src, u8* dst, u8* codes, int lane, const u16* mean) {
    float x[D / 32];
    load_row<D>(src, x, lane);
    encode_regs<FMT, D>(x, dst, codes, lane, mean);
}

// Where row (token row / kvHeads, kv head row % kvHeads) goes: its bytes in the pool, and with MEAN its page's key
// mean (else null). Null when the token's slot is negative (a padded batch: nothing is written).
template <int FMT, int D, bool MEAN>
__device__ __forceinline__ u8* row_dest(int row, int kvHeads, const int* __restrict__ slots, u8* __restrict__ pool,
                                        int pageTokens, i64 pageBytes, const u16** mean) {
    const int token = row / kvHeads, head = row % kvHeads;
    const int slot = slots[token];
    if (slot < 0) return nullptr;
    const int page = slot / pageTokens, inPage = slot % pageTokens;
    *mean = MEAN ? key_mean(pool, page, pageBytes, pageTokens, kvHeads, head) : nullptr;
    return pool + (i64) page * pageBytes + ((i64) inPage * kvHeads + head) * fmt_row_bytes(FMT, D);
}

template <int FMT, int D, bool MEAN>
__device__ __forceinline__ void write_rows(const float* __restrict__ src, int rows, int kvHeads,
                                           const int* __restrict__ slots, u8* __restrict__ pool, int pageTokens,
                                           i64 pageBytes) {
    __shared__ u8 codes[4][D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * 4 + warp;
    if (row >= rows) return;
    const u16* mean;
    u8* dst = row_dest<FMT, D, MEAN>(row, kvHeads, slots, pool, pageTokens, pageBytes, &mean);
    if (dst == nullptr) return;
    encode_row<FMT, D>(src + (i64) row * D, dst, codes[warp], lane, mean);
}

// kvant_kv_write_kv: K and V rows in one launch (grid.y = 0 writes K rows, 1 writes V rows).
extern "C" __global__ void __launch_bounds__(128) kvant_kv_write_kv(const float* __restrict__ k,
        const float* __restrict__ v, int rows, int kvHeads, const int* __restrict__ slots, u8* __restrict__ kPool,
        u8* __restrict__ vPool, int pageTokens, i64 kPageBytes, i64 vPageBytes) {
    KVANT_GRID_ENTER();
    if (blockIdx.y == 0) {
        write_rows<KF, DK, KMEAN>(k, rows, kvHeads, slots, kPool, pageTokens, kPageBytes);
    } else {
        write_rows<VF, DV, false>(v, rows, kvHeads, slots, vPool, pageTokens, vPageBytes);
    }
}

// One row a block of KV_GAINS warps (short writes: a decode step's few rows would leave the one-warp writer's nine
// gains one after the other on a handful of warps): every warp holds the row (x: element 32j + lane in x[j]),
// rotates it and tries its own gain; the first best gain in TurboFormat.GAINS order (as encode_row picks it) is
// packed by the warp that tried it. Formats without gains are written by warp 0 as encode_row does. codes: D bytes,
// cosines: KV_GAINS floats, both the block's shared memory; every thread of the block calls this.
template <int FMT, int D>
__device__ __forceinline__ void write_regs_gains(float (&x)[D / 32], u8* dst, const u16* mean, u8* codes,
                                                 float* cosines, int warp, int lane) {
    if constexpr (!fmt_turbo(FMT)) {
        if (warp == 0) encode_regs<FMT, D>(x, dst, codes, lane, mean);
    } else {
        constexpr int N = rot_block(D);
        constexpr int R = N / 32;
        const float cent = turbo_centroid<FMT, N>(lane);
#pragma unroll
        for (int b = 0; b < D / N; b++) {
            float* y = x + b * R;
            const float s = turbo_rotate<N>(y, mean != nullptr ? mean + b * N : nullptr, lane);
            const float inv = s > 0.f ? __fdiv_rn(1.f, s) : 0.f;
            int code[R];
            float cc;
            const float cosine = turbo_try_gain<FMT, N>(y, inv, warp, cent, lane, code, cc);
            if (lane == 0) cosines[warp] = cosine;
            __syncthreads();
            int best = 0;
            for (int a = 1; a < KV_GAINS; a++)
                if (cosines[a] > cosines[best]) best = a;
            if (warp == best) turbo_pack<FMT, N>(code, s, cc, codes, dst + b * (2 + N * fmt_bits(FMT) / 8), lane);
            __syncthreads();
        }
    }
}

template <int FMT, int D, bool MEAN>
__device__ __forceinline__ void write_row_gains(const float* __restrict__ src, int kvHeads,
                                                const int* __restrict__ slots, u8* __restrict__ pool, int pageTokens,
                                                i64 pageBytes) {
    __shared__ u8 codes[D];
    __shared__ float cosines[KV_GAINS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x;
    const u16* mean;
    u8* dst = row_dest<FMT, D, MEAN>(row, kvHeads, slots, pool, pageTokens, pageBytes, &mean);
    if (dst == nullptr) return;   // the whole block: no barrier is left waiting
    float x[D / 32];
    load_row<D>(src + (i64) row * D, x, lane);
    write_regs_gains<FMT, D>(x, dst, mean, codes, cosines, warp, lane);
}

// kvant_kv_write_gains: as kvant_kv_write_kv, one row a block; grid (rows, 2), block KV_GAINS * 32 threads.
extern "C" __global__ void __launch_bounds__(KV_GAINS * 32) kvant_kv_write_gains(const float* __restrict__ k,
        const float* __restrict__ v, int rows, int kvHeads, const int* __restrict__ slots, u8* __restrict__ kPool,
        u8* __restrict__ vPool, int pageTokens, i64 kPageBytes, i64 vPageBytes) {
    KVANT_GRID_ENTER();
    if (blockIdx.y == 0) {
        write_row_gains<KF, DK, KMEAN>(k, kvHeads, slots, kPool, pageTokens, kPageBytes);
    } else {
        write_row_gains<VF, DV, false>(v, kvHeads, slots, vPool, pageTokens, vPageBytes);
    }
}

// kvant_rope_write — a decode step's kvant_rope_split (model.cu) and K/V write in one launch, for K formats without
// page means: the rows go from the fused q|k|v projection through rope.cuh's RoPE straight into the cache, in the
// bytes kvant_kv_write_gains writes from kvant_rope_split's rows, and q into its buffer for the decode attention.
//
// qkv: [n][heads·DK + kvHeads·(DK + DV)]; positions: int [n], vector t's position; its page table at tables +
// t·tableStride. slots (the first local layer of a stage's step: the layers after it and the attention read them)
// and prevPages (a centered K format in a later layer: kvant_kv_page_means), or null, get vector t's entries as
// kvant_rope_split writes them.
// grid: (n, 2·kvHeads + ceil(heads / KV_GAINS)); block: KV_GAINS warps. y < kvHeads: K row of kv head y (every warp
// rotates it by RoPE into its registers and tries its gain); y < 2·kvHeads: V row of kv head y − kvHeads; the
// others: query heads, one a warp. rotateQ (a rotated K format): the query rows also rotated into K's basis, block
// by block (wht_row, the decode kernel's rotation: the same bits), for a decode told so (kvant_attn_decode's flags).
extern "C" __global__ void __launch_bounds__(KV_GAINS * 32) kvant_rope_write(const float* __restrict__ qkv,
        const int* __restrict__ positions, float* __restrict__ q, const float2* __restrict__ angles, int ropeDim,
        int neox, int heads, int kvHeads, const float* __restrict__ qNorm, const float* __restrict__ kNorm, float eps,
        const int* __restrict__ tables, int tableStride, int pageTokens, int* __restrict__ slots,
        int* __restrict__ prevPages, u8* __restrict__ kPool, u8* __restrict__ vPool, i64 kPageBytes,
        i64 vPageBytes, int rotateQ) {
    KVANT_GRID_ENTER();
    __shared__ u8 codes[DK > DV ? DK : DV];
    __shared__ float cosines[KV_GAINS];
    const int t = blockIdx.x, role = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qDim = heads * DK, kvDim = kvHeads * DK;
    const float* row = qkv + (i64) t * (qDim + kvDim + kvHeads * DV);
    const float2* angle = angles + (i64) t * (ropeDim / 2);
    if (role >= 2 * kvHeads) {
        const int h = (role - 2 * kvHeads) * KV_GAINS + warp;
        if (h < heads) {
            float x[DK / 32];
            rope_head<DK / 32>(row + h * DK, qNorm, angle, ropeDim, neox, DK, eps, lane, x);
            if constexpr (fmt_rotated(KF)) {
                if (rotateQ) wht_row<DK>(x, lane, false);
            }
            float* dst = q + (i64) t * qDim + h * DK;
#pragma unroll
            for (int j = 0; j < DK / 32; j++) dst[32 * j + lane] = x[j];
        }
        return;
    }
    const int pos = positions[t];
    const int* table = tables + (i64) t * tableStride;
    if (role == 0 && threadIdx.x == 0 && slots != nullptr) {
        rope_slots(table, pos, pageTokens, true, t, slots, prevPages);
    }
    const int slot = rope_slot(table, pos, pageTokens);
    if (slot < 0) return;   // the whole block
    const i64 page = slot / pageTokens, inPage = slot % pageTokens;
    if (role < kvHeads) {
        float x[DK / 32];
        rope_head<DK / 32>(row + qDim + role * DK, kNorm, angle, ropeDim, neox, DK, eps, lane, x);
        write_regs_gains<KF, DK>(x, kPool + page * kPageBytes + (inPage * kvHeads + role) * fmt_row_bytes(KF, DK),
                                 nullptr, codes, cosines, warp, lane);
    } else {
        const int h = role - kvHeads;
        float x[DV / 32];
        load_row<DV>(row + qDim + kvDim + h * DV, x, lane);
        write_regs_gains<VF, DV>(x, vPool + page * vPageBytes + (inPage * kvHeads + h) * fmt_row_bytes(VF, DV),
                                 nullptr, codes, cosines, warp, lane);
    }
}

// kvant_kv_page_means — with a centered K format (KMEAN), before kvant_kv_write_kv: the mean of every K page this
// write opens (the write holds its first row: the token whose slot is the page's first), by the rule of
// dev.kvant.kv.KvSequence.pageMean, in its order and roundings: span = the write's rows in the page (the tokens after
// this one with the following slots); the span rows' own mean (rotated into K's domain, summed in order, divided by
// span) when 4 * span >= pageTokens or when the previous page is in this write; 0 for a sequence's first page; else
// the previous page's stored keys (decoded, summed in order, divided by pageTokens, plus its mean). A value that is
// not finite adds 0 (a NaN key stays in its row), and the mean is stored clamped to the fp16 range, as on the CPU.
//
// prev int32 [tokens], read for page-opening tokens only: -1 the sequence's first page, -2 the token is not the
//      first of its sequence's write (the previous page is in this write), else the previous logical page's id.
// grid: (tokens, kvHeads); block: 32 threads, lane holding values 32j + lane.
extern "C" __global__ void __launch_bounds__(32) kvant_kv_page_means(const float* __restrict__ k, int tokens,
        int kvHeads, const int* __restrict__ slots, const int* __restrict__ prev, u8* __restrict__ kPool,
        int pageTokens, i64 kPageBytes) {
    KVANT_GRID_ENTER();
    if constexpr (KMEAN) {
        const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
        const int slot = slots[t];
        if (slot < 0 || slot % pageTokens != 0) return;
        int span = 1;
        while (span < pageTokens && t + span < tokens && slots[t + span] == slot + span) span++;
        const int before = prev[t];
        float acc[DK / 32];
#pragma unroll
        for (int j = 0; j < DK / 32; j++) acc[j] = 0.f;
        if (4 * span >= pageTokens || before == -2) {
            for (int r = 0; r < span; r++) {
                float x[DK / 32];
                load_row<DK>(k + ((i64) (t + r) * kvHeads + h) * DK, x, lane);
                if constexpr (fmt_rotated(KF)) wht_row<DK>(x, lane, false);
#pragma unroll
                for (int j = 0; j < DK / 32; j++) acc[j] = __fadd_rn(acc[j], isfinite(x[j]) ? x[j] : 0.f);
            }
#pragma unroll
            for (int j = 0; j < DK / 32; j++) acc[j] = __fdiv_rn(acc[j], (float) span);
        } else if (before >= 0) {
            for (int r = 0; r < pageTokens; r++) {
                const u8* row = kPool + (i64) before * kPageBytes + ((i64) r * kvHeads + h) * fmt_row_bytes(KF, DK);
#pragma unroll
                for (int j = 0; j < DK / 32; j++) {
                    const float v = decode_elem<KF, DK>(row, 32 * j + lane);
                    acc[j] = __fadd_rn(acc[j], isfinite(v) ? v : 0.f);
                }
            }
            const u16* pm = key_mean(kPool, before, kPageBytes, pageTokens, kvHeads, h);
#pragma unroll
            for (int j = 0; j < DK / 32; j++)
                acc[j] = __fadd_rn(__fdiv_rn(acc[j], (float) pageTokens), h2f(pm[32 * j + lane]));
        }
        u16* m = (u16*) key_mean(kPool, slot / pageTokens, kPageBytes, pageTokens, kvHeads, h);
#pragma unroll
        for (int j = 0; j < DK / 32; j++) m[32 * j + lane] = to_half_clamped(acc[j]);
    }
}

// kvant_fill_normal — dst[i] = a standard normal draw from a counter-based hash of (seed, i): test and benchmark
// data made on the device. grid-stride, any grid; block 256. Not the CPU's generator: data only, never compared.
__device__ __forceinline__ u32 hash32(u32 x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}
extern "C" __global__ void kvant_fill_normal(float* __restrict__ dst, i64 n, u32 seed, float scale) {
    KVANT_GRID_ENTER();
    const i64 stride = (i64) gridDim.x * blockDim.x;
    for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const u32 a = hash32((u32) i * 2u + 1u ^ hash32(seed ^ (u32) (i >> 31)));
        const u32 b = hash32(a ^ 0x9e3779b9u);
        const float u1 = ((a >> 8) + 1) * (1.f / 16777217.f);
        const float u2 = (b >> 8) * (1.f / 16777216.f);
        dst[i] = scale * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    }
}
