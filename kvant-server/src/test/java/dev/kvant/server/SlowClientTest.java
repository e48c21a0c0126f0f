package dev.kvant.server;

import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.engine.EngineStats;
import dev.kvant.kv.KvFormat;
import org.junit.jupiter.api.Test;

import java.net.InetSocketAddress;
import java.net.Socket;
import java.time.Duration;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A client that stays connected but stops reading a streamed response: once the socket buffers are full the
 * server's write blocks, and the write deadline (here half a second) cuts the response — the request is counted as
 * a disconnect, its generation is cancelled before its end and its pages come back — instead of the request's thread
 * and connection waiting on that client for as long as it stays connected.
 */
class SlowClientTest {
    private static final int CTX = 4096;
    private static final int MAX_TOKENS = 3500;

    @Test
    void aClientThatStopsReadingHasItsResponseCut() throws Exception {
        long seed = new Random().nextLong();
        KvFormat f16 = KvFormat.parse("f16");
        try (TestServers m = TestServers.tiny(seed);
             SequencePool pool = m.backend.newSequencePool(CTX, f16, f16)) {
            Engine engine = new Engine(m.backend, pool, new EngineConfig(1, CTX, 32, 1, false));
            // an 8 KB send buffer: the server's writes block soon (Linux would otherwise buffer megabytes)
            KvantServer server = KvantServer.start(ServerConfig.local(0, "tiny")
                    .withWriteTimeout(Duration.ofMillis(500)), engine, TextCodec.of(m.model, null), 8192);
            try (Socket socket = new Socket()) {
                socket.setReceiveBufferSize(4096);   // before connecting: a small window, soon full
                socket.connect(new InetSocketAddress("127.0.0.1", server.port()));
                int freeBefore = engine.stats().freePages();
                TestServers.postCompletion(socket, MAX_TOKENS, true);
                // never read; wait for the server to give up on this client
                long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
                while (server.metrics().disconnects() == 0 && System.nanoTime() < deadline) {
                    Thread.sleep(5);
                }
                assertEquals(1, server.metrics().disconnects(), "seed " + seed + ": the response was not cut");
                EngineStats s = engine.stats();
                while ((s.running() > 0 || s.waiting() > 0) && System.nanoTime() < deadline) {
                    Thread.sleep(1);
                    s = engine.stats();
                }
                assertEquals(0, s.running() + s.waiting(), "seed " + seed + ": the generation still runs");
                assertEquals(freeBefore, s.freePages(), "seed " + seed + ": every page back");
                System.out.printf("cut after %d of %d tokens%n", s.generatedTokens(), MAX_TOKENS);
                assertTrue(s.generatedTokens() < MAX_TOKENS, "seed " + seed + ": " + s.generatedTokens()
                        + " tokens: the generation ran to its end for a client that read nothing");
            } finally {
                server.shutdown(Duration.ofSeconds(5));
                engine.close();
            }
        }
    }
}
