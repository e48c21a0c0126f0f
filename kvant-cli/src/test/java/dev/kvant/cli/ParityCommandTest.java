package dev.kvant.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

class ParityCommandTest {

    @Test
    void parityReportsEveryCpuKernelWithTheSameChecksumAndSucceeds() {
        MainTest.Run r = MainTest.run("parity", "--ctk", "turbo3", "--ctv", "q8_0", "--ctx", "300", "--queries", "3",
                "--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--seed", "7", "-t", "2", "--json");
        assertEquals(0, r.code(), r.err() + r.out());
        assertTrue(r.out().contains("\"seed\":7"), r.out());
        Matcher m = Pattern.compile("\"kernel\":\"(cpu-[a-z-]+)\",\"nmse\":([0-9.e+-]+),[^}]*\"checksum\":\"([0-9a-f]{16})\"")
                .matcher(r.out());
        String checksum = null;
        int kernels = 0;
        while (m.find()) {
            kernels++;
            assertTrue(Double.parseDouble(m.group(2)) < 1e-9, m.group(1) + " NMSE " + m.group(2));
            if (checksum == null) {
                checksum = m.group(3);
            }
            // decode, multi-query and prefill compute every query the same way: equal bits
            assertEquals(checksum, m.group(3), r.out());
        }
        assertEquals(3, kernels, r.out());
    }

    /** Without a GPU, asking for the CUDA kernels is a clear error, not a crash; with one, they join the table. */
    @Test
    void parityWithTheCudaBackendRunsOrSaysWhyNot() {
        MainTest.Run r = MainTest.run("parity", "--backend", "cuda", "--ctx", "300", "--queries", "3", "--heads", "8",
                "--kv-heads", "2", "--head-dim", "64", "--seed", "7", "--json");
        if (dev.kvant.cuda.Cuda.available().ok()) {
            assertEquals(0, r.code(), r.err() + r.out());
            assertTrue(r.out().contains("\"kernel\":\"cuda-decode\""), r.out());
        } else {
            assertEquals(1, r.code(), r.out());
            assertTrue(r.err().contains("--backend cuda"), r.err());
        }
        MainTest.Run bad = MainTest.run("parity", "--backend", "tpu");
        assertEquals(2, bad.code());
        assertTrue(bad.err().contains("tpu") && bad.err().contains("cuda"), bad.err());
    }

    @Test
    void parityNamesAnUnknownFormat() {
        MainTest.Run r = MainTest.run("parity", "--ctk", "q5_1");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("q5_1") && r.err().contains("turbo3"), r.err());
    }

    @Test
    void benchAttentionPrintsOneRowPerFormatContextAndThreadCount() {
        MainTest.Run r = MainTest.run("bench-attention", "--formats", "f16,turbo3", "--ctx", "256,512", "-t", "1,2",
                "-r", "3", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--copy-mb", "8", "--json");
        assertEquals(0, r.code(), r.err());
        Matcher m = Pattern.compile("\\{\"kv\":\"(f16|turbo3)\",\"test\":\"decode\",\"ctx\":(256|512),\"threads\":(1|2),"
                + "\"cache_bytes\":[0-9]+,\"ms\":([0-9.]+),\"gb_per_s\":([0-9.]+),\"copy_gb_per_s\":([0-9.]+)}")
                .matcher(r.out());
        int rows = 0;
        while (m.find()) {
            rows++;
            assertTrue(Double.parseDouble(m.group(4)) > 0 && Double.parseDouble(m.group(6)) > 0, r.out());
        }
        assertEquals(8, rows, r.out());
    }
}
