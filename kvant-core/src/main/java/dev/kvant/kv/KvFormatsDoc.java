package dev.kvant.kv;

import java.util.Locale;

/**
 * The part of docs/KV_FORMATS.md that the code determines: rotation signs and codebooks. Printed by
 * {@link #main}, pasted between the doc's generated markers, and checked against the code by a test, so the
 * document always states the constants kv-format v1 actually uses.
 */
public final class KvFormatsDoc {
    static final String BEGIN = "<!-- BEGIN GENERATED: java dev.kvant.kv.KvFormatsDoc -->";
    static final String END = "<!-- END GENERATED -->";

    private KvFormatsDoc() {
    }

    public static void main(String[] args) {
        System.out.print(generated());
    }

    /** The generated section, markers included. */
    static String generated() {
        StringBuilder s = new StringBuilder();
        s.append(BEGIN).append('\n');
        s.append("\n### Rotation signs (kv-format v").append(KvFormat.VERSION).append(")\n\n");
        s.append(String.format(Locale.ROOT, "SplitMix64 seeded with 0x%X; `-` marks a sign of -1, element 0 first.%n",
                Rotation.SEED));
        s.append("\n```\n");
        for (int n : new int[] {64, 128}) {
            Rotation r = Rotation.ofBlock(n);
            for (int which = 1; which <= 2; which++) {
                StringBuilder line = new StringBuilder();
                for (int i = 0; i < n; i++) {
                    line.append(r.sign(which, i) < 0 ? '-' : '+');
                }
                for (int i = 0; i < n; i += 64) {
                    s.append(String.format(Locale.ROOT, "n=%-3d D%d [%3d..%3d] %s%n", n, which, i, i + 63,
                            line.substring(i, i + 64)));
                }
            }
        }
        s.append("```\n");
        s.append("\n### Codebooks\n\n");
        s.append("Centroids are the float constants the decoder multiplies by; `×√n` is the same value in units of the\n");
        s.append("coordinate's standard deviation; a value's code is the number of boundaries strictly below it.\n");
        s.append("`E‖u-û‖²` is the codebook's expected squared error for a unit vector (n × the per-coordinate MSE).\n");
        for (int n : new int[] {128, 64}) {
            for (int bits = 4; bits >= 2; bits--) {
                Codebook cb = Codebook.sphere(bits, n);
                float[] c = cb.centroidsAsFloat();
                float[] b = cb.boundaries();
                s.append(String.format(Locale.ROOT, "%n#### turbo%d, n = %d: %d centroids, E‖u-û‖² = %.6f (%d Lloyd iterations)%n%n",
                        bits, n, c.length, cb.unitVectorMse(), cb.iterations()));
                s.append("| code | centroid | ×√n | boundary to next |\n| ---: | ---: | ---: | ---: |\n");
                for (int i = 0; i < c.length; i++) {
                    s.append(String.format(Locale.ROOT, "| %d | %s | %.6f | %s |%n", i, Float.toString(c[i]),
                            c[i] * Math.sqrt(n), i < b.length ? Float.toString(b[i]) : ""));
                }
            }
        }
        s.append('\n').append(END).append('\n');
        return s.toString();
    }
}
