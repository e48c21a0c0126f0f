package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;

import dev.kvant.select.Selection;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Arrays;
import jdk.incubator.vector.FloatVector;
import jdk.incubator.vector.IntVector;
import jdk.incubator.vector.VectorMask;
import jdk.incubator.vector.VectorOperators;
import jdk.incubator.vector.VectorShuffle;

/**
 * One thread's share of attention: the softmax partial of some queries over one partition of the cache, and the
 * merge of partials into outputs. Holds the thread's scratch (tiles, scores, accumulators), grown to the largest
 * call seen, so a call allocates nothing.
 *
 * <p>A partition is {@value CpuAttention#PARTITION} consecutive positions from a multiple of that size. For the
 * queries of one kv head (every query head of its GQA group, at one or more consecutive positions):
 * <ol>
 * <li>K tiles of {@value CpuAttention#DENSE_TILE} rows are decoded as they are loaded and scored against all the
 *     queries (one read of a row serves the whole group);</li>
 * <li>per query, over its visible rows (causal: positions up to its own): soft-cap, max m, weights exp(s - m), sum l;
 *     with sparse V, weights below T·l are dropped (see below);</li>
 * <li>V tiles of the rows some query still weights are decoded and accumulated, unnormalized.</li>
 * </ol>
 * Each step's arithmetic for one query depends only on the query, the cache and its position, never on the other
 * queries, the tile or the thread: that is what makes decode, multi-query and prefill agree bit for bit.
 *
 * <p>Sparse V: the weight a row finally gets is exp(s - M)/Λ with M, Λ the max and sum over all partitions, and
 * since Λ ≥ l·exp(m - M) that is at most w/l. So a row dropped here has a final weight below T, certainly; rows
 * whose final weight is below T but whose in-partition weight is not are kept. The sum l keeps every weight.
 */
final class PartitionWorker {
    private static final ThreadLocal<PartitionWorker> LOCAL = ThreadLocal.withInitial(PartitionWorker::new);
    private static final VectorShuffle<Float> SWAP1 = VectorShuffle.fromOp(F, i -> i ^ 1);
    private static final VectorShuffle<Float> SWAP2 = VectorShuffle.fromOp(F, i -> i ^ 2);
    /** Lane j of a scores vector holds row j % 4 of its 4-row block. */
    private static final IntVector ROW_IN_BLOCK = IntVector.fromArray(I, rowInBlock(), 0);
    private static final int P = CpuAttention.PARTITION;
    /** A selection's tile: see {@link #partitionSelected}. */
    private static final int T = CpuAttention.TILE;
    /** A dense tile: see {@link #partition}. */
    private static final int DT = CpuAttention.DENSE_TILE;

    private float[] kt = new float[0];
    /** The row layout the key tile was last decoded in (its padding columns, dimK .. dpK, are zero for it). */
    private int ktPadded = -1;
    private int ktDim = -1;
    private float[] vt = new float[0];
    /** Blocked scores, then weights: one region of P·slots floats per kv head of the task. */
    private float[] scores = new float[0];
    private int[] queryOff = new int[0];
    private int[] limit = new int[0];
    private int[] laneLimit = new int[0];
    private int[] accOff = new int[0];
    private final int[] rows = new int[P];
    private final int[] kept = new int[DT];
    private int[] offs = new int[0];
    private int[] tileOffs = new int[0];
    private final float[] lanes = new float[2 * L];
    private final float[] red = new float[16 * L];
    private final float[] sums = new float[L];
    private final float[] capScratch = new float[Softmax.SOFT_CAP_CHUNK];
    private final float[] capSums = new float[Lanes.L];
    /** Per kv head of a task, the partition's tiles its selection list holds: bit t = rows [t·T, t·T + T). */
    private long[] masks = new long[0];
    private float[] pMax = new float[0];
    private float[] pSum = new float[0];
    private float[] pAcc = new float[0];
    private float[] sMax = new float[0];
    private float[] sSum = new float[0];
    private float[] sAcc = new float[0];
    private float[] row = new float[0];
    /** Per kv head, the physical page whose key mean {@link #keyMeans} holds (-1: none); reset per partition. */
    private int[] meanPage = new int[0];
    /** A page's key mean: its halves, then as a tile of 4 rows (the mean and three zero rows), and its scores. */
    private short[] meanHalves = new short[0];
    private float[] meanTile = new float[0];
    private float[] meanScores = new float[0];
    /** Per kv head, 4·slots floats: q·μ of the page {@link #meanPage} names, each query slot's value 4 times. */
    private float[] keyBias = new float[0];
    /** A partition's cache bytes (K, then V), see {@link #stage}. */
    private byte[] staging = new byte[0];

    private PartitionWorker() {
    }

    static PartitionWorker get() {
        return LOCAL.get();
    }

    private static int[] rowInBlock() {
        int[] r = new int[L];
        for (int j = 0; j < L; j++) {
            r[j] = j & 3;
        }
        return r;
    }

    private void ensure(AttentionCall c, int slots, int heads) {
        if (kt.length < DT * heads * c.dpK) {
            kt = new float[DT * heads * c.dpK];
        } else if (c.dpK != c.dimK && (c.dpK != ktPadded || c.dimK != ktDim)) {
            // the decoders leave a row's padding columns alone and the scores multiply over them (by a zero query):
            // what a call of another layout left there (a NaN, say) must not reach this one's scores
            Arrays.fill(kt, 0f);
        }
        ktPadded = c.dpK;
        ktDim = c.dimK;
        if (offs.length < P * heads) {
            offs = new int[P * heads];
            tileOffs = new int[DT * heads];
        }
        if (vt.length < DT * heads * c.dpV) {
            vt = new float[DT * heads * c.dpV];
        }
        if (scores.length < heads * P * slots) {
            scores = new float[heads * P * slots];
        }
        if (queryOff.length < slots) {
            queryOff = new int[slots];
            limit = new int[slots];
            laneLimit = new int[4 * slots];
            accOff = new int[slots];
        }
        if (pMax.length < heads * slots) {
            pMax = new float[heads * slots];
            pSum = new float[heads * slots];
            sMax = new float[heads * slots];
            sSum = new float[heads * slots];
        }
        if (pAcc.length < heads * slots * c.dpV) {
            pAcc = new float[heads * slots * c.dpV];
            sAcc = new float[heads * slots * c.dpV];
        }
        if (row.length < Math.max(c.dimV, c.dimK) + L) {
            row = new float[Math.max(c.dimV, c.dimK) + L];
        }
        if (meanPage.length < c.kvHeads) {
            meanPage = new int[c.kvHeads];
        }
        if (meanTile.length < 4 * c.dpK) {
            meanHalves = new short[c.dpK];
            meanTile = new float[4 * c.dpK];   // rows 1..3 and the padding stay zero
        }
        if (meanScores.length < 4 * slots) {
            meanScores = new float[4 * slots];
        }
        if (keyBias.length < c.kvHeads * 4 * slots) {
            keyBias = new float[c.kvHeads * 4 * slots];
        }
        Arrays.fill(meanPage, -1);
        long stage = (long) P * c.kvHeads * Math.max(c.kRowBytes, c.vRowBytes) + 64;
        if (staging.length < stage) {
            staging = new byte[Math.toIntExact(stage)];
        }
    }

    /**
     * Copies the cache bytes of positions [pos, pos + count), kv heads [g0, g0 + heads), from a K or V pool into the
     * staging array, and sets offs to the rows' offsets there, position-major. Decoding straight from the pool
     * stalled on memory more than half the time: a tile's rows are read in a short burst between stretches of
     * arithmetic, and the hardware prefetcher does not run far enough ahead to cover a burst. A bulk copy streams
     * at copy bandwidth instead (the longer the better: dense decode stages a whole partition), and the decoders
     * then read a heap array from the caches, which they do faster than a native segment (see
     * {@link RowDecoder#decode}). These are the compressed bytes: nothing is expanded here.
     */
    private int stage(AttentionCall c, MemorySegment pool, long pageBytes, long rowBytes, int pos, int count, int g0,
                      int heads) {
        int kvHeads = c.kvHeads;
        int at = 0;
        int n = 0;
        for (int k = 0; k < count; ) {
            int p = pos + k;
            int inPage = p % c.pageTokens;
            int run = Math.min(count - k, c.pageTokens - inPage);
            long from = c.seq.page(p / c.pageTokens) * pageBytes + ((long) inPage * kvHeads + g0) * rowBytes;
            int bytes = (int) (((long) (run - 1) * kvHeads + heads) * rowBytes);
            MemorySegment.copy(pool, ValueLayout.JAVA_BYTE, from, staging, at, bytes);
            for (int r = 0; r < run; r++) {
                for (int j = 0; j < heads; j++) {
                    offs[n++] = at + (int) ((r * kvHeads + j) * rowBytes);
                }
            }
            at += bytes;
            k += run;
        }
        return n;
    }

    /**
     * Adds to the scores of tile rows [0, count) (positions from pos, kv head g, at partition rows from row0 of the
     * region at off) the bias q·μ of each row's page, μ its key mean ({@link dev.kvant.kv.PageMeanFormat}): a score
     * is then q·(k − μ) + q·μ, the key as written. The bias of a page is one dot per query slot, summed in dimension
     * order, kept while the rows stay in the page; it is added to whole blocks of 4 rows at once (a padding row's
     * score is masked anyway), one vector of 4·slots floats per block.
     */
    private void addKeyBias(AttentionCall c, int g, int pos, int count, int nq, int slots, int off, int row0) {
        int width = 4 * slots;
        int bb = g * width;
        for (int r = 0; r < count; ) {
            int lp = (pos + r) / c.pageTokens;
            // rows r .. end - 1 share the page; whole 4-row blocks unless the page ends inside one
            int end = Math.min(count, (lp + 1) * c.pageTokens - pos);
            int page = c.seq.page(lp);
            if (meanPage[g] != page) {
                // the mean as a tile of one row (and three zero rows), scored like any key row
                MemorySegment.copy(c.kPool, Lanes.LE_SHORT, page * c.kPageBytes + c.seq.cache().kMeanOffset(c.layer, g),
                        meanHalves, 0, c.dimK);
                for (int d = 0; d < c.dimK; d++) {
                    meanTile[d] = Float.float16ToFloat(meanHalves[d]);
                }
                TileKernels.scores(c.queries, queryOff, nq, slots, meanTile, 0, c.dpK, 4, c.dpK, meanScores, 0, 0,
                        red);
                for (int i = 0; i < slots; i++) {
                    Arrays.fill(keyBias, bb + 4 * i, bb + 4 * i + 4, i < nq ? meanScores[4 * i] : 0f);
                }
                meanPage[g] = page;
            }
            if (r % 4 == 0 && (end % 4 == 0 || end == count)) {
                for (int blk = (row0 + r) >> 2; blk < (row0 + end + 3) >> 2; blk++) {
                    int o = off + blk * width;
                    int k = 0;
                    for (; k + L <= width; k += L) {
                        FloatVector.fromArray(F, scores, o + k).add(FloatVector.fromArray(F, keyBias, bb + k))
                                .intoArray(scores, o + k);
                    }
                    for (; k < width; k++) {
                        scores[o + k] += keyBias[bb + k];
                    }
                }
            } else {
                for (int q = r; q < end; q++) {
                    for (int i = 0; i < nq; i++) {
                        scores[off + TileKernels.at(row0 + q, i, slots)] += keyBias[bb + 4 * i];
                    }
                }
            }
            r = end;
        }
    }

    /** Rotates, scales and pads the query rows of token t into {@code c.queries}. */
    void prepareQueries(AttentionCall c, float[] q, int t, float scale) {
        ensure(c, 4, 1);
        for (int h = 0; h < c.heads; h++) {
            int r = t * c.heads + h;
            System.arraycopy(q, r * c.headDimK, row, 0, c.headDimK);
            c.kFormat.rotate(row, 0, c.headDimK);
            int o = r * c.dpK;
            for (int d = 0; d < c.dimK; d++) {
                c.queries[o + d] = row[d] * scale;
            }
            Arrays.fill(c.queries, o + c.dimK, o + c.dpK, 0f);
        }
    }

    /**
     * The partials of kv heads [g0, g0 + heads) over partition p, for the queries of tokens [t0, t0 + tokens):
     * query slot i of head g is token t0 + i / group, query head g·group + i % group. Head j = g - g0, slot i
     * writes its max and sum at {@code e = base + j·headStride + i} and its unnormalized accumulator at
     * {@code acc[e·dpV]}. Slots past tokens·group, up to a multiple of 4, are padding, left empty.
     *
     * <p>Rows are read position by position, all the task's heads of a position together: the cache stores a
     * position's heads side by side, so this is a forward walk through memory that the hardware prefetcher follows
     * (reading one head's rows alone strides over the others' and ran 3x slower).
     */
    void partition(AttentionCall c, int p, int g0, int heads, int t0, int tokens, float[] max, float[] sum,
                   float[] acc, int base, int headStride) {
        int group = c.group;
        int nq = tokens * group;
        int slots = (nq + 3) & ~3;
        ensure(c, slots, heads);
        int p0 = p * P;
        int maxRows = 0;
        for (int i = 0; i < slots; i++) {
            limit[i] = i < nq ? Math.clamp(c.start + t0 + i / group - p0 + 1, 0, P) : 0;
            maxRows = Math.max(maxRows, limit[i]);
            laneLimit[4 * i] = laneLimit[4 * i + 1] = laneLimit[4 * i + 2] = laneLimit[4 * i + 3] = limit[i];
        }
        for (int j = 0; j < heads; j++) {
            int e = base + j * headStride;
            Arrays.fill(acc, e * c.dpV, (e + slots) * c.dpV, 0f);
            if (maxRows == 0) {
                Arrays.fill(max, e, e + slots, Float.NEGATIVE_INFINITY);
                Arrays.fill(sum, e, e + slots, 0f);
            }
        }
        if (maxRows == 0) {
            return;
        }
        int region = P * slots;

        // The partition's K rows are staged in one copy, then its V rows: one long stream each (staged by 4 tiles
        // at a time, decode over f16, q8_0 and turbo3 caches took 2-8% longer on one thread, 2-5% on two).
        stage(c, c.kPool, c.kPageBytes, c.kRowBytes, p0, maxRows, g0, heads);
        for (int ts = 0; ts < maxRows; ts += DT) {
            int count = Math.min(DT, maxRows - ts);
            System.arraycopy(offs, ts * heads, tileOffs, 0, count * heads);
            c.kDecoder.decode(staging, tileOffs, count * heads, kt, c.dpK);
            for (int j = 0; j < heads; j++) {
                setQueries(c, g0 + j, t0, nq, slots);
                TileKernels.scores(c.queries, queryOff, nq, slots, kt, j * c.dpK, heads * c.dpK, (count + 3) & ~3,
                        c.dpK, scores, j * region, ts, red);
                if (c.keyMeans) {
                    addKeyBias(c, g0 + j, p0 + ts, count, nq, slots, j * region, ts);
                }
            }
        }
        int rows4 = (maxRows + 3) & ~3;
        for (int j = 0; j < heads; j++) {
            if (c.softCap > 0) {
                Softmax.softCapInPlace(scores, j * region, j * region + rows4 * slots, c.softCap, capScratch,
                        capSums);
            }
            softmax(slots, rows4, c.sparseV, j * region, max, sum, base + j * headStride);
        }

        for (int r = 0; r < maxRows; r++) {
            rows[r] = r;
        }
        boolean sparse = c.sparseV > 0;
        stage(c, c.vPool, c.vPageBytes, c.vRowBytes, p0, maxRows, g0, heads);
        for (int k0 = 0; k0 < maxRows; k0 += DT) {
            int count = Math.min(DT, maxRows - k0);
            int first = k0 * heads;
            if (!sparse) {
                System.arraycopy(offs, first, tileOffs, 0, count * heads);
                c.vDecoder.decode(staging, tileOffs, count * heads, vt, c.dpV);
                for (int j = 0; j < heads; j++) {
                    setAccumulators(c, base + j * headStride, slots);
                    TileKernels.weightedSum(scores, j * region, slots, rows, k0, count, vt, j * c.dpV, heads * c.dpV,
                            c.dpV, acc, accOff, nq);
                }
                continue;
            }
            // Sparse V: per head, decode and accumulate only the rows some query still weights. The bytes were
            // staged anyway (a skipped row shares its cache lines with its neighbours); what is saved is decoding
            // and the multiply-adds.
            for (int j = 0; j < heads; j++) {
                int n = 0;
                for (int k = 0; k < count; k++) {
                    int r = k0 + k;
                    int at = j * region + TileKernels.at(r, 0, slots);
                    for (int i = 0; i < nq; i++) {
                        if (scores[at + 4 * i] != 0f) {
                            kept[n] = r;
                            tileOffs[n++] = offs[first + k * heads + j];
                            break;
                        }
                    }
                }
                if (n > 0) {
                    c.vDecoder.decode(staging, tileOffs, n, vt, c.dpV);
                    setAccumulators(c, base + j * headStride, slots);
                    TileKernels.weightedSum(scores, j * region, slots, kept, 0, n, vt, 0, c.dpV, c.dpV, acc, accOff,
                            nq);
                }
            }
        }
    }

    /**
     * {@link #partition} through a selection: the tiles of the partition that no list of query block qb (for the
     * task's kv heads) holds are neither staged nor decoded; a head's unselected tiles are left out of its scores,
     * softmax and weighted sum, which is what weight exactly 0 would give (see {@link #softmaxSelected}). Everything else is the dense arithmetic in the dense order,
     * which is why a selection of every block gives the dense result bit for bit. Tiles are staged one at a time
     * (a selected tile's neighbours are mostly not wanted). A head with no selected tile here gets an empty
     * partial, which the merge skips; a query with visible rows always sees a selected one, because its own
     * block is in every list ({@link Selection#check}).
     */
    void partitionSelected(AttentionCall c, int qb, int p, int g0, int heads, int t0, int tokens, float[] max,
                           float[] sum, float[] acc, int base, int headStride) {
        int group = c.group;
        int nq = tokens * group;
        int slots = (nq + 3) & ~3;
        ensure(c, slots, heads);
        if (masks.length < heads) {
            masks = new long[heads];
        }
        int p0 = p * P;
        int maxRows = 0;
        for (int i = 0; i < slots; i++) {
            limit[i] = i < nq ? Math.clamp(c.start + t0 + i / group - p0 + 1, 0, P) : 0;
            maxRows = Math.max(maxRows, limit[i]);
            laneLimit[4 * i] = laneLimit[4 * i + 1] = laneLimit[4 * i + 2] = laneLimit[4 * i + 3] = limit[i];
        }
        int tiles = (maxRows + T - 1) / T;
        long rowTiles = tiles == 64 ? -1L : (1L << tiles) - 1;
        long any = 0;
        for (int j = 0; j < heads; j++) {
            masks[j] = tileMask(c.selection, qb, g0 + j, p0) & rowTiles;
            any |= masks[j];
            int e = base + j * headStride;
            if (masks[j] == 0) {
                Arrays.fill(max, e, e + slots, Float.NEGATIVE_INFINITY);
                Arrays.fill(sum, e, e + slots, 0f);
            } else {
                Arrays.fill(acc, e * c.dpV, (e + slots) * c.dpV, 0f);
            }
        }
        if (any == 0) {
            return;
        }
        int region = P * slots;

        for (int tile = 0; tile < tiles; tile++) {
            int ts = tile * T;
            if ((any >>> tile & 1) == 0) {
                continue;
            }
            int count = Math.min(T, maxRows - ts);
            stage(c, c.kPool, c.kPageBytes, c.kRowBytes, p0 + ts, count, g0, heads);
            for (int j = 0; j < heads; j++) {
                if ((masks[j] >>> tile & 1) == 0) {
                    continue;
                }
                // Only the heads that selected the tile decode it: lists differ per head, so a tile is often
                // wanted by one head of the task. A row's values and score do not depend on where it is decoded.
                for (int k = 0; k < count; k++) {
                    tileOffs[k] = offs[k * heads + j];
                }
                c.kDecoder.decode(staging, tileOffs, count, kt, c.dpK);
                setQueries(c, g0 + j, t0, nq, slots);
                TileKernels.scores(c.queries, queryOff, nq, slots, kt, 0, c.dpK, (count + 3) & ~3, c.dpK, scores,
                        j * region, ts, red);
                if (c.keyMeans) {
                    addKeyBias(c, g0 + j, p0 + ts, count, nq, slots, j * region, ts);
                }
            }
        }
        int rows4 = (maxRows + 3) & ~3;
        for (int j = 0; j < heads; j++) {
            if (masks[j] == 0) {
                continue;
            }
            if (c.softCap > 0) {
                for (long m = masks[j]; m != 0; m &= m - 1) {
                    int ts = Long.numberOfTrailingZeros(m) * T;
                    int to = Math.min(ts + T, rows4);
                    Softmax.softCapInPlace(scores, j * region + ts * slots, j * region + to * slots, c.softCap,
                            capScratch, capSums);
                }
            }
            softmaxSelected(slots, rows4, masks[j], c.sparseV, j * region, max, sum, base + j * headStride);
        }

        for (int r = 0; r < maxRows; r++) {
            rows[r] = r;
        }
        boolean sparse = c.sparseV > 0;
        for (int tile = 0; tile < tiles; tile++) {
            if ((any >>> tile & 1) == 0) {
                continue;
            }
            int k0 = tile * T;
            int count = Math.min(T, maxRows - k0);
            stage(c, c.vPool, c.vPageBytes, c.vRowBytes, p0 + k0, count, g0, heads);
            if (!sparse) {
                for (int j = 0; j < heads; j++) {
                    if ((masks[j] >>> tile & 1) == 0) {
                        continue;
                    }
                    for (int k = 0; k < count; k++) {
                        tileOffs[k] = offs[k * heads + j];
                    }
                    c.vDecoder.decode(staging, tileOffs, count, vt, c.dpV);
                    setAccumulators(c, base + j * headStride, slots);
                    TileKernels.weightedSum(scores, j * region, slots, rows, k0, count, vt, 0, c.dpV, c.dpV, acc,
                            accOff, nq);
                }
                continue;
            }
            for (int j = 0; j < heads; j++) {
                if ((masks[j] >>> tile & 1) == 0) {
                    continue;
                }
                int n = 0;
                for (int k = 0; k < count; k++) {
                    int r = k0 + k;
                    int at = j * region + TileKernels.at(r, 0, slots);
                    for (int i = 0; i < nq; i++) {
                        if (scores[at + 4 * i] != 0f) {
                            kept[n] = r;
                            tileOffs[n++] = offs[k * heads + j];
                            break;
                        }
                    }
                }
                if (n > 0) {
                    c.vDecoder.decode(staging, tileOffs, n, vt, c.dpV);
                    setAccumulators(c, base + j * headStride, slots);
                    TileKernels.weightedSum(scores, j * region, slots, kept, 0, n, vt, 0, c.dpV, c.dpV, acc, accOff,
                            nq);
                }
            }
        }
    }

    /**
     * {@link #softmax} over the tiles set in mask only: the max over fewer (all finite-or-masked) scores is the same
     * max, the weights of the skipped rows would be exactly +0, and the sums run over the kept blocks in block
     * order ({@link Softmax#weights} accumulating run after run), so with every tile set this is the dense softmax
     * bit for bit.
     */
    private void softmaxSelected(int slots, int rows4, long mask, float sparse, int off, float[] max, float[] sum,
                                 int ml) {
        int stride = 4 * slots;
        int blocks = rows4 / 4;
        int perTile = T / 4;
        for (int v = 0; v < stride; v += L) {
            IntVector lim = IntVector.fromArray(I, laneLimit, v);
            FloatVector mx = FloatVector.broadcast(F, Float.NEGATIVE_INFINITY);
            for (long m = mask; m != 0; m &= m - 1) {
                int tile = Long.numberOfTrailingZeros(m);
                int b1 = Math.min(blocks, (tile + 1) * perTile);
                for (int b = tile * perTile; b < b1; b++) {
                    VectorMask<Float> out = ROW_IN_BLOCK.add(4 * b).compare(VectorOperators.GE, lim).cast(F);
                    mx = mx.max(FloatVector.fromArray(F, scores, off + b * stride + v)
                            .blend(Float.NEGATIVE_INFINITY, out));
                }
            }
            mx = mx.max(mx.rearrange(SWAP1));
            mx = mx.max(mx.rearrange(SWAP2));
            mx.intoArray(lanes, 0);
            Arrays.fill(sums, 0f);
            for (long m = mask; m != 0; ) {
                int a = Long.numberOfTrailingZeros(m);
                int e = a + Long.numberOfTrailingZeros(~(m >>> a));
                int b0 = a * perTile;
                int b1 = Math.min(blocks, e * perTile);
                if (b1 > b0) {
                    Softmax.weights(scores, off + b0 * stride + v, stride, b1 - b0, 4 * b0, lanes, laneLimit, v, sums,
                            true);
                }
                m = e >= 64 ? 0 : m & (-1L << e);
            }
            FloatVector total = FloatVector.fromArray(F, sums, 0);
            total = total.add(total.rearrange(SWAP2));
            total = total.add(total.rearrange(SWAP1));
            if (sparse > 0) {
                FloatVector threshold = total.mul(sparse);
                for (long m = mask; m != 0; m &= m - 1) {
                    int tile = Long.numberOfTrailingZeros(m);
                    int b1 = Math.min(blocks, (tile + 1) * perTile);
                    for (int b = tile * perTile; b < b1; b++) {
                        int at = off + b * stride + v;
                        FloatVector w = FloatVector.fromArray(F, scores, at);
                        w.blend(0f, w.compare(VectorOperators.LT, threshold)).intoArray(scores, at);
                    }
                }
            }
            mx.intoArray(lanes, 0);
            total.intoArray(lanes, L);
            for (int j = 0; j < L; j += 4) {
                int slot = (v + j) / 4;
                max[ml + slot] = lanes[j];
                sum[ml + slot] = lanes[L + j];
            }
        }
    }

    /** The tiles of partition p0 that the list of (qb, g) holds, as bits. */
    private static long tileMask(Selection sel, int qb, int g, int p0) {
        int bt = sel.blockTokens();
        int perBlock = bt / T;
        long blockBits = perBlock == 64 ? -1L : (1L << perBlock) - 1;
        int end = (p0 + P) / bt;
        int[] list = sel.blocks();
        int o = sel.offset(qb, g);
        int count = sel.count(qb, g);
        long mask = 0;
        for (int i = sel.firstAtOrAfter(qb, g, p0 / bt); i < count && list[o + i] < end; i++) {
            mask |= blockBits << ((list[o + i] * bt - p0) / T);
        }
        return mask;
    }

    private void setQueries(AttentionCall c, int g, int t0, int nq, int slots) {
        int group = c.group;
        for (int i = 0; i < slots; i++) {
            queryOff[i] = i < nq ? ((t0 + i / group) * c.heads + g * group + i % group) * c.dpK : c.zeroQuery;
        }
    }

    private void setAccumulators(AttentionCall c, int e, int slots) {
        for (int i = 0; i < slots; i++) {
            accOff[i] = (e + i) * c.dpV;
        }
    }

    /**
     * Turns the scores of rows [0, rows4) in the region at off into weights in place and writes each slot's max
     * and sum at ml + slot. A vector holds L/4 slots × 4 rows, so per slot the running max and sum are 4 lanes
     * (rows r mod 4), folded at the end in a fixed order; lanes past a slot's limit are masked out.
     */
    private void softmax(int slots, int rows4, float sparse, int off, float[] max, float[] sum, int ml) {
        int stride = 4 * slots;
        int blocks = rows4 / 4;
        for (int v = 0; v < stride; v += L) {
            IntVector lim = IntVector.fromArray(I, laneLimit, v);
            FloatVector mx = FloatVector.broadcast(F, Float.NEGATIVE_INFINITY);
            for (int b = 0; b < blocks; b++) {
                VectorMask<Float> out = ROW_IN_BLOCK.add(4 * b).compare(VectorOperators.GE, lim).cast(F);
                mx = mx.max(FloatVector.fromArray(F, scores, off + b * stride + v)
                        .blend(Float.NEGATIVE_INFINITY, out));
            }
            mx = mx.max(mx.rearrange(SWAP1));
            mx = mx.max(mx.rearrange(SWAP2));
            mx.intoArray(lanes, 0);
            Softmax.weights(scores, off + v, stride, blocks, lanes, laneLimit, v, sums);
            FloatVector total = FloatVector.fromArray(F, sums, 0);
            total = total.add(total.rearrange(SWAP2));
            total = total.add(total.rearrange(SWAP1));
            if (sparse > 0) {
                FloatVector threshold = total.mul(sparse);
                for (int b = 0; b < blocks; b++) {
                    int at = off + b * stride + v;
                    FloatVector w = FloatVector.fromArray(F, scores, at);
                    w.blend(0f, w.compare(VectorOperators.LT, threshold)).intoArray(scores, at);
                }
            }
            mx.intoArray(lanes, 0);
            total.intoArray(lanes, L);
            for (int j = 0; j < L; j += 4) {
                int slot = (v + j) / 4;
                max[ml + slot] = lanes[j];
                sum[ml + slot] = lanes[L + j];
            }
        }
    }

    /**
     * Split-K second step: for every query of kv head g, merges its partials over the call's partitions in order
     * and writes the output.
     */
    void mergeSplit(AttentionCall c, int g, float[] out) {
        int slots = c.slots;
        ensure(c, slots, 1);
        int nq = c.n * c.group;
        for (int i = 0; i < nq; i++) {
            sMax[0] = Float.NEGATIVE_INFINITY;
            sSum[0] = 0f;
            for (int p = 0; p < c.parts; p++) {
                int e = (g * c.parts + p) * slots + i;
                Softmax.merge(sMax, sSum, 0, sAcc, 0, c.partMax, c.partSum, e, c.partAcc, e * c.dpV, c.dpV);
            }
            write(c, g, 0, i, 0, out);
        }
    }

    /**
     * Prefill: the queries of tokens [t0, t0 + tokens) of kv heads [g0, g0 + heads) over every partition up to
     * their last position, merged as they come, then written.
     */
    void prefillBlock(AttentionCall c, int g0, int heads, int t0, int tokens, float[] out) {
        int nq = tokens * c.group;
        int slots = (nq + 3) & ~3;
        ensure(c, slots, heads);
        Arrays.fill(sMax, 0, heads * slots, Float.NEGATIVE_INFINITY);
        Arrays.fill(sSum, 0, heads * slots, 0f);
        int last = (c.start + t0 + tokens - 1) / P;
        int qb = t0 / Selection.QUERY_BLOCK;
        for (int p = 0; p <= last; p++) {
            if (c.selection == null) {
                partition(c, p, g0, heads, t0, tokens, pMax, pSum, pAcc, 0, slots);
            } else {
                partitionSelected(c, qb, p, g0, heads, t0, tokens, pMax, pSum, pAcc, 0, slots);
            }
            for (int j = 0; j < heads; j++) {
                for (int i = 0; i < nq; i++) {
                    int e = j * slots + i;
                    Softmax.merge(sMax, sSum, e, sAcc, e * c.dpV, pMax, pSum, e, pAcc, e * c.dpV, c.dpV);
                }
            }
        }
        for (int j = 0; j < heads; j++) {
            for (int i = 0; i < nq; i++) {
                int e = j * slots + i;
                write(c, g0 + j, t0, i, e, out);
            }
        }
    }

    /**
     * Normalizes merged state e, slot i of kv head g for tokens from t0, rotates it out of V's domain and stores
     * it as query head g·group + i % group of token t0 + i / group.
     */
    private void write(AttentionCall c, int g, int t0, int i, int e, float[] out) {
        // no row a query sees has a finite score (every one masked or non-finite): its output is NaN, as the
        // reference's 0/0 — not whatever another query left in the accumulator
        float inv = sSum[e] > 0f ? 1f / sSum[e] : Float.NaN;
        int a = e * c.dpV;
        for (int d = 0; d < c.dimV; d++) {
            row[d] = sAcc[a + d] * inv;
        }
        c.vFormat.unrotate(row, 0, c.headDimV);
        int t = t0 + i / c.group;
        int h = g * c.group + i % c.group;
        System.arraycopy(row, 0, out, (t * c.heads + h) * c.headDimV, c.headDimV);
    }
}
