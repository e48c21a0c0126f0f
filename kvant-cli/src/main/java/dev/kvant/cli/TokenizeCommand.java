package dev.kvant.cli;

import dev.kvant.gguf.GgufFile;
import dev.kvant.tokenizer.Tokenizer;
import dev.kvant.tokenizer.TokenizerSpec;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.io.PrintStream;
import java.nio.file.Path;

/** Prints the token ids of a text. */
@Command(name = "tokenize", mixinStandardHelpOptions = true, description = "Print the token ids of a prompt or file.")
final class TokenizeCommand implements Runnable {

    @Option(names = {"-m", "--model"}, required = true, paramLabel = "GGUF", description = "model file (GGUF)")
    Path model;

    @Option(names = {"-p", "--prompt"}, description = "the text")
    String prompt;

    @Option(names = {"-f", "--file"}, paramLabel = "FILE", description = "read the text from a file (UTF-8)")
    Path file;

    @Option(names = "--no-bos", description = "do not add BOS even when the vocabulary adds it")
    boolean noBos;

    @Option(names = "--special", description = "parse special-token text in the input")
    boolean special;

    @Option(names = "--json", description = "print {\"tokens\":[...]}")
    boolean json;

    @Override
    public void run() {
        if ((prompt == null) == (file == null)) {
            throw new UsageException("give exactly one of -p and -f");
        }
        String text = prompt != null ? prompt : TextFiles.read(file);
        int[] ids;
        try (GgufFile f = GgufFile.open(model)) {
            Tokenizer tok = Tokenizer.create(TokenizerSpec.fromGguf(f.metadata()));
            ids = tok.encode(text, !noBos, special);
        }
        PrintStream out = System.out;   // digits and punctuation only; one write for the lot
        StringBuilder sb = new StringBuilder(ids.length * 6);
        sb.append(json ? "{\"tokens\":[" : "[");
        for (int i = 0; i < ids.length; i++) {
            if (i > 0) {
                sb.append(json ? "," : ", ");
            }
            sb.append(ids[i]);
        }
        sb.append(json ? "]}" : "]");
        out.println(sb);
        out.flush();
    }
}
