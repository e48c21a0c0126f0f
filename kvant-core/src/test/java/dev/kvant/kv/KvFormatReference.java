package dev.kvant.kv;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Float64 reference for the documented kv-format v1 layouts, written from docs/KV_FORMATS.md with plain loops and
 * none of the kernels' code: a decoder per layout, a packer for hand-built blocks, the rotation as a matrix
 * product with signs from an independent SplitMix64.
 */
final class KvFormatReference {
    private KvFormatReference() {
    }

    /** SplitMix64 as published: state += golden gamma, then the variant-13 mix. */
    static long[] splitMix64(long seed, int count) {
        long[] out = new long[count];
        long state = seed;
        for (int i = 0; i < count; i++) {
            state += 0x9E3779B97F4A7C15L;
            long z = state;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            out[i] = z ^ (z >>> 31);
        }
        return out;
    }

    /** D1 (which = 1) or D2 (which = 2) of a block of n: draws 0..n-1, then n..2n-1 of SplitMix64(SEED). */
    static double[] signs(int n, int which) {
        long[] draws = splitMix64(0x6B76616E74L, 2 * n);
        double[] s = new double[n];
        for (int i = 0; i < n; i++) {
            s[i] = draws[(which - 1) * n + i] < 0 ? -1 : 1;
        }
        return s;
    }

    /** Sylvester Hadamard entry: (-1)^popcount(i & j). */
    static double hadamard(int i, int j) {
        return Integer.bitCount(i & j) % 2 == 0 ? 1 : -1;
    }

    /** y = D2 (H/√n) D1 x on one block (or with swapped signs, the inverse). */
    static double[] rotateBlock(double[] x, boolean inverse) {
        int n = x.length;
        double[] before = signs(n, inverse ? 2 : 1);
        double[] after = signs(n, inverse ? 1 : 2);
        double[] y = new double[n];
        for (int i = 0; i < n; i++) {
            double acc = 0;
            for (int j = 0; j < n; j++) {
                acc += hadamard(i, j) * before[j] * x[j];
            }
            y[i] = after[i] * acc / Math.sqrt(n);
        }
        return y;
    }

    static int paddedDim(int headDim) {
        return (headDim + 63) / 64 * 64;
    }

    static int blockSize(int headDim) {
        return paddedDim(headDim) % 128 == 0 ? 128 : 64;
    }

    /** A head row zero-padded to a multiple of 64 and rotated block by block. */
    static double[] rotateRow(float[] x, int off, int headDim) {
        int padded = paddedDim(headDim);
        int n = blockSize(headDim);
        double[] y = new double[padded];
        for (int b = 0; b < padded; b += n) {
            double[] block = new double[n];
            for (int i = 0; i < n; i++) {
                block[i] = b + i < headDim ? x[off + b + i] : 0;
            }
            System.arraycopy(rotateBlock(block, false), 0, y, b, n);
        }
        return y;
    }

    /** An IEEE binary16 value from its bits, by sign, exponent and mantissa. */
    static double half(int bits) {
        int sign = (bits >> 15) & 1;
        int exp = (bits >> 10) & 31;
        int man = bits & 1023;
        double v;
        if (exp == 0) {
            v = man * Math.pow(2, -24);
        } else if (exp == 31) {
            v = man == 0 ? Double.POSITIVE_INFINITY : Double.NaN;
        } else {
            v = (1024 + man) * Math.pow(2, exp - 25);
        }
        return sign == 1 ? -v : v;
    }

    static int u8(byte[] b, int i) {
        return b[i] & 0xFF;
    }

    static int u16(byte[] b, int i) {
        return u8(b, i) | (u8(b, i + 1) << 8);
    }

    static byte[] bytes(MemorySegment seg, long off, long len) {
        return seg.asSlice(off, len).toArray(ValueLayout.JAVA_BYTE);
    }

    /** Decodes one row of the named format from its bytes: domainDim values (rotated domain if rotated). */
    static double[] decode(String format, byte[] row, int headDim) {
        return switch (format) {
            case "f16" -> {
                double[] out = new double[headDim];
                for (int i = 0; i < headDim; i++) {
                    out[i] = half(u16(row, 2 * i));
                }
                yield out;
            }
            case "bf16" -> {
                double[] out = new double[headDim];
                for (int i = 0; i < headDim; i++) {
                    out[i] = Float.intBitsToFloat(u16(row, 2 * i) << 16);
                }
                yield out;
            }
            case "q8_0" -> int8Blocks(row, headDim, 32);
            case "int8" -> int8Blocks(row, headDim, 64);
            case "q4_0" -> q4Blocks(row, headDim);
            case "q4_0h" -> q4Blocks(row, paddedDim(headDim));
            case "turbo4" -> turbo(row, headDim, 4);
            case "turbo3" -> turbo(row, headDim, 3);
            case "turbo2" -> turbo(row, headDim, 2);
            default -> throw new IllegalArgumentException(format);
        };
    }

    private static double[] int8Blocks(byte[] row, int headDim, int block) {
        double[] out = new double[headDim];
        for (int i = 0; i < headDim; i++) {
            int b = i / block;
            int base = b * (2 + block);
            out[i] = half(u16(row, base)) * row[base + 2 + i % block];
        }
        return out;
    }

    private static double[] q4Blocks(byte[] row, int values) {
        double[] out = new double[values];
        for (int i = 0; i < values; i++) {
            int base = i / 32 * 18;
            int j = i % 32;
            int nibble = j < 16 ? u8(row, base + 2 + j) & 15 : u8(row, base + 2 + j - 16) >> 4;
            out[i] = half(u16(row, base)) * (nibble - 8);
        }
        return out;
    }

    /** The code of element i of a turbo block from its code bytes (the bytes after the fp16 norm). */
    static int turboCode(byte[] codes, int codesOff, int n, int bits, int i) {
        return switch (bits) {
            case 4 -> (u8(codes, codesOff + i % (n / 2)) >> (4 * (i / (n / 2)))) & 15;
            case 2 -> (u8(codes, codesOff + i % (n / 4)) >> (2 * (i / (n / 4)))) & 3;
            case 3 -> ((u8(codes, codesOff + i % (n / 4)) >> (2 * (i / (n / 4)))) & 3)
                    | (((u8(codes, codesOff + n / 4 + i % (n / 8)) >> (i / (n / 8))) & 1) << 2);
            default -> throw new IllegalArgumentException("bits " + bits);
        };
    }

    static int turboBlockBytes(int n, int bits) {
        return 2 + n * bits / 8;
    }

    private static double[] turbo(byte[] row, int headDim, int bits) {
        int padded = paddedDim(headDim);
        int n = blockSize(headDim);
        float[] c = Codebook.sphere(bits, n).centroidsAsFloat();
        double[] out = new double[padded];
        for (int i = 0; i < padded; i++) {
            int base = i / n * turboBlockBytes(n, bits);
            out[i] = half(u16(row, base)) * (double) c[turboCode(row, base + 2, n, bits, i % n)];
        }
        return out;
    }

    /** Packs one turbo block by the documented layout: fp16 norm bits, then the code planes. */
    static byte[] packTurboBlock(int normBits, int[] codes, int bits) {
        int n = codes.length;
        byte[] out = new byte[turboBlockBytes(n, bits)];
        out[0] = (byte) normBits;
        out[1] = (byte) (normBits >> 8);
        for (int i = 0; i < n; i++) {
            int c = codes[i];
            switch (bits) {
                case 4 -> out[2 + i % (n / 2)] |= (byte) (c << (4 * (i / (n / 2))));
                case 2 -> out[2 + i % (n / 4)] |= (byte) (c << (2 * (i / (n / 4))));
                case 3 -> {
                    out[2 + i % (n / 4)] |= (byte) ((c & 3) << (2 * (i / (n / 4))));
                    out[2 + n / 4 + i % (n / 8)] |= (byte) ((c >> 2) << (i / (n / 8)));
                }
                default -> throw new IllegalArgumentException("bits " + bits);
            }
        }
        return out;
    }
}
