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
    /**
     * Sends {@code POST /v1/completions} of a greedy, end-ignoring completion of "hello" by hand on socket (tests of
     * clients that hang up or stop reading), and does not read the answer.
     */
    static void postCompletion(java.net.Socket socket, int maxTokens, boolean stream) throws java.io.IOException {
        byte[] bytes = ("{\"prompt\": \"hello\", \"max_tokens\": " + maxTokens + ", \"ignore_eos\": true, "
                + "\"temperature\": 0, \"stream\": " + stream + "}").getBytes(java.nio.charset.StandardCharsets.UTF_8);
        java.io.OutputStream out = socket.getOutputStream();
        out.write(("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + "Content-Length: " + bytes.length + "\r\n\r\n").getBytes(java.nio.charset.StandardCharsets.US_ASCII));
        out.write(bytes);
        out.flush();
    }

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
