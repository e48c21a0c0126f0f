package dev.kvant.cli;

import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.SyntheticModel;
import picocli.CommandLine.Option;

import java.nio.file.Files;
import java.nio.file.Path;

/** Options shared by the commands that run a model. */
final class ModelOptions {

    @Option(names = {"-m", "--model"}, paramLabel = "GGUF", description = "model file (GGUF)")
    Path model;

    @Option(names = {"-t", "--threads"}, paramLabel = "N",
            description = "worker threads (default: available processors, ${DEFAULT-VALUE} if unset)")
    int threads = Runtime.getRuntime().availableProcessors();

    @Option(names = {"--ctk"}, paramLabel = "FORMAT", defaultValue = "f16",
            description = "KV cache format for keys: f16, bf16, q8_0, int8, q4_0, q4_0h, turbo4, turbo3, turbo2")
    String ctk;

    @Option(names = {"--ctv"}, paramLabel = "FORMAT", defaultValue = "f16",
            description = "KV cache format for values (same names as --ctk)")
    String ctv;

    @Option(names = {"--prefill-chunk"}, paramLabel = "N", defaultValue = "512",
            description = "prompt tokens per forward pass (default ${DEFAULT-VALUE})")
    int prefillChunk;

    KvFormat kFormat() {
        return KvFormat.parse(ctk);
    }

    KvFormat vFormat() {
        return KvFormat.parse(ctv);
    }

    LlamaModel load() {
        if (model == null) {
            throw new IllegalArgumentException("no model given: pass -m path/to/model.gguf");
        }
        if (!Files.isRegularFile(model)) {
            throw new IllegalArgumentException("model file not found: " + model);
        }
        return LlamaModel.load(model);
    }

    static LlamaModel synthetic(String shape, String weightType) {
        GgmlType type;
        try {
            type = GgmlType.valueOf(weightType.toUpperCase(java.util.Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("unknown weight type '" + weightType + "'");
        }
        return SyntheticModel.build(SyntheticModel.Shape.parse(shape), type, 42);
    }

    static void checkThreads(int threads) {
        if (threads < 1 || threads > 1024) {
            throw new IllegalArgumentException("--threads must be between 1 and 1024, got " + threads);
        }
    }
}
