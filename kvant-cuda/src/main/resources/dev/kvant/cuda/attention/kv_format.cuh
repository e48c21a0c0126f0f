// kv_format.cuh — the KV cache formats of docs/KV_FORMATS.md (kv-format v1) on the device: byte layouts, the
// randomized Walsh-Hadamard rotation, and the per-format "dequantize 8 values" step of the attention kernels.
//
// This text is preceded by a header generated in Java (CudaKvSource) that defines KV_LANES (the CPU encoder's
// vector width, see kv_write.cu) and the constant tables kv_rot_sign, kv_rot_scale, kv_centroid, kv_boundary
// taken from dev.kvant.kv.Rotation and dev.kvant.kv.Codebook, so the device uses the CPU's exact constants.
//
// No <cuda_fp16.h>: NVRTC finds no toolkit headers on the GPU machine, so halves are raw bits and the few
// conversions are PTX (cvt.rn.*: round to nearest even, the rule of Float.floatToFloat16).

#define FULL_MASK 0xffffffffu

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

enum {
    F_F16 = 0, F_BF16 = 1, F_Q8_0 = 2, F_INT8 = 3, F_Q4_0 = 4, F_Q4_0H = 5, F_TURBO4 = 6, F_TURBO3 = 7, F_TURBO2 = 8
};

__host__ __device__ constexpr bool fmt_rotated(int f) { return f == F_Q4_0H || f >= F_TURBO4; }
__host__ __device__ constexpr bool fmt_turbo(int f) { return f >= F_TURBO4; }
__host__ __device__ constexpr bool fmt_direct(int f) { return f <= F_BF16; }
__host__ __device__ constexpr bool fmt_8bit(int f) { return f == F_Q8_0 || f == F_INT8; }
__host__ __device__ constexpr bool fmt_q4(int f) { return f == F_Q4_0 || f == F_Q4_0H; }
// Values of one scale of an 8-bit format (a block: the fp16 scale, then that many int8 values).
__host__ __device__ constexpr int fmt_block8(int f) { return f == F_Q8_0 ? 32 : 64; }
__host__ __device__ constexpr int fmt_bits(int f) { return f == F_TURBO4 ? 4 : f == F_TURBO3 ? 3 : f == F_TURBO2 ? 2 : 0; }
__host__ __device__ constexpr int fmt_row_bytes(int f, int d) {
    return f <= F_BF16 ? 2 * d
         : f == F_Q8_0 ? d / 32 * 34
         : f == F_INT8 ? d / 64 * 66
         : f <= F_Q4_0H ? d / 32 * 18
         : d / rot_block(d) * (2 + rot_block(d) * fmt_bits(f) / 8);
}
// Entries of the pair table of a turbo format (see dq_group): a byte of turbo4, 7 index bits of turbo3 (bits 0-4
// and 6: bit 5 is always clear, so the indices stop at 95), a nibble of turbo2.
__host__ __device__ constexpr int lut_entries(int f) {
    return f == F_TURBO4 ? 256 : f == F_TURBO3 ? 96 : f == F_TURBO2 ? 16 : 0;
}
// Bytes from one entry of a pair table to the next: the 32 lane copies take 128; the decode's fragment paths of
// turbo3 and turbo2 (attention.cu, pair_at) space entries 256 bytes apart, so that an index byte moved above the
// lane's offset by one byte_perm is the address (the upper 128 bytes of each entry stay unused).
__host__ __device__ constexpr int lut_stride(int f, bool frag) {
    return frag && (f == F_TURBO3 || f == F_TURBO2) ? 256 : 128;
}
__host__ __device__ constexpr int lut_bytes(int f, bool frag) {
    return lut_entries(f) * lut_stride(f, frag);
}
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }
__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int round16(int x) { return (x + 15) & ~15; }

// ---- scalar conversions

// f16 conversions saturate (.satfinite, PTX ISA 8.1): a value past the f16 range, an infinity too, becomes ±65504,
// so an f16 operand of a tensor-core product or GEMM never carries an infinity that would turn its zero products
// into NaN; NaN stays NaN. (bf16's range is float's: its conversions do not saturate.)
__device__ __forceinline__ u16 f2h(float x) {
    u16 h;
    asm("cvt.rn.satfinite.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ float h2f(u16 h) {
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
    return x;
}
// Two floats as f16x2: lo in bits 0..15, hi in bits 16..31 (cvt.rn.f16x2.f32 puts its first source high).
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u32 pack_bf2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ u16 f2bf(float x) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

// A NaN as HotSpot's Float.floatToFloat16 gives it through the hardware conversion it uses on x64 (F16C) and
// aarch64: its sign, the quiet bit and the top ten payload bits (cvt.rn.f16.f32 gives one canonical NaN instead), so
// that a NaN input the CPU stores in an f16 row and one the device stores are the same bytes. (A NaN computed from
// other values, a scale or a norm, may carry other payload bits on the two.)
__device__ __forceinline__ u16 nan_to_half(float x) {
    const u32 b = __float_as_uint(x);
    return (u16) (((b >> 16) & 0x8000u) | 0x7e00u | ((b & 0x7fffffu) >> 13));
}
// The larger of a and b, NaN if either is (max.NaN; model.cu's fmax_nan): the merge's 8-bit operand of the o product
// keeps a NaN output row NaN.
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
// KvLanes.toHalf: the magnitude clamped to the largest finite fp16, then rounded to nearest even; NaN stays NaN
// (fminf would make it the largest fp16).
__device__ __forceinline__ u16 to_half_clamped(float x) {
    return x != x ? nan_to_half(x) : f2h(copysignf(fminf(fabsf(x), 65504.f), x));
}

// Java's Math.max/Math.min order on floats: -0 below +0, NaN wins. The CPU's block maxima use it, so the q4_0
// scale of a block of signed zeros keeps the CPU's sign.
__device__ __forceinline__ float java_max(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a > b) return a;
    if (b > a) return b;
    return signbit(a) ? b : a;
}
__device__ __forceinline__ float java_min(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    if (a < b) return a;
    if (b < a) return b;
    return signbit(a) ? a : b;
}

// ---- the rotation: rotation.cuh (wht_block, wht_row), shared with the model's kernels

// ---- shared-memory loads at 2-byte alignment (rows of most formats are not 4-byte aligned)

__device__ __forceinline__ u32 ld_u16(const u8* p) { return *(const u16*) p; }
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

// ---- dequantizing: 8 values of a row (a "group") into 16 bytes of f16 (bf16 for bf16)
//
// Attention dequantizes a tile of K or V into shared memory as f16 for the tensor cores. Group grp of a row gives
// the 8 tile columns 8grp..8grp+7; which head dimension each column holds is the format's column order
// perm_col (identity except turbo, whose columns follow the split code planes so that one byte yields a pair of
// values). The query is permuted the same way (perm_inv), and the attention output is written back in head order,
// so the order never shows outside the kernels.

template <int FMT, int D>
__device__ __forceinline__ int perm_col(int m) {   // tile column -> head dimension
    if constexpr (fmt_turbo(FMT)) {
        constexpr int N = rot_block(D);
        const int b = m / N, ml = m % N, gl = ml >> 3, e = ml & 7;
        if constexpr (FMT == F_TURBO4) {
            return b * N + 4 * gl + (e >> 1) + (e & 1) * (N / 2);
        } else {
            return b * N + 2 * gl + (e >> 2) + (e & 3) * (N / 4);
        }
    } else {
        return m;
    }
}

template <int FMT, int D>
__device__ __forceinline__ int perm_inv(int d) {   // head dimension -> tile column
    if constexpr (fmt_turbo(FMT)) {
        constexpr int N = rot_block(D);
        const int b = d / N, dd = d % N;
        if constexpr (FMT == F_TURBO4) {
            const int nib = dd / (N / 2), byte = dd % (N / 2);
            return b * N + 8 * (byte >> 2) + (((byte & 3) << 1) | nib);
        } else {
            const int q = dd / (N / 4), beta = dd % (N / 4);
            return b * N + 8 * (beta >> 1) + (((beta & 1) << 2) | q);
        }
    } else {
        return d;
    }
}

// Fills the pair table of a turbo format: entry e, copy l at word e * STRIDE / 4 + l (lut_stride). Lane l of any
// warp reads copy l, so the 32 lanes of a lookup hit 32 different banks whatever their codes are (a plain table of
// 16 centroids measured 2-4-way conflicts on random codes in this design's budget; replicated, a lookup is one
// conflict-free LDS).
template <int FMT, int D, int STRIDE = 128>
__device__ void build_pair_lut(u32* lut, int tid, int nthreads) {
    constexpr int N = rot_block(D);
    constexpr int BITS = fmt_bits(FMT);
    constexpr int E = lut_entries(FMT);
    const float* c = kv_centroid[BITS - 2][N == 128 ? 1 : 0];
    for (int i = tid; i < E * 32; i += nthreads) {
        const int e = i >> 5;
        int ca, cb;
        if constexpr (FMT == F_TURBO4) {
            ca = e & 15;
            cb = e >> 4;
        } else if constexpr (FMT == F_TURBO3) {
            ca = (e & 3) | (((e >> 4) & 1) << 2);
            cb = ((e >> 2) & 3) | (((e >> 6) & 1) << 2);
        } else {
            ca = e & 3;
            cb = e >> 2;
        }
        lut[e * (STRIDE / 4) + (i & 31)] = pack_h2(c[ca], c[cb]);
    }
}

// int8 pairs to f16: byte b becomes the half 1024 + (b ^ 0x80) by placing it under the exponent byte 0x64; one
// subtraction of 1152 (= 1024 + 128) leaves the exact integer, one multiplication the scaled value (rounded once).
// The exponent bytes come with the sign flip (one xor), so the byte_perm needs no constant register.
__device__ __forceinline__ u32 i8pair_ints(u32 w16) {   // the exact integers, before the scale
    const u32 t = __byte_perm(w16 ^ 0x64648080u, 0u, 0x3120);
    return hsub2(t, 0x64806480u);
}
__device__ __forceinline__ u32 i8pair_to_h2(u32 w16, u32 d2) { return hmul2(i8pair_ints(w16), d2); }
// The int8 values of byte 0 of a and of b (lo, hi) or of their byte 1 (H = 1) to f16 times their scales d2, as
// i8pair_to_h2: ax, bx are 16-bit words x-ored with 0x64648080 (the sign flip, and the exponent byte above them).
template <int H>
__device__ __forceinline__ u32 i8cross_to_h2(u32 ax, u32 bx, u32 d2) {
    const u32 t = __byte_perm(ax, bx, H ? 0x6521 : 0x6420);
    return hmul2(hsub2(t, 0x64806480u), d2);
}
// Two 4-bit codes (bits 0..3 and 8..11 of w) to f16 (code - 8) * d: the exact integers code - 8, then the scale.
__device__ __forceinline__ u32 q4pair_ints(u32 w) {
    const u32 t = __byte_perm(w | 0x64640000u, 0u, 0x3120);
    return hsub2(t, 0x64086408u);
}
__device__ __forceinline__ u32 q4pair_to_h2(u32 w, u32 d2) { return hmul2(q4pair_ints(w), d2); }

// ---- 32-bit shared-memory addresses (smem_u32, with cp.async): rows of the raw stages are read through these so
// that locating a value costs 32-bit adds. Raw-stage loads are volatile (a stage's address holds new rows every few tiles: they must stay
// after the barrier that publishes them); pair-table loads are not (the table never changes after it is built).
__device__ __forceinline__ u32 lds_u8(u32 a) {
    u32 v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ u32 lds_u16(u32 a) {
    u32 v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ u32 lds_table(u32 a) {
    u32 v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}

// Group grp of a turbo row at shared address row (see dq_group); lut: the lane's copy of the pair table (entry e at
// lut + 128 e). NORM = false: the bare centroid pairs, without the block's norm (the caller applies it). In two
// steps, so that a caller decoding several rows can issue all their loads first (dq_turbo_words), then look them up
// (dq_turbo_pairs): ptxas keeps a load after any earlier shared store it cannot tell apart.
struct TurboWords {
    u32 g;    // the block's norm (fp16 bits), when NORM
    u32 lo;   // the group's code word (turbo4: 32 bits; turbo3: the low-plane pair; turbo2: 16 bits)
    u32 hi;   // turbo3: the high-plane pair
};
template <int FMT, int D, bool NORM>
__device__ __forceinline__ TurboWords dq_turbo_words(u32 row, int grp) {
    constexpr int N = rot_block(D);
    constexpr int BITS = fmt_bits(FMT);
    constexpr int GPB = N / 8;
    const u32 blk = row + (grp / GPB) * (2 + N * BITS / 8);
    const int gl = grp % GPB;
    const u32 codes = blk + 2;
    TurboWords w;
    w.g = NORM ? lds_u16(blk) : 0u;
    w.hi = 0u;
    if constexpr (FMT == F_TURBO4) {
        w.lo = lds_u16(codes + 4 * gl) | (lds_u16(codes + 4 * gl + 2) << 16);
    } else if constexpr (FMT == F_TURBO2) {
        w.lo = lds_u16(codes + 2 * gl);
    } else {
        // Low plane bytes beta0 = 2gl, beta1 = 2gl+1 hold the low bits of dims beta + q*N/4 (q = 0..3); their
        // high bits are bits s + 2q of high-plane bytes beta mod N/8 (s = beta div N/8, the same for both).
        w.lo = lds_u16(codes + 2 * gl);
        w.hi = lds_u16(codes + N / 4 + (2 * gl) % (N / 8));
    }
    return w;
}
// ADD (with NORM): each pair is value·norm + the caller's f16 pair of that word (one fma, one rounding), which a
// centered key's page mean takes (prefill_wg's producers).
template <int FMT, int D, bool NORM, bool ADD = false>
__device__ __forceinline__ uint4 dq_turbo_pairs(const TurboWords& w, int grp, u32 lut, uint4 add = {}) {
    static_assert(NORM || !ADD, "a sum needs the norm's product");
    constexpr int N = rot_block(D);
    const u32 g2 = w.g | (w.g << 16);
    auto pair = [&](u32 e, u32 a) -> u32 {
        const u32 v = lds_table(lut + (e << 7));
        return ADD ? hfma2(v, g2, a) : NORM ? hmul2(v, g2) : v;
    };
    uint4 r;
    if constexpr (FMT == F_TURBO4) {
        r.x = pair(w.lo & 255u, add.x);
        r.y = pair((w.lo >> 8) & 255u, add.y);
        r.z = pair((w.lo >> 16) & 255u, add.z);
        r.w = pair(w.lo >> 24, add.w);
    } else if constexpr (FMT == F_TURBO2) {
        r.x = pair(w.lo & 15u, add.x);
        r.y = pair((w.lo >> 4) & 15u, add.y);
        r.z = pair((w.lo >> 8) & 15u, add.z);
        r.w = pair((w.lo >> 12) & 15u, add.w);
    } else {
        const int s = (2 * (grp % (N / 8))) / (N / 8);
        const u32 x0 = (w.hi >> s) & 0x55u;
        const u32 x1 = (w.hi >> (8 + s)) & 0x55u;
        const u32 lo0 = w.lo & 255u, lo1 = w.lo >> 8;
        r.x = pair((lo0 & 15u) | ((x0 & 5u) << 4), add.x);
        r.y = pair((lo0 >> 4) | (x0 & 0x50u), add.y);
        r.z = pair((lo1 & 15u) | ((x1 & 5u) << 4), add.z);
        r.w = pair((lo1 >> 4) | (x1 & 0x50u), add.w);
    }
    return r;
}
template <int FMT, int D, bool NORM>
__device__ __forceinline__ uint4 dq_turbo(u32 row, int grp, u32 lut) {
    return dq_turbo_pairs<FMT, D, NORM>(dq_turbo_words<FMT, D, NORM>(row, grp), grp, lut);
}

// NORM = false (turbo only): the bare centroid pairs, without the block's norm (the caller applies it).
template <int FMT, int D, bool NORM = true>
__device__ __forceinline__ uint4 dq_group(const u8* row, int grp, const u32* lut, int lane) {
    uint4 r;
    if constexpr (FMT == F_F16 || FMT == F_BF16) {
        const u8* p = row + grp * 16;
        r.x = ld_u32_a2(p);
        r.y = ld_u32_a2(p + 4);
        r.z = ld_u32_a2(p + 8);
        r.w = ld_u32_a2(p + 12);
    } else if constexpr (FMT == F_Q8_0 || FMT == F_INT8) {
        constexpr int B = FMT == F_Q8_0 ? 32 : 64;
        constexpr int GPB = B / 8;
        const u8* blk = row + (grp / GPB) * (B + 2);
        const u32 d = ld_u16(blk);
        const u32 d2 = d | (d << 16);
        const u8* p = blk + 2 + 8 * (grp % GPB);
        r.x = i8pair_to_h2(ld_u16(p), d2);
        r.y = i8pair_to_h2(ld_u16(p + 2), d2);
        r.z = i8pair_to_h2(ld_u16(p + 4), d2);
        r.w = i8pair_to_h2(ld_u16(p + 6), d2);
    } else if constexpr (FMT == F_Q4_0 || FMT == F_Q4_0H) {
        const u8* blk = row + (grp >> 2) * 18;
        const u32 d = ld_u16(blk);
        const u32 d2 = d | (d << 16);
        const int gi = grp & 3;
        const u8* p = blk + 2 + 8 * (gi & 1);
        const int sh = (gi >> 1) * 4;
        r.x = q4pair_to_h2((ld_u16(p) >> sh) & 0x0F0Fu, d2);
        r.y = q4pair_to_h2((ld_u16(p + 2) >> sh) & 0x0F0Fu, d2);
        r.z = q4pair_to_h2((ld_u16(p + 4) >> sh) & 0x0F0Fu, d2);
        r.w = q4pair_to_h2((ld_u16(p + 6) >> sh) & 0x0F0Fu, d2);
    } else {
        r = dq_turbo<FMT, D, NORM>(smem_u32(row), grp, smem_u32(lut + lane));
    }
    return r;
}

// Head dimension d of a K row as the CPU's KvFormat.decode gives it (rotated domain for rotated formats): the same
// float operations, so summaries equal dev.kvant.kv.KeySummaries bit for bit.
template <int FMT, int D>
__device__ __forceinline__ float decode_elem(const u8* row, int d) {
    if constexpr (FMT == F_F16) {
        return h2f((u16) ld_u16(row + 2 * d));
    } else if constexpr (FMT == F_BF16) {
        return __uint_as_float(ld_u16(row + 2 * d) << 16);
    } else if constexpr (FMT == F_Q8_0 || FMT == F_INT8) {
        constexpr int B = FMT == F_Q8_0 ? 32 : 64;
        const u8* blk = row + (d / B) * (B + 2);
        return __fmul_rn((float) (signed char) blk[2 + d % B], h2f((u16) ld_u16(blk)));
    } else if constexpr (FMT == F_Q4_0 || FMT == F_Q4_0H) {
        const u8* blk = row + (d / 32) * 18;
        const int j = d % 32;
        const int code = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
        return __fmul_rn((float) (code - 8), h2f((u16) ld_u16(blk)));
    } else {
        constexpr int N = rot_block(D);
        constexpr int BITS = fmt_bits(FMT);
        constexpr int NI = N == 128 ? 1 : 0;
        const u8* blk = row + (d / N) * (2 + N * BITS / 8);
        const u8* codes = blk + 2;
        const int i = d % N;
        int code;
        if constexpr (BITS == 4) {
            code = (codes[i % (N / 2)] >> (4 * (i / (N / 2)))) & 15;
        } else if constexpr (BITS == 2) {
            code = (codes[i % (N / 4)] >> (2 * (i / (N / 4)))) & 3;
        } else {
            code = ((codes[i % (N / 4)] >> (2 * (i / (N / 4)))) & 3)
                 | (((codes[N / 4 + i % (N / 8)] >> (i / (N / 8))) & 1) << 2);
        }
        return __fmul_rn(kv_centroid[BITS - 2][NI][code], h2f((u16) ld_u16(blk)));
    }
}

// ---- keys centered on their page's mean (dev.kvant.kv.PageMeanFormat: KMEAN = 1)
//
// A K page then ends with one mean per kv head, DK fp16 values in K's domain (head order), after its pageTokens *
// kvHeads rows; every reader adds a row's page mean to its decoded values.
#ifndef KMEAN
#define KMEAN 0
#endif
__device__ __forceinline__ const u16* key_mean(const u8* kpool, int page, i64 kPageBytes, int pageTokens,
                                               int kvHeads, int h) {
    return (const u16*) (kpool + (i64) page * kPageBytes + (i64) pageTokens * kvHeads * fmt_row_bytes(KF, DK))
         + (i64) h * DK;
}
