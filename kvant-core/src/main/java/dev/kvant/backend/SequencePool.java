package dev.kvant.backend;

/**
 * One pool of KV pages that many sequences of a backend draw from, as a server needs: the pages a conversation's
 * prefix fills can be shared by later sequences ({@link #fork}), and how many pages are used or free is known for the
 * whole pool. Sequences of a pool are closed before the pool; closing one returns its pages (its share of shared
 * ones). Page bookkeeping is thread-safe; each sequence is used by one thread at a time.
 */
public interface SequencePool extends AutoCloseable {

    /** Tokens per page: prefixes are shared in whole pages. */
    int pageTokens();

    int totalPages();

    int freePages();

    /**
     * A new empty sequence of this pool that holds at most capacity tokens. Its pages are taken as it grows; a
     * forward pass that finds too few free pages throws {@link dev.kvant.kv.KvCacheFullException} and changes
     * nothing.
     */
    BackendSequence newSequence(int capacity);

    /**
     * A new sequence holding the first prefixTokens tokens of parent, which belongs to this pool: the whole pages of
     * the prefix are shared (reference-counted), the page it ends inside is copied, so parent and child can both go
     * on writing without seeing each other.
     *
     * @throws dev.kvant.kv.KvCacheFullException when the page to copy cannot be had
     */
    BackendSequence fork(BackendSequence parent, int prefixTokens, int capacity);

    /**
     * Whether a sequence forked from any prefix gives the bits the same tokens give computed afresh, so that reusing
     * cached prefixes of any length keeps a request's output independent of the cache (false where K pages are
     * centered on their means: a page's mean comes from the write that opens it, and a cached prefix's pages were
     * opened by its own writes, decode steps among them; and on the GPU, whose rows depend on whether a prompt chunk's
     * products, chosen by the chunk's length, or a decode step's computed them). Where false, a fork at the end of a
     * prompt's whole chunks still gives those bits when the rest is read in the same chunks: the engine reuses such
     * prefixes ({@link dev.kvant.engine.Engine#prefixReuseStep}).
     */
    default boolean forksKeepBits() {
        return true;
    }

    /**
     * How many sequences hold the page ({@link BackendSequence#pageIds}): closing them all gives it back. -1 where
     * the backend does not say.
     */
    default int holders(int page) {
        return -1;
    }

    /** Frees the pages; every sequence of the pool is unusable afterwards. */
    @Override
    void close();
}
