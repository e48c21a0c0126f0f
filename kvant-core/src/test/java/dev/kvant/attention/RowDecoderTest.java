package dev.kvant.attention;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.kvant.kv.KvFormat;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class RowDecoderTest {
    private static final long SEED = new SplittableRandom().nextLong();

    /**
     * Rows spread out (a gap before each) into a tile with padding, and rows side by side (one gap, after row 4)
     * into a tile without: decoders may take runs of adjacent rows at once (f16 does).
     */
    @Test
    void decodersMatchFormatDecodeBitForBit() {
        SplittableRandom rnd = new SplittableRandom(SEED);
        int rows = 9;
        for (KvFormat f : KvFormat.all()) {
            for (int dim : new int[] {40, 64, 72, 80, 96, 128, 192, 256}) {
                for (boolean adjacent : new boolean[] {false, true}) {
                    decodeRows(f, dim, rows, adjacent, rnd);
                }
            }
        }
    }

    private static void decodeRows(KvFormat f, int dim, int rows, boolean adjacent, SplittableRandom rnd) {
        long rowBytes = f.rowBytes(dim);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment seg = arena.allocate(rowBytes * rows * 2);
            int[] offs = new int[rows];
            float[] x = new float[dim];
            for (int r = 0; r < rows; r++) {
                double scale = r == 0 ? 1e-6 : r == 1 ? 3e4 : 1 + rnd.nextDouble() * 4;
                for (int d = 0; d < dim; d++) {
                    x[d] = (float) (rnd.nextGaussian() * scale);
                }
                offs[r] = (int) ((adjacent ? r + (r > 4 ? 1 : 0) : 2L * r + 1) * rowBytes);
                f.encode(x, 0, dim, seg, offs[r]);
            }
            RowDecoder dec = RowDecoder.of(f, dim);
            int stride = adjacent ? dec.dim() : dec.dim() + 5;
            float[] tile = new float[rows * stride];
            dec.decode(seg.toArray(ValueLayout.JAVA_BYTE), offs, rows, tile, stride);
            float[] want = new float[f.domainDim(dim)];
            for (int r = 0; r < rows; r++) {
                f.decode(seg, offs[r], dim, want, 0);
                for (int d = 0; d < want.length; d++) {
                    assertEquals(Float.floatToRawIntBits(want[d]), Float.floatToRawIntBits(tile[r * stride + d]),
                            f + " dim " + dim + (adjacent ? " adjacent" : "") + " row " + r + " value " + d
                                    + " (seed " + SEED + ")");
                }
            }
        }
    }

    @Test
    void halfDecoderWidensEveryF16BitPatternLikeFloat16ToFloat() {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment seg = arena.allocate(2 * 65536);
            for (int h = 0; h < 65536; h++) {
                seg.set(Lanes.LE_SHORT, 2L * h, (short) h);
            }
            RowDecoder dec = RowDecoder.of(KvFormat.parse("f16"), 65536);
            float[] out = new float[65536];
            dec.decode(seg.toArray(ValueLayout.JAVA_BYTE), new int[] {0}, 1, out, 65536);
            for (int h = 0; h < 65536; h++) {
                float want = Float.float16ToFloat((short) h);
                if (Float.isNaN(want)) {
                    assertEquals(true, Float.isNaN(out[h]), "half 0x" + Integer.toHexString(h));
                } else {
                    assertEquals(Float.floatToRawIntBits(want), Float.floatToRawIntBits(out[h]),
                            "half 0x" + Integer.toHexString(h));
                }
            }
        }
    }
}
