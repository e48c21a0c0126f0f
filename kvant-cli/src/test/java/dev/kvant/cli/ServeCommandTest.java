package dev.kvant.cli;

import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class ServeCommandTest {

    @Test
    void serveHelpListsTheServerOptions() {
        MainTest.Run r = MainTest.run("serve", "--help");
        assertEquals(0, r.code(), r.err());
        for (String option : new String[] {"--port", "--host", "--parallel", "--api-key", "--max-queue", "--ctk",
                "--backend", "--shutdown-grace"}) {
            assertTrue(r.out().contains(option), option + " in:\n" + r.out());
        }
    }

    @Test
    void serveWithoutAModelSaysWhatToPass() {
        MainTest.Run r = MainTest.run("serve", "--port", "0");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("no model given"), r.err());
    }

    @Test
    void aContextOrPoolTooLargeOrTooSmallIsNamedBeforeAnythingLoads() {
        MainTest.Run big = MainTest.run("serve", "--synthetic", "tiny", "--port", "0", "-np", "256", "-c", "8388608");
        assertEquals(2, big.code());
        assertTrue(big.err().contains("tokens of KV cache, more than one pool holds"), big.err());
        MainTest.Run zero = MainTest.run("serve", "--synthetic", "tiny", "--port", "0", "-c", "0");
        assertEquals(2, zero.code());
        assertTrue(zero.err().contains("-c must be at least 2"), zero.err());
    }

    /** A KV budget smaller than one context of an explicit -c is refused (it used to shrink the context unsaid). */
    @Test
    void aKvBudgetBelowOneContextOfTheAskedLengthIsRefused() {
        MainTest.Run r = MainTest.run("serve", "--synthetic", "tiny", "--port", "0", "-c", "512", "--kv-mem", "1M");
        assertEquals(2, r.code(), r.err());
        assertTrue(r.err().contains("less than one context of -c 512: raise --kv-mem or lower -c"), r.err());
    }

    @Test
    void approximatePrefixesWithoutAPrefixCacheAreRefused() {
        MainTest.Run r = MainTest.run("serve", "--synthetic", "tiny", "--port", "0", "--no-prefix-cache",
                "--prefix-cache-approximate");
        assertEquals(2, r.code());
        assertTrue(r.err().contains("--prefix-cache-approximate and --no-prefix-cache"), r.err());
        MainTest.Run help = MainTest.run("serve", "--help");
        assertTrue(help.out().contains("--prefix-cache-approximate"), help.out());
    }

    @Test
    void benchServeRunsThroughAQueryAwareSelection() {
        MainTest.Run r = MainTest.run("bench-serve", "--synthetic", "tiny", "--mode", "batching", "-np", "2",
                "--clients", "2", "--requests", "2", "-p", "300", "-n", "4", "-c", "512", "-t", "2", "--seed", "1",
                "--select", "topk", "--select-budget", "64", "--select-sink", "16", "--select-recent", "16",
                "--select-dense-layers", "0");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("| 1 |") && r.out().contains("| 2 |"), r.out());
        MainTest.Run dump = MainTest.run("serve", "--synthetic", "tiny", "--port", "0", "--select", "topk",
                "--dump-selection", "/tmp/x.sel");
        assertEquals(2, dump.code());
        assertTrue(dump.err().contains("--dump-selection"), dump.err());
    }

    @Test
    void benchServeBatchingOnASyntheticModelPrintsBothRows() {
        MainTest.Run r = MainTest.run("bench-serve", "--synthetic", "tiny", "--mode", "batching", "-np", "2",
                "--clients", "2", "--requests", "2", "-p", "8", "-n", "4", "-c", "128", "-t", "2", "--seed", "1");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().contains("| 1 |") && r.out().contains("| 2 |"), r.out());
    }
}
