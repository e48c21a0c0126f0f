package dev.kvant.cli;

/**
 * A command line that asks for something impossible or contradictory (an option out of range, options that do not
 * go together): reported as one line and exit status 2, picocli's status for usage errors, as its own parse errors
 * are — where errors met while running (a file that cannot be read, a model that does not load, a device that is
 * missing) exit with 1.
 */
final class UsageException extends IllegalArgumentException {
    UsageException(String message) {
        super(message);
    }

    /** An option's value as the core parses it, its refusal (an unknown format, a size out of range) a usage error. */
    static <T> T parsing(java.util.function.Supplier<T> parse) {
        try {
            return parse.get();
        } catch (UsageException e) {
            throw e;
        } catch (IllegalArgumentException e) {
            throw new UsageException(e.getMessage());
        }
    }
}
