package dev.kvant.engine;

import dev.kvant.backend.BackendSequence;
import dev.kvant.backend.SequencePool;

import java.util.ArrayList;
import java.util.List;

/**
 * Sequences kept after their request ended, with the tokens they hold, so that a later prompt that starts with the
 * same tokens (the next turn of a conversation, a shared system prompt) forks their pages instead of computing them.
 * A match is cut to a multiple of the engine's reuse step (whole prompt chunks where only they keep the bits of a
 * fresh computation: see {@link Engine}).
 * The pages are reference-counted by the pool: an entry that shares pages with running sequences or other entries
 * frees only the pages it alone holds when it is evicted (a page shared between entries goes with the last). Entries are evicted least recently used first, when pages
 * are needed or there are more than maxEntries.
 *
 * <p>Used by the engine's thread only; the counters may be read from any thread.
 */
final class PrefixCache {

    /** Matches shorter than this are not worth a fork (which copies the page the prefix ends in). */
    static final int MIN_MATCH = 16;

    /** One kept sequence: tokens[i] is the token at position i of seq; seq.length() == tokens.length. */
    static final class Entry {
        final int[] tokens;
        final BackendSequence seq;
        long lastUse;

        Entry(int[] tokens, BackendSequence seq, long lastUse) {
            this.tokens = tokens;
            this.seq = seq;
            this.lastUse = lastUse;
        }
    }

    /** The entry to fork and how many of its tokens the prompt shares; entry is null when none is worth it. */
    record Match(Entry entry, int tokens) {
    }

    private final int maxEntries;
    private final List<Entry> entries = new ArrayList<>();
    /** pagesExcept's count of each page's holders among the entries; all 0 between calls. */
    private int[] held = new int[0];
    private long clock;
    private volatile int size;

    PrefixCache(int maxEntries) {
        this.maxEntries = maxEntries;
    }

    /**
     * The entry sharing the longest prefix with prompt, at most prompt.length - 1 tokens (the last prompt token is
     * always computed, since its logits give the first generated token), cut to a multiple of step.
     */
    Match match(int[] prompt, int step) {
        Entry best = null;
        int bestLen = 0;
        for (Entry e : entries) {
            int n = commonPrefix(e.tokens, prompt, Math.min(e.tokens.length, prompt.length - 1)) / step * step;
            if (n > bestLen) {
                best = e;
                bestLen = n;
            }
        }
        if (best == null || bestLen < MIN_MATCH) {
            return new Match(null, 0);
        }
        best.lastUse = ++clock;
        return new Match(best, bestLen);
    }

    /**
     * Keeps seq, which holds tokens; takes ownership of it (closes it when it is redundant or evicted). Entries whose
     * tokens are a prefix of these are dropped, since this one serves every prompt they serve.
     */
    void insert(int[] tokens, BackendSequence seq) {
        if (tokens.length != seq.length()) {
            seq.close();
            throw new IllegalStateException("a prefix entry of " + tokens.length + " tokens for a sequence of "
                    + seq.length());
        }
        for (Entry e : entries) {
            if (e.tokens.length >= tokens.length && commonPrefix(e.tokens, tokens, tokens.length) == tokens.length) {
                e.lastUse = ++clock;
                seq.close();
                return;
            }
        }
        entries.removeIf(e -> {
            boolean covered = commonPrefix(e.tokens, tokens, e.tokens.length) == e.tokens.length;
            if (covered) {
                e.seq.close();
            }
            return covered;
        });
        entries.add(new Entry(tokens, seq, ++clock));
        while (entries.size() > maxEntries) {
            evictLeastRecent(null);
        }
        size = entries.size();
    }

    /**
     * What evicting every entry but keep would free: the pages whose every holder is one of those entries (a page an
     * entry shares with a running sequence — the prompt pages kept while it runs — stays until that one goes; one
     * shared only between entries goes with the last of them). Where the backend does not say (no page ids, or no
     * holder counts), an entry's pages are counted as if none were shared.
     */
    int pagesExcept(Entry keep, SequencePool pool) {
        if (held.length < pool.totalPages()) {
            held = new int[pool.totalPages()];
        }
        long n = 0;
        List<int[]> lists = new ArrayList<>();
        try {
            for (Entry e : entries) {
                if (e != keep) {
                    int[] ids = e.seq.pageIds();
                    if (ids == null) {
                        n += (e.seq.length() + pool.pageTokens() - 1) / pool.pageTokens();
                        continue;
                    }
                    lists.add(ids);
                    for (int id : ids) {
                        held[id]++;
                    }
                }
            }
            for (int[] ids : lists) {   // each page once
                for (int id : ids) {
                    if (held[id] > 0) {
                        int holders = pool.holders(id);
                        if (holders < 0 || holders == held[id]) {
                            n++;
                        }
                        held[id] = 0;
                    }
                }
            }
        } finally {   // every count back to 0 for the next call, whatever happened
            for (int[] ids : lists) {
                for (int id : ids) {
                    held[id] = 0;
                }
            }
        }
        return (int) Math.min(n, Integer.MAX_VALUE);
    }

    /** Closes the least recently used entry other than keep; false when there is none. */
    boolean evictLeastRecent(Entry keep) {
        Entry lru = null;
        for (Entry e : entries) {
            if (e != keep && (lru == null || e.lastUse < lru.lastUse)) {
                lru = e;
            }
        }
        if (lru == null) {
            return false;
        }
        entries.remove(lru);
        lru.seq.close();
        size = entries.size();
        return true;
    }

    void remove(Entry e) {
        if (entries.remove(e)) {
            e.seq.close();
        }
        size = entries.size();
    }

    void clear() {
        for (Entry e : entries) {
            e.seq.close();
        }
        entries.clear();
        size = 0;
    }

    int size() {
        return size;
    }

    static int commonPrefix(int[] a, int[] b, int limit) {
        int n = Math.min(limit, Math.min(a.length, b.length));
        int i = 0;
        while (i < n && a[i] == b[i]) {
            i++;
        }
        return i;
    }
}
