package dev.kvant.tensor;

/** Small rules shared by the block formats: argument checks and the two roundings ggml's quantizers use. */
final class Blocks {
    private Blocks() {
    }

    static void check(WeightFormat f, int n) {
        if (n < 0 || n % f.blockSize() != 0) {
            throw new IllegalArgumentException(
                    n + " values is not a whole number of " + f.type() + " blocks of " + f.blockSize());
        }
    }

    /** C's roundf: halves away from zero. */
    static int roundHalfAway(float v) {
        return (int) Math.copySign(Math.floor(Math.abs((double) v) + 0.5), v);
    }

    /** Round half to even, as ggml's nearest_int does by adding 1.5 * 2^23. */
    static int nearestInt(float v) {
        return (int) Math.rint(v);
    }
}
