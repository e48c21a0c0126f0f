package dev.kvant.cuda;

/** A launch dimension (grid in blocks, or block in threads); each extent at least 1. */
public record Dim3(int x, int y, int z) {
    public Dim3 {
        if (x < 1 || y < 1 || z < 1) {
            throw new IllegalArgumentException("launch dimension (" + x + ", " + y + ", " + z + ") has an extent below 1");
        }
    }

    public static Dim3 of(int x) {
        return new Dim3(x, 1, 1);
    }

    public static Dim3 of(int x, int y) {
        return new Dim3(x, y, 1);
    }

    /** x · y · z. */
    public long volume() {
        return (long) x * y * z;
    }

    @Override
    public String toString() {
        return "(" + x + ", " + y + ", " + z + ")";
    }
}
