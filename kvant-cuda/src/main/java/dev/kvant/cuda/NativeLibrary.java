package dev.kvant.cuda;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.function.Function;

/**
 * A shared library opened through FFM, and the search that found it. CUDA's libraries live in different places on
 * different machines (the driver's {@code libcuda.so.1} on the loader path; NVRTC and cuBLASLt in a toolkit under
 * {@code /usr/local/cuda*}, or in pip wheels under python's site-packages), so a library is looked for in a list of
 * candidates and, when none loads, the error lists every one tried.
 *
 * <p>Libraries are opened in the global arena: they stay loaded for the life of the JVM, as CUDA expects.
 *
 * @param name       the library's short name, e.g. {@code libnvrtc}
 * @param loadedFrom the candidate that loaded: a soname resolved by the dynamic loader, or a path
 */
record NativeLibrary(String name, String loadedFrom, SymbolLookup lookup) {

    private static final Linker LINKER = Linker.nativeLinker();

    /**
     * Opens the first candidate that loads. A candidate without a slash is a soname for the dynamic loader
     * (LD_LIBRARY_PATH, ld.so.cache); one with a slash is a file, skipped when it does not exist.
     *
     * @param note words added to the error, e.g. where else was searched or what the user can do
     * @throws CudaUnavailableException naming every candidate tried, when none loads
     */
    static NativeLibrary load(String name, List<String> candidates, String note) {
        return load(name, candidates, note, null);
    }

    /**
     * As {@link #load(String, List, String)}, first opening the files matching {@code companionGlob} in a path
     * candidate's folder. NVRTC dlopens {@code libnvrtc-builtins.so.13.0} by bare soname, which the loader only finds
     * on its search path, or already loaded: preloading it from the folder NVRTC came from is what makes a pip
     * wheel or an unregistered toolkit work without LD_LIBRARY_PATH.
     */
    static NativeLibrary load(String name, List<String> candidates, String note, String companionGlob) {
        List<String> tried = new ArrayList<>();
        for (String candidate : candidates) {
            try {
                SymbolLookup lookup;
                if (candidate.indexOf('/') < 0) {
                    lookup = SymbolLookup.libraryLookup(candidate, Arena.global());
                } else {
                    Path path = Path.of(candidate);
                    if (!Files.isRegularFile(path)) {
                        continue;
                    }
                    if (companionGlob != null) {
                        preload(path.toAbsolutePath().getParent(), companionGlob);
                    }
                    lookup = SymbolLookup.libraryLookup(path, Arena.global());
                }
                return new NativeLibrary(name, candidate, lookup);
            } catch (IllegalArgumentException | IllegalCallerException | UnsatisfiedLinkError e) {
                tried.add(candidate);
            }
        }
        String list = tried.isEmpty() ? "no candidate exists" : "tried " + String.join(", ", tried);
        throw new CudaUnavailableException(name + " could not be loaded (" + list
                + (note.isEmpty() ? "" : "; " + note) + ")");
    }

    /**
     * The candidates for a CUDA toolkit library: the file or folder named by {@code envVar}, the sonames through the
     * dynamic loader, then the toolkits under /usr/local/cuda*, then pip wheels in python site-packages.
     *
     * @param sonames    e.g. libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12 (tried in this order in every folder)
     * @param pipFolders folders under site-packages holding the wheel's libraries, e.g. nvidia/cu13/lib
     */
    static List<String> toolkitCandidates(String envVar, List<String> sonames, List<String> pipFolders,
                                          Function<String, String> env) {
        Set<String> out = new LinkedHashSet<>();
        String override = env.apply(envVar);
        if (override != null && !override.isBlank()) {
            Path p = Path.of(override.strip());
            if (Files.isDirectory(p)) {
                sonames.forEach(s -> out.add(p.resolve(s).toString()));
            } else {
                out.add(p.toString().indexOf('/') < 0 ? "./" + p : p.toString());
            }
        }
        out.addAll(sonames);
        List<Path> folders = new ArrayList<>();
        for (Path cuda : sortedNewestFirst(Path.of("/usr/local"), "cuda*")) {
            folders.add(cuda.resolve("lib64"));
            folders.add(cuda.resolve("targets/x86_64-linux/lib"));
            folders.add(cuda.resolve("targets/sbsa-linux/lib"));
        }
        for (Path sitePackages : sitePackages(env)) {
            for (String pip : pipFolders) {
                folders.add(sitePackages.resolve(pip));
            }
        }
        for (Path folder : folders) {
            if (Files.isDirectory(folder)) {
                sonames.forEach(s -> out.add(folder.resolve(s).toString()));
            }
        }
        return List.copyOf(out);
    }

    /** Words for the error message: where {@link #toolkitCandidates} looked, and how to point it elsewhere. */
    static String toolkitSearchNote(String envVar, List<String> pipFolders) {
        return "searched the dynamic loader path, /usr/local/cuda*/lib64 and python site-packages "
                + String.join(", ", pipFolders) + "; set " + envVar + " to the library or its folder";
    }

    /** A downcall handle for {@code symbol}; a library without it cannot be used, so its absence is an error. */
    MethodHandle function(String symbol, FunctionDescriptor descriptor) {
        MemorySegment address = lookup.find(symbol).orElseThrow(() -> new CudaUnavailableException(
                name + " (" + loadedFrom + ") has no function " + symbol + ": the library is older than kvant needs"));
        return LINKER.downcallHandle(address, descriptor);
    }

    /** A downcall handle for {@code symbol}, or null where the library does not export it (an optional feature). */
    MethodHandle optionalFunction(String symbol, FunctionDescriptor descriptor) {
        return lookup.find(symbol).map(a -> LINKER.downcallHandle(a, descriptor)).orElse(null);
    }

    /** A downcall handle for the first of {@code symbols} the library exports (newer name first). */
    MethodHandle firstFunction(FunctionDescriptor descriptor, String... symbols) {
        for (String symbol : symbols) {
            Optional<MemorySegment> address = lookup.find(symbol);
            if (address.isPresent()) {
                return LINKER.downcallHandle(address.get(), descriptor);
            }
        }
        throw new CudaUnavailableException(name + " (" + loadedFrom + ") has none of " + String.join(", ", symbols)
                + ": the library is older than kvant needs");
    }

    private static void preload(Path folder, String glob) {
        if (folder == null) {
            return;
        }
        for (Path companion : sortedNewestFirst(folder, glob)) {
            try {
                SymbolLookup.libraryLookup(companion, Arena.global());
            } catch (IllegalArgumentException e) {
                // Not loadable: the library itself will say what is missing when it needs it.
            }
        }
    }

    private static List<Path> sitePackages(Function<String, String> env) {
        List<Path> roots = new ArrayList<>();
        String venv = env.apply("VIRTUAL_ENV");
        if (venv != null && !venv.isBlank()) {
            roots.add(Path.of(venv, "lib"));
        }
        String conda = env.apply("CONDA_PREFIX");
        if (conda != null && !conda.isBlank()) {
            roots.add(Path.of(conda, "lib"));
        }
        String home = env.apply("HOME");
        if (home != null && !home.isBlank()) {
            roots.add(Path.of(home, ".local/lib"));
        }
        roots.add(Path.of("/usr/local/lib"));
        roots.add(Path.of("/usr/lib"));
        roots.add(Path.of("/opt/conda/lib"));
        List<Path> out = new ArrayList<>();
        for (Path root : roots) {
            for (Path python : sortedNewestFirst(root, "python3*")) {
                out.add(python.resolve("site-packages"));
                out.add(python.resolve("dist-packages"));
            }
        }
        return out;
    }

    private static List<Path> sortedNewestFirst(Path dir, String glob) {
        if (!Files.isDirectory(dir)) {
            return List.of();
        }
        List<Path> found = new ArrayList<>();
        try (DirectoryStream<Path> stream = Files.newDirectoryStream(dir, glob)) {
            stream.forEach(found::add);
        } catch (IOException | SecurityException e) {
            return List.of();
        }
        // "cuda" (the link to the default toolkit) first, then versions newest first.
        found.sort(Comparator.comparing((Path p) -> !p.getFileName().toString().equals("cuda"))
                .thenComparing(p -> p.getFileName().toString(), Comparator.reverseOrder()));
        return found;
    }
}
