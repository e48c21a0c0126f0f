package dev.kvant.model;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvant.tensor.Parallel;
import java.util.Random;
import java.util.concurrent.atomic.AtomicIntegerArray;
import org.junit.jupiter.api.Test;

class OpsTest {

    /** Every index of [0, count) is in exactly one range, whatever the count, grain and pool. */
    @Test
    void rangesCoverEveryIndexOnce() {
        for (int threads = 1; threads <= 3; threads++) {
            try (Parallel pool = new Parallel(threads)) {
                for (int count : new int[] {0, 1, 3, 4, 7, 64, 1000, 100_003}) {
                    for (int grain : new int[] {1, 4, 8192}) {
                        AtomicIntegerArray hits = new AtomicIntegerArray(count);
                        Ops.ranges(pool, count, grain, (from, to) -> {
                            for (int i = from; i < to; i++) {
                                hits.incrementAndGet(i);
                            }
                        });
                        for (int i = 0; i < count; i++) {
                            assertEquals(1, hits.get(i), "index " + i + " of " + count + ", grain " + grain
                                    + ", " + threads + " threads");
                        }
                    }
                }
            }
        }
    }

    /** SwiGLU cut into ranges on a pool gives the bits of one pass. */
    @Test
    void swigluInRangesGivesTheBitsOfOnePass() {
        long seed = new Random().nextLong();
        Random random = new Random(seed);
        int n = 50_001;
        float[] gate = new float[n];
        float[] up = new float[n];
        for (int i = 0; i < n; i++) {
            gate[i] = (float) (random.nextGaussian() * 4);
            up[i] = (float) random.nextGaussian();
        }
        float[] want = gate.clone();
        Ops.swiglu(want, up, n);
        try (Parallel pool = new Parallel(3)) {
            float[] got = gate.clone();
            Ops.ranges(pool, n, 1000, (from, to) -> Ops.swiglu(got, up, from, to));
            assertArrayEquals(want, got, "seed " + seed);
        }
    }
}
