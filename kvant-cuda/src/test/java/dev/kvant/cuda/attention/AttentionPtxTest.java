package dev.kvant.cuda.attention;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.kvant.cuda.CudaUnavailableException;
import dev.kvant.cuda.Nvrtc;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvGeometry;
import java.util.List;
import org.junit.jupiter.api.Test;

class AttentionPtxTest {
    /** Instructions are counted per entry, predicated ones and inline asm included; labels, directives not. */
    @Test
    void countsEachKernelsInstructionsByClass() {
        String ptx = """
                .version 9.0
                .target sm_90
                .visible .entry kvant_a(
                \t.param .u64 a
                )
                {
                \t.reg .b32 %r<4>;
                \tld.param.u64 %rd1, [a];
                $L__BB0_1:
                \tld.shared.u16 %rs1, [%rd1];
                \t@%p1 bra $L__BB0_1;
                \t// begin inline asm
                \tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r1,%r2}, {%f1,%f2,%f3,%f4};
                \t// end inline asm
                \tret;
                }
                .entry kvant_b(
                )
                {
                \tshfl.sync.bfly.b32 %r1, %r2, 1, 31, -1;
                \tbar.sync 0;
                \tret;
                }
                """;
        List<AttentionPtx.Kernel> k = AttentionPtx.count(ptx);
        assertEquals(2, k.size());
        assertEquals("kvant_a", k.get(0).name());
        assertEquals(5, k.get(0).instructions());
        assertEquals(1, k.get(0).classes().get("ld.shared"));
        assertEquals(1, k.get(0).classes().get("bra"));
        assertEquals(1, k.get(0).classes().get("mma"));
        assertEquals("kvant_b", k.get(1).name());
        assertEquals(3, k.get(1).instructions());
        assertEquals(1, k.get(1).classes().get("shfl"));
        assertEquals(1, k.get(1).classes().get("bar"));
    }

    /** Where NVRTC loads (no GPU needed): the turbo3 module compiles to PTX with its decode kernel in it. */
    @Test
    void theTurboModuleCompilesToPtx() {
        try {
            Nvrtc.load();
        } catch (CudaUnavailableException e) {
            assumeTrue(false, "NVRTC is not installed here: " + e.getMessage());
        }
        KvFormat turbo3 = KvFormat.parse("turbo3");
        String ptx = AttentionPtx.ptx(new AttentionShape(new KvGeometry(1, 8, 128, 128), 32, turbo3, turbo3, 64),
                "compute_90");
        AttentionPtx.Kernel decode = AttentionPtx.count(ptx).stream().filter(k -> k.name().equals("kvant_attn_decode"))
                .findFirst().orElseThrow();
        assertTrue(decode.instructions() > 1000 && decode.classes().getOrDefault("mma", 0) >= 16,
                decode.toString());
    }
}
