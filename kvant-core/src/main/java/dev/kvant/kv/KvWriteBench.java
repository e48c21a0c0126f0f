package dev.kvant.kv;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.management.ManagementFactory;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

/**
 * Quantize-on-write throughput of every format on one thread: rows (one kv head of one token) per second through
 * {@link KvFormat#encode} (decode-time writes, a row at a time), {@link KvFormat#encodeRows} (prefill) and
 * {@link KvFormat#decode}. Usage: {@code KvWriteBench [headDim] [seconds per measurement] [format,format,...]}.
 */
public final class KvWriteBench {
    private static final int ROWS = 4096;
    private static volatile float sink;

    private KvWriteBench() {
    }

    public static void main(String[] args) {
        int headDim = args.length > 0 ? Integer.parseInt(args[0]) : 128;
        double seconds = args.length > 1 ? Double.parseDouble(args[1]) : 1.0;
        List<KvFormat> formats = args.length > 2
                ? Arrays.stream(args[2].split(",")).map(KvFormat::parse).toList() : KvFormat.all();
        float[][] rows = KvEval.gaussianRows(ROWS, headDim, 7);
        float[] flat = new float[ROWS * headDim];
        for (int r = 0; r < ROWS; r++) {
            System.arraycopy(rows[r], 0, flat, r * headDim, headDim);
        }
        System.out.printf(Locale.ROOT, "kv-format v%d quantize-on-write, head_dim %d, one thread, %d float lanes, %s%n",
                KvFormat.VERSION, headDim, KvLanes.L, System.getProperty("java.vm.version"));
        System.out.printf(Locale.ROOT, "%-8s %9s %16s %16s %16s   %s%n", "format", "bytes/row", "encode rows/s",
                "encodeRows rows/s", "decode rows/s", "heap bytes allocated per row (encode/encodeRows/decode)");
        try (Arena arena = Arena.ofConfined()) {
            for (KvFormat f : formats) {
                long rb = f.rowBytes(headDim);
                MemorySegment seg = arena.allocate(rb * ROWS, 64);
                float[] out = new float[f.domainDim(headDim)];
                Runnable single = () -> {
                    for (int r = 0; r < ROWS; r++) {
                        f.encode(flat, r * headDim, headDim, seg, r * rb);
                    }
                };
                Runnable batch = () -> f.encodeRows(flat, 0, ROWS, headDim, seg, 0, rb);
                Runnable decode = () -> {
                    for (int r = 0; r < ROWS; r++) {
                        f.decode(seg, r * rb, headDim, out, 0);
                    }
                    sink += out[0];
                };
                // Warm all three paths first, long enough for C2: until it compiles a kernel, the Vector API runs
                // as plain Java, 100x slower. On a loaded machine C2 can take seconds to get to it.
                long warm = System.nanoTime() + (long) (Math.max(3, 2 * seconds) * 1e9);
                while (System.nanoTime() < warm) {
                    single.run();
                    batch.run();
                    decode.run();
                }
                double[] s = rowsPerSecond(single, seconds);
                double[] b = rowsPerSecond(batch, seconds);
                double[] d = rowsPerSecond(decode, seconds);
                System.out.printf(Locale.ROOT, "%-8s %9d %16.3e %16.3e %16.3e   %.0f/%.0f/%.0f%n", f.name(), rb, s[0], b[0],
                        d[0], s[1], b[1], d[1]);
            }
        }
    }

    /** Rows per second and heap bytes allocated per row, over whole passes of ROWS rows, after a short warm-up. */
    private static double[] rowsPerSecond(Runnable pass, double seconds) {
        long warm = System.nanoTime() + (long) (seconds / 3 * 1e9);
        while (System.nanoTime() < warm) {
            pass.run();
        }
        long allocated = allocatedBytes();
        long start = System.nanoTime();
        long end = start + (long) (seconds * 1e9);
        long passes = 0;
        long now;
        do {
            pass.run();
            passes++;
            now = System.nanoTime();
        } while (now < end);
        double rows = passes * (double) ROWS;
        return new double[] {rows / ((now - start) / 1e9), (allocatedBytes() - allocated) / rows};
    }

    private static long allocatedBytes() {
        return ManagementFactory.getThreadMXBean() instanceof com.sun.management.ThreadMXBean t
                ? t.getCurrentThreadAllocatedBytes() : 0;
    }
}
