package dev.kvant.cuda;

import java.util.SplittableRandom;

/** Seeds of the GPU tests: fresh each run, or {@code -Dkvant.test.seed=N} to replay a failing run's printed seed. */
public final class TestSeed {
    private TestSeed() {
    }

    public static long next() {
        return Long.getLong("kvant.test.seed", new SplittableRandom().nextLong());
    }
}
