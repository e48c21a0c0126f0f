package dev.kvant.server;

import dev.kvant.backend.SequencePool;
import dev.kvant.engine.Engine;
import dev.kvant.engine.EngineConfig;
import dev.kvant.engine.EngineStats;
import dev.kvant.kv.KvFormat;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.net.Socket;
import java.time.Duration;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * A client that goes away while its tokens are still being generated has its generation cancelled and its pages
 * returned within a few heartbeats, streamed or not: a response held back until the end writes its heartbeat every
 * period even while tokens keep arriving (it used to write one only after a period with no token at all, so a
 * generation whose tokens came faster than that ran to its end for nobody).
 */
class DisconnectTest {
    private static final int CTX = 4096;
    private static final int MAX_TOKENS = 3000;

    @ParameterizedTest(name = "stream {0}")
    @ValueSource(booleans = {false, true})
    void aClientThatHangsUpStopsItsGeneration(boolean stream) throws Exception {
        long seed = new Random().nextLong();
        KvFormat f16 = KvFormat.parse("f16");
        try (TestServers m = TestServers.tiny(seed);
             SequencePool pool = m.backend.newSequencePool(CTX, f16, f16)) {
            Engine engine = new Engine(m.backend, pool, new EngineConfig(1, CTX, 32, 1, false));
            KvantServer server = KvantServer.start(ServerConfig.local(0, "tiny").withHeartbeat(Duration.ofMillis(20)),
                    engine, TextCodec.of(m.model, null));
            try {
                int freeBefore = engine.stats().freePages();
                try (Socket socket = new Socket("127.0.0.1", server.port())) {
                    TestServers.postCompletion(socket, MAX_TOKENS, stream);
                    long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
                    while (engine.stats().generatedTokens() < 50 && System.nanoTime() < deadline) {
                        Thread.sleep(1);
                    }
                }
                long atHangUp = engine.stats().generatedTokens();
                assertTrue(atHangUp < MAX_TOKENS / 2, "seed " + seed + ": the generation was nearly done ("
                        + atHangUp + " tokens) before the client hung up; the test needs a slower model");
                EngineStats s = engine.stats();
                long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
                while ((s.running() > 0 || s.waiting() > 0) && System.nanoTime() < deadline) {
                    Thread.sleep(1);
                    s = engine.stats();
                }
                assertEquals(0, s.running() + s.waiting(), "seed " + seed + ": the generation still runs");
                assertTrue(s.generatedTokens() < MAX_TOKENS, "seed " + seed + ": " + s.generatedTokens()
                        + " tokens: the generation ran to its end after the client had gone (hung up at "
                        + atHangUp + ")");
                assertEquals(freeBefore, s.freePages(), "seed " + seed + ": every page back");
                System.out.printf("stream %s: hung up at %d tokens, stopped at %d of %d%n", stream, atHangUp,
                        s.generatedTokens(), MAX_TOKENS);
            } finally {
                server.shutdown(Duration.ofSeconds(5));
                engine.close();
            }
        }
    }
}
