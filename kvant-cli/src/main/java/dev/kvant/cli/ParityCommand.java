package dev.kvant.cli;

import dev.kvant.attention.AttentionKernel;
import dev.kvant.attention.AttentionOptions;
import dev.kvant.attention.AttentionParity;
import dev.kvant.cuda.Cuda;
import dev.kvant.cuda.CudaAvailability;
import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.attention.CudaParityKernels;
import dev.kvant.kv.KvFormat;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.Callable;

/** Runs every attention kernel on one random problem and compares each with the float64 reference. */
@Command(name = "parity", mixinStandardHelpOptions = true,
        description = {"Attention kernels against the float64 reference on random inputs: NMSE, max abs error and a "
                + "checksum of the output bits per kernel.",
                "Exits with 1 when a kernel exceeds its NMSE bound."})
final class ParityCommand implements Callable<Integer> {

    @Option(names = "--ctk", paramLabel = "FORMAT", defaultValue = "f16", description = "K cache format (default ${DEFAULT-VALUE})")
    String ctk;

    @Option(names = "--ctv", paramLabel = "FORMAT", defaultValue = "f16", description = "V cache format (default ${DEFAULT-VALUE})")
    String ctv;

    @Option(names = "--ctx", paramLabel = "N", defaultValue = "4096",
            description = "cached positions, the queries being the last of them (default ${DEFAULT-VALUE})")
    int ctx;

    @Option(names = "--queries", paramLabel = "Q", defaultValue = "4",
            description = "query tokens at consecutive positions (default ${DEFAULT-VALUE})")
    int queries;

    @Option(names = "--seed", paramLabel = "S", description = "random seed (default: a fresh one, printed)")
    Long seed;

    @Option(names = "--heads", paramLabel = "N", defaultValue = "32", description = "query heads (default ${DEFAULT-VALUE})")
    int heads;

    @Option(names = "--kv-heads", paramLabel = "N", defaultValue = "8", description = "kv heads (default ${DEFAULT-VALUE})")
    int kvHeads;

    @Option(names = "--head-dim", paramLabel = "D", defaultValue = "128",
            description = "head size of K and V (default ${DEFAULT-VALUE})")
    int headDim;

    @Option(names = "--head-dim-v", paramLabel = "D", description = "head size of V when it differs from K")
    Integer headDimV;

    @Option(names = "--soft-cap", paramLabel = "C", defaultValue = "0", description = "logit soft-cap (0 = off)")
    float softCap;

    @Option(names = "--sparse-v", paramLabel = "T", defaultValue = "0", description = "sparse-V threshold (0 = off)")
    float sparseV;

    @Option(names = {"-t", "--threads"}, paramLabel = "N", description = "worker threads (default: available processors)")
    int threads = Runtime.getRuntime().availableProcessors();

    @Option(names = "--json", description = "print one JSON object")
    boolean json;

    @Option(names = "--backend", paramLabel = "NAME", defaultValue = "cpu",
            description = "whose kernels: cpu, cuda, or all (cpu and cuda in one table; default ${DEFAULT-VALUE})")
    String backend;

    @Override
    public Integer call() {
        ModelOptions.checkThreads(threads);
        if (headDim < 1 || headDimV != null && headDimV < 1) {
            throw new UsageException("--head-dim and --head-dim-v must be at least 1");
        }
        long s = seed != null ? seed : new SplittableRandom().nextLong();
        AttentionParity.Settings settings = UsageException.parsing(() -> new AttentionParity.Settings(
                KvFormat.parse(ctk), KvFormat.parse(ctv), ctx, queries, kvHeads, heads, headDim,
                headDimV != null ? headDimV : headDim, s, new AttentionOptions(softCap, sparseV)));
        String which = backend.toLowerCase(java.util.Locale.ROOT);
        if (!which.equals("cpu") && !which.equals("cuda") && !which.equals("all")) {
            throw new UsageException("--backend: unknown backend '" + backend + "' (cpu, cuda, all)");
        }
        AttentionParity.Report report;
        CudaContext context = null;
        try (Parallel pool = new Parallel(threads)) {
            List<AttentionKernel> kernels = new ArrayList<>();
            if (!which.equals("cuda")) {
                kernels.addAll(AttentionParity.cpuKernels(pool));
            }
            if (!which.equals("cpu")) {
                CudaAvailability cuda = Cuda.available();
                if (!cuda.ok()) {
                    throw new IllegalArgumentException("--backend " + which + ": " + cuda.reason());
                }
                context = CudaContext.open();
                kernels.addAll(CudaParityKernels.kernels(context));
            }
            report = AttentionParity.run(settings, kernels);
        } finally {
            if (context != null) {
                context.close();
            }
        }
        System.out.println(json ? report.toJson() : report.markdown());
        return report.ok() ? 0 : 1;
    }
}
