package dev.kvant.tensor;

import dev.kvant.gguf.GgmlType;

/**
 * A tensor type that kvant cannot compute with. The message names the type and the supported ones; whoever knows
 * the tensor's name (the model loader) adds it.
 */
public final class UnsupportedTensorTypeException extends RuntimeException {
    /** The types {@link WeightFormat#of} accepts, in the order the message lists them. */
    public static final String SUPPORTED = "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K";

    private final transient GgmlType type;

    public UnsupportedTensorTypeException(GgmlType type) {
        super("unsupported tensor type " + type + " (supported: " + SUPPORTED + ")");
        this.type = type;
    }

    public GgmlType type() {
        return type;
    }
}
