package dev.kvant.tokenizer;

import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** Streaming decode on byte tokens that cut characters apart (ids 0..255 of the synthetic BPE vocabulary are bytes). */
class StreamDecoderTest {

    private final Tokenizer tok = Tokenizer.create(SyntheticVocab.bpe("gpt-2"));

    private static List<String> feedAll(StreamDecoder d, int... ids) {
        List<String> out = new ArrayList<>();
        for (int id : ids) {
            out.add(d.feed(id));
        }
        return out;
    }

    @Test
    void multiByteCharacterIsHeldUntilItsLastByte() {
        StreamDecoder d = tok.streamDecoder();
        assertEquals(List.of("", "", "€"), feedAll(d, 0xE2, 0x82, 0xAC));
        assertEquals(List.of("", "", "", "😀"), feedAll(d, 0xF0, 0x9F, 0x98, 0x80));
        assertEquals(List.of("a", "", "é", "b"), feedAll(d, 'a', 0xC3, 0xA9, 'b'));
        assertEquals(0, d.pendingBytes());
        assertEquals("", d.flush());
    }

    @Test
    void bytesThatCanNeverFormACharacterComeOutAsReplacementAtOnce() {
        StreamDecoder d = tok.streamDecoder();
        assertEquals("\uFFFD", d.feed(0x82), "a lone continuation byte");
        assertEquals("", d.feed(0xE2));
        assertEquals("\uFFFDa", d.feed('a'), "a lead byte followed by ASCII");
        assertEquals("\uFFFD", d.feed(0xC0), "C0 is never a lead byte");
        assertEquals("", d.feed(0xED));
        String surrogate = d.feed(0xA0);
        assertTrue(surrogate.matches("\uFFFD+"), "ED A0 would start a surrogate: invalid at once, got " + surrogate);
        assertEquals(0, d.pendingBytes());
        assertEquals("", d.feed(0xF0));
        assertEquals("\uFFFD", d.flush(), "an unfinished character at the end");
    }

    @Test
    void streamedChunksConcatenateToTheDecodedTextAndNeverSplitACharacter() {
        long seed = System.nanoTime();
        Random r = new Random(seed);
        for (int round = 0; round < 200; round++) {
            String text = TokenizerCorpus.randomText(r, r.nextInt(40), false);
            int[] ids = tok.encode(text, false, false);
            StreamDecoder d = tok.streamDecoder();
            StringBuilder sb = new StringBuilder();
            for (int id : ids) {
                String chunk = d.feed(id);
                assertFalse(chunk.contains("\uFFFD"), "seed " + seed + ": chunk with U+FFFD for '" + text + "'");
                assertFalse(!chunk.isEmpty() && Character.isLowSurrogate(chunk.charAt(0)), "seed " + seed);
                sb.append(chunk);
            }
            sb.append(d.flush());
            assertEquals(text, sb.toString(), "seed " + seed);
        }
    }
}
