package dev.kvant.gguf;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.Fixtures;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/** The real tinycode model opens and says what its README says. */
class TinycodeGgufTest {
    private static final ValueLayout.OfFloat F32 = ValueLayout.JAVA_FLOAT_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    @Test
    void tinycodeF16HasTheDocumentedArchitectureAndShapes() throws Exception {
        Path path = Fixtures.requireTinycode("tinycode-f16.gguf");
        try (GgufFile f = GgufFile.open(path)) {
            GgufMetadata md = f.metadata();
            assertEquals("llama", md.getString("general.architecture"));
            assertEquals(8, md.getInt("llama.block_count"));
            assertEquals(512, md.getInt("llama.embedding_length"));
            assertEquals(8192, md.getInt("llama.context_length"));
            assertEquals(4, md.getInt("llama.attention.head_count"));
            assertEquals(2, md.getInt("llama.attention.head_count_kv"));
            assertEquals(100000f, md.getFloat("llama.rope.freq_base"));
            assertEquals(4096, md.getStringArray("tokenizer.ggml.tokens").size());
            assertEquals("<|endoftext|>", md.getStringArray("tokenizer.ggml.tokens").getFirst());
            assertEquals(8 * 9 + 3, f.tensors().size());
            assertEquals(Files.size(path), f.byteSize());

            GgufTensorInfo q = f.requireTensor("blk.0.attn_q.weight");
            assertEquals(GgmlType.F16, q.type());
            assertArrayEquals(new long[] {512, 512}, q.shape());
            assertEquals(512L * 512 * 2, f.data(q).byteSize());
            assertArrayEquals(new long[] {512, 4096}, f.requireTensor("token_embd.weight").shape());

            GgufTensorInfo norm = f.requireTensor("blk.0.attn_norm.weight");
            assertEquals(GgmlType.F32, norm.type());
            MemorySegment w = f.data(norm);
            for (long i = 0; i < norm.elementCount(); i++) {
                float x = w.get(F32, 4 * i);
                assertTrue(Float.isFinite(x) && x != 0f, "attn_norm[" + i + "] = " + x);
            }
            System.out.println(f.describe());
        }
    }

    @Test
    void tinycodeQ8_0StoresMatricesAsQ8_0() {
        Path path = Fixtures.requireTinycode("tinycode-q8_0.gguf");
        try (GgufFile f = GgufFile.open(path)) {
            GgufTensorInfo q = f.requireTensor("blk.0.attn_q.weight");
            assertEquals(GgmlType.Q8_0, q.type());
            assertEquals(512 / 32 * 34 * 512, q.byteSize());
            assertEquals(GgmlType.F32, f.requireTensor("output_norm.weight").type());
        }
    }
}
