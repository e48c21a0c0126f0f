package dev.kvant.cli;

import dev.kvant.attention.AttentionBench;
import dev.kvant.attention.AttentionOptions;
import dev.kvant.kv.KvFormat;
import dev.kvant.select.SelectionConfig;
import dev.kvant.select.SelectionLog;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Model.CommandSpec;
import picocli.CommandLine.Option;
import picocli.CommandLine.Spec;

import java.nio.file.Path;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/** Decode (and prefill) attention of one layer over caches of every format: time, cache read rate, copy rate. */
@Command(name = "bench-attention", mixinStandardHelpOptions = true,
        description = {"Attention kernel benchmark: one layer of a real geometry over a cache of random rows.",
                "Prints decode time per token and layer, GB/s of cache read, and the copy bandwidth measured in the "
                        + "same run."})
final class AttentionBenchCommand implements Runnable {

    @Option(names = "--formats", paramLabel = "F", split = ",",
            defaultValue = "f16,q8_0,int8,q4_0,turbo4,turbo3,turbo2",
            description = "K/V formats, both K and V (default ${DEFAULT-VALUE})")
    List<String> formats;

    @Option(names = "--ctx", paramLabel = "N", split = ",", defaultValue = "4096,32768,131072",
            description = "cached tokens (default ${DEFAULT-VALUE})")
    int[] ctx;

    @Option(names = {"-t", "--threads"}, paramLabel = "N", split = ",", defaultValue = "1,2",
            description = "thread counts (default ${DEFAULT-VALUE})")
    int[] threads;

    @Option(names = "--heads", paramLabel = "N", defaultValue = "32", description = "query heads (default ${DEFAULT-VALUE})")
    int heads;

    @Option(names = "--kv-heads", paramLabel = "N", defaultValue = "8", description = "kv heads (default ${DEFAULT-VALUE})")
    int kvHeads;

    @Option(names = "--head-dim", paramLabel = "D", defaultValue = "128", description = "head size (default ${DEFAULT-VALUE})")
    int headDim;

    @Option(names = {"-r", "--repetitions"}, paramLabel = "N", defaultValue = "20",
            description = "timed decode repetitions at 4K tokens, fewer for longer caches (default ${DEFAULT-VALUE});"
                    + " with --replay-selection, per record and for each of selected and dense (default "
                    + REPLAY_REPS + ")")
    int reps;

    @Option(names = "--prefill", paramLabel = "N", defaultValue = "0",
            description = "also time a prefill chunk of N tokens after the cache (0 = off)")
    int prefill;

    @Option(names = "--sparse-v", paramLabel = "T", defaultValue = "0", description = "sparse-V threshold (0 = off)")
    float sparseV;

    @Option(names = "--copy-mb", paramLabel = "MB", defaultValue = "256",
            description = "buffer size of the copy-bandwidth measurement (default ${DEFAULT-VALUE})")
    int copyMb;

    @Option(names = "--json", description = "print a JSON array, one object per row")
    boolean json;

    @Option(names = "--select-budget", paramLabel = "TOKENS", defaultValue = "0",
            description = "also time decode through a top-k selection of this many tokens, selector included (0 = off)")
    int selectBudget;

    @Option(names = "--select-coarse", paramLabel = "TOKENS", defaultValue = "0",
            description = "with --select-budget: a coarse round over blocks of TOKENS (0 = one round)")
    int selectCoarse;

    @Option(names = "--replay-selection", paramLabel = "FILE",
            description = "instead: replay the selections of a --dump-selection file over random K/V of its shape, "
                    + "printing median time per call, dense time of the same calls and an output checksum")
    Path replay;

    @Option(names = "--replay-limit", paramLabel = "N", defaultValue = "0",
            description = "replay the first N records only (0 = all)")
    int replayLimit;

    @Option(names = "--replay-decode", description = "replay only the records of decode steps (at most 8 tokens)")
    boolean replayDecode;

    @Spec
    CommandSpec spec;

    /** Repetitions per replayed record without -r: a dump holds thousands of records. */
    static final int REPLAY_REPS = 3;
    /** The options that shape the random problems: a replay takes its geometry and queries from the dump instead. */
    private static final List<String> PROBLEM_OPTIONS = List.of("--ctx", "--heads", "--kv-heads", "--head-dim",
            "--prefill", "--select-budget", "--select-coarse", "--copy-mb");

    @Override
    public void run() {
        var parsed = spec.commandLine().getParseResult();
        if (replay != null) {
            // an option the replay would silently ignore is refused
            List<String> ignored = PROBLEM_OPTIONS.stream().filter(parsed::hasMatchedOption).toList();
            if (!ignored.isEmpty()) {
                throw new UsageException(String.join(", ", ignored) + (ignored.size() == 1 ? " shapes" : " shape")
                        + " the random problems; --replay-selection takes the geometry and the selections from its"
                        + " file: leave " + (ignored.size() == 1 ? "it" : "them") + " out");
            }
        } else if (parsed.hasMatchedOption("--replay-limit") || parsed.hasMatchedOption("--replay-decode")) {
            throw new UsageException("--replay-limit and --replay-decode choose the records of a replay: give"
                    + " --replay-selection FILE too");
        }
        for (int t : threads) {
            ModelOptions.checkThreads(t);
        }
        if (heads < 1 || kvHeads < 1) {
            throw new UsageException("--heads and --kv-heads must be at least 1, got " + heads + " and "
                    + kvHeads);
        }
        if (reps < 1) {
            throw new UsageException("-r must be at least 1");
        }
        for (int c : ctx) {
            if (c < 1) {
                throw new UsageException("--ctx must be at least 1, got " + c);
            }
        }
        if (heads % kvHeads != 0) {
            throw new UsageException("--heads " + heads + " must be a multiple of --kv-heads " + kvHeads);
        }
        if (headDim < 1) {
            throw new UsageException("--head-dim must be at least 1, got " + headDim);
        }
        if (copyMb < 1) {
            throw new UsageException("--copy-mb must be at least 1, got " + copyMb);
        }
        if (prefill < 0 || selectBudget < 0 || selectCoarse < 0) {
            throw new UsageException("--prefill, --select-budget and --select-coarse take a number of tokens, 0 for"
                    + " off; got " + prefill + ", " + selectBudget + ", " + selectCoarse);
        }
        if (selectCoarse > 0 && selectBudget == 0) {   // it would be ignored
            throw new UsageException("--select-coarse shapes a selection: give --select-budget too");
        }
        long least = SelectionConfig.leastBudget(SelectionConfig.DEFAULT_BLOCK, SelectionConfig.DEFAULT_SINK,
                SelectionConfig.DEFAULT_RECENT);
        if (selectBudget > 0 && selectBudget < least) {   // (the windows are not options here: named as they are)
            throw new UsageException("--select-budget " + selectBudget + " is below " + least + " tokens, the least"
                    + " this selection honours: its sink of " + SelectionConfig.DEFAULT_SINK + " and recent window of "
                    + SelectionConfig.DEFAULT_RECENT + " tokens, the query's own page and one chosen, in pages of "
                    + SelectionConfig.DEFAULT_BLOCK);
        }
        UsageException.parsing(() -> dev.kvant.attention.AttentionOptions.defaults().withSparseV(sparseV));
        List<KvFormat> fs = UsageException.parsing(() -> formats.stream().map(KvFormat::parse).toList());
        Progress progress = new Progress(json);
        String machine = AttentionBench.machine();
        if (replay != null) {
            if (replayLimit < 0) {
                throw new UsageException("--replay-limit must be 0 (all) or more, got " + replayLimit);
            }
            replay(fs, parsed.hasMatchedOption("-r") ? reps : REPLAY_REPS, progress, machine);
            return;
        }
        SelectionConfig select = selectBudget > 0
                ? UsageException.parsing(() -> SelectionConfig.topK(selectBudget).withCoarse(selectCoarse)) : null;
        List<AttentionBench.Row> rows = AttentionBench.run(new AttentionBench.Settings(fs, ctx, threads, heads, kvHeads,
                headDim, reps, prefill, new AttentionOptions(0f, sparseV), (long) copyMb << 20, select),
                progress::update);
        progress.done();
        if (json) {
            System.out.println(AttentionBench.json(rows));
        } else {
            System.out.println("machine: " + machine + "; " + LocalDate.now() + "; " + heads + " heads / " + kvHeads
                    + " kv heads / head size " + headDim + ", one layer" + (sparseV > 0 ? ", sparse-v " + sparseV : "")
                    + "; ctx " + Arrays.toString(ctx));
            System.out.println();
            System.out.println(AttentionBench.markdown(rows));
        }
    }

    private void replay(List<KvFormat> fs, int replayReps, Progress progress, String machine) {
        SelectionLog log = SelectionLog.read(replay);
        List<AttentionBench.Replay> rows = new ArrayList<>();
        for (KvFormat f : fs) {
            for (int t : threads) {
                try (Parallel pool = new Parallel(t)) {
                    rows.add(AttentionBench.replay(log, f, pool, replayLimit, replayDecode, replayReps, 42,
                            new AttentionOptions(0f, sparseV), progress::update));
                }
            }
        }
        progress.done();
        if (json) {
            System.out.println("[" + String.join(",\n ", rows.stream().map(AttentionBench.Replay::toJson).toList())
                    + "]");
        } else {
            SelectionLog.Header h = log.header();
            System.out.println("machine: " + machine + "; " + LocalDate.now() + "; replay of " + replay + " ("
                    + h.heads() + " heads / " + h.kvHeads() + " kv heads / head size " + h.headDimK() + ", blocks of "
                    + h.blockTokens() + ")" + (sparseV > 0 ? "; sparse-v " + sparseV : "") + "; " + replayReps
                    + " repetitions per record");
            System.out.println();
            System.out.println(AttentionBench.replayMarkdown(rows));
        }
    }
}
