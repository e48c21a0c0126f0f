package dev.kvant.gguf;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.channels.FileChannel;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;

/**
 * A GGUF model file (versions 2 and 3, little-endian), memory-mapped and validated as a whole when opened: after
 * {@link #open} or {@link #of} succeeds, every tensor's bytes lie inside the file, are aligned, do not overlap, and
 * match the tensor's type and shape. Tensor data is never copied; {@link #data} hands out read-only slices of the
 * mapping, valid until {@link #close}.
 *
 * <p>Thread-safe: the mapping lives in a shared arena and nothing changes after opening.
 */
public final class GgufFile implements AutoCloseable {
    private final String name;
    private final MemorySegment bytes;
    private final Arena arena; // null when the caller owns the memory (of)
    private final int version;
    private final int alignment;
    private final long dataOffset;
    private final GgufMetadata metadata;
    private final List<GgufTensorInfo> tensors;
    private final Map<String, GgufTensorInfo> byName;

    private GgufFile(String name, MemorySegment bytes, Arena arena) {
        GgufParser.Header h = GgufParser.parse(name, bytes);
        this.name = name;
        this.bytes = bytes.asReadOnly();
        this.arena = arena;
        this.version = h.version();
        this.alignment = h.alignment();
        this.dataOffset = h.dataOffset();
        this.metadata = new GgufMetadata(name, h.metadata());
        this.tensors = h.tensors();
        Map<String, GgufTensorInfo> m = new LinkedHashMap<>();
        for (GgufTensorInfo t : tensors) {
            m.put(t.name(), t);
        }
        this.byName = m;
    }

    /** Maps {@code path} read-only and validates it; the mapping is released by {@link #close}. */
    public static GgufFile open(Path path) {
        String name = path.toString();
        if (Files.isDirectory(path)) {
            throw new GgufException("GGUF " + name + ": is a directory, not a file");
        }
        if (Files.exists(path) && !Files.isRegularFile(path)) {
            // a named pipe or a device: opening a pipe waits for a writer, mapping one cannot work
            throw new GgufException("GGUF " + name + ": is not a regular file");
        }
        Arena arena = Arena.ofShared();
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ)) {
            MemorySegment mapped = ch.map(FileChannel.MapMode.READ_ONLY, 0, ch.size(), arena);
            return new GgufFile(name, mapped, arena);
        } catch (NoSuchFileException e) {
            arena.close();
            throw new GgufException("GGUF " + name + ": no such file", e);
        } catch (AccessDeniedException e) {
            arena.close();
            throw new GgufException("GGUF " + name + ": permission denied", e);
        } catch (IOException e) {
            arena.close();
            throw new GgufException("GGUF " + name + ": cannot read the file: " + e.getMessage(), e);
        } catch (RuntimeException | Error e) {
            arena.close();
            throw e;
        }
    }

    /**
     * Parses an in-memory image (e.g. from {@link GgufWriter#writeToSegment}) with the same validation as
     * {@link #open}. The caller keeps ownership of {@code bytes}: {@link #close} does not free it.
     */
    public static GgufFile of(MemorySegment bytes, String displayName) {
        return new GgufFile(displayName, bytes, null);
    }

    /** The file path or display name, as used in every error message. */
    public String name() {
        return name;
    }

    public int version() {
        return version;
    }

    /** The alignment of tensor data: {@code general.alignment}, or 32 when absent. */
    public int alignment() {
        return alignment;
    }

    public GgufMetadata metadata() {
        return metadata;
    }

    /** All tensors, in file order. */
    public List<GgufTensorInfo> tensors() {
        return tensors;
    }

    public Optional<GgufTensorInfo> tensor(String tensorName) {
        return Optional.ofNullable(byName.get(tensorName));
    }

    public GgufTensorInfo requireTensor(String tensorName) {
        GgufTensorInfo t = byName.get(tensorName);
        if (t == null) {
            throw new GgufException("GGUF " + name + ": tensor '" + tensorName + "' is missing");
        }
        return t;
    }

    /** The tensor's bytes: a read-only slice of the mapping, exactly {@code t.byteSize()} long. */
    public MemorySegment data(GgufTensorInfo t) {
        if (!t.equals(byName.get(t.name()))) {
            throw new GgufException("GGUF " + name + ": tensor " + t + " does not belong to this file");
        }
        return bytes.asSlice(t.offset(), t.byteSize());
    }

    /** Shorthand for {@code data(requireTensor(tensorName))}. */
    public MemorySegment data(String tensorName) {
        return data(requireTensor(tensorName));
    }

    /** Absolute offset of the (aligned) tensor data section. */
    public long dataOffset() {
        return dataOffset;
    }

    /** Size of the whole file in bytes. */
    public long byteSize() {
        return bytes.byteSize();
    }

    /** Releases the mapping (for {@link #open}); every segment from {@link #data} becomes inaccessible. */
    @Override
    public void close() {
        if (arena != null && arena.scope().isAlive()) {
            arena.close();
        }
    }

    /**
     * A summary for humans (the CLI's {@code info}): version, sizes, counts, and bytes per tensor type, e.g.
     * <pre>
     * GGUF v3 tinycode-f16.gguf: 58,885,376 bytes, 23 metadata keys, 75 tensors, data at byte 130,304 (alignment 32)
     *   F32          17 tensors             34,816 bytes
     *   F16          58 tensors         58,720,256 bytes
     * </pre>
     */
    public String describe() {
        Map<GgmlType, long[]> perType = new EnumMap<>(GgmlType.class);
        for (GgufTensorInfo t : tensors) {
            long[] c = perType.computeIfAbsent(t.type(), k -> new long[2]);
            c[0]++;
            c[1] += t.byteSize();
        }
        StringBuilder s = new StringBuilder(String.format(Locale.ROOT,
                "GGUF v%d %s: %,d bytes, %,d metadata keys, %,d tensors, data at byte %,d (alignment %d)",
                version, name, byteSize(), metadata.size(), tensors.size(), dataOffset, alignment));
        perType.forEach((type, c) -> s.append(String.format(Locale.ROOT, "%n  %-8s %,6d tensors %,18d bytes",
                type, c[0], c[1])));
        return s.toString();
    }

    @Override
    public String toString() {
        return "GgufFile[" + name + ", v" + version + ", " + metadata.size() + " keys, " + tensors.size()
                + " tensors]";
    }
}
