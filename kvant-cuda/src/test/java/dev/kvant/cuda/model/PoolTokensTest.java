package dev.kvant.cuda.model;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/** How many tokens a session's KV pool holds on the device: a --kv-mem budget caps it, it never sizes it. */
class PoolTokensTest {

    @Test
    void aBudgetCapsThePoolAndNeverGrowsItPastTheContexts() {
        int page = CudaBackend.PAGE_TOKENS;
        assertEquals(2048, CudaBackend.poolTokens(0, 2048, 1), "no budget: one context");
        assertEquals(2 * 2048, CudaBackend.poolTokens(0, 2000, 2), "each context a whole number of pages");
        assertEquals(2048, CudaBackend.poolTokens(1_000_000, 2048, 1),
                "a budget of a million tokens for one 2,048-token sequence took a million");
        assertEquals(1000, CudaBackend.poolTokens(1000, 2048, 1), "a budget below the context is the pool");
        assertEquals(page, CudaBackend.poolTokens(0, 1, 1));
    }
}
