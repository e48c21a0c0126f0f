package dev.kvant.cli;

import dev.kvant.model.LlamaModel;
import dev.kvant.model.ModelConfig;
import dev.kvant.select.SelectionConfig;
import dev.kvant.select.SelectionLog;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.Locale;

/** Sparse attention options ({@code --select ...}) of the commands that run a model. */
final class SelectOptions {

    @Option(names = "--select", paramLabel = "NAME", defaultValue = "dense",
            description = "attention selection: dense (every position) or topk (query-aware blocks; default ${DEFAULT-VALUE})")
    String select;

    @Option(names = "--select-budget", paramLabel = "TOKENS", defaultValue = "" + SelectionConfig.DEFAULT_BUDGET,
            description = "tokens attended per query block and kv head, sink and recent included (default ${DEFAULT-VALUE})")
    int budget;

    @Option(names = "--select-page", paramLabel = "TOKENS", defaultValue = "" + SelectionConfig.DEFAULT_BLOCK,
            description = "selection granule, a power of two 16..1024 (default ${DEFAULT-VALUE})")
    int page;

    @Option(names = "--select-sink", paramLabel = "TOKENS", defaultValue = "" + SelectionConfig.DEFAULT_SINK,
            description = "first positions always attended (default ${DEFAULT-VALUE})")
    int sink;

    @Option(names = "--select-recent", paramLabel = "TOKENS", defaultValue = "" + SelectionConfig.DEFAULT_RECENT,
            description = "positions before the queries always attended (default ${DEFAULT-VALUE})")
    int recent;

    @Option(names = "--select-dense-layers", paramLabel = "N", defaultValue = "" + SelectionConfig.DEFAULT_DENSE_LAYERS,
            description = "the first N layers attend densely (default ${DEFAULT-VALUE})")
    int denseLayers;

    @Option(names = "--select-coarse", paramLabel = "TOKENS", defaultValue = "0",
            description = "coarse blocks of TOKENS positions chosen first (0: one round; e.g. 256 at 128K and up,"
                    + " so a step reads summaries of about context/TOKENS blocks; default ${DEFAULT-VALUE})")
    int coarse;

    @Option(names = "--select-coarse-keep", paramLabel = "N", defaultValue = "0",
            description = "coarse blocks whose blocks compete (0: four times the coarse blocks the budget fills, at least 32)")
    int coarseKeep;

    @Option(names = "--dump-selection", paramLabel = "FILE",
            description = "record every selection (layer, position, blocks) to FILE, for bench-attention --replay-selection")
    Path dump;

    /** The selection these options ask for; null for dense attention. */
    SelectionConfig config() {
        return switch (select.toLowerCase(Locale.ROOT)) {
            case "dense" -> {
                // an option of the top-k selection given without it would be ignored: refused instead (one given
                // with its default value is not told apart)
                if (coarse != 0 || coarseKeep != 0 || budget != SelectionConfig.DEFAULT_BUDGET
                        || page != SelectionConfig.DEFAULT_BLOCK || sink != SelectionConfig.DEFAULT_SINK
                        || recent != SelectionConfig.DEFAULT_RECENT
                        || denseLayers != SelectionConfig.DEFAULT_DENSE_LAYERS) {
                    throw new UsageException("--select-budget, --select-page, --select-sink,"
                            + " --select-recent, --select-dense-layers, --select-coarse and --select-coarse-keep shape"
                            + " a top-k selection: add --select topk");
                }
                yield null;
            }
            case "topk" -> {
                yield UsageException.parsing(() -> new SelectionConfig(budget, page, sink, recent, denseLayers,
                        coarse, coarse > 0 && coarseKeep == 0 ? SelectionConfig.defaultCoarseKeep(budget, coarse)
                                : coarseKeep));
            }
            default -> throw new UsageException("--select: unknown selection '" + select + "' (dense, topk)");
        };
    }

    /**
     * Sets the selection on the model and opens the dump when one is asked for; returns the dump's writer (null
     * without --dump-selection), which the caller commits when the run is over and closes (a run that fails leaves
     * the file as it was). inputs: the run's input files, which the dump must not name.
     */
    SelectionLog.Writer apply(LlamaModel model, Path... inputs) {
        SelectionConfig c = config();
        UsageException.parsing(() -> {
            model.setSelection(c);
            return c;
        });
        if (dump == null) {
            return null;
        }
        if (c == null) {
            throw new UsageException("--dump-selection records selections: it needs --select topk");
        }
        for (Path in : inputs) {
            if (in != null && dump.toAbsolutePath().normalize().equals(in.toAbsolutePath().normalize())) {
                throw new UsageException("--dump-selection " + dump + " is an input of this run; name"
                        + " another file");
            }
        }
        ModelConfig m = model.config();
        SelectionLog.Writer w = UsageException.parsing(() -> SelectionLog.writer(dump, new SelectionLog.Header(
                m.layers(), m.heads(), m.kvHeads(), m.headDimK(), m.headDimV(), c.blockTokens())));
        model.setSelectionLog(w);
        return w;
    }

    /** One line for reports. */
    String describe() {
        SelectionConfig c = config();
        return c == null ? "dense" : c.toString();
    }
}
