package dev.kvant.cli;

import java.io.IOException;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.List;

/** The commands' text inputs (-f and the like), read as UTF-8, with errors that say what is wrong with the file. */
final class TextFiles {
    private TextFiles() {
    }

    static String read(Path file) {
        try {
            return Files.readString(file, StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw unreadable(file, e);
        }
    }

    static List<String> lines(Path file) {
        try {
            return Files.readAllLines(file, StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw unreadable(file, e);
        }
    }

    private static IllegalArgumentException unreadable(Path file, IOException e) {
        String why = switch (e) {
            case NoSuchFileException x -> "no such file";
            case AccessDeniedException x -> "permission denied";
            case CharacterCodingException x -> "not UTF-8 text";
            default -> Files.isDirectory(file) ? "a directory, not a file" : e.getMessage();
        };
        return new IllegalArgumentException("cannot read " + file + ": " + why);
    }
}
