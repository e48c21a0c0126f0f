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

    /**
     * Closes what a constructor made before failure stopped it; a failure while closing rides along the first one
     * (suppressed), which is the one to report.
     */
    public static void closeAfter(Throwable failure, AutoCloseable resource) {
        try {
            resource.close();
        } catch (Exception | Error e) {
            failure.addSuppressed(e);
        }
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
