package dev.kvant.cuda;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.function.UnaryOperator;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The on-disk cubin cache, with a fake compiler standing in for NVRTC. */
class KernelCacheTest {
    private static final KernelSource SOURCE = new KernelSource("axpy.cu",
            "extern \"C\" __global__ void axpy(float a, const float* x, float* y) { y[threadIdx.x] += a * x[threadIdx.x]; }");

    /** A stand-in for NVRTC: the "cubin" is a digest of what it was asked to compile, plus some random bytes. */
    static final class FakeCompiler implements KernelCompiler {
        final String version;
        final byte[] salt;
        int calls;
        boolean fail;

        FakeCompiler(String version, long seed) {
            this.version = version;
            this.salt = new byte[1000 + new SplittableRandom(seed).nextInt(3000)];
            new SplittableRandom(seed).nextBytes(salt);
        }

        @Override
        public byte[] compile(KernelSource source, List<String> options) {
            calls++;
            if (fail) {
                throw new KernelCompileException(source.name(), options, 6, "NVRTC_ERROR_COMPILATION",
                        source.name() + "(1): error: fake failure");
            }
            try {
                MessageDigest sha = MessageDigest.getInstance("SHA-256");
                sha.update(source.code().getBytes(StandardCharsets.UTF_8));
                sha.update(String.join(" ", options).getBytes(StandardCharsets.UTF_8));
                byte[] digest = sha.digest();
                byte[] out = Arrays.copyOf(digest, digest.length + salt.length);
                System.arraycopy(salt, 0, out, digest.length, salt.length);
                return out;
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        }

        @Override
        public String version() {
            return version;
        }
    }

    @Test
    void secondRequestIsServedFromDiskWithoutCompiling(@TempDir Path dir) {
        long seed = GpuFixture.seed("secondRequestIsServedFromDiskWithoutCompiling");
        FakeCompiler compiler = new FakeCompiler("fake 1.0", seed);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        byte[] first = cache.cubin(SOURCE, "sm_90");
        byte[] second = cache.cubin(SOURCE, "sm_90");
        assertEquals(1, compiler.calls, "seed " + seed);
        assertArrayEquals(first, second, "seed " + seed);
        assertEquals(new KernelCache.Stats(1, 1, 0), cache.stats());

        KernelCache afterRestart = new KernelCache(dir, compiler, 13000);
        assertArrayEquals(first, afterRestart.cubin(SOURCE, "sm_90"), "seed " + seed);
        assertEquals(1, compiler.calls, "a new process reuses the file; seed " + seed);
    }

    /**
     * Cache files are readable by the directory's other users (a shared cache), and temporary files a writer that
     * died left behind are removed when a cache opens, younger ones (a live writer's) kept.
     */
    @Test
    void filesAreReadableByOthersAndStaleTemporariesAreRemoved(@TempDir Path dir) throws IOException {
        FakeCompiler compiler = new FakeCompiler("fake 1.0", 1);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        cache.cubin(SOURCE, "sm_90");
        Path file = dir.resolve(cache.key(SOURCE, "sm_90", KernelCache.options("sm_90", Map.of())).fileName());
        org.junit.jupiter.api.Assumptions.assumeTrue(dir.getFileSystem().supportedFileAttributeViews().contains("posix"),
                "not a POSIX file system");
        assertEquals("rw-r--r--", java.nio.file.attribute.PosixFilePermissions.toString(
                Files.getPosixFilePermissions(file)));
        Path stale = Files.writeString(dir.resolve("x.cubin123.tmp"), "half");
        Files.setLastModifiedTime(stale, java.nio.file.attribute.FileTime.fromMillis(
                System.currentTimeMillis() - KernelCache.STALE_TEMPORARY.toMillis() - 60_000));
        Path live = Files.writeString(dir.resolve("y.cubin456.tmp"), "being written");
        new KernelCache(dir, compiler, 13000);
        assertFalse(Files.exists(stale), "a temporary older than an hour is removed");
        assertTrue(Files.exists(live), "a young one may be another process's, still writing");
        assertTrue(Files.exists(file));
    }

    @Test
    void aCachedCubinTheDriverRefusesIsCompiledAgainAndReplaced(@TempDir Path dir) throws IOException {
        long seed = GpuFixture.seed("aCachedCubinTheDriverRefusesIsCompiledAgainAndReplaced");
        FakeCompiler compiler = new FakeCompiler("fake 1.0", seed);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        byte[] good = cache.cubin(SOURCE, "sm_90");
        Path file = dir.resolve(cache.key(SOURCE, "sm_90", KernelCache.options("sm_90", Map.of())).fileName());
        // an intact file (its hash matches) whose payload the driver will not take
        byte[] refused = "not a cubin for this driver".getBytes(StandardCharsets.US_ASCII);
        Files.write(file, KernelCache.encode(refused));
        List<byte[]> offered = new java.util.ArrayList<>();
        String loaded = cache.load(SOURCE, "sm_90", Map.of(), cubin -> {
            offered.add(cubin);
            if (Arrays.equals(cubin, refused)) {
                throw new CudaException("cuModuleLoadData(axpy.cu)", 200, "CUDA_ERROR_INVALID_IMAGE",
                        "device kernel image is invalid");
            }
            return "module of " + cubin.length + " bytes";
        });
        assertEquals("module of " + good.length + " bytes", loaded, "seed " + seed);
        assertEquals(2, offered.size(), "the refused image, then the recompiled one; seed " + seed);
        assertEquals(2, compiler.calls, "seed " + seed);
        assertArrayEquals(good, KernelCache.decode(Files.readAllBytes(file)), "the file replaced; seed " + seed);
        assertEquals(new KernelCache.Stats(0, 2, 1), cache.stats(), "seed " + seed);
        cache.load(SOURCE, "sm_90", Map.of(), cubin -> cubin);
        assertEquals(new KernelCache.Stats(1, 2, 1), cache.stats(), "the replaced file serves the next load; seed "
                + seed);
    }

    @Test
    void aFreshCubinTheDriverRefusesTooIsThrownAndLeavesNoFile(@TempDir Path dir) {
        long seed = GpuFixture.seed("aFreshCubinTheDriverRefusesTooIsThrownAndLeavesNoFile");
        FakeCompiler compiler = new FakeCompiler("fake 1.0", seed);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        cache.cubin(SOURCE, "sm_90");
        Path file = dir.resolve(cache.key(SOURCE, "sm_90", KernelCache.options("sm_90", Map.of())).fileName());
        CudaException e = assertThrows(CudaException.class, () -> cache.load(SOURCE, "sm_90", Map.of(), cubin -> {
            throw new CudaException("cuModuleLoadData(axpy.cu)", 222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
                    "the provided PTX was compiled with an unsupported toolchain");
        }));
        assertEquals(222, e.code());
        assertEquals(1, e.getSuppressed().length, "the cached file's refusal rides along");
        assertEquals(2, compiler.calls, "seed " + seed);
        assertTrue(Files.notExists(file), "a refused cubin is not kept");
        KernelCache next = new KernelCache(dir, compiler, 13000);
        next.load(SOURCE, "sm_90", Map.of(), cubin -> cubin);
        assertEquals(new KernelCache.Stats(0, 1, 0), next.stats(), "a compile, no rebuild: seed " + seed);
    }

    @Test
    void aRefusalIsKnownByItsNumberWhateverItsName() {
        assertTrue(KernelCache.refusedImage(new CudaException("cuModuleLoadData", 209, "CUresult 209", "")));
        assertTrue(KernelCache.refusedImage(new CudaException("cuModuleLoadData", 200, null, null)));
        assertEquals(false, KernelCache.refusedImage(new CudaException("cuModuleLoadData", 2, null, null)));
    }

    @Test
    void anIntactFileWithAnEmptyPayloadIsCorrupt() {
        assertNull(KernelCache.decode(KernelCache.encode(new byte[0])));
    }

    @Test
    void aLoaderFailureOtherThanARefusedImageIsThrownWithoutRecompiling(@TempDir Path dir) {
        long seed = GpuFixture.seed("aLoaderFailureOtherThanARefusedImageIsThrownWithoutRecompiling");
        FakeCompiler compiler = new FakeCompiler("fake 1.0", seed);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        cache.cubin(SOURCE, "sm_90");
        CudaException e = assertThrows(CudaException.class, () -> cache.load(SOURCE, "sm_90", Map.of(), cubin -> {
            throw new CudaException("cuModuleLoadData(axpy.cu)", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory");
        }));
        assertEquals("CUDA_ERROR_OUT_OF_MEMORY", e.errorName());
        assertEquals(1, compiler.calls, "seed " + seed);
        assertEquals(new KernelCache.Stats(0, 1, 0), cache.stats(), "seed " + seed);
    }

    @Test
    void keyChangesWithSourceOptionsArchDriverAndCompiler(@TempDir Path dir) {
        FakeCompiler compiler = new FakeCompiler("fake 1.0", 1);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        List<String> sm90 = KernelCache.options("sm_90", Map.of());
        KernelCache.Key base = cache.key(SOURCE, "sm_90", sm90);

        KernelSource edited = new KernelSource(SOURCE.name(), SOURCE.code() + "\n");
        assertNotEquals(base.sourceHash(), cache.key(edited, "sm_90", sm90).sourceHash(), "source");
        assertNotEquals(base.sourceHash(), cache.key(SOURCE, "sm_90",
                KernelCache.options("sm_90", Map.of("TILE", "64"))).sourceHash(), "options");
        assertNotEquals(base.fileName(), cache.key(SOURCE, "sm_80", KernelCache.options("sm_80", Map.of())).fileName(),
                "arch");
        assertNotEquals(base.fileName(), new KernelCache(dir, compiler, 12080).key(SOURCE, "sm_90", sm90).fileName(),
                "driver");
        assertNotEquals(base.fileName(), new KernelCache(dir, new FakeCompiler("fake 1.1", 1), 13000)
                .key(SOURCE, "sm_90", sm90).fileName(), "compiler");
        assertEquals(base, cache.key(SOURCE, "sm_90", sm90), "the same inputs give the same key");
        assertEquals(64, base.sourceHash().length(), "a SHA-256 in hex");
        assertTrue(base.fileName().startsWith("axpy.cu-sm_90-cuda13000-fake_1.0-"), base.fileName());
        assertTrue(base.fileName().endsWith(".cubin"), base.fileName());
    }

    @Test
    void definesGiveTheSameCubinWhateverTheirOrder(@TempDir Path dir) {
        FakeCompiler compiler = new FakeCompiler("fake 1.0", 2);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        Map<String, String> ab = new LinkedHashMap<>();
        ab.put("A", "1");
        ab.put("B", "2");
        Map<String, String> ba = new LinkedHashMap<>();
        ba.put("B", "2");
        ba.put("A", "1");
        cache.cubin(SOURCE, "sm_90", ab);
        cache.cubin(SOURCE, "sm_90", ba);
        assertEquals(1, compiler.calls);
        assertEquals(List.of("--gpu-architecture=sm_90", "--std=c++17", "-default-device", "-DA=1", "-DB=2"),
                KernelCache.options("sm_90", ba));
    }

    @Test
    void optionsNameARealArchitectureAndRejectWhatNvrtcWouldNot() {
        assertEquals(List.of("--gpu-architecture=sm_90a", "--std=c++17", "-default-device", "-DFLAG"),
                KernelCache.options("sm_90a", Map.of("FLAG", "")));
        assertTrue(KernelCache.options("sm_90", Map.of()).stream().noneMatch(o -> o.startsWith("-O")),
                "NVRTC rejects -O3");
        IllegalArgumentException virtualArch = assertThrows(IllegalArgumentException.class,
                () -> KernelCache.options("compute_90", Map.of()));
        assertTrue(virtualArch.getMessage().contains("'compute_90' is not a real GPU architecture"),
                virtualArch.getMessage());
        assertThrows(IllegalArgumentException.class, () -> KernelCache.options("sm_90", Map.of("A B", "1")));
    }

    @Test
    void corruptFilesAreDetectedAndRebuilt(@TempDir Path dir) throws IOException {
        long seed = GpuFixture.seed("corruptFilesAreDetectedAndRebuilt");
        SplittableRandom r = new SplittableRandom(seed);
        FakeCompiler compiler = new FakeCompiler("fake 1.0", seed);
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        byte[] good = cache.cubin(SOURCE, "sm_90");
        Path file = dir.resolve(cache.key(SOURCE, "sm_90", KernelCache.options("sm_90", Map.of())).fileName());
        byte[] intact = Files.readAllBytes(file);

        Map<String, UnaryOperator<byte[]>> damages = new LinkedHashMap<>();
        damages.put("a flipped payload bit", b -> flip(b, KernelCache.HEADER_BYTES + r.nextInt(b.length - KernelCache.HEADER_BYTES)));
        damages.put("a flipped hash bit", b -> flip(b, 16 + r.nextInt(32)));
        damages.put("a wrong magic", b -> flip(b, r.nextInt(8)));
        damages.put("a wrong length", b -> flip(b, 8 + r.nextInt(8)));
        damages.put("a truncated payload", b -> Arrays.copyOf(b, KernelCache.HEADER_BYTES + r.nextInt(b.length - KernelCache.HEADER_BYTES)));
        damages.put("a truncated header", b -> Arrays.copyOf(b, r.nextInt(KernelCache.HEADER_BYTES)));
        damages.put("trailing garbage", b -> Arrays.copyOf(b, b.length + 1 + r.nextInt(100)));
        damages.put("an empty file", b -> new byte[0]);

        int rebuilt = 0;
        for (var damage : damages.entrySet()) {
            String why = damage.getKey() + "; seed " + seed;
            Files.write(file, damage.getValue().apply(intact.clone()));
            int callsBefore = compiler.calls;
            assertArrayEquals(good, cache.cubin(SOURCE, "sm_90"), why);
            assertEquals(callsBefore + 1, compiler.calls, "recompiled after " + why);
            assertEquals(++rebuilt, cache.stats().rebuilt(), why);
            assertArrayEquals(intact, Files.readAllBytes(file), "the file is whole again after " + why);
        }
        cache.cubin(SOURCE, "sm_90");
        assertEquals(rebuilt, cache.stats().rebuilt(), "an intact file is not rebuilt");
    }

    @Test
    void encodedFilesDecodeAndEveryTruncationIsRejected() {
        long seed = GpuFixture.seed("encodedFilesDecodeAndEveryTruncationIsRejected");
        byte[] payload = new byte[1 + new SplittableRandom(seed).nextInt(500)];
        new SplittableRandom(seed + 1).nextBytes(payload);
        byte[] file = KernelCache.encode(payload);
        assertEquals(KernelCache.HEADER_BYTES + payload.length, file.length);
        assertArrayEquals(payload, KernelCache.decode(file), "seed " + seed);
        for (int n = 0; n < file.length; n++) {
            assertNull(KernelCache.decode(Arrays.copyOf(file, n)), n + " bytes of " + file.length + "; seed " + seed);
        }
    }

    @Test
    void writesLeaveOnlyWholeFilesBehind(@TempDir Path dir) throws IOException {
        FakeCompiler compiler = new FakeCompiler("fake 1.0", 3);
        KernelCache cache = new KernelCache(dir.resolve("nested/cubin"), compiler, 13000);
        for (String arch : List.of("sm_80", "sm_89", "sm_90")) {
            cache.cubin(SOURCE, arch);
        }
        try (Stream<Path> files = Files.list(dir.resolve("nested/cubin"))) {
            List<String> names = files.map(p -> p.getFileName().toString()).sorted().toList();
            assertEquals(3, names.size(), names.toString());
            assertTrue(names.stream().allMatch(n -> n.endsWith(".cubin")), "no temporary files: " + names);
        }
    }

    @Test
    void compileFailurePropagatesWithItsLogAndStoresNothing(@TempDir Path dir) throws IOException {
        FakeCompiler compiler = new FakeCompiler("fake 1.0", 4);
        compiler.fail = true;
        KernelCache cache = new KernelCache(dir, compiler, 13000);
        KernelCompileException e = assertThrows(KernelCompileException.class, () -> cache.cubin(SOURCE, "sm_90"));
        assertTrue(e.getMessage().contains("axpy.cu(1): error: fake failure"), e.getMessage());
        try (Stream<Path> files = Files.list(dir)) {
            assertEquals(0, files.count());
        }
    }

    @Test
    void unwritableCacheStillReturnsTheCubin(@TempDir Path dir) throws IOException {
        Path notADirectory = Files.writeString(dir.resolve("file"), "x");
        FakeCompiler compiler = new FakeCompiler("fake 1.0", 5);
        KernelCache cache = new KernelCache(notADirectory, compiler, 13000);
        byte[] cubin = cache.cubin(SOURCE, "sm_90");
        assertArrayEquals(compiler.compile(SOURCE, KernelCache.options("sm_90", Map.of())), cubin);
        cache.cubin(SOURCE, "sm_90");
        assertEquals(3, compiler.calls, "each request compiles again, none fails");
    }

    @Test
    void defaultDirectoryIsKvantCacheDirElseUnderTheHomeCache() {
        assertEquals(Path.of("/data/cubins"), KernelCache.defaultDirectory(Map.of("KVANT_CACHE_DIR", "/data/cubins")::get, "/home/u"));
        assertEquals(Path.of("/home/u/.cache/kvant/cubin"), KernelCache.defaultDirectory(k -> null, "/home/u"));
    }

    @Test
    void kvantKernelSourcesAreOnTheClassPath() {
        for (String name : List.of("copy.cu", "fill_check.cu")) {
            KernelSource s = KernelSource.resource(name);
            assertTrue(s.code().contains("extern \"C\" __global__"), name);
            assertTrue(s.code().contains("grid:") && s.code().contains("block:") && s.code().contains("shared:"),
                    name + " states its launch geometry");
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> KernelSource.resource("missing.cu"));
        assertEquals("kernel source /dev/kvant/cuda/missing.cu is not on the class path", e.getMessage());
    }

    private static byte[] flip(byte[] b, int index) {
        b[index] ^= (byte) (1 << (index % 8));
        return b;
    }
}
