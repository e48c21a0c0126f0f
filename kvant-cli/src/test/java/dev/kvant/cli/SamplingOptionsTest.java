package dev.kvant.cli;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.sample.SamplerConfig;
import org.junit.jupiter.api.Test;
import picocli.CommandLine;

class SamplingOptionsTest {

    private static SamplerConfig config(int ctx, String... args) {
        return CommandLine.populateCommand(new SamplingOptions(), args).config(ctx);
    }

    @Test
    void llamaCppSettingsThatMeanGreedyOrTheWholeContextAreTakenAsSuch() {
        assertTrue(config(4096, "--temp", "-1", "-s", "1").isGreedy(), "a negative temperature is greedy");
        assertTrue(config(4096, "--top-p", "0", "-s", "1").isGreedy(), "top-p 0 is greedy, as the server reads it");
        assertEquals(4096, config(4096, "--repeat-last-n", "-1", "-s", "1").repeatLastN());
        // a window longer than the context is the context (it used to size the sampler's ring: 8 GB here)
        assertEquals(4096, config(4096, "--repeat-last-n", "2000000000", "-s", "1").repeatLastN());
        assertEquals(64, config(4096, "-s", "1").repeatLastN());
        assertEquals(0.8f, config(4096, "-s", "1").temperature());
        IllegalArgumentException window = assertThrows(IllegalArgumentException.class,
                () -> config(4096, "--repeat-last-n", "-2", "-s", "1"));
        assertTrue(window.getMessage().contains("-1 (the whole context) or at least 0"), window.getMessage());
        // values out of range are refused even where greedy decoding would not use them
        assertThrows(IllegalArgumentException.class, () -> config(4096, "--temp", "0", "--top-p", "5", "-s", "1"));
        assertThrows(IllegalArgumentException.class, () -> config(4096, "--temp", "0", "--top-p", "-3", "-s", "1"));
        assertThrows(IllegalArgumentException.class, () -> config(4096, "--temp", "0", "--top-p", "NaN", "-s", "1"));
        assertThrows(IllegalArgumentException.class, () -> config(4096, "--temp", "NaN", "--top-p", "0", "-s", "1"));
    }

    @Test
    void aValueOutOfRangeIsNamedByItsOption() {
        String[][] cases = {{"--top-k", "-1"}, {"--min-p", "2"}, {"--repeat-penalty", "0"},
                {"--frequency-penalty", "Infinity"}, {"--presence-penalty", "-Infinity"}};
        for (String[] c : cases) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> config(4096, c[0], c[1], "-s", "1"));
            assertTrue(e.getMessage().startsWith(c[0] + " must be"), e.getMessage());
        }
    }
}
