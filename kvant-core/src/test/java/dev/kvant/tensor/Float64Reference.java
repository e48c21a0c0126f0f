package dev.kvant.tensor;

import dev.kvant.gguf.GgmlType;
import java.util.Random;

/**
 * Plain float64 decoders of the GGML block layouts, written straight from the layout definitions (byte by byte,
 * no shared code with the kernels), and the float64 dot products the kernels are held to.
 */
final class Float64Reference {
    private Float64Reference() {
    }

    static int u8(byte[] b, int i) {
        return b[i] & 0xff;
    }

    static int u16(byte[] b, int i) {
        return u8(b, i) | u8(b, i + 1) << 8;
    }

    /** IEEE binary16 by its definition: sign, 5-bit exponent (bias 15), 10-bit fraction. */
    static double half(int bits) {
        int sign = (bits >> 15) & 1;
        int exponent = (bits >> 10) & 0x1f;
        int fraction = bits & 0x3ff;
        double magnitude;
        if (exponent == 0) {
            magnitude = Math.scalb((double) fraction, -24);
        } else if (exponent == 31) {
            magnitude = fraction == 0 ? Double.POSITIVE_INFINITY : Double.NaN;
        } else {
            magnitude = Math.scalb(1024.0 + fraction, exponent - 25);
        }
        return sign == 1 ? -magnitude : magnitude;
    }

    /** 6-bit scale of sub-block j from the 12 packed bytes at {@code at} (the Q4_K/Q5_K rule). */
    static int kScale(byte[] b, int at, int j) {
        if (j < 4) {
            return u8(b, at + j) & 63;
        }
        return (u8(b, at + j + 4) & 0x0f) | (u8(b, at + j - 4) >> 6) << 4;
    }

    /** 6-bit min of sub-block j. */
    static int kMin(byte[] b, int at, int j) {
        if (j < 4) {
            return u8(b, at + j + 4) & 63;
        }
        return (u8(b, at + j + 4) >> 4) | (u8(b, at + j) >> 6) << 4;
    }

    /** The {@code n} values encoded in {@code bytes} (from offset 0). */
    static double[] decode(GgmlType type, byte[] bytes, int n) {
        double[] v = new double[n];
        switch (type) {
            case F32 -> {
                for (int i = 0; i < n; i++) {
                    int bits = u16(bytes, 4 * i) | u16(bytes, 4 * i + 2) << 16;
                    v[i] = Float.intBitsToFloat(bits);
                }
            }
            case F16 -> {
                for (int i = 0; i < n; i++) {
                    v[i] = half(u16(bytes, 2 * i));
                }
            }
            case BF16 -> {
                for (int i = 0; i < n; i++) {
                    v[i] = Float.intBitsToFloat(u16(bytes, 2 * i) << 16);
                }
            }
            case Q8_0 -> {
                for (int blk = 0; blk < n / 32; blk++) {
                    int p = 34 * blk;
                    double d = half(u16(bytes, p));
                    for (int i = 0; i < 32; i++) {
                        v[32 * blk + i] = d * bytes[p + 2 + i];
                    }
                }
            }
            case Q4_0 -> {
                for (int blk = 0; blk < n / 32; blk++) {
                    int p = 18 * blk;
                    double d = half(u16(bytes, p));
                    for (int i = 0; i < 16; i++) {
                        v[32 * blk + i] = d * ((u8(bytes, p + 2 + i) & 0x0f) - 8);
                        v[32 * blk + 16 + i] = d * ((u8(bytes, p + 2 + i) >> 4) - 8);
                    }
                }
            }
            case Q4_K -> {
                for (int blk = 0; blk < n / 256; blk++) {
                    int p = 144 * blk;
                    double d = half(u16(bytes, p));
                    double dmin = half(u16(bytes, p + 2));
                    for (int j = 0; j < 8; j++) {
                        int pair = j / 2;
                        for (int l = 0; l < 32; l++) {
                            int b = u8(bytes, p + 16 + 32 * pair + l);
                            int q = j % 2 == 0 ? b & 0x0f : b >> 4;
                            v[256 * blk + 32 * j + l] = d * kScale(bytes, p + 4, j) * q - dmin * kMin(bytes, p + 4, j);
                        }
                    }
                }
            }
            case Q5_K -> {
                for (int blk = 0; blk < n / 256; blk++) {
                    int p = 176 * blk;
                    double d = half(u16(bytes, p));
                    double dmin = half(u16(bytes, p + 2));
                    for (int j = 0; j < 8; j++) {
                        int pair = j / 2;
                        for (int l = 0; l < 32; l++) {
                            int b = u8(bytes, p + 48 + 32 * pair + l);
                            int q = (j % 2 == 0 ? b & 0x0f : b >> 4) + 16 * ((u8(bytes, p + 16 + l) >> j) & 1);
                            v[256 * blk + 32 * j + l] = d * kScale(bytes, p + 4, j) * q - dmin * kMin(bytes, p + 4, j);
                        }
                    }
                }
            }
            case Q6_K -> {
                for (int blk = 0; blk < n / 256; blk++) {
                    int p = 210 * blk;
                    double d = half(u16(bytes, p + 208));
                    for (int h = 0; h < 2; h++) {
                        for (int l = 0; l < 32; l++) {
                            int qh = u8(bytes, p + 128 + 32 * h + l);
                            int a = u8(bytes, p + 64 * h + l);
                            int b = u8(bytes, p + 64 * h + 32 + l);
                            int[] q = {
                                (a & 0x0f) | (qh & 3) << 4,
                                (b & 0x0f) | ((qh >> 2) & 3) << 4,
                                (a >> 4) | ((qh >> 4) & 3) << 4,
                                (b >> 4) | ((qh >> 6) & 3) << 4};
                            for (int g = 0; g < 4; g++) {
                                int scale = bytes[p + 192 + 8 * h + l / 16 + 2 * g];
                                v[256 * blk + 128 * h + 32 * g + l] = d * scale * (q[g] - 32);
                            }
                        }
                    }
                }
            }
            default -> throw new IllegalArgumentException("no reference for " + type);
        }
        return v;
    }

    static double dot(double[] w, float[] x, int xOffset) {
        double s = 0;
        for (int i = 0; i < w.length; i++) {
            s += w[i] * x[xOffset + i];
        }
        return s;
    }

    static double absDot(double[] w, float[] x, int xOffset) {
        double s = 0;
        for (int i = 0; i < w.length; i++) {
            s += Math.abs(w[i] * x[xOffset + i]);
        }
        return s;
    }

    /**
     * How far a float dot product of n terms may be from the float64 one, for the kernels' arithmetic: each lane
     * rounds once per chunk (n/L fmas, plus one for a padded chunk), the tree adds log2(L) more, and the weights
     * themselves are within half an ulp of their float64 values: (n/L + log2 L + 3) * 2^-24 * sum |w x|.
     */
    static double bound(int n, double absDot) {
        int steps = n / Lanes.L + 1 + Integer.numberOfTrailingZeros(Lanes.L) + 2;
        return steps * 0x1p-24 * absDot + Double.MIN_NORMAL;
    }

    /** Standard normal floats, none zero (a test on zeros proves nothing). */
    static float[] gaussian(Random random, int n, double scale) {
        float[] v = new float[n];
        for (int i = 0; i < n; i++) {
            float f;
            do {
                f = (float) (random.nextGaussian() * scale);
            } while (f == 0);
            v[i] = f;
        }
        return v;
    }
}
