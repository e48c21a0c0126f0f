package dev.kvant.cli;

import org.junit.jupiter.api.Test;

import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

class ChatCommandTest {

    /** A message the context cannot hold is dropped with a note; the conversation goes on. */
    @Test
    void aMessageTheContextCannotHoldIsDroppedAndTheChatGoesOn() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        String input = "word ".repeat(400) + "\nhello\n/exit\n";
        InputStream old = System.in;
        try {
            System.setIn(new ByteArrayInputStream(input.getBytes(StandardCharsets.UTF_8)));
            MainTest.Run r = MainTest.run("chat", "-m", model.toString(), "-c", "128", "-n", "4", "-t", "2",
                    "--backend", "cpu");
            assertEquals(0, r.code(), r.err());
            assertTrue(r.err().contains("the message was dropped"), r.err());
            assertTrue(r.err().contains("generated"), "the next message was answered: " + r.err());
        } finally {
            System.setIn(old);
        }
    }

    /**
     * A conversation longer than the context drops its oldest exchanges (the system prompt stays) and goes on
     * answering; a reply the context cuts short says so.
     */
    @Test
    void aConversationLongerThanTheContextDropsItsOldestExchanges() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        String input = "hello there\nsecond message\nthird\nfourth one\n/exit\n";
        InputStream old = System.in;
        try {
            System.setIn(new ByteArrayInputStream(input.getBytes(StandardCharsets.UTF_8)));
            MainTest.Run r = MainTest.run("chat", "-m", model.toString(), "-c", "64", "-n", "100", "--temp", "0",
                    "--system", "be brief", "-t", "2", "--backend", "cpu");
            assertEquals(0, r.code(), r.err());
            assertTrue(r.err().contains("the reply was cut"), r.err());
            assertTrue(r.err().contains("oldest exchange"), r.err());
            assertTrue(!r.err().contains("the message was dropped"), "every message was answered: " + r.err());
            assertEquals(4, r.err().split("generated", -1).length - 1, "four replies: " + r.err());
        } finally {
            System.setIn(old);
        }
    }
}
