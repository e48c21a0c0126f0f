package dev.kvant.cuda;

import java.util.ArrayList;
import java.util.List;

/** Device resources made one after another and closed together, last first. */
public final class Owned implements AutoCloseable {
    private final List<AutoCloseable> resources = new ArrayList<>();

    public <T extends AutoCloseable> T add(T resource) {
        resources.add(resource);
        return resource;
    }

    @Override
    public void close() {
        for (int i = resources.size() - 1; i >= 0; i--) {
            try {
                resources.get(i).close();
            } catch (Exception ignored) {
                // device memory of a context being torn down: nothing left to do with it
            }
        }
        resources.clear();
    }
}
