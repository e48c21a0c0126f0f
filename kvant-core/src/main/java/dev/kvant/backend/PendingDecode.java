package dev.kvant.backend;

/**
 * A decode step a backend has started and not yet finished ({@link Backend#startDecode}): a device backend has
 * queued its work and returned, so the caller can start a step of other sequences (on a layer split, on the GPU the
 * first one has left) before it waits for this one.
 */
public interface PendingDecode {

    /**
     * Waits for the step. Returns, per sequence, the id of its largest logit (the lowest among equal ones) when the
     * step was started without a logits array; when it was started with one, the logits are in that array now and
     * this returns null. A step started by {@link Backend#startDecodeDrawn} returns the ids it chose either way (and
     * fills the logits array when given one). A second call returns what the first did.
     */
    int[] await();
}
