// select.cu — query-aware block selection on the device, dev.kvant.select.PageTopK's rule: key summaries kept up to
// date on write, an upper bound of q.k per block, the top blocks under the token budget after the sink, recent and
// own blocks, ties to the lower block, lists ascending. kvant_attn_decode_sel (attention.cu) reads the lists.
//
// Selection blocks are 2^shift positions (16..1024). Summaries live beside the K pool, per physical page:
//   sums float [pages][spp][kvHeads][2][DK] (spp = pageTokens >> shift blocks per page, blocks dividing the page;
//   component 0 the element-wise minimum of the block's K rows as attention decodes them, 1 the maximum). Block b of
//   a sequence is slot (table[(b << shift) / pageTokens], ((b << shift) % pageTokens) >> shift). Pages copied on
//   write carry their summaries along (the host copies both).
// Lists: sel int32 [seqs][kvHeads][selStride], counts int32 [seqs][kvHeads]; scores float [seqs][kvHeads][maxBlocks].


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
    KVANT_GRID_ENTER();
    const int seq = blockIdx.z, g = blockIdx.y, d = threadIdx.x;
    const int len = lens != nullptr ? lens[seq] : fixedLen;
    if (written <= 0 || written > len) return;
    const int b = ((len - written) >> shift) + blockIdx.x;
    const int p0 = b << shift;
    if (p0 >= len) return;
    const int p1 = imin(p0 + (1 << shift), len);
    const int* table = tables + (i64) seq * tableStride;
    float mn = __int_as_float(0x7f800000), mx = -__int_as_float(0x7f800000);
    for (int p = p0; p < p1; p++) {
        const u8* row = kpool + (i64) table[p / pageTokens] * kPageBytes
                      + ((i64) (p % pageTokens) * kvHeads + g) * fmt_row_bytes(KF, DK);
        float v = decode_elem<KF, DK>(row, d);
        if constexpr (KMEAN) v = __fadd_rn(v, h2f(key_mean(kpool, table[p / pageTokens], kPageBytes, pageTokens,
                                                           kvHeads, g)[d]));
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

// The coarse blocks a coarse round ranks, [j0, end), for a query block from len - nq: those meeting the candidates,
// but for the one the recent window cuts when its rows reach the queries' own (a recent window shorter than a coarse
// block): its summary then covers rows at and after them (a prefill chunk's later rows are written before its
// queries select), so it is not ranked and is kept as it is (cut), its blocks below the window competing — which
// keeps the choice causal. PageTopK's rule.
struct CoarseRange {
    int j0, end;
    bool cut;
    __device__ CoarseRange(const SelectWindow& win, int len, int nq, int shift, int cshift) {
        const int C = 1 << (cshift - shift);
        const int jEnd = win.recentFrom / C;
        const bool cutBlock = jEnd * C < win.recentFrom;
        cut = cutBlock && ((i64) (jEnd + 1) << cshift) > len - nq;
        j0 = win.sink / C;
        end = cutBlock && !cut ? jEnd + 1 : jEnd;
    }
};

// ================================================================================================================
// Scoring. The bound of a block for the query rows: max over the nq * G rows of sum_d max(q_d, 0) * max_d +
// min(q_d, 0) * min_d, q rotated into K's domain (unscaled). Each lane sums its dimensions d = lane + 32j with fmas
// in j order, the 32 lane sums are added by a fixed xor tree: the same bits every run (not the CPU's lane order:
// near-equal bounds may order differently from the CPU's; tests allow that and nothing else).
//
// A round says which entries a launch bounds, for each (sequence, kv head):
//   ROUND_FLAT   entry b = block b in [sink, recentFrom) (one round, no coarse level), scores[b]
//   ROUND_COARSE entry j = coarse block j of CoarseRange (those meeting [sink, recentFrom) but a cut one that
//                reaches the queries), bounded from its coarse summary (only when there are more than keep), cscores[j]
//   ROUND_KEPT   entry e < keptCount * C = block kept[e / C] * C + e % C (C blocks per coarse block), scores[e];
//                -inf for a block outside [sink, recentFrom)
// Nothing is scored when every candidate is taken anyway (k >= candidates) or none is (k = 0).
//
// grid:   (ceil(maxEntries / 64), kvHeads, seqs); block: 256 threads (8 warps, 8 entries each); shared (dynamic):
//         the positive and negative parts of up to SCORE_ROWS rows at a time, 2 * min(nq * G, 32) * DK floats.
// summaryLen: the length the summaries were kept at (0: lens[seq]); a prefill's query blocks read summaries made
//         for the whole chunk, as the CPU's selector does.
// ================================================================================================================
constexpr int SCORE_WARPS = 8;
constexpr int SCORE_PER_WARP = 8;
constexpr int SCORE_ROWS = 32;   // query rows per pass through shared memory
constexpr int ROUND_FLAT = 0, ROUND_COARSE = 1, ROUND_KEPT = 2;

// The coarse summary of coarse block j of a sequence of len tokens: each page holds the min and max over its
// coarse block from the block's first row to the page's end (kvant_kv_summarize_coarse), so the block's summary is
// in the page of its last written row.
__device__ __forceinline__ i64 coarse_at(const int* table, int j, int len, int cshift, int pageTokens, int kvHeads,
                                         int g) {
    const int last = imin(len, (j + 1) << cshift) - 1;
    return ((i64) table[last / pageTokens] * kvHeads + g) * 2 * DK;
}

template <int ROUND>
__device__ __forceinline__ void score_body(const float* __restrict__ q, const float* __restrict__ sums,
        const int* __restrict__ tables, int tableStride, const int* __restrict__ lens, int summaryLen,
        float* __restrict__ scores, const int* __restrict__ kept, const int* __restrict__ keptCounts, int keepMax,
        int kvHeads, int G, int nq, int pageTokens, int shift, int cshift, int spp, int sinkBlocks, int recentBlocks,
        int budgetBlocks, int maxEntries) {
    extern __shared__ float qpn[];   // [chunk rows][DK] positive parts, then [chunk rows][DK] negative parts
    const int seq = blockIdx.z, g = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int len = lens[seq];
    // The length the summaries were last kept at: len in decode, the chunk's end for a prefill's query blocks.
    const int sumLen = summaryLen > 0 ? summaryLen : len;
    const SelectWindow win(len, nq, shift, sinkBlocks, recentBlocks, budgetBlocks);
    if (win.k >= win.candidates || win.k == 0) return;
    const int C = 1 << (cshift - shift);
    int e0, e1;   // the entries to bound
    const int* keptList = nullptr;
    if constexpr (ROUND_FLAT == ROUND) {
        e0 = win.sink;
        e1 = win.recentFrom;
    } else if constexpr (ROUND_COARSE == ROUND) {
        const CoarseRange cr(win, len, nq, shift, cshift);
        e0 = cr.j0;
        e1 = cr.end;
        if (e1 - e0 <= keepMax) return;   // every coarse block is kept: no ranking
    } else {
        keptList = kept + (i64) (seq * kvHeads + g) * (keepMax + 1);
        e0 = 0;
        e1 = keptCounts[seq * kvHeads + g] * C;
    }
    e1 = imin(e1, maxEntries);
    const int b0 = blockIdx.x * SCORE_WARPS * SCORE_PER_WARP;
    if (b0 >= e1 || b0 + SCORE_WARPS * SCORE_PER_WARP <= e0) return;
    const int rows = nq * G;
    const int heads = kvHeads * G;
    const int* table = tables + (i64) seq * tableStride;
    float* out = scores + ((i64) seq * kvHeads + g) * maxEntries;
    float best[SCORE_PER_WARP];
#pragma unroll
    for (int i = 0; i < SCORE_PER_WARP; i++) best[i] = NEG_INF;
    // rows in chunks of SCORE_ROWS through shared memory; a bound is the max over all of them
    for (int r0 = 0; r0 < rows; r0 += SCORE_ROWS) {
        const int nr = imin(SCORE_ROWS, rows - r0);
        if (r0 > 0) __syncthreads();   // the previous chunk is read by every warp
        for (int r = warp; r < nr; r += SCORE_WARPS) {
            const int row = r0 + r;
            const int qi = row / G, hq = g * G + row % G;
            const float* src = q + (((i64) seq * nq + qi) * heads + hq) * DK;
            float x[DK / 32];
#pragma unroll
            for (int j = 0; j < DK / 32; j++) x[j] = src[32 * j + lane];
            if constexpr (fmt_rotated(KF)) wht_row<DK>(x, lane, false);
#pragma unroll
            for (int j = 0; j < DK / 32; j++) {
                qpn[r * DK + 32 * j + lane] = java_max(x[j], 0.f);   // a NaN stays NaN (fmaxf drops it)
                qpn[(nr + r) * DK + 32 * j + lane] = java_min(x[j], 0.f);
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < SCORE_PER_WARP; i++) {
            const int e = b0 + warp * SCORE_PER_WARP + i;
            if (e < e0 || e >= e1) continue;
            const float* s;
            if constexpr (ROUND_COARSE == ROUND) {
                s = sums + coarse_at(table, e, sumLen, cshift, pageTokens, kvHeads, g);
            } else {
                const int b = ROUND_FLAT == ROUND ? e : keptList[e / C] * C + e % C;
                if (b < win.sink || b >= win.recentFrom) continue;
                s = sums + summary_at(table, b, shift, pageTokens, spp, kvHeads, g);
            }
            float mn[DK / 32], mx[DK / 32];
#pragma unroll
            for (int j = 0; j < DK / 32; j++) {
                mn[j] = s[32 * j + lane];
                mx[j] = s[DK + 32 * j + lane];
            }
            for (int r = 0; r < nr; r++) {
                float acc = 0.f;
#pragma unroll
                for (int j = 0; j < DK / 32; j++) {
                    acc = __fmaf_rn(qpn[r * DK + 32 * j + lane], mx[j], acc);
                    acc = __fmaf_rn(qpn[(nr + r) * DK + 32 * j + lane], mn[j], acc);
                }
#pragma unroll
                for (int h = 16; h >= 1; h >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(FULL_MASK, acc, h));
                best[i] = java_max(best[i], acc);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < SCORE_PER_WARP; i++) {
        const int e = b0 + warp * SCORE_PER_WARP + i;
        if (lane == 0 && e >= e0 && e < e1) out[e] = best[i];   // -inf for a kept-round block outside the window
    }
}

#define SCORE_PARAMS const float* __restrict__ q, const float* __restrict__ sums, const int* __restrict__ tables, \
        int tableStride, const int* __restrict__ lens, int summaryLen, float* __restrict__ scores, \
        const int* __restrict__ kept, \
        const int* __restrict__ keptCounts, int keepMax, int kvHeads, int G, int nq, int pageTokens, int shift, \
        int cshift, int spp, int sinkBlocks, int recentBlocks, int budgetBlocks, int maxEntries
#define SCORE_ARGS q, sums, tables, tableStride, lens, summaryLen, scores, kept, keptCounts, keepMax, kvHeads, G, nq, pageTokens, \
        shift, cshift, spp, sinkBlocks, recentBlocks, budgetBlocks, maxEntries

extern "C" __global__ void __launch_bounds__(SCORE_WARPS * 32) kvant_select_score(SCORE_PARAMS) {
    KVANT_GRID_ENTER();
    score_body<ROUND_FLAT>(SCORE_ARGS);
}
extern "C" __global__ void __launch_bounds__(SCORE_WARPS * 32) kvant_select_score_coarse(SCORE_PARAMS) {
    KVANT_GRID_ENTER();
    score_body<ROUND_COARSE>(SCORE_ARGS);
}
extern "C" __global__ void __launch_bounds__(SCORE_WARPS * 32) kvant_select_score_kept(SCORE_PARAMS) {
    KVANT_GRID_ENTER();
    score_body<ROUND_KEPT>(SCORE_ARGS);
}

// A float's bits as an unsigned key in the float order (-0 below +0): a higher score is a higher key. A NaN bound
// (a NaN in the query or in the block's keys) is the highest key whatever its sign: such a block is kept, as dense
// attention would show the NaN (PageTopK.key).
__device__ __forceinline__ u32 score_key(float s) {
    const u32 b = __float_as_uint(s);
    return s != s ? 0xffffffffu : (b & 0x80000000u) ? ~b : (b | 0x80000000u);
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
// Top-k of one (sequence, kv head) in one block of 1024 threads: the k-th highest key of sc[0, n) by a radix
// select over the 32-bit keys (four 8-bit passes; histograms per warp, a lane of each distinct digit adding for its
// lanes through __match_any_sync, so equal top bytes — scores of one sign and exponent — do not serialize on one
// shared word; the digit found by a scan over warp 0's lanes), then every entry with a higher key and the first
// `remaining` entries with an equal one, in entry order: thread t scans a contiguous run of entries, so prefix sums
// in thread order number the taken entries in entry order. Entry order is block order in every round, so ties go
// to the lower block and lists come out ascending.
// ================================================================================================================
constexpr int TOPK_THREADS = 1024;

struct TopkShared {
    u32 hist[TOPK_THREADS / 32][256];
    int warpSums[32];
    u32 prefix;
    int remaining;
};

// Takes the k highest of sc[0, n) (0 < k <= n) and writes map(i) of each, in entry order, to out[0, k).
template <class Map>
__device__ __forceinline__ void top_k(const float* __restrict__ sc, int n, int k, int* __restrict__ out, Map map,
                                      TopkShared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    u32 prefix = 0, mask = 0;
    int remaining = k;
    for (int bits = 24; bits >= 0; bits -= 8) {
        for (int i = tid; i < TOPK_THREADS / 32 * 256; i += TOPK_THREADS) (&sh.hist[0][0])[i] = 0;
        __syncthreads();
        for (int i0 = warp * 32; i0 < n; i0 += TOPK_THREADS) {
            const int i = i0 + lane;
            const u32 key = i < n ? score_key(sc[i]) : 0u;
            const bool live = i < n && (key & mask) == prefix;
            const u32 digit = live ? (key >> bits) & 255u : 256u;
            const u32 same = __match_any_sync(FULL_MASK, digit);
            if (live && lane == __ffs(same) - 1) sh.hist[warp][digit] += __popc(same);
            __syncwarp();   // the next iteration's leaders read what this one's wrote
        }
        __syncthreads();
        if (tid < 256) {
            u32 total = 0;
            for (int w = 0; w < TOPK_THREADS / 32; w++) total += sh.hist[w][tid];
            sh.hist[0][tid] = total;
        }
        __syncthreads();
        if (warp == 0) {
            // lane l holds digits 255 - 8l .. 248 - 8l (highest first); a scan over lanes finds the digit
            u32 c[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                c[j] = sh.hist[0][255 - 8 * lane - j];
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
                        sh.prefix = prefix | ((u32) (255 - 8 * lane - j) << bits);
                        sh.remaining = remaining - (int) cum;
                        break;
                    }
                    cum += c[j];
                }
            }
        }
        __syncthreads();
        prefix = sh.prefix;
        remaining = sh.remaining;
        mask |= 255u << bits;
        __syncthreads();
    }
    // prefix = the k-th highest key; take every key above it and the first `remaining` keys equal to it.
    const int per = (n + TOPK_THREADS - 1) / TOPK_THREADS;
    const int i0 = imin(n, tid * per), i1 = imin(n, i0 + per);
    int total;
    int eq = 0;
    for (int i = i0; i < i1; i++) eq += score_key(sc[i]) == prefix;
    int eqSeen = block_scan(eq, sh.warpSums, &total);
    const int eqFirst = eqSeen;
    int taken = 0;
    for (int i = i0; i < i1; i++) {
        const u32 key = score_key(sc[i]);
        taken += key > prefix || (key == prefix && eqSeen++ < remaining);
    }
    int at = block_scan(taken, sh.warpSums, &total);
    if (taken > 0) {
        eqSeen = eqFirst;
        for (int i = i0; i < i1; i++) {
            const u32 key = score_key(sc[i]);
            if (key > prefix || (key == prefix && eqSeen++ < remaining)) out[at++] = map(i);
        }
    }
}

// The list of one (sequence, kv head) once `taken` blocks are in list[sink, sink + taken): the sink blocks before
// them, the recent and own blocks after; or every visible block when every candidate is taken.
__device__ __forceinline__ void finish_list(const SelectWindow& win, int taken, int* list, int* count) {
    const int tid = threadIdx.x;
    for (int b = tid; b < win.sink; b += TOPK_THREADS) list[b] = b;
    const int tail = win.sink + taken;
    for (int b = win.recentFrom + tid; b < win.visible; b += TOPK_THREADS) list[tail + b - win.recentFrom] = b;
    if (tid == 0) *count = tail + win.visible - win.recentFrom;
}

__device__ __forceinline__ bool list_all(const SelectWindow& win, int* list, int* count) {
    if (win.k < win.candidates) return false;
    for (int b = threadIdx.x; b < win.visible; b += TOPK_THREADS) list[b] = b;
    if (threadIdx.x == 0) *count = win.visible;
    return true;
}

// ================================================================================================================
// kvant_select_topk — one round: sink, the k best candidates of kvant_select_score, recent and own blocks.
// kvant_select_topk_coarse — the kept coarse blocks (ascending; all of them when no more than keep are ranked), then
// the coarse block the recent window cuts where it reaches the queries (CoarseRange::cut, never ranked), into
// kept[seq][kvHead][keepMax + 1], their number into keptCounts.
// kvant_select_topk_kept — the final list from kvant_select_score_kept's entries: the min(k, candidates inside the
// kept coarse blocks) best.
// grid: (kvHeads, seqs); block: 1024 threads.
// ================================================================================================================
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) kvant_select_topk(const float* __restrict__ scores,
        const int* __restrict__ lens, int* __restrict__ sel, int* __restrict__ selCounts, int selStride, int kvHeads,
        int nq, int shift, int sinkBlocks, int recentBlocks, int budgetBlocks, int maxBlocks) {
    KVANT_GRID_ENTER();
    __shared__ TopkShared sh;
    const int seq = blockIdx.y, g = blockIdx.x;
    const SelectWindow win(lens[seq], nq, shift, sinkBlocks, recentBlocks, budgetBlocks);
    int* list = sel + (i64) (seq * kvHeads + g) * selStride;
    int* count = selCounts + seq * kvHeads + g;
    if (list_all(win, list, count)) return;
    if (win.k > 0) {
        const float* sc = scores + ((i64) seq * kvHeads + g) * maxBlocks + win.sink;
        const int sink = win.sink;
        top_k(sc, win.candidates, win.k, list + win.sink, [=](int i) { return sink + i; }, sh);
    }
    finish_list(win, win.k, list, count);
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) kvant_select_topk_coarse(const float* __restrict__ cscores,
        const int* __restrict__ lens, int* __restrict__ kept, int* __restrict__ keptCounts, int keepMax, int kvHeads,
        int nq, int shift, int cshift, int sinkBlocks, int recentBlocks, int budgetBlocks, int maxCoarse) {
    KVANT_GRID_ENTER();
    __shared__ TopkShared sh;
    const int seq = blockIdx.y, g = blockIdx.x;
    const SelectWindow win(lens[seq], nq, shift, sinkBlocks, recentBlocks, budgetBlocks);
    int* out = kept + (i64) (seq * kvHeads + g) * (keepMax + 1);
    if (win.k >= win.candidates || win.k == 0) {
        if (threadIdx.x == 0) keptCounts[seq * kvHeads + g] = 0;
        return;
    }
    const CoarseRange cr(win, lens[seq], nq, shift, cshift);
    const int j0 = cr.j0, nc = imax(0, cr.end - j0), cut = cr.cut ? 1 : 0;
    int n = nc;
    if (nc <= keepMax) {
        for (int j = threadIdx.x; j < nc; j += TOPK_THREADS) out[j] = j0 + j;
    } else {
        top_k(cscores + ((i64) seq * kvHeads + g) * maxCoarse + j0, nc, keepMax, out, [=](int i) { return j0 + i; },
              sh);
        n = keepMax;
    }
    if (threadIdx.x == 0) {
        if (cut) out[n] = cr.end;   // the cut block, after the ranked ones
        keptCounts[seq * kvHeads + g] = n + cut;
    }
}

extern "C" __global__ void __launch_bounds__(TOPK_THREADS) kvant_select_topk_kept(const float* __restrict__ scores,
        const int* __restrict__ lens, const int* __restrict__ kept, const int* __restrict__ keptCounts, int keepMax,
        int* __restrict__ sel, int* __restrict__ selCounts, int selStride, int kvHeads, int nq, int shift, int cshift,
        int sinkBlocks, int recentBlocks, int budgetBlocks, int maxEntries) {
    KVANT_GRID_ENTER();
    __shared__ TopkShared sh;
    const int seq = blockIdx.y, g = blockIdx.x;
    const SelectWindow win(lens[seq], nq, shift, sinkBlocks, recentBlocks, budgetBlocks);
    int* list = sel + (i64) (seq * kvHeads + g) * selStride;
    int* count = selCounts + seq * kvHeads + g;
    if (list_all(win, list, count)) return;
    int taken = 0;
    if (win.k > 0) {
        const int C = 1 << (cshift - shift);
        const int* kl = kept + (i64) (seq * kvHeads + g) * (keepMax + 1);
        const int nk = keptCounts[seq * kvHeads + g];
        int inside = 0;   // candidates inside the kept coarse blocks
        for (int i = 0; i < nk; i++) {
            inside += imax(0, imin(win.recentFrom, (kl[i] + 1) * C) - imax(win.sink, kl[i] * C));
        }
        taken = imin(win.k, inside);
        if (taken > 0) {
            top_k(scores + ((i64) seq * kvHeads + g) * maxEntries, nk * C, taken, list + win.sink,
                  [=](int e) { return kl[e / C] * C + e % C; }, sh);
        }
    }
    finish_list(win, taken, list, count);
}

// ================================================================================================================
// kvant_kv_summarize_coarse — after kvant_kv_summarize, the coarse summaries of the coarse blocks that the last
// `written` positions of each sequence fall in: each page of such a block from the first written one holds the min
// and max from the block's first row to the page's end (the previous page's value combined with the blocks
// starting in this page, up to the length), pages in order within a block. Needs blocks no larger than a page and
// coarse blocks of whole pages.
//
// grid:  (ceil(written / 2^cshift) + 1, kvHeads, seqs); block: DK threads, thread d one dimension.
// ================================================================================================================
extern "C" __global__ void __launch_bounds__(DK) kvant_kv_summarize_coarse(const float* __restrict__ sums,
        float* __restrict__ coarse, const int* __restrict__ tables, int tableStride, const int* __restrict__ lens,
        int fixedLen, int written, int kvHeads, int pageTokens, int shift, int cshift, int spp) {
    KVANT_GRID_ENTER();
    const int seq = blockIdx.z, g = blockIdx.y, d = threadIdx.x;
    const int len = lens != nullptr ? lens[seq] : fixedLen;
    if (written <= 0 || written > len) return;
    const int from = len - written;
    const int j = (from >> cshift) + blockIdx.x;
    if ((j << cshift) >= len) return;
    const int* table = tables + (i64) seq * tableStride;
    const int firstPage = (j << cshift) / pageTokens;
    const int endPage = (imin(len, (j + 1) << cshift) + pageTokens - 1) / pageTokens;
    int p = imax(firstPage, from / pageTokens);
    float mn = __int_as_float(0x7f800000), mx = -__int_as_float(0x7f800000);
    if (p > firstPage) {
        const float* prev = coarse + ((i64) table[p - 1] * kvHeads + g) * 2 * DK;
        mn = prev[d];
        mx = prev[DK + d];
    }
    for (; p < endPage; p++) {
        for (int b = (p * pageTokens) >> shift; b < ((p + 1) * pageTokens) >> shift && (b << shift) < len; b++) {
            const float* f = sums + summary_at(table, b, shift, pageTokens, spp, kvHeads, g);
            mn = java_min(mn, f[d]);
            mx = java_max(mx, f[DK + d]);
        }
        float* c = coarse + ((i64) table[p] * kvHeads + g) * 2 * DK;
        c[d] = mn;
        c[DK + d] = mx;
    }
}
