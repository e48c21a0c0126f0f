package dev.kvant.cli;

import picocli.CommandLine;
import picocli.CommandLine.Command;

/** The {@code kvant} command. */
@Command(name = "kvant", mixinStandardHelpOptions = true, versionProvider = Main.Version.class,
        description = "LLM inference on GGUF models with a compressed KV cache.",
        subcommands = {RunCommand.class, ChatCommand.class, TokenizeCommand.class, PerplexityCommand.class,
                BenchCommand.class, KvEvalCommand.class, KvPlanCommand.class, ParityCommand.class,
                AttentionBenchCommand.class, InfoCommand.class, ServeCommand.class, ServeBenchCommand.class,
                NeedleCommand.class, CommandLine.HelpCommand.class})
public final class Main implements Runnable {

    @CommandLine.Spec
    CommandLine.Model.CommandSpec spec;

    /** Helidon's loggers, kept referenced so that the level set on them holds (JUL keeps loggers weakly). */
    private static final java.util.logging.Logger HELIDON = java.util.logging.Logger.getLogger("io.helidon");

    public static void main(String[] args) {
        // a log record (a tokenizer's warning, say) as one line on stderr, as kvant's own messages, not JUL's two with
        // a timestamp; the web server's INFO lines (its start and routing) left out: kvant serve prints its own
        if (System.getProperty("java.util.logging.SimpleFormatter.format") == null) {
            System.setProperty("java.util.logging.SimpleFormatter.format", "kvant: %4$s: %5$s%6$s%n");
        }
        HELIDON.setLevel(java.util.logging.Level.WARNING);
        System.exit(execute(args));
    }

    /** Runs the command line and returns the exit code (tests call this). */
    public static int execute(String... args) {
        CommandLine cl = new CommandLine(new Main());
        // every command takes -V (mixinStandardHelpOptions), and prints nothing without a provider of its own
        for (CommandLine sub : cl.getSubcommands().values()) {
            sub.getCommandSpec().versionProvider(new Version());
        }
        // an option picocli cannot read: the same one line as kvant's own usage errors (and exit 2), then where the
        // options are listed, and picocli's suggestions for a mistyped name
        cl.setParameterExceptionHandler((e, given) -> {
            CommandLine cmd = e.getCommandLine();
            Progress.clearShown();
            cmd.getErr().println("kvant: " + e.getMessage() + " (" + cmd.getCommandSpec().qualifiedName()
                    + " --help lists the options)");
            CommandLine.UnmatchedArgumentException.printSuggestions(e, cmd.getErr());
            return cmd.getCommandSpec().exitCodeOnInvalidInput();
        });
        cl.setExecutionExceptionHandler((e, cmd, parsed) -> {
            Progress.clearShown();   // the message on a line of its own, not after "tokenizing x.txt"
            cmd.getErr().println("kvant: " + (e.getMessage() != null ? e.getMessage() : e.toString()));
            if (System.getenv("KVANT_DEBUG") != null) {
                e.printStackTrace(cmd.getErr());
            }
            return e instanceof UsageException ? CommandLine.ExitCode.USAGE : 1;
        });
        try {
            return cl.execute(args);
        } catch (OutOfMemoryError e) {   // picocli hands on Errors; this one has a remedy to name
            cl.getErr().println("kvant: out of Java heap memory (" + e.getMessage() + "): give the JVM more, e.g. "
                    + "KVANT_JAVA_OPTS=-Xmx16g, or ask for less (a smaller -c or --kv-mem)");
            return 1;
        }
    }

    @Override
    public void run() {
        spec.commandLine().usage(System.out);
    }

    static final class Version implements CommandLine.IVersionProvider {
        @Override
        public String[] getVersion() {
            String v = Main.class.getPackage().getImplementationVersion();
            return new String[] {"kvant " + (v != null ? v : "dev")};
        }
    }
}
