package dev.kvant.server;

import dev.kvant.Fixtures;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.Optional;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Many streaming clients with random cancellations: every request must end in a complete response, a client-side
 * cancellation or a clean 503, nothing may hang, and the KV pool must have as many free pages at the end as at the
 * start.
 */
class ServerLoadTest {

    @Test
    void concurrentStreamsWithCancellationsEndCleanlyAndLeakNoPage() {
        long seed = new Random().nextLong();
        try (TestServers m = TestServers.tiny(seed)) {
            ServeBench.LoadReport r = ServeBench.load(m.setup(256, 32), 4,
                    new ServeBench.LoadPlan(8, 48, 4, 160, 24, 0.25, seed, Duration.ofMinutes(3)));
            assertTrue(r.clean(), "seed " + seed + ": " + r);
            assertEquals(48, r.completed() + r.cancelled() + r.rejected(), "seed " + seed + ": " + r);
            assertTrue(r.cancelled() > 0 && r.completed() > 0, "seed " + seed + ": " + r);
        }
    }

    /** The figure: 32 clients, 500 requests, tinycode (or the synthetic tiny shape without the fixture). */
    @Test
    @Tag("slow")
    void fiveHundredRequestsFromThirtyTwoClients() {
        long seed = new Random().nextLong();
        Optional<java.nio.file.Path> tinycode = Fixtures.tinycode("tinycode-q8_0.gguf");
        try (TestServers m = tinycode.map(TestServers::load).orElseGet(() -> TestServers.tiny(seed))) {
            ServeBench.LoadReport r = ServeBench.load(m.setup(2048, 256), 8,
                    new ServeBench.LoadPlan(32, 500, 8, 1024, 64, 0.15, seed, Duration.ofMinutes(30)));
            System.out.println("load test (seed " + seed + "): " + r.completed() + " completed, " + r.cancelled()
                    + " cancelled, " + r.rejected() + " rejected in " + r.seconds() + " s; TTFT " + r.ttft().millis()
                    + "; inter-token " + r.itl().millis());
            assertTrue(r.clean(), "seed " + seed + ": " + r);
            assertEquals(500, r.completed() + r.cancelled() + r.rejected());
        }
    }
}
