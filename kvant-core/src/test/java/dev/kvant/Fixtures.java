package dev.kvant;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.stream.Stream;

/**
 * Finds the shared test fixtures ({@code shared/fixtures/...}), which live beside the repository rather than in it.
 * Tests run with the module directory as working directory, and the repository may be a worktree nested anywhere,
 * so the search walks up from the working directory and looks in every {@code shared/fixtures} it meets.
 * {@code -Dkvant.fixtures=DIR} or {@code KVANT_FIXTURES=DIR} point at the fixtures directory explicitly.
 */
public final class Fixtures {
    private Fixtures() {
    }

    /** The file {@code fileName} of the tinycode model fixture, if present. */
    public static Optional<Path> tinycode(String fileName) {
        return roots().map(r -> r.resolve("tinycode").resolve(fileName)).filter(Files::isRegularFile).findFirst();
    }

    /** As {@link #tinycode}, but skips the calling test (with a message saying where it looked) when absent. */
    public static Path requireTinycode(String fileName) {
        Optional<Path> p = tinycode(fileName);
        assumeTrue(p.isPresent(), () -> "tinycode fixture " + fileName + " not found (expected"
                + " ../shared/fixtures/tinycode beside the repo, searched upward from "
                + Path.of("").toAbsolutePath() + "; or set -Dkvant.fixtures / KVANT_FIXTURES)");
        return p.get();
    }

    /** Candidate {@code shared/fixtures} directories, nearest first. */
    private static Stream<Path> roots() {
        String explicit = System.getProperty("kvant.fixtures", System.getenv("KVANT_FIXTURES"));
        if (explicit != null && !explicit.isBlank()) {
            return Stream.of(Path.of(explicit));
        }
        List<Path> found = new ArrayList<>();
        for (Path dir = Path.of("").toAbsolutePath(); dir != null; dir = dir.getParent()) {
            Path candidate = dir.resolve("shared").resolve("fixtures");
            if (Files.isDirectory(candidate)) {
                found.add(candidate);
            }
        }
        return found.stream();
    }
}
