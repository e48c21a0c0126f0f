package dev.kvant.engine;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvCache;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.KvSequence;
import dev.kvant.model.KvRowHook;
import java.lang.foreign.MemorySegment;
import java.util.List;
import java.util.SplittableRandom;

import org.junit.jupiter.api.Test;

/** The key-study hook: rows through the format, centered as asked, the mean given back. */
class KeyStudyTest {
    private static final int HEADS = 2;
    private static final int D = 128;

    private static float[] rows(int n, long seed, float offset) {
        SplittableRandom r = new SplittableRandom(seed);
        float[] k = new float[n * HEADS * D];
        for (int i = 0; i < k.length; i++) {
            k[i] = (float) r.nextGaussian() + offset;
        }
        return k;
    }

    private static float[] roundTrip(KvFormat f, float[] x, int off) {
        MemorySegment buf = MemorySegment.ofArray(new byte[(int) f.rowBytes(D)]);
        float[] row = new float[f.domainDim(D)];
        f.encode(x, off, D, buf, 0);
        f.decode(buf, 0, D, row, 0);
        f.unrotate(row, 0, D);
        return java.util.Arrays.copyOf(row, D);
    }

    @Test
    void withoutCenteringEveryRowIsTheFormatsRoundTrip() {
        KvFormat f = KvFormat.parse("turbo3");
        try (KvCache cache = KvCache.forTokens(new KvGeometry(1, HEADS, D, D), f, f, 64, 256)) {
            KvSequence seq = cache.newSequence();
            float[] k = rows(10, 1, 0f);
            float[] want = new float[k.length];
            for (int r = 0; r < 10 * HEADS; r++) {
                System.arraycopy(roundTrip(f, k, r * D), 0, want, r * D, D);
            }
            KeyStudy.hook(f, KeyStudy.Mode.NONE, null, 1, HEADS, D, D).beforeWrite(seq, 0, 0, 10, new float[0], 0, k, 0, null,
                    0);
            assertArrayEquals(want, k);
        }
    }

    @Test
    void centeringOnTheBlockMeanRemovesASharedOffsetsError() {
        KvFormat f = KvFormat.parse("turbo3");
        try (KvCache cache = KvCache.forTokens(new KvGeometry(1, HEADS, D, D), f, f, 64, 256)) {
            float[] exact = rows(64, 2, 3f);   // keys sharing a large offset
            double[] err = new double[3];
            for (KeyStudy.Mode mode : List.of(KeyStudy.Mode.NONE, KeyStudy.Mode.PREV64, KeyStudy.Mode.BLOCK64)) {
                KvSequence seq = cache.newSequence();
                float[] k = exact.clone();
                KvRowHook h = KeyStudy.hook(f, mode, null, 1, HEADS, D, D);
                h.beforeWrite(seq, 0, 0, 64, new float[0], 0, k, 0, null, 0);
                double e = 0;
                for (int i = 0; i < k.length; i++) {
                    e += (k[i] - exact[i]) * (double) (k[i] - exact[i]);
                }
                err[mode.ordinal()] = e;
                seq.close();
            }
            // the first block has no previous block: prev64 does what none does
            assertEquals(err[0], err[1], 0.0);
            assertTrue(err[2] < 0.2 * err[0], "block mean: " + err[2] + " vs uncentered " + err[0]);
        }
    }
}
