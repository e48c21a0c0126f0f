package dev.kvant.model;

/**
 * Rotary position embedding. NORMAL rotates adjacent pairs (2i, 2i+1), as llama.cpp's GGUF conversions of Llama and
 * Mistral expect; NEOX rotates (i, i + ropeDim/2), as Qwen does. Frequencies are base^(-2i/ropeDim), divided by the
 * per-pair factors of a {@code rope_freqs} tensor (Llama 3.1 frequency scaling) and positions divided by the linear
 * scale factor.
 */
public record Rope(Mode mode, int ropeDim, float base, float linearScale, float[] freqFactors) {

    public enum Mode { NORMAL, NEOX }

    public Rope {
        if (ropeDim <= 0 || ropeDim % 2 != 0) {
            throw new IllegalArgumentException("rope dimension must be positive and even, got " + ropeDim);
        }
        if (freqFactors != null && freqFactors.length != ropeDim / 2) {
            throw new IllegalArgumentException("rope_freqs has " + freqFactors.length + " factors, expected "
                    + ropeDim / 2);
        }
        if (!(base > 0f) || Float.isInfinite(base) || !(linearScale > 0f) || Float.isInfinite(linearScale)) {
            throw new IllegalArgumentException("the rope base (" + base + ") and linear scale (" + linearScale
                    + ") must be finite and positive");
        }
        if (freqFactors != null) {
            for (int i = 0; i < freqFactors.length; i++) {
                if (!(freqFactors[i] > 0f) || Float.isInfinite(freqFactors[i])) {
                    throw new IllegalArgumentException("rope_freqs factor " + i + " is " + freqFactors[i]
                            + ", not finite and positive");
                }
            }
        }
    }

    /** Angular frequency of pair i, in double so every backend can derive identical tables. */
    public double frequency(int i) {
        double f = Math.pow(base, -2.0 * i / ropeDim);
        return freqFactors == null ? f : f / freqFactors[i];
    }

    /** cos and sin of every pair at position pos: table[2i] = cos, table[2i+1] = sin. */
    public void angles(int pos, float[] table) {
        double p = pos / (double) linearScale;
        for (int i = 0; i < ropeDim / 2; i++) {
            double a = p * frequency(i);
            table[2 * i] = (float) Math.cos(a);
            table[2 * i + 1] = (float) Math.sin(a);
        }
    }

    /** Rotates each head of x[off .. off + heads*headDim) in place with the angles of one position. */
    public void apply(float[] x, int off, int heads, int headDim, float[] table) {
        int half = ropeDim / 2;
        for (int h = 0; h < heads; h++) {
            int base0 = off + h * headDim;
            for (int i = 0; i < half; i++) {
                int a = mode == Mode.NORMAL ? base0 + 2 * i : base0 + i;
                int b = mode == Mode.NORMAL ? a + 1 : a + half;
                float c = table[2 * i];
                float s = table[2 * i + 1];
                float x0 = x[a];
                float x1 = x[b];
                x[a] = x0 * c - x1 * s;
                x[b] = x0 * s + x1 * c;
            }
        }
    }
}
