package dev.kvant.cuda.attention;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.CudaStream;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.cuda.Owned;
import dev.kvant.cuda.PinnedBuffer;
import dev.kvant.kv.KvSequence;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.Objects;

/**
 * The sequences of one batch as the device kernels read them: page tables {@code int32 [maxSeqs][maxPages]}
 * (logical page to physical page, as {@link KvSequence#page}) and lengths {@code int32 [maxSeqs]} (tokens in the
 * cache, the new ones included). Both live in device memory at fixed addresses, so a graph captured once replays
 * with whatever tables and lengths were uploaded before the replay.
 *
 * <p>Edits go to page-locked host staging; {@link #upload} copies the staging to the device on a stream.
 */
public final class DeviceBatch implements AutoCloseable {
    private final int maxSeqs;
    private final int maxPages;
    private final PinnedBuffer staging;
    private final DeviceBuffer device;
    private final DeviceBuffer tables;
    private final DeviceBuffer lengths;

    private DeviceBatch(CudaContext context, int maxSeqs, int maxPages) {
        if (maxSeqs < 1 || maxPages < 1) {
            throw new IllegalArgumentException("a device batch needs maxSeqs >= 1 and maxPages >= 1, got " + maxSeqs
                    + " and " + maxPages);
        }
        this.maxSeqs = maxSeqs;
        this.maxPages = maxPages;
        long tableBytes = Math.multiplyExact(4L * maxSeqs, (long) maxPages);
        long bytes = tableBytes + 4L * maxSeqs;
        this.staging = context.allocatePinned(bytes);
        staging.segment().fill((byte) 0);
        try {
            this.device = context.allocate(bytes);
        } catch (RuntimeException | Error e) {
            Owned.closeAfter(e, staging);
            throw e;
        }
        this.tables = device.slice(0, tableBytes);
        this.lengths = device.slice(tableBytes, 4L * maxSeqs);
    }

    public static DeviceBatch allocate(CudaContext context, int maxSeqs, int maxPages) {
        return new DeviceBatch(context, maxSeqs, maxPages);
    }

    /** Sets sequence {@code index}: its first {@code pageCount} page ids and its length in tokens. */
    public void set(int index, int[] pages, int pageCount, int length) {
        Objects.checkIndex(index, maxSeqs);
        if (pageCount > maxPages || pageCount > pages.length) {
            throw new IllegalArgumentException("sequence " + index + " has " + pageCount + " pages; the batch holds "
                    + maxPages + " per sequence");
        }
        MemorySegment s = staging.segment();
        for (int p = 0; p < pageCount; p++) {
            s.setAtIndex(ValueLayout.JAVA_INT, (long) index * maxPages + p, pages[p]);
        }
        setLength(index, length);
    }

    /** Sets sequence {@code index} from a host sequence's page table and length. */
    public void set(int index, KvSequence seq) {
        int[] pages = new int[seq.pageCount()];
        for (int p = 0; p < pages.length; p++) {
            pages[p] = seq.page(p);
        }
        set(index, pages, pages.length, seq.length());
    }

    public void setLength(int index, int length) {
        Objects.checkIndex(index, maxSeqs);
        if (length < 0) {
            throw new IllegalArgumentException("sequence " + index + " cannot have length " + length);
        }
        staging.segment().setAtIndex(ValueLayout.JAVA_INT, (long) maxSeqs * maxPages + index, length);
    }

    /** Queues the copy of tables and lengths to the device on {@code stream}. */
    public void upload(CudaStream stream) {
        device.copyFromHostAsync(staging.segment(), 0, stream);
    }

    /** Copies tables and lengths to the device and waits. */
    public void upload() {
        device.copyFromHost(staging.segment());
    }

    public DeviceBuffer tables() {
        return tables;
    }

    public DeviceBuffer lengths() {
        return lengths;
    }

    /** Ints between the page tables of consecutive sequences. */
    public int tableStride() {
        return maxPages;
    }

    public int maxSeqs() {
        return maxSeqs;
    }

    public int maxPages() {
        return maxPages;
    }

    /** The page table of one sequence (a slice of {@link #tables()}). */
    DeviceBuffer table(int index) {
        Objects.checkIndex(index, maxSeqs);
        return tables.slice(4L * index * maxPages, 4L * maxPages);
    }

    @Override
    public void close() {
        device.close();
        staging.close();
    }
}
