package dev.kvant.cuda.attention;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.Rotation;
import dev.kvant.kv.TurboFormat;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/** The generated CUDA header and the host-side launch arithmetic; no GPU needed. */
class AttentionSourceTest {
    @Test
    void generatedHeaderCarriesTheRotationSignsBitForBit() {
        String header = AttentionSource.generatedHeader(16);
        Matcher m = Pattern.compile("kv_rot_sign\\[2\\]\\[2\\]\\[4\\] = \\{(.*?)\\};").matcher(header);
        assertTrue(m.find(), header);
        Matcher word = Pattern.compile("0x([0-9a-f]+)u").matcher(m.group(1));
        long[] words = new long[16];
        for (int i = 0; i < 16; i++) {
            assertTrue(word.find(), "16 sign words expected in " + m.group(1));
            words[i] = Long.parseLong(word.group(1), 16);
        }
        for (int ni = 0; ni < 2; ni++) {
            Rotation r = Rotation.ofBlock(ni == 0 ? 64 : 128);
            for (int which = 1; which <= 2; which++) {
                for (int i = 0; i < r.size(); i++) {
                    long w = words[ni * 8 + (which - 1) * 4 + i / 32];
                    boolean negative = ((w >> (i % 32)) & 1) != 0;
                    assertEquals(r.sign(which, i) < 0, negative, "n=" + r.size() + " D" + which + " element " + i);
                }
            }
        }
        assertTrue(header.contains("#define KV_LANES 16"), header);
    }

    @Test
    void generatedHeaderCarriesTheCodebooksExactly() {
        String header = AttentionSource.generatedHeader(8);
        float[] c = TurboFormat.TURBO3.codebook(128).centroidsAsFloat();
        for (float v : c) {
            assertTrue(header.contains(AttentionSource.hex(v)), "centroid " + v + " missing");
            assertEquals(v, Float.parseFloat(AttentionSource.hex(v).substring(0, AttentionSource.hex(v).length() - 1)), "hex literal of " + v);
        }
        float[] b = TurboFormat.TURBO4.codebook(64).boundaries();
        for (float v : b) {
            assertTrue(header.contains(AttentionSource.hex(v)), "boundary " + v + " missing");
        }
    }

    @Test
    void formatIdsFollowTheFormatTable() {
        assertEquals(0, AttentionSource.formatId(KvFormat.parse("f16")));
        assertEquals(5, AttentionSource.formatId(KvFormat.parse("q4_0h")));
        assertEquals(8, AttentionSource.formatId(TurboFormat.TURBO2));
    }

    @Test
    void splitsAreTheFewestWholeTilesThatMakeAtMostTheLaunchsSplits() {
        AttentionPlan big = AttentionPlan.of(1, 1, 524288, 0);
        assertEquals(256, big.maxSplits());
        assertEquals(256, big.maxSplits(2));
        assertEquals(128, big.maxSplits(1));
        assertEquals(16, big.splitFor(1, 256));
        assertEquals(16, big.splitFor(4096, 256));
        assertEquals(32, big.splitFor(4097, 256));
        assertEquals(32, big.splitFor(8192, 256));
        assertEquals(48, big.splitFor(8193, 256));
        assertEquals(128, big.splitFor(32768, 256));
        assertEquals(144, big.splitFor(32769, 256), "228 splits, not 129 of 256 tokens");
        assertEquals(272, big.splitFor(32769, 128));
        assertEquals(2048, big.splitFor(524288, 256));
        for (int len = 1; len <= 70000; len += 97) {
            for (int splits : new int[] {128, 256}) {
                int s = big.splitFor(len, splits);
                assertEquals(0, s % 16, "whole tiles");
                assertTrue((len + s - 1) / s <= splits, "at most the launch's splits");
                assertTrue(s == AttentionPlan.MIN_SPLIT || (len + s - 17) / (s - 16) > splits, "no smaller split would do: " + len);
            }
        }
        AttentionPlan small = AttentionPlan.of(1, 1, 600, 0);
        assertEquals(38, small.maxSplits());
        assertEquals(16, small.splitFor(600, small.maxSplits()));
        assertEquals(256, AttentionPlan.of(1, 1, 8 << 20, 0).maxSplits(), "any length: the split grows instead");
        assertThrows(IllegalArgumentException.class, () -> big.maxSplits(3));
    }

    @Test
    void decodeBlocksServeEightKvHeadsUnlessTheirRowsDoNotFit() {
        assertEquals(8, AttentionSource.decodeHeads(shape("f16", 8, 128)));
        assertEquals(8, AttentionSource.decodeHeads(shape("turbo3", 8, 128)));
        assertEquals(4, AttentionSource.decodeHeads(shape("f16", 8, 256)));
        assertEquals(2, AttentionSource.decodeHeads(shape("q8_0", 2, 128)));
        assertEquals(6, AttentionSource.decodeHeads(shape("turbo4", 12, 128)));
        for (AttentionShape s : AttentionPrecompile.standardShapes()) {
            int hb = AttentionSource.decodeHeads(s);
            assertTrue(AttentionSource.decodeSharedBytes(s, hb) <= AttentionSource.MAX_SHARED, s.toString());
        }
    }

    /**
     * The Java mirror of the decode layout gives the bytes the device reported for llama3-8b's layer (attention.cu's
     * Layout::TOTAL through kvant_attn_info, printed by AttentionGpuBench on the H200, 2026-11-30): turbo rows of 128
     * with no tile and 256-byte pair-table entries (turbo3, turbo2), q8_0 with no tile either (2026-12-01: its query
     * rows in their own area, two stages), f16 with its 66 KB stages;
     * and the prefill's (one kv head, 64-token tiles, 128-byte entries: turbo3's 96 of them).
     */
    /**
     * A decode block of every kv head compiles with HB_ALL=1 (its covers start on 16 bytes: whole-word and bulk
     * copies), any other with 0; the module's name says which, so the two never share a cache entry or a
     * precompiled module.
     */
    @Test
    void aBlockOfEveryKvHeadIsItsOwnModule() {
        AttentionShape eight = shape("q8_0", 8, 128), sixteen = shape("q8_0", 16, 128);
        assertEquals("1", AttentionSource.defines(eight).get("HB_ALL"));
        assertEquals("8", AttentionSource.defines(sixteen).get("HBD"));
        assertEquals("0", AttentionSource.defines(sixteen).get("HB_ALL"));
        assertEquals("0", AttentionSource.defines(eight, 1).get("HB_ALL"));
        assertTrue(AttentionSource.source(eight).name().endsWith("/hb8-all]"), AttentionSource.source(eight).name());
        assertTrue(AttentionSource.source(sixteen).name().endsWith("/hb8]"), AttentionSource.source(sixteen).name());
    }

    @Test
    void decodeLayoutMirrorGivesTheDevicesBytes() {
        assertEquals(106_240, AttentionSource.decodeSharedBytes(shape("turbo3", 8, 128), 8));
        assertEquals(73_984, AttentionSource.decodeSharedBytes(shape("turbo2", 8, 128), 8));
        assertEquals(101_120, AttentionSource.decodeSharedBytes(shape("turbo4", 8, 128), 8));
        assertEquals(88_320, AttentionSource.decodeSharedBytes(shape("q8_0", 8, 128), 8));
        assertEquals(149_760, AttentionSource.decodeSharedBytes(shape("f16", 8, 128), 8));
        KvGeometry g = new KvGeometry(1, 8, 128, 128);
        assertEquals(106_496, AttentionSource.prefillSharedBytes(g, TurboFormat.TURBO3, TurboFormat.TURBO3));
        assertEquals(104_448, AttentionSource.prefillSharedBytes(g, TurboFormat.TURBO2, TurboFormat.TURBO2));
        assertEquals(110_592, AttentionSource.prefillSharedBytes(g, TurboFormat.TURBO4, TurboFormat.TURBO4));
        assertEquals(94_208, AttentionSource.prefillSharedBytes(g, KvFormat.parse("q8_0"), KvFormat.parse("q8_0")));
        assertEquals(105_472, AttentionSource.prefillSharedBytes(g, KvFormat.parse("f16"), KvFormat.parse("f16")));
    }

    @Test
    void centeredKeysCountTheirBaseFormatsTablesAndTheirMeansInSharedMemory() {
        // turbo3+mean keys read turbo3's pair table: with turbo3 values one table, with f16 values the same bytes as
        // plain turbo3 plus the per-warp means
        KvGeometry g = new KvGeometry(1, 8, 256, 256);
        AttentionShape plain = new AttentionShape(g, 32, TurboFormat.TURBO3, KvFormat.parse("f16"), 64);
        AttentionShape centered = new AttentionShape(g, 32, KvFormat.parse("turbo3+mean"), KvFormat.parse("f16"), 64);
        for (int hb : new int[] {1, 2, 4, 8}) {
            assertEquals(AttentionSource.decodeSharedBytes(plain, hb) + hb * 2 * 256,
                    AttentionSource.decodeSharedBytes(centered, hb), "hb " + hb);
        }
        assertTrue(AttentionSource.decodeHeads(centered) < 8, "hb 8 does not fit: " + AttentionSource.decodeSharedBytes(
                centered, 8));
        AttentionShape same = new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, KvFormat.parse("turbo3+mean"),
                TurboFormat.TURBO3, 64);
        AttentionShape sameBase = new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, TurboFormat.TURBO3,
                TurboFormat.TURBO3, 64);
        assertEquals(AttentionSource.decodeSharedBytes(sameBase, 8) + 8 * 2 * 128,
                AttentionSource.decodeSharedBytes(same, 8));
    }

    @Test
    void shapesTheKernelsCannotServeAreRefusedWithTheReason() {
        KvFormat f16 = KvFormat.parse("f16");
        IllegalArgumentException head = assertThrows(IllegalArgumentException.class,
                () -> new AttentionShape(new KvGeometry(1, 8, 96, 96), 32, f16, f16, 64));
        assertTrue(head.getMessage().contains("head sizes 64, 128 and 256, got 96"), head.getMessage());
        IllegalArgumentException page = assertThrows(IllegalArgumentException.class,
                () -> new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, f16, f16, 12));
        assertTrue(page.getMessage().contains("multiple of 8 tokens"), page.getMessage());
        IllegalArgumentException heads = assertThrows(IllegalArgumentException.class,
                () -> new AttentionShape(new KvGeometry(1, 8, 128, 128), 12, f16, f16, 64));
        assertTrue(heads.getMessage().contains("multiple of the 8 kv heads"), heads.getMessage());
        IllegalArgumentException centered = assertThrows(IllegalArgumentException.class,
                () -> new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, KvFormat.parse("turbo3"),
                        KvFormat.parse("turbo3+mean"), 64));
        assertTrue(centered.getMessage().contains("only keys are centered"), centered.getMessage());
        assertEquals(AttentionSource.formatId(TurboFormat.TURBO3), AttentionSource.formatId(KvFormat.parse(
                "turbo3+mean")));
        assertEquals("1", AttentionSource.defines(new AttentionShape(new KvGeometry(1, 8, 128, 128), 32,
                KvFormat.parse("turbo3+mean"), TurboFormat.TURBO3, 64)).get("KMEAN"));
        // the prefill stages of turbo4+mean keys with f16 values of 256 do not fit in shared memory: refused
        IllegalArgumentException big = assertThrows(IllegalArgumentException.class,
                () -> new AttentionShape(new KvGeometry(1, 8, 256, 256), 32, KvFormat.parse("turbo4+mean"),
                        KvFormat.parse("f16"), 64));
        assertTrue(big.getMessage().contains("do not fit in shared memory"), big.getMessage());
        IllegalArgumentException split = assertThrows(IllegalArgumentException.class,
                () -> new AttentionPlan(1, 1, 100, 24, 0));
        assertTrue(split.getMessage().contains("16-token tiles"), split.getMessage());
    }

    private static AttentionShape shape(String format, int kvHeads, int d) {
        KvFormat f = KvFormat.parse(format);
        return new AttentionShape(new KvGeometry(1, kvHeads, d, d), 4 * kvHeads, f, f, 64);
    }
}
