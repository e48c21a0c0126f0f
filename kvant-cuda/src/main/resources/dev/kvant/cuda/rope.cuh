// rope.cuh — one head of a token's fused q|k|v projection row, optionally RMS-normalized per head (qwen3's q/k
// norms) and rotated by RoPE, into a warp's registers: shared by model.cu's kvant_rope_split and kv_write.cu's
// kvant_rope_write, so both give the same bits. Stands alone (CUDA's own types only).
//
// src: the head's headDim values; norm: its norm weights, or null; angle: (cos, sin) of each of the ropeDim / 2
// pairs at the token's position (kvant_rope_angles). Element i = lane + 32j lands in x[j], 0 past headDim. NORM mode
// pairs (2i, 2i + 1), NEOX (i, i + ropeDim / 2); elements from ropeDim on pass unrotated. The rotation is the CPU's
// (dev.kvant.model.Rope): x0·c − x1·s and x0·s + x1·c, each product rounded, no contraction. Every load is issued
// before any is used: a decode step's RoPE moves a few KB, so its time is latency.
template <int J>
__device__ __forceinline__ void rope_head(const float* __restrict__ src, const float* __restrict__ norm,
                                          const float2* __restrict__ angle, int ropeDim, int neox, int headDim,
                                          float eps, int lane, float (&x)[J]) {
    const int half = ropeDim / 2;
    float xi[J], xp[J], ni[J], np[J];
    float2 cs[J];
    bool first[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = lane + 32 * j;
        xi[j] = xp[j] = 0.f;
        ni[j] = np[j] = 1.f;
        cs[j] = make_float2(1.f, 0.f);
        first[j] = true;
        if (i < headDim) {
            int pair, partner;
            if (neox) {
                pair = i < half ? i : i - half;
                partner = i < half ? i + half : i - half;
                first[j] = i < half;
            } else {
                pair = i >> 1;
                partner = i ^ 1;
                first[j] = (i & 1) == 0;
            }
            xi[j] = src[i];
            if (norm != nullptr) ni[j] = norm[i];
            if (i < ropeDim) {
                xp[j] = src[partner];
                if (norm != nullptr) np[j] = norm[partner];
                cs[j] = angle[pair];
            }
        }
    }
    float scale = 1.f;
    if (norm != nullptr) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < J; j++) ss = fmaf(xi[j], xi[j], ss);   // zero past headDim
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        scale = 1.f / sqrtf(ss / (float) headDim + eps);
    }
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int i = lane + 32 * j;
        float a = xi[j] * scale;
        if (norm != nullptr) a *= ni[j];
        float out = a;
        if (i < ropeDim) {
            float b = xp[j] * scale;
            if (norm != nullptr) b *= np[j];
            // a is this element, b its partner: the first of a pair is x0 = a, the second x1 = a (x0 = b)
            out = first[j] ? __fsub_rn(__fmul_rn(a, cs[j].x), __fmul_rn(b, cs[j].y))
                           : __fadd_rn(__fmul_rn(b, cs[j].y), __fmul_rn(a, cs[j].x));
        }
        x[j] = i < headDim ? out : 0.f;
    }
}

// The cache slot (page · pageTokens + token in page) of the token at pos whose page table is table: negative where
// the table holds a negative page (a padded batch's unused vector: writers skip it).
__device__ __forceinline__ int rope_slot(const int* __restrict__ table, int pos, int pageTokens) {
    return table[pos / pageTokens] * pageTokens + pos % pageTokens;
}

// Vector t's slot into slots[t] and, with prevPages given (centered K formats: kvant_kv_page_means), the previous
// logical page of a page it opens: -1 for a sequence's first page, -2 where the vector is not the first of its
// sequence's write (first: a decode vector, or a prefill's first token), else that page's id.
__device__ __forceinline__ void rope_slots(const int* __restrict__ table, int pos, int pageTokens, bool first, int t,
                                           int* __restrict__ slots, int* __restrict__ prevPages) {
    slots[t] = rope_slot(table, pos, pageTokens);
    if (prevPages != nullptr) {
        prevPages[t] = pos < pageTokens ? -1 : first ? table[pos / pageTokens - 1] : -2;
    }
}
