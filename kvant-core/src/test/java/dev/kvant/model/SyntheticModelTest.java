package dev.kvant.model;

import dev.kvant.gguf.GgmlType;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;

/** Synthetic models read per token the bytes a real model file of their type holds. */
class SyntheticModelTest {

    /** llama.cpp's quantizer leaves the output head in Q6_K for Q4_0/Q4_K/Q5_K files, in the file's type otherwise. */
    @Test
    void theOutputHeadIsQ6KWhereLlamaCppQuantizesItSo() {
        for (GgmlType t : new GgmlType[] {GgmlType.Q4_0, GgmlType.Q4_K, GgmlType.Q5_K}) {
            assertEquals(GgmlType.Q6_K, SyntheticModel.headType(t, 4096), t.name());
            assertEquals(t, SyntheticModel.headType(t, 4096 + 32), t + ": rows of no whole Q6_K blocks keep the type");
        }
        for (GgmlType t : new GgmlType[] {GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.Q8_0, GgmlType.Q6_K}) {
            assertEquals(t, SyntheticModel.headType(t, 4096), t.name());
        }
    }
}
