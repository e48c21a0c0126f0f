package dev.kvant.cuda;

/** Host reference of fill_check.cu: the same 32-bit arithmetic, so device and host agree bit for bit. */
final class FillPattern {
    private FillPattern() {
    }

    /** kvant_pattern(i, seed). */
    static int value(long i, int seed) {
        int x = (int) i ^ ((int) (i >>> 32) * 0x9E3779B9) ^ seed;
        x ^= x >>> 16;
        x *= 0x85EBCA6B;
        x ^= x >>> 13;
        x *= 0xC2B2AE35;
        x ^= x >>> 16;
        return x;
    }

    /** One application of kvant_mix_pattern to element i. */
    static int mix(int current, long i, int seed) {
        return current * 16777619 + value(i, seed);
    }
}
