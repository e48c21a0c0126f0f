package dev.kvant.cuda;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;

/**
 * CUDA C++ source of one compilation unit.
 *
 * @param name a file name for logs and the cache, e.g. {@code copy.cu}
 * @param code the source text
 */
public record KernelSource(String name, String code) {
    /** Where kvant's kernels live on the class path. */
    public static final String RESOURCE_FOLDER = "/dev/kvant/cuda/";

    public KernelSource {
        if (name.isBlank()) {
            throw new IllegalArgumentException("a kernel source needs a name");
        }
    }

    /** One of kvant's kernels, {@code src/main/resources/dev/kvant/cuda/<fileName>}. */
    public static KernelSource resource(String fileName) {
        String path = RESOURCE_FOLDER + fileName;
        try (InputStream in = KernelSource.class.getResourceAsStream(path)) {
            if (in == null) {
                throw new IllegalArgumentException("kernel source " + path + " is not on the class path");
            }
            return new KernelSource(fileName, new String(in.readAllBytes(), StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new UncheckedIOException("kernel source " + path + " could not be read", e);
        }
    }
}
