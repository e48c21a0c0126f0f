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
// f16 conversions saturate (.satfinite, PTX ISA 8.1): a value past the f16 range, an infinity too, becomes ±65504,
// so an f16 operand of a tensor-core product or GEMM never carries an infinity that would turn its zero products
// into NaN; NaN stays NaN. (bf16's range is float's: its conversions do not saturate.)
__device__ __forceinline__ u16 f2h(float x) {
    u16 h;
    asm("cvt.rn.satfinite.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// The larger of a and b, NaN if either is (max.NaN): the 8-bit vectors' block maxima, so a NaN activation makes its
// block's scale NaN and reaches the products' outputs, as Math.max makes it on the CPU, instead of being dropped by
// fmaxf and coded as 0.
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ float bf2f(u16 b) {
    return __uint_as_float(((u32) b) << 16);
}
// Greedy choice folded into the output product: a 64-bit key that orders by logit, then by the lower index, so an
// atomicMax over every row gives the argmax (lowest index among equal logits) whatever the order of the rows. A NaN
// logit ranks below every number (0 in the high half), as Sampler.argmax ranks it; all NaN gives index 0; -0 and +0
// are equal logits, as there.
__device__ __forceinline__ unsigned long long argmax_key(float v, int index) {
    u32 b = __float_as_uint(v == 0.f ? 0.f : v);   // -0 as +0 (equal logits: the lower id), as Sampler.argmax
    u32 ordered = v != v ? 0u : (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((unsigned long long) ordered << 32) | (u32) (0xFFFFFFFFu - (u32) index);
}

__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return *(const u16*) p;
}

// Exact float of an integer |s| < 2^22 in two full-rate operations (an int-to-float conversion runs at a quarter of
// the rate on sm_90, and the 8-bit products make one per term): s + 1.5·2^23 as float bits, less 1.5·2^23.
__device__ __forceinline__ float small_int_float(int s) {
    return __fsub_rn(__int_as_float(0x4B400000 + s), 12582912.f);
}

// ---- dequantizing: 8 consecutive weights (chunk c of the 32-weight sub-block s) of row `row`

// K-quant scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block: six bits each, packed in 12 bytes.
__device__ __forceinline__ void kq_scale_min(const u8* sc, int j, float& scale, float& min) {
    if (j < 4) {
        scale = small_int_float(sc[j] & 63);
        min = small_int_float(sc[j + 4] & 63);
    } else {
        scale = small_int_float((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
        min = small_int_float((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
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
            w[i] = __fmaf_rn(scale, (float) q, -off);  // one rounding, as kvant_mh_* decodes it
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
// Blocks a lane of a one-vector 8-bit product over a planar format (Q4_0, Q8_0) loads before multiplying any of
// them. On the H200 two (46 registers for Q4_0, one row a warp) ran tg128 4-5% faster than the loop left to the
// compiler, four (76 registers: fewer warps fit) 1% (docs/BENCHMARKS.md).
#define MV_ROUND 2

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
// One vector (kvant_mq1r*_): launch geometry and outputs as kvant_mv*, a warp taking 1 row (2 with SwiGLU).
// Several vectors: kvant_mt_* below, on the tensor cores, which take each row's blocks in the same order and add the
// same terms, rounded the same way (q8_add: explicit roundings, nothing left to contraction), so a vector gets the same bits
// from either kernel: alone or in a batch.

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// acc plus one block's term, from the block's exact integer sum s, every rounding explicit (see above; an fma is
// one rounding): Q8_0, Q6_K acc + dw·(dx·s); Q4_0 (s = Σ c·qx over the codes c = q + 8) acc + dw·(dx·s − 8·dy);
// Q4_K, Q5_K (acc − mw·dy) + dw·(dx·s); Q6_K's s = Σ_h sc_h·Σ(q − 32)·qx. dw, mw: the block's weight scale and min;
// dx, dy: the vector's d and d·Σq.
template <int F>
__device__ __forceinline__ float q8_add(float acc, float dw, float mw, float dx, float dy, int s) {
    // |s| < 2^22 but for Q6_K, whose scaled sums reach 2^24 (a conversion, exact below 2^24)
    float fs = F == W_Q6_K ? (float) s : small_int_float(s);
    if constexpr (F == W_Q4_0) {
        return __fmaf_rn(dw, __fmaf_rn(dx, fs, __fmul_rn(-8.f, dy)), acc);
    } else if constexpr (F == W_Q4_K || F == W_Q5_K) {
        return __fmaf_rn(dw, __fmul_rn(dx, fs), __fmaf_rn(-mw, dy, acc));
    } else {
        return __fmaf_rn(dw, __fmul_rn(dx, fs), acc);
    }
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
    if constexpr ((F == W_Q4_0 || F == W_Q8_0) && NV == 1) {
        // One vector over a planar format: a lane's blocks MV_ROUND at a time, every load of a round (the rows'
        // quants and scales, the vector's codes) issued before the round's first product, then multiplied in block
        // order — the loop below's terms in its order, so the same bits (ModelKernelsGpuTest), its loads in flight
        // together where the compiler had spread the loop's
        constexpr int QW = F == W_Q4_0 ? 4 : 8;   // 32-bit words of a block's quants
        for (int s0 = lane; s0 < nb; s0 += 32 * MV_ROUND) {
            u32 q[MV_ROUND][R][QW];
            unsigned short dh[MV_ROUND][R];
            uint4 x0[MV_ROUND], x1[MV_ROUND];
            float2 ds[MV_ROUND];
#pragma unroll
            for (int u = 0; u < MV_ROUND; u++) {
                const int s = s0 + 32 * u;
                if (s < nb) {
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        const i64 b = (i64) rows[i] * nb + s;
                        dh[u][i] = __ldg((const unsigned short*) (W + scales + b * 2));
                        const uint4 t0 = __ldg((const uint4*) (W + b * (QW * 4)));
                        q[u][i][0] = t0.x; q[u][i][1] = t0.y; q[u][i][2] = t0.z; q[u][i][3] = t0.w;
                        if constexpr (QW == 8) {
                            const uint4 t1 = __ldg((const uint4*) (W + b * 32 + 16));
                            q[u][i][4] = t1.x; q[u][i][5] = t1.y; q[u][i][6] = t1.z; q[u][i][7] = t1.w;
                        }
                    }
                    const uint4* xp = (const uint4*) (xq + s * 32);
                    x0[u] = xp[0];
                    x1[u] = xp[1];
                    ds[u] = xds[s];
                }
            }
#pragma unroll
            for (int u = 0; u < MV_ROUND; u++) {
                if (s0 + 32 * u < nb) {
                    const int xw[8] = {(int) x0[u].x, (int) x0[u].y, (int) x0[u].z, (int) x0[u].w,
                                       (int) x1[u].x, (int) x1[u].y, (int) x1[u].z, (int) x1[u].w};
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        int wq[8];
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            if constexpr (QW == 4) {
                                wq[k] = (int) (q[u][i][k] & 0x0F0F0F0Fu);
                                wq[k + 4] = (int) ((q[u][i][k] >> 4) & 0x0F0F0F0Fu);
                            } else {
                                wq[k] = (int) q[u][i][k];
                                wq[k + 4] = (int) q[u][i][k + 4];
                            }
                        }
                        int sum = 0;
#pragma unroll
                        for (int k = 0; k < 8; k++) {
                            sum = dp4a(wq[k], xw[k], sum);
                        }
                        acc[i][0] = q8_add<F>(acc[i][0], h2f(dh[u][i]), 0.f, ds[u].x, ds[u].y, sum);
                    }
                }
            }
        }
        warp_outputs<R, NV>(acc, r0, valid, nvec, out, outStride, bias, mode, best);
        return;
    }
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
                        acc[i][v] = q8_add<F>(acc[i][v], dw[i], 0.f, ds.x, 0.f, isum);
                        continue;
                    }
                    int sum = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        sum = dp4a(wq[i][k], xw[k], sum);
                    }
                    acc[i][v] = q8_add<F>(acc[i][v], dw[i], mw[i], ds.x, ds.y, sum);
                }
            }
        }
    }
    warp_outputs<R, NV>(acc, r0, valid, nvec, out, outStride, bias, mode, best);
}

// Bytes of each weight range (a row's quants, its scales) that the one-vector products ask L2 for before their wait:
// the first two rounds of a warp's loads (32 lanes x 16 bytes x 2 for Q4_0). Measured on the H200 (tg128 of
// llama3-8b Q4_0, docs/BENCHMARKS.md): +4% with 1 KB, the same with 512 bytes; 2 KB (a 4,096-column Q4_0 row's
// quants whole) and 4 KB -7%, the whole rows by cp.async.bulk.prefetch -3%.
#define MV_PREFETCH_BYTES 1024

// Each lane asks L2 for the 128-byte lines at its offsets lane·128 + k·4096 of [p, p + min(bytes,
// MV_PREFETCH_BYTES)): prefetch.global.L2, a hint that holds no register and is never waited for.
__device__ __forceinline__ void prefetch_lines(const u8* p, i64 bytes, int lane) {
    const i64 n = bytes < MV_PREFETCH_BYTES ? bytes : MV_PREFETCH_BYTES;
    for (i64 off = (i64) lane * 128; off < n; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
    }
}

// The lanes of each warp of a one-vector 8-bit product ask L2 for the start of its rows (quants and scales) before
// the kernel's griddepcontrol.wait. Weights never change under a decode step, so this may come before the wait
// (KernelSource.GRID_ENTER); a product launched as a programmatic dependent has its blocks placed while the kernel
// before it (an RMSNorm, the attention merge, the quantization of the down product's input) still runs, so its
// first loads find their lines in L2 instead of waiting a DRAM round trip after that kernel ends.
template <int F, int R>
__device__ __forceinline__ void prefetch_warp_rows(const u8* W, i64 nb64, i64 scales, int outputs, int cols,
                                                   int mode, int ffn) {
    const int lane = threadIdx.x & 31;
    int r0;
    int rows[R];
    bool valid[R];
    if (!warp_rows<R>(blockIdx.x * MV_WARPS + (threadIdx.x >> 5), outputs, mode, ffn, r0, rows, valid)) {
        return;
    }
    const i64 nb = cols / 32;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (!valid[i]) {
            continue;
        }
        const i64 r = rows[i];
        if constexpr (F == W_Q4_0 || F == W_Q8_0) {   // planar: the quant plane, then the scale plane
            const i64 qb = F == W_Q4_0 ? 16 : 32;
            prefetch_lines(W + r * nb * qb, nb * qb, lane);
            prefetch_lines(W + scales + r * nb * 2, nb * 2, lane);
        } else if constexpr (F == W_Q6_K) {           // super-blocks of 208 bytes, then the d plane
            prefetch_lines(W + r * (nb >> 3) * 208, (nb >> 3) * 208, lane);
            prefetch_lines(W + scales + r * (nb >> 3) * 2, (nb >> 3) * 2, lane);
        } else {                                      // Q4_K, Q5_K: GGUF rows of nb64 bytes
            prefetch_lines(W + r * nb64, nb64, lane);
        }
    }
}

#define KVANT_Q8_KERNELS(NAME, F)                                                                                 \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mq1r2_##NAME(                               \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        prefetch_warp_rows<F, 2>(W, nb, scales, outputs, cols, mode, ffn);                                        \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_q8<F, 1, 2>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias, mode, ffn, best);  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) kvant_mq1r1_##NAME(                               \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        prefetch_warp_rows<F, 1>(W, nb, scales, outputs, cols, mode, ffn);                                        \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_q8<F, 1, 1>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias, mode, ffn, best);  \
    }

KVANT_Q8_KERNELS(q8_0, W_Q8_0)
KVANT_Q8_KERNELS(q4_0, W_Q4_0)
KVANT_Q8_KERNELS(q4_k, W_Q4_K)
KVANT_Q8_KERNELS(q5_k, W_Q5_K)
KVANT_Q8_KERNELS(q6_k, W_Q6_K)

// ---- the same products on the tensor cores, for 2 to 8 vectors: 16 weight rows × 8 vectors per integer mma
//
// A block of MT_WARPS warps takes a tile of 16 weight rows (MV_SWIGLU: 8 gate rows and their 8 up rows) and all its
// columns; warp w takes the 256-column groups w, w + MT_WARPS, ... (Q4_0, Q8_0: 8 blocks; K-quants: a super-block).
// A warp copies each group into its own ring of shared-memory stages with 16-byte cp.async (the 16 rows' bytes, the
// vectors' codes through L1, which the blocks of a multiprocessor share, their scale pairs, the rows' scales), one
// group in flight while it multiplies the one before: the mma fragments want 4 bytes of 8 different rows per load,
// which straight from global memory cost 8 cache lines a load (measured: 25-60% of copy bandwidth); from shared
// memory, with row strides that put the 8 rows in different banks, one wavefront.
// Per 32-value block, one mma.m16n8k32 (s8 × s8 → s32; Q4_0 u8 × s8; Q6_K one m16n8k16 per 16-value half, each under
// its own scale) gives the 16 × 8 exact integer sums of the block, the same integers dp4a gives the one-vector
// kernel (Q6_K's codes are made signed first, q − 32, exact per byte, so Σ(q − 32)·qx is its s − 32·Σqx). Thread
// (g = lane/4, t = lane%4) owns rows g and g + 8 against vectors 2t and 2t + 1: A's k-slots of that thread are
// values 4t..4t+3 and 16+4t..16+4t+3 of the block, B's the same values of vector g.
// Bits: with 8-block groups and 4 warps, warp w multiplies exactly the blocks lanes 8w..8w+7 of the one-vector
// kernel take (block b goes to lane b mod 32); each thread keeps one running sum per such lane (acc[j]), adds the
// blocks' terms in the same order through q8_add, and warp 0 adds the 32 sums in the one-vector kernel's butterfly
// order. So every vector gets the bits it gets alone, whatever else is in the batch. Vectors past nvec (and blocks
// past a row's end) are neither loaded nor written: their columns hold stale bytes that no written output reads.
#define MT_WARPS 4    // with 8-block groups, warp w takes the blocks of lanes 8w..8w+7 of the one-vector kernel
#define MT_STAGES 2  // groups a warp has in its ring: S − 1 in flight while it multiplies one
#define MT_XSTRIDE 272  // a vector's 256 codes in shared memory, padded: rows g = 0..7 in different banks

__device__ __forceinline__ void mma_k32(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// The same with A unsigned (Q4_0's codes 0..15).
__device__ __forceinline__ void mma_k32_u8(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

__device__ __forceinline__ void mma_k16(int (&d)[4], u32 a0, u32 a1, u32 b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// Per byte c − k for bytes c in 0..127 and k <= 128 (no borrow crosses a byte): Q6_K's signed codes q − 32.
__device__ __forceinline__ u32 sub_bytes(u32 c, u32 k4) {
    return ((c | 0x80808080u) - k4) ^ 0x80808080u;
}

// Byte i (a constant after unrolling) of the 12 packed K-quant scale bytes s[0..2].
__device__ __forceinline__ int kq_byte(const u32 (&s)[3], int i) {
    return (int) ((s[i >> 2] >> (8 * (i & 3))) & 0xFF);
}

__device__ __forceinline__ void kq_scale_min_regs(const u32 (&s)[3], int j, float& scale, float& min) {
    if (j < 4) {
        scale = small_int_float(kq_byte(s, j) & 63);
        min = small_int_float(kq_byte(s, j + 4) & 63);
    } else {
        scale = small_int_float((kq_byte(s, j + 4) & 0xF) | ((kq_byte(s, j - 4) >> 6) << 4));
        min = small_int_float((kq_byte(s, j + 4) >> 4) | ((kq_byte(s, j) >> 6) << 4));
    }
}

// A format's group in shared memory: RB bytes of a row's group (quant plane or GGUF row), RBP their stride there
// (≡ 16, 48 or 80 mod 128 bytes: the 8 rows of a fragment load in different banks), SC the scale bytes a row's group
// has in the scale plane (Q4_0, Q8_0: 8 block scales; Q6_K: the super-block's d).
template <int F> struct MtGeom {
    static constexpr int RB = F == W_Q8_0 ? 256 : F == W_Q4_0 ? 128 : F == W_Q4_K ? 144 : F == W_Q5_K ? 176 : 208;
    static constexpr int RBP = F == W_Q8_0 ? 272 : F == W_Q4_0 ? 144 : RB;
    static constexpr int SC = F == W_Q8_0 || F == W_Q4_0 ? 16 : F == W_Q6_K ? 2 : 0;
    static constexpr int CHUNKS = RB / 16;                    // 16-byte chunks of a row's group
    static constexpr int PER_LANE = (16 * CHUNKS + 31) / 32;  // of the 16 rows' chunks
    static constexpr int W_BYTES = 16 * RBP;
    static constexpr int X_BYTES = 8 * MT_XSTRIDE;
    static constexpr int DS_BYTES = 64 * 8;
    static constexpr int SC_BYTES = SC == 16 ? 256 : SC == 2 ? 32 : 0;
    static constexpr int STAGE = W_BYTES + X_BYTES + DS_BYTES + SC_BYTES;
};

// Row i (0..15) of the block's tile: the weight row and whether its output exists.
__device__ __forceinline__ int mt_row(int i, int o0, int outputs, int mode, int ffn) {
    if (mode == MV_SWIGLU) {
        int o = o0 + (i & 7);
        return o < outputs ? (i < 8 ? o : ffn + o) : 0;
    }
    return o0 + i < outputs ? o0 + i : 0;
}

// (smem_u32 and the cp.async copies: KernelSource.CP_ASYNC, prepended to every kvant source)

// What a lane copies of every group, worked out once: sources at group 0 (a group adds gr · RB bytes to the rows',
// gr · 256 to the vectors', gr · 8 to the scales') and places in a stage; a source of -1 bytes into its row (at) is
// none, and Q4_0/Q8_0 chunks and blocks past a row's end are skipped.
template <int F> struct MtPlan {
    const u8* w[MtGeom<F>::PER_LANE];
    int wAt[MtGeom<F>::PER_LANE];  // the chunk's byte in the row's group (-1: no chunk)
    int wTo[MtGeom<F>::PER_LANE];
    const i8* x[4];
    int xAt[4];                    // the chunk's column in the group (-1: no vector)
    const float2* ds[2];
    int dsAt[2];                   // the block in the group (-1: no vector)
    const u8* sc;                  // lanes 0..15: the row's scales at group 0
};

template <int F>
__device__ __forceinline__ void mt_plan(MtPlan<F>& p, const u8* __restrict__ W, i64 rowStride, i64 scales, int nb,
                                        int cols, int o0, int outputs, int mode, int ffn,
                                        const i8* __restrict__ xq, const float2* __restrict__ xds, int nvec,
                                        int lane) {
    using G = MtGeom<F>;
#pragma unroll
    for (int k = 0; k < G::PER_LANE; k++) {
        int idx = k * 32 + lane;
        int i = idx / G::CHUNKS, c = idx % G::CHUNKS;
        p.wAt[k] = i < 16 ? c * 16 : -1;
        p.wTo[k] = i * G::RBP + c * 16;
        p.w[k] = W + (i64) mt_row(i & 15, o0, outputs, mode, ffn) * rowStride + c * 16;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int idx = k * 32 + lane;
        int v = idx >> 4, c = idx & 15;
        p.xAt[k] = v < nvec ? c * 16 : -1;
        p.x[k] = xq + (i64) max(min(v, nvec - 1), 0) * cols + c * 16;
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int idx = k * 32 + lane;
        int v = idx >> 3, j = idx & 7;
        p.dsAt[k] = v < nvec ? j : -1;
        p.ds[k] = xds + (i64) max(min(v, nvec - 1), 0) * nb + j;
    }
    int row = mt_row(lane & 15, o0, outputs, mode, ffn);
    p.sc = W + scales + (G::SC == 2 ? (i64) row * (nb >> 3) * 2 : (i64) row * nb * 2);
}

// Starts the copies of group gr into a stage: the 16 rows' bytes, the vectors' codes and scale pairs, the rows'
// scales (copied at once where they are not 16-byte aligned: Q4_0/Q8_0 rows of a width not a multiple of 256, Q6_K).
// X: with the vectors' codes and scale pairs (the tensor-core products); without them (kvant_mh_*, whose f16
// vectors the block stages itself) the rows' scales follow the rows' bytes at once.
template <int F, bool X>
__device__ __forceinline__ void mt_issue(u8* stage, const MtPlan<F>& p, i64 rowLen, int nb, int cols, int gr,
                                         int lane) {
    using G = MtGeom<F>;
    i64 off = (i64) gr * G::RB;
#pragma unroll
    for (int k = 0; k < G::PER_LANE; k++) {
        if (p.wAt[k] >= 0 && off + p.wAt[k] < rowLen) {
            cp_async16(stage + p.wTo[k], p.w[k] + off);
        }
    }
    u8* xs = stage + G::W_BYTES;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (X && p.xAt[k] >= 0 && gr * 256 + p.xAt[k] < cols) {
            // through L1: the blocks on a multiprocessor read the same vectors (through L2 alone, eight vectors'
            // codes were as many bytes as Q4_0's weights, and the eight-vector products a third slower)
            cp_async16_ca(xs + ((k * 32 + lane) >> 4) * MT_XSTRIDE + p.xAt[k], p.x[k] + gr * 256);
        }
    }
    float2* ds = (float2*) (xs + G::X_BYTES);
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (X && p.dsAt[k] >= 0 && gr * 8 + p.dsAt[k] < nb) {
            cp_async8(ds + k * 32 + lane, p.ds[k] + gr * 8);
        }
    }
    u8* sc = X ? (u8*) ds + G::DS_BYTES : stage + G::W_BYTES;
    if constexpr (G::SC == 16) {
        if (lane < 16) {
            const u8* q = p.sc + gr * 16;
            if ((nb & 7) == 0) {
                cp_async16(sc + lane * 16, q);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    if (gr * 8 + j < nb) {
                        ((u16*) (sc + lane * 16))[j] = __ldg((const unsigned short*) (q + 2 * j));
                    }
                }
            }
        }
    } else if constexpr (G::SC == 2) {
        if (lane < 16) {
            ((u16*) sc)[lane] = __ldg((const unsigned short*) (p.sc + gr * 2));
        }
    }
}

__device__ __forceinline__ u32 lds32(const u8* p) {
    return *(const u32*) p;
}

// acc[j][i] += the products of block j of the staged group gr: i = 0, 1 row g against vectors 2t, 2t + 1; i = 2, 3
// row g + 8 (acc[j] is the running sum that lane 8·warp + j keeps in the one-vector kernel).
template <int F>
__device__ __forceinline__ void mt_multiply(const u8* stage, int nb, int gr, int g, int t, float (&acc)[8][4]) {
    using G = MtGeom<F>;
    const u8* ra = stage + g * G::RBP;
    const u8* rb = stage + (g + 8) * G::RBP;
    const u8* xv = stage + G::W_BYTES + g * MT_XSTRIDE;
    const float2* ds = (const float2*) (stage + G::W_BYTES + G::X_BYTES);
    const float2* d0 = ds + (2 * t) * 8;
    const float2* d1 = ds + (2 * t + 1) * 8;
    const u8* sc = stage + G::W_BYTES + G::X_BYTES + G::DS_BYTES;
    if constexpr (F == W_Q8_0 || F == W_Q4_0) {
        const u16* sa = (const u16*) (sc + g * 16);
        const u16* sb = (const u16*) (sc + (g + 8) * 16);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (gr * 8 + j < nb) {
                u32 x0 = lds32(xv + j * 32 + t * 4), x1 = lds32(xv + j * 32 + 16 + t * 4);
                int d[4];
                if constexpr (F == W_Q8_0) {
                    mma_k32(d, lds32(ra + j * 32 + t * 4), lds32(rb + j * 32 + t * 4),
                            lds32(ra + j * 32 + 16 + t * 4), lds32(rb + j * 32 + 16 + t * 4), x0, x1);
                } else {
                    u32 wa = lds32(ra + j * 16 + t * 4), wb = lds32(rb + j * 16 + t * 4);
                    mma_k32_u8(d, wa & 0x0F0F0F0Fu, wb & 0x0F0F0F0Fu, (wa >> 4) & 0x0F0F0F0Fu,
                               (wb >> 4) & 0x0F0F0F0Fu, x0, x1);
                }
                float dwa = h2f(sa[j]), dwb = h2f(sb[j]);
                float2 s0 = d0[j], s1 = d1[j];
                acc[j][0] = q8_add<F>(acc[j][0], dwa, 0.f, s0.x, s0.y, d[0]);
                acc[j][1] = q8_add<F>(acc[j][1], dwa, 0.f, s1.x, s1.y, d[1]);
                acc[j][2] = q8_add<F>(acc[j][2], dwb, 0.f, s0.x, s0.y, d[2]);
                acc[j][3] = q8_add<F>(acc[j][3], dwb, 0.f, s1.x, s1.y, d[3]);
            }
        }
    } else if constexpr (F == W_Q4_K || F == W_Q5_K) {
        constexpr int QS = F == W_Q4_K ? 16 : 48;
        uint4 ha = *(const uint4*) ra, hb = *(const uint4*) rb;
        u32 sa[3] = {ha.y, ha.z, ha.w}, sbk[3] = {hb.y, hb.z, hb.w};
        float da = h2f((u16) (ha.x & 0xFFFF)), ma = h2f((u16) (ha.x >> 16));
        float db = h2f((u16) (hb.x & 0xFFFF)), mb = h2f((u16) (hb.x >> 16));
        u32 qha0 = 0, qha1 = 0, qhb0 = 0, qhb1 = 0;
        if constexpr (F == W_Q5_K) {
            qha0 = lds32(ra + 16 + t * 4);
            qha1 = lds32(ra + 32 + t * 4);
            qhb0 = lds32(rb + 16 + t * 4);
            qhb1 = lds32(rb + 32 + t * 4);
        }
#pragma unroll
        for (int p = 0; p < 4; p++) {
            u32 la = lds32(ra + QS + p * 32 + t * 4), ha2 = lds32(ra + QS + p * 32 + 16 + t * 4);
            u32 lb = lds32(rb + QS + p * 32 + t * 4), hb2 = lds32(rb + QS + p * 32 + 16 + t * 4);
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int j = 2 * p + e, shift = 4 * e;
                u32 a0 = (la >> shift) & 0x0F0F0F0Fu, a2 = (ha2 >> shift) & 0x0F0F0F0Fu;
                u32 a1 = (lb >> shift) & 0x0F0F0F0Fu, a3 = (hb2 >> shift) & 0x0F0F0F0Fu;
                if constexpr (F == W_Q5_K) {
                    a0 |= ((qha0 >> j) & 0x01010101u) << 4;
                    a2 |= ((qha1 >> j) & 0x01010101u) << 4;
                    a1 |= ((qhb0 >> j) & 0x01010101u) << 4;
                    a3 |= ((qhb1 >> j) & 0x01010101u) << 4;
                }
                // as dp4a's kernel: dw = d·sc, mw = dmin·m
                float sc0, mn0;
                kq_scale_min_regs(sa, j, sc0, mn0);
                float dwa = da * sc0, mwa = ma * mn0;
                kq_scale_min_regs(sbk, j, sc0, mn0);
                float dwb = db * sc0, mwb = mb * mn0;
                u32 x0 = lds32(xv + j * 32 + t * 4), x1 = lds32(xv + j * 32 + 16 + t * 4);
                float2 s0 = d0[j], s1 = d1[j];
                int d[4];
                mma_k32(d, a0, a1, a2, a3, x0, x1);
                acc[j][0] = q8_add<F>(acc[j][0], dwa, mwa, s0.x, s0.y, d[0]);
                acc[j][1] = q8_add<F>(acc[j][1], dwa, mwa, s1.x, s1.y, d[1]);
                acc[j][2] = q8_add<F>(acc[j][2], dwb, mwb, s0.x, s0.y, d[2]);
                acc[j][3] = q8_add<F>(acc[j][3], dwb, mwb, s1.x, s1.y, d[3]);
            }
        }
    } else {  // W_Q6_K, planar super-blocks (see dq8): ql[128] qh[64] scales[16], d in the scale plane
        uint4 ka = *(const uint4*) (ra + 192), kb = *(const uint4*) (rb + 192);
        u32 ksa[4] = {ka.x, ka.y, ka.z, ka.w}, ksb[4] = {kb.x, kb.y, kb.z, kb.w};
        float dwa = h2f(((const u16*) sc)[g]), dwb = h2f(((const u16*) sc)[g + 8]);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int h = j >> 2, quarter = j & 3;
            int lowShift = quarter >= 2 ? 4 : 0, highShift = quarter * 2;
            u32 a[2][2];  // [row][word]
#pragma unroll
            for (int w = 0; w < 2; w++) {
                u32 la = lds32(ra + h * 64 + (quarter & 1) * 32 + w * 16 + t * 4);
                u32 lb = lds32(rb + h * 64 + (quarter & 1) * 32 + w * 16 + t * 4);
                u32 qa = lds32(ra + 128 + h * 32 + w * 16 + t * 4);
                u32 qb = lds32(rb + 128 + h * 32 + w * 16 + t * 4);
                a[0][w] = sub_bytes(((la >> lowShift) & 0x0F0F0F0Fu) | (((qa >> highShift) & 0x03030303u) << 4),
                                    0x20202020u);
                a[1][w] = sub_bytes(((lb >> lowShift) & 0x0F0F0F0Fu) | (((qb >> highShift) & 0x03030303u) << 4),
                                    0x20202020u);
            }
            u32 x0 = lds32(xv + j * 32 + t * 4), x1 = lds32(xv + j * 32 + 16 + t * 4);
            float dx0 = d0[j].x, dx1 = d1[j].x;
            int e[4], f[4];
            mma_k16(e, a[0][0], a[1][0], x0);
            mma_k16(f, a[0][1], a[1][1], x1);
            // the sub-block's two int8 scales: bytes 2j and 2j + 1 of the 16
            int sa0 = (int) (signed char) ((ksa[j >> 1] >> (16 * (j & 1))) & 0xFF);
            int sa1 = (int) (signed char) ((ksa[j >> 1] >> (16 * (j & 1) + 8)) & 0xFF);
            int sb0 = (int) (signed char) ((ksb[j >> 1] >> (16 * (j & 1))) & 0xFF);
            int sb1 = (int) (signed char) ((ksb[j >> 1] >> (16 * (j & 1) + 8)) & 0xFF);
            acc[j][0] = q8_add<F>(acc[j][0], dwa, 0.f, dx0, 0.f, sa0 * e[0] + sa1 * f[0]);
            acc[j][1] = q8_add<F>(acc[j][1], dwa, 0.f, dx1, 0.f, sa0 * e[1] + sa1 * f[1]);
            acc[j][2] = q8_add<F>(acc[j][2], dwb, 0.f, dx0, 0.f, sb0 * e[2] + sb1 * f[2]);
            acc[j][3] = q8_add<F>(acc[j][3], dwb, 0.f, dx1, 0.f, sb0 * e[3] + sb1 * f[3]);
        }
    }
}

template <int F, int NW, int S>
__device__ void matvec_mt(const u8* __restrict__ W, i64 nb64, i64 scales, int outputs, int cols,
                          const i8* __restrict__ xq, const float2* __restrict__ xds, int nvec, float* out,
                          int outStride, const float* __restrict__ bias, int mode, int ffn,
                          unsigned long long* __restrict__ best) {
    using G = MtGeom<F>;
    extern __shared__ __align__(16) u8 stages[];  // NW · S · G::STAGE bytes (ModelKernels.mtSharedBytes)
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, t = lane & 3;
    bool swiglu = mode == MV_SWIGLU;
    int o0 = blockIdx.x * (swiglu ? 8 : 16);
    int nb = cols / 32;
    // the rows' bytes in the quant plane (Q4_0, Q8_0, Q6_K) or in GGUF's rows (Q4_K, Q5_K; nb64 = bytes a row)
    i64 rowStride = F == W_Q8_0 ? (i64) nb * 32 : F == W_Q4_0 ? (i64) nb * 16 : F == W_Q6_K ? (i64) (nb >> 3) * 208
                                                                                            : nb64;
    i64 rowLen = F == W_Q4_K || F == W_Q5_K ? nb64 : rowStride;
    u8* mine = stages + warp * S * G::STAGE;  // the warp's ring of S stages
    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            acc[j][i] = 0.f;
        }
    }
    int groups = (nb + 7) / 8;
    int n = warp < groups ? (groups - warp + NW - 1) / NW : 0;  // the warp's groups: warp, warp + NW, ...
    MtPlan<F> plan;
    mt_plan<F>(plan, W, rowStride, scales, nb, cols, o0, outputs, mode, ffn, xq, xds, nvec, lane);
#pragma unroll
    for (int k = 0; k < S - 1; k++) {
        if (k < n) {
            mt_issue<F, true>(mine + k * G::STAGE, plan, rowLen, nb, cols, warp + k * NW, lane);
        }
        cp_async_commit();
    }
    for (int k = 0; k < n; k++) {
        __syncwarp();  // every lane is done with the stage the next copies go to (read at k − 1)
        int ahead = k + S - 1;
        if (ahead < n) {
            mt_issue<F, true>(mine + (ahead % S) * G::STAGE, plan, rowLen, nb, cols, warp + ahead * NW, lane);
        }
        cp_async_commit();
        cp_async_wait<S - 1>();  // this lane's copies of group k have landed
        __syncwarp();            // and every lane's
        mt_multiply<F>(mine + (k % S) * G::STAGE, nb, warp + k * NW, g, t, acc);
    }
    // The 32 running sums p_L (L = 8·warp + j), each in its warp's ring (no copies are pending), added by warp 0 in
    // the one-vector kernel's butterfly order: ((((p_L + p_L+16) + (p_L+8 + p_L+24)) + ...), L from 0.
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 8; j++) {
        *(float4*) (mine + (j * 32 + lane) * 16) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    }
    __syncthreads();
    if (warp != 0) {
        return;
    }
    float b[8][4];  // b_j = (p_j + p_j+16) + (p_j+8 + p_j+24): warps 0 and 2, then 1 and 3
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float4 p0 = *(const float4*) (stages + 0 * S * G::STAGE + (j * 32 + lane) * 16);
        float4 p1 = *(const float4*) (stages + 1 * S * G::STAGE + (j * 32 + lane) * 16);
        float4 p2 = *(const float4*) (stages + 2 * S * G::STAGE + (j * 32 + lane) * 16);
        float4 p3 = *(const float4*) (stages + 3 * S * G::STAGE + (j * 32 + lane) * 16);
        b[j][0] = __fadd_rn(__fadd_rn(p0.x, p2.x), __fadd_rn(p1.x, p3.x));
        b[j][1] = __fadd_rn(__fadd_rn(p0.y, p2.y), __fadd_rn(p1.y, p3.y));
        b[j][2] = __fadd_rn(__fadd_rn(p0.z, p2.z), __fadd_rn(p1.z, p3.z));
        b[j][3] = __fadd_rn(__fadd_rn(p0.w, p2.w), __fadd_rn(p1.w, p3.w));
    }
    float sum[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float c0 = __fadd_rn(b[0][i], b[4][i]), c1 = __fadd_rn(b[1][i], b[5][i]);
        float c2 = __fadd_rn(b[2][i], b[6][i]), c3 = __fadd_rn(b[3][i], b[7][i]);
        sum[i] = __fadd_rn(__fadd_rn(c0, c2), __fadd_rn(c1, c3));
    }
    bool va = o0 + g < outputs, vb = swiglu ? va : o0 + g + 8 < outputs;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        int v = 2 * t + c;
        if (v >= nvec) {
            break;
        }
        float* o = out + (i64) v * outStride;
        if (swiglu) {
            if (va) {
                float gate = sum[c], up = sum[2 + c];
                o[o0 + g] = gate / (1.f + expf(-gate)) * up;
            }
            continue;
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = o0 + g + 8 * r;
            if (r == 0 ? va : vb) {
                float val = sum[2 * r + c];
                if (bias != nullptr) {
                    val += bias[row];
                }
                if (mode == MV_ADD) {
                    o[row] += val;
                } else {
                    o[row] = val;
                }
                if (best != nullptr) {
                    atomicMax(best + v, argmax_key(val, row));
                }
            }
        }
    }
}

#define KVANT_MT_KERNEL(NAME, F)                                                                                  \
    extern "C" __global__ void __launch_bounds__(MT_WARPS * 32) kvant_mt_##NAME(                                  \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const i8* xq, const float2* xds, int nvec,    \
            float* out, int outStride, const float* bias, int mode, int ffn, unsigned long long* best) {          \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_mt<F, MT_WARPS, MT_STAGES>(W, nb, scales, outputs, cols, xq, xds, nvec, out, outStride, bias,     \
                                          mode, ffn, best);                                                       \
    }

KVANT_MT_KERNEL(q8_0, W_Q8_0)
KVANT_MT_KERNEL(q4_0, W_Q4_0)
KVANT_MT_KERNEL(q4_k, W_Q4_K)
KVANT_MT_KERNEL(q5_k, W_Q5_K)
KVANT_MT_KERNEL(q6_k, W_Q6_K)

// ---- weight matrix × a few f16 vectors, the weights dequantized on the fly (prompt chunks of a few tokens)
//
// A prompt chunk of n <= a few dozen tokens through dequant-to-f16 + cuBLASLt writes and reads an f16 copy of every
// weight; through the 8-bit products it pays a float rescale per 32-weight block, output and vector. Here every
// weight is decoded once per block of vectors, to the f16 value kvant_dequant_* gives it (dq8's formula, one
// rounding), and multiplied on the tensor cores (m16n8k16, f16 in, f32 sums) against the vectors' f16 form (the
// operand the GEMM path reads).
// grid:   (ceil(rows / 64), ceil(nvec / 32), splits); block of MH_WARPS = 4 warps (64 = 16 · MH_WARPS rows).
// shared: MH_STAGES stages of MhGeom::STAGE bytes: each warp's 16 rows at MtGeom's padded stride and their scales,
//         then the block's 32 vectors at MH_XSTRIDE (ModelKernels.mhSharedBytes).
// warp:   16 weight rows (64·bx + 16·warp ..), the block's 32 vectors (32·by ..) as four n8 tiles, over the groups of
//         256 columns of split z: [z·per, min(groups, (z + 1)·per)), all warps on the same group: each copies its
//         rows' bytes (mt_issue, as the tensor-core products), the block the vectors' 256 values, into a ring of
//         MH_STAGES stages.
// k:      a 16-column step gives thread t columns 4t..4t+3 in the A slots 2t, 2t+1, 2t+8, 2t+9 and the vectors'
//         same columns in the same B slots (a permutation of k, the same for both operands).
// order:  each output is one running f32 sum over its split's groups in order (the mma's own accumulation);
//         splits == 1 writes (MV_STORE) or adds (MV_ADD) it to out, more splits write partial[z][v][row] (rows
//         `outputs` apart) for kvant_mh_reduce, which adds them in split order. Fixed either way.
#define MH_WARPS 4
#define MH_VECTORS 32
#define MH_STAGES 2
#define MH_XSTRIDE 544  // a vector's 256 f16 in shared memory, padded: the 8-byte B loads of a half-warp conflict-free

template <int F> struct MhGeom {
    static constexpr int WARP = MtGeom<F>::W_BYTES + MtGeom<F>::SC_BYTES;  // a warp's rows and their scales
    static constexpr int X = MH_VECTORS * MH_XSTRIDE;
    static constexpr int STAGE = MH_WARPS * WARP + X;
};

__device__ __forceinline__ void mma_f16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Byte i of w (0..255) as a float plus 2^23, in one byte permute (its bits under 0x4B000000).
__device__ __forceinline__ float byte_float(u32 w, int i) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440 | i));
}

// The f16 pair of values (scale · (code − zero) − off) of bytes 2p, 2p + 1 of the codes word u (each 0..255), as
// dq8 computes them: the code exact, one product (and the offset through one fma where the format has one).
template <int F>
__device__ __forceinline__ u32 mh_pair(u32 u, int p, float zero, float scale, float off) {
    float q0 = __fsub_rn(byte_float(u, 2 * p), zero), q1 = __fsub_rn(byte_float(u, 2 * p + 1), zero);
    if constexpr (F == W_Q4_K || F == W_Q5_K) {
        return pack_h2(__fmaf_rn(scale, q0, -off), __fmaf_rn(scale, q1, -off));
    } else {
        return pack_h2(__fmul_rn(scale, q0), __fmul_rn(scale, q1));
    }
}

// The A fragment of the 16-column step h (0, 1) of block j of the staged group: rows g (a0, a2) and g + 8 (a1, a3),
// columns j·32 + h·16 + 4t .. + 3 (see k above).
template <int F>
__device__ __forceinline__ void mh_fragment(const u8* rows, int g, int t, int j, int h, u32 (&a)[4]) {
    using G = MtGeom<F>;
    const u8* sc = rows + G::W_BYTES;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const u8* row = rows + (g + 8 * r) * G::RBP;
        u32 u;
        float zero, scale, off = 0.f;
        if constexpr (F == W_Q8_0) {
            u = lds32(row + j * 32 + h * 16 + t * 4) ^ 0x80808080u;  // q + 128
            zero = 8388736.f;
            scale = h2f(((const u16*) (sc + (g + 8 * r) * 16))[j]);
        } else if constexpr (F == W_Q4_0) {
            u = (lds32(row + j * 16 + t * 4) >> (4 * h)) & 0x0F0F0F0Fu;  // q + 8
            zero = 8388616.f;
            scale = h2f(((const u16*) (sc + (g + 8 * r) * 16))[j]);
        } else if constexpr (F == W_Q4_K || F == W_Q5_K) {
            constexpr int QS = F == W_Q4_K ? 16 : 48;
            uint4 head = *(const uint4*) row;
            u32 s[3] = {head.y, head.z, head.w};
            float m;
            kq_scale_min_regs(s, j, scale, m);
            scale = h2f((u16) (head.x & 0xFFFF)) * scale;
            off = h2f((u16) (head.x >> 16)) * m;
            u = (lds32(row + QS + (j >> 1) * 32 + h * 16 + t * 4) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
            if constexpr (F == W_Q5_K) {
                u |= ((lds32(row + 16 + h * 16 + t * 4) >> j) & 0x01010101u) << 4;
            }
            zero = 8388608.f;
        } else {  // W_Q6_K (see dq8)
            int half = j >> 2, quarter = j & 3;
            u32 lo = lds32(row + half * 64 + (quarter & 1) * 32 + h * 16 + t * 4);
            u32 hi = lds32(row + 128 + half * 32 + h * 16 + t * 4);
            u = ((lo >> (quarter >= 2 ? 4 : 0)) & 0x0F0F0F0Fu) | (((hi >> (quarter * 2)) & 0x03030303u) << 4);
            zero = 8388640.f;  // q − 32
            float d = h2f(((const u16*) sc)[g + 8 * r]);
            scale = d * (float) (signed char) row[192 + half * 8 + quarter * 2 + h];
        }
        a[r] = mh_pair<F>(u, 0, zero, scale, off);
        a[2 + r] = mh_pair<F>(u, 1, zero, scale, off);
    }
}

// Starts the copies of group gr into a stage: each warp its 16 rows' bytes and scales, the block the nv vectors'
// 256 f16 (those past nv, and columns past the row's end, are not copied: their products are never used).
template <int F>
__device__ __forceinline__ void mh_issue(u8* stage, const MtPlan<F>& plan, i64 rowLen, int nb, int cols, int gr,
                                         const u16* __restrict__ xv, int nv, int tid) {
    using H = MhGeom<F>;
    mt_issue<F, false>(stage + (tid >> 5) * H::WARP, plan, rowLen, nb, cols, gr, tid & 31);
    u8* xs = stage + MH_WARPS * H::WARP;
#pragma unroll
    for (int k = 0; k < MH_VECTORS * 32 / (MH_WARPS * 32); k++) {
        int c = k * MH_WARPS * 32 + tid;
        int v = c >> 5, part = c & 31;
        if (v < nv && gr * 256 + part * 8 < cols) {
            cp_async16(xs + v * MH_XSTRIDE + part * 16, xv + (i64) v * cols + gr * 256 + part * 8);
        }
    }
}

template <int F>
__device__ void matvec_mh(const u8* __restrict__ W, i64 nb64, i64 scales, int outputs, int cols,
                          const u16* __restrict__ xh, int nvec, float* __restrict__ out, int outStride, int mode,
                          float* __restrict__ partial, int perSplit) {
    using G = MtGeom<F>;
    using H = MhGeom<F>;
    extern __shared__ __align__(16) u8 stages[];  // MH_STAGES · H::STAGE bytes (ModelKernels.mhSharedBytes)
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, t = lane & 3;
    int o0 = (blockIdx.x * MH_WARPS + warp) * 16;
    int v0 = blockIdx.y * MH_VECTORS;
    int nv = min(MH_VECTORS, nvec - v0);
    int nb = cols / 32, groups = (nb + 7) / 8;
    int first = blockIdx.z * perSplit, n = max(0, min(groups, first + perSplit) - first);
    i64 rowStride = F == W_Q8_0 ? (i64) nb * 32 : F == W_Q4_0 ? (i64) nb * 16 : F == W_Q6_K ? (i64) (nb >> 3) * 208
                                                                                            : nb64;
    i64 rowLen = F == W_Q4_K || F == W_Q5_K ? nb64 : rowStride;
    MtPlan<F> plan;
    mt_plan<F>(plan, W, rowStride, scales, nb, cols, o0, outputs, MV_STORE, 0, nullptr, nullptr, 0, lane);
    const u16* xv = xh + (i64) v0 * cols;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            acc[i][e] = 0.f;
        }
    }
#pragma unroll
    for (int k = 0; k < MH_STAGES - 1; k++) {
        if (k < n) {
            mh_issue<F>(stages + k * H::STAGE, plan, rowLen, nb, cols, first + k, xv, nv, tid);
        }
        cp_async_commit();
    }
    for (int k = 0; k < n; k++) {
        __syncthreads();  // every thread is done with the stage the next copies go to (read at k − 1)
        int ahead = k + MH_STAGES - 1;
        if (ahead < n) {
            mh_issue<F>(stages + (ahead % MH_STAGES) * H::STAGE, plan, rowLen, nb, cols, first + ahead, xv, nv, tid);
        }
        cp_async_commit();
        cp_async_wait<MH_STAGES - 1>();  // this thread's copies of group k have landed
        __syncthreads();                 // and every thread's
        const u8* stage = stages + (k % MH_STAGES) * H::STAGE;
        const u8* rows = stage + warp * H::WARP;
        const u8* xs = stage + MH_WARPS * H::WARP + g * MH_XSTRIDE + t * 8;
        int gr = first + k;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (gr * 8 + j >= nb) {
                break;
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                u32 a[4];
                mh_fragment<F>(rows, g, t, j, h, a);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    if (i * 8 < nv) {
                        uint2 b = *(const uint2*) (xs + i * 8 * MH_XSTRIDE + (j * 32 + h * 16) * 2);
                        mma_f16(acc[i], a[0], a[1], a[2], a[3], b.x, b.y);
                    }
                }
            }
        }
    }
    // acc[i]: rows g (0, 1) and g + 8 (2, 3) against vectors 8i + 2t (0, 2) and 8i + 2t + 1 (1, 3)
    bool direct = gridDim.z == 1;
    float* dst = direct ? out : partial + (i64) blockIdx.z * nvec * outputs;
    i64 stride = direct ? outStride : outputs;
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int v = i * 8 + 2 * t + (e & 1), row = o0 + g + 8 * (e >> 1);
            if (v < nv && row < outputs) {
                float* o = dst + (i64) (v0 + v) * stride + row;
                if (direct && mode == MV_ADD) {
                    *o += acc[i][e];
                } else {
                    *o = acc[i][e];
                }
            }
        }
    }
}

#define KVANT_MH_KERNEL(NAME, F)                                                                                  \
    extern "C" __global__ void __launch_bounds__(MH_WARPS * 32) kvant_mh_##NAME(                                  \
            const u8* W, i64 nb, i64 scales, int outputs, int cols, const u16* xh, int nvec, float* out,          \
            int outStride, int mode, float* partial, int perSplit) {                                              \
        KVANT_GRID_ENTER();                                                                                       \
        matvec_mh<F>(W, nb, scales, outputs, cols, xh, nvec, out, outStride, mode, partial, perSplit);            \
    }

KVANT_MH_KERNEL(q8_0, W_Q8_0)
KVANT_MH_KERNEL(q4_0, W_Q4_0)
KVANT_MH_KERNEL(q4_k, W_Q4_K)
KVANT_MH_KERNEL(q5_k, W_Q5_K)
KVANT_MH_KERNEL(q6_k, W_Q6_K)

// out[v][row] (stride outStride) = or += Σ_z partial[z][v][row], z in order, for v < nvec, row < outputs.
// grid: ceil(nvec · outputs / 256) blocks of 256 threads, one thread an output.
extern "C" __global__ void kvant_mh_reduce(const float* __restrict__ partial, int splits, int nvec, int outputs,
                                           float* __restrict__ out, int outStride, int mode) {
    KVANT_GRID_ENTER();
    i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x, plane = (i64) nvec * outputs;
    if (i >= plane) {
        return;
    }
    float s = partial[i];
    for (int z = 1; z < splits; z++) {
        s = __fadd_rn(s, partial[z * plane + i]);
    }
    int v = (int) (i / outputs), row = (int) (i - (i64) v * outputs);
    float* o = out + (i64) v * outStride + row;
    *o = mode == MV_ADD ? __fadd_rn(*o, s) : s;
}

// One warp quantizes one 32-value block of a vector: lane l holds value l.
__device__ __forceinline__ void quantize_block(float v, i8* q, float2* ds) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a = fmax_nan(a, __shfl_xor_sync(FULL_MASK, a, o));
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

// ---- draws (kvant_draw): a row whose draw has a temperature T > 0 takes the token of the largest l/T + g over its
// candidates, g a standard Gumbel variate of (the draw's key, the token id) — the Gumbel-max draw, which picks
// candidate i with probability exp(l_i/T) / Σ exp(l_j/T) — and writes it as the row's argmax key (argmax_key: ties
// to the lower id), where the output product's argmax key stood. The candidates are the host sampler's (Sampler):
// every id; with top-k, the k largest logits (ties to the lower id), then the fewest of them, largest first, whose
// weights exp(l - max) reach top-p of theirs, then those of them whose weight is at least min-p; without top-k (and
// top-p 1), the ids whose weight is at least min-p. Banned ids (up to DRAW_BANNED a row) and NaN logits are never
// candidates. A row at T = 0 with banned ids or penalties takes the largest other (penalized) logit; one at T = 0
// with neither keeps the product's key (greedy). An infinite logit wins (the lowest id of them); all -inf: the lowest id, as greedy's. One
// block a row. The draw of row v is draws[8v .. 8v + 7]: 1/T as float bits (0: greedy) | the number of banned ids
// << 32; the key; the banned ids, two a word (low half first), in the next two; top-k (0: off, at most DRAW_TOPK) |
// top-p's float bits << 32; min-p's float bits | the number of penalized ids << 32; the repeat penalty's float bits
// | the frequency penalty's << 32; the presence penalty's. A row with penalized ids (penalized[DRAW_PENALIZED v ..]:
// (id, count) pairs, distinct ids) has those logits changed first, in place, in the host sampler's float arithmetic:
// l becomes (l > 0 ? l / repeat : l · repeat) − (count · frequency + presence); then it is drawn (or, at T = 0, takes
// the largest logit) as above.
#define DRAW_BANNED 4
#define DRAW_PENALIZED 64
#define DRAW_TOPK 256
#define DRAW_THREADS 1024
// The two-pass top-k's histogram of ref - l: DRAW_BINS bins of 1 / DRAW_BIN_SCALE over [0, DRAW_RANGE), and at most
// DRAW_CAND candidates taken from them.
#define DRAW_BINS 2048
#define DRAW_BIN_SCALE 64.f
#define DRAW_RANGE 32.f
#define DRAW_CAND 2048
static_assert(DRAW_BINS == 2 * DRAW_THREADS && DRAW_RANGE * DRAW_BIN_SCALE == DRAW_BINS, "the histogram's bins");

// A standard Gumbel variate of (key, id): the id's counter mixed into the key (splitmix64's finalizer), the top 23
// bits a uniform u = (m + 1/2) / 2^23 in [2^-24, 1 - 2^-24], every step exact in float, -log(-log u) finite. (With
// 24 bits, (2^24 - 1) + 1/2 rounds to 2^24 in float: u = 1, g = +inf, and that token won the draw — one draw in
// 2^24 / vocab, 0.8% of a 128K vocabulary's, a token at random.)
__device__ __forceinline__ float gumbel(unsigned long long key, int id) {
    unsigned long long z = key + (unsigned long long) (id + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = ((float) (z >> 41) + 0.5f) * (1.0f / 8388608.0f);
    return -logf(-logf(u));
}

// Sorts a[0..size) largest first (size a power of two, at most 2 · DRAW_THREADS), bitonic in shared memory, every
// thread of the block taking part; a[] is ready to read after it.
__device__ __forceinline__ void bitonic_descending(unsigned long long* a, int size) {
    for (int run = 2; run <= size; run <<= 1) {
        for (int stride = run >> 1; stride > 0; stride >>= 1) {
            for (int j = threadIdx.x; j < size; j += DRAW_THREADS) {
                const int partner = j ^ stride;
                if (partner > j) {
                    const bool descending = (j & run) == 0;
                    const unsigned long long x = a[j], y = a[partner];
                    if (descending ? x < y : x > y) {
                        a[j] = y;
                        a[partner] = x;
                    }
                }
            }
            __syncthreads();
        }
    }
}

// The largest of each thread's v over the block (every thread gets it); scratch: DRAW_THREADS / 32 words.
__device__ __forceinline__ unsigned long long block_max(unsigned long long v, unsigned long long* scratch) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(FULL_MASK, v, o);
        v = other > v ? other : v;
    }
    __syncthreads();   // scratch free again
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    v = scratch[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(FULL_MASK, v, o);
        v = other > v ? other : v;
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(DRAW_THREADS) kvant_draw(float* logits, int vocab,
        const unsigned long long* __restrict__ draws, const int2* __restrict__ penalized,
        unsigned long long* __restrict__ best) {
    KVANT_GRID_ENTER();
    __shared__ unsigned long long scratch[DRAW_THREADS / 32];
    __shared__ unsigned int hist[DRAW_BINS];
    __shared__ unsigned long long cand[DRAW_CAND];
    __shared__ double weight[DRAW_TOPK];
    __shared__ int shared[3];
    const int v = blockIdx.x;
    const unsigned long long* d = draws + 8 * v;
    const unsigned long long head = d[0];
    const float invT = __uint_as_float((u32) head);
    const int nbanned = min((int) (head >> 32), DRAW_BANNED);
    const int npen = min((int) (u32) (d[5] >> 32), DRAW_PENALIZED);
    if (!(invT > 0.f) && nbanned == 0 && npen == 0) {
        return;
    }
    if (npen > 0) {   // the penalties first (distinct ids: each logit is one thread's), seen by the block after
        float* w = logits + (i64) v * vocab;
        const float repeat = __uint_as_float((u32) d[6]), frequency = __uint_as_float((u32) (d[6] >> 32));
        const float presence = __uint_as_float((u32) d[7]);
        for (int j = threadIdx.x; j < npen; j += DRAW_THREADS) {
            const int2 p = penalized[(i64) v * DRAW_PENALIZED + j];
            if (p.x >= 0 && p.x < vocab) {
                float l = w[p.x];
                l = l > 0.f ? __fdiv_rn(l, repeat) : __fmul_rn(l, repeat);
                w[p.x] = __fsub_rn(l, __fadd_rn(__fmul_rn((float) p.y, frequency), presence));
            }
        }
        __syncthreads();
    }
    const unsigned long long key = d[1];
    int banned[DRAW_BANNED];
#pragma unroll
    for (int b = 0; b < DRAW_BANNED; b++) {
        banned[b] = b < nbanned ? (int) (u32) (d[2 + b / 2] >> (32 * (b & 1))) : -1;
    }
    const bool drawn = invT > 0.f;
    const int topK = drawn ? min((int) (u32) d[4], DRAW_TOPK) : 0;
    const float topP = __uint_as_float((u32) (d[4] >> 32));
    const float minP = drawn ? __uint_as_float((u32) d[5]) : 0.f;
    const float* row = logits + (i64) v * vocab;
    // the candidate key of id i: argmax_key of its logit, 0 for a NaN or banned one
    auto keyOf = [&](int i) -> unsigned long long {
        const float l = row[i];
        bool out = l != l;
#pragma unroll
        for (int b = 0; b < DRAW_BANNED; b++) {
            out |= i == banned[b];
        }
        return out ? 0ull : argmax_key(l, i);
    };
    if (drawn && topK == 0 && !(minP > 0.f)) {   // no filter: the draw in one pass over the vocabulary
        unsigned long long pick = 0ull;
        for (int i = threadIdx.x; i < vocab; i += DRAW_THREADS) {
            const unsigned long long k = keyOf(i);
            if (k != 0ull) {
                const float l = row[i];
                const bool inf = l == __int_as_float(0x7f800000) || l == -__int_as_float(0x7f800000);
                const unsigned long long c = argmax_key(inf ? l : fmaf(l, invT, gumbel(key, i)), i);
                pick = c > pick ? c : pick;
            }
        }
        pick = block_max(pick, scratch);
        if (threadIdx.x == 0 && pick != 0ull) {
            best[v] = pick;
        }
        return;
    }
    // Top-k in two passes where the output product's argmax key (best[v], banned ids among its candidates) is a
    // finite logit ref, mostly at least every candidate's (not where penalties lowered it, or banned it): a histogram
    // of d = ref - l over [0, DRAW_RANGE) in bins of 1 / DRAW_BIN_SCALE (l above ref in bin 0), the first bin b whose
    // count from the top reaches k, then the candidates of bins 0..b into cand and sorted. The bin of l never rises as
    // l does, so every id left out is below every id taken: the k largest keys are the first k. Where that cannot be done (no usable ref, fewer than k ids in range, more than DRAW_CAND
    // taken), the radix selection below (eight more passes).
    int n = -1;              // the candidates, largest first, in cand[0..n) once found
    float mx = 0.f;          // the largest candidate's logit
    if (drawn && topK > 0) {
        const unsigned long long hint = best[v];   // 0 where no product left one (a key's id is below vocab)
        const u32 hintId = 0xFFFFFFFFu - (u32) hint;
        const float ref = (hint >> 32) != 0ull && hintId < (u32) vocab ? row[hintId] : __int_as_float(0x7f800000);
        if (ref == ref && ref != __int_as_float(0x7f800000) && ref != -__int_as_float(0x7f800000)) {
            for (int b = threadIdx.x; b < DRAW_BINS; b += DRAW_THREADS) {
                hist[b] = 0u;
            }
            __syncthreads();
            // id i's bin, -1 for none (out of range, NaN, banned); a logit above ref (no argmax of this row, then)
            // goes to bin 0, which keeps the bins in order
            auto binOf = [&](int i) -> int {
                if (keyOf(i) == 0ull) {
                    return -1;
                }
                const float d = ref - row[i];
                return !(d < DRAW_RANGE) ? -1 : d > 0.f ? (int) (d * DRAW_BIN_SCALE) : 0;
            };
            for (int i = threadIdx.x; i < vocab; i += DRAW_THREADS) {
                const int b = binOf(i);
                if (b >= 0) {
                    atomicAdd(&hist[b], 1u);
                }
            }
            __syncthreads();
            // the counts from the top (bin 0) summed: thread t holds bins 2t, 2t + 1; the thread whose pair crosses k
            // names the bin and the count through it
            const u32 h0 = hist[2 * threadIdx.x], h1 = hist[2 * threadIdx.x + 1];
            u32 incl = h0 + h1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u32 other = __shfl_up_sync(FULL_MASK, incl, o);
                incl += (threadIdx.x & 31) >= o ? other : 0u;
            }
            if (threadIdx.x == 0) {
                shared[2] = -1;
            }
            __syncthreads();
            if ((threadIdx.x & 31) == 31) {
                scratch[threadIdx.x >> 5] = incl;
            }
            __syncthreads();
            if (threadIdx.x < 32) {
                u32 w = scratch[threadIdx.x];
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const u32 other = __shfl_up_sync(FULL_MASK, w, o);
                    w += threadIdx.x >= o ? other : 0u;
                }
                scratch[threadIdx.x] = w;   // warps 0..w's counts
            }
            __syncthreads();
            incl += (threadIdx.x >> 5) > 0 ? (u32) scratch[(threadIdx.x >> 5) - 1] : 0u;
            const u32 before = incl - h0 - h1;
            if (before < (u32) topK && incl >= (u32) topK) {
                const bool first = before + h0 >= (u32) topK;
                shared[0] = first ? 2 * threadIdx.x : 2 * threadIdx.x + 1;
                shared[2] = (int) (first ? before + h0 : incl);
            }
            __syncthreads();
            const int through = shared[0], count = shared[2];
            if (count > 0 && count <= DRAW_CAND) {
                if (threadIdx.x == 0) {
                    shared[1] = 0;
                }
                __syncthreads();
                for (int i = threadIdx.x; i < vocab; i += DRAW_THREADS) {
                    const int b = binOf(i);
                    if (b >= 0 && b <= through) {
                        cand[atomicAdd(&shared[1], 1)] = keyOf(i);
                    }
                }
                __syncthreads();
                int size = 2;
                while (size < count) {
                    size <<= 1;
                }
                for (int j = count + threadIdx.x; j < size; j += DRAW_THREADS) {
                    cand[j] = 0ull;
                }
                __syncthreads();
                bitonic_descending(cand, size);
                mx = row[0xFFFFFFFFu - (u32) cand[0]];
                n = mx != __int_as_float(0x7f800000) ? topK : -1;   // an infinite logit: the general path's
            }
        }
    }
    if (n < 0) {
        // the largest candidate key and its logit (greedy with banned ids, and every draw with a filter, needs it)
        unsigned long long top = 0ull;
        for (int i = threadIdx.x; i < vocab; i += DRAW_THREADS) {
            const unsigned long long k = keyOf(i);
            top = k > top ? k : top;
        }
        top = block_max(top, scratch);
        if (top == 0ull) {
            return;   // no candidate: the product's key stays
        }
        const int topId = (int) (0xFFFFFFFFu - (u32) top);
        mx = row[topId];
        const bool finite = mx != __int_as_float(0x7f800000) && mx != -__int_as_float(0x7f800000);
        // greedy with banned ids; or an infinite largest logit (or all -inf): it is the token
        if (!drawn || !finite) {
            if (threadIdx.x == 0) {
                best[v] = top;
            }
            return;
        }
    }
    unsigned long long chosen;
    if (topK > 0) {
        if (n < 0) {
            // the k-th largest candidate key (keys are distinct: the id is in them), by radix selection a byte at a
            // time
            if (threadIdx.x == 0) {
                shared[0] = topK;   // how many are still to be taken at or below the prefix
            }
            unsigned long long prefix = 0ull;
            __syncthreads();
            for (int shift = 56; shift >= 0; shift -= 8) {
                for (int b = threadIdx.x; b < 256; b += DRAW_THREADS) {
                    hist[b] = 0u;
                }
                __syncthreads();
                const unsigned long long mask = shift == 56 ? 0ull : ~0ull << (shift + 8);
                // lanes of a warp counting the same byte add once (the early bytes of similar logits are nearly all
                // equal: one shared counter a lane would serialize a pass)
                for (int i0 = 0; i0 < vocab; i0 += DRAW_THREADS) {
                    const int i = i0 + threadIdx.x;
                    const unsigned long long k = i < vocab ? keyOf(i) : 0ull;
                    const bool counts = k != 0ull && (k & mask) == prefix;
                    const u32 bin = counts ? (u32) (k >> shift) & 255u : 256u;
                    const u32 peers = __match_any_sync(FULL_MASK, bin);
                    if (counts && (threadIdx.x & 31) == __ffs(peers) - 1) {
                        atomicAdd(&hist[bin], (u32) __popc(peers));
                    }
                }
                __syncthreads();
                if (threadIdx.x == 0) {
                    int remain = shared[0];
                    int digit = 0;
                    for (int b = 255; b >= 0; b--) {
                        if ((int) hist[b] >= remain) {
                            digit = b;
                            break;
                        }
                        remain -= (int) hist[b];
                        digit = -1;
                    }
                    if (digit < 0) {   // fewer candidates than k: every one of them
                        digit = 0;
                        remain = 0;
                    }
                    shared[0] = remain;
                    shared[1] = digit;
                }
                __syncthreads();
                prefix |= (unsigned long long) shared[1] << shift;
                __syncthreads();
            }
            const unsigned long long floorKey = shared[0] == 0 ? 1ull : prefix;   // candidates: keys >= floorKey
            // the candidates into cand (unordered), then sorted largest first (bitonic, zeros last)
            for (int j = threadIdx.x; j < DRAW_TOPK; j += DRAW_THREADS) {
                cand[j] = 0ull;
            }
            if (threadIdx.x == 0) {
                shared[1] = 0;
            }
            __syncthreads();
            for (int i = threadIdx.x; i < vocab; i += DRAW_THREADS) {
                const unsigned long long k = keyOf(i);
                if (k != 0ull && k >= floorKey) {
                    const int at = atomicAdd(&shared[1], 1);
                    if (at < DRAW_TOPK) {
                        cand[at] = k;
                    }
                }
            }
            __syncthreads();
            bitonic_descending(cand, DRAW_TOPK);
            n = min(shared[1], DRAW_TOPK);
        }
        // the cuts in the host sampler's order and arithmetic (up to rounding at a cut: docs/GPU.md): each
        // candidate's weight exp(l - max) in double, then one thread's sums in rank order
        if (threadIdx.x < n) {
            weight[threadIdx.x] = exp((double) row[0xFFFFFFFFu - (u32) cand[threadIdx.x]] - (double) mx);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double mass = 0.0;
            for (int j = 0; j < n; j++) {
                mass += weight[j];
            }
            int keep = n;
            if (topP < 1.f) {
                double cum = 0.0;
                for (int j = 0; j < n; j++) {
                    cum += weight[j] / mass;
                    if (cum >= (double) topP) {
                        keep = j + 1;
                        break;
                    }
                }
            }
            if (minP > 0.f) {
                int k = 1;
                while (k < keep && weight[k] >= (double) minP) {
                    k++;
                }
                keep = k;
            }
            shared[0] = keep;
        }
        __syncthreads();
        unsigned long long pick = 0ull;
        if (threadIdx.x < shared[0]) {
            const int id = (int) (0xFFFFFFFFu - (u32) cand[threadIdx.x]);
            pick = argmax_key(fmaf(row[id], invT, gumbel(key, id)), id);
        }
        chosen = block_max(pick, scratch);
    } else {
        // every candidate whose weight exp(l - max) is at least min-p (all of them without it)
        const double minCut = minP > 0.f ? (double) mx + log((double) minP) : 0.0;
        unsigned long long pick = 0ull;
        for (int i = threadIdx.x; i < vocab; i += DRAW_THREADS) {
            const unsigned long long k = keyOf(i);
            if (k != 0ull) {
                const float l = row[i];
                // the host's two cuts: l >= max + log(min-p) (Sampler's floor), then exp(l - max) >= min-p
                if (minP > 0.f && !((double) l >= minCut && exp((double) l - (double) mx) >= (double) minP)) {
                    continue;
                }
                const bool inf = l == -__int_as_float(0x7f800000);
                const unsigned long long c = argmax_key(inf ? l : fmaf(l, invT, gumbel(key, i)), i);
                pick = c > pick ? c : pick;
            }
        }
        chosen = block_max(pick, scratch);
    }
    if (threadIdx.x == 0 && chosen != 0ull) {
        best[v] = chosen;
    }
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
// The sum of squares has one fixed order, that of NORM_THREADS virtual threads: virtual thread v sums the 4-value
// chunks v, v + NORM_THREADS, ... (dim <= 4·NORM_THREADS·NORM_CHUNKS) with fmaf in order, each warp of 32 of them
// by butterflies (16, 8, .., 1), and the 32 warps' sums by butterflies again.
// grid: (n, ceil(min(dim / 4, NORM_THREADS) / NORM_SLICE)); block: NORM_SLICE threads. Every block of a row sums the
// whole row (thread t playing the virtual threads t, t + NORM_SLICE, ...: lane for lane, so its warps' shuffles are
// the virtual warps'), then writes only its slice: the chunks of virtual thread blockIdx.y·NORM_SLICE + t. A decode
// step's norm is latency: several small blocks, each with one barrier over four warps and every load of the row in
// flight at once, finish sooner than one block of NORM_THREADS (3.5 µs a row in ncu on the H200). An 8-bit block of
// 32 values is the chunks of 8 neighbouring lanes.
#define NORM_THREADS 1024
#define NORM_CHUNKS 4
#define NORM_SLICE 128

extern "C" __global__ void __launch_bounds__(NORM_SLICE) kvant_rmsnorm(
        const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, u16* __restrict__ yh,
        i8* __restrict__ yq, float2* __restrict__ yds, int dim, float eps) {
    KVANT_GRID_ENTER();
    constexpr int VJ = NORM_THREADS / NORM_SLICE;   // virtual threads a thread plays
    __shared__ float sums[NORM_THREADS / 32];
    const int t = threadIdx.x, lane = t & 31, slice = blockIdx.y;
    const i64 row = (i64) blockIdx.x * dim;
    const float4* xr = (const float4*) (x + row);
    const float4* wr = (const float4*) w;
    const int chunks = dim / 4;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 mine[NORM_CHUNKS], wv[NORM_CHUNKS];   // this block's slice: virtual thread slice·NORM_SLICE + t
    float ss[VJ];
#pragma unroll
    for (int j = 0; j < VJ; j++) {
        ss[j] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < NORM_CHUNKS; k++) {
        const int c = slice * NORM_SLICE + t + k * NORM_THREADS;
        mine[k] = zero;
        wv[k] = c < chunks ? wr[c] : zero;   // fetched with x: one memory round trip
        if (k * NORM_THREADS >= chunks) {
            continue;   // uniform: no chunk of this pass exists
        }
        float4 v[VJ];
#pragma unroll
        for (int j = 0; j < VJ; j++) {
            const int cj = t + j * NORM_SLICE + k * NORM_THREADS;
            v[j] = cj < chunks ? xr[cj] : zero;
        }
#pragma unroll
        for (int j = 0; j < VJ; j++) {
            ss[j] = fmaf(v[j].x, v[j].x, ss[j]);
            ss[j] = fmaf(v[j].y, v[j].y, ss[j]);
            ss[j] = fmaf(v[j].z, v[j].z, ss[j]);
            ss[j] = fmaf(v[j].w, v[j].w, ss[j]);
            if (j == slice) {
                mine[k] = v[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < VJ; j++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            ss[j] += __shfl_xor_sync(FULL_MASK, ss[j], o);
        }
        if (lane == 0) {
            sums[(t + j * NORM_SLICE) >> 5] = ss[j];
        }
    }
    __syncthreads();
    float total = sums[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        total += __shfl_xor_sync(FULL_MASK, total, o);
    }
    const float inv = 1.f / sqrtf(total / (float) dim + eps);
#pragma unroll
    for (int k = 0; k < NORM_CHUNKS; k++) {
        const int c = slice * NORM_SLICE + t + k * NORM_THREADS;
        if (k * NORM_THREADS >= chunks) {
            break;  // uniform across the block: no chunk of this pass exists
        }
        const bool live = c < chunks;  // dim % 32 == 0, so whole groups of 8 lanes agree
        const float4 v = mine[k], ww = wv[k];
        float o[4] = {v.x * inv * ww.x, v.y * inv * ww.y, v.z * inv * ww.z, v.w * inv * ww.w};
        if (live && y != nullptr) {
            ((float4*) (y + row))[c] = make_float4(o[0], o[1], o[2], o[3]);
        }
        if (live && yh != nullptr) {
            ((uint2*) (yh + row))[c] = make_uint2(pack_h2(o[0], o[1]), pack_h2(o[2], o[3]));
        }
        if (yq != nullptr) {
            float a = fmax_nan(fmax_nan(fabsf(o[0]), fabsf(o[1])), fmax_nan(fabsf(o[2]), fabsf(o[3])));
#pragma unroll
            for (int m = 1; m < 8; m <<= 1) {
                a = fmax_nan(a, __shfl_xor_sync(FULL_MASK, a, m));
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
// (angles from kvant_rope_angles), q/k/v split into their own contiguous buffers, and (slots given: the first local
// layer of a stage's step, whose other layers share them) each vector's cache slot from its page table.
//
// qkv: [n][qDim + 2·kvDim] (the fused projection's output); positions: int [n], or null for start + t;
// tables: page table of vector t at tables + (t·seqStride)·tableStride (seqStride 0: one sequence, prefill).
// grid: (n, ceil((heads + kvHeads) / 4)); block: 128 threads, warp w rotating head 4·blockIdx.y + w (rope.cuh's
// rope_head); the V copy is spread over all the vector's threads, so no thread loops over it. A decode step with a
// format that kv_write.cu's kvant_rope_write takes does this and the cache write in one launch instead. qRotation
// 64 or 128: the q heads then rotated into K's basis (rotate_head), as a dense prefill in the rotated basis takes
// them (CudaAttention.prefill); 0 leaves them.
#define ROPE_MAX_DIM 256

// A head of headDim values (x[j] = element 32j + lane) rotated by blocks of n = 64 or 128 (rotation.cuh, the
// attention kernels' wht_row for such a head: the same bits), or left as it is for n = 0. A warp, all lanes.
template <int J>
__device__ __forceinline__ void rotate_head(float (&x)[J], int headDim, int n, int lane, bool inverse) {
    if (n == 128) {
#pragma unroll
        for (int b = 0; b < J / 4; b++) {
            if (128 * b < headDim) wht_block<128>(x + 4 * b, lane, inverse);
        }
    } else if (n == 64) {
#pragma unroll
        for (int b = 0; b < J / 2; b++) {
            if (64 * b < headDim) wht_block<64>(x + 2 * b, lane, inverse);
        }
    }
}
extern "C" __global__ void __launch_bounds__(128) kvant_rope_split(
        const float* __restrict__ qkv, int n, const int* __restrict__ positions, int start,
        float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
        const float2* __restrict__ angles, int ropeDim, int neox,
        int heads, int kvHeads, int headDim, int headDimV,
        const float* __restrict__ qNorm, const float* __restrict__ kNorm, float eps,
        const int* __restrict__ tables, int tableStride, int seqStride, int pageTokens, int* __restrict__ slots,
        int* __restrict__ prevPages, int qRotation) {
    KVANT_GRID_ENTER();
    constexpr int J = ROPE_MAX_DIM / 32;
    int t = blockIdx.x;
    int qDim = heads * headDim, kvDim = kvHeads * headDim, kvDimV = kvHeads * headDimV;
    const float* row = qkv + (i64) t * (qDim + kvDim + kvDimV);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int h = blockIdx.y * 4 + warp;
    if (h < heads + kvHeads) {
        bool isQ = h < heads;
        const float* src = isQ ? row + h * headDim : row + qDim + (h - heads) * headDim;
        float* dst = isQ ? q + (i64) t * qDim + h * headDim : k + (i64) t * kvDim + (h - heads) * headDim;
        float x[J];
        rope_head<J>(src, isQ ? qNorm : kNorm, angles + (i64) t * (ropeDim / 2), ropeDim, neox, headDim, eps, lane,
                     x);
        if (isQ) rotate_head<J>(x, headDim, qRotation, lane, false);
#pragma unroll
        for (int j = 0; j < J; j++) {
            if (lane + 32 * j < headDim) dst[lane + 32 * j] = x[j];
        }
    }
    const float* vs = row + qDim + kvDim;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < kvDimV; i += gridDim.y * blockDim.x) {
        v[(i64) t * kvDimV + i] = vs[i];
    }
    if (blockIdx.y != 0 || threadIdx.x != 0 || slots == nullptr) {
        return;
    }
    int pos = positions != nullptr ? positions[t] : start + t;
    const int* table = tables + (i64) t * seqStride * tableStride;
    rope_slots(table, pos, pageTokens, positions != nullptr || t == 0, t, slots, prevPages);
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

// rows of headDim floats (a prefill's attention output, left in V's rotated basis: CudaAttention.prefill with
// rotatedBasis) rotated back by blocks of n (64 or 128) and written as f16, the operand of the o GEMM: the values, and
// so the f16, of the attention's own epilogue rotation. A warp a row.
extern "C" __global__ void __launch_bounds__(256) kvant_to_half_unrotated(const float* __restrict__ x,
        u16* __restrict__ out, i64 rows, int headDim, int n) {
    KVANT_GRID_ENTER();
    constexpr int J = ROPE_MAX_DIM / 32;
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64) gridDim.x * (blockDim.x >> 5);
    for (i64 r = (i64) blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
        const float* src = x + r * headDim;
        float v[J];
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = lane + 32 * j < headDim ? src[lane + 32 * j] : 0.f;
        rotate_head<J>(v, headDim, n, lane, true);
#pragma unroll
        for (int j = 0; j < J; j++) {
            if (lane + 32 * j < headDim) out[r * headDim + lane + 32 * j] = f2h(v[j]);
        }
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
