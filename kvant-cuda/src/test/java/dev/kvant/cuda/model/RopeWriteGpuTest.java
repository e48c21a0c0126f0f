package dev.kvant.cuda.model;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.TestSeed;
import dev.kvant.cuda.attention.AttentionPlan;
import dev.kvant.cuda.attention.AttentionShape;
import dev.kvant.cuda.attention.CudaAttention;
import dev.kvant.cuda.attention.CudaKvCache;
import dev.kvant.cuda.attention.RopeRows;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.Rotation;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * A decode step's fused RoPE and cache write (kv_write.cu's kvant_rope_write, {@link CudaAttention#writeRoped})
 * against the two launches it replaces (model.cu's kvant_rope_split, then {@link CudaAttention#quantizeRows}): the
 * same q bits, the same K and V bytes in the same slots of poisoned pools, the same slots and previous pages, and
 * nothing written for a padded vector (a negative page). Without q/k norms the q rows are also the CPU's RoPE
 * (dev.kvant.model.Rope: x0·c − x1·s, x0·s + x1·c) of the same angles, bit for bit. And a dense prefill's rotations
 * as the model does them (queries rotated by RoPE, the output turned back by its conversion to f16) against the CPU's;
 * a decode step's fused write with the queries rotated gives kvant_rope_split's rotated queries.
 */
@Tag("gpu")
class RopeWriteGpuTest extends ModelKernelsGpuFixture {
    private static final int KV_HEADS = 4;
    private static final int HEADS = 4 * KV_HEADS;
    private static final int PAGE_TOKENS = 16;
    private static final int PAGES = 8;
    /** Decode vectors at these positions; the last has a negative page (a padded batch's unused row). */
    private static final int[] POSITIONS = {5, 37, 16, 3};
    private static final int TABLE_STRIDE = 4;
    /** Each vector's page table (pages 1..7: page 0 is never written). */
    private static final int[] TABLES = {2, 1, 3, 4, /* */ 7, 1, 5, 3, /* */ 4, 6, 2, 2, /* */ -1, -1, -1, -1};

    static Stream<Arguments> cases() {
        List<Arguments> all = new ArrayList<>();
        for (KvFormat f : List.of(KvFormat.parse("f16"), KvFormat.parse("bf16"), KvFormat.parse("q8_0"),
                KvFormat.parse("int8"), KvFormat.parse("q4_0"), KvFormat.parse("q4_0h"), KvFormat.parse("turbo4"),
                KvFormat.parse("turbo3"), KvFormat.parse("turbo2"))) {
            all.add(Arguments.of(f.name(), f.name(), 128, 128, 128, false, false));
        }
        all.add(Arguments.of("turbo3", "turbo3", 128, 128, 64, true, true));    // NEOX, partial RoPE, q/k norms
        all.add(Arguments.of("q8_0", "turbo3", 128, 128, 128, true, false));
        all.add(Arguments.of("turbo4", "turbo2", 64, 64, 64, false, true));
        all.add(Arguments.of("turbo2", "turbo4", 256, 256, 256, true, false));
        all.add(Arguments.of("q8_0", "turbo3", 256, 128, 128, false, false));  // K and V heads of two sizes
        return all.stream();
    }

    @ParameterizedTest(name = "{0}/{1} head {2}/{3} rope {4} neox {5} norms {6}")
    @MethodSource("cases")
    void fusedRopeWriteGivesTheSplitLaunchesBits(String kName, String vName, int dK, int dV, int ropeDim,
                                                  boolean neox, boolean norms) {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        String where = kName + "/" + vName + " " + dK + "/" + dV + " (seed " + seed + ")";
        int n = POSITIONS.length;
        int qDim = HEADS * dK, width = qDim + KV_HEADS * (dK + dV);
        float[] qkv = gaussians(r, n * width, 2);
        float[] angles = angles(r, n * ropeDim / 2);
        float[] qNorm = new float[dK], kNorm = new float[dK];
        for (int i = 0; i < dK; i++) {
            qNorm[i] = (float) r.nextDouble(0.5, 2);
            kNorm[i] = (float) r.nextDouble(0.5, 2);
        }
        KvFormat kf = KvFormat.parse(kName), vf = KvFormat.parse(vName);
        KvGeometry g = new KvGeometry(1, KV_HEADS, dK, dV);
        AttentionShape shape = new AttentionShape(g, HEADS, kf, vf, PAGE_TOKENS);
        try (CudaAttention attention = CudaAttention.create(context, cache, shape, AttentionPlan.of(n, 1, 64, 0));
             CudaKvCache split = CudaKvCache.allocate(context, g, kf, vf, PAGE_TOKENS, PAGES);
             CudaKvCache fused = CudaKvCache.allocate(context, g, kf, vf, PAGE_TOKENS, PAGES);
             DeviceBuffer qkvD = upload(MemorySegment.ofArray(qkv));
             DeviceBuffer anglesD = upload(MemorySegment.ofArray(angles));
             DeviceBuffer positions = upload(MemorySegment.ofArray(POSITIONS));
             DeviceBuffer tables = upload(MemorySegment.ofArray(TABLES));
             DeviceBuffer qNormD = upload(MemorySegment.ofArray(qNorm));
             DeviceBuffer kNormD = upload(MemorySegment.ofArray(kNorm));
             DeviceBuffer qA = context.allocate(4L * n * qDim);
             DeviceBuffer qB = context.allocate(4L * n * qDim);
             DeviceBuffer kRows = context.allocate(4L * n * KV_HEADS * dK);
             DeviceBuffer vRows = context.allocate(4L * n * KV_HEADS * dV);
             DeviceBuffer slotsA = context.allocate(4L * n);
             DeviceBuffer slotsB = context.allocate(4L * n);
             DeviceBuffer prevA = context.allocate(4L * n);
             DeviceBuffer prevB = context.allocate(4L * n)) {
            assertTrue(attention.writesRoped(n), where + ": a decode step's write is fused");
            for (CudaKvCache c : List.of(split, fused)) {
                c.kPool(0).fillBytes((byte) 0xA5);
                c.vPool(0).fillBytes((byte) 0xA5);
            }
            qA.fillFloats(Float.NaN);
            qB.fillFloats(Float.NaN);
            for (DeviceBuffer b : List.of(slotsA, slotsB, prevA, prevB)) {
                b.fillInts(0x5A5A5A5A);
            }
            DeviceBuffer qn = norms ? qNormD : null, kn = norms ? kNormD : null;
            kernels.ropeSplit(new RopeRows(qkvD, n, positions, 0, qA, kRows, vRows, anglesD, ropeDim, neox, HEADS,
                    KV_HEADS, dK, dV, qn, kn, 1e-6f, tables, TABLE_STRIDE, 1, PAGE_TOKENS, slotsA, prevA), 0, stream);
            attention.quantizeRows(split, 0, kRows, vRows, slotsA, n, stream);
            attention.writeRoped(fused, 0, new RopeRows(qkvD, n, positions, 0, qB, null, null, anglesD, ropeDim,
                    neox, HEADS, KV_HEADS, dK, dV, qn, kn, 1e-6f, tables, TABLE_STRIDE, 1, PAGE_TOKENS, slotsB,
                    prevB), stream);
            stream.synchronize();
            float[] q = download(qB).toArray(ValueLayout.JAVA_FLOAT);
            assertArrayEquals(download(qA).toArray(ValueLayout.JAVA_FLOAT), q, where + ": q");
            assertArrayEquals(download(slotsA).toArray(ValueLayout.JAVA_INT), download(slotsB).toArray(ValueLayout.JAVA_INT), where + ": slots");
            assertArrayEquals(download(prevA).toArray(ValueLayout.JAVA_INT), download(prevB).toArray(ValueLayout.JAVA_INT), where + ": previous pages");
            byte[] kBytes = download(fused.kPool(0)).toArray(ValueLayout.JAVA_BYTE);
            byte[] vBytes = download(fused.vPool(0)).toArray(ValueLayout.JAVA_BYTE);
            assertArrayEquals(download(split.kPool(0)).toArray(ValueLayout.JAVA_BYTE), kBytes, where + ": K pool");
            assertArrayEquals(download(split.vPool(0)).toArray(ValueLayout.JAVA_BYTE), vBytes, where + ": V pool");
            for (int i = 0; i < fused.kPageBytes(0); i++) {
                assertEquals((byte) 0xA5, kBytes[i], where + ": page 0 of K was written, though no slot is there");
            }
            boolean anyWritten = false;
            for (int i = (int) fused.kPageBytes(0); i < kBytes.length && !anyWritten; i++) {
                anyWritten = kBytes[i] != (byte) 0xA5;
            }
            assertTrue(anyWritten, where + ": nothing was written");
            if (!norms) {
                float[] want = cpuRopeQueries(qkv, angles, n, width, dK, ropeDim, neox);
                assertArrayEquals(want, q, where + ": q against the CPU's RoPE");
            }
            // a dense decode step's call: the queries also rotated into K's basis, kvant_rope_split's with the same
            // rotation, and the same cache bytes
            try (CudaKvCache rotated = CudaKvCache.allocate(context, g, kf, vf, PAGE_TOKENS, PAGES)) {
                rotated.kPool(0).fillBytes((byte) 0xA5);
                rotated.vPool(0).fillBytes((byte) 0xA5);
                qA.fillFloats(Float.NaN);
                qB.fillFloats(Float.NaN);
                kernels.ropeSplit(new RopeRows(qkvD, n, positions, 0, qA, kRows, vRows, anglesD, ropeDim, neox, HEADS,
                        KV_HEADS, dK, dV, qn, kn, 1e-6f, tables, TABLE_STRIDE, 1, PAGE_TOKENS, null, null),
                        attention.queryRotation(), stream);
                attention.writeRoped(rotated, 0, new RopeRows(qkvD, n, positions, 0, qB, null, null, anglesD, ropeDim,
                        neox, HEADS, KV_HEADS, dK, dV, qn, kn, 1e-6f, tables, TABLE_STRIDE, 1, PAGE_TOKENS, null,
                        null), true, stream);
                stream.synchronize();
                float[] qRotated = download(qB).toArray(ValueLayout.JAVA_FLOAT);
                assertArrayEquals(download(qA).toArray(ValueLayout.JAVA_FLOAT), qRotated, where + ": rotated q");
                if (attention.queryRotation() == 0) {
                    assertArrayEquals(q, qRotated, where + ": q of a K format that is not rotated");
                }
                assertArrayEquals(kBytes, download(rotated.kPool(0)).toArray(ValueLayout.JAVA_BYTE),
                        where + ": K pool of the rotated call");
                assertArrayEquals(vBytes, download(rotated.vPool(0)).toArray(ValueLayout.JAVA_BYTE),
                        where + ": V pool of the rotated call");
            }
        }
    }

    /**
     * A dense prefill's rotations done in the model's passes (CudaAttention.prefill with rotatedBasis): RoPE with a
     * query rotation gives each query head of RoPE without it rotated by the CPU's {@link Rotation}, bit for bit, and
     * leaves k and v as they were; the output's conversion, {@link ModelKernels#toHalfUnrotated}, gives the CPU's
     * inverse rotation of each row as f16, bit for bit. Heads of 64, 128 and 256 (two rotation blocks).
     */
    @ParameterizedTest(name = "head {0}")
    @ValueSource(ints = {64, 128, 256})
    void prefillRotationsAreTheCpusRotation(int d) {
        long seed = TestSeed.next();
        SplittableRandom r = new SplittableRandom(seed);
        String where = "head " + d + " (seed " + seed + ")";
        int n = POSITIONS.length;
        int qDim = HEADS * d, kvDim = KV_HEADS * d, width = qDim + 2 * kvDim;
        float[] qkv = gaussians(r, n * width, 2);
        float[] angles = angles(r, n * d / 2);
        int block = Rotation.blockSize(d);
        int rows = n * HEADS;
        float[] out = gaussians(r, rows * d, 3);
        try (DeviceBuffer qkvD = upload(MemorySegment.ofArray(qkv));
             DeviceBuffer anglesD = upload(MemorySegment.ofArray(angles));
             DeviceBuffer positions = upload(MemorySegment.ofArray(POSITIONS));
             DeviceBuffer tables = upload(MemorySegment.ofArray(TABLES));
             DeviceBuffer outD = upload(MemorySegment.ofArray(out));
             DeviceBuffer half = context.allocate(2L * rows * d);
             DeviceBuffer qA = context.allocate(4L * n * qDim);
             DeviceBuffer qB = context.allocate(4L * n * qDim);
             DeviceBuffer kA = context.allocate(4L * n * kvDim);
             DeviceBuffer kB = context.allocate(4L * n * kvDim);
             DeviceBuffer vA = context.allocate(4L * n * kvDim);
             DeviceBuffer vB = context.allocate(4L * n * kvDim)) {
            for (DeviceBuffer b : List.of(qA, qB, kA, kB, vA, vB)) {
                b.fillFloats(Float.NaN);
            }
            half.fillBytes((byte) 0xA5);
            kernels.ropeSplit(new RopeRows(qkvD, n, positions, 0, qA, kA, vA, anglesD, d, false, HEADS, KV_HEADS, d,
                    d, null, null, 1e-6f, tables, TABLE_STRIDE, 1, PAGE_TOKENS, null, null), 0, stream);
            kernels.ropeSplit(new RopeRows(qkvD, n, positions, 0, qB, kB, vB, anglesD, d, false, HEADS, KV_HEADS, d,
                    d, null, null, 1e-6f, tables, TABLE_STRIDE, 1, PAGE_TOKENS, null, null), block, stream);
            kernels.toHalfUnrotated(outD, half, rows, d, block, stream);
            stream.synchronize();
            float[] want = download(qA).toArray(ValueLayout.JAVA_FLOAT);
            for (int row = 0; row < n * HEADS; row++) {
                Rotation.forwardRow(want, row * d, d);
            }
            assertArrayEquals(want, download(qB).toArray(ValueLayout.JAVA_FLOAT), where + ": rotated q");
            assertArrayEquals(download(kA).toArray(ValueLayout.JAVA_FLOAT), download(kB).toArray(ValueLayout.JAVA_FLOAT),
                    where + ": k");
            assertArrayEquals(download(vA).toArray(ValueLayout.JAVA_FLOAT), download(vB).toArray(ValueLayout.JAVA_FLOAT),
                    where + ": v");
            short[] wantHalf = new short[rows * d];
            float[] turned = out.clone();
            for (int row = 0; row < rows; row++) {
                Rotation.inverseRow(turned, row * d, d);
            }
            for (int i = 0; i < turned.length; i++) {
                wantHalf[i] = Float.floatToFloat16(turned[i]);
            }
            assertArrayEquals(wantHalf, download(half).toArray(ValueLayout.JAVA_SHORT), where + ": f16 turned back");
        }
    }

    /** A K format centered on page means needs every row's RoPE before the write: not fused. */
    @Test
    void centeredKeysAreNotFused() {
        KvGeometry g = new KvGeometry(1, KV_HEADS, 128, 128);
        AttentionShape shape = new AttentionShape(g, HEADS, KvFormat.parse("turbo3+mean"), KvFormat.parse("turbo3"),
                PAGE_TOKENS);
        try (CudaAttention attention = CudaAttention.create(context, cache, shape, AttentionPlan.of(1, 1, 64, 0))) {
            assertFalse(attention.writesRoped(1));
        }
    }

    /** count standard normal values, each scaled by e^u, u uniform in (-spread, spread): magnitudes far apart. */
    private static float[] gaussians(SplittableRandom r, int count, double spread) {
        float[] x = new float[count];
        for (int i = 0; i < count; i++) {
            x[i] = (float) (r.nextGaussian() * Math.exp(r.nextDouble(-spread, spread)));
        }
        return x;
    }

    /** (cos, sin) of pairs random angles, a pair after another. */
    private static float[] angles(SplittableRandom r, int pairs) {
        float[] cs = new float[2 * pairs];
        for (int i = 0; i < cs.length; i += 2) {
            double a = r.nextDouble(-Math.PI, Math.PI);
            cs[i] = (float) Math.cos(a);
            cs[i + 1] = (float) Math.sin(a);
        }
        return cs;
    }

    /** The query heads rotated as dev.kvant.model.Rope rotates them: x0·c − x1·s and x0·s + x1·c in float. */
    private static float[] cpuRopeQueries(float[] qkv, float[] angles, int n, int width, int d, int ropeDim,
                                          boolean neox) {
        float[] out = new float[n * HEADS * d];
        int half = ropeDim / 2;
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < HEADS; h++) {
                int src = t * width + h * d, dst = (t * HEADS + h) * d;
                for (int i = 0; i < d; i++) {
                    out[dst + i] = qkv[src + i];
                }
                for (int p = 0; p < half; p++) {
                    int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
                    float c = angles[t * ropeDim + 2 * p], s = angles[t * ropeDim + 2 * p + 1];
                    float x0 = qkv[src + a], x1 = qkv[src + b];
                    out[dst + a] = x0 * c - x1 * s;
                    out[dst + b] = x0 * s + x1 * c;
                }
            }
        }
        return out;
    }
}
