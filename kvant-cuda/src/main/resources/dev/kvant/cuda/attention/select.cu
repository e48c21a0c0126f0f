// select.cu — query-aware block selection on the device, dev.kvant.select.PageTopK's rule: key summaries kept up to
// date on write, an upper bound of q.k per block, the top blocks under the token budget after the sink, recent and
// own blocks, ties to the lower block, lists ascending. kvant_attn_decode_sel (attention.cu) reads the lists.
//
// Selection blocks are 2^shift positions (16..1024). Summaries live beside the K pool, per physical page:
//   sums float [pages][spp][kvHeads][2][DK] (spp = max(1, pageTokens >> shift) blocks per page; component 0 the
//   element-wise minimum of the block's K rows as attention decodes them, 1 the maximum). Block b of a sequence is
//   slot (table[(b << shift) / pageTokens], ((b << shift) % pageTokens) >> shift): a block larger than a page lives
//   in its first page. Pages copied on write carry their summaries along (the host copies both).
// Lists: sel int32 [seqs][kvHeads][selStride], counts int32 [seqs][kvHeads]; scores float [seqs][kvHeads][maxBlocks].

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

__device__ __forceinline__ i64 summary_at(const int* table, int block, int shift, int pageTokens, int spp,
                                          int kvHeads, int g) {
    const int p0 = block << shift;
    const int page = table[p0 / pageTokens];
    return (((i64) page * spp + ((p0 % pageTokens) >> shift)) * kvHeads + g) * 2 * DK;
}

// ================================================================================================================
// kvant_kv_summarize — recomputes the summaries of the blocks that the last `written` positions of each sequence
// fall in, each from its first row up to the sequence's length (KeySummaries.update: exact after overwrites).
//
// grid:  (ceil(written / 2^shift) + 1, kvHeads, seqs); block: DK threads, thread d one dimension.
// lens:  int32 [seqs] in device memory (decode), or null and fixedLen (one sequence's prefill chunk).
// ================================================================================================================
extern "C" __global__ void __launch_bounds__(DK) kvant_kv_summarize(const u8* __restrict__ kpool,
        float* __restrict__ sums, const int* __restrict__ tables, int tableStride, const int* __restrict__ lens,
        int fixedLen, int written, int kvHeads, int pageTokens, i64 kPageBytes, int shift, int spp) {
    const int seq = blockIdx.z, g = blockIdx.y, d = threadIdx.x;
    const int len = lens != nullptr ? lens[seq] : fixedLen;
    const int b = ((len - written) >> shift) + blockIdx.x;
    const int p0 = b << shift;
    if (written <= 0 || p0 >= len) return;
    const int p1 = imin(p0 + (1 << shift), len);
    const int* table = tables + (i64) seq * tableStride;
    float mn = __int_as_float(0x7f800000), mx = -__int_as_float(0x7f800000);
    for (int p = p0; p < p1; p++) {
        const u8* row = kpool + (i64) table[p / pageTokens] * kPageBytes
                      + ((i64) (p % pageTokens) * kvHeads + g) * fmt_row_bytes(KF, DK);
        const float v = decode_elem<KF, DK>(row, d);
        mn = java_min(mn, v);
        mx = java_max(mx, v);
    }
    float* s = sums + summary_at(table, b, shift, pageTokens, spp, kvHeads, g);
    s[d] = mn;
    s[DK + d] = mx;
}

// The block structure of one (sequence, kv head) list for queries at positions len - nq .. len - 1, as
// PageTopK.selectOne computes it for one query block.
struct SelectWindow {
    int visible, sink, recentFrom, candidates, k;
    __device__ SelectWindow(int len, int nq, int shift, int sinkBlocks, int recentBlocks, int budgetBlocks) {
        visible = (len + (1 << shift) - 1) >> shift;
        sink = imin(visible, sinkBlocks);
        recentFrom = imax(sink, ((len - nq) >> shift) - recentBlocks);
        candidates = recentFrom - sink;
        k = imax(0, budgetBlocks - (sink + visible - recentFrom));
    }
};

// ================================================================================================================
// kvant_select_score — the bound of every candidate block (between the sink and recent windows) of each
// (sequence, kv head): max over the nq * G query rows of sum_d max(q_d, 0) * max_d + min(q_d, 0) * min_d, q rotated
// into K's domain (unscaled). Each lane sums its dimensions d = lane + 32j with fmas in j order, the 32 lane sums
// are added by a fixed xor tree: the same bits every run (not the CPU's lane order: near-equal bounds may order
// differently from the CPU's; tests allow that and nothing else).
//
// grid:   (ceil(maxBlocks / 64), kvHeads, seqs); block: 256 threads (8 warps, 8 blocks each); shared (dynamic):
//         the positive and negative parts of the rows, 2 * nq * G * DK floats.
// ================================================================================================================
constexpr int SCORE_WARPS = 8;
constexpr int SCORE_PER_WARP = 8;

extern "C" __global__ void __launch_bounds__(SCORE_WARPS * 32) kvant_select_score(const float* __restrict__ q,
        const float* __restrict__ sums, const int* __restrict__ tables, int tableStride, const int* __restrict__ lens,
        float* __restrict__ scores, int kvHeads, int G, int nq, int pageTokens, int shift, int spp, int sinkBlocks,
        int recentBlocks, int budgetBlocks, int maxBlocks) {
    extern __shared__ float qpn[];   // [rows][DK] positive parts, then [rows][DK] negative parts
    const int seq = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = lens[seq];
    const SelectWindow win(len, nq, shift, sinkBlocks, recentBlocks, budgetBlocks);
    const int b0 = blockIdx.x * SCORE_WARPS * SCORE_PER_WARP;
    if (win.k >= win.candidates || b0 >= win.recentFrom || b0 + SCORE_WARPS * SCORE_PER_WARP <= win.sink) return;
    const int rows = nq * G;
    const int heads = kvHeads * G;
    for (int r = warp; r < rows; r += SCORE_WARPS) {
        const int qi = r / G, hq = g * G + r % G;
        const float* src = q + (((i64) seq * nq + qi) * heads + hq) * DK;
        float x[DK / 32];
#pragma unroll
        for (int j = 0; j < DK / 32; j++) x[j] = src[32 * j + lane];
        if constexpr (fmt_rotated(KF)) wht_row<DK>(x, lane, false);
#pragma unroll
        for (int j = 0; j < DK / 32; j++) {
            qpn[r * DK + 32 * j + lane] = fmaxf(x[j], 0.f);
            qpn[(rows + r) * DK + 32 * j + lane] = fminf(x[j], 0.f);
        }
    }
    __syncthreads();
    const int* table = tables + (i64) seq * tableStride;
    for (int i = 0; i < SCORE_PER_WARP; i++) {
        const int b = b0 + warp * SCORE_PER_WARP + i;
        if (b < win.sink || b >= win.recentFrom) continue;
        const float* s = sums + summary_at(table, b, shift, pageTokens, spp, kvHeads, g);
        float mn[DK / 32], mx[DK / 32];
#pragma unroll
        for (int j = 0; j < DK / 32; j++) {
            mn[j] = s[32 * j + lane];
            mx[j] = s[DK + 32 * j + lane];
        }
        float best = NEG_INF;
        for (int r = 0; r < rows; r++) {
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < DK / 32; j++) {
                acc = __fmaf_rn(qpn[r * DK + 32 * j + lane], mx[j], acc);
                acc = __fmaf_rn(qpn[(rows + r) * DK + 32 * j + lane], mn[j], acc);
            }
#pragma unroll
            for (int h = 16; h >= 1; h >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(FULL_MASK, acc, h));
            best = fmaxf(best, acc);
        }
        if (lane == 0) scores[((i64) seq * kvHeads + g) * maxBlocks + b] = best;
    }
}

// A float's bits as an unsigned key in the float order (-0 below +0): a higher score is a higher key.
__device__ __forceinline__ u32 score_key(float s) {
    const u32 b = __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Exclusive prefix sum of v over the 1024 threads of the block, in thread order; total in *total.
__device__ __forceinline__ int block_scan(int v, int* warpSums, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warpSums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = warpSums[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(FULL_MASK, w, o);
            if (lane >= o) w += y;
        }
        warpSums[lane] = w;
    }
    __syncthreads();
    const int excl = (warp > 0 ? warpSums[warp - 1] : 0) + x - v;
    *total = warpSums[31];
    __syncthreads();
    return excl;
}

// ================================================================================================================
// kvant_select_topk — the list of each (sequence, kv head): sink blocks, the k best candidates (the k-th highest
// key found by a radix select over the 32-bit keys, four 8-bit passes; keys above it all taken, keys equal to it
// taken lowest block first), recent and own blocks; ascending. Every visible block when k covers the candidates.
//
// grid:   (kvHeads, seqs); block: 1024 threads. Histograms per warp, a lane of each distinct digit adding for its
//         lanes (__match_any_sync), so equal top bytes (scores of one sign and exponent) do not serialize on one
//         shared word; the digit is found by a scan over warp 0's lanes. For the lists, thread t scans a contiguous
//         run of candidates, so prefix sums in thread order number the taken blocks in block order.
// ================================================================================================================
constexpr int TOPK_THREADS = 1024;

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) kvant_select_topk(const float* __restrict__ scores,
        const int* __restrict__ lens, int* __restrict__ sel, int* __restrict__ selCounts, int selStride, int kvHeads,
        int nq, int shift, int sinkBlocks, int recentBlocks, int budgetBlocks, int maxBlocks) {
    __shared__ u32 hist[TOPK_THREADS / 32][256];   // one histogram per warp: few lanes ever share an address
    __shared__ int warpSums[32];
    __shared__ u32 shPrefix;
    __shared__ int shRemaining;
    const int seq = blockIdx.y, g = blockIdx.x, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int len = lens[seq];
    const SelectWindow win(len, nq, shift, sinkBlocks, recentBlocks, budgetBlocks);
    int* list = sel + (i64) (seq * kvHeads + g) * selStride;
    if (win.k >= win.candidates) {
        for (int b = tid; b < win.visible; b += TOPK_THREADS) list[b] = b;
        if (tid == 0) selCounts[seq * kvHeads + g] = win.visible;
        return;
    }
    const float* sc = scores + ((i64) seq * kvHeads + g) * maxBlocks + win.sink;
    const int n = win.candidates;
    u32 prefix = 0, mask = 0;
    int remaining = win.k;
    if (remaining > 0) {
        for (int sh = 24; sh >= 0; sh -= 8) {
            for (int i = tid; i < TOPK_THREADS / 32 * 256; i += TOPK_THREADS) (&hist[0][0])[i] = 0;
            __syncthreads();
            // the whole warp iterates together (idle lanes past n), lanes of one digit add once through a leader
            for (int i0 = warp * 32; i0 < n; i0 += TOPK_THREADS) {
                const int i = i0 + lane;
                const u32 key = i < n ? score_key(sc[i]) : 0u;
                const bool live = i < n && (key & mask) == prefix;
                const u32 digit = live ? (key >> sh) & 255u : 256u;
                const u32 same = __match_any_sync(FULL_MASK, digit);
                if (live && lane == __ffs(same) - 1) hist[warp][digit] += __popc(same);
            }
            __syncthreads();
            if (tid < 256) {
                u32 total = 0;
                for (int w = 0; w < TOPK_THREADS / 32; w++) total += hist[w][tid];
                hist[0][tid] = total;
            }
            __syncthreads();
            if (warp == 0) {
                // lane l holds digits 255 - 8l .. 248 - 8l (highest first); a scan over lanes finds the digit
                u32 c[8], sum = 0;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    c[j] = hist[0][255 - 8 * lane - j];
                    sum += c[j];
                }
                u32 incl = sum;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const u32 y = __shfl_up_sync(FULL_MASK, incl, o);
                    if (lane >= o) incl += y;
                }
                const u32 before = incl - sum;
                const u32 hit = __ballot_sync(FULL_MASK, incl >= (u32) remaining);
                if (lane == __ffs(hit) - 1) {
                    u32 cum = before;
                    for (int j = 0; j < 8; j++) {
                        if (cum + c[j] >= (u32) remaining) {
                            shPrefix = prefix | ((u32) (255 - 8 * lane - j) << sh);
                            shRemaining = remaining - (int) cum;
                            break;
                        }
                        cum += c[j];
                    }
                }
            }
            __syncthreads();
            prefix = shPrefix;
            remaining = shRemaining;
            mask |= 255u << sh;
            __syncthreads();
        }
    }
    // prefix = the k-th highest key; take every key above it and the first `remaining` keys equal to it.
    const int per = (n + TOPK_THREADS - 1) / TOPK_THREADS;
    const int i0 = imin(n, tid * per), i1 = imin(n, i0 + per);
    int total;
    int eq = 0;
    if (win.k > 0) {
        for (int i = i0; i < i1; i++) eq += score_key(sc[i]) == prefix;
    }
    int eqSeen = block_scan(eq, warpSums, &total);
    int taken = 0;
    if (win.k > 0) {
        for (int i = i0; i < i1; i++) {
            const u32 key = score_key(sc[i]);
            taken += key > prefix || (key == prefix && eqSeen++ < remaining);
        }
    }
    int at = win.sink + block_scan(taken, warpSums, &total);
    if (win.k > 0 && taken > 0) {
        eqSeen -= eq;   // back to this run's first equal key
        for (int i = i0; i < i1; i++) {
            const u32 key = score_key(sc[i]);
            if (key > prefix || (key == prefix && eqSeen++ < remaining)) list[at++] = win.sink + i;
        }
    }
    for (int b = tid; b < win.sink; b += TOPK_THREADS) list[b] = b;
    const int tail = win.sink + win.k;
    for (int b = win.recentFrom + tid; b < win.visible; b += TOPK_THREADS) list[tail + b - win.recentFrom] = b;
    if (tid == 0) selCounts[seq * kvHeads + g] = tail + win.visible - win.recentFrom;
}
