package dev.kvant.tokenizer;

import java.util.Arrays;

/** A growable run of token ids, so that encoding does not box every id. */
final class IdList {
    private int[] ids = new int[64];
    private int size;

    void add(int id) {
        if (size == ids.length) {
            ids = Arrays.copyOf(ids, ids.length * 2);
        }
        ids[size++] = id;
    }

    void addAll(int[] more) {
        if (size + more.length > ids.length) {
            ids = Arrays.copyOf(ids, Math.max(ids.length * 2, size + more.length));
        }
        System.arraycopy(more, 0, ids, size, more.length);
        size += more.length;
    }

    int size() {
        return size;
    }

    int[] toArray() {
        return Arrays.copyOf(ids, size);
    }
}
