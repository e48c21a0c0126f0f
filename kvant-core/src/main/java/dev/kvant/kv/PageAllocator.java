package dev.kvant.kv;

/**
 * Reference-counted page ids 0..total-1, handed out from a free stack (lowest ids first on a fresh pool). A page
 * is free exactly when its count is 0; a count above 1 means sequences share it (a forked prefix) and a write to
 * it must copy it first. Not thread-safe: {@link KvCache} calls it under its lock.
 */
final class PageAllocator {
    private final int[] refs;
    private final int[] free;
    private int freeCount;

    PageAllocator(int pages) {
        refs = new int[pages];
        free = new int[pages];
        for (int i = 0; i < pages; i++) {
            free[i] = pages - 1 - i;
        }
        freeCount = pages;
    }

    /** A free page with count 1, or -1 when none is free. */
    int allocate() {
        if (freeCount == 0) {
            return -1;
        }
        int page = free[--freeCount];
        refs[page] = 1;
        return page;
    }

    void retain(int page) {
        if (refs[page] <= 0) {
            throw new IllegalStateException("page " + page + " is free and cannot be shared");
        }
        refs[page]++;
    }

    void release(int page) {
        if (refs[page] <= 0) {
            throw new IllegalStateException("page " + page + " released more often than it was taken");
        }
        if (--refs[page] == 0) {
            free[freeCount++] = page;
        }
    }

    int refCount(int page) {
        return refs[page];
    }

    int free() {
        return freeCount;
    }

    int total() {
        return refs.length;
    }
}
