package dev.kvant.attention;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvFormat;
import dev.kvant.tensor.Parallel;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

class AttentionParityTest {
    private static final long SEED = new SplittableRandom().nextLong();

    private static AttentionParity.Settings settings(String k, String v) {
        return new AttentionParity.Settings(KvFormat.parse(k), KvFormat.parse(v), 700, 4, 2, 8, 128, 128, SEED,
                AttentionOptions.defaults());
    }

    @Test
    void everyCpuKernelPassesAndAllAgreeBitForBit() {
        AttentionParity.Report r = AttentionParity.run(settings("q4_0h", "turbo4"),
                AttentionParity.cpuKernels(Parallel.serial()));
        assertTrue(r.ok(), r.markdown());
        assertEquals(4, r.results().size(), r.markdown());
        long sum = r.results().get(1).checksum();
        for (AttentionParity.Result x : r.results().subList(1, 4)) {
            assertEquals(sum, x.checksum(), r.markdown());
            assertTrue(x.nmse() > 0 && x.nmse() < 1e-10, r.markdown());
        }
        assertTrue(r.toJson().contains("\"seed\":" + SEED), r.toJson());
    }

    /**
     * Sparse V past one partition: the kernels keep rows the reference's exact rule drops (they know each weight
     * only within its partition), which a fixed bound of 1e-3 called a failure at 2,048 positions and T = 0.01; the
     * bound now grows by the dense output's distance from the reference, and the kernels still agree bit for bit.
     * A threshold that drops every row of the reference is measured against the dense output's energy, not 0/0.
     */
    @Test
    void sparseVKernelsPassBetweenTheExactRuleAndDenseAttention() {
        for (float t : new float[] {0.01f, 0.5f}) {
            AttentionParity.Settings st = new AttentionParity.Settings(KvFormat.parse("f16"), KvFormat.parse("f16"),
                    2048, 2, 2, 8, 128, 128, SEED, AttentionOptions.defaults().withSparseV(t));
            AttentionParity.Report r = AttentionParity.run(st, AttentionParity.cpuKernels(Parallel.serial()));
            assertTrue(r.ok(), "T " + t + ", seed " + SEED + ":\n" + r.markdown());
            long sum = r.results().get(1).checksum();
            for (AttentionParity.Result x : r.results().subList(1, r.results().size())) {
                assertEquals(sum, x.checksum(), r.markdown());
                assertTrue(Double.isFinite(x.nmse()), r.markdown());
            }
        }
        // a wrong kernel still fails with sparse V on: the bound is the gap, not anything
        List<AttentionKernel> wrong = new ArrayList<>(AttentionParity.cpuKernels(Parallel.serial()));
        wrong.add(AttentionParity.kernel("zeros", (p, o, out) -> Arrays.fill(out, 0f)));
        AttentionParity.Report bad = AttentionParity.run(new AttentionParity.Settings(KvFormat.parse("f16"),
                KvFormat.parse("f16"), 2048, 2, 2, 8, 128, 128, SEED, AttentionOptions.defaults().withSparseV(0.01f)),
                wrong);
        assertFalse(bad.ok(), bad.markdown());
    }

    @Test
    void aWrongKernelFailsTheReport() {
        List<AttentionKernel> kernels = new ArrayList<>(AttentionParity.cpuKernels(Parallel.serial()));
        // attends to one position too few: a plausible off-by-one in a causal mask
        kernels.add(AttentionParity.kernel("one-row-short", (p, o, out) -> CpuAttention.decode(p.seq(), 0,
                p.queries(), 1, p.start() - 1, p.heads(), p.scale(), o, out, Parallel.serial())));
        AttentionParity.Report r = AttentionParity.run(settings("f16", "f16"), kernels);
        assertFalse(r.ok(), r.markdown());
        assertTrue(r.markdown().contains("EXCEEDED"), r.markdown());
    }

    @Test
    void aKernelThatTakesFewerQueriesIsListedAsNotRunAndTheOthersStillRun() {
        List<AttentionKernel> kernels = new ArrayList<>(AttentionParity.cpuKernels(Parallel.serial()));
        kernels.add(new AttentionKernel() {
            @Override
            public String name() {
                return "two-at-most";
            }

            @Override
            public int maxQueries() {
                return 2;
            }

            @Override
            public void run(AttentionProblem p, AttentionOptions o, float[] out) {
                throw new AssertionError("run with " + p.n() + " queries");
            }
        });
        AttentionParity.Report r = AttentionParity.run(settings("f16", "f16"), kernels);   // 4 queries
        assertTrue(r.ok(), r.markdown());
        assertEquals(4, r.results().size(), r.markdown());
        assertEquals(List.of("two-at-most: at most 2 queries"), r.skipped());
        assertTrue(r.markdown().contains("not run: two-at-most: at most 2 queries"), r.markdown());
        assertTrue(r.toJson().endsWith("\"not_run\":[\"two-at-most: at most 2 queries\"]}"), r.toJson());
    }

    @Test
    void checksumDependsOnEveryBit() {
        float[] x = {1f, 2f, 3f};
        long a = AttentionParity.checksum(x);
        x[1] = Math.nextUp(2f);
        assertTrue(a != AttentionParity.checksum(x));
    }

    /** A kernel that wrote NaN: its NMSE and error are JSON nulls (a bare Infinity is no JSON), and it is not ok. */
    @Test
    void aNonFiniteErrorIsNullInJson() {
        AttentionParity.Result r = new AttentionParity.Result("broken", Double.POSITIVE_INFINITY, Double.NaN, 7L,
                1e-5, 1.0);
        assertTrue(r.toJson().contains("\"nmse\":null,\"max_abs_err\":null,"), r.toJson());
        assertTrue(r.toJson().endsWith("\"ok\":false}"), r.toJson());
        AttentionParity.Result fine = new AttentionParity.Result("fine", 1.5e-7, 2e-3, 7L, 1e-5, 1.0);
        assertTrue(fine.toJson().contains("\"nmse\":1.500e-07,\"max_abs_err\":2.000e-03,"), fine.toJson());
    }
}
