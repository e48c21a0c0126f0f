package dev.kvant.cuda.attention;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.attention.AttentionOptions;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaGraph;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.kv.Q4Format;
import dev.kvant.kv.Rotation;
import dev.kvant.kv.TurboFormat;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.stream.IntStream;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Decode, multi-query decode and prefill on the GPU, every K/V format and head size, GQA groups 1 to 8, against the
 * float64 reference: tightly against attention over the cache's decoded rows (what the kernels must compute; their
 * only error is f16/bf16 operands and f32 sums), loosely against attention over the exact rows that were written
 * (the format's own quantization error). Outputs are poisoned with NaN first; every run must give the same bits.
 *
 * <p>The cache: 8 kv heads, pages of 16 tokens handed out to three sequences (1, 150 and 515 tokens) in turns, so
 * page tables jump; decode splits of 32 tokens, so the longest sequence merges 17 partials.
 */
@Tag("gpu")
class AttentionGpuTest {
    static final int KV_HEADS = 8;
    static final int PAGE_TOKENS = 16;
    static final int[] LENS = {1, 150, 515};
    static final int MAX_TOKENS = 600;
    private static final Map<String, Data> DATA = new HashMap<>();

    /** A host cache written by the CPU encoder, its device mirror, and the reference rows. */
    record Data(KvCache host, KvSequence[] seqs, CudaKvCache device, double[][][][] kDecoded, double[][][][] vDecoded,
                double[][][][] kExact, double[][][][] vExact, long seed) {
        int dK() {
            return host.geometry().headDimK();
        }

        int dV() {
            return host.geometry().headDimV();
        }
    }

    static Stream<Arguments> shapes() {
        List<Arguments> all = new ArrayList<>();
        for (AttentionShape s : AttentionPrecompile.standardShapes()) {
            all.add(Arguments.of(s.kFormat().name(), s.vFormat().name(), s.headDimK(), s.headDimV()));
        }
        return all.stream();
    }

    static synchronized Data data(String kName, String vName, int dK, int dV) {
        String key = kName + "/" + vName + "/" + dK + "/" + dV;
        Data existing = DATA.get(key);
        if (existing != null) {
            return existing;
        }
        CudaContext context = AttentionGpuFixture.context();
        long seed = AttentionGpuFixture.seed("cache " + key);
        SplittableRandom r = new SplittableRandom(seed);
        KvFormat kf = KvFormat.parse(kName), vf = KvFormat.parse(vName);
        KvGeometry g = new KvGeometry(1, KV_HEADS, dK, dV);
        KvCache host = new KvCache(g, kf, vf, PAGE_TOKENS, 48);
        KvSequence[] seqs = interleavedSequences(host);
        double[][][][] kDec = new double[seqs.length][][][], vDec = new double[seqs.length][][][];
        double[][][][] kEx = new double[seqs.length][][][], vEx = new double[seqs.length][][][];
        for (int s = 0; s < seqs.length; s++) {
            float[] k = AttentionGpuFixture.gaussianRows(r, LENS[s] * KV_HEADS, dK, 1.0, 3);
            float[] v = AttentionGpuFixture.gaussianRows(r, LENS[s] * KV_HEADS, dV, 1.0, 0);
            seqs[s].writeRows(0, 0, LENS[s], k, 0, v, 0);
            kDec[s] = AttentionReference.decoded(seqs[s], 0, LENS[s], false);
            vDec[s] = AttentionReference.decoded(seqs[s], 0, LENS[s], true);
            kEx[s] = AttentionReference.exact(k, LENS[s], KV_HEADS, dK);
            vEx[s] = AttentionReference.exact(v, LENS[s], KV_HEADS, dV);
        }
        Data d = new Data(host, seqs, CudaKvCache.mirror(context, host), kDec, vDec, kEx, vEx, seed);
        DATA.put(key, d);
        return d;
    }

    /** Sequences of LENS tokens in host, reserved a page at a time in turn, so that their pages interleave. */
    static KvSequence[] interleavedSequences(KvCache host) {
        int pageTokens = host.pageTokens();
        KvSequence[] seqs = new KvSequence[LENS.length];
        for (int s = 0; s < seqs.length; s++) {
            seqs[s] = host.newSequence();
        }
        for (int reserved = pageTokens; reserved < MAX_TOKENS + pageTokens; reserved += pageTokens) {
            for (int s = 0; s < seqs.length; s++) {
                seqs[s].reserve(Math.min(LENS[s], reserved));
            }
        }
        return seqs;
    }

    /**
     * {@link #interleavedSequences} written in full with Gaussian rows from r, heads of 128 (every third K row with
     * outlier channels, see {@link AttentionGpuFixture#gaussianRows}).
     */
    static KvSequence[] gaussianSequences(KvCache host, SplittableRandom r) {
        KvSequence[] seqs = interleavedSequences(host);
        for (int s = 0; s < seqs.length; s++) {
            float[] k = AttentionGpuFixture.gaussianRows(r, LENS[s] * KV_HEADS, 128, 1.0, 3);
            float[] v = AttentionGpuFixture.gaussianRows(r, LENS[s] * KV_HEADS, 128, 1.0, 0);
            seqs[s].writeRows(0, 0, LENS[s], k, 0, v, 0);
        }
        return seqs;
    }

    @AfterAll
    static synchronized void release() {
        for (Data d : DATA.values()) {
            d.device().close();
            d.host().close();
        }
        DATA.clear();
    }

    /** The bound against the decoded-rows reference: f16 operands, or bf16 ones. */
    static double tightBound(String kName, String vName) {
        return kName.equals("bf16") || vName.equals("bf16") ? 2e-4 : 2e-5;
    }

    /**
     * The bound against the exact rows: the format's quantization error in attention outputs (estimated from the
     * row errors of docs/KV_FORMATS.md, with margin), never below the arithmetic bound.
     */
    static double looseBound(String kName, String vName) {
        return Math.max(loose(kName), loose(vName));
    }

    private static double loose(String name) {
        return switch (name) {
            case "f16" -> 3e-5;
            case "bf16" -> 3e-4;
            case "q8_0", "int8" -> 2e-3;
            case "q4_0h", "turbo4" -> 0.1;
            // plain q4_0's scale follows each block's largest value: over few rows (15 queries of one head) its
            // output error was measured at 0.017-0.117 on the H200 across seeds
            case "q4_0", "turbo3" -> 0.3;
            default -> 0.8;
        };
    }

    @ParameterizedTest(name = "{0}/{1} head {2}/{3}")
    @MethodSource("shapes")
    void decodeMatchesFloat64ReferenceForGroupsOneFourEight(String kName, String vName, int dK, int dV) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        Data data = data(kName, vName, dK, dV);
        long seed = AttentionGpuFixture.seed("decode " + kName + "/" + vName + " " + dK + "/" + dV);
        SplittableRandom r = new SplittableRandom(seed);
        for (int group : new int[] {1, 4, 8}) {
            int heads = KV_HEADS * group;
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                    AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 0));
                 DeviceBatch batch = batch(context, data, new int[] {0, 1, 2}, LENS)) {
                float[] q = AttentionGpuFixture.gaussianRows(r, LENS.length * heads, dK, 1.0, 0);
                float[] first = null;
                for (int run = 0; run < 2; run++) {
                    float[] out = decode(context, attention, data, batch, q, LENS.length, 1, heads);
                    if (first == null) {
                        first = out;
                    } else {
                        assertArrayEquals(first, out, "two decode runs gave different bits; seed " + seed);
                    }
                }
                double[] tight = new double[LENS.length * heads * dV];
                double[] loose = new double[tight.length];
                double scale = 1 / Math.sqrt(dK);
                // each reference row is computed alone into its own slots: in parallel, the same numbers
                IntStream.range(0, LENS.length).parallel().forEach(s -> {
                    AttentionReference.attend(data.kDecoded()[s], data.vDecoded()[s], q, s * heads * dK, heads, LENS[s],
                            scale, tight, s * heads * dV);
                    AttentionReference.attend(data.kExact()[s], data.vExact()[s], q, s * heads * dK, heads, LENS[s],
                            scale, loose, s * heads * dV);
                });
                check("decode G=" + group, first, tight, loose, kName, vName, seed);
            }
        }
    }

    /**
     * Pages of 8, 24 and 64 tokens give the bits of 16-token pages: tiles and splits follow positions, not pages.
     * With 16 and 64 a full tile lies in one page (a block of every kv head copies it with one bulk copy a side on
     * sm_90); with 8 and 24 tiles cross pages and are copied a token at a time. Sequences interleave their pages.
     * And the batch gives each sequence the bits it gets decoded alone: in the batch (1, 150 and 515 tokens, a plan
     * of {@value #MAX_TOKENS}) blocks take runs of two splits of a sequence (attention.cu dec_run); alone, a
     * sequence keeps a block a split.
     */
    @ParameterizedTest(name = "{0}/{1}")
    @CsvSource({"turbo3,turbo3", "q8_0,q8_0", "q8_0,turbo3", "turbo4,turbo4", "turbo2,turbo2", "int8,int8", "f16,f16",
            "q4_0,q4_0", "q4_0h,q8_0"})
    void decodeGivesTheSameBitsWhateverThePageSizeOrBatch(String kName, String vName) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        long seed = AttentionGpuFixture.seed("page sizes " + kName + "/" + vName);
        KvGeometry g = new KvGeometry(1, KV_HEADS, 128, 128);
        int heads = KV_HEADS * 4;
        float[] first = null;
        for (int pageTokens : new int[] {16, 8, 24, 64}) {
            SplittableRandom r = new SplittableRandom(seed);   // the same rows and queries for every page size
            int pagesPerSeq = (MAX_TOKENS + pageTokens - 1) / pageTokens;
            try (KvCache host = new KvCache(g, KvFormat.parse(kName), KvFormat.parse(vName), pageTokens,
                    LENS.length * pagesPerSeq)) {
                KvSequence[] seqs = gaussianSequences(host, r);
                float[] q = AttentionGpuFixture.gaussianRows(r, LENS.length * heads, 128, 1.0, 0);
                AttentionShape shape = AttentionShape.of(host, heads);
                try (CudaKvCache device = CudaKvCache.mirror(context, host);
                     CudaAttention attention = CudaAttention.create(context, cache, shape,
                             AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 0));
                     DeviceBatch batch = DeviceBatch.allocate(context, LENS.length, pagesPerSeq);
                     DeviceBatch one = DeviceBatch.allocate(context, 1, pagesPerSeq)) {
                    for (int s = 0; s < seqs.length; s++) {
                        batch.set(s, pagesOf(seqs[s]), seqs[s].pageCount(), LENS[s]);
                    }
                    batch.upload();
                    Data data = new Data(host, seqs, device, null, null, null, null, seed);
                    float[] out = decode(context, attention, data, batch, q, LENS.length, 1, heads);
                    assertTrue(allFinite(out), kName + "/" + vName + " pages of " + pageTokens
                            + ": output has NaN/inf (unwritten or broken); seed " + seed);
                    int rowFloats = heads * 128;
                    for (int s = 0; s < seqs.length; s++) {
                        one.set(0, pagesOf(seqs[s]), seqs[s].pageCount(), LENS[s]);
                        one.upload();
                        float[] alone = decode(context, attention, data, one,
                                Arrays.copyOfRange(q, s * rowFloats, (s + 1) * rowFloats), 1, 1, heads);
                        assertArrayEquals(alone, Arrays.copyOfRange(out, s * rowFloats, (s + 1) * rowFloats),
                                kName + "/" + vName + " pages of " + pageTokens + ": sequence " + s + " ("
                                        + LENS[s] + " tokens) has other bits in the batch than alone; seed " + seed);
                    }
                    if (first == null) {
                        first = out;
                    } else {
                        assertArrayEquals(first, out, kName + "/" + vName + ": pages of " + pageTokens
                                + " tokens gave other bits than pages of 16; seed " + seed);
                    }
                }
            }
        }
    }

    /**
     * A batch of many sequences of different lengths gives each sequence the bits it gets alone, for one query and for
     * eight (speculative verify): 36 sequences (attention.cu dec_run takes them in two rounds of 32 lanes), one of
     * 8,003 tokens whose splits hold two tiles, so its runs are several splits of several tiles, beside 35 of up to
     * 700; with eight queries the row tile of the first two queries sees 6 tokens fewer than the sequence, so a run
     * can end in an empty split. Alone, a sequence takes runs of another length (or a block a split): the same bits.
     */
    @ParameterizedTest(name = "{0}/{1} queries {2}")
    @CsvSource({"turbo3,turbo3,1", "turbo3,turbo3,8", "q8_0,q4_0,1", "f16,f16,8"})
    void manySequencesOfABatchGetTheirBitsAlone(String kName, String vName, int queries) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        long seed = AttentionGpuFixture.seed("many sequences " + kName + "/" + vName + " x" + queries);
        SplittableRandom r = new SplittableRandom(seed);
        int[] lens = new int[36];
        lens[0] = 8003;
        for (int s = 1; s < lens.length; s++) {
            lens[s] = queries + r.nextInt(700);
        }
        int maxTokens = 8192;
        int pagesPerSeq = maxTokens / PAGE_TOKENS;
        int pages = IntStream.of(lens).map(n -> (n + PAGE_TOKENS - 1) / PAGE_TOKENS).sum();
        int heads = KV_HEADS * 4;
        try (KvCache host = new KvCache(new KvGeometry(1, KV_HEADS, 128, 128), KvFormat.parse(kName),
                KvFormat.parse(vName), PAGE_TOKENS, pages)) {
            KvSequence[] seqs = new KvSequence[lens.length];
            for (int s = 0; s < seqs.length; s++) {
                seqs[s] = host.newSequence();
                seqs[s].reserve(lens[s]);
                float[] k = AttentionGpuFixture.gaussianRows(r, lens[s] * KV_HEADS, 128, 1.0, 3);
                float[] v = AttentionGpuFixture.gaussianRows(r, lens[s] * KV_HEADS, 128, 1.0, 0);
                seqs[s].writeRows(0, 0, lens[s], k, 0, v, 0);
            }
            float[] q = AttentionGpuFixture.gaussianRows(r, lens.length * queries * heads, 128, 1.0, 0);
            try (CudaKvCache device = CudaKvCache.mirror(context, host);
                 CudaAttention attention = CudaAttention.create(context, cache, AttentionShape.of(host, heads),
                         AttentionPlan.of(lens.length, queries, maxTokens, 0));
                 DeviceBatch batch = DeviceBatch.allocate(context, lens.length, pagesPerSeq);
                 DeviceBatch one = DeviceBatch.allocate(context, 1, pagesPerSeq)) {
                Data data = new Data(host, seqs, device, null, null, null, null, seed);
                for (int s = 0; s < seqs.length; s++) {
                    batch.set(s, pagesOf(seqs[s]), seqs[s].pageCount(), lens[s]);
                }
                batch.upload();
                float[] all = decode(context, attention, data, batch, q, lens.length, queries, heads);
                assertTrue(allFinite(all), kName + "/" + vName + ": output has NaN/inf; seed " + seed);
                int seqFloats = queries * heads * 128;
                for (int s = 0; s < seqs.length; s++) {
                    one.set(0, pagesOf(seqs[s]), seqs[s].pageCount(), lens[s]);
                    one.upload();
                    float[] alone = decode(context, attention, data, one,
                            Arrays.copyOfRange(q, s * seqFloats, (s + 1) * seqFloats), 1, queries, heads);
                    assertArrayEquals(alone, Arrays.copyOfRange(all, s * seqFloats, (s + 1) * seqFloats),
                            kName + "/" + vName + " x" + queries + ": sequence " + s + " (" + lens[s]
                                    + " tokens) has other bits in the batch than alone; seed " + seed);
                }
            }
        }
    }

    /**
     * Keys centered on their page's mean (the warpgroup prefill adds each row's page mean as its producer dequantizes;
     * the page changes within a 128-token tile) against the float64 reference over pages of 8, 24 and 64 tokens,
     * heads of 64 and 128, three kv heads, keys with a large common part (which the means take) and without, a chunk
     * after earlier ones; every output element is written (NaN poison first).
     */
    @ParameterizedTest(name = "{0} head {1}")
    @CsvSource({"turbo3+mean,128", "turbo3+mean,64", "turbo2+mean,128", "turbo2+mean,64"})
    void centeredKeysPrefillMatchesTheReferenceOverAnyPageSize(String kName, int d) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        long seed = AttentionGpuFixture.seed("centered prefill " + kName + " " + d);
        int kvHeads = 3, heads = 2 * kvHeads, total = 700, start = 350, n = total - start;
        KvFormat kf = KvFormat.parse(kName), vf = PageMeanFormat.rows(kf);
        KvGeometry g = new KvGeometry(1, kvHeads, d, d);
        float scale = (float) (1 / Math.sqrt(d));
        for (int pageTokens : new int[] {8, 24, 64}) {
            for (double common : new double[] {0, 4}) {
                SplittableRandom r = new SplittableRandom(seed);
                int pages = (total + pageTokens - 1) / pageTokens;
                try (KvCache host = new KvCache(g, kf, vf, pageTokens, 2 * pages)) {
                    KvSequence seq = everyOtherPage(host, total);
                    float[] k = new float[total * kvHeads * d], v = new float[k.length], q = new float[n * heads * d];
                    for (int i = 0; i < k.length; i++) {
                        k[i] = (float) (r.nextGaussian() + common * Math.sin(1.7 * (i % (kvHeads * d)) + 0.3));
                        v[i] = (float) r.nextGaussian();
                    }
                    for (int i = 0; i < q.length; i++) {
                        q[i] = (float) r.nextGaussian();
                    }
                    // two writes: the pages the second opens take its rows' means, the one it continues keeps its own
                    seq.writeRows(0, 0, start, k, 0, v, 0);
                    seq.writeRows(0, start, n, k, start * kvHeads * d, v, start * kvHeads * d);
                    double[] ref = dev.kvant.attention.AttentionReference.attend(seq, 0, q, n, start, heads, scale,
                            new AttentionOptions(0f, 0f));
                    AttentionShape shape = AttentionShape.of(host, heads);
                    try (CudaKvCache device = CudaKvCache.mirror(context, host);
                         CudaAttention attention = CudaAttention.create(context, cache, shape,
                                 AttentionPlan.of(1, 1, total, n));
                         DeviceBatch batch = DeviceBatch.allocate(context, 1, 2 * pages);
                         DeviceBuffer qd = AttentionGpuFixture.upload(context, q);
                         DeviceBuffer od = context.allocate(4L * n * heads * d)) {
                        batch.set(0, pagesOf(seq), seq.pageCount(), total);
                        batch.upload();
                        od.fillFloats(Float.NaN);
                        attention.prefill(device, 0, qd, batch, 0, start, n, od, context.defaultStream());
                        context.synchronize();
                        float[] out = AttentionGpuFixture.download(od, n * heads * d);
                        String what = kName + " head " + d + " pages of " + pageTokens + " common " + common
                                + "; seed " + seed;
                        assertTrue(allFinite(out), what + ": output has NaN/inf (unwritten or broken)");
                        double nmse = AttentionReference.nmse(out, ref);
                        System.out.printf(java.util.Locale.ROOT, "centered prefill %s: NMSE %.3e%n", what, nmse);
                        assertTrue(nmse < 2e-5, what + ": NMSE " + nmse + " against the float64 reference");
                    }
                }
            }
        }
    }

    /**
     * Prefill over pages of 8, 24 and 64 tokens gives the bits of 16-token pages (tiles follow positions; on sm_90a
     * the warpgroup kernel copies f16 rows a 16-byte chunk at a time and turbo rows a row at a time from wherever
     * their page lies, and non-power-of-two pages take the division path), for a prompt of one tile (100 tokens)
     * and one of 1,300 (eleven 128-token tiles: the stage rings and tile pairs wrap several times); every output
     * element is written (NaN poison first).
     */
    @ParameterizedTest(name = "{0}/{1}")
    @CsvSource({"turbo3,turbo3", "turbo2,turbo3", "turbo3,turbo2", "f16,f16", "q8_0,q8_0"})
    void prefillGivesTheSameBitsWhateverThePageSize(String kName, String vName) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        long seed = AttentionGpuFixture.seed("prefill page sizes " + kName + "/" + vName);
        KvGeometry g = new KvGeometry(1, KV_HEADS, 128, 128);
        int heads = KV_HEADS * 4, len = 1300;
        for (int n : new int[] {100, len}) {
            float[] first = null;
            for (int pageTokens : new int[] {16, 8, 24, 64}) {
                SplittableRandom r = new SplittableRandom(seed);   // the same rows and queries for every page size
                int pages = (len + pageTokens - 1) / pageTokens;
                try (KvCache host = new KvCache(g, KvFormat.parse(kName), KvFormat.parse(vName), pageTokens,
                        2 * pages)) {
                    KvSequence seq = everyOtherPage(host, n);
                    float[] k = AttentionGpuFixture.gaussianRows(r, n * KV_HEADS, 128, 1.0, 3);
                    float[] v = AttentionGpuFixture.gaussianRows(r, n * KV_HEADS, 128, 1.0, 0);
                    seq.writeRows(0, 0, n, k, 0, v, 0);
                    AttentionShape shape = AttentionShape.of(host, heads);
                    try (CudaKvCache device = CudaKvCache.mirror(context, host);
                         CudaAttention attention = CudaAttention.create(context, cache, shape,
                                 AttentionPlan.of(1, 1, len, len));
                         DeviceBatch batch = DeviceBatch.allocate(context, 1, 2 * pages);
                         DeviceBuffer qd = AttentionGpuFixture.upload(context,
                                 AttentionGpuFixture.gaussianRows(r, n * heads, 128, 1.0, 0));
                         DeviceBuffer od = context.allocate(4L * n * heads * 128)) {
                        batch.set(0, pagesOf(seq), seq.pageCount(), n);
                        batch.upload();
                        od.fillFloats(Float.NaN);
                        attention.prefill(device, 0, qd, batch, 0, 0, n, od, context.defaultStream());
                        context.synchronize();
                        float[] out = AttentionGpuFixture.download(od, n * heads * 128);
                        assertTrue(allFinite(out), kName + "/" + vName + " prefill of " + n + " over pages of "
                                + pageTokens + ": output has NaN/inf (unwritten or broken); seed " + seed);
                        if (first == null) {
                            first = out;
                        } else {
                            assertArrayEquals(first, out, kName + "/" + vName + " prefill of " + n + ": pages of "
                                    + pageTokens + " tokens gave other bits than pages of 16; seed " + seed);
                        }
                    }
                }
            }
        }
    }

    /**
     * A long prefill launch gives every query row the bits of a launch of its 32 queries alone: 2,400 queries at G = 4
     * are 75 row blocks x 8 kv heads = 600 blocks, several waves of an H200, against 8 blocks for 32 queries, and a
     * row's block — its kv head, its 128 rows, its tiles and causal masks — is the same in both, so any difference
     * is the launch's (a block mapped to the wrong rows or heads, a tile bound or page read taken from the launch
     * instead of the rows). Every output element is written (NaN poison first).
     */
    @ParameterizedTest(name = "{0}/{1}")
    @CsvSource({"turbo3,turbo3", "turbo3+mean,turbo3", "f16,f16", "q8_0,q8_0", "q4_0h,turbo4"})
    void aLongPrefillGivesEachRowTheBitsOfItsChunkAlone(String kName, String vName) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        long seed = AttentionGpuFixture.seed("long prefill " + kName + "/" + vName);
        SplittableRandom r = new SplittableRandom(seed);
        int d = 128, heads = KV_HEADS * 4, n = 2400, chunk = 32, pages = n / PAGE_TOKENS;
        KvFormat kf = KvFormat.parse(kName), vf = KvFormat.parse(vName);
        try (KvCache host = new KvCache(new KvGeometry(1, KV_HEADS, d, d), kf, vf, PAGE_TOKENS, 2 * pages)) {
            KvSequence seq = everyOtherPage(host, n);
            seq.writeRows(0, 0, n, AttentionGpuFixture.gaussianRows(r, n * KV_HEADS, d, 1.0, 3), 0,
                    AttentionGpuFixture.gaussianRows(r, n * KV_HEADS, d, 1.0, 0), 0);
            long rowBytes = 4L * heads * d;
            AttentionShape shape = AttentionShape.of(host, heads);
            try (CudaKvCache device = CudaKvCache.mirror(context, host);
                 CudaAttention attention = CudaAttention.create(context, cache, shape, AttentionPlan.of(1, 1, n, n));
                 DeviceBatch batch = DeviceBatch.allocate(context, 1, 2 * pages);
                 DeviceBuffer qd = AttentionGpuFixture.upload(context,
                         AttentionGpuFixture.gaussianRows(r, n * heads, d, 1.0, 0));
                 DeviceBuffer whole = context.allocate(rowBytes * n);
                 DeviceBuffer chunks = context.allocate(rowBytes * n)) {
                batch.set(0, pagesOf(seq), seq.pageCount(), n);
                batch.upload();
                whole.fillFloats(Float.NaN);
                chunks.fillFloats(Float.NaN);
                CudaStream stream = context.defaultStream();
                attention.prefill(device, 0, qd, batch, 0, 0, n, whole, stream);
                for (int start = 0; start < n; start += chunk) {
                    attention.prefill(device, 0, qd.slice(rowBytes * start, rowBytes * chunk), batch, 0, start, chunk,
                            chunks.slice(rowBytes * start, rowBytes * chunk), stream);
                }
                context.synchronize();
                float[] a = AttentionGpuFixture.download(whole, n * heads * d);
                float[] b = AttentionGpuFixture.download(chunks, n * heads * d);
                String what = kName + "/" + vName + " prefill of " + n + "; seed " + seed;
                assertTrue(allFinite(a), what + ": output has NaN/inf (unwritten or broken)");
                assertArrayEquals(b, a, what + ": rows differ from the launches of their 32 queries alone");
            }
        }
    }

    /**
     * A sequence of {@code tokens} reserved in {@code host} page by page in turn with a second one, so that it holds
     * every other page and its table is not the identity (a kernel that ignored the table would read the right rows
     * by luck).
     */
    private static KvSequence everyOtherPage(KvCache host, int tokens) {
        KvSequence other = host.newSequence();
        KvSequence seq = host.newSequence();
        int pageTokens = host.pageTokens();
        for (int p = 1; (p - 1) * pageTokens < tokens; p++) {
            other.reserve(p * pageTokens);
            seq.reserve(Math.min(tokens, p * pageTokens));
        }
        return seq;
    }

    private static int[] pagesOf(KvSequence seq) {
        int[] pages = new int[seq.pageCount()];
        for (int p = 0; p < pages.length; p++) {
            pages[p] = seq.page(p);
        }
        return pages;
    }

    @ParameterizedTest(name = "{0}/{1} head {2}/{3}")
    @MethodSource("shapes")
    void multiQueryDecodeIsCausalAmongItsQueries(String kName, String vName, int dK, int dV) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        Data data = data(kName, vName, dK, dV);
        long seed = AttentionGpuFixture.seed("multi-query " + kName + "/" + vName + " " + dK + "/" + dV);
        SplittableRandom r = new SplittableRandom(seed);
        int[][] cases = {{2, 3}, {8, 8}, {4, 5}};
        for (int[] c : cases) {
            int group = c[0], queries = c[1];
            int heads = KV_HEADS * group;
            int[] lens = {LENS[1], LENS[2]};
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                    AttentionPlan.of(2, AttentionPlan.MAX_QUERIES, MAX_TOKENS, 0));
                 DeviceBatch batch = batch(context, data, new int[] {1, 2}, lens)) {
                float[] q = AttentionGpuFixture.gaussianRows(r, 2 * queries * heads, dK, 1.0, 0);
                float[] out = decode(context, attention, data, batch, q, 2, queries, heads);
                double[] tight = new double[2 * queries * heads * dV];
                double[] loose = new double[tight.length];
                double scale = 1 / Math.sqrt(dK);
                IntStream.range(0, 2 * queries).parallel().forEach(row -> {
                    int s = row / queries, i = row % queries;
                    int visible = lens[s] - queries + i + 1;
                    AttentionReference.attend(data.kDecoded()[s + 1], data.vDecoded()[s + 1], q, row * heads * dK,
                            heads, visible, scale, tight, row * heads * dV);
                    AttentionReference.attend(data.kExact()[s + 1], data.vExact()[s + 1], q, row * heads * dK,
                            heads, visible, scale, loose, row * heads * dV);
                });
                check("multi-query G=" + group + " queries=" + queries, out, tight, loose, kName, vName, seed);
            }
        }
    }

    @ParameterizedTest(name = "{0}/{1} head {2}/{3}")
    @MethodSource("shapes")
    void prefillChunksMatchFloat64Reference(String kName, String vName, int dK, int dV) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        Data data = data(kName, vName, dK, dV);
        long seed = AttentionGpuFixture.seed("prefill " + kName + "/" + vName + " " + dK + "/" + dV);
        SplittableRandom r = new SplittableRandom(seed);
        // {group, sequence, start, n}: a whole prompt from 0, and a late chunk after earlier ones.
        int[][] cases = {{4, 1, 0, 150}, {4, 2, 441, 74}, {1, 2, 500, 15}, {8, 1, 64, 86}};
        for (int[] c : cases) {
            int group = c[0], s = c[1], start = c[2], n = c[3];
            int heads = KV_HEADS * group;
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                    AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 256));
                 DeviceBatch batch = batch(context, data, new int[] {0, 1, 2}, LENS);
                 DeviceBuffer qd = AttentionGpuFixture.upload(context,
                         AttentionGpuFixture.gaussianRows(r, n * heads, dK, 1.0, 0));
                 DeviceBuffer od = context.allocate(4L * n * heads * dV)) {
                float[] q = AttentionGpuFixture.download(qd, n * heads * dK);
                od.fillFloats(Float.NaN);
                attention.prefill(data.device(), 0, qd, batch, s, start, n, od, context.defaultStream());
                context.synchronize();
                float[] out = AttentionGpuFixture.download(od, n * heads * dV);
                double[] tight = new double[n * heads * dV];
                double[] loose = new double[tight.length];
                double scale = 1 / Math.sqrt(dK);
                IntStream.range(0, n).parallel().forEach(i -> {
                    AttentionReference.attend(data.kDecoded()[s], data.vDecoded()[s], q, i * heads * dK, heads,
                            start + i + 1, scale, tight, i * heads * dV);
                    AttentionReference.attend(data.kExact()[s], data.vExact()[s], q, i * heads * dK, heads,
                            start + i + 1, scale, loose, i * heads * dV);
                });
                check("prefill G=" + group + " start=" + start + " n=" + n, out, tight, loose, kName, vName, seed);
            }
        }
    }

    /**
     * A prefill in the rotated basis (the model's: queries rotated into K's basis before, output left in V's and turned
     * back after) gives the plain call's bits, with the rotations done here by {@link Rotation} (the device's rotation
     * is the CPU's, bit for bit): for every standard format pair and head size, a whole prompt and a late chunk, every
     * output element written (NaN poison first). The rotation blocks the attention names are K's and V's.
     */
    @ParameterizedTest(name = "{0}/{1} head {2}/{3}")
    @MethodSource("shapes")
    void prefillInTheRotatedBasisGivesThePlainBits(String kName, String vName, int dK, int dV) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        Data data = data(kName, vName, dK, dV);
        long seed = AttentionGpuFixture.seed("rotated prefill " + kName + "/" + vName + " " + dK + "/" + dV);
        SplittableRandom r = new SplittableRandom(seed);
        KvFormat kf = PageMeanFormat.rows(KvFormat.parse(kName)), vf = KvFormat.parse(vName);
        int[][] cases = {{4, 1, 0, 150}, {4, 2, 441, 74}};
        for (int[] c : cases) {
            int group = c[0], s = c[1], start = c[2], n = c[3];
            int heads = KV_HEADS * group;
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            float[] q = AttentionGpuFixture.gaussianRows(r, n * heads, dK, 1.0, 0);
            float[] qRotated = q.clone();
            try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                    AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 256));
                 DeviceBatch batch = batch(context, data, new int[] {0, 1, 2}, LENS);
                 DeviceBuffer od = context.allocate(4L * n * heads * dV)) {
                assertEquals(rotated(kf) ? Rotation.blockSize(dK) : 0, attention.queryRotation(), "K's rotation");
                assertEquals(rotated(vf) ? Rotation.blockSize(dV) : 0, attention.outputRotation(), "V's rotation");
                if (attention.queryRotation() != 0) {
                    for (int row = 0; row < n * heads; row++) {
                        Rotation.forwardRow(qRotated, row * dK, dK);
                    }
                }
                float[][] outs = new float[2][];
                for (int pass = 0; pass < 2; pass++) {
                    try (DeviceBuffer qd = AttentionGpuFixture.upload(context, pass == 0 ? q : qRotated)) {
                        od.fillFloats(Float.NaN);
                        attention.prefill(data.device(), 0, qd, batch, s, start, n, od, pass == 1,
                                context.defaultStream());
                        context.synchronize();
                        outs[pass] = AttentionGpuFixture.download(od, n * heads * dV);
                    }
                }
                if (attention.outputRotation() != 0) {
                    for (int row = 0; row < n * heads; row++) {
                        Rotation.inverseRow(outs[1], row * dV, dV);
                    }
                }
                String what = kName + "/" + vName + " " + dK + "/" + dV + " prefill of " + n + " at " + start;
                assertTrue(allFinite(outs[0]), what + ": output has NaN/inf; seed " + seed);
                assertArrayEquals(outs[0], outs[1], what + ": the rotated basis gave other bits; seed " + seed);
            }
        }
    }

    /**
     * A decode step's call (queries rotated into K's basis by its RoPE write, CudaAttention.decode with rotatedBasis)
     * gives the plain call's bits, the rotation done here by {@link Rotation}: every standard format pair and head
     * size, groups of 4 and 8, the three sequences of one batch, every output element written (NaN poison first).
     */
    @ParameterizedTest(name = "{0}/{1} head {2}/{3}")
    @MethodSource("shapes")
    void decodeInTheRotatedBasisGivesThePlainBits(String kName, String vName, int dK, int dV) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        Data data = data(kName, vName, dK, dV);
        long seed = AttentionGpuFixture.seed("rotated decode " + kName + "/" + vName + " " + dK + "/" + dV);
        SplittableRandom r = new SplittableRandom(seed);
        for (int group : new int[] {4, 8}) {
            int heads = KV_HEADS * group;
            int rows = LENS.length * heads;
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            float[] q = AttentionGpuFixture.gaussianRows(r, rows, dK, 1.0, 0);
            float[] qRotated = q.clone();
            try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                    AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 0));
                 DeviceBatch batch = batch(context, data, new int[] {0, 1, 2}, LENS);
                 DeviceBuffer od = context.allocate(4L * rows * dV)) {
                if (attention.queryRotation() != 0) {
                    for (int row = 0; row < rows; row++) {
                        Rotation.forwardRow(qRotated, row * dK, dK);
                    }
                }
                float[][] outs = new float[2][];
                for (int pass = 0; pass < 2; pass++) {
                    try (DeviceBuffer qd = AttentionGpuFixture.upload(context, pass == 0 ? q : qRotated)) {
                        od.fillFloats(Float.NaN);
                        attention.decode(data.device(), 0, qd, batch, LENS.length, od, null, null, pass == 1,
                                context.defaultStream());
                        context.synchronize();
                        outs[pass] = AttentionGpuFixture.download(od, rows * dV);
                    }
                }
                String what = kName + "/" + vName + " " + dK + "/" + dV + " decode G=" + group;
                assertTrue(allFinite(outs[0]), what + ": output has NaN/inf; seed " + seed);
                assertArrayEquals(outs[0], outs[1], what + ": the rotated basis gave other bits; seed " + seed);
            }
        }
    }

    /** Whether a format's rows are in the rotated basis (kv_format.cuh fmt_rotated: q4_0h and the turbo formats). */
    private static boolean rotated(KvFormat f) {
        return f instanceof TurboFormat || f == Q4Format.Q4_0H;
    }

    /**
     * Peaked attention (queries x4): dropping the V rows whose weight is under 1e-3 of the running maximum changes
     * the output (so rows were skipped) but stays within 1e-4 NMSE of the dense float64 result.
     */
    @Test
    void sparseVSkipsNegligibleRowsAndStaysCloseToDense() {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        for (String name : new String[] {"turbo3", "f16"}) {
            Data data = data(name, name, 128, 128);
            long seed = AttentionGpuFixture.seed("sparse V " + name);
            SplittableRandom r = new SplittableRandom(seed);
            int heads = KV_HEADS * 4;
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            AttentionPlan plan = AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 0);
            float scale = (float) (1 / Math.sqrt(128));
            try (CudaAttention dense = CudaAttention.create(context, cache, shape, plan, scale, 0f);
                 CudaAttention sparse = CudaAttention.create(context, cache, shape, plan, scale, 1e-3f);
                 DeviceBatch batch = batch(context, data, new int[] {0, 1, 2}, LENS)) {
                float[] q = AttentionGpuFixture.gaussianRows(r, LENS.length * heads, 128, 4.0, 0);
                float[] d = decode(context, dense, data, batch, q, LENS.length, 1, heads);
                float[] s = decode(context, sparse, data, batch, q, LENS.length, 1, heads);
                double[] ref = new double[d.length];
                for (int i = 0; i < LENS.length; i++) {
                    AttentionReference.attend(data.kDecoded()[i], data.vDecoded()[i], q, i * heads * 128, heads,
                            LENS[i], scale, ref, i * heads * 128);
                }
                double nmseDense = AttentionReference.nmse(d, ref);
                double nmseSparse = AttentionReference.nmse(s, ref);
                System.out.printf("sparse V %s: NMSE dense %.3e, sparse (1e-3) %.3e%n", name, nmseDense, nmseSparse);
                assertFalse(Arrays.equals(d, s), "sparse V changed nothing: no weight under 1e-3? seed " + seed);
                assertTrue(nmseSparse < 1e-4, "sparse V NMSE " + nmseSparse + " vs dense reference; seed " + seed);
            }
        }
    }

    /**
     * A decode captured once as a graph, replayed after the lengths in device memory changed: both replays must
     * match the reference at their own lengths (a graph that froze the first lengths would fail the second).
     */
    @Test
    void capturedDecodeGraphReplaysAtTwoDifferentLengths() {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        for (String name : new String[] {"f16", "turbo3", "q8_0"}) {
            Data data = data(name, name, 128, 128);
            long seed = AttentionGpuFixture.seed("graph " + name);
            SplittableRandom r = new SplittableRandom(seed);
            int heads = KV_HEADS * 4;
            AttentionShape shape = AttentionShape.of(data.host(), heads);
            int[][] lengths = {{1, 97, 260}, {1, 150, 515}};
            try (CudaAttention attention = CudaAttention.create(context, cache, shape,
                    AttentionPlan.of(LENS.length, 1, MAX_TOKENS, 0));
                 DeviceBatch batch = batch(context, data, new int[] {0, 1, 2}, lengths[0]);
                 CudaStream stream = context.createStream();
                 DeviceBuffer qd = AttentionGpuFixture.upload(context,
                         AttentionGpuFixture.gaussianRows(r, LENS.length * heads, 128, 1.0, 0));
                 DeviceBuffer od = context.allocate(4L * LENS.length * heads * 128)) {
                float[] q = AttentionGpuFixture.download(qd, LENS.length * heads * 128);
                try (CudaGraph graph = CudaGraph.capture(stream,
                        () -> attention.decode(data.device(), 0, qd, batch, LENS.length, od, stream))) {
                    for (int[] lens : lengths) {
                        for (int s = 0; s < lens.length; s++) {
                            batch.setLength(s, lens[s]);
                        }
                        batch.upload();
                        od.fillFloats(Float.NaN);
                        graph.launch(stream);
                        stream.synchronize();
                        float[] out = AttentionGpuFixture.download(od, LENS.length * heads * 128);
                        double[] ref = new double[out.length];
                        for (int s = 0; s < lens.length; s++) {
                            AttentionReference.attend(data.kDecoded()[s], data.vDecoded()[s], q, s * heads * 128,
                                    heads, lens[s], 1 / Math.sqrt(128), ref, s * heads * 128);
                        }
                        double nmse = AttentionReference.nmse(out, ref);
                        System.out.printf("graph %s lengths %s: NMSE %.3e%n", name, Arrays.toString(lens), nmse);
                        assertTrue(allFinite(out), "graph replay left unwritten (NaN) outputs at lengths "
                                + Arrays.toString(lens) + "; seed " + seed);
                        assertTrue(nmse < tightBound(name, name), "graph replay at lengths " + Arrays.toString(lens)
                                + ": NMSE " + nmse + "; seed " + seed);
                    }
                }
            }
        }
    }

    // ---- helpers

    static DeviceBatch batch(CudaContext context, Data data, int[] seqIndices, int[] lens) {
        DeviceBatch batch = DeviceBatch.allocate(context, seqIndices.length, 48);
        for (int i = 0; i < seqIndices.length; i++) {
            KvSequence s = data.seqs()[seqIndices[i]];
            int[] pages = new int[s.pageCount()];
            for (int p = 0; p < pages.length; p++) {
                pages[p] = s.page(p);
            }
            batch.set(i, pages, pages.length, lens[i]);
        }
        batch.upload();
        return batch;
    }

    static float[] decode(CudaContext context, CudaAttention attention, Data data, DeviceBatch batch, float[] q,
                          int seqs, int queries, int heads) {
        int dV = data.dV();
        try (DeviceBuffer qd = AttentionGpuFixture.upload(context, q);
             DeviceBuffer od = context.allocate(4L * seqs * queries * heads * dV)) {
            od.fillFloats(Float.NaN);
            attention.decodeMulti(data.device(), 0, qd, batch, seqs, queries, od, context.defaultStream());
            context.synchronize();
            return AttentionGpuFixture.download(od, seqs * queries * heads * dV);
        }
    }

    static void check(String what, float[] out, double[] tight, double[] loose, String kName, String vName,
                      long seed) {
        assertTrue(allFinite(out), what + " " + kName + "/" + vName + ": output has NaN/inf (unwritten or broken); "
                + "seed " + seed);
        double nTight = AttentionReference.nmse(out, tight);
        double nLoose = AttentionReference.nmse(out, loose);
        System.out.printf("%s %s/%s: NMSE vs decoded-cache reference %.3e, vs exact rows %.3e%n", what, kName, vName,
                nTight, nLoose);
        assertTrue(nTight < tightBound(kName, vName), what + " " + kName + "/" + vName + ": NMSE " + nTight
                + " against the float64 reference over the decoded cache exceeds " + tightBound(kName, vName)
                + "; seed " + seed);
        assertTrue(nLoose < looseBound(kName, vName), what + " " + kName + "/" + vName + ": NMSE " + nLoose
                + " against the float64 reference over the exact rows exceeds " + looseBound(kName, vName)
                + "; seed " + seed);
    }

    static boolean allFinite(float[] x) {
        for (float v : x) {
            if (!Float.isFinite(v)) {
                return false;
            }
        }
        return true;
    }

    static {
        // A format outside the lists above would silently get the loosest bound; keep the table complete.
        for (KvFormat f : KvFormat.all()) {
            if (loose(f.name()) == 0.8 && !(f instanceof TurboFormat t && t.bits() == 2)) {
                throw new IllegalStateException("no error bound for KV format " + f.name());
            }
        }
    }
}
