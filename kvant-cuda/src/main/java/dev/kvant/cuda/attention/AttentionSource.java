package dev.kvant.cuda.attention;

import dev.kvant.cuda.KernelSource;
import dev.kvant.kv.Codebook;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import dev.kvant.kv.PageMeanFormat;
import dev.kvant.kv.Rotation;
import dev.kvant.kv.TurboFormat;
import java.util.List;
import java.util.Map;
import jdk.incubator.vector.FloatVector;

/**
 * The CUDA source of one attention module: a header generated here from the CPU's own constants (rotation signs
 * and scales from {@link Rotation} by {@link RotationSource}, codebooks from {@link TurboFormat#codebook}, and the
 * vector width of the CPU encoder), then {@code rotation.cuh}, {@code kv_format.cuh}, {@code rope.cuh},
 * {@code kv_write.cu}, {@code attention.cu} and {@code select.cu}, compiled with the defines KF, VF (format ids in {@link KvFormat#all()} order), DK, DV, HBD
 * (kv heads per decode block) and HB_ALL (1 when a decode block serves every kv head: its tokens' rows then start on
 * 16 bytes in their pages).
 *
 * <p>Nothing is pasted: a new codebook or sign convention in core reaches the device through this header, and the
 * kernel cache key (a hash of the source) changes with it.
 */
final class AttentionSource {
    /** The module's files, under {@link KernelSource#RESOURCE_FOLDER}, in order. */
    static final List<String> FILES = List.of("rotation.cuh", "attention/kv_format.cuh", "rope.cuh",
            "attention/kv_write.cu", "attention/attention.cu", "attention/select.cu");
    /** Shared memory one block may use on sm_90 (227 KiB). */
    static final int MAX_SHARED = 227 * 1024;

    private AttentionSource() {
    }

    /**
     * The module's source; its name says what it was made for, e.g. {@code attention[turbo3/turbo3/128/128/hb8-all]}
     * (8 kv heads a decode block, all of them).
     */
    static KernelSource source(AttentionShape shape) {
        return source(shape, decodeHeads(shape));
    }

    /**
     * The module with {@code hb} kv heads per decode block: 1 for the one that also has the selected decode
     * (kvant_attn_decode_sel reads one kv head's list per block).
     */
    static KernelSource source(AttentionShape shape, int hb) {
        String code = generatedHeader(cpuEncoderLanes()) + "\n" + KernelSource.joined(FILES);
        return KernelSource.kvant("attention[" + shape.kFormat().name() + "/" + shape.vFormat().name() + "/"
                + shape.headDimK() + "/" + shape.headDimV() + "/hb" + hb + (hb == shape.kvHeads() ? "-all" : "") + "]",
                code);
    }

    static Map<String, String> defines(AttentionShape shape) {
        return defines(shape, decodeHeads(shape));
    }

    static Map<String, String> defines(AttentionShape shape, int hb) {
        return Map.of("KF", Integer.toString(formatId(shape.kFormat())),
                "KMEAN", shape.kFormat() instanceof PageMeanFormat ? "1" : "0",
                "VF", Integer.toString(formatId(shape.vFormat())),
                "DK", Integer.toString(shape.headDimK()),
                "DV", Integer.toString(shape.headDimV()),
                "HBD", Integer.toString(hb),
                "HB_ALL", hb == shape.kvHeads() ? "1" : "0");
    }

    /**
     * The id kv_format.cuh uses for a format: its position in {@link KvFormat#all()}; a centered K format has its
     * rows' format's id (the define KMEAN says it is centered).
     */
    static int formatId(KvFormat format) {
        int id = KvFormat.all().indexOf(PageMeanFormat.rows(format));
        if (id < 0) {
            throw new IllegalArgumentException("KV format " + format.name() + " has no GPU kernels");
        }
        return id;
    }

    /**
     * The float lanes of the CPU encoder's sums (dev.kvant.kv.KvLanes: the preferred width if 8 to 16 lanes, else 8):
     * the turbo norm's summation order, which the device encoder reproduces.
     */
    static int cpuEncoderLanes() {
        int lanes = FloatVector.SPECIES_PREFERRED.length();
        return lanes >= 8 && lanes <= 16 ? lanes : 8;
    }

    /**
     * Kv heads per decode block: the most (up to 8, one warp each) that divide the kv heads and whose tiles fit in
     * shared memory. All heads of a block are contiguous in a page, so one 16-byte copy stream serves them.
     */
    static int decodeHeads(AttentionShape shape) {
        for (int hb = Math.min(8, shape.kvHeads()); hb >= 1; hb--) {
            if (shape.kvHeads() % hb == 0 && decodeSharedBytes(shape, hb) <= MAX_SHARED) {
                return hb;
            }
        }
        throw new IllegalArgumentException("no decode block of kv heads fits in shared memory for " + shape);
    }

    /** Mirror of attention.cu's Layout for decode (the device reports the real size through kvant_attn_info). */
    static int decodeSharedBytes(AttentionShape shape, int hb) {
        return layoutBytes(shape.geometry(), shape.kFormat(), shape.vFormat(), hb, hb, 16, 8, true, false, true);
    }

    /** Mirror of attention.cu's Layout for prefill (PreLayout: one kv head, 8 warps, 64-token tiles). */
    static int prefillSharedBytes(KvGeometry g, KvFormat kFormat, KvFormat vFormat) {
        return layoutBytes(g, kFormat, vFormat, 1, 8, 64, 16, false, kFormat instanceof PageMeanFormat, false);
    }

    /** attention.cu's Layout&lt;HB, WARPS, TT, QROWS, Q_ALIAS, MU, FRAG&gt;::TOTAL. */
    private static int layoutBytes(KvGeometry g, KvFormat kFormat, KvFormat vFormat, int hb, int warps, int tt,
                                   int qRows, boolean qAlias, boolean mu, boolean frag) {
        int dK = g.headDimK(), dV = g.headDimV();
        KvFormat k = PageMeanFormat.rows(kFormat), v = vFormat;
        boolean kMean = kFormat instanceof PageMeanFormat;
        boolean kFrag = frag && (k instanceof TurboFormat && (dK == 128 || dK == 64) || blockFragments(k));
        boolean vFrag = frag && (v instanceof TurboFormat && (dV == 128 || dV == 64) || blockFragments(v) && dV <= 256);
        int coverK = hb * (int) k.rowBytes(dK), coverV = hb * (int) v.rowBytes(dV);
        // DEC_TIGHT: a decode block of every kv head reading both sides as fragments, covers of whole words whose
        // stride is no multiple of 64 bytes (attention.cu's tight_cover)
        boolean tight = frag && hb == g.kvHeads() && kFrag && vFrag && coverK % 16 == 0 && coverK % 64 != 0
                && coverV % 16 == 0 && coverV % 64 != 0;
        int slotK = tight ? coverK : round16(coverK) + 16;
        int slotV = tight ? coverV : round16(coverV) + 16;
        int qStr = 2 * dK + 16;
        int ts = Math.max(direct(k) || kFrag ? 0 : 2 * dK + 16, direct(v) || vFrag ? 0 : 2 * dV + 16);
        int tiles = ts == 0 ? 0 : hb;
        boolean qInTile = qAlias && ts > 0 && tt * ts >= qRows * qStr && warps == tiles;
        boolean sharedLut = v == k && Rotation.blockSize(dK) == Rotation.blockSize(dV)
                && lutStride(k, kFrag) == lutStride(v, vFrag);
        int plainFixed = (qInTile ? 0 : warps * qRows * qStr) + lutEntries(k) * lutStride(k, kFrag)
                + (sharedLut ? 0 : lutEntries(v) * lutStride(v, vFrag)) + tiles * tt * ts + round16(8 * tt * 2);
        int fixed = plainFixed + (kMean ? warps * dK * 2 : 0);
        int plainStage = tt * (slotK + slotV);
        int stage = plainStage + (mu ? (tt / 8) * dK * 2 : 0);
        int small = mu ? (110 * 1024 - plainFixed) / plainStage : (110 * 1024 - fixed) / stage;
        int stages = small >= 2 ? Math.min(small, 6) : Math.max(2, Math.min(6, (200 * 1024 - fixed) / stage));
        return fixed + stages * stage;
    }

    private static boolean direct(KvFormat f) {
        return formatId(f) <= 1;
    }

    /**
     * kv_format.cuh fmt_8bit or fmt_q4: q8_0, int8, q4_0 and q4_0h, whose decode reads its fragments straight from
     * the stage at any head size.
     */
    private static boolean blockFragments(KvFormat f) {
        int id = formatId(f);
        return id >= 2 && id <= 5;
    }

    /** kv_format.cuh lut_entries: turbo3's 7-bit indices have bit 5 clear, so they stop at 95. */
    private static int lutEntries(KvFormat f) {
        if (f instanceof TurboFormat t) {
            return switch (t.bits()) {
                case 4 -> 256;
                case 3 -> 96;
                default -> 16;
            };
        }
        return 0;
    }

    /** kv_format.cuh lut_stride: 256-byte entries for the fragment paths of turbo3 and turbo2. */
    private static int lutStride(KvFormat f, boolean frag) {
        return frag && f instanceof TurboFormat t && t.bits() < 4 ? 256 : 128;
    }

    private static int round16(int x) {
        return (x + 15) & ~15;
    }

    /**
     * kv_rot_sign[n==128][D1=0/D2=1][word]: bit i of word j set when element 32j + i has sign -1; kv_rot_scale[n==128]
     * = fl(1/sqrt(n)) as Rotation computes it; kv_centroid[bits-2][n==128][i] and kv_boundary[bits-2][n==128][gain][i] (the boundaries / each of
     * TurboFormat.gains()) as floats.
     */
    static String generatedHeader(int lanes) {
        StringBuilder h = new StringBuilder();
        h.append("// generated by dev.kvant.cuda.attention.AttentionSource from dev.kvant.kv (kv-format v")
                .append(KvFormat.VERSION).append(")\n");
        h.append("#define KV_LANES ").append(lanes).append('\n');
        h.append(RotationSource.header());
        StringBuilder centroids = new StringBuilder("__constant__ float kv_centroid[3][2][16] = {");
        float[] gains = TurboFormat.gains();
        h.append("#define KV_GAINS ").append(gains.length).append('\n');
        StringBuilder boundaries = new StringBuilder("__constant__ float kv_boundary[3][2][KV_GAINS][16] = {");
        TurboFormat[] byBits = {TurboFormat.TURBO2, TurboFormat.TURBO3, TurboFormat.TURBO4};
        for (int b = 0; b < 3; b++) {
            centroids.append(b == 0 ? "{" : ", {");
            boundaries.append(b == 0 ? "{" : ", {");
            for (int n : new int[] {64, 128}) {
                Codebook cb = byBits[b].codebook(n);
                centroids.append(n == 64 ? "" : ", ").append(floats(cb.centroidsAsFloat()));
                boundaries.append(n == 64 ? "{" : ", {");
                for (int a = 0; a < gains.length; a++) {
                    boundaries.append(a == 0 ? "" : ", ").append(floats(TurboFormat.gainBoundaries(cb, gains[a])));
                }
                boundaries.append('}');
            }
            centroids.append('}');
            boundaries.append('}');
        }
        h.append(centroids).append("};\n").append(boundaries).append("};\n");
        return h.toString();
    }

    private static String floats(float[] values) {
        StringBuilder s = new StringBuilder("{");
        for (int i = 0; i < 16; i++) {
            s.append(i == 0 ? "" : ", ").append(hex(i < values.length ? values[i] : 0f));
        }
        return s.append('}').toString();
    }

    /** A C float literal with the exact value: hexadecimal, as Float.toHexString writes it. */
    static String hex(float f) {
        if (!Float.isFinite(f)) {
            throw new IllegalArgumentException("constant " + f + " is not finite");
        }
        return Float.toHexString(f) + "f";
    }
}
