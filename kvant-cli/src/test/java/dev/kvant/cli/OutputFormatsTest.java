package dev.kvant.cli;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The output formats other tools parse (issue 2's CLI contract), each as the README gives it. */
class OutputFormatsTest {

    @Test
    void tokenizeJsonIsOneObjectOfTokenIds() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        MainTest.Run r = MainTest.run("tokenize", "-m", model.toString(), "-p", "def add(a, b):", "--json");
        assertEquals(0, r.code(), r.err());
        assertTrue(r.out().strip().matches("\\{\"tokens\":\\[\\d+(,\\d+)*]}"), r.out());
    }

    /** run: the text on stdout, and on stderr a last line with the prompt's and the generation's tokens/s. */
    @Test
    void runEndsWithItsRatesOnStderr() {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        MainTest.Run r = MainTest.run("run", "-m", model.toString(), "-p", "def add(a, b):", "-n", "8", "-t", "2",
                "--backend", "cpu", "--temp", "0");
        assertEquals(0, r.code(), r.err());
        List<String> lines = r.err().strip().lines().toList();
        assertTrue(lines.getLast().matches("prompt: \\d+ tokens, [\\d.]+ tokens/s \\| generation: 8 tokens,"
                + " [\\d.]+ tokens/s \\| cpu, 2 threads"), r.err());
        assertTrue(!r.out().isBlank(), "the generated text on stdout");
    }

    /** perplexity without --json ends in llama.cpp's line, with the JSON's perplexity. */
    @Test
    void perplexityEndsInLlamaCppsFinalEstimate(@TempDir Path dir) throws Exception {
        Path model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf");
        Path text = SparseCommandsTest.evalText(dir, 4000);
        String[] args = {"perplexity", "-m", model.toString(), "-f", text.toString(), "-c", "128", "--chunks", "2",
                "-t", "2", "--backend", "cpu"};
        MainTest.Run plain = MainTest.run(args);
        assertEquals(0, plain.code(), plain.err());
        Matcher m = Pattern.compile("Final estimate: PPL = ([0-9.]+) \\+/- [0-9.]+")
                .matcher(plain.out().strip().lines().toList().getLast());
        assertTrue(m.matches(), plain.out());
        String[] withJson = Arrays.copyOf(args, args.length + 1);
        withJson[args.length] = "--json";
        MainTest.Run json = MainTest.run(withJson);
        Matcher j = Pattern.compile("\\{\"ppl\":([0-9.]+),.*").matcher(json.out().strip());
        assertTrue(j.matches(), json.out());
        assertEquals(Double.parseDouble(j.group(1)), Double.parseDouble(m.group(1)), 1e-4);
    }

    /**
     * kv-eval --json without a model: the fields, and no bytes per token nor model-query error (null, not -1
     * or NaN).
     */
    @Test
    void kvEvalJsonWithoutAModel() {
        MainTest.Run r = MainTest.run("kv-eval", "--rows", "64", "--json");
        assertEquals(0, r.code(), r.err());
        String out = r.out().strip();
        assertTrue(out.startsWith("[") && out.endsWith("]"), out);
        for (String line : out.lines().filter(l -> l.contains("{")).toList()) {
            assertTrue(line.matches("\\s*\\{\"format\":\"[a-z0-9_]+\",\"bits_per_value\":[0-9.]+,"
                    + "\"bytes_per_token\":null,\"mse_rel\":[0-9.e+-]+,\"ip_err_rel\":[0-9.e+-]+,"
                    + "\"ip_err_rel_outlier_q\":[0-9.e+-]+,\"ip_err_rel_model_q\":null,\"source\":\"gaussian\","
                    + "\"tensor\":\"-\"},?"), line);
        }
        assertTrue(out.contains("\"format\":\"turbo3\""), out);
    }
    /**
     * kv-eval -m: the model's K rows carry the error of their logits under the model's own queries, its V rows none
     * (null); an f16 key's is its rounding alone, and turbo3's lies between q8_0's and turbo2's.
     */
    @Test
    void kvEvalWithAModelWeighsKeysByItsOwnQueries() {
        String model = SparseCommandsTest.tinycode("tinycode-q8_0.gguf").toString();
        String text = SparseCommandsTest.tinycode("eval-heldout.txt").toString();
        MainTest.Run r = MainTest.run("kv-eval", "-m", model, "-f", text, "--tokens", "96", "--rows", "16", "-t", "2",
                "--json");
        assertEquals(0, r.code(), r.err());
        java.util.Map<String, Double> k = new java.util.HashMap<>();
        Pattern row = Pattern.compile(".*\"format\":\"([a-z0-9_+]+)\".*\"ip_err_rel_model_q\":([^,]+),"
                + "\"source\":\"model\",\"tensor\":\"([kv])\".*");
        for (String line : r.out().lines().toList()) {
            Matcher m = row.matcher(line);
            if (!m.matches()) {
                continue;
            }
            if (m.group(3).equals("v")) {
                assertEquals("null", m.group(2), line);
            } else {
                k.put(m.group(1), Double.parseDouble(m.group(2)));
            }
        }
        assertTrue(k.get("f16") < 1e-3, k.toString());
        assertTrue(k.get("q8_0") < k.get("turbo3") && k.get("turbo3") < k.get("turbo2"), k.toString());
        assertTrue(k.get("turbo3+mean") < k.get("turbo3"), k.toString());
    }
}
