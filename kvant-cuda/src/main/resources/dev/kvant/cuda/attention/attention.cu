// attention.cu — attention over the paged, compressed KV cache: decode (one or a few queries per sequence, split-K),
// prefill (tensor-core tiles, causal, chunked), and the merge of split partials. One module per (KF, VF, DK, DV,
// HBD): the K and V formats (kv_format.cuh ids), head sizes, and the kv heads one decode block serves.
//
// Common to all kernels
//   q      float [seqs][nq][heads][DK], unrotated; query i of a sequence sits at position qstart + i
//   pools  K and V pools of one layer as dev.kvant.kv.KvCache lays them out: page p at p * pageBytes, row (token t of
//          the page, kv head h) at (t * kvHeads + h) * rowBytes
//   tables int32 [seqs][tableStride]: logical page -> physical page (device memory)
//   lens   int32 [seqs]: tokens in the cache including the nq new ones (device memory); qstart = len - nq
//   opart  float [seqs][nq][heads][splits][DV] unnormalized partial outputs (head order), ml float2 (max, sum),
//          both in the log2 domain (the query is pre-scaled by scale * log2(e), so exp2 replaces exp)
//
// Tiles. A block loads the rows of its kv heads for TT consecutive tokens with 16-byte cp.async into a ring of NST
// stages: per token the 16-byte-aligned cover of the HB rows (HB * rowBytes bytes, contiguous in a page) is copied,
// so any row size and alignment loads with whole 16-byte words (rows of q8_0/turbo are only 2-byte aligned). Tokens
// outside the range are zero-filled, never read. f16 and bf16 rows are used in place as the tensor-core tile; the
// other formats are dequantized to an f16 tile (dq_group), K first, then V into the same buffer.
//
// Numerics: S and O accumulate in f32 on the tensor cores (mma.sync m16n8k16, f16 operands, bf16 for the bf16
// format); probabilities enter the P.V product as f16 (bf16); the softmax is the online one with the running max
// per row. The order of every sum is fixed by the tile loop and the split boundaries (multiples of splitTokens, a
// launch parameter independent of the device), so the same input gives the same bits on every run.

constexpr int RBK = fmt_row_bytes(KF, DK);
constexpr int RBV = fmt_row_bytes(VF, DV);
constexpr bool K_DIRECT = fmt_direct(KF);
constexpr bool V_DIRECT = fmt_direct(VF);
constexpr bool K_BF16 = KF == F_BF16;
// Decode with a turbo format of one block a row: the tile holds the rows' bare centroids and the row's norm is
// applied to its scores (K) or to its probabilities (V) instead, one multiplication a token rather than one a value.
constexpr bool K_FOLD = fmt_turbo(KF) && DK == rot_block(DK);
constexpr bool V_FOLD = fmt_turbo(VF) && DV == rot_block(DV);
constexpr bool V_BF16 = VF == F_BF16;
// Decode over turbo rows of one rotation block (64 or 128 values), 8-bit rows (q8_0, int8: K_FRAG8, V_FRAG8) and
// 4-bit rows (q4_0, q4_0h: K_FRAG4, V_FRAG4): no tile (K_FRAG, V_FRAG). Each lane decodes its mma A fragments
// straight from the raw stage — turbo
// through the pair table (turbo_pairs, turbo4_pair), 8-bit and 4-bit values under an exponent byte (i8pair_to_h2,
// i8cross_to_h2, q4pair_to_h2) — in a column order of its own (kfrag_col, vfrag_dim) chosen so that a lane's pairs
// come from a few consecutive bytes of a row; the query (K) and the output (V) follow it.
constexpr bool K_FRAG8 = fmt_8bit(KF);
constexpr bool V_FRAG8 = fmt_8bit(VF) && DV <= 256;
constexpr bool K_FRAG4 = fmt_q4(KF);
constexpr bool V_FRAG4 = fmt_q4(VF) && DV <= 256;
constexpr bool K_FRAG = (fmt_turbo(KF) && (DK == 128 || DK == 64)) || K_FRAG8 || K_FRAG4;
constexpr bool V_FRAG = (fmt_turbo(VF) && (DV == 128 || DV == 64)) || V_FRAG8 || V_FRAG4;
#define NEG_INF (-__int_as_float(0x7f800000))

// ---- PTX helpers (smem_u32 and the cp.async copies come with every kvant source: KernelSource.CP_ASYNC)

// ldmatrix from a shared-memory address (smem_u32): a loop that adds constant offsets to one such base lets ptxas
// fold them into the instruction; a generic pointer costs a 64-bit add and a conversion per load.
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const void* p) {
    ldsm_x4(r, smem_u32(p));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], const void* p) {
    ldsm_x4_t(r, smem_u32(p));
}
__device__ __forceinline__ u32 movm_t(u32 x) {
    u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
template <bool BF>
__device__ __forceinline__ void mma16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if constexpr (BF) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
// ---- turbo fragments (K_FRAG, V_FRAG), rows of one block of N = 128 or 64 values: a norm, then the codes.
// turbo4: N/2 bytes, byte b holds dimensions b (low nibble) and b + N/2 (high): one byte is one pair table entry.
// turbo3: a low plane of N/4 bytes (byte b: the low code bits of dimensions b + (N/4)q at bits 2q, q = 0..3) and a
// high plane of N/8 (byte j: the high bit of dimension (N/8)s + j + (N/4)q at bit s + 2q). A nibble of a low byte and
// its two high bits index the pair table (build_pair_lut): dimensions b + (N/4)(2n), b + (N/4)(2n + 1) for nibble n,
// as the low and high half. turbo2: the low plane alone, a nibble is the index. (The figures below are N = 128's;
// rows of 64 halve every byte count and span: a lane reads half the bytes, and there are half the k-steps and
// m-tiles.)

// A lane's lookups in the fragment paths' pair tables (lut: the table's shared address; lane4: the lane's byte offset,
// 4 x lane). turbo3, turbo2 (256-byte entries, lut_stride): the entry of index byte b of y is one byte_perm — byte b
// of y above lane4's low byte, zeros above — so a lookup costs that and its load.
template <int B>
__device__ __forceinline__ u32 pair_at(u32 lut, u32 y, u32 lane4) {
    return lds_table(lut + __byte_perm(y, lane4, 0x5504u | (B << 4)));
}

// The four pairs of low bytes b, b + 1 (turbo3, turbo2; at codes + loOff, b even) from one 16-bit word of each plane:
// p[0] byte b nibble 0, p[1] byte b + 1 nibble 0, p[2] byte b nibble 1, p[3] byte b + 1 nibble 1. lo, hi: the words at
// codes + loOff and codes + N/4 + hiOff (hiOff = b mod N/8; turbo2 has none), s = b div N/8; lut, lane4: as pair_at.
template <int FMT>
__device__ __forceinline__ void turbo_pairs(u32 (&p)[4], u32 lo, u32 hi, int s, u32 lut, u32 lane4) {
    u32 y0 = lo & 0x0F0Fu, y1 = (lo >> 4) & 0x0F0Fu;
    if constexpr (FMT == F_TURBO3) {
        const u32 x = (hi >> s) & 0x5555u;
        y0 |= (x & 0x0505u) << 4;
        y1 |= x & 0x5050u;
    }
    p[0] = pair_at<0>(lut, y0, lane4);
    p[1] = pair_at<1>(lut, y0, lane4);
    p[2] = pair_at<0>(lut, y1, lane4);
    p[3] = pair_at<1>(lut, y1, lane4);
}
// turbo4 (128-byte entries): the pair of byte h (0, 1) of a 16-bit code word; lutL: the lane's copy (lut + lane4).
__device__ __forceinline__ u32 turbo4_pair(u32 w, int h, u32 lutL) {
    return lds_table(lutL + (((w >> (8 * h)) & 255u) << 7));
}

// K_FRAG column order (head dimension -> column of the K fragments and of the query).
// turbo3, turbo2: lane g·4 + c reads low bytes 8c..8c+7 of its tokens' rows, byte 8c + ks for k-step ks, nibble n for
// the A registers of columns 16ks + 8n + 2c (+1): column 16ks + 8h + 2c + e holds dimension 8c + ks + 32(2h + e).
// turbo4: lane g·4 + c reads bytes 16c..16c+15, byte 16c + 2ks + h for the A registers of columns 16ks + 8h + 2c (+1):
// column 16ks + 8h + 2c + e holds dimension 16c + 2ks + h + 64e.
// q8_0, int8: lane g·4 + c reads bytes 8c..8c+7 of each 32 values j of its tokens' rows, the 16-bit word k of them
// for k-step 2j + (k >> 1), the A registers of columns 2c (+1) (k even) or 8 + 2c (+1) (k odd): column
// 16(2j + h) + 8x + 2c + e holds dimension 32j + 8c + 4h + 2x + e.
// q4_0, q4_0h: lane g·4 + c reads quant bytes 4c..4c+3 of each block j of its tokens' rows (byte b: value b in the
// low nibble, b + 16 in the high), the 16-bit word x of them for k-step 2j + x, its low nibbles for the A registers
// of columns 2c (+1), its high ones for 8 + 2c (+1): column 16(2j + x) + 8h + 2c + e holds dimension
// 32j + 16h + 4c + 2x + e.
template <int FMT, int D = DK>
__device__ __forceinline__ int kfrag_col(int d) {
    if constexpr (fmt_8bit(FMT)) {
        const int r = d & 31;
        return 16 * (2 * (d >> 5) + ((r >> 2) & 1)) + 8 * ((r >> 1) & 1) + 2 * (r >> 3) + (r & 1);
    } else if constexpr (fmt_q4(FMT)) {
        const int r = d & 31;
        return 16 * (2 * (d >> 5) + ((r >> 1) & 1)) + 8 * (r >> 4) + 2 * ((r >> 2) & 3) + (r & 1);
    } else if constexpr (FMT == F_TURBO4) {   // a lane's D/8 bytes
        const int b = d % (D / 2), e = d / (D / 2);
        return 16 * ((b % (D / 8)) >> 1) + 8 * (b & 1) + 2 * (b / (D / 8)) + e;
    } else {                                  // a lane's D/16 low bytes
        const int b = d % (D / 4), q = d / (D / 4);
        return 16 * (b % (D / 16)) + 8 * (q >> 1) + 2 * (b / (D / 16)) + (q & 1);
    }
}
// V_FRAG column order (column of the output's m-tiles -> head dimension): a pair is rows g, g + 8 of an m-tile.
// turbo3, turbo2: lane g·4 + c reads low bytes 4g..4g+3 of its four tokens' rows; byte 4g + i nibble n is m-tile
// 2i + n: column 16mt + 8h + g holds dimension 4g + (mt >> 1) + 32(2(mt & 1) + h).
// turbo4: lane g·4 + c reads bytes 8g..8g+7; byte 8g + mt is m-tile mt: column 16mt + 8h + g holds dimension
// 8g + mt + 64h.
// q8_0, int8: lane g·4 + c reads bytes 4g..4g+3 of each 32 values of its four tokens' rows, the 16-bit word at 2i
// of the 32 values j for m-tile 2j + i: column 16mt + 8h + g holds dimension 32(mt >> 1) + 4g + 2(mt & 1) + h. So a
// lane's outputs of a row are runs of four dimensions that eight lanes write side by side (the partials' stores).
// q4_0, q4_0h: lane g·4 + c reads quant bytes 2g, 2g + 1 of each block j of its four tokens' rows; byte 2g + i is
// m-tile 2j + i, its low nibble row g, its high nibble row g + 8: column 16mt + 8h + g holds dimension
// 32(mt >> 1) + 16h + 2g + (mt & 1) (runs of two dimensions a lane, eight lanes side by side).
template <int FMT, int D = DV>
__device__ __forceinline__ int vfrag_dim(int m) {
    const int mt = m >> 4, g = m & 7, h = (m >> 3) & 1;
    if constexpr (fmt_8bit(FMT)) {
        return 32 * (mt >> 1) + 4 * g + 2 * (mt & 1) + h;
    } else if constexpr (fmt_q4(FMT)) {
        return 32 * (mt >> 1) + 16 * h + 2 * g + (mt & 1);
    } else if constexpr (FMT == F_TURBO4) {   // a lane's D/16 bytes
        return (D / 16) * g + mt + (D / 2) * h;
    } else {                                  // a lane's D/32 low bytes
        return (D / 32) * g + (mt >> 1) + (D / 4) * (2 * (mt & 1) + h);
    }
}

// ---- bulk copies (sm_90): cp.async.bulk moves a run of 16-byte words into shared memory and counts its bytes on an
// mbarrier, so one thread's instruction replaces a word per thread of cp.async (decode with HB_ALL: a token's rows).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KVANT_BULK 1
#else
#define KVANT_BULK 0
#endif
__device__ __forceinline__ void mbar_init(u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
#if KVANT_BULK
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// This thread's arrival, announcing bytes that its bulk copies will bring.
__device__ __forceinline__ void mbar_arrive_tx(u32 bar, int bytes) {
#if KVANT_BULK
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
#if KVANT_BULK
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra WAIT_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
#endif
}
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, int bytes, u32 bar) {
#if KVANT_BULK
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

// 2^x by the SFU (ex2.approx.ftz: relative error below 2^-22, 2^-inf = 0): the softmax's exponential, one
// instruction instead of exp2f's range handling.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
template <bool BF>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    if constexpr (BF) return pack_bf2(lo, hi);
    else return pack_h2(lo, hi);
}

// ---- shared memory layout of one block

// Q_ALIAS: the query tile lives in the warp's own dequant tile (decode: one warp per tile, Q is read into registers
// before the first tile is dequantized), which keeps the shared memory of turbo and q8/q4 decode within two blocks
// per SM.
// MU: (KMEAN prefill) each stage also holds the key means of the pages its 8-token chunks start, DK halves per
// chunk in head order, copied with the rows.
// FRAG (decode): turbo rows of 128, 8-bit and 4-bit rows (K_FRAG, V_FRAG) are read as fragments straight from the
// stage, so they need no tile, and turbo pair tables have lut_stride(f, true) entries.
// TIGHT: covers of whole words at offset 0 that are only read as fragments (no ldmatrix, whose rows want the odd
// 16-byte stride of the padding): the slots follow each other with no padding, so the tokens of a tile that lie in
// one page are one run in the stage as in the page (decode copies them with one bulk copy for K and one for V).
template <int HB, int WARPS, int TT, int QROWS, bool Q_ALIAS, bool MU = false, bool FRAG = false, bool TIGHT = false>
struct Layout {
    static constexpr int SLOTK = TIGHT ? HB * RBK : round16(HB * RBK) + 16;   // one token's cover of HB K rows
    static constexpr int SLOTV = TIGHT ? HB * RBV : round16(HB * RBV) + 16;
    static_assert(!TIGHT || (SLOTK % 16 == 0 && SLOTV % 16 == 0), "tight slots are whole 16-byte words");
    static constexpr int QSTR = 2 * DK + 16;               // bytes per Q row: 16-byte units odd, ldmatrix conflict-free
    static constexpr int TSK = 2 * DK + 16;
    static constexpr int TSV = 2 * DV + 16;
    static constexpr bool KFR = FRAG && K_FRAG, VFR = FRAG && V_FRAG;
    static constexpr int TS = imax(K_DIRECT || KFR ? 0 : TSK, V_DIRECT || VFR ? 0 : TSV);
    static constexpr int TILES = TS == 0 ? 0 : HB;         // one dequantized tile per kv head of the block
    static constexpr bool Q_IN_TILE = Q_ALIAS && TS > 0 && TT * TS >= QROWS * QSTR && WARPS == TILES;
    static constexpr int Q_BYTES = Q_IN_TILE ? 0 : WARPS * QROWS * QSTR;
    // K and V share one pair table when it is the same table: same format, rotation block and entry stride.
    static constexpr bool SHARED_LUT = VF == KF && rot_block(DK) == rot_block(DV)
                                    && lut_stride(KF, KFR) == lut_stride(VF, VFR);
    static constexpr int LUTK_BYTES = lut_bytes(KF, KFR);
    static constexpr int LUTV_BYTES = SHARED_LUT ? 0 : lut_bytes(VF, VFR);
    static constexpr int TILE_BYTES = TILES * TT * TS;
    static constexpr int STAGE_MU = MU ? (TT / 8) * DK * 2 : 0;
    static constexpr int STAGE = TT * (SLOTK + SLOTV) + STAGE_MU;
    static constexpr int OFF_LUTK = Q_BYTES;
    static constexpr int OFF_LUTV = OFF_LUTK + LUTK_BYTES;
    static constexpr int OFF_TILE = OFF_LUTV + LUTV_BYTES;
    static constexpr int OFF_OFS = OFF_TILE + TILE_BYTES;
    static constexpr int OFF_MU = OFF_OFS + round16(8 * TT * 2);     // KMEAN: per warp a page mean, tile order
    static constexpr int FIXED = OFF_MU + (KMEAN ? WARPS * DK * 2 : 0);
    // Stages: enough bytes in flight to cover the memory latency. Two blocks per SM when that fits in about 110 KB
    // each, else one block with up to 200 KB. A centered prefill (MU) counts its stages as the uncentered layout
    // does: the prefill holds one block per SM by its registers anyway, and the mean bytes would cost it a stage.
    static constexpr int NST_SMALL = MU ? (110 * 1024 - OFF_MU) / (STAGE - STAGE_MU) : (110 * 1024 - FIXED) / STAGE;
    static constexpr int NST = NST_SMALL >= 2 ? imin(NST_SMALL, 6) : imax(2, imin(6, (200 * 1024 - FIXED) / STAGE));
    static constexpr int OFF_RAW = FIXED;
    static constexpr int TOTAL = OFF_RAW + NST * STAGE;
    static_assert(NST <= 8, "offset table holds 8 stages");
    static_assert(TOTAL <= 227 * 1024, "attention tile does not fit in shared memory: fewer kv heads per block");
};

// x / pageTokens and x % pageTokens for positions x >= 0 in the tile loops: a shift and a mask when pages hold a
// power of two tokens (as every cache kvant plans; the test is uniform and hoisted out of the loops), else the
// unsigned division — a runtime divisor otherwise costs a few dozen instructions a token.
__device__ __forceinline__ int page_div(int x, int pageTokens) {
    return (pageTokens & (pageTokens - 1)) == 0 ? x >> (__ffs(pageTokens) - 1) : (int) ((u32) x / (u32) pageTokens);
}
__device__ __forceinline__ int page_mod(int x, int pageTokens) {
    return (pageTokens & (pageTokens - 1)) == 0 ? x & (pageTokens - 1) : (int) ((u32) x % (u32) pageTokens);
}

// One token's cover of HB rows into its slot of a raw stage: the TPT threads of the token copy consecutive 16-byte
// words (w = u, u + TPT, ...), so each group of TPT lanes reads one contiguous run. page < 0: the token is outside
// the range and its slot is zero-filled (never read as data; zeros keep masked rows finite).
// WHOLE: the caller knows that a cover of whole 16-byte words starts on 16 bytes — rows of whole words (prefill's
// f16, bf16: a page holds whole rows and, for a centered K, a mean area of 2·kvHeads·DK bytes; pools are 256-byte
// aligned), or the rows of every kv head of a token (decode with HB = kvHeads: a token's cover is HB·RB bytes at a
// multiple of HB·RB in its page) — so where HB·RB is a multiple of 16, the cover is HB·RB/16 words at offset 0, a
// fixed count a thread: no offset or word count worked out per token, and its offset is 0 (cover_aligned).
template <int HB, int RB>
__host__ __device__ constexpr bool cover_aligned(bool whole) { return whole && (HB * RB) % 16 == 0; }

template <int HB, int RB, int SLOT, int TPT, bool WHOLE = false>
__device__ __forceinline__ void copy_token(u8* dst, u8* offOut, int page, int tok, int pageTokens,
                                           const u8* __restrict__ pool, i64 pageBytes, int kvHeads, int h0, int u) {
    constexpr int WORDS = HB * RB / 16;
    if (page >= 0) {
        const i64 start = (i64) page * pageBytes + ((i64) page_mod(tok, pageTokens) * kvHeads + h0) * RB;
        if constexpr (cover_aligned<HB, RB>(WHOLE)) {
            if (u == 0) *offOut = 0;
            const u8* src = pool + start;
#pragma unroll
            for (int k = 0; k < (WORDS + TPT - 1) / TPT; k++) {
                const int w = u + k * TPT;
                if (WORDS % TPT == 0 || w < WORDS) cp_async16(dst + w * 16, src + w * 16);
            }
        } else {
            const int off = (int) (start & 15);
            const int words = (off + HB * RB + 15) >> 4;
            const u8* src = pool + (start & ~(i64) 15);
            if (u == 0) *offOut = (u8) off;
            for (int w = u; w < words; w += TPT) cp_async16(dst + w * 16, src + w * 16);
        }
    } else {
        for (int w = u; w < SLOT / 16; w += TPT) *(uint4*) (dst + w * 16) = make_uint4(0, 0, 0, 0);
        if (u == 0) *offOut = 0;
    }
}

// The cp.async loader of a block's raw stages: thread tid owns token tid / TPT of every stage (TPT = threads per
// token) and copies its K and V covers. The page of the token a stage later is read from the table one iteration
// ahead (page()), so no copy waits on a page-table load: issuing a stage costs no global-memory latency.
template <class LY, int HB, int TT, int NT, bool WHOLE = false>
struct StageLoader {
    static constexpr int TPT = NT / TT;
    static_assert(NT % TT == 0 && TPT >= 1, "a stage needs at least one thread per token");
    const int t, u;

    __device__ explicit StageLoader(int tid) : t(tid / TPT), u(tid % TPT) {}

    // The page of this thread's token in the stage from tok0, or -1 at or past tokEnd; pos0 is the cache position
    // of tok0 (tok0 itself, or where a selection list maps it: a stage never crosses a selection block).
    __device__ __forceinline__ int page(const int* __restrict__ table, int tok0, int tokEnd, int pos0,
                                        int pageTokens) const {
        return tok0 + t < tokEnd ? table[page_div(pos0 + t, pageTokens)] : -1;
    }

    // WHOLE covers by bulk copies: the first thread of each token copies its K and V covers (HB·RBK, HB·RBV bytes) and
    // arrives on the stage's mbarrier bar (one arrival per token: a barrier of TT) announcing their bytes; a token
    // outside the range has its slots zero-filled by its TPT threads first, then arrives with none.
    // run (TIGHT slots, uniform): the stage's TT tokens are consecutive positions of one page, from tok0: thread 0
    // copies all their K rows and all their V rows with one bulk copy each (the other tokens' threads arrive with
    // none); page then matters to thread 0 alone. sraw: the raw stages' 32-bit shared address (smem + OFF_RAW).
    __device__ __forceinline__ void issue_bulk(u8* smem, u32 sraw, int stage, int tok0, int page, int pageTokens,
                                               const u8* __restrict__ kpool, const u8* __restrict__ vpool,
                                               i64 kPageBytes, i64 vPageBytes, int kvHeads, int h0, u32 bar,
                                               bool run = false) const {
        static_assert(cover_aligned<HB, RBK>(true) && cover_aligned<HB, RBV>(true), "bulk copies move whole words");
        const int dk = stage * LY::STAGE + t * LY::SLOTK, dv = stage * LY::STAGE + TT * LY::SLOTK + t * LY::SLOTV;
        if constexpr (LY::SLOTK == HB * RBK && LY::SLOTV == HB * RBV) {
            if (run) {
                if (u != 0) return;
                if (t == 0) {
                    const i64 row = (i64) page_mod(tok0, pageTokens) * kvHeads + h0;
                    mbar_arrive_tx(bar, TT * HB * (RBK + RBV));
                    bulk_copy(sraw + dk, kpool + (i64) page * kPageBytes + row * RBK, TT * HB * RBK, bar);
                    bulk_copy(sraw + dv, vpool + (i64) page * vPageBytes + row * RBV, TT * HB * RBV, bar);
                } else {
                    mbar_arrive(bar);
                }
                return;
            }
        }
        if (page < 0) {
            u8* raw = smem + LY::OFF_RAW;
            for (int w = u; w < LY::SLOTK / 16; w += TPT) *(uint4*) (raw + dk + w * 16) = make_uint4(0, 0, 0, 0);
            for (int w = u; w < LY::SLOTV / 16; w += TPT) *(uint4*) (raw + dv + w * 16) = make_uint4(0, 0, 0, 0);
        }
        __syncwarp();
        if (u != 0) return;
        if (page >= 0) {
            const i64 row = (i64) page_mod(tok0 + t, pageTokens) * kvHeads + h0;
            mbar_arrive_tx(bar, HB * (RBK + RBV));
            bulk_copy(sraw + dk, kpool + (i64) page * kPageBytes + row * RBK, HB * RBK, bar);
            bulk_copy(sraw + dv, vpool + (i64) page * vPageBytes + row * RBV, HB * RBV, bar);
        } else {
            mbar_arrive(bar);
        }
    }

    __device__ __forceinline__ void issue(u8* smem, int stage, int tok0, int page, int pageTokens,
                                          const u8* __restrict__ kpool, const u8* __restrict__ vpool, i64 kPageBytes,
                                          i64 vPageBytes, int kvHeads, int h0) const {
        u8* rawK = smem + LY::OFF_RAW + stage * LY::STAGE;
        u8* rawV = rawK + TT * LY::SLOTK;
        u8* offs = smem + LY::OFF_OFS + stage * TT * 2;
        copy_token<HB, RBK, LY::SLOTK, TPT, WHOLE>(rawK + t * LY::SLOTK, offs + t * 2, page, tok0 + t, pageTokens,
                                                   kpool, kPageBytes, kvHeads, h0, u);
        copy_token<HB, RBV, LY::SLOTV, TPT, WHOLE>(rawV + t * LY::SLOTV, offs + t * 2 + 1, page, tok0 + t, pageTokens,
                                                   vpool, vPageBytes, kvHeads, h0, u);
        if constexpr (LY::STAGE_MU > 0) {
            // a chunk that starts a page: that page's key mean (kv head h0) into the chunk's slot
            if (page >= 0 && t % 8 == 0 && page_mod(tok0 + t, pageTokens) == 0) {
                u8* mu = rawK + TT * (LY::SLOTK + LY::SLOTV) + (t / 8) * DK * 2;
                const u8* src = (const u8*) key_mean(kpool, page, kPageBytes, pageTokens, kvHeads, h0);
                for (int w = u; w < DK * 2 / 16; w += TPT) cp_async16(mu + w * 16, src + w * 16);
            }
        }
    }
};

// The corrected norm of a turbo row of one block (its first two bytes, fp16).
__device__ __forceinline__ float row_norm(const u8* row) {
    return h2f((u16) ld_u16(row));
}

// Dequantizes the TT x D tile of one kv head (hl within the block) from a raw stage into tile (stride TS), by NT
// threads (gtid = 0..NT-1); !NORM: turbo rows without their norms (see K_FOLD). Thread gtid always takes group gtid %
// G of its rows (NT is a multiple of G = D / 8), so what locates a group in a row is worked out once, and its
// TT * G / NT rows are unrolled: their loads overlap. Tokens past the range are decoded like the others: their
// slots are zero-filled (copy_token), which decodes to finite values (zeros, or bare centroids that a zero norm
// or a zero probability cancels), and their scores are masked. ALIGNED: every cover's offset is 0 (cover_aligned).
template <int FMT, int D, int TT, int SLOT, int TS, int NT, bool NORM = true, bool ALIGNED = false>
__device__ __forceinline__ void dequant_tile(u8* tile, const u8* raw, const u8* offs, int isV, int hl,
                                             const u32* lut, int gtid, int lane) {
    constexpr int RB = fmt_row_bytes(FMT, D);
    constexpr int G = D / 8;
    static_assert(NT % G == 0 && (TT * G) % NT == 0, "a tile's groups are whole rounds of the threads");
    constexpr int TSTEP = NT / G;
    const int grp = gtid & (G - 1), t0 = gtid / G;
    u8* dst = tile + grp * 16;
    if constexpr (fmt_turbo(FMT)) {
        const u32 src = smem_u32(raw + hl * RB), ofs = smem_u32(offs + isV), table = smem_u32(lut + lane);
#pragma unroll
        for (int k = 0; k < TT * G / NT; k++) {
            const int t = t0 + k * TSTEP;
            const u32 off = ALIGNED ? 0u : lds_u8(ofs + t * 2);
            *(uint4*) (dst + t * TS) = dq_turbo<FMT, D, NORM>(src + t * SLOT + off, grp, table);
        }
    } else {
        const u8* src = raw + hl * RB;
#pragma unroll
        for (int k = 0; k < TT * G / NT; k++) {
            const int t = t0 + k * TSTEP;
            const int off = ALIGNED ? 0 : offs[t * 2 + isV];
            *(uint4*) (dst + t * TS) = dq_group<FMT, D>(src + t * SLOT + off, grp, lut, lane);
        }
    }
}

// KMEAN: the score of a key is q·(k - μ) + q·μ, μ its page's mean, so the tile (centered rows) goes through the
// tensor cores as is and each score gets the bias q·μ of its page: computed once per page by the tensor cores, from
// the f16 query fragments the mma reads (tile column order) and the fp16 mean, which a warp first stages in shared
// memory in that order (stage_mean). Decode reads the mean from the page when a tile enters a new page; the mma.sync
// prefill gets it with the stage's rows (Layout MU). (prefill_wg adds the mean to its dequantized K tile instead.)

// A page mean staged by one warp in its tile column order (muT[col] = μ of head dimension perm_col(col)), so that the
// f16 pairs a lane reads are the fragment of a matrix whose every row (decode: A) or column (prefill: B) is μ.
template <bool FRAG>
__device__ __forceinline__ void stage_mean(u16* muT, const u16* __restrict__ mu, int lane) {
    __syncwarp();
#pragma unroll
    for (int j = 0; j < DK / 32; j++) {
        const int d = 32 * j + lane;
        muT[FRAG ? kfrag_col<KF>(d) : perm_inv<KF, DK>(d)] = mu[d];
    }
    __syncwarp();
}

// Decode (Q^T as B fragments: lane g·4 + c holds query row g, columns 16ks + 2c.. and +8..): A = 16 rows of μ, so
// D[token][row] = μ·q_row and the lane's pair is the bias of rows 2c and 2c + 1.
__device__ __forceinline__ float2 key_bias_decode(const u32 (*qf)[2], const u16* muT, int lane) {
    const int c = lane & 3;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks++) {
        const u32 m0 = *(const u32*) (muT + 16 * ks + 2 * c), m1 = *(const u32*) (muT + 16 * ks + 2 * c + 8);
        mma16816<false>(d, m0, m0, m1, m1, qf[ks][0], qf[ks][1]);
    }
    return make_float2(d[0], d[1]);
}

// Prefill (Q as A fragments of one k-step: rows g and g + 8): B = 8 columns of μ, so D[row][n] = q_row·μ and the
// lane's d[0], d[2] are the bias of rows g and g + 8.
__device__ __forceinline__ void key_bias_step(float (&d)[4], const u32 (&a)[4], const u16* muT, int ks, int lane) {
    const int c = lane & 3;
    const u32 m0 = *(const u32*) (muT + 16 * ks + 2 * c), m1 = *(const u32*) (muT + 16 * ks + 2 * c + 8);
    mma16816<false>(d, a[0], a[1], a[2], a[3], m0, m1);
}

// The rows of a warp's query tile: QROWS rows starting at row0 of a kv head's rows (row = query * G + head in
// group), rotated into the K format's domain (the CPU's rotation), scaled by qscale, in the K tile's column order.
// load_q reads them (lane l holds dimensions 32j + l; rows past nq * G read as 0), store_q rotates all QROWS rows
// side by side and writes them as f16/bf16 (the first validRows; +0 for the others); decode issues the loads first
// so that their latency passes while it looks up its pages and builds its tables.
template <int QROWS>
__device__ __forceinline__ void load_q(float (&x)[QROWS][DK / 32], const float* __restrict__ q, int seq, int nq,
                                       int heads, int G, int kvHead, int row0, int lane) {
#pragma unroll
    for (int r = 0; r < QROWS; r++) {
        const int row = row0 + r;
        if (row < nq * G) {
            const int qi = row / G, hq = kvHead * G + (row - qi * G);
            const float* src = q + (((i64) seq * nq + qi) * heads + hq) * DK;
#pragma unroll
            for (int j = 0; j < DK / 32; j++) x[r][j] = src[32 * j + lane];
        } else {
#pragma unroll
            for (int j = 0; j < DK / 32; j++) x[r][j] = 0.f;
        }
    }
}

template <int QROWS, bool FRAG = false>
__device__ __forceinline__ void store_q(u8* qs, float (&x)[QROWS][DK / 32], int validRows, float qscale,
                                        int lane, bool rotate = true) {
#pragma unroll
    for (int r = 0; r < QROWS; r++) {
        // rows past validRows are written as zeros: only the others need their rotation (a uniform test: one query
        // of a GQA group of 4 leaves half of decode's 8 rows empty); none where the queries come rotated
        if constexpr (fmt_rotated(KF)) {
            if (rotate && r < validRows) wht_row<DK>(x[r], lane, false);
        }
#pragma unroll
        for (int j = 0; j < DK / 32; j++) {
            const int col = FRAG ? kfrag_col<KF>(32 * j + lane) : perm_inv<KF, DK>(32 * j + lane);
            const float v = r < validRows ? x[r][j] * qscale : 0.f;
            *(u16*) (qs + r * (2 * DK + 16) + col * 2) = K_BF16 ? f2bf(v) : f2h(v);
        }
    }
    __syncwarp();
}

// As load_q then store_q, one row at a time (prefill: 16 rows a warp, whose registers the tile loop needs).
template <int QROWS>
__device__ __forceinline__ void prepare_q(u8* qs, const float* __restrict__ q, int seq, int nq, int heads, int G,
                                          int kvHead, int row0, float qscale, int lane, bool rotate) {
    for (int r = 0; r < QROWS; r++) {
        float x[1][DK / 32];
        load_q<1>(x, q, seq, nq, heads, G, kvHead, row0 + r, lane);
        store_q<1>(qs + r * (2 * DK + 16), x, nq * G - (row0 + r), qscale, lane, rotate);
    }
}

template <class LY>
__device__ __forceinline__ void build_luts(u8* smem, int tid, int nthreads) {
    if constexpr (fmt_turbo(KF))
        build_pair_lut<KF, DK, lut_stride(KF, LY::KFR)>((u32*) (smem + LY::OFF_LUTK), tid, nthreads);
    if constexpr (fmt_turbo(VF) && !LY::SHARED_LUT)
        build_pair_lut<VF, DV, lut_stride(VF, LY::VFR)>((u32*) (smem + LY::OFF_LUTV), tid, nthreads);
}

// The attention kernels' flags. PRE_Q_ROTATED (kvant_attn_decode, kvant_attn_prefill): the queries come rotated into
// K's basis — the model's RoPE (kvant_rope_write for a decode step, kvant_rope_split for a prefill) rotates them
// where it writes them, so the blocks' prologue, which the loads and the tensor cores wait for, does not; ignored
// where K is not rotated. PRE_OUT_ROTATED (kvant_attn_prefill): the output is left in V's rotated basis (the model's
// kvant_to_half_unrotated turns it back where it converts it; the epilogue then only divides and stores). Measured
// on an H200 (docs/BENCHMARKS.md): a turbo3 prefill_wg of 4K tokens 1.2x faster.
constexpr int PRE_Q_ROTATED = 1, PRE_OUT_ROTATED = 2;

// ================================================================================================================
// kvant_attn_decode — split-K decode of nq queries (1..8) per sequence, causal among themselves.
//
// grid:   (targetBlocks + seqs, (kvHeads / HBD) * ceil(nq * G / 8), 1). Sequence b is cut into splits of
//         split = split_for(len_b, splitTokens, maxSplits) tokens (split s: [s * split, min((s + 1) * split, len_b)),
//         the merge reads ceil(len_b / split)), and block (x, y) takes a run of consecutive splits of one sequence
//         (dec_run: about targetBlocks blocks for the batch, a block a split for one sequence) for HBD kv heads and 8
//         query rows (query, head in group) of each, writing each split's partial as a block of that split alone
//         would; a block past the runs exits at once.
//         All sizes that change per step come from lens and tables in device memory, so a graph captured once
//         replays at any length up to maxSplits * splitTokens.
//         flags: PRE_Q_ROTATED (above), the same bits as the rotation done here.
// block:  HBD warps; warp w serves kv head h0 + w. One ring of stages (all warps) brings the rows of all HBD heads
//         for 16 tokens at a time, so each K/V row is read once for the whole GQA group: by cp.async, or when the
//         block serves every kv head on sm_90 (DEC_BULK), by two bulk copies a token counted on a stage's mbarrier
//         — one for K and one for V for the whole tile where its slots are tight (DEC_TIGHT) and it lies in a page.
// shared: Layout<HBD, HBD, 16, 8, true, false, FRAG, DEC_TIGHT>: pair tables, one dequant tile per warp that first
//         holds the warp's 8 query rows (f16/bf16, turbo rows of 128, 8-bit and 4-bit rows need no tile: a Q area),
//         NST raw stages. llama3-8b d128: 74-106 KB (two blocks per SM), 150 KB for f16/bf16 (one block, the f16 stage
//         being 66 KB). A block of every kv head (HB_ALL) copies whole-word covers at offset 0 (copy_token's WHOLE,
//         or bulk).
// thread: S^T = K Q^T with the 16 tokens as M and the 8 query rows as N (mma m16n8k16: K tile by ldmatrix, Q
//         fragments in registers), so a lane holds 2 tokens x 2 rows of S, 4 registers; P^T goes back into the
//         tensor cores through movmatrix; O^T = V^T P^T accumulates DV/16 m-tiles x 4 f32 per lane. Sparse V: a
//         probability below sparseThreshold (relative to the running row max) is dropped from the V sum (kept in
//         the denominator), and a 16-token block with none left skips its V dequantization and mma (tests only
//         with sparse V on); a tile inside the range that every row sees whole skips the mask tests.
//         Turbo rows of one block (K_FOLD, V_FOLD) enter the tile as bare centroid pairs; a K row's norm scales
//         its scores after the mma, a V row's norm its probabilities before they become f16. turbo rows of 128,
//         8-bit and 4-bit rows (K_FRAG, V_FRAG) have no tile: a lane decodes its A fragments from the raw stage.
// exact:  deterministic (fixed tile order, fixed split boundaries); not bitwise equal to the CPU's f32 attention
//         (f16 operands); tests bound the NMSE against a float64 reference.
// ================================================================================================================

// The split of a dense decode over len tokens: the fewest whole 16-token tiles, at least minSplit tokens, that make
// at most maxSplits splits (AttentionPlan#splitFor). A function of the length and the launch alone, so the same
// sequence gives the same bits; a plan for long contexts still cuts a short sequence into many splits. (Splits of
// power-of-two multiples of minSplit left half the blocks idle just past each power of two: at 32K + 1 tokens, 129
// splits of 256 instead of 228 of 144.)
__device__ __forceinline__ int split_for(int len, int minSplit, int maxSplits) {
    const int s = (((len + maxSplits - 1) / maxSplits) + 15) & ~15;
    return imax(minSplit, s);
}

constexpr int DEC_TT = 16;
// HB_ALL: a block serves every kv head (HBD = kvHeads), so a token's rows are one run at a multiple of HBD·RB in its
// page: covers of whole words start on 16 bytes (copy_token's WHOLE) and their offsets are 0.
#ifndef HB_ALL
#define HB_ALL 0
#endif
// Such covers read as fragments on both sides sit in tight slots (Layout's TIGHT): a tile's tokens in one page are then
// also consecutive runs of the page, HBD·RB bytes a token — unless that stride is a multiple of 64 bytes (q8_0 with 8
// kv heads: 1088): the 8 tokens a fragment load reads would then fall on 2 bank offsets, 4-way conflicts (measured
// 1.3-1.4x slower than padded slots), so such covers keep the padding and their copies a token.
constexpr bool tight_cover(int bytes) { return bytes % 16 == 0 && bytes % 64 != 0; }
constexpr bool DEC_TIGHT = HB_ALL != 0 && K_FRAG && V_FRAG && tight_cover(HBD * RBK) && tight_cover(HBD * RBV);
using DecLayout = Layout<HBD, HBD, DEC_TT, 8, true, false, true, DEC_TIGHT>;
constexpr bool DEC_KAL = cover_aligned<HBD, RBK>(HB_ALL != 0);
constexpr bool DEC_VAL = cover_aligned<HBD, RBV>(HB_ALL != 0);
// Both covers whole words at offset 0 on sm_90: each token's K and V rows come by two bulk copies, one thread's, and
// a stage is waited for on its mbarrier (kept in the offsets' area, which such covers do not use) instead of
// cp.async groups.
constexpr bool DEC_BULK = DEC_KAL && DEC_VAL && KVANT_BULK;
// Decode blocks an SM: two when their shared memory fits twice (the launch bound asks the registers for it).
constexpr int DEC_BLOCKS = (DV <= 128 && DecLayout::TOTAL <= 110 * 1024) ? 2 : 1;

// Dense decode's blocks (x) over the launch's sequences. A sequence's splits stay what split_for makes of its
// length (so its bits do not depend on the batch), and a block takes a run of consecutive splits of one sequence:
// the fewest splits that hold w tiles, w = ceil(the launch's tiles / targetBlocks). A batch so fills at most
// targetBlocks + seqs blocks (a sequence's runs are at most ceil(its tiles / w)), each preparing its query and tables
// once for its run and streaming its stages across the splits (a block a split repeated that prologue for every one:
// a sequence of 4K tokens is 256 splits of one tile), and a longer sequence gets more blocks, so sequences of
// different lengths share the grid by their work. One sequence alone (its splits are at most targetBlocks) keeps a
// block a split. Block x is run x - (the runs of the sequences before) of the sequence whose runs hold it; a block
// past them all returns -1. Every warp works it out alike, lane i for sequence base + i.
__device__ __forceinline__ int dec_run(const int* __restrict__ lens, int seqs, int targetBlocks, int minSplit,
                                       int maxSplits, int lane, int& s0, int& s1) {
    int tiles = 0;
    for (int base = 0; base < seqs; base += 32) {
        int t = base + lane < seqs ? (lens[base + lane] + DEC_TT - 1) / DEC_TT : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL_MASK, t, o);
        tiles += t;
    }
    const int w = (tiles + targetBlocks - 1) / targetBlocks;
    int b = blockIdx.x;
    for (int base = 0; base < seqs; base += 32) {
        int runs = 0, per = 1;
        if (base + lane < seqs) {
            const int len = lens[base + lane];
            const int split = split_for(len, minSplit, maxSplits);
            per = imax(1, (w + split / DEC_TT - 1) / (split / DEC_TT));
            runs = ((len + split - 1) / split + per - 1) / per;
        }
        int incl = runs;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += y;
        }
        const unsigned hit = __ballot_sync(FULL_MASK, b >= incl - runs && b < incl);
        if (hit != 0u) {
            const int src = __ffs(hit) - 1;
            per = __shfl_sync(FULL_MASK, per, src);
            s0 = (b - __shfl_sync(FULL_MASK, incl - runs, src)) * per;
            s1 = s0 + per;
            return base + src;
        }
        b -= __shfl_sync(FULL_MASK, incl, 31);
    }
    return -1;
}

// A lane's values of output row 2c + e of the block's O^T accumulators into a split's partial row op (DV floats,
// head order).
__device__ __forceinline__ void store_partial(float* __restrict__ op, const float (&o)[DV / 16][4], int e, int g) {
    // V_FRAG: a lane's outputs of a row are runs of four dimensions (vfrag_dim), stored whole, so that the
    // eight lanes of a row write 128 contiguous bytes (one value at a time, 8-bit V's stores were 4x the lines)
    if constexpr (V_FRAG8) {   // dimensions 32j + 4g .. + 3: m-tiles 2j (rows g, g + 8) and 2j + 1
#pragma unroll
        for (int j = 0; j < DV / 32; j++) {
            *(float4*) (op + 32 * j + 4 * g) = make_float4(o[2 * j][e], o[2 * j][2 + e], o[2 * j + 1][e],
                                                           o[2 * j + 1][2 + e]);
        }
    } else if constexpr (V_FRAG4) {   // dimensions 32j + 16h + 2g, + 1: m-tiles 2j and 2j + 1, row g + 8h
#pragma unroll
        for (int j = 0; j < DV / 32; j++) {
#pragma unroll
            for (int h = 0; h < 2; h++)
                *(float2*) (op + 32 * j + 16 * h + 2 * g) =
                        make_float2(o[2 * j][2 * h + e], o[2 * j + 1][2 * h + e]);
        }
    } else if constexpr (V_FRAG && VF == F_TURBO4) {
        // dimensions (DV/2)h + (DV/16)g + 4k .. + 3: m-tiles 4k .. 4k + 3
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int x = 2 * h + e;
#pragma unroll
            for (int k = 0; k < DV / 64; k++)
                *(float4*) (op + (DV / 2) * h + (DV / 16) * g + 4 * k) =
                        make_float4(o[4 * k][x], o[4 * k + 1][x], o[4 * k + 2][x], o[4 * k + 3][x]);
        }
    } else if constexpr (V_FRAG && DV == 128) {
        // dimensions 32r + 4g .. + 3, r = 2(mt & 1) + h: m-tiles 2i + (r >> 1)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int m = r >> 1, x = 2 * (r & 1) + e;
            *(float4*) (op + 32 * r + 4 * g) = make_float4(o[m][x], o[2 + m][x], o[4 + m][x], o[6 + m][x]);
        }
    } else if constexpr (V_FRAG) {   // DV 64: dimensions 16r + 2g, + 1, r = 2(mt & 1) + h: m-tiles 2i + (r >> 1)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int m = r >> 1, x = 2 * (r & 1) + e;
            *(float2*) (op + 16 * r + 2 * g) = make_float2(o[m][x], o[2 + m][x]);
        }
    } else {
#pragma unroll
        for (int mt = 0; mt < DV / 16; mt++) {
            op[perm_col<VF, DV>(mt * 16 + g)] = o[mt][e];
            op[perm_col<VF, DV>(mt * 16 + g + 8)] = o[mt][2 + e];
        }
    }
}

// Selected decode (kvant_attn_decode_sel, HBD = 1): the block reads the tokens of its kv head's selection list
// instead of [0, len): list sel[(seq * kvHeads + kvHead) * selStride + i] (i < selCounts[...]) holds ascending
// blocks of 2^selShift positions, the last one the queries' own. Tokens are numbered through the list ("list
// tokens": list token j is position sel[j >> selShift] << selShift | j & mask), the splits cut that numbering, and
// causality is applied to the positions; the merge takes the splits of the list's length. Over a list of every
// block, with the same splitTokens, the tiles, splits and sums are dense decode's: the same bits.
template <bool SEL>
__device__ __forceinline__ void decode_body(const float* __restrict__ q, const u8* __restrict__ kpool,
        const u8* __restrict__ vpool, const int* __restrict__ tables, int tableStride, const int* __restrict__ lens,
        float* __restrict__ opart, float2* __restrict__ ml, int kvHeads, int G, int nq, int pageTokens,
        i64 kPageBytes, i64 vPageBytes, int splitTokens, int maxSplits, float qscale, float sparseThreshold,
        const int* __restrict__ sel, const int* __restrict__ selCounts, int selStride, int selShift, int seqs,
        int targetBlocks, bool rotateQ) {
    using LY = DecLayout;
    constexpr int TT = DEC_TT;
    constexpr int NST = LY::NST;
    extern __shared__ __align__(16) u8 smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int headBlocks = kvHeads / HBD;
    const int hb = blockIdx.y % headBlocks, nt = blockIdx.y / headBlocks;
    // This block's sequence and its splits [s0, s1): selected decode, a block a split (x) and sequence (z); dense
    // decode, a run of consecutive splits of one sequence (dec_run).
    int seq, s0, s1;
    if (SEL || (seqs == 1 && targetBlocks >= maxSplits)) {   // (one sequence of at most targetBlocks splits)
        seq = blockIdx.z;
        s0 = blockIdx.x;
        s1 = s0 + 1;
    } else {
        seq = dec_run(lens, seqs, targetBlocks, splitTokens, maxSplits, lane, s0, s1);
        if (seq < 0) return;
    }
    const int len = lens[seq];
    const int kh = hb * HBD + warp;
    const int qstart = len - nq;
    const int heads = kvHeads * G;
    const int nRows = nq * G;
    const int row0 = nt * 8;
    // The last position any of this block's rows sees.
    const int lastRow = imin(nRows - 1, row0 + 7);
    if constexpr (!SEL) splitTokens = split_for(len, splitTokens, maxSplits);
    // The tokens of the block's splits: [t0, t1), the splits' tokens up to the end of the sequence (dense) or of the
    // list (selected) and the last position the block's rows see; splits past that end (a multi-query block's rows
    // see fewer tokens than the sequence has) write empty partials.
    int total, limit;
    const int* list = nullptr;
    if constexpr (SEL) {
        list = sel + (i64) (seq * kvHeads + kh) * selStride;
        const int count = selCounts[seq * kvHeads + kh];
        total = limit = count > 0 ? ((count - 1) << selShift) + len - (list[count - 1] << selShift) : 0;
    } else {
        total = len;
        limit = imin(len, qstart + lastRow / G + 1);
    }
    s1 = imin(s1, (total + splitTokens - 1) / splitTokens);
    if (s0 >= s1) return;
    const int t0 = s0 * splitTokens;
    const int t1 = imin(s1 * splitTokens, limit);
    // The cache position of list token tok (below t1; tiles and stages never cross a selection block).
    auto pos = [&](int tok) -> int {
        if constexpr (SEL) {
            return tok < t1 ? (list[tok >> selShift] << selShift) | (tok & ((1 << selShift) - 1)) : tok;
        } else {
            return tok;
        }
    };
    const int* table = tables + (i64) seq * tableStride;

    u8* tile = smem + LY::OFF_TILE + warp * TT * LY::TS;
    u8* qs = LY::Q_IN_TILE ? tile : smem + warp * 8 * LY::QSTR;
    const u32* lutK = (const u32*) (smem + LY::OFF_LUTK);
    const u32* lutV = (const u32*) (smem + (LY::SHARED_LUT ? LY::OFF_LUTK : LY::OFF_LUTV));
    const u32 lutKs = smem_u32(lutK), lutVs = smem_u32(lutV);

    const int ntiles = t1 > t0 ? (t1 - t0 + TT - 1) / TT : 0;
    const StageLoader<LY, HBD, TT, HBD * 32, HB_ALL != 0> loader(threadIdx.x);
    // DEC_TIGHT with bulk copies: whether tile s is one run of TT consecutive positions in one page (issue_bulk's run)
    auto runOf = [&](int s) -> bool {
        if constexpr (DEC_TIGHT && DEC_BULK) {
            const int tok = t0 + s * TT;
            if (tok + TT > t1) return false;
            const int p0 = pos(tok);
            return page_mod(p0, pageTokens) + TT <= pageTokens && (!SEL || pos(tok + TT - 1) == p0 + TT - 1);
        } else {
            return false;
        }
    };
    // The page of this thread's token in tile s (of its first token alone for a run: run = runOf(s)); tile s into its
    // stage. Both are worked out a tile ahead, so no copy waits on a page-table load.
    auto pageOf = [&](int s, bool run) -> int {
        const int tok = t0 + s * TT;
        if (run && threadIdx.x != 0) return 0;
        return loader.page(table, tok, t1, pos(tok), pageTokens);
    };
    // DEC_BULK: the stages' mbarriers, 8 bytes each (tile it waits for phase it / NST of stage it % NST's)
    const u32 bars = smem_u32(smem + LY::OFF_OFS);
    const u32 sraw = smem_u32(smem + LY::OFF_RAW);   // the raw stages, as a 32-bit shared address
    auto issue = [&](int s, int page, bool run) {
        if constexpr (DEC_BULK) {
            loader.issue_bulk(smem, sraw, s % NST, pos(t0 + s * TT), page, pageTokens, kpool, vpool, kPageBytes,
                              vPageBytes, kvHeads, hb * HBD, bars + 8 * (s % NST), run);
        } else {
            loader.issue(smem, s % NST, pos(t0 + s * TT), page, pageTokens, kpool, vpool, kPageBytes, vPageBytes,
                         kvHeads, hb * HBD);
        }
    };
    int pages[NST - 1];
    bool runs[NST - 1];
#pragma unroll
    for (int s = 0; s < NST - 1; s++) {
        runs[s] = runOf(s);
        pages[s] = pageOf(s, runs[s]);
    }
    bool runNext = runOf(NST - 1);
    int pageNext = pageOf(NST - 1, runNext);
    build_luts<LY>(smem, threadIdx.x, blockDim.x);
    // Dense decode waits for the kernel before it only here: it is launched overlapped (CudaAttention), so the work
    // above — lens, page tables, the pair tables from constants — runs while that kernel still does; the query comes
    // from it (a decode step's kvant_rope_write, which also writes the K/V rows), so its loads follow the wait
    // (KernelSource.GRID_ENTER). (Selected decode waited at its top: its lists come from the kernel before it.)
    if constexpr (!SEL) KVANT_GRID_WAIT();
    float qx[8][DK / 32];
    load_q<8>(qx, q, seq, nq, heads, G, kh, row0, lane);
    store_q<8, K_FRAG>(qs, qx, nRows - row0, qscale, lane, rotateQ);

    // Q^T as B fragments: b0/b1 of k-step ks = dims 16ks + 2c.. / +8.., row g.
    u32 qf[DK / 16][2];
#pragma unroll
    for (int ks = 0; ks < DK / 16; ks += 2) {
        u32 r[4];
        ldsm_x4(r, qs + (lane & 7) * LY::QSTR + (ks * 16 + (lane >> 3) * 8) * 2);
        qf[ks][0] = r[0];
        qf[ks][1] = r[1];
        qf[ks + 1][0] = r[2];
        qf[ks + 1][1] = r[3];
    }
    if constexpr (DEC_BULK) {
        if (threadIdx.x == 0) {
#pragma unroll
            for (int s = 0; s < NST; s++) mbar_init(bars + 8 * s, TT);
            mbar_init_fence();
        }
        __syncthreads();
    }
#pragma unroll
    for (int s = 0; s < NST - 1; s++) {
        if (s < ntiles) issue(s, pages[s], runs[s]);
        if constexpr (!DEC_BULK) cp_async_commit();
    }

    // Positions of this lane's two rows (2c, 2c+1 of the tile): a token is visible up to its row's query.
    int rowPos[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int row = row0 + 2 * c + e;
        rowPos[e] = row < nRows ? qstart + row / G : 0x7fffffff;
    }
    // The position of the block's first row (row0 < nRows): every row of the block sees the tokens up to it.
    const int firstPos = qstart + row0 / G;

    float o[DV / 16][4];
#pragma unroll
    for (int i = 0; i < DV / 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
    int biasPage = -1;   // KMEAN: the page whose q·μ bias holds
    float2 bias = make_float2(0.f, 0.f);

    // ---- partials of split sp: the lane's sums over its tokens, added across the 8 lanes of a row in a fixed tree;
    // then the running state starts again for the block's next split
    auto flush = [&](int sp) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 4);
            lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 8);
            lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 16);
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int row = row0 + 2 * c + e;
            if (row >= nRows) continue;
            const int qi = row / G, hq = kh * G + (row - qi * G);
            const i64 part = (((i64) seq * nq + qi) * heads + hq) * maxSplits + sp;
            if (g == 0) ml[part] = make_float2(mrow[e], lrow[e]);
            store_partial(opart + part * DV, o, e, g);
        }
#pragma unroll
        for (int i = 0; i < DV / 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
        mrow[0] = mrow[1] = NEG_INF;
        lrow[0] = lrow[1] = 0.f;
    };
    // The block's splits one after the other, their tiles numbered on (it: the stages stream across the splits);
    // a split past the rows' last position has none and writes an empty partial.
    const int splitTiles = splitTokens / TT;
    int it = 0;
    for (int split = s0; split < s1; split++) {
        for (const int itEnd = imin(ntiles, (split + 1 - s0) * splitTiles); it < itEnd; it++) {
            if constexpr (DEC_BULK) {
                mbar_wait(bars + 8 * (it % NST), (it / NST) & 1);
            } else {
                cp_async_wait<NST - 2>();
            }
            __syncthreads();
            {
                const int nx = it + NST - 1;
                if (nx < ntiles) issue(nx, pageNext, runNext);
                if constexpr (!DEC_BULK) cp_async_commit();
                runNext = runOf(nx + 1);
                pageNext = pageOf(nx + 1, runNext);
            }
            const int st = it % NST;
            const int tok0 = t0 + it * TT;
            const int valid = imin(TT, t1 - tok0);
            const u8* rawK = smem + LY::OFF_RAW + st * LY::STAGE;
            const u8* rawV = rawK + TT * LY::SLOTK;
            const u8* offs = smem + LY::OFF_OFS + st * TT * 2;
            // the same stage as 32-bit shared addresses: the fragment paths' row addresses are these plus lane
            // constants (the generic pointers' 64-bit sums, redone every tile under the register limit, cost ~90
            // instructions a tile)
            const u32 rawKs = sraw + st * LY::STAGE, rawVs = rawKs + TT * LY::SLOTK;
            // the offsets of token t's K and V covers in their slots
            auto kofs = [&](int t) -> int { return DEC_KAL ? 0 : offs[t * 2]; };
            auto vofs = [&](int t) -> int { return DEC_VAL ? 0 : offs[t * 2 + 1]; };

            // ---- S^T = K Q^T (16 tokens x 8 rows)
            float s[4] = {0.f, 0.f, 0.f, 0.f};
            // K_FRAG: the rows of tokens g and g + 8 (shared addresses of their norms; the codes follow)
            u32 krow0 = 0, krow1 = 0;
            if constexpr (K_FRAG) {
                krow0 = rawKs + (g * LY::SLOTK + warp * RBK) + kofs(g);
                krow1 = rawKs + ((g + 8) * LY::SLOTK + warp * RBK) + kofs(g + 8);
            }
            if constexpr (K_FRAG8) {
                // tokens g and g + 8: per 32 values j, words k of bytes 8c.. give k-steps 2j, 2j + 1 (a token past the
                // tile's end reads its zero-filled slot: zeros, its score masked below)
                constexpr int B = fmt_block8(KF);
                u32 d2[2] = {0u, 0u};
#pragma unroll
                for (int j = 0; j < DK / 32; j++) {
                    const int blk = (32 * j / B) * (B + 2), base = blk + 2 + (32 * j) % B + 8 * c;
                    if ((32 * j) % B == 0) {
                        const u32 d0 = lds_u16(krow0 + blk), d1 = lds_u16(krow1 + blk);
                        d2[0] = d0 | (d0 << 16);
                        d2[1] = d1 | (d1 << 16);
                    }
                    u32 w[2][4];
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        w[0][k] = lds_u16(krow0 + base + 2 * k);
                        w[1][k] = lds_u16(krow1 + base + 2 * k);
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        mma16816<false>(s, i8pair_to_h2(w[0][2 * h], d2[0]), i8pair_to_h2(w[1][2 * h], d2[1]),
                                        i8pair_to_h2(w[0][2 * h + 1], d2[0]), i8pair_to_h2(w[1][2 * h + 1], d2[1]),
                                        qf[2 * j + h][0], qf[2 * j + h][1]);
                    }
                }
            } else if constexpr (K_FRAG4) {
                // tokens g and g + 8: per block j (18 bytes: the scale, 16 quant bytes), words x of quant bytes 4c..
                // give k-step 2j + x, low nibbles then high (a token past the tile's end reads its zero-filled slot:
                // finite values, its score masked below)
#pragma unroll
                for (int j = 0; j < DK / 32; j++) {
                    const int blk = 18 * j, base = blk + 2 + 4 * c;
                    const u32 d0 = lds_u16(krow0 + blk), d1 = lds_u16(krow1 + blk);
                    const u32 d2a = d0 | (d0 << 16), d2b = d1 | (d1 << 16);
                    u32 w[2][2];
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        w[0][x] = lds_u16(krow0 + base + 2 * x);
                        w[1][x] = lds_u16(krow1 + base + 2 * x);
                    }
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        mma16816<false>(s, q4pair_to_h2(w[0][x] & 0x0F0Fu, d2a), q4pair_to_h2(w[1][x] & 0x0F0Fu, d2b),
                                        q4pair_to_h2((w[0][x] >> 4) & 0x0F0Fu, d2a),
                                        q4pair_to_h2((w[1][x] >> 4) & 0x0F0Fu, d2b), qf[2 * j + x][0],
                                        qf[2 * j + x][1]);
                    }
                }
            } else if constexpr (K_FRAG && KF == F_TURBO4) {
                // tokens g and g + 8: 16-bit word ks of bytes (DK/8)c.. gives k-step ks (a token past the tile's end
                // reads its zero-filled slot: finite pairs, its score masked below)
                const u32 lutL = lutKs + 4 * lane;
                u32 w[2][DK / 16];
#pragma unroll
                for (int ks = 0; ks < DK / 16; ks++) {
                    w[0][ks] = lds_u16(krow0 + 2 + (DK / 8) * c + 2 * ks);
                    w[1][ks] = lds_u16(krow1 + 2 + (DK / 8) * c + 2 * ks);
                }
#pragma unroll
                for (int ks = 0; ks < DK / 16; ks++) {
                    mma16816<false>(s, turbo4_pair(w[0][ks], 0, lutL), turbo4_pair(w[1][ks], 0, lutL),
                                    turbo4_pair(w[0][ks], 1, lutL), turbo4_pair(w[1][ks], 1, lutL), qf[ks][0],
                                    qf[ks][1]);
                }
            } else if constexpr (K_FRAG) {
                // tokens g and g + 8: 16-bit words k of low bytes (DK/16)c.. and (turbo3) high bytes (DK/16)(c & 1)..
                // give k-steps 2k, 2k + 1 (a token past the tile's end reads its zero-filled slot: finite pairs, its
                // score masked below)
                constexpr int KW = DK / 32;   // a lane's words of low bytes
                const u32 lutA = lutKs, lane4 = lane << 2;
                u32 w[2][KW][2];
#pragma unroll
                for (int k = 0; k < KW; k++) {
                    w[0][k][0] = lds_u16(krow0 + 2 + (DK / 16) * c + 2 * k);
                    w[1][k][0] = lds_u16(krow1 + 2 + (DK / 16) * c + 2 * k);
                    if constexpr (KF == F_TURBO3) {
                        w[0][k][1] = lds_u16(krow0 + 2 + DK / 4 + (DK / 16) * (c & 1) + 2 * k);
                        w[1][k][1] = lds_u16(krow1 + 2 + DK / 4 + (DK / 16) * (c & 1) + 2 * k);
                    } else {
                        w[0][k][1] = w[1][k][1] = 0u;
                    }
                }
#pragma unroll
                for (int k = 0; k < KW; k++) {
                    u32 p0[4], p1[4];
                    turbo_pairs<KF>(p0, w[0][k][0], w[0][k][1], c >> 1, lutA, lane4);
                    turbo_pairs<KF>(p1, w[1][k][0], w[1][k][1], c >> 1, lutA, lane4);
                    mma16816<false>(s, p0[0], p1[0], p0[2], p1[2], qf[2 * k][0], qf[2 * k][1]);
                    mma16816<false>(s, p0[1], p1[1], p0[3], p1[3], qf[2 * k + 1][0], qf[2 * k + 1][1]);
                }
            } else {
                const u8* kt;
                int kstride;
                if constexpr (K_DIRECT) {
                    kt = rawK + warp * RBK;
                    kstride = LY::SLOTK;
                } else {
                    dequant_tile<KF, DK, TT, LY::SLOTK, LY::TS, 32, !K_FOLD, DEC_KAL>(tile, rawK, offs, 0, warp, lutK,
                                                                                      lane, lane);
                    __syncwarp();
                    kt = tile;
                    kstride = LY::TS;
                }
                const u32 a = smem_u32(kt) + ((lane & 7) + ((lane >> 3) & 1) * 8) * kstride + (lane >> 4) * 16;
#pragma unroll
                for (int ks = 0; ks < DK / 16; ks++) {
                    u32 r[4];
                    ldsm_x4(r, a + ks * 32);
                    mma16816<K_BF16>(s, r[0], r[1], r[2], r[3], qf[ks][0], qf[ks][1]);
                }
            }
            if constexpr (K_FOLD) {   // the norms of tokens g and g + 8 (a token past the tile's end is masked below)
                float n0, n1;
                if constexpr (K_FRAG) {
                    n0 = h2f((u16) lds_u16(krow0));
                    n1 = h2f((u16) lds_u16(krow1));
                } else {
                    n0 = row_norm(rawK + g * LY::SLOTK + kofs(g) + warp * RBK);
                    n1 = row_norm(rawK + (g + 8) * LY::SLOTK + kofs(g + 8) + warp * RBK);
                }
                s[0] *= n0;
                s[1] *= n0;
                s[2] *= n1;
                s[3] *= n1;
            }
            if constexpr (KMEAN) {
                // tokens g and g + 8: the tile's 8-token halves, each in one page (pages hold multiples of 8 tokens)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (8 * e < valid) {
                        const int page = table[page_div(pos(tok0 + 8 * e), pageTokens)];
                        if (page != biasPage) {
                            biasPage = page;
                            u16* muT = (u16*) (smem + LY::OFF_MU) + warp * DK;
                            stage_mean<K_FRAG>(muT, key_mean(kpool, page, kPageBytes, pageTokens, kvHeads, kh), lane);
                            bias = key_bias_decode(qf, muT, lane);
                        }
                        s[2 * e] += bias.x;
                        s[2 * e + 1] += bias.y;
                    }
                }
            }
            // ---- online softmax over the 16 tokens (lane: tokens g, g+8; rows 2c, 2c+1)
            float p[4];
            {
                // a tile inside [t0, t1) whose last position every row sees (most tiles; a tile's positions are
                // consecutive) masks nothing: the warp skips the tests
                const int pa = pos(tok0) + g;   // the positions of list tokens tok0 + g and tok0 + g + 8
                if (!(tok0 + TT <= t1 && pos(tok0) + TT - 1 <= firstPos)) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (!(tok0 + g < t1 && pa <= rowPos[e])) s[e] = NEG_INF;
                        if (!(tok0 + g + 8 < t1 && pa + 8 <= rowPos[e])) s[2 + e] = NEG_INF;
                    }
                }
                float corr[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float mx = fmaxf(s[e], s[2 + e]);
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 4));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 8));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 16));
                    const float mnew = fmaxf(mrow[e], mx);
                    const float base = mnew == NEG_INF ? 0.f : mnew;
                    corr[e] = fast_exp2(mrow[e] - base);
                    p[e] = fast_exp2(s[e] - base);
                    p[2 + e] = fast_exp2(s[2 + e] - base);
                    lrow[e] = lrow[e] * corr[e] + (p[e] + p[2 + e]);
                    mrow[e] = mnew;
                }
                // Once the running maxima settle (most tiles of a long context) every factor is exactly 1 (2^0): the
                // warp skips the rescaling, which would leave the same bits.
                if (__any_sync(FULL_MASK, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
                    for (int i = 0; i < DV / 16; i++) {
                        o[i][0] *= corr[0];
                        o[i][2] *= corr[0];
                        o[i][1] *= corr[1];
                        o[i][3] *= corr[1];
                    }
                }
            }
            // Sparse V: probabilities under the threshold are dropped, and a tile whose every probability is then zero
            // skips its V. Off (threshold 0: the test is uniform) every tile has a visible token (t1 ends at the last
            // row's position), so the only such tiles are those whose probabilities all underflowed, and their V adds
            // zeros: not worth a vote every tile.
            if (sparseThreshold > 0.f) {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (p[e] < sparseThreshold) p[e] = 0.f;
                if (!__any_sync(FULL_MASK, p[0] != 0.f || p[1] != 0.f || p[2] != 0.f || p[3] != 0.f)) continue;
            }
            float pv[4] = {p[0], p[1], p[2], p[3]};
            if constexpr (V_FOLD) {   // tokens g and g + 8 weighted by their V rows' norms (0 past the tile's end)
                const float n0 = g < valid ? h2f((u16) lds_u16(rawVs + (g * LY::SLOTV + warp * RBV) + vofs(g))) : 0.f;
                const float n1 = g + 8 < valid
                        ? h2f((u16) lds_u16(rawVs + ((g + 8) * LY::SLOTV + warp * RBV) + vofs(g + 8))) : 0.f;
                pv[0] *= n0;
                pv[1] *= n0;
                pv[2] *= n1;
                pv[3] *= n1;
            }
            const u32 b0 = movm_t(pack2<V_BF16>(pv[0], pv[1]));
            const u32 b1 = movm_t(pack2<V_BF16>(pv[2], pv[3]));

            // ---- O^T += V^T P^T
            if constexpr (V_FRAG8) {
                // tokens 2c, 2c + 1, 2c + 8, 2c + 9: the word at 4g + 2i of 32 values j of a row holds rows g, g + 8 of
                // m-tile 2j + i; two tokens' bytes make an A register by halves, times the two tokens' scales (a token
                // past the tile's end reads its zero-filled slot: zeros times a zero probability)
                constexpr int B = fmt_block8(VF);
                u32 vrow[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int t = 2 * c + (j & 1) + 8 * (j >> 1);
                    vrow[j] = rawVs + (t * LY::SLOTV + warp * RBV) + vofs(t);
                }
                u32 dA = 0u, dB = 0u;
#pragma unroll
                for (int j = 0; j < DV / 32; j++) {
                    const int blk = (32 * j / B) * (B + 2), base = blk + 2 + (32 * j) % B + 4 * g;
                    if ((32 * j) % B == 0) {
                        dA = __byte_perm(lds_u16(vrow[0] + blk), lds_u16(vrow[1] + blk), 0x5410);
                        dB = __byte_perm(lds_u16(vrow[2] + blk), lds_u16(vrow[3] + blk), 0x5410);
                    }
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        u32 x[4];
#pragma unroll
                        for (int t = 0; t < 4; t++) x[t] = lds_u16(vrow[t] + base + 2 * i) ^ 0x64648080u;
                        mma16816<false>(o[2 * j + i], i8cross_to_h2<0>(x[0], x[1], dA),
                                        i8cross_to_h2<1>(x[0], x[1], dA), i8cross_to_h2<0>(x[2], x[3], dB),
                                        i8cross_to_h2<1>(x[2], x[3], dB), b0, b1);
                    }
                }
            } else if constexpr (V_FRAG4) {
                // tokens 2c, 2c + 1, 2c + 8, 2c + 9: byte 2g + i of block j's quants holds rows g (low nibble) and g +
                // 8 (high) of m-tile 2j + i; two tokens' bytes make an A register by halves, times the two tokens'
                // scales (a token past the tile's end reads its zero-filled slot: finite values times a zero
                // probability)
                u32 vrow[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int t = 2 * c + (j & 1) + 8 * (j >> 1);
                    vrow[j] = rawVs + (t * LY::SLOTV + warp * RBV) + vofs(t);
                }
#pragma unroll
                for (int j = 0; j < DV / 32; j++) {
                    const int blk = 18 * j, base = blk + 2 + 2 * g;
                    const u32 dA = __byte_perm(lds_u16(vrow[0] + blk), lds_u16(vrow[1] + blk), 0x5410);
                    const u32 dB = __byte_perm(lds_u16(vrow[2] + blk), lds_u16(vrow[3] + blk), 0x5410);
                    u32 x[4];
#pragma unroll
                    for (int t = 0; t < 4; t++) x[t] = lds_u16(vrow[t] + base);
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        // byte i of tokens 2c, 2c + 1 (and of 2c + 8, 2c + 9) side by side
                        const u32 ab = __byte_perm(x[0], x[1], i ? 0x51u : 0x40u);
                        const u32 cd = __byte_perm(x[2], x[3], i ? 0x51u : 0x40u);
                        mma16816<false>(o[2 * j + i], q4pair_to_h2(ab & 0x0F0Fu, dA),
                                        q4pair_to_h2((ab >> 4) & 0x0F0Fu, dA), q4pair_to_h2(cd & 0x0F0Fu, dB),
                                        q4pair_to_h2((cd >> 4) & 0x0F0Fu, dB), b0, b1);
                    }
                }
            } else if constexpr (V_FRAG) {
                // tokens 2c, 2c + 1, 2c + 8, 2c + 9; two tokens' pairs make an A register by halves (a token past the
                // tile's end reads its zero-filled slot: finite pairs times a zero probability). turbo4: 16-bit words k
                // of bytes (DV/16)g.. give the pairs (rows g, g + 8) of m-tiles 2k, 2k + 1; turbo3, turbo2: words k of
                // low bytes (DV/32)g.. and (turbo3) high bytes (DV/32)(g & 3).. those of m-tiles 4k..4k + 3.
                const u32 lutA = lutVs, lane4 = lane << 2, lutL = lutA + lane4;
                u32 vrow[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int t = 2 * c + (j & 1) + 8 * (j >> 1);
                    vrow[j] = rawVs + (t * LY::SLOTV + warp * RBV + 2) + vofs(t);
                }
                if constexpr (VF == F_TURBO4) {
                    u32 w[4][DV / 32];
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int k = 0; k < DV / 32; k++) w[j][k] = lds_u16(vrow[j] + (DV / 16) * g + 2 * k);
#pragma unroll
                    for (int k = 0; k < DV / 32; k++) {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            u32 p[4];
#pragma unroll
                            for (int j = 0; j < 4; j++) p[j] = turbo4_pair(w[j][k], h, lutL);
                            mma16816<false>(o[2 * k + h], __byte_perm(p[0], p[1], 0x5410),
                                            __byte_perm(p[0], p[1], 0x7632), __byte_perm(p[2], p[3], 0x5410),
                                            __byte_perm(p[2], p[3], 0x7632), b0, b1);
                        }
                    }
                } else {
                    constexpr int VW = DV / 64;   // a lane's words of low bytes
                    u32 w[4][VW][2];
#pragma unroll
                    for (int j = 0; j < 4; j++) {
#pragma unroll
                        for (int k = 0; k < VW; k++) {
                            w[j][k][0] = lds_u16(vrow[j] + (DV / 32) * g + 2 * k);
                            w[j][k][1] = VF == F_TURBO3 ? lds_u16(vrow[j] + DV / 4 + (DV / 32) * (g & 3) + 2 * k) : 0u;
                        }
                    }
#pragma unroll
                    for (int k = 0; k < VW; k++) {
                        u32 p[4][4];
#pragma unroll
                        for (int j = 0; j < 4; j++) turbo_pairs<VF>(p[j], w[j][k][0], w[j][k][1], g >> 2, lutA, lane4);
#pragma unroll
                        for (int i = 0; i < 4; i++) {   // pair i of a word: m-tile 4k + (0, 2, 1, 3)[i]
                            const int mt = 4 * k + ((i & 1) << 1) + (i >> 1);
                            mma16816<false>(o[mt], __byte_perm(p[0][i], p[1][i], 0x5410),
                                            __byte_perm(p[0][i], p[1][i], 0x7632),
                                            __byte_perm(p[2][i], p[3][i], 0x5410),
                                            __byte_perm(p[2][i], p[3][i], 0x7632), b0, b1);
                        }
                    }
                }
            } else {
                const u8* vt;
                int vstride;
                if constexpr (V_DIRECT) {
                    vt = rawV + warp * RBV;
                    vstride = LY::SLOTV;
                } else {
                    __syncwarp();
                    dequant_tile<VF, DV, TT, LY::SLOTV, LY::TS, 32, !V_FOLD, DEC_VAL>(tile, rawV, offs, 1, warp, lutV,
                                                                                      lane, lane);
                    __syncwarp();
                    vt = tile;
                    vstride = LY::TS;
                }
                const u32 a = smem_u32(vt) + ((lane & 7) + (lane >> 4) * 8) * vstride + ((lane >> 3) & 1) * 16;
#pragma unroll
                for (int mt = 0; mt < DV / 16; mt++) {
                    u32 r[4];
                    ldsm_x4_t(r, a + mt * 32);
                    mma16816<V_BF16>(o[mt], r[0], r[1], r[2], r[3], b0, b1);
                }
                if constexpr (!V_DIRECT) __syncwarp();
            }
        }
        flush(split);
    }
}

extern "C" __global__ void __launch_bounds__(HBD * 32, DEC_BLOCKS)
kvant_attn_decode(const float* __restrict__ q, const u8* __restrict__ kpool, const u8* __restrict__ vpool,
                  const int* __restrict__ tables, int tableStride, const int* __restrict__ lens,
                  float* __restrict__ opart, float2* __restrict__ ml, int kvHeads, int G, int nq, int pageTokens,
                  i64 kPageBytes, i64 vPageBytes, int splitTokens, int maxSplits, float qscale,
                  float sparseThreshold, int seqs, int targetBlocks, int flags) {
    // KVANT_GRID_WAIT() in decode_body, after the prologue that may come before it (KernelSource.GRID_ENTER)
    decode_body<false>(q, kpool, vpool, tables, tableStride, lens, opart, ml, kvHeads, G, nq, pageTokens, kPageBytes,
                       vPageBytes, splitTokens, maxSplits, qscale, sparseThreshold, nullptr, nullptr, 0, 0, seqs,
                       targetBlocks, !(flags & PRE_Q_ROTATED));
}

#if HBD == 1
extern "C" __global__ void __launch_bounds__(32, DEC_BLOCKS)
kvant_attn_decode_sel(const float* __restrict__ q, const u8* __restrict__ kpool, const u8* __restrict__ vpool,
                      const int* __restrict__ tables, int tableStride, const int* __restrict__ lens,
                      float* __restrict__ opart, float2* __restrict__ ml, int kvHeads, int G, int nq, int pageTokens,
                      i64 kPageBytes, i64 vPageBytes, int splitTokens, int maxSplits, float qscale,
                      float sparseThreshold, const int* __restrict__ sel, const int* __restrict__ selCounts,
                      int selStride, int selShift) {
    KVANT_GRID_WAIT();
    decode_body<true>(q, kpool, vpool, tables, tableStride, lens, opart, ml, kvHeads, G, nq, pageTokens, kPageBytes,
                      vPageBytes, splitTokens, maxSplits, qscale, sparseThreshold, sel, selCounts, selStride,
                      selShift, 0, 0, true);
}
#endif


// ---- the two prefill kernels' tile steps (kvant_attn_prefill's mma.sync loop and prefill_wg)

// The online softmax of one tile's scores (lane: rows g, g + 8; tokens 8j + 2c, +1). A masked tile first sets the
// scores a row may not see (past t1 or its position) to -inf; a tile every row of the warp sees entirely (below the
// diagonal, inside the range) needs no mask: a uniform branch around the loop, so an ordinary tile pays nothing.
// The row maxima move to the tile's, corr gets the factors that rescale what was summed before, s becomes the
// probabilities and lrow their running sums. Returns whether some probability of the lane's rows is not 0.
template <int TT>
__device__ __forceinline__ bool tile_softmax(float (&s)[TT / 8][4], bool masked, int tok0, int t1,
                                             const int (&rowPos)[2], int c, float (&mrow)[2], float (&lrow)[2],
                                             float (&corr)[2]) {
    bool any = false;
    if (masked) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
#pragma unroll
            for (int j = 0; j < TT / 8; j++) {
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int tok = tok0 + 8 * j + 2 * c + u;
                    if (!(tok < t1 && tok <= rowPos[e])) s[j][2 * e + u] = NEG_INF;
                }
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 2; e++) {
        float mx = NEG_INF;
#pragma unroll
        for (int j = 0; j < TT / 8; j++) mx = fmaxf(fmaxf(mx, s[j][2 * e]), s[j][2 * e + 1]);
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
        const float mnew = fmaxf(mrow[e], mx);
        const float base = mnew == NEG_INF ? 0.f : mnew;
        corr[e] = fast_exp2(mrow[e] - base);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < TT / 8; j++) {
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const float pv = fast_exp2(s[j][2 * e + u] - base);
                sum += pv;
                s[j][2 * e + u] = pv;
            }
        }
        lrow[e] = lrow[e] * corr[e] + sum;
        mrow[e] = mnew;
        any |= sum > 0.f;   // a sum of non-negative terms: some probability of the row is not 0
    }
    return any;
}

// Sparse V: drops the probabilities under the threshold; returns whether any of the lane's is left.
template <int TT>
__device__ __forceinline__ bool tile_sparse_v(float (&s)[TT / 8][4], float threshold) {
    bool any = false;
#pragma unroll
    for (int j = 0; j < TT / 8; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (s[j][i] < threshold) s[j][i] = 0.f;
            any |= s[j][i] != 0.f;
        }
    }
    return any;
}

// O *= the rows' factors. Once the running maxima settle (most tiles of a long prompt) both factors are exactly 1
// (2^0) in every lane: the warp skips the rescaling, which would leave the same bits.
__device__ __forceinline__ void rescale_rows(float (&o)[DV / 8][4], const float (&corr)[2]) {
    if (__any_sync(FULL_MASK, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < DV / 8; i++) {
            o[i][0] *= corr[0];
            o[i][1] *= corr[0];
            o[i][2] *= corr[1];
            o[i][3] *= corr[1];
        }
    }
}

// The probabilities as the A fragments of P V (f16, bf16 for a bf16 V).
template <int TT>
__device__ __forceinline__ void pack_probs(u32 (&pa)[TT / 16][4], const float (&s)[TT / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < TT / 16; kk++) {
        pa[kk][0] = pack2<V_BF16>(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack2<V_BF16>(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack2<V_BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack2<V_BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

// out = O / l for the lane's rows of the warp's 16 (row0..), in head order (perm_col undoes a turbo V's column order).
__device__ __forceinline__ void store_rows(const float (&o)[DV / 8][4], float (&lrow)[2], float* __restrict__ out,
                                           int row0, int nRows, int G, int kh, int heads, int g, int c) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
        lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 1);
        lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 2);
    }
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int row = row0 + g + 8 * e;
        if (row >= nRows) continue;
        const int qi = row / G, hq = kh * G + (row - qi * G);
        const float inv = 1.f / lrow[e];
        float* op = out + ((i64) qi * heads + hq) * DV;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            op[perm_col<VF, DV>(8 * j + 2 * c)] = o[j][2 * e] * inv;
            op[perm_col<VF, DV>(8 * j + 2 * c + 1)] = o[j][2 * e + 1] * inv;
        }
    }
}

// The prefill epilogue (both kernels): a warp's rows O / l written in head order through shared memory, 8 rows at a
// time (rows g, then rows g + 8 of the warp). A rotated V's rows are rotated back first, in registers: the lane's
// DV/4 values x[r] of a row (r = 2j + e: tile column 8j + 2c + e, whose head dimension is perm_col) and its quad's
// other three lanes' make the whole row, so each butterfly distance of the inverse transform is either a bit of r
// (registers) or a bit of c (a shuffle within the quad) — out_bit_src — and the transform runs in
// kvant_attn_unrotate's float operations and order (D2, distances 1, 2, ..., N/2, the scale, D1): that kernel's
// bits, without its launch and its pass over the output. Each warp then stages 8 rows of DV floats in `stage`
// (swizzled so that a store of the 32 lanes falls on distinct banks; a float pair stays together) and writes each
// row as float pairs, 256 contiguous bytes a store. (store_rows wrote 4 bytes at a time, a turbo V's to scattered
// columns: ncu put a fifth of a 4K turbo3 prefill's warp samples of prefill_wg there.)
// STAGED_OUT: the formats and sizes it takes (a rotated V of one rotation block a row); the caller's stage holds
// 8 * DV floats a warp.
constexpr bool STAGED_OUT = DV % 64 == 0 && (!fmt_rotated(VF) || rot_block(DV) == DV);
__host__ __device__ constexpr int ilog2(int n) { return n <= 1 ? 0 : 1 + ilog2(n / 2); }
// Where bit k of the head dimension of x[r] (above) comes from: >= 0 that bit of r, -1 lane bit 0 (c & 1), -2 lane
// bit 1 (c & 2). turbo3/turbo2 (perm_col): (2(c & 1) + e)·N/4 + 2j + (c >> 1); turbo4: 4j + c + e·N/2; the
// others: 8j + 2c + e.
__host__ __device__ constexpr int out_bit_src(int fmt, int n, int k) {
    return fmt == F_TURBO4 ? (k == 0 ? -1 : k == 1 ? -2 : k == ilog2(n) - 1 ? 0 : k - 1)
         : fmt_turbo(fmt) ? (k == 0 ? -2 : k == ilog2(n) - 1 ? -1 : k == ilog2(n) - 2 ? 0 : k)
         : (k == 0 ? 0 : k == 1 ? -1 : k == 2 ? -2 : k - 2);
}
// The head dimension of x[r] (above) is out_dim_a(r) + the lane's part out_dim_b(c), without a carry out of the low
// five bits, so a sign bit is bit (a & 31) + (b & 31) of word (a >> 5) + (b >> 5).
__host__ __device__ constexpr int out_dim_a(int fmt, int n, int r) {
    return fmt == F_TURBO4 ? 4 * (r >> 1) + (r & 1) * (n / 2)
         : fmt_turbo(fmt) ? (r & 1) * (n / 4) + 2 * (r >> 1)
         : 8 * (r >> 1) + (r & 1);
}
__device__ __forceinline__ int out_dim_b(int fmt, int n, int c) {
    return fmt == F_TURBO4 ? c : fmt_turbo(fmt) ? (c & 1) * (n / 2) + (c >> 1) : 2 * c;
}
__device__ __forceinline__ void store_rows_staged(const float (&o)[DV / 8][4], float (&lrow)[2],
                                                  float* __restrict__ out, float* stage, int row0, int nRows, int G,
                                                  int kh, int heads, int g, int c, int lane, bool unrotate) {
    constexpr bool ROT = fmt_rotated(VF), TURBO = fmt_turbo(VF);
    constexpr int N = rot_block(DV), NI = N == 128 ? 1 : 0, R = DV / 4;
    // (compiled for every module, called where STAGED_OUT holds: PRE_STAGED)
#pragma unroll
    for (int e = 0; e < 2; e++) {
        lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 1);
        lrow[e] += __shfl_xor_sync(FULL_MASK, lrow[e], 2);
    }
    const int b = out_dim_b(VF, N, c);
    // dimension d of staged row rr; turbo's lanes write single values, the others' float pairs (bit 0 is kept)
    auto place = [&](int rr, int d) {
        const int x = !TURBO ? 8 * rr : VF == F_TURBO4 ? 4 * rr : 4 * rr ^ (((d / (N / 2)) & 1) << 1);
        return rr * DV + (d ^ x);
    };
    // the lane's sign words: pre[i] holds the D2 bits of dimensions 32(i + (b >> 5)) .., post[i] D1's
    u32 pre[N / 32], post[N / 32];
    if constexpr (ROT) {
#pragma unroll
        for (int i = 0; i < N / 32; i++) {
            const int w = imin(i + (b >> 5), N / 32 - 1);
            pre[i] = kv_rot_sign[NI][1][w];
            post[i] = kv_rot_sign[NI][0][w];
        }
    }
    auto sign = [&](const u32 (&w)[N / 32], int r) {
        const int a = out_dim_a(VF, N, r);
        return (w[a >> 5] >> ((a & 31) + (b & 31))) & 1u;
    };
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const float inv = 1.f / lrow[e];
        float x[R];
#pragma unroll
        for (int r = 0; r < R; r++) x[r] = o[r >> 1][2 * e + (r & 1)] * inv;
        if (ROT && unrotate) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (sign(pre, r)) x[r] = -x[r];
            }
#pragma unroll
            for (int k = 0; k < ilog2(N); k++) {
                const int src = out_bit_src(VF, N, k);
                if (src < 0) {
                    const int m = -src;   // lane bit 0 or 1 of c
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const float y = __shfl_xor_sync(FULL_MASK, x[r], m);
                        x[r] = (c & m) ? __fsub_rn(y, x[r]) : __fadd_rn(x[r], y);
                    }
                } else {
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        if (!(r & (1 << src))) {
                            const float lo = x[r], hi = x[r | (1 << src)];
                            x[r] = __fadd_rn(lo, hi);
                            x[r | (1 << src)] = __fsub_rn(lo, hi);
                        }
                    }
                }
            }
            const float sc = kv_rot_scale[NI];
#pragma unroll
            for (int r = 0; r < R; r++) x[r] = __fmul_rn(x[r], sign(post, r) ? -sc : sc);
        }
        if constexpr (TURBO) {
#pragma unroll
            for (int r = 0; r < R; r++) stage[place(g, out_dim_a(VF, N, r) + b)] = x[r];
        } else {
#pragma unroll
            for (int j = 0; j < R / 2; j++) {
                *(float2*) (stage + place(g, 8 * j + b)) = make_float2(x[2 * j], x[2 * j + 1]);
            }
        }
        __syncwarp();
#pragma unroll
        for (int rr = 0; rr < 8; rr++) {
            const int row = row0 + 8 * e + rr;
            if (row < nRows) {
                const int qi = row / G, hq = kh * G + (row - qi * G);
                float* op = out + ((i64) qi * heads + hq) * DV;
#pragma unroll
                for (int h = 0; h < DV / 64; h++) {
                    const int d = 64 * h + 2 * lane;
                    *(float2*) (op + d) = *(const float2*) (stage + place(rr, d));
                }
            }
        }
        __syncwarp();
    }
}

// ---- prefill on Hopper's warpgroup tensor cores (wgmma, sm_90a: the module is compiled for sm_90a on a 9.0 device)
//
// Compiled where NVRTC targets sm_90a (__CUDA_ARCH_FEAT_SM90_ALL) for K and V rows of 64 or 128 values (one size), of
// any formats: kvant_attn_prefill then runs prefill_wg below instead of its mma.sync tile loop; other head sizes and
// architectures keep that loop. Same grid, block (8 warps = 2 warpgroups of 64 query rows, plus two producer warpgroups
// where the rows are dequantized) and row order as it: warp w owns rows 16w..16w+15 of the block's 128, lane (g, c)
// rows g and g + 8 of those, so the softmax and output code is the same. The products give mma.sync's sums (with
// 64-token tiles this kernel gave the loop's bits exactly); its tiles are of 128 tokens where their stages fit (WG_TT),
// so the running maximum moves every 128 tokens instead of 64 and the bits differ from the loop's within rounding
// (measured on an H200: 128 tokens +5% at 32K over 64).
// Shared-memory operands in wgmma's 128-byte swizzled layout: a tile of R rows (query rows, or tokens) x D values is
// cut into blocks of 64 values (128 bytes a row, R·128 bytes a block); in a block, row r sits at (r/8)·1024 +
// (r%8)·128 and its 16-byte chunk u (values 8u..8u+7) at chunk u ^ (r % 8) of that row (the XOR spreads rows over
// the banks: the plain layout of 8-row core matrices ran this kernel 1.33x slower at 32K). One layout serves three
// operands: Q (A, K-major) and K (B, K-major): 8-row groups 1024 bytes apart, a k16 step 32 bytes into the row;
// V (B with the transpose bit, its rows the k dimension): 8-token groups 1024 bytes apart, the next 64 values
// R·128 bytes on. Tiles start on 1024 bytes (the swizzle is of address bits).
// Pipeline: NST stages of TT tokens (K and V) in a ring, each with two mbarriers: full (every thread's copies of
// the stage landed: cp.async arrives for it when they do) and empty (every thread is done with the stage). A
// warpgroup waits for its S = Q K^T (DK / 16 k-steps), does the softmax in registers and waits for O += P V (P as
// register A fragments) before its next tile (left running into it, ptxas serialized the products anyway: C7515,
// its accumulators being reassigned in between). The two warpgroups take turns on the tensor cores (named
// barriers, below), so one's softmax runs while the other's products do: +8% at 32K.
// f16/bf16 rows (WG_DEQ false): the stages are the operand tiles. Each thread issues its share of the copies
// NST - 2 tiles ahead (a tile, 64 KB, covers the memory latency; the stage it refills was released a tile before),
// after waiting for that stage to be empty; a stage is empty once both warpgroups' products over it are done.
// Quantized rows, K or V (WG_DEQ): two more warpgroups, the producers (wgq_producer: one for K, one for V), copy the
// raw rows into their parts of the stage ring and dequantize each tile into one of two f16 tile pairs (K, V) in that
// layout (a row of f16 or bf16 beside a quantized one is copied as it is) while the two computing warpgroups run their
// products and softmax on the pair before (turbo3 with the dequantization on the computing warpgroups' own path,
// between their products, ran at 0.74x of f16 at 32K; with one producer for both, 0.86x; with two, 0.93x). The f16 tile
// pairs take 128 KB at 128 tokens: where the raw stages of 128 tokens then fit fewer than three times (8-bit rows,
// turbo4 with its 32 KB pair table), the tiles are of 64 tokens. Four mbarriers a pair: ready (K, V: its producer's 128
// threads wrote it and fenced the async proxy) and freed (K after both computing warpgroups' S, V after their P V), so
// a pair is rewritten only when both are done with it. The producers need few registers and the others many: setmaxnreg
// moves them (4 x 128 at entry = 2 x 56 + 2 x 200; a request the register file cannot meet hangs the kernel, so the sum
// is checked below).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && DK == DV && (DK == 64 || DK == 128)
#define KVANT_WGMMA 1
#else
#define KVANT_WGMMA 0
#endif
constexpr bool PRE_WG = KVANT_WGMMA;
constexpr bool WG_DEQ = !(fmt_direct(KF) && fmt_direct(VF));   // (centered keys are quantized: PageMeanFormat)
// A raw stage's slot of a quantized row: the row from the 16-byte word that holds its first byte. Pages start on 16
// bytes (multiples of 8 tokens of even row bytes), so a row starts at a multiple of gcd(rb, 16) past a word.
__host__ __device__ constexpr int wg_slot(int rb) { return round16(rb + 16 - imin(rb & -rb, 16)); }
constexpr int WG_Q_BYTES = 128 * DK * 2;
constexpr int WG_SLOTK = wg_slot(RBK), WG_SLOTV = wg_slot(RBV);
constexpr bool WG_SHARED_LUT = VF == KF;
constexpr int WG_LUT_BYTES = WG_DEQ ? lut_bytes(KF, false) + (WG_SHARED_LUT ? 0 : lut_bytes(VF, false)) : 0;
// The layout for tiles of tt tokens: Q, then (WG_DEQ) two K tiles, two V tiles and the pair tables, then the
// stages, then the barriers (up to 1024 + 128 bytes with the alignment).
__host__ __device__ constexpr int wg_off_stages(int tt) {
    return WG_Q_BYTES + (WG_DEQ ? 2 * tt * (DK + DV) * 2 : 0) + round16(WG_LUT_BYTES);
}
__host__ __device__ constexpr int wg_stage(int tt) { return WG_DEQ ? tt * (WG_SLOTK + WG_SLOTV) : tt * (DK + DV) * 2; }
__host__ __device__ constexpr int wg_stages(int tt) {
    return WG_DEQ ? imin(4, (227 * 1024 - 1024 - 128 - wg_off_stages(tt)) / wg_stage(tt)) : 3;
}
constexpr int WG_TT = wg_stages(128) >= 3 ? 128 : 64;
constexpr int WG_KT = WG_TT * DK * 2;   // an f16 K tile
constexpr int WG_VT = WG_TT * DV * 2;
constexpr int WG_OFF_TILES = WG_Q_BYTES;
constexpr int WG_OFF_LUT = WG_OFF_TILES + (WG_DEQ ? 2 * (WG_KT + WG_VT) : 0);
constexpr int WG_OFF_STAGES = wg_off_stages(WG_TT);
constexpr int WG_STAGE = wg_stage(WG_TT);
constexpr int WG_NST = wg_stages(WG_TT);
// f16/bf16: full[NST], empty[NST]; turbo: full[K|V][NST], ready[K|V][2], freed[K|V][2]
constexpr int WG_NBARS = 2 * WG_NST + (WG_DEQ ? 8 : 0);
constexpr int WG_BARS = WG_OFF_STAGES + WG_NST * WG_STAGE;
constexpr int WG_TOTAL = WG_BARS + 8 * WG_NBARS + 1024;   // + the alignment of the tiles
// WG_DEQ: two more warpgroups, the producers (K, V), copy and dequantize; they give registers to the two that
// compute (setmaxnreg: 4 x 128 at entry = 2 x 56 + 2 x 200)
constexpr int WG_THREADS = WG_DEQ ? 512 : 256;
constexpr int WG_PRODUCER_REGS = 56, WG_CONSUMER_REGS = 200;
static_assert(!WG_DEQ || 2 * WG_PRODUCER_REGS + 2 * WG_CONSUMER_REGS <= 4 * ((65536 / WG_THREADS) & ~7),
              "setmaxnreg asks for more registers than the block's entry count frees");
static_assert(!PRE_WG || (WG_NST >= (WG_DEQ ? 2 : 3) && WG_TOTAL <= 227 * 1024),
              "prefill_wg's tiles do not fit in shared memory");

#if KVANT_WGMMA
typedef unsigned long long u64;

// A shared-memory matrix descriptor, 128-byte swizzle: start, leading and stride byte offsets in 16-byte units.
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64) ((addr & 0x3FFFF) >> 4) | ((u64) (lbo >> 4) << 16) | ((u64) (sbo >> 4) << 32) | (1ull << 62);
}
// A descriptor's start moved on by bytes (a compile-time offset within the tile: the 14-bit start field, shared
// memory being under 256 KB, cannot carry into the next field).
__device__ __forceinline__ constexpr u64 wg_step(u32 bytes) { return bytes >> 4; }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Pins registers an asynchronous product reads or writes, at a wgmma.fence or wait: the compiler does not know the
// product is there, and could otherwise move their reads above the wait that ends it (accumulators) or their
// writes (the softmax's, the rescale's, P's packing) below the fence that starts it.
template <int N>
__device__ __forceinline__ void wg_pin(float (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
    }
}
template <int N>
__device__ __forceinline__ void wg_pin(u32 (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[i][e])::"memory");
    }
}
// 16 bytes from global memory, or (bytes = 0) 16 zero bytes.
__device__ __forceinline__ void cp_async16_zfill(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
// An arrival on bar once this thread's cp.async copies so far have landed (counted in the barrier's arrivals).
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// The wgmma products, for operand type TY ("f16" or "bf16"), with the caller's d[N][4] as accumulators (N = 8:
// n64, N = 16: n128): S = Q K^T with A and B in shared memory, both K-major; P V with A (P) in registers and B (V)
// under the transpose bit.
#define WG_D32 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
    "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
    "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
    "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
#define WG_D64 \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), \
    "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), \
    "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), \
    "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
    "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), \
    "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), \
    "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), \
    "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), \
    "+f"(d[15][3])
#define WG_R32 \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define WG_R64 \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define WG_SS128(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WG_R64 "}, " \
                 "%64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : WG_D64 : "l"(descA), "l"(descB), "r"(scaleD))
#define WG_SS64(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" WG_R32 "}, " \
                 "%32, %33, p, 1, 1, 0, 0;\n}\n" \
                 : WG_D32 : "l"(descA), "l"(descB), "r"(scaleD))
#define WG_RS64(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" WG_R32 "}, " \
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n" \
                 : WG_D32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(descB), "r"(scaleD))
#define WG_RS128(TY) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" WG_R64 "}, " \
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n" \
                 : WG_D64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(descB), "r"(scaleD))

template <bool BF>
__device__ __forceinline__ void wg_rs64(float (&d)[8][4], const u32 (&a)[4], u64 descB, int scaleD) {
    if constexpr (BF) {
        WG_RS64("bf16");
    } else {
        WG_RS64("f16");
    }
}
// S = Q K^T step of a tile of 64 or 128 tokens (n = tokens: s[TT / 8][4]).
template <bool BF>
__device__ __forceinline__ void wg_ss(float (&d)[16][4], u64 descA, u64 descB, int scaleD) {
    if constexpr (BF) {
        WG_SS128("bf16");
    } else {
        WG_SS128("f16");
    }
}
template <bool BF>
__device__ __forceinline__ void wg_ss(float (&d)[8][4], u64 descA, u64 descB, int scaleD) {
    if constexpr (BF) {
        WG_SS64("bf16");
    } else {
        WG_SS64("f16");
    }
}
template <bool BF>
__device__ __forceinline__ void wg_rs128(float (&d)[16][4], const u32 (&a)[4], u64 descB, int scaleD) {
    if constexpr (BF) {
        WG_RS128("bf16");
    } else {
        WG_RS128("f16");
    }
}

// The byte offset of 16-byte chunk u (values 8u..8u+7) of row r in a tile of R rows (the layout above).
template <int R>
__device__ __forceinline__ int wg_chunk(int r, int u) {
    return (u >> 3) * R * 128 + (r >> 3) * 1024 + (r & 7) * 128 + (((u & 7) ^ (r & 7)) << 4);
}

// O += P V step with P as register fragments: m64 n DV k16.
template <bool BF>
__device__ __forceinline__ void wg_pv(float (&o)[DV / 8][4], const u32 (&a)[4], u64 descB) {
    if constexpr (DV == 128) {
        wg_rs128<BF>(o, a, descB, 1);
    } else {
        wg_rs64<BF>(o, a, descB, 1);
    }
}

constexpr int WG_CH = DK / 8;               // 16-byte chunks of a K (or V) row
constexpr int WG_RPK = 256 / WG_CH;         // tokens one round of the block's 256 threads' copies covers
constexpr int WG_CHUNKS = WG_TT / WG_RPK;   // rounds a tile: the copies of a K (or V) tile a thread issues
static_assert(!PRE_WG || (WG_RPK % 8 == 0 && WG_TT % WG_RPK == 0), "prefill_wg's copy rounds");

// Where this thread's copies of the tile from tok0 read: chunk tid % CH of tokens tok0 + tid / CH + RPK·k (so eight
// lanes read 128 contiguous bytes of a row), as byte offsets into a pool — K's and V's pages are the same size on
// this path (f16/bf16 rows, DK == DV), so one offset serves both; a bit k set for each token before t1 (the others
// are zero-filled). Computed a tile ahead: the page-table reads land while the tile before is worked on.
__device__ __forceinline__ u32 wg_sources(i64 (&off)[WG_CHUNKS], const int* __restrict__ table, int tok0, int t1,
                                          int pageTokens, i64 pageBytes, int kvHeads, int kh, int tid) {
    const int t0 = tid / WG_CH, j = tid % WG_CH;
    u32 in = 0;
#pragma unroll
    for (int k = 0; k < WG_CHUNKS; k++) {
        const int tok = tok0 + t0 + WG_RPK * k;
        off[k] = 0;
        if (tok < t1) {
            in |= 1u << k;
            off[k] = (i64) table[page_div(tok, pageTokens)] * pageBytes
                     + (u32) ((page_mod(tok, pageTokens) * kvHeads + kh) * (DK * 2) + j * 16);
        }
    }
    return in;
}

// Issues this thread's copies of a tile (wg_sources' chunks) from pool into the swizzled tile at dst: chunk k lands
// in row t0 + RPK·k, RPK·128·k bytes past chunk 0 (RPK a multiple of 8 keeps the row's swizzle).
__device__ __forceinline__ void wg_copy(u32 dst, const u8* __restrict__ pool, const i64 (&off)[WG_CHUNKS], u32 in,
                                        int tid) {
    const u32 d0 = dst + wg_chunk<WG_TT>(tid / WG_CH, tid % WG_CH);
#pragma unroll
    for (int k = 0; k < WG_CHUNKS; k++) {
        const bool got = (in >> k) & 1u;
        cp_async16_zfill(d0 + k * WG_RPK * 128, got ? pool + off[k] : pool, got ? 16 : 0);
    }
}

// Issues the copy of one raw turbo row (RB bytes, kv head kh) at page position pos of page page (page < 0: a token
// at or past t1) into its slot of SLOT bytes at dst: the 16-byte words that cover the row, from the one that holds
// its first byte, and the rest of the slot (or all of it, past t1) zero-filled — never reading past a word the row
// touches; zeros decode to finite values that a masked score or a zero norm cancels.
template <int RB, int SLOT>
__device__ __forceinline__ void wgq_copy(u32 dst, const u8* __restrict__ pool, int page, int pos, i64 pageBytes,
                                         int kvHeads, int kh) {
    const u8* src = pool;
    int words = 0;
    if (page >= 0) {
        const u32 start = (u32) ((pos * kvHeads + kh) * RB);
        words = (int) (((start & 15u) + RB + 15) >> 4);
        src = pool + (i64) page * pageBytes + (start & ~15u);
    }
#pragma unroll
    for (int w = 0; w < SLOT / 16; w++) {
        const bool got = w < words;
        cp_async16_zfill(dst + w * 16, got ? src + w * 16 : pool, got ? 16 : 0);
    }
}

__device__ __forceinline__ void sts128(u32 a, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

// The page mean of page (kv head kh) in the tile columns 8grp..8grp+7, as the f16 pairs of the dequantized group's
// words (page < 0: zeros). turbo3 and turbo2: column 8gl + e of a rotation block holds dimension 2gl + (e >> 2) +
// (e & 3)·N/4 (perm_col), so four 32-bit loads (dimensions 2gl + jN/4 and the one after) give the eight values; the
// formats in head order, one 16-byte load; turbo4, two 8-byte loads.
template <int D>
__device__ __forceinline__ uint4 wg_mean_cols(const u8* __restrict__ kpool, int page, i64 kPageBytes, int pageTokens,
                                              int kvHeads, int kh, int grp) {
    if (page < 0) return make_uint4(0u, 0u, 0u, 0u);
    const u16* mu = key_mean(kpool, page, kPageBytes, pageTokens, kvHeads, kh);
    if constexpr (KF == F_TURBO3 || KF == F_TURBO2) {
        constexpr int N = rot_block(D), GPB = N / 8;
        mu += (grp / GPB) * N + 2 * (grp % GPB);
        u32 w[4];
#pragma unroll
        for (int j = 0; j < 4; j++) w[j] = __ldg((const unsigned int*) (mu + j * (N / 4)));
        return make_uint4(__byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410),
                          __byte_perm(w[0], w[1], 0x7632), __byte_perm(w[2], w[3], 0x7632));
    } else if constexpr (!fmt_turbo(KF)) {
        return __ldg((const uint4*) (mu + 8 * grp));   // a head's means start on 16 bytes (key_mean)
    } else {   // turbo4: column 8gl + e holds dimension 4gl + (e >> 1) + (e & 1)·N/2, pairs from two 8-byte loads
        constexpr int N = rot_block(D), GPB = N / 8;
        mu += (grp / GPB) * N + 4 * (grp % GPB);
        const uint2 a = __ldg((const uint2*) mu), b = __ldg((const uint2*) (mu + N / 2));
        return make_uint4(__byte_perm(a.x, b.x, 0x5410), __byte_perm(a.x, b.x, 0x7632),
                          __byte_perm(a.y, b.y, 0x5410), __byte_perm(a.y, b.y, 0x7632));
    }
}

// Centered keys (KMEAN): a K producer thread's page mean, for the 8 tile columns of its group — the page's index in
// the sequence's table (-1: none yet, or past the range: zeros) and the f16 pairs of those columns.
struct WgMean {
    int index;
    uint4 mu;
};
// Where a K producer finds the page means.
struct WgMeanSource {
    const u8* pool;
    const int* table;
    i64 pageBytes;
    int pageTokens, kvHeads, kh, t1;

    __device__ __forceinline__ int index(int tok) const { return tok < t1 ? page_div(tok, pageTokens) : -1; }
};

// A producer's group grp (8 values, tile columns 8grp..8grp+7) of the raw row at shared address row, in two steps as
// dq_turbo_words/dq_turbo_pairs for every format: the loads (wg_words: the scale or norm, and the code words), then
// the f16 pairs (wg_pairs) — the loop's dequantization (dq_group; an f16 or bf16 value copied), or with ADD each
// pair value + the caller's pair in one rounding (a centered key's page mean).
struct WgWords {
    u32 s;      // turbo: the norm; 8-bit and 4-bit: the scale (fp16 bits)
    u32 w[4];   // turbo: TurboWords' lo, hi; f16/bf16: the 16 bytes; 8-bit, 4-bit: four 16-bit words of codes
};
__device__ __forceinline__ uint4 lds128(u32 a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
template <int FMT, int D>
__device__ __forceinline__ WgWords wg_words(u32 row, int grp) {
    WgWords x;
    if constexpr (fmt_turbo(FMT)) {
        const TurboWords t = dq_turbo_words<FMT, D, true>(row, grp);
        x.s = t.g;
        x.w[0] = t.lo;
        x.w[1] = t.hi;
        x.w[2] = x.w[3] = 0u;
    } else if constexpr (fmt_direct(FMT)) {
        const uint4 v = lds128(row + 16 * grp);   // rows of 2·D bytes: a slot's row starts on 16 bytes
        x.s = 0u;
        x.w[0] = v.x;
        x.w[1] = v.y;
        x.w[2] = v.z;
        x.w[3] = v.w;
    } else {
        // 8-bit: block grp / GPB (scale, B codes), its values 8(grp % GPB)..; 4-bit: block grp / 4 (scale, 16 bytes
        // of code pairs), the low (grp % 4 < 2) or high nibbles of bytes 8(grp % 2)..
        constexpr int B = fmt_8bit(FMT) ? fmt_block8(FMT) : 32, GPB = B / 8;
        constexpr int BB = fmt_8bit(FMT) ? B + 2 : 18;
        const u32 blk = row + (grp / GPB) * BB;
        const u32 p = blk + 2 + 8 * (fmt_8bit(FMT) ? grp % GPB : grp & 1);
        x.s = lds_u16(blk);
#pragma unroll
        for (int k = 0; k < 4; k++) x.w[k] = lds_u16(p + 2 * k);
    }
    return x;
}
template <int FMT, int D, bool ADD>
__device__ __forceinline__ uint4 wg_pairs(const WgWords& x, int grp, u32 lut, uint4 add) {
    if constexpr (fmt_turbo(FMT)) {
        const TurboWords t{x.s, x.w[0], x.w[1]};
        return dq_turbo_pairs<FMT, D, true, ADD>(t, grp, lut, add);
    } else {
        const u32 d2 = x.s | (x.s << 16);
        const u32 a[4] = {add.x, add.y, add.z, add.w};
        u32 r[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if constexpr (fmt_direct(FMT)) {
                static_assert(!ADD, "f16 and bf16 keys are not centered");
                r[k] = x.w[k];
            } else {
                const u32 v = fmt_8bit(FMT) ? i8pair_ints(x.w[k]) : q4pair_ints((x.w[k] >> ((grp & 2) * 2)) & 0x0F0Fu);
                r[k] = ADD ? hfma2(v, d2, a[k]) : hmul2(v, d2);
            }
        }
        return make_uint4(r[0], r[1], r[2], r[3]);
    }
}

// Dequantizes the WG_TT tokens of a raw stage (slots of SLOT bytes from raw) into the swizzled f16 tile at dst, by
// a producer warpgroup's 128 threads (t128): thread t128 takes group t128 % G of tokens t0, t0 + TSTEP, ...
// (16-byte stores: 8 lanes fill the 8 chunks of one 128-byte row, conflict-free). A row starts (wg_slot) at
// ((page position · kvHeads + kh) · RB) mod 16 into its slot, which depends on the page position mod 8 alone (pages
// are multiples of 8 tokens, RB is even), and that is t0 mod 8 for all of a thread's tokens (tiles start on
// multiples of 64 tokens, TSTEP is a multiple of 8): one offset a thread, and every address a base plus a constant.
// The loads of BATCH rows go first, then their lookups, then the stores (ptxas keeps a load after any earlier shared
// store).
// lut: the lane's copy of the pair table.
// MEAN (centered keys): each row gets its page's mean added (value·norm + μ, one fma: the tile holds the key, so the
// products need no bias; the mma.sync loop adds q·μ to the scores instead, and the two differ within the tile's f16
// rounding), read (wg_mean_cols) when a row's page is not the one before. A token's page is the same for the threads
// of a warp (pages of a multiple of 8 tokens, t0 < 8 where D is 128), so the branch is uniform. (Read a tile ahead
// into L1, prefetch.global.L1, the means measured the same.)
template <int FMT, int D, int SLOT, bool MEAN = false>
__device__ __forceinline__ void wgq_dequant(u32 dst, u32 raw, u32 lut, int t128, int kvHeads, int kh, int tok0 = 0,
                                            const WgMeanSource* ms = nullptr, WgMean* cur = nullptr) {
    constexpr int RB = fmt_row_bytes(FMT, D);
    constexpr int G = D / 8, TSTEP = 128 / G, ROWS = WG_TT / TSTEP, BATCH = imin(4, ROWS);
    static_assert(TSTEP % 8 == 0 && ROWS % BATCH == 0, "a thread's tokens share their place mod 8");
    const int grp = t128 % G, t0 = t128 / G;
    const u32 off = (u32) (((t0 & 7) * kvHeads + kh) * RB) & 15u;
    const u32 src = raw + t0 * SLOT + off, d0 = dst + wg_chunk<WG_TT>(t0, grp);
#pragma unroll
    for (int k0 = 0; k0 < ROWS; k0 += BATCH) {
        WgWords w[BATCH];
#pragma unroll
        for (int k = 0; k < BATCH; k++) w[k] = wg_words<FMT, D>(src + (k0 + k) * TSTEP * SLOT, grp);
        uint4 v[BATCH];
#pragma unroll
        for (int k = 0; k < BATCH; k++) {
            if constexpr (MEAN) {
                const int index = ms->index(tok0 + t0 + (k0 + k) * TSTEP);
                if (index != cur->index) {
                    cur->index = index;
                    cur->mu = wg_mean_cols<D>(ms->pool, index < 0 ? -1 : ms->table[index], ms->pageBytes,
                                              ms->pageTokens, ms->kvHeads, ms->kh, grp);
                }
                v[k] = wg_pairs<FMT, D, true>(w[k], grp, lut, cur->mu);
            } else {
                v[k] = wg_pairs<FMT, D, false>(w[k], grp, lut, make_uint4(0u, 0u, 0u, 0u));
            }
        }
#pragma unroll
        for (int k = 0; k < BATCH; k++) sts128(d0 + (k0 + k) * (TSTEP / 8) * 1024, v[k]);
    }
}

// A producer warpgroup of a dequantizing prefill: V = 0 (warps 8..11) for the K rows, V = 1 (warps 12..15) for the
// V rows. Both build the pair tables together (named barrier 6), then each, for each tile, copies its raw rows
// NST - 1 tiles ahead into its part of the stage ring (one row a thread, threads past a 64-token tile's rows none;
// its own full[V][stage] barriers) and dequantizes the
// tile's rows into tile pair x % 2 once the computing warpgroups are done with what it held (freed: tile x - 2's
// products), announcing it (ready) after fence.proxy.async. A stage part is refilled after all the producer's
// threads dequantized what it held (named barrier 3 + 2V at the top of each tile).
template <int V>
__device__ __forceinline__ void wgq_producer(u8* aligned, u32 base, const u8* __restrict__ pool,
                                             const int* __restrict__ table, int t1, int ntiles, int pageTokens,
                                             i64 pageBytes, int kvHeads, int kh, int t128, int t256) {
    constexpr int TT = WG_TT, NST = WG_NST;
    constexpr int F = V ? VF : KF, D = V ? DV : DK, RB = V ? RBV : RBK, SLOT = V ? WG_SLOTV : WG_SLOTK;
    const u32 sa = base + WG_OFF_STAGES + (V ? TT * WG_SLOTK : 0), bars = base + WG_BARS;
    const u32 tile0 = base + WG_OFF_TILES + (V ? 2 * WG_KT : 0);
    constexpr int TILE = V ? WG_VT : WG_KT;
    const u32 lut = base + WG_OFF_LUT + (V && !WG_SHARED_LUT ? lut_bytes(KF, false) : 0) + (t128 & 31) * 4;
    auto full = [&](int st) { return bars + 8 * (V * NST + st); };
    const u32 ready0 = bars + 8 * (2 * NST + V * 2), freed0 = bars + 8 * (2 * NST + 4 + V * 2);
    // this thread's token of tile x: its page (-1 at or past t1), read a tile before its copy is issued so that the
    // table's latency is not on the producer's path
    auto page_of = [&](int x) {
        const int tok = x * TT + t128;
        return t128 < TT && tok < t1 ? table[page_div(tok, pageTokens)] : -1;
    };
    auto copy = [&](int x, int page) {
        if (t128 < TT)
            wgq_copy<RB, SLOT>(sa + (x % NST) * WG_STAGE + t128 * SLOT, pool, page,
                               page_mod(x * TT + t128, pageTokens), pageBytes, kvHeads, kh);
        cp_async_arrive(full(x % NST));   // (no copies: an arrival at once)
    };
    for (int x = 0; x < NST - 1 && x < ntiles; x++) copy(x, page_of(x));
    int page = NST - 1 < ntiles ? page_of(NST - 1) : -1;
    constexpr bool MEAN = KMEAN && !V;   // centered keys: the K producer adds the page means
    const WgMeanSource ms{pool, table, pageBytes, pageTokens, kvHeads, kh, t1};
    WgMean cur{-1, make_uint4(0u, 0u, 0u, 0u)};
    if constexpr (fmt_turbo(KF)) build_pair_lut<KF, DK>((u32*) (aligned + WG_OFF_LUT), t256, 256);
    if constexpr (!WG_SHARED_LUT && fmt_turbo(VF))
        build_pair_lut<VF, DV>((u32*) (aligned + WG_OFF_LUT + lut_bytes(KF, false)), t256, 256);
    asm volatile("bar.sync 6, 256;" ::: "memory");   // the tables, by both producers
    for (int x = 0; x < ntiles; x++) {
        if (x > 0) {   // every thread of this producer done with tile x - 1's stage
            if (V) asm volatile("bar.sync 5, 128;" ::: "memory");
            else asm volatile("bar.sync 3, 128;" ::: "memory");
        }
        if (x + NST - 1 < ntiles) {
            copy(x + NST - 1, page);
            if (x + NST < ntiles) page = page_of(x + NST);
        }
        const int b = x & 1;
        mbar_wait(full(x % NST), (x / NST) & 1);
        if (x >= 2) mbar_wait(freed0 + 8 * b, ((x >> 1) - 1) & 1);
        wgq_dequant<F, D, SLOT, MEAN>(tile0 + b * TILE, sa + (x % NST) * WG_STAGE, lut, t128, kvHeads, kh, x * TT,
                                      &ms, &cur);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        mbar_arrive(ready0 + 8 * b);
    }
}

__device__ __forceinline__ void prefill_wg(const float* __restrict__ q, const u8* __restrict__ kpool,
                                           const u8* __restrict__ vpool, const int* __restrict__ table, int qstart,
                                           int nq, float* __restrict__ out, int kvHeads, int G, int pageTokens,
                                           i64 kPageBytes, i64 vPageBytes, float qscale, float sparseThreshold,
                                           int flags) {
    constexpr int TT = WG_TT, NST = WG_NST, AHEAD = WG_NST - 2;
    extern __shared__ __align__(128) u8 smem[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3, wg = warp >> 2;
    const int nRows = nq * G;
    const int rowBlocks = (nRows + 127) / 128;
    const int kh = blockIdx.y % kvHeads;
    const int rb = rowBlocks - 1 - blockIdx.y / kvHeads;
    const int heads = kvHeads * G;
    const int row0 = rb * 128 + warp * 16;
    const int lastRow = imin(nRows - 1, rb * 128 + 127);
    const int t1 = qstart + lastRow / G + 1;
    const int ntiles = (t1 + TT - 1) / TT;
    const u32 base = (smem_u32(smem) + 1023) & ~1023u;   // the swizzle is of address bits: tiles on 1024 bytes
    u8* const aligned = smem + (base - smem_u32(smem));
    u8* qs = aligned + (warp >> 2) * 64 * DK * 2;   // this warpgroup's 64 query rows
    const u32 qa = smem_u32(qs), sa = base + WG_OFF_STAGES, bars = base + WG_BARS;
    const u32 tiles = base + WG_OFF_TILES;
    const u64 dq = wg_desc(qa, 16, 1024);
    auto full = [&](int st) { return bars + 8 * st; };                              // f16/bf16
    auto empty = [&](int st) { return bars + 8 * (NST + st); };
    auto ready = [&](int v, int b) { return bars + 8 * (2 * NST + 2 * v + b); };  // turbo; v: 0 K, 1 V
    auto freed = [&](int v, int b) { return bars + 8 * (2 * NST + 4 + 2 * v + b); };
    if (tid == 0) {
        for (int st = 0; st < 2 * NST; st++) mbar_init(bars + 8 * st, WG_DEQ ? 128 : 256);   // full (and empty)
        if constexpr (WG_DEQ) {
            for (int b = 0; b < 2; b++) {
                for (int v = 0; v < 2; v++) {
                    mbar_init(ready(v, b), 128);
                    mbar_init(freed(v, b), 256);
                }
            }
        }
        mbar_init_fence();
    }
    __syncthreads();
    if constexpr (WG_DEQ) {
        if (wg >= 2) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(WG_PRODUCER_REGS));
            if (wg == 2)
                wgq_producer<0>(aligned, base, kpool, table, t1, ntiles, pageTokens, kPageBytes, kvHeads, kh,
                                tid - 256, tid - 256);
            else
                wgq_producer<1>(aligned, base, vpool, table, t1, ntiles, pageTokens, vPageBytes, kvHeads, kh,
                                tid - 384, tid - 256);
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(WG_CONSUMER_REGS));
    }

    i64 off[WG_CHUNKS];
    u32 in = 0;
    if constexpr (!WG_DEQ) {
        if (kPageBytes != vPageBytes) __trap();   // wg_sources' one offset for both
#pragma unroll
        for (int x = 0; x < AHEAD; x++) {
            if (x < ntiles) {
                in = wg_sources(off, table, x * TT, t1, pageTokens, kPageBytes, kvHeads, kh, tid);
                wg_copy(sa + x * WG_STAGE, kpool, off, in, tid);
                wg_copy(sa + x * WG_STAGE + WG_KT, vpool, off, in, tid);
                cp_async_arrive(full(x));
            }
        }
        if (AHEAD < ntiles) in = wg_sources(off, table, AHEAD * TT, t1, pageTokens, kPageBytes, kvHeads, kh, tid);
    }

    // the warp's 16 query rows, scaled (and rotated, in the tile column order, for a turbo K), as f16/bf16 in the
    // operand layout: all 16 loaded first (one memory latency for the lot: the block's products wait on this), then
    // rotated two at a time (their shuffles overlap)
    {
        float x[16][DK / 32];
        load_q<16>(x, q, 0, nq, heads, G, kh, row0, lane);
#pragma unroll
        for (int r0 = 0; r0 < 16; r0 += 2) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if constexpr (fmt_rotated(KF)) {
                    if (!(flags & PRE_Q_ROTATED) && row0 + r0 + e < nRows) wht_row<DK>(x[r0 + e], lane, false);
                }
            }
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int rr = (warp & 3) * 16 + r0 + e;
                const bool valid = row0 + r0 + e < nRows;
#pragma unroll
                for (int j = 0; j < DK / 32; j++) {
                    const int col = perm_inv<KF, DK>(32 * j + lane);
                    const float v = valid ? x[r0 + e][j] * qscale : 0.f;
                    *(u16*) (qs + wg_chunk<64>(rr, col >> 3) + (col & 7) * 2) = K_BF16 ? f2bf(v) : f2h(v);
                }
            }
        }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if constexpr (WG_DEQ) {
        asm volatile("bar.sync 4, 256;" ::: "memory");   // the two computing warpgroups; the producers run on
    } else {
        __syncthreads();
    }

    int rowPos[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int row = row0 + g + 8 * e;
        rowPos[e] = row < nRows ? qstart + row / G : -1;
    }
    const int warpFirstPos = row0 < nRows ? qstart + row0 / G : -1;
    // Turns: a warpgroup issues its products between turn_wait (named barrier 1 + wg) and turn_pass (the other's),
    // so the two alternate on the tensor cores — S0, S1, PV0, PV1, ... — and each one's softmax runs while the
    // other's products do. Warpgroup 0 goes first; warpgroup 1 skips its last pass, which nobody waits for.
    auto turn_wait = [&]() {
        if (wg == 0) asm volatile("bar.sync 1, 256;" ::: "memory");
        else asm volatile("bar.sync 2, 256;" ::: "memory");
    };
    auto turn_pass = [&]() {
        if (wg == 0) asm volatile("bar.arrive 2, 256;" ::: "memory");
        else asm volatile("bar.arrive 1, 256;" ::: "memory");
    };
    if (wg == 1) turn_pass();

    float o[DV / 8][4];
#pragma unroll
    for (int i = 0; i < DV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float s[TT / 8][4];
#pragma unroll
    for (int j = 0; j < TT / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};

    for (int it = 0; it < ntiles; it++) {
        const int st = it % NST;
        u32 kt, vt;
        if constexpr (WG_DEQ) {
            kt = tiles + (it & 1) * WG_KT;
            vt = tiles + 2 * WG_KT + (it & 1) * WG_VT;
        } else {
            const int nx = it + AHEAD, sx = nx % NST;
            if (nx < ntiles) {
                if (nx >= NST) mbar_wait(empty(sx), ((nx / NST) - 1) & 1);
                wg_copy(sa + sx * WG_STAGE, kpool, off, in, tid);
                wg_copy(sa + sx * WG_STAGE + WG_KT, vpool, off, in, tid);
                cp_async_arrive(full(sx));
                if (nx + 1 < ntiles)
                    in = wg_sources(off, table, (nx + 1) * TT, t1, pageTokens, kPageBytes, kvHeads, kh, tid);
            }
            mbar_wait(full(st), (it / NST) & 1);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            kt = sa + st * WG_STAGE;
            vt = kt + WG_KT;
        }
        const u64 dk = wg_desc(kt, 16, 1024), dv = wg_desc(vt, TT * 128, 1024);
        const int tok0 = it * TT;
        const bool next = it + 1 < ntiles;

        // ---- S = Q K^T: m64 nTT (tokens) k16, DK / 16 steps
        if constexpr (WG_DEQ) mbar_wait(ready(0, it & 1), (it >> 1) & 1);
        turn_wait();
        wg_pin(s);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < DK / 16; ks++) {
            wg_ss<K_BF16>(s, dq + wg_step((ks >> 2) * 64 * 128 + (ks & 3) * 32),
                             dk + wg_step((ks >> 2) * TT * 128 + (ks & 3) * 32), ks > 0);
        }
        wg_commit();
        turn_pass();
        wg_wait0();
        wg_pin(s);
        if constexpr (WG_DEQ) mbar_arrive(freed(0, it & 1));

        // ---- online softmax, as kvant_attn_prefill's loop
        float corr[2];
        tile_softmax<TT>(s, tok0 + TT > imin(t1, warpFirstPos + 1), tok0, t1, rowPos, c, mrow, lrow, corr);
        if (sparseThreshold > 0.f) tile_sparse_v<TT>(s, sparseThreshold);
        rescale_rows(o, corr);
        u32 pa[TT / 16][4];
        pack_probs<TT>(pa, s);
        // ---- O += P V: TT / 16 steps (k = tokens)
        if constexpr (WG_DEQ) mbar_wait(ready(1, it & 1), (it >> 1) & 1);
        turn_wait();
        wg_pin(o);
        wg_pin(pa);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < TT / 16; kk++) wg_pv<V_BF16>(o, pa[kk], dv + wg_step(kk * 2 * 1024));
        wg_commit();
        if (wg == 0 || next) turn_pass();
        wg_wait0();
        wg_pin(o);
        if constexpr (WG_DEQ) mbar_arrive(freed(1, it & 1));
        if constexpr (!WG_DEQ) mbar_arrive(empty(st));
    }

    // the warpgroup's query tile becomes its warps' output stages once all four are past their last products
    if (wg == 0) asm volatile("bar.sync 7, 128;" ::: "memory");
    else asm volatile("bar.sync 8, 128;" ::: "memory");
    store_rows_staged(o, lrow, out, (float*) qs + (warp & 3) * 8 * DV, row0, nRows, G, kh, heads, g, c, lane,
                      !(flags & PRE_OUT_ROTATED));
}
#endif

// ================================================================================================================
// kvant_attn_prefill — causal attention of nq queries at positions qstart.. over cached tokens [0, qstart + nq) of
// one sequence (the chunk's own K/V must already be written), for every query head.
//
// grid:   (1, kvHeads * ceil(nq * G / 128), 1); the row blocks run last-first, the longest (latest) queries first.
// block:  8 warps, one kv head, 128 query rows (row = query * G + head in group), 16 rows per warp: each K/V tile
//         loaded serves 128 rows (64 rows per block would double the L2 traffic per flop). Heads up to 128: two
//         blocks an SM (PRE_BLOCKS; 128 registers, 16 warps an SM), which the tensor cores need: with one block the
//         warps spent most cycles waiting on mma and shared-memory results (ncu: tensor pipe 29% busy).
// shared: Layout<1, 8, 64, 16>: Q (128 rows), pair tables, one dequant tile (K, then V), NST raw stages of 64 tokens.
// thread: FA2-style: S = Q K^T per warp 16 rows x 64 tokens (8 n-tiles x 4 f32), Q as A fragments re-read by
//         ldmatrix each k-step (kept in registers when one block an SM leaves room), K and V^T by ldmatrix(.trans)
//         from the f16 tile; P from the S accumulators as A fragments; O = P V, DV/8 n-tiles x 4 f32 per lane. The
//         eight warps dequantize the shared tile together, so each compressed row is decoded once per 128 query rows.
//         A tile no row masks and a run without a sparse-V threshold skip those steps by uniform branches.
// exact:  as decode. Writes out = O / l in head order, a rotated V's rows rotated back in the epilogue
//         (store_rows_staged); where that cannot be (!PRE_STAGED: a rotated V of head 256, or of head 128 beside a K of
//         head 64), kvant_attn_unrotate follows (kvant_attn_info out[9]). flags (PRE_Q_ROTATED, PRE_OUT_ROTATED) say
//         the queries come rotated and the output may stay rotated: then the kernel rotates neither (nor does
//         kvant_attn_unrotate follow); the same bits as the rotations done here.
// sm_90a: rows of one head size of 64 or 128 take prefill_wg above (same grid and rows; quantized rows or centered
//         keys: 16 warps, warps 8..15 copying and dequantizing).
// ================================================================================================================

constexpr int PRE_TT = 64;
constexpr int PRE_WARPS = 8;
constexpr int PRE_ROWS = PRE_WARPS * 16;
using PreLayout = Layout<1, PRE_WARPS, PRE_TT, 16, false, KMEAN>;
// Prefill blocks an SM: two when their shared memory fits twice and the heads are small enough for the O and S
// accumulators to fit in 128 registers beside the query fragments, which are then read from shared memory for
// each k-step instead of kept.
constexpr int PRE_BLOCKS = !PRE_WG && DK <= 128 && DV <= 128 && PreLayout::TOTAL <= 112 * 1024 ? 2 : 1;
constexpr bool PRE_Q_REGS = DK <= 128 && PRE_BLOCKS == 1;
constexpr int PRE_THREADS = PRE_WG ? WG_THREADS : PRE_WARPS * 32;
// The epilogue rotates back and stages the rows (store_rows_staged) where the format allows and the warp's 16 query
// rows (PreLayout, or prefill_wg's quarter of a warpgroup's tile) hold 8 output rows; else store_rows, and a rotated V's
// output takes kvant_attn_unrotate after the launch.
constexpr bool PRE_STAGED = STAGED_OUT && (PRE_WG || 8 * DV * 4 <= 16 * PreLayout::QSTR);

extern "C" __global__ void __launch_bounds__(PRE_THREADS, PRE_BLOCKS)
kvant_attn_prefill(const float* __restrict__ q, const u8* __restrict__ kpool, const u8* __restrict__ vpool,
                   const int* __restrict__ table, int qstart, int nq, float* __restrict__ out, int kvHeads, int G,
                   int pageTokens, i64 kPageBytes, i64 vPageBytes, float qscale, float sparseThreshold, int flags) {
    KVANT_GRID_ENTER();
#if KVANT_WGMMA
    if constexpr (PRE_WG) {
        prefill_wg(q, kpool, vpool, table, qstart, nq, out, kvHeads, G, pageTokens, kPageBytes, vPageBytes, qscale,
                   sparseThreshold, flags);
        return;
    }
#endif
    using LY = PreLayout;
    constexpr int TT = PRE_TT;
    constexpr int NST = LY::NST;
    extern __shared__ __align__(16) u8 smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nRows = nq * G;
    const int rowBlocks = (nRows + PRE_ROWS - 1) / PRE_ROWS;
    const int kh = blockIdx.y % kvHeads;
    const int rb = rowBlocks - 1 - blockIdx.y / kvHeads;
    const int heads = kvHeads * G;
    const int row0 = rb * PRE_ROWS + warp * 16;
    const int lastRow = imin(nRows - 1, rb * PRE_ROWS + PRE_ROWS - 1);
    const int t1 = qstart + lastRow / G + 1;

    u8* qs = smem + warp * 16 * LY::QSTR;
    u8* tile = smem + LY::OFF_TILE;
    const u32* lutK = (const u32*) (smem + LY::OFF_LUTK);
    const u32* lutV = (const u32*) (smem + (LY::SHARED_LUT ? LY::OFF_LUTK : LY::OFF_LUTV));

    const int ntiles = (t1 + TT - 1) / TT;
    const StageLoader<LY, 1, TT, PRE_WARPS * 32, true> loader(threadIdx.x);
    {
        int pages[NST - 1];
#pragma unroll
        for (int s = 0; s < NST - 1; s++) pages[s] = loader.page(table, s * TT, t1, s * TT, pageTokens);
#pragma unroll
        for (int s = 0; s < NST - 1; s++) {
            if (s < ntiles)
                loader.issue(smem, s, s * TT, pages[s], pageTokens, kpool, vpool, kPageBytes, vPageBytes, kvHeads,
                             kh);
            cp_async_commit();
        }
    }
    int pageNext = loader.page(table, (NST - 1) * TT, t1, (NST - 1) * TT, pageTokens);
    build_luts<LY>(smem, threadIdx.x, blockDim.x);
    prepare_q<16>(qs, q, 0, nq, heads, G, kh, row0, qscale, lane, !(flags & PRE_Q_ROTATED));

    // shared-memory addresses (ldsm_x4): the tile loop's loads are a base and constant offsets
    const u32 sbase = smem_u32(smem);
    const u32 qa = smem_u32(qs) + ((lane & 7) + ((lane >> 3) & 1) * 8) * LY::QSTR + (lane >> 4) * 16;
    u32 qf[PRE_Q_REGS ? DK / 16 : 1][4];
    if constexpr (PRE_Q_REGS) {
#pragma unroll
        for (int ks = 0; ks < DK / 16; ks++) ldsm_x4(qf[ks], qa + ks * 32);
    }
    // the query's A fragment of k-step ks: from the registers, or (large heads) from shared memory
    auto q_frag = [&](u32 (&a)[4], int ks) {
        if constexpr (PRE_Q_REGS) {
            a[0] = qf[ks][0]; a[1] = qf[ks][1]; a[2] = qf[ks][2]; a[3] = qf[ks][3];
        } else {
            ldsm_x4(a, qa + ks * 32);
        }
    };

    int rowPos[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int row = row0 + g + 8 * e;
        rowPos[e] = row < nRows ? qstart + row / G : -1;
    }
    // The position of the warp's first row: every row of the warp sees at least the tokens up to it (a warp whose
    // rows are all past nRows has none, and masks every tile).
    const int warpFirstPos = row0 < nRows ? qstart + row0 / G : -1;

    float o[DV / 8][4];
#pragma unroll
    for (int i = 0; i < DV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
    float2 bias = make_float2(0.f, 0.f);   // KMEAN: q·μ of the current page, rows g and g + 8

    for (int it = 0; it < ntiles; it++) {
        cp_async_wait<NST - 2>();
        __syncthreads();
        {
            const int nx = it + NST - 1;
            if (nx < ntiles)
                loader.issue(smem, nx % NST, nx * TT, pageNext, pageTokens, kpool, vpool, kPageBytes, vPageBytes,
                             kvHeads, kh);
            cp_async_commit();
            pageNext = loader.page(table, (nx + 1) * TT, t1, (nx + 1) * TT, pageTokens);
        }
        const int st = it % NST;
        const int tok0 = it * TT;
        const u8* rawK = smem + LY::OFF_RAW + st * LY::STAGE;
        const u8* rawV = rawK + TT * LY::SLOTK;
        const u8* offs = smem + LY::OFF_OFS + st * TT * 2;

        constexpr int kstride = K_DIRECT ? LY::SLOTK : LY::TS;
        const u32 kt = sbase + (K_DIRECT ? LY::OFF_RAW + st * LY::STAGE : LY::OFF_TILE);
        if constexpr (!K_DIRECT) {
            dequant_tile<KF, DK, TT, LY::SLOTK, LY::TS, PRE_WARPS * 32>(tile, rawK, offs, 0, 0, lutK,
                                                                        threadIdx.x, lane);
            __syncthreads();
        }
        // ---- S = Q K^T: 16 rows x 64 tokens per warp
        float s[TT / 8][4];
#pragma unroll
        for (int j = 0; j < TT / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        {
            const u32 b = kt + ((lane & 7) + (lane >> 4) * 8) * kstride + ((lane >> 3) & 1) * 16;
#pragma unroll
            for (int ks = 0; ks < DK / 16; ks++) {
                u32 a[4];
                q_frag(a, ks);
#pragma unroll
                for (int np = 0; np < TT / 16; np++) {
                    u32 r[4];
                    ldsm_x4(r, b + np * 16 * kstride + ks * 32);
                    mma16816<K_BF16>(s[2 * np], a[0], a[1], a[2], a[3], r[0], r[1]);
                    mma16816<K_BF16>(s[2 * np + 1], a[0], a[1], a[2], a[3], r[2], r[3]);
                }
            }
        }
        if constexpr (KMEAN) {
            // chunk j = tokens 8j..8j+7 of the tile, in one page; lane: rows g (x) and g + 8 (y). next: the tile
            // offset of the next page start.
            int next = (pageTokens - tok0 % pageTokens) % pageTokens;
#pragma unroll
            for (int j = 0; j < TT / 8; j++) {
                if (tok0 + 8 * j < t1) {
                    if (8 * j == next) {   // a new page: its mean came with the stage
                        next += pageTokens;
                        u16* muT = (u16*) (smem + LY::OFF_MU) + warp * DK;
                        stage_mean<false>(muT, (const u16*) (rawK + TT * (LY::SLOTK + LY::SLOTV)) + j * DK, lane);
                        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                        for (int ks = 0; ks < DK / 16; ks++) {
                            u32 a[4];
                            q_frag(a, ks);
                            key_bias_step(d, a, muT, ks, lane);
                        }
                        bias = make_float2(d[0], d[2]);
                    }
                    s[j][0] += bias.x;
                    s[j][1] += bias.x;
                    s[j][2] += bias.y;
                    s[j][3] += bias.y;
                }
            }
        }
        // ---- online softmax (lane: rows g, g+8; tokens 8j + 2c, +1). A tile every row of the warp sees entirely
        // (below the diagonal, inside the range) needs no mask, and without a sparse-V threshold no probability is
        // dropped: both are uniform branches around their loops, so an ordinary tile pays for neither.
        float corr[2];
        bool any = tile_softmax<TT>(s, tok0 + TT > imin(t1, warpFirstPos + 1), tok0, t1, rowPos, c, mrow, lrow,
                                    corr);
        if (sparseThreshold > 0.f) any = tile_sparse_v<TT>(s, sparseThreshold);
        rescale_rows(o, corr);
        u32 pa[TT / 16][4];
        pack_probs<TT>(pa, s);
        constexpr int vstride = V_DIRECT ? LY::SLOTV : LY::TS;
        const u32 vt = sbase + (V_DIRECT ? LY::OFF_RAW + st * LY::STAGE + TT * LY::SLOTK : LY::OFF_TILE);
        if constexpr (!V_DIRECT) {
            __syncthreads();
            dequant_tile<VF, DV, TT, LY::SLOTV, LY::TS, PRE_WARPS * 32>(tile, rawV, offs, 1, 0, lutV,
                                                                        threadIdx.x, lane);
            __syncthreads();
        }
        // ---- O += P V
        if (__any_sync(FULL_MASK, any)) {
            const u32 b = vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * vstride + (lane >> 4) * 16;
#pragma unroll
            for (int kk = 0; kk < TT / 16; kk++) {
                if (!__any_sync(FULL_MASK, (pa[kk][0] | pa[kk][1] | pa[kk][2] | pa[kk][3]) != 0u)) continue;
#pragma unroll
                for (int np = 0; np < DV / 16; np++) {
                    u32 r[4];
                    ldsm_x4_t(r, b + kk * 16 * vstride + np * 32);
                    mma16816<V_BF16>(o[2 * np], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], r[0], r[1]);
                    mma16816<V_BF16>(o[2 * np + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], r[2], r[3]);
                }
            }
        }
    }

    if constexpr (PRE_STAGED) {
        store_rows_staged(o, lrow, out, (float*) qs, row0, nRows, G, kh, heads, g, c, lane,   // the warp's own Q rows
                          !(flags & PRE_OUT_ROTATED));
    } else {
        store_rows(o, lrow, out, row0, nRows, G, kh, heads, g, c);
    }
}

// ================================================================================================================
// kvant_attn_merge — out = (sum_s 2^(m_s - M) o_s) / (sum_s 2^(m_s - M) l_s), M = max m_s, over the splits of one
// decode row, then rotated back out of the V format's domain.
//
// grid:   (nq * heads, seqs); block: 1024 threads; shared: the split weights (up to MERGE_MAX_SPLITS) and a row.
// thread: M by a block max; thread t computes the weights of splits t, t + 1024, ... and their part of the
//         denominator (summed by a fixed tree; up to 32 splits, every warp sums them in the tree's first butterfly,
//         which is all of it that is not adding zeros); then thread (d, sub) = (t % DV, t / DV) sums w_s o_s[d]
//         over splits s = sub, sub + SUBS, ... in order, and the SUBS partials of d are added in sub order. Every
//         order is a function of the split count alone, so the bits do not depend on timing. kvLenFixed >= 0 gives
//         the kv length; else lens[seq]. With sel given (selected decode) the split count is that of the row's kv
//         head's list (kvant_attn_decode_sel's numbering).
// ================================================================================================================
constexpr int MERGE_THREADS = 1024;
constexpr int MERGE_SUBS = MERGE_THREADS / DV;
constexpr int MERGE_MAX_SPLITS = 4096;

// The inverse rotation of one row held in shared memory (DV floats), by the first DV threads; every thread of the
// block must call it. dev.kvant.kv.Rotation's inverse: pre-signs D2, butterflies 1..N/2, then D1 * fl(1/sqrt(N)).
// Butterflies within a warp (distances 1..16) are shuffles, the others go through the row; each value is the same
// sum or difference either way.
__device__ __forceinline__ void unrotate_row(float* row, int d) {
    constexpr int N = rot_block(DV);
    constexpr int NI = N == 128 ? 1 : 0;
    const int i = d % N;
    if (d < DV) {   // whole warps: DV % 32 == 0
        float v = row[d];
        if ((kv_rot_sign[NI][1][i >> 5] >> (i & 31)) & 1u) v = -v;
#pragma unroll
        for (int h = 1; h < 32; h <<= 1) {
            const float b = __shfl_xor_sync(FULL_MASK, v, h);
            v = (i & h) ? b - v : v + b;
        }
        row[d] = v;
    }
    __syncthreads();
    for (int h = 32; h < N; h <<= 1) {
        float a = 0.f, b = 0.f;
        if (d < DV) {
            a = row[d];
            b = row[d ^ h];
        }
        __syncthreads();
        if (d < DV) row[d] = (i & h) ? b - a : a + b;
        __syncthreads();
    }
    if (d < DV) {
        float y = row[d] * kv_rot_scale[NI];
        row[d] = ((kv_rot_sign[NI][0][i >> 5] >> (i & 31)) & 1u) ? -y : y;
    }
    __syncthreads();
}

__device__ __forceinline__ float block_reduce(float v, float* red, bool isMax) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int h = 16; h >= 1; h >>= 1) {
        const float o = __shfl_xor_sync(FULL_MASK, v, h);
        v = isMax ? fmaxf(v, o) : v + o;
    }
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int) (blockDim.x >> 5) ? red[lane] : (isMax ? NEG_INF : 0.f);
#pragma unroll
        for (int h = 16; h >= 1; h >>= 1) {
            const float o = __shfl_xor_sync(FULL_MASK, v, h);
            v = isMax ? fmaxf(v, o) : v + o;
        }
        if (lane == 0) red[32] = v;
    }
    __syncthreads();
    v = red[32];
    __syncthreads();
    return v;
}

// With outQ (and outDs) given, the row is also written as 8-bit codes for the next product: per 32 values a scale
// d = max|x|/127, codes round(x/d) into outQ, (d, d·Σcodes) into outDs — model.cu's quantize_block, value for value.
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) kvant_attn_merge(const float* __restrict__ opart,
        const float2* __restrict__ ml, float* __restrict__ out, const int* __restrict__ lens, int kvLenFixed, int nq,
        int heads, int maxSplits, int splitTokens, signed char* __restrict__ outQ, float2* __restrict__ outDs,
        const int* __restrict__ sel, const int* __restrict__ selCounts, int selStride, int selShift, int G) {
    KVANT_GRID_ENTER();
    __shared__ float w[MERGE_MAX_SPLITS];
    __shared__ float red[33];
    __shared__ float part[MERGE_THREADS];
    __shared__ float row[DV];
    const int seq = blockIdx.y;
    const int r = blockIdx.x;   // query * heads + head
    const int tid = threadIdx.x;
    int len = kvLenFixed >= 0 ? kvLenFixed : lens[seq];
    if (sel != nullptr) {   // a selected decode: the splits of the head's list
        const int kvh = (r % heads) / G;
        const int* list = sel + (i64) (seq * (heads / G) + kvh) * selStride;
        const int count = selCounts[seq * (heads / G) + kvh];
        len = count > 0 ? ((count - 1) << selShift) + len - (list[count - 1] << selShift) : 0;
    }
    if (sel == nullptr) splitTokens = split_for(len, splitTokens, maxSplits);
    const int ns = imin(imin(maxSplits, MERGE_MAX_SPLITS), (len + splitTokens - 1) / splitTokens);
    const i64 base = ((i64) seq * nq * heads + r) * maxSplits;
    const int d = tid % DV, sub = tid / DV;
    float acc = 0.f;
    float l;
    if (ns <= 32) {
        // Up to 32 splits (short sequences, every decode step of a short chat): every warp reduces the splits' (m, l)
        // itself, lane s holding split s — block_reduce's first butterfly, whose result the rest of block_reduce only
        // adds zeros (or -inf maxima) to, so the same bits — and takes a split's weight from its lane; the thread's
        // partial rows are loaded first, so their latency passes during the reductions. No barrier until part[].
        constexpr int K = (32 + MERGE_SUBS - 1) / MERGE_SUBS;
        float o[K];
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int s = sub + k * MERGE_SUBS;
            o[k] = s < ns ? opart[(base + s) * DV + d] : 0.f;
        }
        const int lane = tid & 31;
        const float2 v = lane < ns ? ml[base + lane] : make_float2(NEG_INF, 0.f);
        float m = v.y > 0.f ? fmaxf(NEG_INF, v.x) : NEG_INF;
#pragma unroll
        for (int h = 16; h >= 1; h >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, h));
        const float ws = v.y > 0.f ? exp2f(v.x - m) : 0.f;
        l = 0.f;
        l += v.y * ws;   // the form of the loop below (one fma onto zero), whose value block_reduce starts from
#pragma unroll
        for (int h = 16; h >= 1; h >>= 1) l += __shfl_xor_sync(FULL_MASK, l, h);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int s = sub + k * MERGE_SUBS;
            const float wk = __shfl_sync(FULL_MASK, ws, s & 31);
            if (s < ns && wk != 0.f) acc += o[k] * wk;
        }
    } else {
        float m = NEG_INF;
        for (int s = tid; s < ns; s += MERGE_THREADS) {
            const float2 v = ml[base + s];
            if (v.y > 0.f) m = fmaxf(m, v.x);
        }
        m = block_reduce(m, red, true);
        l = 0.f;
        for (int s = tid; s < ns; s += MERGE_THREADS) {
            const float2 v = ml[base + s];
            const float ws = v.y > 0.f ? exp2f(v.x - m) : 0.f;
            w[s] = ws;
            l += v.y * ws;
        }
        l = block_reduce(l, red, false);
#pragma unroll 4
        for (int s = sub; s < ns; s += MERGE_SUBS) {
            const float ws = w[s];
            if (ws != 0.f) acc += opart[(base + s) * DV + d] * ws;
        }
    }
    part[tid] = acc;
    __syncthreads();
    if (tid < DV) {
        float y = 0.f;
        for (int k = 0; k < MERGE_SUBS; k++) y += part[k * DV + tid];
        row[tid] = y / l;
    }
    __syncthreads();
    if constexpr (fmt_rotated(VF)) unrotate_row(row, tid);
    const i64 at = (((i64) seq * nq * heads) + r) * DV + tid;
    if (tid < DV) out[at] = row[tid];
    if (outQ != nullptr && tid < DV) {  // DV % 32 == 0: each of the first DV / 32 warps holds one block
        const float v = row[tid];
        float a = fabsf(v);
#pragma unroll
        for (int h = 16; h >= 1; h >>= 1) a = fmax_nan(a, __shfl_xor_sync(FULL_MASK, a, h));
        const float dq = a / 127.f;
        const int c = dq > 0.f ? __float2int_rn(v / dq) : 0;
        int sum = c;
#pragma unroll
        for (int h = 16; h >= 1; h >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, h);
        outQ[at] = (signed char) c;
        if ((tid & 31) == 0) outDs[at / 32] = make_float2(dq, dq * (float) sum);
    }
}

// kvant_attn_unrotate — rows of prefill output rotated back out of a rotated V format's domain, in place.
// grid: ceil(rows / (1024 / DV)); block: 1024 threads, DV per row; shared: the block's rows.
extern "C" __global__ void __launch_bounds__(MERGE_THREADS) kvant_attn_unrotate(float* __restrict__ out, i64 rows) {
    KVANT_GRID_ENTER();
    __shared__ float buf[MERGE_THREADS];
    const int tid = threadIdx.x;
    const int sub = tid / DV, d = tid % DV;
    const i64 rowIdx = (i64) blockIdx.x * MERGE_SUBS + sub;
    const bool live = rowIdx < rows;
    float* row = buf + sub * DV;
    if (live) row[d] = out[rowIdx * DV + d];
    __syncthreads();
    constexpr int N = rot_block(DV);
    constexpr int NI = N == 128 ? 1 : 0;
    const int i = d % N;
    if ((kv_rot_sign[NI][1][i >> 5] >> (i & 31)) & 1u) row[d] = -row[d];
    __syncthreads();
    for (int h = 1; h < N; h <<= 1) {
        const float a = row[d], b = row[d ^ h];
        __syncthreads();
        row[d] = (i & h) ? b - a : a + b;
        __syncthreads();
    }
    const float y = row[d] * kv_rot_scale[NI];
    if (live) out[rowIdx * DV + d] = ((kv_rot_sign[NI][0][i >> 5] >> (i & 31)) & 1u) ? -y : y;
}

// kvant_attn_info — the launch geometry the host needs, from the one place it is defined:
// out = {decode shared bytes, decode threads, decode stages, prefill shared bytes, prefill threads, prefill stages,
//        K row bytes, V row bytes, decode blocks an SM, 1 if the prefill's output needs kvant_attn_unrotate,
//        the rotation block of K (0: K is not rotated), that of V}. One thread.
extern "C" __global__ void kvant_attn_info(int* out) {
    KVANT_GRID_ENTER();
    out[0] = DecLayout::TOTAL;
    out[1] = HBD * 32;
    out[2] = DecLayout::NST;
    out[3] = PRE_WG ? WG_TOTAL : PreLayout::TOTAL;
    out[4] = PRE_THREADS;
    out[5] = PRE_WG ? WG_NST : PreLayout::NST;
    out[6] = RBK;
    out[7] = RBV;
    out[8] = DEC_BLOCKS;
    out[9] = fmt_rotated(VF) && !PRE_STAGED ? 1 : 0;
    out[10] = fmt_rotated(KF) ? rot_block(DK) : 0;
    out[11] = fmt_rotated(VF) ? rot_block(DV) : 0;
}
