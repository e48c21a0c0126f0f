package dev.kvant.tokenizer;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * Just enough GGUF (v3, little-endian) to read a model's tokenizer keys in tests, until the real reader lands: the
 * header's key/value section, with arrays of strings, ints and floats. Tensor data is never touched.
 */
final class TestGgufVocab {

    static final String FIXTURE_DIR = "shared/fixtures/tinycode";

    private TestGgufVocab() {
    }

    /**
     * A file of the tinycode fixture, found by walking up from the working directory; the test is skipped with a
     * message when the fixture is absent (a clone without the shared folder).
     */
    static Path fixture(String name) {
        for (Path dir = Path.of("").toAbsolutePath(); dir != null; dir = dir.getParent()) {
            Path candidate = dir.resolve(FIXTURE_DIR).resolve(name);
            if (Files.isRegularFile(candidate)) {
                return candidate;
            }
        }
        assumeTrue(false, "fixture " + FIXTURE_DIR + "/" + name + " not found above " + Path.of("").toAbsolutePath()
                + "; skipping the tests that need the tinycode model");
        throw new AssertionError("unreachable");
    }

    /** All key/value pairs of a GGUF header: strings, boxed numbers, booleans, and lists for arrays. */
    static Map<String, Object> readMetadata(Path file) throws IOException {
        try (FileChannel ch = FileChannel.open(file, StandardOpenOption.READ)) {
            ByteBuffer buf = ch.map(FileChannel.MapMode.READ_ONLY, 0, ch.size()).order(ByteOrder.LITTLE_ENDIAN);
            int magic = buf.getInt();
            if (magic != 0x46554747) { // "GGUF" little-endian
                throw new IOException(file + ": not a GGUF file (magic " + Integer.toHexString(magic) + ")");
            }
            int version = buf.getInt();
            if (version != 3) {
                throw new IOException(file + ": GGUF version " + version + ", this test reader knows 3");
            }
            buf.getLong(); // tensor count
            long kvCount = buf.getLong();
            Map<String, Object> kv = new HashMap<>();
            for (long i = 0; i < kvCount; i++) {
                String key = string(buf);
                kv.put(key, value(buf, buf.getInt()));
            }
            return kv;
        }
    }

    private static String string(ByteBuffer buf) {
        int n = Math.toIntExact(buf.getLong());
        byte[] b = new byte[n];
        buf.get(b);
        return new String(b, StandardCharsets.UTF_8);
    }

    private static Object value(ByteBuffer buf, int type) throws IOException {
        return switch (type) {
            case 0 -> buf.get() & 0xFF;
            case 1 -> (int) buf.get();
            case 2 -> buf.getShort() & 0xFFFF;
            case 3 -> (int) buf.getShort();
            case 4 -> Integer.toUnsignedLong(buf.getInt());
            case 5 -> buf.getInt();
            case 6 -> buf.getFloat();
            case 7 -> buf.get() != 0;
            case 8 -> string(buf);
            case 9 -> {
                int elemType = buf.getInt();
                int n = Math.toIntExact(buf.getLong());
                List<Object> list = new ArrayList<>(n);
                for (int i = 0; i < n; i++) {
                    list.add(value(buf, elemType));
                }
                yield list;
            }
            case 10, 11 -> buf.getLong();
            case 12 -> buf.getDouble();
            default -> throw new IOException("unknown GGUF value type " + type);
        };
    }

    /** The tokenizer spec of a GGUF file, with llama.cpp's defaults for absent keys. */
    static TokenizerSpec spec(Path file) throws IOException {
        Map<String, Object> kv = readMetadata(file);
        String model = (String) kv.get("tokenizer.ggml.model");
        List<String> tokens = strings(kv.get("tokenizer.ggml.tokens"));
        float[] scores = null;
        if (kv.get("tokenizer.ggml.scores") instanceof List<?> l) {
            scores = new float[l.size()];
            for (int i = 0; i < scores.length; i++) {
                scores[i] = ((Number) l.get(i)).floatValue();
            }
        }
        int[] types = null;
        if (kv.get("tokenizer.ggml.token_type") instanceof List<?> l) {
            types = l.stream().mapToInt(o -> ((Number) o).intValue()).toArray();
        }
        boolean llama = "llama".equals(model);
        return new TokenizerSpec(model, (String) kv.get("tokenizer.ggml.pre"), tokens, scores, types,
                kv.containsKey("tokenizer.ggml.merges") ? strings(kv.get("tokenizer.ggml.merges")) : null,
                id(kv, "tokenizer.ggml.bos_token_id", llama ? 1 : -1),
                id(kv, "tokenizer.ggml.eos_token_id", llama ? 2 : -1),
                id(kv, "tokenizer.ggml.eot_token_id", -1),
                id(kv, "tokenizer.ggml.unknown_token_id", llama ? 0 : -1),
                id(kv, "tokenizer.ggml.padding_token_id", -1),
                (Boolean) kv.getOrDefault("tokenizer.ggml.add_bos_token", llama),
                (Boolean) kv.getOrDefault("tokenizer.ggml.add_eos_token", false),
                (Boolean) kv.getOrDefault("tokenizer.ggml.add_space_prefix", llama),
                (String) kv.get("tokenizer.chat_template"));
    }

    private static int id(Map<String, Object> kv, String key, int absent) {
        Object v = kv.get(key);
        return v == null ? absent : ((Number) v).intValue();
    }

    private static List<String> strings(Object list) {
        List<String> out = new ArrayList<>();
        for (Object o : (List<?>) list) {
            out.add((String) o);
        }
        return out;
    }
}
