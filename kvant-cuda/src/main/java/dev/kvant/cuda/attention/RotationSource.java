package dev.kvant.cuda.attention;

import dev.kvant.kv.Rotation;

/**
 * The constant tables of the device's rotation ({@code rotation.cuh}), generated from {@link Rotation}: the sign
 * vectors D1 and D2 of blocks of 64 and 128 values as bit words ({@code kv_rot_sign[block][D1 or D2][word]}) and
 * fl(1/sqrt(N)) ({@code kv_rot_scale}). Both the attention modules and the model module prepend it, so a query
 * rotated by the model's RoPE and a key rotated on write meet in the same basis.
 */
public final class RotationSource {
    private RotationSource() {
    }

    /** The tables as CUDA source. */
    public static String header() {
        StringBuilder h = new StringBuilder();
        h.append("__constant__ unsigned int kv_rot_sign[2][2][4] = {");
        for (int n : new int[] {64, 128}) {
            Rotation r = Rotation.ofBlock(n);
            h.append(n == 64 ? "{" : ", {");
            for (int which = 1; which <= 2; which++) {
                h.append(which == 1 ? "{" : ", {");
                for (int word = 0; word < 4; word++) {
                    long bits = 0;
                    for (int i = 0; i < 32 && 32 * word + i < n; i++) {
                        if (r.sign(which, 32 * word + i) < 0) {
                            bits |= 1L << i;
                        }
                    }
                    h.append(word == 0 ? "" : ", ").append("0x").append(Long.toHexString(bits)).append('u');
                }
                h.append('}');
            }
            h.append('}');
        }
        h.append("};\n");
        h.append("__constant__ float kv_rot_scale[2] = {").append(AttentionSource.hex((float) (1.0 / Math.sqrt(64)))).append(", ")
                .append(AttentionSource.hex((float) (1.0 / Math.sqrt(128)))).append("};\n");
        return h.toString();
    }

}
