package dev.kvant.attention;

import static dev.kvant.attention.Lanes.F;
import static dev.kvant.attention.Lanes.I;
import static dev.kvant.attention.Lanes.L;

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
 * <li>K tiles of {@value CpuAttention#TILE} rows are decoded as they are loaded and scored against all the queries
 *     (one read of a row serves the whole group);</li>
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

    private float[] kt = new float[0];
    private float[] vt = new float[0];
    private float[] scores = new float[0];
    private int[] queryOff = new int[0];
    private int[] limit = new int[0];
    private int[] laneLimit = new int[0];
    private int[] accOff = new int[0];
    private int[] rows = new int[CpuAttention.PARTITION];
    private final long[] offs = new long[CpuAttention.TILE];
    private final float[] lanes = new float[2 * L];
    private final float[] red = new float[16 * L];
    private final float[] capScratch = new float[Softmax.SOFT_CAP_CHUNK];
    private float[] pMax = new float[0];
    private float[] pSum = new float[0];
    private float[] pAcc = new float[0];
    private float[] sMax = new float[0];
    private float[] sSum = new float[0];
    private float[] sAcc = new float[0];
    private float[] row = new float[0];

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

    private void ensure(AttentionCall c, int slots) {
        int t = CpuAttention.TILE;
        if (kt.length < t * c.dpK) {
            kt = new float[t * c.dpK];
        }
        if (vt.length < t * c.dpV) {
            vt = new float[t * c.dpV];
        }
        if (scores.length < CpuAttention.PARTITION * slots) {
            scores = new float[CpuAttention.PARTITION * slots];
        }
        if (queryOff.length < slots) {
            queryOff = new int[slots];
            limit = new int[slots];
            laneLimit = new int[4 * slots];
            accOff = new int[slots];
            pMax = new float[slots];
            pSum = new float[slots];
            sMax = new float[slots];
            sSum = new float[slots];
        }
        if (pAcc.length < slots * c.dpV) {
            pAcc = new float[slots * c.dpV];
            sAcc = new float[slots * c.dpV];
        }
        if (row.length < Math.max(c.dimV, c.dimK) + L) {
            row = new float[Math.max(c.dimV, c.dimK) + L];
        }
    }

    /** Rotates, scales and pads the query rows of token t into {@code c.queries}. */
    void prepareQueries(AttentionCall c, float[] q, int t, float scale) {
        ensure(c, 4);
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
     * The partials of the queries of tokens [t0, t0 + tokens) (all heads of kv head g's group, slot i = token
     * (i / group), head g·group + i % group) over partition p: max, sum at {@code max/sum[ml + i]}, unnormalized
     * accumulator at {@code acc[accBase + i·dpV]}. Slots up to a multiple of 4 are padding, left empty.
     */
    void partition(AttentionCall c, int g, int p, int t0, int tokens, float[] max, float[] sum, int ml,
                   float[] acc, int accBase) {
        int group = c.group;
        int nq = tokens * group;
        int slots = (nq + 3) & ~3;
        ensure(c, slots);
        int p0 = p * CpuAttention.PARTITION;
        int maxRows = 0;
        for (int i = 0; i < slots; i++) {
            if (i < nq) {
                int t = t0 + i / group;
                queryOff[i] = (t * c.heads + g * group + i % group) * c.dpK;
                limit[i] = Math.clamp(c.start + t - p0 + 1, 0, CpuAttention.PARTITION);
            } else {
                queryOff[i] = c.zeroQuery;
                limit[i] = 0;
            }
            maxRows = Math.max(maxRows, limit[i]);
            accOff[i] = accBase + i * c.dpV;
            laneLimit[4 * i] = laneLimit[4 * i + 1] = laneLimit[4 * i + 2] = laneLimit[4 * i + 3] = limit[i];
        }
        Arrays.fill(acc, accBase, accBase + slots * c.dpV, 0f);
        if (maxRows == 0) {
            Arrays.fill(max, ml, ml + slots, Float.NEGATIVE_INFINITY);
            Arrays.fill(sum, ml, ml + slots, 0f);
            return;
        }

        int tile = CpuAttention.TILE;
        for (int ts = 0; ts < maxRows; ts += tile) {
            int count = Math.min(tile, maxRows - ts);
            for (int k = 0; k < count; k++) {
                offs[k] = c.kOffset(p0 + ts + k, g);
            }
            c.kDecoder.decode(c.kPool, offs, count, kt, c.dpK);
            TileKernels.scores(c.queries, queryOff, nq, slots, kt, c.dpK, (count + 3) & ~3, c.dpK, scores, ts, red);
        }
        int rows4 = (maxRows + 3) & ~3;
        if (c.softCap > 0) {
            Softmax.softCapInPlace(scores, 0, rows4 * slots, c.softCap, capScratch);
        }
        softmax(slots, rows4, c.sparseV, max, sum, ml);

        int count = 0;
        if (c.sparseV > 0) {
            for (int r = 0; r < maxRows; r++) {
                int at = TileKernels.at(r, 0, slots);
                for (int i = 0; i < nq; i++) {
                    if (scores[at + 4 * i] != 0f) {
                        rows[count++] = r;
                        break;
                    }
                }
            }
        } else {
            for (int r = 0; r < maxRows; r++) {
                rows[r] = r;
            }
            count = maxRows;
        }
        for (int k0 = 0; k0 < count; k0 += tile) {
            int n = Math.min(tile, count - k0);
            for (int k = 0; k < n; k++) {
                offs[k] = c.vOffset(p0 + rows[k0 + k], g);
            }
            c.vDecoder.decode(c.vPool, offs, n, vt, c.dpV);
            TileKernels.weightedSum(scores, slots, rows, k0, n, vt, c.dpV, c.dpV, acc, accOff, nq);
        }
    }

    /**
     * Turns the scores of rows [0, rows4) into weights in place and writes each slot's max and sum. A vector holds
     * L/4 slots × 4 rows, so per slot the running max and sum are 4 lanes (rows r mod 4), folded at the end in a
     * fixed order; lanes past a slot's limit are masked out.
     */
    private void softmax(int slots, int rows4, float sparse, float[] max, float[] sum, int ml) {
        int stride = 4 * slots;
        int blocks = rows4 / 4;
        for (int v = 0; v < stride; v += L) {
            IntVector lim = IntVector.fromArray(I, laneLimit, v);
            FloatVector mx = FloatVector.broadcast(F, Float.NEGATIVE_INFINITY);
            for (int b = 0; b < blocks; b++) {
                VectorMask<Float> out = ROW_IN_BLOCK.add(4 * b).compare(VectorOperators.GE, lim).cast(F);
                mx = mx.max(FloatVector.fromArray(F, scores, b * stride + v).blend(Float.NEGATIVE_INFINITY, out));
            }
            mx = mx.max(mx.rearrange(SWAP1));
            mx = mx.max(mx.rearrange(SWAP2));
            // Rows outside a slot's limit become -inf, which exp turns into 0.
            for (int b = 0; b < blocks; b++) {
                int at = b * stride + v;
                VectorMask<Float> out = ROW_IN_BLOCK.add(4 * b).compare(VectorOperators.GE, lim).cast(F);
                FloatVector.fromArray(F, scores, at).sub(mx).blend(Float.NEGATIVE_INFINITY, out).intoArray(scores, at);
            }
            Softmax.expInPlace(scores, v, stride, blocks);
            FloatVector total = FloatVector.zero(F);
            for (int b = 0; b < blocks; b++) {
                total = total.add(FloatVector.fromArray(F, scores, b * stride + v));
            }
            total = total.add(total.rearrange(SWAP2));
            total = total.add(total.rearrange(SWAP1));
            if (sparse > 0) {
                FloatVector threshold = total.mul(sparse);
                for (int b = 0; b < blocks; b++) {
                    int at = b * stride + v;
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
        ensure(c, slots);
        int nq = c.n * c.group;
        for (int i = 0; i < nq; i++) {
            sMax[i] = Float.NEGATIVE_INFINITY;
            sSum[i] = 0f;
            for (int p = 0; p < c.parts; p++) {
                int e = (g * c.parts + p) * slots + i;
                Softmax.merge(sMax, sSum, i, sAcc, i * c.dpV, c.partMax, c.partSum, e, c.partAcc, e * c.dpV, c.dpV);
            }
            write(c, g, 0, i, out);
        }
    }

    /**
     * Prefill: the queries of tokens [t0, t0 + tokens) of kv head g over every partition up to their last position,
     * merged as they come, then written.
     */
    void prefillBlock(AttentionCall c, int g, int t0, int tokens, float[] out) {
        int nq = tokens * c.group;
        int slots = (nq + 3) & ~3;
        ensure(c, slots);
        Arrays.fill(sMax, 0, slots, Float.NEGATIVE_INFINITY);
        Arrays.fill(sSum, 0, slots, 0f);
        int last = (c.start + t0 + tokens - 1) / CpuAttention.PARTITION;
        for (int p = 0; p <= last; p++) {
            partition(c, g, p, t0, tokens, pMax, pSum, 0, pAcc, 0);
            for (int i = 0; i < nq; i++) {
                Softmax.merge(sMax, sSum, i, sAcc, i * c.dpV, pMax, pSum, i, pAcc, i * c.dpV, c.dpV);
            }
        }
        for (int i = 0; i < nq; i++) {
            write(c, g, t0, i, out);
        }
    }

    /** Normalizes query slot i's merged state, rotates it out of V's domain and stores it. */
    private void write(AttentionCall c, int g, int t0, int i, float[] out) {
        float inv = 1f / sSum[i];
        int a = i * c.dpV;
        for (int d = 0; d < c.dimV; d++) {
            row[d] = sAcc[a + d] * inv;
        }
        c.vFormat.unrotate(row, 0, c.headDimV);
        int t = t0 + i / c.group;
        int h = g * c.group + i % c.group;
        System.arraycopy(row, 0, out, (t * c.heads + h) * c.headDimV, c.headDimV);
    }
}
