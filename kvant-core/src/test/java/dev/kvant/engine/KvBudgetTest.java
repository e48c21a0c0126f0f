package dev.kvant.engine;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.kvant.kv.KvFormat;
import dev.kvant.model.ModelConfig;
import dev.kvant.model.SyntheticModel;
import dev.kvant.select.SelectionConfig;
import org.junit.jupiter.api.Test;

/** What a KV memory budget (--kv-mem) holds, with and without the key summaries of a selection. */
class KvBudgetTest {
    private static final ModelConfig LLAMA3_8B = SyntheticModel.Shape.parse("llama3-8b").config();
    private static final KvFormat TURBO3 = KvFormat.parse("turbo3");

    @Test
    void summariesTakeTheirShareOfTheBudget() {
        // llama3-8b, turbo3: K+V 2 x 8 heads x 50 bytes (norm + 48 code bytes) = 800 bytes per token and layer
        assertEquals(32L * 800, Session.kvBytesPerToken(LLAMA3_8B, TURBO3, TURBO3));
        SelectionConfig oneRound = SelectionConfig.topK(2048);
        // 8 heads x (min, max) x 128 floats per 16 tokens: 512 bytes per token and layer
        assertEquals(32L * 512, Session.summaryBytesPerToken(LLAMA3_8B, TURBO3, oneRound));
        // a coarse level adds one pair per 64-token page: 128 bytes per token and layer
        assertEquals(32L * 640, Session.summaryBytesPerToken(LLAMA3_8B, TURBO3, oneRound.withCoarse(256)));
        assertEquals(0, Session.summaryBytesPerToken(LLAMA3_8B, TURBO3, null));
        long budget = 8L << 30;
        int dense = Session.contextForBudget(LLAMA3_8B, TURBO3, TURBO3, budget);
        int selected = Session.contextForBudget(LLAMA3_8B, dev.kvant.kv.KvLayerFormats.of(TURBO3, TURBO3), oneRound, budget);
        assertTrue(selected < dense, selected + " vs " + dense);
        assertTrue((long) selected * 32 * (800 + 512) <= budget, "the summaries fit in the budget too");
        assertEquals(0, selected % Session.PAGE_TOKENS);
    }

    @Test
    void coarseLevelsOutsideTheirRangeAreRefused() {
        assertThrows(IllegalArgumentException.class, () -> new SelectionConfig(2048, 16, 64, 256, 2, 16, 4));
        assertThrows(IllegalArgumentException.class, () -> new SelectionConfig(2048, 16, 64, 256, 2, 8192, 4));
        assertThrows(IllegalArgumentException.class, () -> new SelectionConfig(2048, 16, 64, 256, 2, 256, 0));
        assertThrows(IllegalArgumentException.class, () -> new SelectionConfig(2048, 16, 64, 256, 2, 256, 1 << 17));
        assertThrows(IllegalArgumentException.class, () -> new SelectionConfig(2048, 16, 64, 256, 2, 0, 4));
        assertEquals(32, SelectionConfig.topK(2048).withCoarse(256).coarseKeep());
        assertEquals(64, SelectionConfig.topK(4096).withCoarse(256).coarseKeep());
    }
}
