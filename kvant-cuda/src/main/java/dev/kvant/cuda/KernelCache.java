package dev.kvant.cuda;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * Compiled kernels on disk, so NVRTC runs once per kernel per machine rather than at every start.
 *
 * <p>A cubin is found by its {@link Key}: the SHA-256 of the source and the exact compiler options, the target
 * architecture, the driver version and the compiler version. Any change to any of them is a different file, so a
 * stale cubin is never loaded; old files are simply left behind.
 *
 * <p>File format (all big-endian): the 8 ASCII bytes {@code KVCUBIN1}, the payload length (8 bytes), the payload's
 * SHA-256 (32 bytes), then the payload. A file is written to a temporary name in the same folder and renamed into
 * place, so a reader sees a whole file or none; a file that is short, has the wrong magic, length or hash (a torn
 * copy, a full disk, bit rot) is reported, recompiled and replaced; so is an intact one the driver refuses to load
 * ({@link #load}).
 *
 * <p>Where: {@code $KVANT_CACHE_DIR}, else {@code ~/.cache/kvant/cubin}.
 */
public final class KernelCache {
    static final byte[] MAGIC = "KVCUBIN1".getBytes(StandardCharsets.US_ASCII);
    static final int HEADER_BYTES = 8 + 8 + 32;

    private static final System.Logger LOG = System.getLogger(KernelCache.class.getName());

    private final Path directory;
    private final KernelCompiler compiler;
    private final int driverVersion;
    private final AtomicLong hits = new AtomicLong();
    private final AtomicLong compiles = new AtomicLong();
    private final AtomicLong rebuilt = new AtomicLong();

    /**
     * @param directory     where cubins live (created on first write)
     * @param compiler      what turns source into cubin on a miss
     * @param driverVersion cuDriverGetVersion's value, part of every key
     */
    public KernelCache(Path directory, KernelCompiler compiler, int driverVersion) {
        this.directory = directory;
        this.compiler = compiler;
        this.driverVersion = driverVersion;
        removeStaleTemporaries(directory);
    }

    /** How old a writer's temporary file must be to count as left behind by a process that died writing it. */
    static final java.time.Duration STALE_TEMPORARY = java.time.Duration.ofHours(1);

    /** Deletes the temporary files writers that died left in the directory (best effort; younger ones may be live). */
    private static void removeStaleTemporaries(Path directory) {
        if (!Files.isDirectory(directory)) {
            return;
        }
        long before = System.currentTimeMillis() - STALE_TEMPORARY.toMillis();
        try (var files = Files.newDirectoryStream(directory, "*.tmp")) {
            for (Path f : files) {
                try {
                    if (Files.getLastModifiedTime(f).toMillis() < before) {
                        Files.deleteIfExists(f);
                    }
                } catch (IOException e) {
                    // another process's file, or gone already: not this cache's business
                }
            }
        } catch (IOException e) {
            LOG.log(System.Logger.Level.DEBUG, "kernel cache directory " + directory + " not listed: " + e);
        }
    }

    /** The cache in {@link #defaultDirectory()}, compiling with NVRTC, for {@code context}'s driver. */
    public static KernelCache open(CudaContext context) {
        return new KernelCache(defaultDirectory(), Nvrtc.load(), context.driverVersion());
    }

    /** {@code $KVANT_CACHE_DIR}, else {@code ~/.cache/kvant/cubin}. */
    public static Path defaultDirectory() {
        return defaultDirectory(System::getenv, System.getProperty("user.home"));
    }

    static Path defaultDirectory(Function<String, String> env, String userHome) {
        String override = env.apply("KVANT_CACHE_DIR");
        if (override != null && !override.isBlank()) {
            return Path.of(override.strip());
        }
        return Path.of(userHome, ".cache", "kvant", "cubin");
    }

    /**
     * The options every kvant kernel is compiled with: a real architecture (cubin, no PTX JIT fallback), C++17,
     * {@code __device__} by default, and the defines sorted by name (so the same defines give the same key).
     */
    public static List<String> options(String arch, Map<String, String> defines) {
        if (!arch.matches("sm_[0-9]+[a-z]?")) {
            throw new IllegalArgumentException("'" + arch + "' is not a real GPU architecture (sm_90, sm_90a, ...)");
        }
        List<String> options = new ArrayList<>(List.of("--gpu-architecture=" + arch, "--std=c++17", "-default-device"));
        new TreeMap<>(defines).forEach((name, value) -> {
            if (!name.matches("[A-Za-z_][A-Za-z0-9_]*")) {
                throw new IllegalArgumentException("'" + name + "' is not a C preprocessor name");
            }
            options.add(value == null || value.isEmpty() ? "-D" + name : "-D" + name + "=" + value);
        });
        return List.copyOf(options);
    }

    /** The cubin of {@code source} for {@code arch} (e.g. sm_90), from disk or freshly compiled. */
    public byte[] cubin(KernelSource source, String arch) {
        return cubin(source, arch, Map.of());
    }

    /** The cubin of {@code source} with {@code defines}, for {@code arch}. */
    public byte[] cubin(KernelSource source, String arch, Map<String, String> defines) {
        return load(source, arch, defines, Function.identity());
    }

    /**
     * {@code loader} applied to the cubin of {@code source} with {@code defines}, for {@code arch}. When the driver
     * refuses a cubin from disk as an image (a file intact by its hash but written by a toolkit or for a device this
     * driver does not take), the cubin is compiled afresh and loaded once more, and replaces the file only once the
     * driver took it (a fresh cubin it refuses too is thrown, with the first refusal suppressed, and leaves no file);
     * any other failure of the loader (out of memory, say) is thrown as it is.
     */
    public <T> T load(KernelSource source, String arch, Map<String, String> defines, Function<byte[], T> loader) {
        List<String> options = options(arch, defines);
        Path file = directory.resolve(key(source, arch, options).fileName());
        byte[] stored = stored(file, source);
        CudaException refused = null;
        if (stored != null) {
            try {
                T loaded = loader.apply(stored);
                hits.incrementAndGet();
                return loaded;
            } catch (CudaException e) {
                if (!refusedImage(e)) {
                    throw e;
                }
                refused = e;
                rebuilt.incrementAndGet();
                LOG.log(System.Logger.Level.WARNING, "the driver refused the cached kernel file " + file + " ("
                        + e.errorName() + "); recompiling " + source.name());
                delete(file);
            }
        }
        byte[] cubin = compiler.compile(source, options);
        compiles.incrementAndGet();
        T loaded;
        try {
            loaded = loader.apply(cubin);
        } catch (RuntimeException | Error e) {
            if (refused != null) {
                e.addSuppressed(refused);
            }
            throw e;
        }
        write(file, encode(cubin));
        return loaded;
    }

    /**
     * Whether the driver answered a module load with "this image is not for me" (CUresult 200 INVALID_IMAGE, 209
     * NO_BINARY_FOR_GPU, 218 INVALID_PTX, 222 UNSUPPORTED_PTX_VERSION, 300 INVALID_SOURCE): a reason to compile
     * again rather than to give up. By number: the name is the driver's answer to cuGetErrorName, which may fail.
     */
    static boolean refusedImage(CudaException e) {
        return switch (e.code()) {
            case 200, 209, 218, 222, 300 -> true;
            default -> false;
        };
    }

    /** The payload of {@code file} when it is a whole, intact cache file; null when absent or corrupt (counted). */
    private byte[] stored(Path file, KernelSource source) {
        byte[] stored = read(file);
        if (stored == null) {
            return null;
        }
        byte[] payload = decode(stored);
        if (payload == null) {
            rebuilt.incrementAndGet();
            LOG.log(System.Logger.Level.WARNING, "kernel cache file " + file + " is corrupt (" + stored.length
                    + " bytes, bad header, length or hash); recompiling " + source.name());
        }
        return payload;
    }

    private static void delete(Path file) {
        try {
            Files.deleteIfExists(file);
        } catch (IOException e) {
            LOG.log(System.Logger.Level.WARNING, "kernel cache file " + file + " could not be deleted: " + e);
        }
    }

    /** What identifies one compiled cubin. */
    public record Key(String sourceName, String sourceHash, String arch, int driverVersion, String compilerVersion) {
        /** e.g. {@code copy.cu-sm_90-cuda13000-nvrtc_13.0-3f2a...e1.cubin}; the hash is 32 hex digits of 64. */
        public String fileName() {
            return safe(sourceName) + "-" + arch + "-cuda" + driverVersion + "-" + safe(compilerVersion) + "-"
                    + sourceHash.substring(0, 32) + ".cubin";
        }

        private static String safe(String s) {
            return s.replaceAll("[^A-Za-z0-9._-]", "_");
        }
    }

    /** The key of {@code source} compiled with {@code options} for {@code arch} by this cache's compiler and driver. */
    public Key key(KernelSource source, String arch, List<String> options) {
        MessageDigest sha = sha256();
        sha.update(source.code().getBytes(StandardCharsets.UTF_8));
        for (String option : options) {
            sha.update((byte) 0);
            sha.update(option.getBytes(StandardCharsets.UTF_8));
        }
        return new Key(source.name(), HexFormat.of().formatHex(sha.digest()), arch, driverVersion, compiler.version());
    }

    /** Counts since this cache was made: cubins served from disk, compiler runs, corrupt or refused files replaced. */
    public record Stats(long hits, long compiles, long rebuilt) {
    }

    public Stats stats() {
        return new Stats(hits.get(), compiles.get(), rebuilt.get());
    }

    public Path directory() {
        return directory;
    }

    static byte[] encode(byte[] payload) {
        ByteBuffer out = ByteBuffer.allocate(HEADER_BYTES + payload.length);
        out.put(MAGIC).putLong(payload.length).put(sha256().digest(payload)).put(payload);
        return out.array();
    }

    /** The payload of a cache file, or null when the file is not a whole, intact one. */
    static byte[] decode(byte[] file) {
        if (file.length < HEADER_BYTES || !Arrays.equals(file, 0, MAGIC.length, MAGIC, 0, MAGIC.length)) {
            return null;
        }
        ByteBuffer in = ByteBuffer.wrap(file);
        long length = in.getLong(MAGIC.length);
        if (length != file.length - HEADER_BYTES || length == 0) {   // no compiler writes an empty cubin
            return null;
        }
        byte[] payload = Arrays.copyOfRange(file, HEADER_BYTES, file.length);
        byte[] hash = sha256().digest(payload);
        if (!Arrays.equals(hash, 0, 32, file, 16, HEADER_BYTES)) {
            return null;
        }
        return payload;
    }

    private static byte[] read(Path file) {
        try {
            return Files.readAllBytes(file);
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            LOG.log(System.Logger.Level.WARNING, "kernel cache file " + file + " could not be read (" + e
                    + "); recompiling");
            return null;
        }
    }

    private void write(Path file, byte[] bytes) {
        Path temp = null;
        try {
            Files.createDirectories(directory);
            temp = Files.createTempFile(directory, file.getFileName().toString(), ".tmp");
            Files.write(temp, bytes);
            try {
                // a temporary file is the owner's alone; a cache directory shared between users must stay readable
                Files.setPosixFilePermissions(temp, java.nio.file.attribute.PosixFilePermissions.fromString("rw-r--r--"));
            } catch (UnsupportedOperationException e) {
                // not a POSIX file system: its defaults apply
            }
            try {
                Files.move(temp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            } catch (AtomicMoveNotSupportedException e) {
                Files.move(temp, file, StandardCopyOption.REPLACE_EXISTING);
            }
        } catch (IOException e) {
            // A cache that cannot be written is slower, not wrong: the cubin in hand is returned regardless.
            LOG.log(System.Logger.Level.WARNING, "kernel cache file " + file + " could not be written: " + e);
            if (temp != null) {
                try {
                    Files.deleteIfExists(temp);
                } catch (IOException ignored) {
                    // nothing more to do
                }
            }
        }
    }

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("the JDK has no SHA-256", e);
        }
    }
}
