package dev.kvant.cli;

import dev.kvant.gguf.GgufFile;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.nio.file.Path;

/** Summarizes a GGUF file. */
@Command(name = "info", mixinStandardHelpOptions = true, description = "Summarize a GGUF file: metadata and tensors.")
final class InfoCommand implements Runnable {

    @Option(names = {"-m", "--model"}, required = true, paramLabel = "GGUF", description = "model file (GGUF)")
    Path model;

    @Override
    public void run() {
        try (GgufFile f = GgufFile.open(model)) {
            System.out.println(f.describe());
        }
    }
}
