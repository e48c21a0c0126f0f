package dev.kvant.server;

import dev.kvant.backend.CpuBackend;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.TinyModels;
import dev.kvant.tensor.Parallel;

import java.lang.foreign.Arena;
import java.nio.file.Path;

/** Models for the server tests: the small random model of the core tests (no fixture needed), or tinycode. */
final class TestServers implements AutoCloseable {
    final Arena arena = Arena.ofShared();
    final Parallel threads = new Parallel(2);
    final LlamaModel model;
    final CpuBackend backend;

    private TestServers(java.util.function.Function<Arena, LlamaModel> model) {
        this.model = model.apply(arena);
        this.backend = new CpuBackend(this.model, threads);
    }

    /** The random two-layer llama of the core tests: 300 ids, no tokenizer (text goes byte by byte). */
    static TestServers tiny(long seed) {
        return new TestServers(a -> LlamaModel.fromGguf(TinyModels.build("llama", GgmlType.F16, seed, a).file()));
    }

    static TestServers load(Path gguf) {
        return new TestServers(a -> LlamaModel.load(gguf));
    }

    ServeBench.Setup setup(int contextLength, int prefillChunk) {
        KvFormat f16 = KvFormat.parse("f16");
        return new ServeBench.Setup(backend, TextCodec.of(model, null), f16, f16, contextLength, prefillChunk,
                "test-model");
    }

    @Override
    public void close() {
        model.close();
        threads.close();
        arena.close();
    }
}
