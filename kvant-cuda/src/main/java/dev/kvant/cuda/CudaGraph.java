package dev.kvant.cuda;

import java.lang.foreign.MemorySegment;

/**
 * Device work captured once from a stream and replayed with one launch: the whole sequence of kernels goes to the
 * GPU in a single call, so a decode step costs one launch of host overhead instead of hundreds.
 *
 * <p>What capture records: each kernel with the argument values it was launched with (device addresses included)
 * and each async copy/memset. Nothing runs during capture. So everything a step reads that changes between replays
 * (positions, lengths) must live in device memory the kernels read, and the buffers must stay where they were
 * (see {@link DevicePool}). Capture uses {@link CaptureMode#GLOBAL} by default: any unsafe call made meanwhile, such
 * as cuMemAlloc or a synchronous copy on the legacy stream, fails loudly instead of silently breaking the graph.
 */
public final class CudaGraph implements AutoCloseable {
    /** cuStreamBeginCapture's CUstreamCaptureMode. */
    public enum CaptureMode {
        /** Unsafe API calls fail in every thread while the capture is under way. */
        GLOBAL(CudaDriver.CAPTURE_MODE_GLOBAL),
        /** Unsafe API calls fail in the capturing thread only. */
        THREAD_LOCAL(CudaDriver.CAPTURE_MODE_THREAD_LOCAL),
        /** No checks. */
        RELAXED(CudaDriver.CAPTURE_MODE_RELAXED);

        final int value;

        CaptureMode(int value) {
            this.value = value;
        }
    }

    private final CudaContext context;
    private final MemorySegment exec;
    private boolean closed;

    private CudaGraph(CudaContext context, MemorySegment exec) {
        this.context = context;
        this.exec = exec;
    }

    /** Captures the work {@code body} queues on {@code stream} (global mode) and instantiates it. */
    public static CudaGraph capture(CudaStream stream, Runnable body) {
        return capture(stream, CaptureMode.GLOBAL, body);
    }

    public static CudaGraph capture(CudaStream stream, CaptureMode mode, Runnable body) {
        if (stream.isLegacyDefault()) {
            throw new IllegalArgumentException("the legacy default stream cannot be captured; capture a stream from "
                    + "CudaContext.createStream()");
        }
        CudaContext context = stream.context();
        CudaDriver driver = context.driver();
        context.makeCurrent();
        driver.streamBeginCapture(stream.handle(), mode.value);
        MemorySegment graph;
        try {
            body.run();
        } catch (RuntimeException | Error e) {
            try {
                MemorySegment partial = driver.streamEndCapture(stream.handle());
                if (!partial.equals(MemorySegment.NULL)) {
                    driver.graphDestroy(partial);
                }
            } catch (RuntimeException suppressed) {
                e.addSuppressed(suppressed);
            }
            throw e;
        }
        graph = driver.streamEndCapture(stream.handle());
        try {
            return new CudaGraph(context, driver.graphInstantiateWithFlags(graph, 0));
        } finally {
            // The executable graph is independent of the graph it was made from.
            driver.graphDestroy(graph);
        }
    }

    /** Queues one replay of the whole graph on {@code stream}. */
    public void launch(CudaStream stream) {
        if (closed) {
            throw new IllegalStateException("CUDA graph was launched after close()");
        }
        context.makeCurrent();
        context.driver().graphLaunch(exec, stream.handle());
    }

    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        context.release(() -> context.driver().graphExecDestroy(exec));
    }
}
