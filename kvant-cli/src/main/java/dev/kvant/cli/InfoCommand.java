package dev.kvant.cli;

import dev.kvant.gguf.GgufFile;
import dev.kvant.gguf.GgufTensorInfo;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.Arrays;
import java.util.Locale;
import java.util.stream.Collectors;

/** Summarizes a GGUF file: its header, every metadata key, and its tensors by type (or one by one). */
@Command(name = "info", mixinStandardHelpOptions = true, description = {"Summarize a GGUF file: metadata and tensors.",
        "The header, every metadata key and value (long strings cut, arrays by their first items), and the tensors by",
        "type (--tensors: each one)."})
final class InfoCommand implements Runnable {
    /** Characters of a string value shown before it is cut (a chat template runs to thousands). */
    private static final int SHOWN_CHARS = 160;

    @Option(names = {"-m", "--model"}, required = true, paramLabel = "GGUF", description = "model file (GGUF)")
    Path model;

    @Option(names = "--tensors", description = "also list every tensor: name, type, shape, bytes")
    boolean tensors;

    @Override
    public void run() {
        try (GgufFile f = GgufFile.open(model)) {
            System.out.println(f.describe());
            System.out.println("metadata:");
            for (String key : f.metadata().keys()) {
                String v = f.metadata().get(key).map(Object::toString).orElse("");
                if (v.length() > SHOWN_CHARS) {
                    v = v.substring(0, SHOWN_CHARS) + "... (" + v.length() + " characters)";
                }
                System.out.println("  " + key + " = " + v.replace("\n", "\\n"));
            }
            if (tensors) {
                System.out.println("tensors:");
                for (GgufTensorInfo t : f.tensors()) {
                    String shape = Arrays.stream(t.shape()).mapToObj(Long::toString).collect(Collectors.joining(" x "));
                    System.out.println(String.format(Locale.ROOT, "  %-40s %-6s %-20s %,14d bytes", t.name(), t.type(),
                            shape, t.byteSize()));
                }
            }
        }
    }
}
