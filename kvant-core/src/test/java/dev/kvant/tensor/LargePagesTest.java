package dev.kvant.tensor;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import org.junit.jupiter.api.Test;

class LargePagesTest {

    /** Sizes below, at and above a huge page: the segment has exactly the size asked, aligned, all of it usable. */
    @Test
    void buffersHaveTheirSizeAndEveryByteHoldsWhatIsWritten() {
        for (long bytes : new long[] {1000, 2L << 20, (5L << 20) + 3}) {
            MemorySegment s = LargePages.allocate(bytes);
            assertEquals(bytes, s.byteSize(), "size of a " + bytes + "-byte buffer");
            assertEquals(0, s.address() % 64, "alignment of a " + bytes + "-byte buffer");
            for (long i = 0; i < bytes; i++) {
                s.set(ValueLayout.JAVA_BYTE, i, (byte) (i * 31 + 7));
            }
            for (long i = 0; i < bytes; i++) {
                assertEquals((byte) (i * 31 + 7), s.get(ValueLayout.JAVA_BYTE, i), "byte " + i + " of " + bytes);
            }
        }
    }
}
