package dev.kvant.sample;

import java.util.Locale;
import java.util.SplittableRandom;

/**
 * Host time of one {@link Sampler#sample} over a large vocabulary, for the settings a server or CLI request uses:
 * the logits a Gaussian spread (sd 3) with a few tokens far above it, fresh for every call. A non-greedy step of
 * every sequence pays this on the engine thread, on the GPU backend too (only greedy choices stay on the device).
 * Usage: {@code SamplerBench [vocab (128256)] [calls per round (200)] [rounds (5)]}; prints the best round's mean.
 */
public final class SamplerBench {
    private static volatile int sink;

    private SamplerBench() {
    }

    public static void main(String[] args) {
        int vocab = args.length > 0 ? Integer.parseInt(args[0]) : 128_256;
        int calls = args.length > 1 ? Integer.parseInt(args[1]) : 200;
        int rounds = args.length > 2 ? Integer.parseInt(args[2]) : 5;
        float[] base = new float[vocab];
        SplittableRandom rnd = new SplittableRandom(1);
        for (int i = 0; i < vocab; i++) {
            base[i] = (float) (rnd.nextGaussian() * 3);
        }
        base[5] = 14f;
        base[77] = 13f;
        base[900] = 12.5f;
        Object[][] settings = {
            {"temperature 1", 0, 1f, 0f},
            {"top-k 40", 40, 1f, 0f},
            {"top-p 0.95", 0, 0.95f, 0f},
            {"min-p 0.05", 0, 1f, 0.05f},
            {"top-p 0.95, min-p 0.05", 0, 0.95f, 0.05f},
            {"top-k 40, top-p 0.95, min-p 0.05 (CLI defaults)", 40, 0.95f, 0.05f},
        };
        System.out.printf(Locale.ROOT, "sampler, vocabulary %,d, one thread, %s%n", vocab,
                System.getProperty("java.vm.version"));
        float[] logits = new float[vocab];
        for (Object[] s : settings) {
            Sampler sampler = new Sampler(new SamplerConfig(1f, (Integer) s[1], (Float) s[2], (Float) s[3], 1f, 64, 7));
            long best = Long.MAX_VALUE;
            for (int r = 0; r < rounds; r++) {
                long t0 = System.nanoTime();
                for (int c = 0; c < calls; c++) {
                    System.arraycopy(base, 0, logits, 0, vocab);
                    sink += sampler.sample(logits, vocab);
                }
                best = Math.min(best, (System.nanoTime() - t0) / calls);
            }
            System.out.printf(Locale.ROOT, "| %s | %.0f |%n", s[0], best / 1e3);
        }
    }
}
