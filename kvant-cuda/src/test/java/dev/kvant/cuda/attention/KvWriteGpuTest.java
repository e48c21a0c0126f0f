package dev.kvant.cuda.attention;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.KernelCache;
import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/** Quantize-on-write on the device against the CPU encoder: the same bytes, in the same slots of the same pages. */
@Tag("gpu")
class KvWriteGpuTest {
    static final int KV_HEADS = 8;
    static final int PAGE_TOKENS = 16;
    static final int PAGES = 8;

    static Stream<Arguments> formatsAndHeadSizes() {
        List<Arguments> all = new ArrayList<>();
        for (int d : new int[] {64, 128, 256}) {
            for (KvFormat f : KvFormat.all()) {
                all.add(Arguments.of(f.name(), d));
            }
        }
        return all.stream();
    }

    /**
     * Two sequences with interleaved pages (37 and 21 tokens, rows from 1e-3 to 1e3 in scale, some with outlier
     * channels) plus one token whose slot is -1, written by the CPU into a host cache and by the device into a
     * poisoned device cache: every written row must be byte-identical, pages nobody wrote must keep their poison,
     * and a second device run, writing the rows a few tokens at a time (the short writes' kernel), the same bytes.
     */
    @ParameterizedTest(name = "{0} head {1}")
    @MethodSource("formatsAndHeadSizes")
    void deviceEncoderWritesTheCpuEncodersBytes(String formatName, int d) {
        KvFormat f = KvFormat.parse(formatName);
        long seed = AttentionGpuFixture.seed("deviceEncoderWritesTheCpuEncodersBytes " + formatName + " " + d);
        SplittableRandom r = new SplittableRandom(seed);
        KvGeometry g = new KvGeometry(1, KV_HEADS, d, d);
        int[] lens = {37, 21};
        int tokens = lens[0] + lens[1];
        assertTrue(5 * KV_HEADS <= CudaAttention.GAIN_WRITER_ROWS
                && (tokens + 1) * KV_HEADS > CudaAttention.GAIN_WRITER_ROWS, "the two runs take the two writers");
        float[] k = rows(r, tokens + 1, d);
        float[] v = rows(r, tokens + 1, d);
        try (KvCache host = new KvCache(g, f, f, PAGE_TOKENS, PAGES)) {
            KvSequence a = host.newSequence();
            KvSequence b = host.newSequence();
            a.reserve(16);
            b.reserve(16);
            a.reserve(lens[0]);
            b.reserve(lens[1]);
            a.writeRows(0, 0, lens[0], k, 0, v, 0);
            b.writeRows(0, 0, lens[1], k, lens[0] * KV_HEADS * d, v, lens[0] * KV_HEADS * d);
            int[] slots = new int[tokens + 1];
            for (int t = 0; t < tokens; t++) {
                KvSequence s = t < lens[0] ? a : b;
                int pos = t < lens[0] ? t : t - lens[0];
                slots[t] = s.page(pos / PAGE_TOKENS) * PAGE_TOKENS + pos % PAGE_TOKENS;
            }
            slots[tokens] = -1;
            AttentionShape shape = AttentionShape.of(host, 4 * KV_HEADS);
            byte[][] first = null;
            // one write of all rows (one warp a row), then writes of up to 5 tokens as decode steps make them (one
            // block a row)
            for (int perWrite : new int[] {tokens + 1, 5}) {
                byte[][] got = deviceWrite(g, f, PAGES, shape, k, v, slots, tokens + 1, perWrite);
                compare("K", host.kPool(0).toArray(ValueLayout.JAVA_BYTE), got[0], host, a, b, lens,
                        host.kRowBytes(), host.kPageBytes(), seed);
                compare("V", host.vPool(0).toArray(ValueLayout.JAVA_BYTE), got[1], host, a, b, lens,
                        host.vRowBytes(), host.vPageBytes(), seed);
                int unused = PAGES - 1;
                assertEquals((byte) 0xA5, got[0][(int) (unused * host.kPageBytes())],
                        "page " + unused + " was written though no slot points there; seed " + seed);
                if (first == null) {
                    first = got;
                } else {
                    assertArrayEquals(first[0], got[0], "K bytes differ between one write and short writes; seed "
                            + seed);
                    assertArrayEquals(first[1], got[1], "V bytes differ between one write and short writes; seed "
                            + seed);
                }
            }
        }
    }

    /**
     * The K and V pools (layer 0) of a device cache poisoned with 0xA5 after the device wrote the rows of tokens [0,
     * n) into their slots, perWrite tokens a write.
     */
    private static byte[][] deviceWrite(KvGeometry g, KvFormat f, int pages, AttentionShape shape, float[] k,
                                        float[] v, int[] slots, int n, int perWrite) {
        CudaContext context = AttentionGpuFixture.context();
        int kRow = KV_HEADS * g.headDimK(), vRow = KV_HEADS * g.headDimV();
        try (CudaKvCache dev = CudaKvCache.allocate(context, g, f, f, PAGE_TOKENS, pages);
             CudaAttention attention = CudaAttention.create(context, AttentionGpuFixture.cache(), shape,
                     AttentionPlan.of(1, 1, 64, 0));
             DeviceBuffer kd = AttentionGpuFixture.upload(context, k);
             DeviceBuffer vd = AttentionGpuFixture.upload(context, v);
             DeviceBuffer sd = AttentionGpuFixture.upload(context, slots)) {
            dev.kPool(0).fillBytes((byte) 0xA5);
            dev.vPool(0).fillBytes((byte) 0xA5);
            for (int t = 0; t < n; t += perWrite) {
                int m = Math.min(perWrite, n - t);
                attention.quantizeRows(dev, 0, kd.slice(4L * t * kRow, 4L * m * kRow),
                        vd.slice(4L * t * vRow, 4L * m * vRow), sd.slice(4L * t, 4L * m), m, context.defaultStream());
            }
            context.synchronize();
            return new byte[][] {AttentionGpuFixture.downloadBytes(dev.kPool(0)),
                    AttentionGpuFixture.downloadBytes(dev.vPool(0))};
        }
    }

    /**
     * f16 rows past the half range saturate to ±65504 and a NaN keeps its sign and payload bits, on the device as
     * HalfFormat does on the CPU (an infinity in a V row would turn the zero weight of a masked row into NaN in a
     * prefill or multi-query call): the same bytes for a token of such values, one write.
     */
    @Test
    void halfRowsSaturateAndKeepTheirNaNsAsTheCpuDoes() {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        KvFormat f = KvFormat.parse("f16");
        int d = 128;
        KvGeometry g = new KvGeometry(1, KV_HEADS, d, d);
        float[] special = {1e6f, -1e6f, Float.POSITIVE_INFINITY, Float.NEGATIVE_INFINITY, Float.NaN,
                Float.intBitsToFloat(0xff812345), 65519f, 65520f, -0f, 1.5f, 3e-8f};
        float[] k = new float[KV_HEADS * d];
        float[] v = new float[KV_HEADS * d];
        for (int i = 0; i < k.length; i++) {
            k[i] = special[i % special.length];
            v[i] = special[(i + 5) % special.length];
        }
        try (KvCache host = new KvCache(g, f, f, PAGE_TOKENS, PAGES)) {
            KvSequence a = host.newSequence();
            a.reserve(1);
            a.writeRows(0, 0, 1, k, 0, v, 0);
            int[] slots = {a.page(0) * PAGE_TOKENS};
            AttentionShape shape = AttentionShape.of(host, 4 * KV_HEADS);
            try (CudaKvCache dev = CudaKvCache.allocate(context, g, f, f, PAGE_TOKENS, PAGES);
                 CudaAttention attention = CudaAttention.create(context, cache, shape, AttentionPlan.of(1, 1, 64, 0));
                 DeviceBuffer kd = AttentionGpuFixture.upload(context, k);
                 DeviceBuffer vd = AttentionGpuFixture.upload(context, v);
                 DeviceBuffer sd = AttentionGpuFixture.upload(context, slots)) {
                dev.kPool(0).fillBytes((byte) 0xA5);
                dev.vPool(0).fillBytes((byte) 0xA5);
                attention.quantizeRows(dev, 0, kd, vd, sd, 1, context.defaultStream());
                context.synchronize();
                int at = (int) (a.page(0) * host.kPageBytes());
                int n = (int) host.kRowBytes() * KV_HEADS;
                byte[] want = host.kPool(0).toArray(ValueLayout.JAVA_BYTE);
                byte[] got = AttentionGpuFixture.downloadBytes(dev.kPool(0));
                assertArrayEquals(Arrays.copyOfRange(want, at, at + n), Arrays.copyOfRange(got, at, at + n), "K");
                at = (int) (a.page(0) * host.vPageBytes());
                n = (int) host.vRowBytes() * KV_HEADS;
                want = host.vPool(0).toArray(ValueLayout.JAVA_BYTE);
                got = AttentionGpuFixture.downloadBytes(dev.vPool(0));
                assertArrayEquals(Arrays.copyOfRange(want, at, at + n), Arrays.copyOfRange(got, at, at + n), "V");
            }
        }
    }

    static Stream<String> formatNames() {
        return KvFormat.all().stream().map(KvFormat::name);
    }

    /**
     * Rows holding NaN (quiet and with a payload), ±inf, a value past the f16 range, all zeros, with ordinary rows
     * between: the device's rows decode (by the CPU decoder) to the CPU's values, NaN where the CPU's are NaN, for
     * one write of every row (a warp a row) and for token-at-a-time writes (a block a row). A NaN in a q8_0 or int8
     * block made a finite scale and codes of -127 on the device (fmaxf drops NaN; Java's max keeps it), so the block
     * decoded to numbers. A NaN computed from other values may carry other payload bits on the two, so values, not
     * bytes, are compared.
     */
    @ParameterizedTest(name = "{0}")
    @MethodSource("formatNames")
    void nonFiniteValuesDecodeToTheCpusValues(String formatName) {
        KvFormat f = KvFormat.parse(formatName);
        int d = 128;
        long seed = AttentionGpuFixture.seed("nonFiniteValuesDecodeToTheCpusValues " + formatName);
        SplittableRandom r = new SplittableRandom(seed);
        KvGeometry g = new KvGeometry(1, KV_HEADS, d, d);
        int tokens = CudaAttention.GAIN_WRITER_ROWS / KV_HEADS + 1;   // one write takes the warp-a-row writer
        float[] k = rows(r, tokens, d);
        float[] v = rows(r, tokens, d);
        float[] special = {Float.NaN, Float.POSITIVE_INFINITY, Float.NEGATIVE_INFINITY, 1e30f,
                Float.intBitsToFloat(0xff812345), 0f};
        for (int t = 0; t < 4; t++) {   // the first four tokens: one special value a head, at a different place
            for (int h = 0; h < special.length; h++) {
                int row = (t * KV_HEADS + h) * d;
                int at = (37 * (h + t) + 5) % d;
                if (special[h] == 0f) {
                    Arrays.fill(k, row, row + d, 0f);
                    Arrays.fill(v, row, row + d, -0f);
                } else {
                    k[row + at] = special[(h + t) % special.length];
                    v[row + (at + 64) % d] = special[h];
                }
            }
        }
        int pages = (tokens + PAGE_TOKENS - 1) / PAGE_TOKENS + 1;
        try (KvCache host = new KvCache(g, f, f, PAGE_TOKENS, pages)) {
            KvSequence a = host.newSequence();
            a.reserve(tokens);
            a.writeRows(0, 0, tokens, k, 0, v, 0);
            int[] slots = new int[tokens];
            for (int t = 0; t < tokens; t++) {
                slots[t] = a.page(t / PAGE_TOKENS) * PAGE_TOKENS + t % PAGE_TOKENS;
            }
            AttentionShape shape = AttentionShape.of(host, 4 * KV_HEADS);
            byte[] wantK = host.kPool(0).toArray(ValueLayout.JAVA_BYTE);
            byte[] wantV = host.vPool(0).toArray(ValueLayout.JAVA_BYTE);
            // every row in one write, then the four special tokens a token a write
            for (int[] run : new int[][] {{tokens, tokens}, {4, 1}}) {
                byte[][] got = deviceWrite(g, f, pages, shape, k, v, slots, run[0], run[1]);
                String what = formatName + (run[1] > 1 ? ", one write" : ", a token a write") + ", seed " + seed;
                compareDecoded("K", f, wantK, got[0], host.kRowBytes(), host.kPageBytes(), a, run[0], d, what);
                compareDecoded("V", f, wantV, got[1], host.vRowBytes(), host.vPageBytes(), a, run[0], d, what);
            }
        }
    }

    /** The first tokens rows of sequence s decoded from want and from got: equal values, NaN for NaN. */
    private static void compareDecoded(String side, KvFormat f, byte[] want, byte[] got, long rowBytes, long pageBytes,
                                       KvSequence s, int tokens, int d, String what) {
        float[] w = new float[d], o = new float[d];
        for (int t = 0; t < tokens; t++) {
            for (int h = 0; h < KV_HEADS; h++) {
                long off = s.page(t / PAGE_TOKENS) * pageBytes + ((long) (t % PAGE_TOKENS) * KV_HEADS + h) * rowBytes;
                f.decode(MemorySegment.ofArray(want), off, d, w, 0);
                f.decode(MemorySegment.ofArray(got), off, d, o, 0);
                for (int i = 0; i < d; i++) {
                    if (Float.floatToIntBits(w[i]) != Float.floatToIntBits(o[i])) {
                        fail(side + " token " + t + " head " + h + " value " + i + " (" + what + "): the device's row "
                                + "decodes to " + o[i] + ", the CPU's to " + w[i]);
                    }
                }
            }
        }
    }

    /** AttentionPrecompile's centered write shapes (their modules come precompiled with the suite). */
    static Stream<Arguments> centeredFormats() {
        return AttentionPrecompile.centeredWriteShapes().stream()
                .map(s -> Arguments.of(s.kFormat().name(), s.headDimK()));
    }

    /**
     * Keys centered on their page's mean: the device's page means (kvant_kv_page_means) and centered rows equal the
     * CPU's, through every case of the rule — pages whole in a write (own mean), a quarter page ending a write
     * (own), one row after a previous page of the same write (own), two rows opening a first page (0), and a later
     * one-token write opening a page at its start (the previous page's stored mean).
     */
    @ParameterizedTest(name = "{0} head {1}")
    @MethodSource("centeredFormats")
    void pageMeansAndCenteredRowsAreTheCpuBytes(String formatName, int d) {
        CudaContext context = AttentionGpuFixture.context();
        KernelCache cache = AttentionGpuFixture.cache();
        KvFormat f = KvFormat.parse(formatName);
        KvFormat vf = KvFormat.parse("q8_0");
        long seed = AttentionGpuFixture.seed("pageMeansAndCenteredRowsAreTheCpuBytes " + formatName + " " + d);
        SplittableRandom r = new SplittableRandom(seed);
        KvGeometry g = new KvGeometry(1, KV_HEADS, d, d);
        int[] lens = {3 * PAGE_TOKENS, PAGE_TOKENS + PAGE_TOKENS / 4 + 1, PAGE_TOKENS + 1, 2};
        int tokens = 0;
        for (int len : lens) {
            tokens += len;
        }
        float[] k = rows(r, tokens + 1, d);
        float[] v = rows(r, tokens + 1, d);
        // a shared offset per channel, as real keys have
        for (int i = 0; i < k.length; i++) {
            k[i] += 4f * (float) Math.sin(i % (KV_HEADS * d));
        }
        try (KvCache host = new KvCache(g, f, vf, PAGE_TOKENS, 16)) {
            KvSequence[] seqs = new KvSequence[lens.length];
            int[] slots = new int[tokens];
            int[] prev = new int[tokens];
            int t = 0;
            for (int s = 0; s < lens.length; s++) {
                seqs[s] = host.newSequence();
                seqs[s].writeRows(0, 0, lens[s], k, t * KV_HEADS * d, v, t * KV_HEADS * d);
                for (int pos = 0; pos < lens[s]; pos++, t++) {
                    slots[t] = seqs[s].page(pos / PAGE_TOKENS) * PAGE_TOKENS + pos % PAGE_TOKENS;
                    prev[t] = pos < PAGE_TOKENS ? -1 : -2;   // each sequence is one write from 0
                }
            }
            // the decode step of sequence 0: one token opening page 3
            seqs[0].writeRows(0, lens[0], 1, k, tokens * KV_HEADS * d, v, tokens * KV_HEADS * d);
            int[] slot2 = {seqs[0].page(3) * PAGE_TOKENS};
            int[] prev2 = {seqs[0].page(2)};
            AttentionShape shape = AttentionShape.of(host, 4 * KV_HEADS);
            try (CudaKvCache dev = CudaKvCache.allocate(context, g, f, vf, PAGE_TOKENS, 16);
                 CudaAttention attention = CudaAttention.create(context, cache, shape, AttentionPlan.of(1, 1, 64, 0));
                 DeviceBuffer kd = AttentionGpuFixture.upload(context, k);
                 DeviceBuffer vd = AttentionGpuFixture.upload(context, v);
                 DeviceBuffer sd = AttentionGpuFixture.upload(context, slots);
                 DeviceBuffer pd = AttentionGpuFixture.upload(context, prev);
                 DeviceBuffer kd2 = AttentionGpuFixture.upload(context, java.util.Arrays.copyOfRange(k,
                         tokens * KV_HEADS * d, (tokens + 1) * KV_HEADS * d));
                 DeviceBuffer vd2 = AttentionGpuFixture.upload(context, java.util.Arrays.copyOfRange(v,
                         tokens * KV_HEADS * d, (tokens + 1) * KV_HEADS * d));
                 DeviceBuffer sd2 = AttentionGpuFixture.upload(context, slot2);
                 DeviceBuffer pd2 = AttentionGpuFixture.upload(context, prev2)) {
                dev.kPool(0).fillBytes((byte) 0xA5);
                dev.vPool(0).fillBytes((byte) 0xA5);
                attention.quantizeRows(dev, 0, kd, vd, sd, pd, tokens, context.defaultStream());
                attention.quantizeRows(dev, 0, kd2, vd2, sd2, pd2, 1, context.defaultStream());
                context.synchronize();
                byte[] want = host.kPool(0).toArray(ValueLayout.JAVA_BYTE);
                byte[] got = AttentionGpuFixture.downloadBytes(dev.kPool(0));
                long rb = host.kRowBytes();
                long pb = host.kPageBytes();
                lens[0]++;
                for (int s = 0; s < lens.length; s++) {
                    for (int lp = 0; lp < seqs[s].pageCount(); lp++) {
                        int page = seqs[s].page(lp);
                        long means = page * pb + host.kMeanOffset(0);
                        for (long i = means; i < (page + 1) * pb; i++) {
                            if (want[(int) i] != got[(int) i]) {
                                fail("mean of sequence " + s + " page " + lp + " (" + formatName + ", head " + d
                                        + "): byte " + (i - means) + " is " + hex(got[(int) i]) + ", the CPU wrote "
                                        + hex(want[(int) i]) + "; seed " + seed);
                            }
                        }
                        int rowsHere = Math.min(PAGE_TOKENS, lens[s] - lp * PAGE_TOKENS);
                        for (long i = page * pb; i < page * pb + rowsHere * KV_HEADS * rb; i++) {
                            if (want[(int) i] != got[(int) i]) {
                                long row = (i - page * pb) / rb;
                                fail("row of sequence " + s + " position " + (lp * PAGE_TOKENS + row / KV_HEADS)
                                        + " head " + row % KV_HEADS + " (" + formatName + ", head " + d + "): byte "
                                        + (i - page * pb) % rb + " is " + hex(got[(int) i]) + ", the CPU wrote "
                                        + hex(want[(int) i]) + "; seed " + seed);
                            }
                        }
                    }
                }
            }
        }
    }

    private static float[] rows(SplittableRandom r, int tokens, int d) {
        float[] x = AttentionGpuFixture.gaussianRows(r, tokens * KV_HEADS, d, 1.0, 5);
        for (int row = 0; row < tokens * KV_HEADS; row++) {
            float scale = (float) Math.pow(10, r.nextDouble(-3, 3));
            for (int i = 0; i < d; i++) {
                x[row * d + i] *= scale;
            }
        }
        return x;
    }

    private static void compare(String what, byte[] expected, byte[] actual, KvCache host, KvSequence a, KvSequence b,
                                int[] lens, long rowBytes, long pageBytes, long seed) {
        KvSequence[] seqs = {a, b};
        for (int s = 0; s < 2; s++) {
            for (int pos = 0; pos < lens[s]; pos++) {
                int page = seqs[s].page(pos / PAGE_TOKENS);
                for (int h = 0; h < KV_HEADS; h++) {
                    long off = page * pageBytes + ((long) (pos % PAGE_TOKENS) * KV_HEADS + h) * rowBytes;
                    for (int i = 0; i < rowBytes; i++) {
                        if (expected[(int) (off + i)] != actual[(int) (off + i)]) {
                            fail(what + " row of sequence " + s + " position " + pos + " head " + h + " ("
                                    + host.kFormat().name() + ", head " + host.geometry().headDimK() + "): byte " + i
                                    + " of " + rowBytes + " is " + hex(actual[(int) (off + i)]) + ", the CPU wrote "
                                    + hex(expected[(int) (off + i)]) + "; seed " + seed);
                        }
                    }
                }
            }
        }
    }

    private static String hex(byte b) {
        return String.format("0x%02x", b & 0xFF);
    }
}
