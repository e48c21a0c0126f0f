// model.cu — the llama-family layer on the GPU, apart from attention (attention/*.cu): embedding lookup, RMSNorm,
// weight-matrix × vector products for every weight format, RoPE, SwiGLU, greedy token choice, and the kernels that
// feed tensor-core GEMMs in prefill (weights dequantized to f16, activations converted to f16).
//
// No <cuda_fp16.h>: NVRTC finds no toolkit headers on the GPU machine, so halves are raw bits and the conversions
// are PTX (cvt.rn: round to nearest even).
//
// Weight layouts on the device (dev.kvant.cuda.model.DeviceWeights):
//   F32, F16, BF16, Q4_K, Q5_K: GGUF's own row layout, rows of rowBytes bytes.
//   Q8_0 and Q4_0: repacked per matrix into two planes so every block's quants are one aligned 16/32-byte load:
//     quants [rows][cols/32][32 or 16 bytes], then at byte offset `scales` the block scales f16 [rows][cols/32].
//   Q6_K: the same with super-blocks: [rows][cols/256][208 bytes: ql, qh, the 16 int8 scales], then d f16
//     [rows][cols/256]; rowBytes carries the 32-value blocks of a row, as for Q8_0 and Q4_0.
//   The bits are GGUF's; only their places change.
//
// Every reduction has a fixed shape that depends on the launch geometry only (which is fixed per kernel), never on
// timing: the same inputs give the same bits.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define FULL_MASK 0xffffffffu

enum {
    W_F32 = 0, W_F16 = 1, W_BF16 = 2, W_Q8_0 = 3, W_Q4_0 = 4, W_Q4_K = 5, W_Q5_K = 6, W_Q6_K = 7
};

// Output modes of the matrix-vector kernels.
enum { MV_STORE = 0, MV_ADD = 1, MV_SWIGLU = 2 };

__device__ __forceinline__ float h2f(u16 h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}
__device__ __forceinline__ u16 f2h(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf2f(u16 b) {
    return __uint_as_float(((u32) b) << 16);
}
// Greedy choice folded into the output product: a 64-bit key that orders by logit, then by the lower index, so an
// atomicMax over every row gives the argmax (lowest index among equal logits) whatever the order of the rows.
__device__ __forceinline__ unsigned long long argmax_key(float v, int index) {
    u32 b = __float_as_uint(v);
    u32 ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long) ordered << 32) | (u32) (0xFFFFFFFFu - (u32) index);
}

__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return *(const u16*) p;
}

// ---- dequantizing: 8 consecutive weights (chunk c of the 32-weight sub-block s) of row `row`

// K-quant scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block: six bits each, packed in 12 bytes.
__device__ __forceinline__ void kq_scale_min(const u8* sc, int j, float& scale, float& min) {
    if (j < 4) {
        scale = (float) (sc[j] & 63);
        min = (float) (sc[j + 4] & 63);
    } else {
        scale = (float) ((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
        min = (float) ((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
    }
}

template <int F>
__device__ __forceinline__ void dq8(const u8* __restrict__ W, i64 rowBytes, i64 scales, int row, int s, int c,
                                    float* w) {
    if constexpr (F == W_F32) {
        const float4* p = (const float4*) (W + row * rowBytes + (i64) (s * 32 + c * 8) * 4);
        float4 a = p[0], b = p[1];
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else if constexpr (F == W_F16 || F == W_BF16) {
        uint4 q = *(const uint4*) (W + row * rowBytes + (i64) (s * 32 + c * 8) * 2);
        u32 v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (F == W_F16) {
                w[2 * i] = h2f((u16) (v[i] & 0xFFFF));
                w[2 * i + 1] = h2f((u16) (v[i] >> 16));
            } else {
                w[2 * i] = bf2f((u16) (v[i] & 0xFFFF));
                w[2 * i + 1] = bf2f((u16) (v[i] >> 16));
            }
        }
    } else if constexpr (F == W_Q8_0) {
        i64 nb = rowBytes;  // for the repacked planes rowBytes carries blocks per row
        i64 b = (i64) row * nb + s;
        float d = h2f(*(const u16*) (W + scales + b * 2));
        uint2 q = *(const uint2*) (W + b * 32 + c * 8);
        u32 v[2] = {q.x, q.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            w[i] = d * (float) (i8) ((v[i >> 2] >> (8 * (i & 3))) & 0xFF);
        }
    } else if constexpr (F == W_Q4_0) {
        i64 nb = rowBytes;
        i64 b = (i64) row * nb + s;
        float d = h2f(*(const u16*) (W + scales + b * 2));
        // weights 0..15 are the low nibbles of bytes 0..15, weights 16..31 their high nibbles
        uint2 q = *(const uint2*) (W + b * 16 + (c & 1) * 8);
        u32 v[2] = {q.x, q.y};
        int shift = c >= 2 ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            w[i] = d * (float) ((int) ((v[i >> 2] >> (8 * (i & 3) + shift)) & 0xF) - 8);
        }
    } else if constexpr (F == W_Q4_K || F == W_Q5_K) {
        const int blockBytes = F == W_Q4_K ? 144 : 176;
        const u8* blk = W + row * rowBytes + (i64) (s >> 3) * blockBytes;
        int j = s & 7;
        float d = h2f(ld_u16(blk)), dmin = h2f(ld_u16(blk + 2));
        float sc, mn;
        kq_scale_min(blk + 4, j, sc, mn);
        float scale = d * sc, off = dmin * mn;
        // The chunk's 8 nibble bytes (and Q5_K's 8 high-bit bytes) in one 8-byte load each: super-blocks of 144
        // and 176 bytes keep them 8-byte aligned.
        uint2 qs = *(const uint2*) (blk + (F == W_Q4_K ? 16 : 48) + (j >> 1) * 32 + c * 8);
        uint2 qh = make_uint2(0u, 0u);
        if constexpr (F == W_Q5_K) {
            qh = *(const uint2*) (blk + 16 + c * 8);
        }
        int shift = (j & 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 word = i < 4 ? qs.x : qs.y;
            int q = (word >> (8 * (i & 3) + shift)) & 0xF;
            if constexpr (F == W_Q5_K) {
                u32 hword = i < 4 ? qh.x : qh.y;
                q |= ((hword >> (8 * (i & 3) + j)) & 1) << 4;
            }
            w[i] = scale * (float) q - off;
        }
    } else {  // W_Q6_K, planar: per super-block ql[128] qh[64] scales[16] (int8) in the quant plane, d in the scales
        i64 nb = rowBytes;
        i64 sb = (i64) row * (nb >> 3) + (s >> 3);
        const u8* blk = W + sb * 208;
        int j = s & 7;
        int half = j >> 2, quarter = j & 3;
        float d = h2f(*(const u16*) (W + scales + sb * 2));
        const u8* ql = blk + half * 64 + (quarter & 1) * 32;
        const u8* qh = blk + 128 + half * 32;
        const i8* scs = (const i8*) (blk + 192 + half * 8);
        int lowShift = quarter >= 2 ? 4 : 0;
        int highShift = quarter * 2;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int l = c * 8 + i;
            int q = ((ql[l] >> lowShift) & 0xF) | (((qh[l] >> highShift) & 3) << 4);
            w[i] = d * (float) scs[quarter * 2 + (l >> 4)] * (float) (q - 32);
        }
    }
}

// ---- embedding: x[t] = row tokens[t] of the table, dequantized

template <int F>
__device__ void embed(const u8* __restrict__ W, i64 rowBytes, i64 scales, const int* __restrict__ tokens,
                      float* __restrict__ x, int dim) {
    int t = blockIdx.x;
    int row = tokens[t];
    for (int chunk = threadIdx.x; chunk < dim / 8; chunk += blockDim.x) {
        float w[8];
        dq8<F>(W, rowBytes, scales, row, chunk >> 2, chunk & 3, w);
        float4* out = (float4*) (x + (i64) t * dim + chunk * 8);
        out[0] = make_float4(w[0], w[1], w[2], w[3]);
        out[1] = make_float4(w[4], w[5], w[6], w[7]);
    }
}

// ---- dequantize a whole matrix to f16 [rows][cols] (prefill: the GEMM's weight operand)

template <int F>
__device__ void dequant_f16(const u8* __restrict__ W, i64 rowBytes, i64 scales, int rows, int cols,
                            uint4* __restrict__ out) {
    i64 chunks = (i64) rows * (cols / 8);
    int perRow = cols / 8;
    for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < chunks; i += (i64) gridDim.x * blockDim.x) {
        int row = (int) (i / perRow);
        int chunk = (int) (i - (i64) row * perRow);
        float w[8];
        dq8<F>(W, rowBytes, scales, row, chunk >> 2, chunk & 3, w);
        out[i] = make_uint4(pack_h2(w[0], w[1]), pack_h2(w[2], w[3]), pack_h2(w[4], w[5]), pack_h2(w[6], w[7]));
    }
}

// ---- weight matrix × vectors (decode)
//
// grid:   ceil(outputs / (MV_WARPS * rows per warp)) blocks of MV_WARPS warps.
// warp:   4 weight rows (MV_STORE / MV_ADD: rows r..r+3; MV_SWIGLU: gate rows r, r+1 and up rows ffn+r, ffn+r+1)
//         against nvec vectors; lane L takes the 8-weight chunks (float vectors, below) or the 32-weight
//         sub-blocks (8-bit vectors) L, L+32, ... of each row, so a warp reads 4 rows' bytes once, contiguously,
//         for all vectors together.
// reduce: per lane a running sum over its chunks or sub-blocks (in order), then a butterfly over the 32 lanes:
//         fixed order.
// output: MV_STORE out[v][r] = dot (+ bias[r]); MV_ADD out[v][r] += dot; MV_SWIGLU out[v][r] = silu(g)·u.
#define MV_WARPS 4

// The rows of one warp: R weight rows from r0 = warp · (outputs a warp) on (MV_SWIGLU: R/2 gate rows and the
// matching up rows ffn + ...). Rows past the end read row 0's bytes again and are not written.
template <int R>
__device__ __forceinline__ bool warp_rows(int warp, int outputs, int mode, int ffn, int& r0, int* rows,
                                          bool* valid) {
    constexpr int H = R / 2 > 0 ? R / 2 : 1;  // outputs per warp in MV_SWIGLU (R >= 2 there)
    r0 = warp * (mode == MV_SWIGLU ? H : R);
    if (r0 >= outputs) {
        return false;
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (mode == MV_SWIGLU) {
            rows[i] = i < H ? r0 + i : ffn + r0 + (i - H);
            valid[i] = r0 + (i % H) < outputs;
        } else {
            rows[i] = r0 + i;
            valid[i] = r0 + i < outputs;
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (!valid[i]) {
            rows[i] = rows[0];
        }
    }
    return true;
}

// Sums each lane's partials over the warp (a fixed butterfly) and lane 0 writes the outputs per mode: MV_STORE
// (+ bias), MV_ADD, MV_SWIGLU (silu(gate)·up); with best, each stored value also goes into its vector's argmax key.
template <int R, int NV>
__device__ __forceinline__ void warp_outputs(float (&acc)[R][NV], int r0, const bool* valid, int nvec, float* out,
                                             int outStride, const float* __restrict__ bias, int mode,
                                             unsigned long long* __restrict__ best) {
    constexpr int H = R / 2 > 0 ? R / 2 : 1;
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                acc[i][v] += __shfl_xor_sync(FULL_MASK, acc[i][v], o);
            }
        }
    }
    if ((threadIdx.x & 31) != 0) {
        return;
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        if (v >= nvec) {
            break;
        }
        float* o = out + (i64) v * outStride;
        if (mode == MV_SWIGLU) {
#pragma unroll
            for (int i = 0; i < H; i++) {
                if (valid[i]) {
                    float g = acc[i][v], u = acc[i + H][v];
                    o[r0 + i] = g / (1.f + expf(-g)) * u;
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) {
                if (valid[i]) {
                    float val = acc[i][v];
                    if (bias != nullptr) {
                        val += bias[r0 + i];
                    }
                    if (mode == MV_ADD) {
                        o[r0 + i] += val;
                    } else {
                        o[r0 + i] = val;
                    }
                    if (best != nullptr) {
                        atomicMax(best + v, argmax_key(val, r0 + i));
                    }
                }
            }
        }
    }
}

// Lane L takes the 8-value chunks L, L+32, L+64, ... of its warp's rows: a warp's load of a row is 32 consecutive
// chunks, contiguous. One vector (kvant_mv1_*) reads x straight from global memory; several (kvant_mv8_*) stage
// it in shared memory a tile of 128 chunks (1024 columns) at a time, so the block's warps read it from there instead
// of each warp fetching every vector from L2 (eight vectors of floats are 4x a row quad's 16-bit weights: that
// traffic, not the weights, bounded the eight-vector product). Per lane the chunks are taken in the same order
// either way, so one vector or eight give the same bits.
#define MV_TILE_CHUNKS 128

template <int F, int NV>
__device__ __forceinline__ void mv_chunk(const u8* __restrict__ W, i64 rowBytes, i64 scales, const int* rows,
                                         int ch, const float4* xa, const float4* xb, int xStep, int nvec,
                                         float (&acc)[4][NV]) {
    float w[4][8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        dq8<F>(W, rowBytes, scales, rows[i], ch >> 2, ch & 3, w[i]);
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        if (v < nvec) {
            float4 a = xa[v * xStep], b = xb[v * xStep];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float t = w[i][0] * a.x;
                t = fmaf(w[i][1], a.y, t);
                t = fmaf(w[i][2], a.z, t);
                t = fmaf(w[i][3], a.w, t);
                t = fmaf(w[i][4], b.x, t);
                t = fmaf(w[i][5], b.y, t);
                t = fmaf(w[i][6], b.z, t);
                t = fmaf(w[i][7], b.w, t);
                acc[i][v] += t;
            }
        }
    }
}

template <int F, int NV>
__device__ void matvec(const u8* __restrict__ W, i64 rowBytes, i64 scales, int outputs, int cols,
                       const float* __restrict__ x, int xStride, int nvec, float* out, int outStride,
                       const float* __restrict__ bias, int mode, int ffn, unsigned long long* __restrict__ best) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    int r0;
    int rows[4];
    bool valid[4];
    bool active = warp_rows<4>(warp, outputs, mode, ffn, r0, rows, valid);
    float acc[4][NV];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            acc[i][v] = 0.f;
        }
    }
    int nch = cols / 8;
    if constexpr (NV == 1) {
        if (!active) {
            return;
        }
        for (int ch = lane; ch < nch; ch += 32) {
            const float4* xp = (const float4*) (x + ch * 8);
            mv_chunk<F, NV>(W, rowBytes, scales, rows, ch, xp, xp + 1, 0, nvec, acc);
        }
    } else {
        // Tile of x: vector v's chunk j at float4s v*2T + j (values 0-3) and v*2T + T + j (values 4-7), so a
        // warp's reads of one vector are 32 consecutive float4s. Each lane takes 4 chunks of a tile, whose weight
        // loads are all in flight before their products. Every warp of the block takes part in the loads and
        // barriers, rows or not.
        constexpr int T = MV_TILE_CHUNKS;
        __shared__ float4 xs[NV * 2 * T];
        for (int t0 = 0; t0 < nch; t0 += T) {
            int tileChunks = min(T, nch - t0);
            for (int i = threadIdx.x; i < NV * 2 * T; i += blockDim.x) {
                int v = i / (2 * T), q = i % (2 * T);
                int j = q >> 1, half = q & 1;
                float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
                if (v < nvec && j < tileChunks) {
                    val = *(const float4*) (x + (i64) v * xStride + (t0 + j) * 8 + half * 4);
                }
                xs[v * 2 * T + half * T + j] = val;
            }
            __syncthreads();
            if (active) {
#pragma unroll
                for (int k = 0; k < T / 32; k++) {
                    int j = k * 32 + lane;
                    if (j < tileChunks) {
                        mv_chunk<F, NV>(W, rowBytes, scales, rows, t0 + j, xs + j, xs + T + j, 2 * T, nvec, acc);
                    }
                }
            }
            __syncthreads();
        }
        if (!active) {
            return;
        }
    }
    warp_outputs<4, NV>(acc, r0, valid, nvec, out, outStride, bias, mode, best);
}

// ---- the planar Q4_0, Q8_0 and Q6_K formats, and Q4_K and Q5_K in GGUF's layout, against 8-bit vectors (decode)
//
// The vector is quantized first (kvant_quantize_q8, or fused into kvant_rmsnorm): per 32 values a scale d = max|x|/127,
// codes q = round(x/d) (int8, plane xq [nvec][cols]) and (d, d·Σq) (float2, plane xds [nvec][cols/32]). A block of
// weights then costs a handful of integer dot-product instructions (dp4a: four int8 products and their sum):
// Q8_0: dot = dw·dx·Σ qw·qx;  Q4_0 (codes c = q+8): dot = dw·(dx·Σ c·qx − 8·dx·Σ qx);
// Q4_K and Q5_K (sub-block of 32, 4- or 5-bit q, value d·sc·q − dmin·m):
//   dot = (d·sc)·(dx·Σ q·qx) − (dmin·m)·(dx·Σ qx);
// Q6_K (sub-block of 32, 6-bit q, value d·sc_h·(q − 32), a scale per half h):
//   dot = d·(dx·Σ_h sc_h·(Σ q·qx − 32·Σ qx)), the integer sum exact.
// Integer sums are exact and the float steps run in a fixed order: the same bits for one vector or eight.
// Launch geometry and outputs as kvant_mv*.

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

template <int F, int NV, int R>
__device__ void matvec_q8(const u8* __restrict__ W, i64 nb64, i64 scales, int outputs, int cols,
                          const i8* __restrict__ xq, const float2* __restrict__ xds, int nvec, float* out,
                          int outStride, const float* __restrict__ bias, int mode, int ffn,
                          unsigned long long* __restrict__ best) {
    int lane = threadIdx.x & 31;
    int warp = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    int r0;
    int rows[R];
    bool valid[R];
    if (!warp_rows<R>(warp, outputs, mode, ffn, r0, rows, valid)) {
        return;
    }
    float acc[R][NV];
#pragma unroll
    for (int i = 0; i < R; i++) {
#pragma unroll
        for (int v = 0; v < NV; v++) {
            acc[i][v] = 0.f;
        }
    }
    int nb = cols / 32;
#pragma unroll 2
    for (int s = lane; s < nb; s += 32) {
        int wq[R][8];
        float dw[R];
        float mw[R];    // Q4_K, Q5_K: the sub-block's dmin·min
        int ks[R][2];   // Q6_K: the scales of the sub-block's two halves
#pragma unroll
        for (int i = 0; i < R; i++) {
            i64 b = (i64) rows[i] * nb + s;
            if constexpr (F == W_Q4_K || F == W_Q5_K) {
                // GGUF's layout (nb64 is the row's bytes): sub-block s is sub-block j = s & 7 of super-block s >> 3,
                // its nibbles the low (even j) or high (odd j) halves of 32 bytes shared with its pair; Q5_K's fifth
                // bit of value t is bit j of byte t of the 32 high-bit bytes.
                const u8* blk = W + (i64) rows[i] * nb64 + (i64) (s >> 3) * (F == W_Q4_K ? 144 : 176);
                int j = s & 7;
                float sc, mn;
                kq_scale_min(blk + 4, j, sc, mn);
                dw[i] = h2f(__ldg((const unsigned short*) blk)) * sc;
                mw[i] = h2f(__ldg((const unsigned short*) (blk + 2))) * mn;
                const uint4* qp = (const uint4*) (blk + (F == W_Q4_K ? 16 : 48) + (j >> 1) * 32);
                uint4 q0 = __ldg(qp), q1 = __ldg(qp + 1);
                u32 v[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
                int shift = (j & 1) * 4;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    wq[i][k] = (int) ((v[k] >> shift) & 0x0F0F0F0Fu);
                }
                if constexpr (F == W_Q5_K) {
                    const uint4* hp = (const uint4*) (blk + 16);
                    uint4 h0 = __ldg(hp), h1 = __ldg(hp + 1);
                    u32 h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        wq[i][k] |= (int) (((h[k] >> j) & 0x01010101u) << 4);
                    }
                }
                continue;
            } else if constexpr (F == W_Q6_K) {
                // Block s is sub-block j = s & 7 of super-block s >> 3: its 32 low-bit bytes (low or high nibbles),
                // its 32 high-bit bytes (bits 2·quarter..), values 0-15 under scale sc0, 16-31 under sc1. Codes
                // q = 0..63 as bytes (positive for dp4a); the offset of 32 comes off with Σqx in the dot below.
                i64 sb = (i64) rows[i] * (nb >> 3) + (s >> 3);
                const u8* blk = W + sb * 208;
                int j = s & 7;
                int half = j >> 2, quarter = j & 3;
                const uint4* lp = (const uint4*) (blk + half * 64 + (quarter & 1) * 32);
                const uint4* hp = (const uint4*) (blk + 128 + half * 32);
                uint4 l0 = __ldg(lp), l1 = __ldg(lp + 1), h0 = __ldg(hp), h1 = __ldg(hp + 1);
                u32 lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
                u32 hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
                int lowShift = quarter >= 2 ? 4 : 0, highShift = quarter * 2;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    wq[i][k] = (int) (((lw[k] >> lowShift) & 0x0F0F0F0Fu)
                                      | (((hw[k] >> highShift) & 0x03030303u) << 4));
                }
                const signed char* sc = (const signed char*) (blk + 192 + half * 8 + quarter * 2);
                ks[i][0] = sc[0];
                ks[i][1] = sc[1];
                dw[i] = h2f(__ldg((const unsigned short*) (W + scales + sb * 2)));
                mw[i] = 0.f;
                continue;
            } else {
                mw[i] = 0.f;
            }
            dw[i] = h2f(__ldg((const unsigned short*) (W + scales + b * 2)));
            if constexpr (F == W_Q4_0) {
                uint4 q = __ldg((const uint4*) (W + b * 16));
                u32 v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    wq[i][k] = (int) (v[k] & 0x0F0F0F0Fu);
                    wq[i][k + 4] = (int) ((v[k] >> 4) & 0x0F0F0F0Fu);
                }
            } else {
                uint4 q0 = __ldg((const uint4*) (W + b * 32));
                uint4 q1 = __ldg((const uint4*) (W + b * 32 + 16));
                wq[i][0] = (int) q0.x; wq[i][1] = (int) q0.y; wq[i][2] = (int) q0.z; wq[i][3] = (int) q0.w;
                wq[i][4] = (int) q1.x; wq[i][5] = (int) q1.y; wq[i][6] = (int) q1.z; wq[i][7] = (int) q1.w;
            }
        }
#pragma unroll
        for (int v = 0; v < NV; v++) {
            if (v < nvec) {
                const uint4* xp = (const uint4*) (xq + (i64) v * cols + s * 32);
                uint4 x0 = xp[0], x1 = xp[1];
                int xw[8] = {(int) x0.x, (int) x0.y, (int) x0.z, (int) x0.w,
                             (int) x1.x, (int) x1.y, (int) x1.z, (int) x1.w};
                float2 ds = xds[(i64) v * nb + s];
                int sx0 = 0, sx1 = 0;  // Q6_K: Σqx over values 0-15 and 16-31
                if constexpr (F == W_Q6_K) {
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        sx0 = dp4a(0x01010101, xw[k], sx0);
                        sx1 = dp4a(0x01010101, xw[k + 4], sx1);
                    }
                }
#pragma unroll
                for (int i = 0; i < R; i++) {
                    if constexpr (F == W_Q6_K) {
                        int s0 = 0, s1 = 0;
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            s0 = dp4a(wq[i][k], xw[k], s0);
                            s1 = dp4a(wq[i][k + 4], xw[k + 4], s1);
                        }
                        // exact: |sc·(s − 32·sx)| < 2^7 · 2^6 · 2^7 · 16 per half
                        int isum = ks[i][0] * (s0 - 32 * sx0) + ks[i][1] * (s1 - 32 * sx1);
                        acc[i][v] += dw[i] * (ds.x * (float) isum);
                        continue;
                    }
                    int sum = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        sum = dp4a(wq[i][k], xw[k], sum);
                    }
                    float dot;
                    if constexpr (F == W_Q4_0) {
                        dot = dw[i] * (ds.x * (float) sum - 8.f * ds.y);
                    } else if constexpr (F == W_Q4_K || F == W_Q5_K) {
                        dot = dw[i] * (ds.x * (float) sum) - mw[i] * ds.y;
                    } else {
                        dot = dw[i] * (ds.x * (float) sum);
                    }
                    acc[i][v] += dot;
                }
            }
        }
    }
    warp_outputs<R, NV>(acc, r0, valid, nvec, out, outStride, bias, mode, best);
}

#define KVANT_Q8_KERNELS(NAME, F)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mq1_##NAME(                                 \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_q8<F, 1, 4>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias, mode, ffn, best);  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mq1r2_##NAME(                               \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_q8<F, 1, 2>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias, mode, ffn, best);  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mq1r1_##NAME(                               \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_q8<F, 1, 1>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias, mode, ffn, best);  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mq8_##NAME(                                 \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_q8<F, 8, 4>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias, mode, ffn, best);  \
    }

KVANT_Q8_KERNELS(q8_0, W_Q8_0)
KVANT_Q8_KERNELS(q4_0, W_Q4_0)
KVANT_Q8_KERNELS(q4_k, W_Q4_K)
KVANT_Q8_KERNELS(q5_k, W_Q5_K)
KVANT_Q8_KERNELS(q6_k, W_Q6_K)

// One warp quantizes one 32-value block of a vector: lane l holds value l.
__device__ __forceinline__ void quantize_block(float v, i8* q, float2* ds) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, o));
    }
    float d = a / 127.f;
    int c = d > 0.f ? __float2int_rn(v / d) : 0;
    int sum = c;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        sum += __shfl_xor_sync(FULL_MASK, sum, o);
    }
    q[threadIdx.x & 31] = (i8) c;
    if ((threadIdx.x & 31) == 0) {
        *ds = make_float2(d, d * (float) sum);
    }
}

// x: nvec rows of n floats (row stride n) → xq [nvec][n], xds [nvec][n/32]. grid: ceil(nvec·n/32 / 8), block 256.
extern "C" __global__ void __launch_bounds__(256) kvant_quantize_q8(const float* __restrict__ x, int n, int nvec,
                                                                    i8* __restrict__ xq, float2* __restrict__ xds) {
    KVANT_GRID_ENTER();
    int block = blockIdx.x * 8 + (threadIdx.x >> 5);
    int perRow = n / 32;
    if (block >= nvec * perRow) {
        return;
    }
    int v = block / perRow, b = block - v * perRow;
    float value = x[(i64) v * n + b * 32 + (threadIdx.x & 31)];
    quantize_block(value, xq + (i64) v * n + b * 32, xds + (i64) v * perRow + b);
}

#define KVANT_FORMAT_KERNELS(NAME, F)                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mv1_##NAME(                                 \
            const u8* W, i64 rowBytes, i64 scales, int outputs, int cols, const float* x, int xStride, int nvec, \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec<F, 1>(W, rowBytes, scales, outputs, cols, x, xStride, nvec, out, outStride, bias, mode, ffn,      \
                     best);                                                                                       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mv8_##NAME(                                 \
            const u8* W, i64 rowBytes, i64 scales, int outputs, int cols, const float* x, int xStride, int nvec, \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec<F, 8>(W, rowBytes, scales, outputs, cols, x, xStride, nvec, out, outStride, bias, mode, ffn,      \
                     best);                                                                                       \
    }                                                                                                             \
    extern "C" __global__ void kvant_embed_##NAME(const u8* W, i64 rowBytes, i64 scales, const int* tokens,       \
                                                  float* x, int dim, unsigned long long* best, int nbest) {       \
        KVANT_GRID_ENTER();                                                                                       \
        if (blockIdx.x == 0 && (int) threadIdx.x < nbest) {                                                       \
            best[threadIdx.x] = 0ull;                                                                             \
        }                                                                                                         \
        embed<F>(W, rowBytes, scales, tokens, x, dim);                                                           \
    }                                                                                                             \
    extern "C" __global__ void kvant_dequant_##NAME(const u8* W, i64 rowBytes, i64 scales, int rows, int cols,   \
                                                    uint4* out) {                                                 \
        KVANT_GRID_ENTER();                                                                                       \
        dequant_f16<F>(W, rowBytes, scales, rows, cols, out);                                                    \
    }

KVANT_FORMAT_KERNELS(f32, W_F32)
KVANT_FORMAT_KERNELS(f16, W_F16)
KVANT_FORMAT_KERNELS(bf16, W_BF16)
KVANT_FORMAT_KERNELS(q8_0, W_Q8_0)
KVANT_FORMAT_KERNELS(q4_0, W_Q4_0)
KVANT_FORMAT_KERNELS(q4_k, W_Q4_K)
KVANT_FORMAT_KERNELS(q5_k, W_Q5_K)
KVANT_FORMAT_KERNELS(q6_k, W_Q6_K)

// ---- RMSNorm of n rows of dim floats: y = x / sqrt(mean(x²) + eps) · w, into any of y (f32), yh (f16, the
// operand of a prefill GEMM) and yq/yds (8-bit codes and scales, the operand of the decode products).
// grid: n blocks; block: NORM_THREADS threads. Thread t holds the 4-value chunks t, t+T, ... of its row in registers
// (dim <= 4·T·NORM_CHUNKS), so the row is read once; the sum of squares is a fixed tree (per-thread chunks in order,
// then warp butterflies, then warps in order). An 8-bit block of 32 values is the chunks of 8 neighbouring lanes.
#define NORM_THREADS 1024
#define NORM_CHUNKS 4

__device__ float block_sum(float v, float* shared) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(FULL_MASK, v, o);
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    float total = 0.f;
    for (int i = 0; i < (int) (blockDim.x >> 5); i++) {
        total += shared[i];
    }
    __syncthreads();
    return total;
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS) kvant_rmsnorm(
        const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, u16* __restrict__ yh,
        i8* __restrict__ yq, float2* __restrict__ yds, int dim, float eps) {
    KVANT_GRID_ENTER();
    __shared__ float shared[NORM_THREADS / 32];
    const float4* xr = (const float4*) (x + (i64) blockIdx.x * dim);
    int chunks = dim / 4;
    const float4* wr = (const float4*) w;
    float4 v[NORM_CHUNKS], wv[NORM_CHUNKS];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NORM_CHUNKS; k++) {
        int c = threadIdx.x + k * NORM_THREADS;
        v[k] = c < chunks ? xr[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        wv[k] = c < chunks ? wr[c] : make_float4(0.f, 0.f, 0.f, 0.f);  // fetched with x: one memory round trip
        ss = fmaf(v[k].x, v[k].x, ss);
        ss = fmaf(v[k].y, v[k].y, ss);
        ss = fmaf(v[k].z, v[k].z, ss);
        ss = fmaf(v[k].w, v[k].w, ss);
    }
    ss = block_sum(ss, shared);
    float inv = 1.f / sqrtf(ss / (float) dim + eps);
    i64 row = (i64) blockIdx.x * dim;
#pragma unroll
    for (int k = 0; k < NORM_CHUNKS; k++) {
        int c = threadIdx.x + k * NORM_THREADS;
        if (k * NORM_THREADS >= chunks) {
            break;  // uniform across the block: no chunk of this pass exists
        }
        bool live = c < chunks;  // dim % 32 == 0, so whole groups of 8 lanes agree
        float4 ww = wv[k];
        float o[4] = {v[k].x * inv * ww.x, v[k].y * inv * ww.y, v[k].z * inv * ww.z, v[k].w * inv * ww.w};
        if (live && y != nullptr) {
            ((float4*) (y + row))[c] = make_float4(o[0], o[1], o[2], o[3]);
        }
        if (live && yh != nullptr) {
            ((uint2*) (yh + row))[c] = make_uint2(pack_h2(o[0], o[1]), pack_h2(o[2], o[3]));
        }
        if (yq != nullptr) {
            float a = fmaxf(fmaxf(fabsf(o[0]), fabsf(o[1])), fmaxf(fabsf(o[2]), fabsf(o[3])));
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) {
                a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, m));
            }
            float d = a / 127.f;
            int q[4];
            int sum = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                q[j] = d > 0.f ? __float2int_rn(o[j] / d) : 0;
                sum += q[j];
            }
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) {
                sum += __shfl_xor_sync(FULL_MASK, sum, m);
            }
            if (live) {
                ((u32*) (yq + row))[c] = (u32) (q[0] & 0xFF) | ((u32) (q[1] & 0xFF) << 8)
                                         | ((u32) (q[2] & 0xFF) << 16) | ((u32) (q[3] & 0xFF) << 24);
                if ((c & 7) == 0) {
                    yds[(i64) blockIdx.x * (dim / 32) + c / 8] = make_float2(d, d * (float) sum);
                }
            }
        }
    }
}

// ---- RoPE angles of a step: (cos, sin) of every rotated pair at each vector's position, once per step for all
// layers. positions: int [n], or null for start + t. Computed in doubles from the frequencies of
// dev.kvant.model.Rope, so the angles equal the CPU's. grid: n blocks; block: 64 threads.
extern "C" __global__ void kvant_rope_angles(const int* __restrict__ positions, int start, int n,
                                             const double* __restrict__ freqs, int ropeDim, float positionScale,
                                             float2* __restrict__ table) {
    KVANT_GRID_ENTER();
    int t = blockIdx.x;
    int pos = positions != nullptr ? positions[t] : start + t;
    double p = (double) pos / (double) positionScale;
    for (int i = threadIdx.x; i < ropeDim / 2; i += blockDim.x) {
        double a = p * freqs[i];
        table[(i64) t * (ropeDim / 2) + i] = make_float2((float) cos(a), (float) sin(a));
    }
}

// ---- after the QKV projection: optional per-head RMSNorm of q and k (qwen3), RoPE at each vector's position
// (angles from kvant_rope_angles), q/k/v split into their own contiguous buffers, and each vector's cache slot
// from its page table.
//
// qkv: [n][qDim + 2·kvDim] (the fused projection's output); positions: int [n], or null for start + t;
// tables: page table of vector t at tables + (t·seqStride)·tableStride (seqStride 0: one sequence, prefill).
// grid: (n, ceil((heads + kvHeads) / 4)); block: 128 threads, warp w rotating head 4·blockIdx.y + w.
extern "C" __global__ void __launch_bounds__(128) kvant_rope_split(
        const float* __restrict__ qkv, int n, const int* __restrict__ positions, int start,
        float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
        const float2* __restrict__ angles, int ropeDim, int neox,
        int heads, int kvHeads, int headDim, int headDimV,
        const float* __restrict__ qNorm, const float* __restrict__ kNorm, float eps,
        const int* __restrict__ tables, int tableStride, int seqStride, int pageTokens, int* __restrict__ slots,
        int* __restrict__ prevPages) {
    KVANT_GRID_ENTER();
    int t = blockIdx.x;
    int pos = positions != nullptr ? positions[t] : start + t;
    int qDim = heads * headDim, kvDim = kvHeads * headDim, kvDimV = kvHeads * headDimV;
    const float* row = qkv + (i64) t * (qDim + kvDim + kvDimV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float2* angle = angles + (i64) t * (ropeDim / 2);
    int h = blockIdx.y * 4 + warp;
    if (h < heads + kvHeads) {
        bool isQ = h < heads;
        const float* src = isQ ? row + h * headDim : row + qDim + (h - heads) * headDim;
        float* dst = isQ ? q + (i64) t * qDim + h * headDim : k + (i64) t * kvDim + (h - heads) * headDim;
        const float* norm = isQ ? qNorm : kNorm;
        float scale = 1.f;
        if (norm != nullptr) {
            float ss = 0.f;
            for (int i = lane; i < headDim; i += 32) {
                ss = fmaf(src[i], src[i], ss);
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                ss += __shfl_xor_sync(FULL_MASK, ss, o);
            }
            scale = 1.f / sqrtf(ss / (float) headDim + eps);
        }
        int half = ropeDim / 2;
        for (int i = lane; i < headDim; i += 32) {
            // element i's partner and angle index
            float xi = src[i] * scale;
            if (norm != nullptr) {
                xi *= norm[i];
            }
            int pair, partner;
            bool first;
            if (neox) {
                pair = i < half ? i : i - half;
                partner = i < half ? i + half : i - half;
                first = i < half;
            } else {
                pair = i >> 1;
                partner = i ^ 1;
                first = (i & 1) == 0;
            }
            float out = xi;
            if (i < ropeDim) {
                float xp = src[partner] * scale;
                if (norm != nullptr) {
                    xp *= norm[partner];
                }
                float2 cs = angle[pair];
                out = first ? xi * cs.x - xp * cs.y : xp * cs.y + xi * cs.x;
            }
            dst[i] = out;
        }
    }
    if (blockIdx.y != 0) {
        return;
    }
    const float* vs = row + qDim + kvDim;
    for (int i = threadIdx.x; i < kvDimV; i += blockDim.x) {
        v[(i64) t * kvDimV + i] = vs[i];
    }
    if (threadIdx.x == 0 && slots != nullptr) {
        const int* table = tables + (i64) t * seqStride * tableStride;
        slots[t] = table[pos / pageTokens] * pageTokens + pos % pageTokens;
        if (prevPages != nullptr) {
            // for kvant_kv_page_means: a decode vector, or a prefill's first token, starts its sequence's write
            const bool first = positions != nullptr || t == 0;
            prevPages[t] = pos < pageTokens ? -1 : first ? table[pos / pageTokens - 1] : -2;
        }
    }
}

// ---- prefill helpers

// gu: [n][2·ffn] (gate rows, then up rows, of the stacked projection) → silu(gate)·up [n][ffn], as f16 into outH
// (the operand of the down GEMM) or as f32 into outF (decode, when gate and up differ in format).
extern "C" __global__ void kvant_swiglu(const float* __restrict__ gu, int ffn, int n, u16* __restrict__ outH,
                                        float* __restrict__ outF) {
    KVANT_GRID_ENTER();
    i64 total = (i64) n * ffn;
    for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64) gridDim.x * blockDim.x) {
        i64 t = i / ffn;
        int r = (int) (i - t * ffn);
        float g = gu[t * 2 * ffn + r], u = gu[t * 2 * ffn + ffn + r];
        float y = g / (1.f + expf(-g)) * u;
        if (outH != nullptr) {
            outH[i] = f2h(y);
        } else {
            outF[i] = y;
        }
    }
}

extern "C" __global__ void kvant_to_half(const float* __restrict__ x, u16* __restrict__ out, i64 total) {
    KVANT_GRID_ENTER();
    for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64) gridDim.x * blockDim.x) {
        out[i] = f2h(x[i]);
    }
}

// y[t][i] += b[i] for n rows of width floats
extern "C" __global__ void kvant_add_bias(float* __restrict__ y, const float* __restrict__ b, int width, int n) {
    KVANT_GRID_ENTER();
    i64 total = (i64) n * width;
    for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64) gridDim.x * blockDim.x) {
        y[i] += b[i % width];
    }
}
