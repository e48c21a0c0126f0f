package dev.kvant.cli;

import dev.kvant.attention.AttentionOptions;
import dev.kvant.backend.Backend;
import dev.kvant.backend.CpuBackend;
import dev.kvant.cuda.Cuda;
import dev.kvant.cuda.CudaAvailability;
import dev.kvant.cuda.CudaException;
import dev.kvant.cuda.CudaUnavailableException;
import dev.kvant.cuda.model.CudaBackend;
import dev.kvant.gguf.GgmlType;
import dev.kvant.kv.KvFormat;
import dev.kvant.kv.KvLayerFormats;
import dev.kvant.model.LlamaModel;
import dev.kvant.model.SyntheticModel;
import dev.kvant.tensor.Parallel;
import picocli.CommandLine.Option;

import java.nio.file.Files;
import java.nio.file.Path;

/** Options shared by the commands that run a model. */
final class ModelOptions {

    @Option(names = {"-m", "--model"}, paramLabel = "GGUF", description = "model file (GGUF)")
    Path model;

    @Option(names = {"-t", "--threads"}, paramLabel = "N",
            description = "worker threads (default: the available processors, ${DEFAULT-VALUE} here)")
    int threads = Runtime.getRuntime().availableProcessors();

    @Option(names = {"--ctk"}, paramLabel = "FORMAT", defaultValue = "f16",
            description = "KV cache format for keys: f16, bf16, q8_0, int8, q4_0, q4_0h, turbo4, turbo3, turbo2; "
                    + "FORMAT+mean centers the keys on their page's mean (turbo3+mean: +0.25 bits, a third of the loss)")
    String ctk;

    @Option(names = {"--ctv"}, paramLabel = "FORMAT", defaultValue = "f16",
            description = "KV cache format for values (same names as --ctk)")
    String ctv;

    @Option(names = {"--ctk-layer"}, paramLabel = "L=FORMAT",
            description = "K format of layer L in place of --ctk (repeatable); L counts from 0, or from the end when "
                    + "negative (-1: the last layer), which carries most of a compressed cache's loss: --ctk "
                    + "turbo3+mean --ctv turbo3 --ctk-layer -1=turbo4+mean --ctv-layer -1=turbo4")
    java.util.List<String> ctkLayers = new java.util.ArrayList<>();

    @Option(names = {"--ctv-layer"}, paramLabel = "L=FORMAT",
            description = "V format of layer L in place of --ctv (repeatable; L as for --ctk-layer)")
    java.util.List<String> ctvLayers = new java.util.ArrayList<>();

    @Option(names = {"--prefill-chunk"}, paramLabel = "N",
            description = "prompt tokens per forward pass (default " + CPU_PREFILL_CHUNK + " on the CPU, "
                    + CUDA_PREFILL_CHUNK + " on a GPU, whose tensor-core GEMMs want long chunks)")
    Integer prefillChunkOption;

    static final int CPU_PREFILL_CHUNK = 512;
    static final int CUDA_PREFILL_CHUNK = 2048;

    /** --prefill-chunk, else the default of the backend (null: the CPU's). */
    int prefillChunk(Backend backend) {
        if (prefillChunkOption != null) {
            if (prefillChunkOption < 1) {
                throw new UsageException("--prefill-chunk must be positive, got " + prefillChunkOption);
            }
            return prefillChunkOption;
        }
        return backend != null && backend.name().equals("cuda") ? CUDA_PREFILL_CHUNK : CPU_PREFILL_CHUNK;
    }

    @Option(names = "--backend", paramLabel = "NAME", defaultValue = "auto",
            description = "where the model runs: cpu, cuda, or auto (cuda when a GPU is present; default)")
    String backend;

    @Option(names = "--sparse-v", paramLabel = "T", defaultValue = "0",
            description = "sparse V: leave out of the V sum the rows whose softmax weight is below T (0 = off, the "
                    + "default; docs/BENCHMARKS.md measures it)")
    float sparseV;

    @Option(names = "--gpus", paramLabel = "LIST", split = ",",
            description = "GPU ordinals to split the layers over, e.g. 0,1 (cuda backend; default: one GPU)")
    int[] gpus;

    @Option(names = "--layer-split", paramLabel = "auto|A,B,...", defaultValue = "auto",
            description = "layers per GPU of --gpus, first to last; auto shares the weight and KV bytes out in proportion"
                    + " to each GPU's free memory (default)")
    String layerSplit;

    @Option(names = "--kv-mem", paramLabel = "SIZE",
            description = "KV cache memory budget (e.g. 8G, 512M): run and chat make the context what fits (up to -c,"
                    + " else the model's trained length); serve sizes its shared KV pool by it; perplexity, needle and"
                    + " the benchmarks refuse a run that does not fit")
    String kvMem;

    /**
     * The context length: -c when no budget is given, else what the budget holds for this model and these formats
     * (capped by an explicit -c). Reports the plan on stderr.
     */
    int contextLength(LlamaModel model, Integer ctxOption, int dflt) {
        if (ctxOption != null && ctxOption < 1) {
            throw new UsageException("-c must be at least 1, got " + ctxOption);
        }
        int trained = model.config().contextLength();
        if (ctxOption != null) {
            warnPastTraining(model, ctxOption, "-c");
        }
        if (kvMem == null) {
            return ctxOption != null ? ctxOption : dflt;
        }
        long bytes = parseSize(kvMem);
        int fits = budgetTokens(model, kvFormats(), bytes);
        // without -c, a budget makes the context what it holds up to the trained length (llama.cpp's default
        // context); -c asks for more
        int ctx = ctxOption != null ? Math.min(ctxOption, fits) : trained > 0 ? Math.min(fits, trained) : fits;
        System.err.printf(java.util.Locale.ROOT, "KV cache %s: %d bytes/token%s, budget %s holds %d tokens;"
                        + " context %d%s%n", kvFormats().name(),
                dev.kvant.engine.Session.kvBytesPerToken(model.config(), kvFormats()),
                model.selection() == null ? "" : " + " + dev.kvant.engine.Session.summaryBytesPerToken(model.config(),
                        kvFormats().keyDomainDim(model.config().headDimK(), model.config().layers()),
                        model.selection()) + " of key summaries", kvMem, fits, ctx,
                ctxOption == null && ctx < fits ? " (the model's trained length; -c asks for more)" : "");
        return ctx;
    }

    /** Warns, as llama.cpp does, when a context is longer than the one the model was trained on. */
    static void warnPastTraining(LlamaModel model, long ctx, String what) {
        int trained = model.config().contextLength();
        if (trained > 0 && ctx > trained) {
            System.err.printf(java.util.Locale.ROOT, "warning: %s %d is more than the %d tokens the model was trained"
                    + " on; it may not attend well that far%n", what, ctx, trained);
        }
    }

    /**
     * Commands whose context the run fixes (perplexity's -c, needle's longest probe, bench's depths and sizes): with
     * --kv-mem, a run whose caches need more tokens than the budget holds for these formats is refused up front
     * (the budget is a limit, not a hint; the CPU backend would otherwise allocate past it).
     */
    void checkBudget(LlamaModel model, KvLayerFormats formats, long tokens, String what) {
        checkBudget(model, formats, tokens, 1, what);
    }

    /** As above for {@code sequences} caches of {@code tokens} each, every one a whole number of pages. */
    void checkBudget(LlamaModel model, KvLayerFormats formats, long tokens, int sequences, String what) {
        if (kvMem == null) {
            return;
        }
        long bytes = parseSize(kvMem);
        int fits = budgetTokens(model, formats, bytes);
        int page = dev.kvant.engine.Session.PAGE_TOKENS;
        long needed = (tokens + page - 1) / page * page * sequences;
        if (needed > fits) {
            throw new UsageException(String.format(java.util.Locale.ROOT, "%s needs %d tokens of KV cache;"
                    + " --kv-mem %s holds %d with %s (raise --kv-mem, or ask for less)", what, needed, kvMem, fits,
                    formats.name()));
        }
    }

    /** The tokens a budget holds, its refusal (less than one page) a usage error. */
    static int budgetTokens(LlamaModel model, KvLayerFormats formats, long bytes) {
        return UsageException.parsing(() -> dev.kvant.engine.Session.contextForBudget(model.config(), formats,
                model.selection(), bytes));
    }

    /**
     * -m and --synthetic exclude each other, and --weights (the weight format of a synthetic model) does not go
     * with -m: a model file has its own, and the option would be silently ignored.
     */
    static void checkModelChoice(picocli.CommandLine.Model.CommandSpec spec, java.nio.file.Path model,
                                 String synthetic) {
        if (model != null && synthetic != null) {
            throw new UsageException("give either -m or --synthetic, not both");
        }
        if (model != null && spec.commandLine().getParseResult().hasMatchedOption("--weights")) {
            throw new UsageException("--weights sets a synthetic model's weights; a model file (-m) has"
                    + " its own");
        }
    }

    /**
     * serve's and bench-serve's engine options, refused before the model loads (EngineConfig's rules, with
     * kvant's own bound on --parallel); ctx null: the default.
     */
    static void checkServing(int parallel, Integer ctx, int pipeline) {
        if (parallel < 1 || parallel > 256) {
            throw new UsageException("--parallel must be between 1 and 256, got " + parallel);
        }
        if (pipeline < 0) {
            throw new UsageException("--pipeline must not be negative, got " + pipeline);
        }
        if (ctx != null && ctx < 2) {
            throw new UsageException("-c must be at least 2, got " + ctx);
        }
    }

    /** "8G", "512M", "64k" or a plain byte count; binary units. */
    static long parseSize(String s) {
        String t = s.strip().toUpperCase(java.util.Locale.ROOT);
        if (t.endsWith("B")) {
            t = t.substring(0, t.length() - 1);
        }
        if (t.endsWith("I")) {
            t = t.substring(0, t.length() - 1);
        }
        long mult = 1;
        if (!t.isEmpty()) {
            switch (t.charAt(t.length() - 1)) {
                case 'K' -> mult = 1L << 10;
                case 'M' -> mult = 1L << 20;
                case 'G' -> mult = 1L << 30;
                case 'T' -> mult = 1L << 40;
                default -> mult = 1;
            }
        }
        String num = mult == 1 ? t : t.substring(0, t.length() - 1);
        double v;
        try {
            v = Double.parseDouble(num);
        } catch (NumberFormatException e) {
            v = Double.NaN;
        }
        if (!(v > 0) || Double.isInfinite(v)) {
            throw new UsageException("--kv-mem: cannot read '" + s + "' as a size (e.g. 8G, 512M)");
        }
        if (v * mult > Long.MAX_VALUE) {
            throw new UsageException("--kv-mem: '" + s + "' is more bytes than a size can hold (" + Long.MAX_VALUE
                    + ")");
        }
        return (long) (v * mult);
    }

    KvFormat kFormat() {
        return UsageException.parsing(() -> KvFormat.parse(ctk));
    }

    KvFormat vFormat() {
        return UsageException.parsing(() -> KvFormat.parse(ctv));
    }

    /** --ctk and --ctv for every layer, with the layers --ctk-layer and --ctv-layer give formats of their own. */
    KvLayerFormats kvFormats() {
        return withLayers(KvLayerFormats.of(kFormat(), vFormat()));
    }

    /** The --ctk-layer and --ctv-layer formats on top of base. */
    KvLayerFormats withLayers(KvLayerFormats base) {
        KvLayerFormats f = base;
        for (String spec : ctkLayers) {
            f = f.withK(layerOf("--ctk-layer", spec), UsageException.parsing(() -> KvFormat.parse(formatOf(spec))));
        }
        for (String spec : ctvLayers) {
            f = f.withV(layerOf("--ctv-layer", spec), UsageException.parsing(() -> KvFormat.parse(formatOf(spec))));
        }
        return f;
    }

    private static int layerOf(String option, String spec) {
        int eq = spec.indexOf('=');
        try {
            if (eq <= 0 || eq == spec.length() - 1) {
                throw new NumberFormatException();
            }
            return Integer.parseInt(spec.substring(0, eq).strip());
        } catch (NumberFormatException e) {
            throw new UsageException(option + ": '" + spec + "' is not LAYER=FORMAT (e.g. -1=q8_0: the last"
                    + " layer in q8_0)");
        }
    }

    private static String formatOf(String spec) {
        return spec.substring(spec.indexOf('=') + 1).strip();
    }

    /**
     * The backend --backend names for a loaded model; the CPU one runs on pool. The caller closes it before the
     * model and the pool.
     */
    Backend openBackend(LlamaModel loaded, Parallel pool) {
        return openBackend(loaded, pool, 1);
    }

    /** Sequences one device decode launch takes; larger batches run as several launches. */
    static final int MAX_DEVICE_BATCH = 8;

    /** As {@link #openBackend(LlamaModel, Parallel)} for up to {@code maxBatch} sequences decoded together. */
    Backend openBackend(LlamaModel loaded, Parallel pool, int maxBatch) {
        loaded.setAttentionOptions(AttentionOptions.defaults().withSparseV(sparseV));
        if (kvMem != null) {
            parseSize(kvMem);   // a malformed size is refused on every path, the ones that do not use it too
        }
        String name = backend.toLowerCase(java.util.Locale.ROOT);
        if (gpus == null && !"auto".equalsIgnoreCase(layerSplit.strip())) {
            throw new UsageException("--layer-split needs --gpus (one GPU per part)");
        }
        if (gpus != null && name.equals("cpu")) {
            throw new UsageException("--gpus names GPUs for the cuda backend; --backend cpu uses none");
        }
        if (gpus != null) {
            for (int g : gpus) {
                if (g < 0) {
                    throw new UsageException("--gpus takes GPU ordinals 0, 1, ... (nvidia-smi's), got " + g);
                }
            }
        }
        return switch (name) {
            case "cpu" -> new CpuBackend(loaded, pool);
            case "cuda" -> openCuda(loaded, maxBatch);
            case "auto" -> {
                CudaAvailability cuda = Cuda.available();
                // GPUs asked for by name are not silently replaced by the CPU
                if (gpus != null) {
                    yield openCuda(loaded, maxBatch);
                }
                if (!cuda.ok()) {
                    yield new CpuBackend(loaded, pool);
                }
                try {
                    yield openCuda(loaded, maxBatch);
                } catch (CudaUnavailableException e) {
                    // a GPU too old for kvant's kernels: say so, and run on the CPU as auto promises
                    System.err.println("kvant: " + e.getMessage() + " Running on the CPU.");
                    yield new CpuBackend(loaded, pool);
                } catch (CudaException e) {
                    // a GPU that is there but cannot be used now (another process holds it in exclusive mode, its
                    // memory went to someone else between the fit check and the upload): the CPU, as auto promises
                    System.err.println("kvant: the GPU could not be used (" + e.getMessage()
                            + "). Running on the CPU.");
                    yield new CpuBackend(loaded, pool);
                } catch (UsageException e) {
                    throw e;
                } catch (IllegalArgumentException e) {
                    // the model or its cache does not fit the GPU auto chose: name the other way too
                    throw new IllegalArgumentException(e.getMessage() + "; or run on the CPU with --backend cpu", e);
                }
            }
            default -> throw new UsageException("--backend: unknown backend '" + backend
                    + "' (cpu, cuda, auto)");
        };
    }

    private Backend openCuda(LlamaModel loaded, int maxBatch) {
        CudaAvailability cuda = Cuda.available();
        if (!cuda.ok()) {
            throw new IllegalArgumentException("--backend cuda: " + cuda.reason());
        }
        long kvTokens = 0;
        long kvBytes = 0;
        if (kvMem != null) {
            kvBytes = parseSize(kvMem);
            kvTokens = budgetTokens(loaded, kvFormats(), kvBytes);
        }
        int[] split = null;
        if (!"auto".equalsIgnoreCase(layerSplit.strip())) {
            try {
                split = java.util.Arrays.stream(layerSplit.split(",")).map(String::strip).mapToInt(Integer::parseInt)
                        .toArray();
            } catch (NumberFormatException e) {
                throw new UsageException("--layer-split: '" + layerSplit
                        + "' is neither auto nor a list of layer counts (e.g. 14,18)");
            }
        }
        if (split != null && gpus == null) {
            throw new UsageException("--layer-split needs --gpus (one GPU per part)");
        }
        return CudaBackend.open(loaded, new CudaBackend.Options(maxBatch,
                prefillChunkOption != null ? Math.max(prefillChunkOption, 1) : CUDA_PREFILL_CHUNK, kvTokens,
                gpus, split, kvBytes));
    }

    LlamaModel load() {
        if (model == null) {
            throw new UsageException("no model given: pass -m path/to/model.gguf");
        }
        checkOptions();
        if (Files.isDirectory(model)) {
            throw new IllegalArgumentException("model " + model + " is a directory, not a GGUF file");
        }
        if (!Files.isRegularFile(model)) {
            throw new IllegalArgumentException("model file not found: " + model);
        }
        return fitted(LlamaModel.load(model));
    }

    /**
     * The model, its layers checked against --ctk-layer and --ctv-layer: a layer it does not have is a usage error
     * (exit 2, as an unknown format is), and the model is closed.
     */
    LlamaModel fitted(LlamaModel m) {
        try {
            UsageException.parsing(() -> {
                kvFormats().check(m.config().layers());
                return m;
            });
        } catch (RuntimeException e) {
            m.close();
            throw e;
        }
        return m;
    }

    /**
     * The options that need no model, checked before one is loaded (a typo should not cost a model upload first) and
     * refused as usage errors: the K/V formats (values are never centered), the sparse-V threshold, --kv-mem.
     */
    void checkOptions() {
        KvLayerFormats f = kvFormats();
        java.util.List<KvFormat> values = new java.util.ArrayList<>(f.vLayers().values());
        values.add(f.v());
        for (KvFormat v : values) {
            if (v instanceof dev.kvant.kv.PageMeanFormat) {
                throw new UsageException("V cache format " + v.name() + ": only keys are centered on their page's"
                        + " mean; use " + dev.kvant.kv.PageMeanFormat.rows(v).name());
            }
        }
        UsageException.parsing(() -> AttentionOptions.defaults().withSparseV(sparseV));
        if (kvMem != null) {
            parseSize(kvMem);
        }
        if (!java.util.List.of("cpu", "cuda", "auto").contains(backend.toLowerCase(java.util.Locale.ROOT))) {
            throw new UsageException("--backend: unknown backend '" + backend + "' (cpu, cuda, auto)");
        }
        if (prefillChunkOption != null && prefillChunkOption < 1) {
            throw new UsageException("--prefill-chunk must be positive, got " + prefillChunkOption);
        }
    }

    static LlamaModel synthetic(String shape, String weightType) {
        GgmlType type;
        try {
            type = GgmlType.valueOf(weightType.toUpperCase(java.util.Locale.ROOT));
        } catch (IllegalArgumentException e) {
            throw new UsageException("unknown weight type '" + weightType + "' (supported: "
                    + dev.kvant.tensor.UnsupportedTensorTypeException.SUPPORTED + ")");
        }
        SyntheticModel.Shape s = UsageException.parsing(() -> SyntheticModel.Shape.parse(shape));
        // a type kvant computes no weights of, or a shape whose rows are no whole blocks of it: the options' fault
        try {
            return UsageException.parsing(() -> SyntheticModel.build(s, type, 42));
        } catch (dev.kvant.tensor.UnsupportedTensorTypeException e) {
            throw new UsageException("--weights " + weightType + ": " + e.getMessage());
        }
    }

    static void checkThreads(int threads) {
        if (threads < 1 || threads > 1024) {
            throw new UsageException("--threads must be between 1 and 1024, got " + threads);
        }
    }
}
