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
}
