package dev.kvant.cuda.model;

import dev.kvant.cuda.CudaContext;
import dev.kvant.cuda.DeviceBuffer;
import dev.kvant.tensor.WeightMatrix;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * One or more weight matrices of the same format and width, stacked row after row and uploaded once in their
 * compressed form ({@link WeightLayout}). A stack of several is one launch where the model would make several: the
 * q, k and v projections, the gate and up projections.
 *
 * @param rowStride for the row-layout formats the bytes of a row; for the planar ones the 32-value blocks of a row
 *                  (the kernels' {@code rowBytes} argument; Q6_K's super-blocks are eight of them)
 * @param scales    byte offset of the scale plane (planar layouts), else 0
 */
record DeviceMatrix(WeightLayout layout, DeviceBuffer data, long rowStride, long scales, int rows, int cols)
        implements AutoCloseable {

    static DeviceMatrix upload(CudaContext context, WeightMatrix... parts) {
        WeightMatrix first = parts[0];
        WeightLayout layout = WeightLayout.of(first.format().type());
        int cols = first.cols();
        long rows = 0;
        for (WeightMatrix m : parts) {
            if (m.format().type() != first.format().type() || m.cols() != cols) {
                throw new IllegalArgumentException("cannot stack " + m + " under " + first
                        + ": a stack needs one format and one width");
            }
            rows += m.rows();
        }
        if (cols % 32 != 0) {
            throw new IllegalArgumentException("the CUDA kernels take matrices whose width is a multiple of 32; "
                    + first + " has " + cols + " columns");
        }
        if (rows > Integer.MAX_VALUE / 2) {
            throw new IllegalArgumentException("matrix stack of " + rows + " rows is too tall");
        }
        long rowBytes = first.rowBytes();
        if (!layout.planar) {
            DeviceBuffer data = context.allocate(Math.max(16, rowBytes * rows));
            try {
                long off = 0;
                for (WeightMatrix m : parts) {
                    MemorySegment src = m.data().asSlice(0, m.rowBytes() * m.rows());
                    data.copyFromHost(src, off);
                    off += src.byteSize();
                }
                return new DeviceMatrix(layout, data, rowBytes, 0, (int) rows, cols);
            } catch (RuntimeException | Error e) {
                data.close();
                throw e;
            }
        }
        try (Arena arena = Arena.ofConfined()) {
            // Planar: every block's quants in one plane, every block's f16 scale in another.
            int nb = cols / 32;
            long blocks = rows * (cols / layout.planeBlockValues());
            int qb = layout.planeQuantBytes();
            int scaleAt = layout.ggufScaleOffset();
            int quantsAt = scaleAt == 0 ? 2 : 0;
            long scales = blocks * qb;
            MemorySegment packed = arena.allocate(scales + blocks * 2, 16);
            long block = 0;
            for (WeightMatrix m : parts) {
                MemorySegment src = m.data();
                long n = (long) m.rows() * (cols / layout.planeBlockValues());
                for (long b = 0; b < n; b++, block++) {
                    long at = b * layout.ggufBlockBytes();
                    packed.set(ValueLayout.JAVA_SHORT_UNALIGNED, scales + block * 2,
                            src.get(ValueLayout.JAVA_SHORT_UNALIGNED, at + scaleAt));
                    MemorySegment.copy(src, at + quantsAt, packed, block * qb, qb);
                }
            }
            DeviceBuffer planes = context.allocate(packed.byteSize());
            try {
                planes.copyFromHost(packed);
            } catch (RuntimeException | Error e) {
                planes.close();
                throw e;
            }
            return new DeviceMatrix(layout, planes, nb, scales, (int) rows, cols);
        }
    }

    long byteSize() {
        return data.byteSize();
    }

    @Override
    public void close() {
        data.close();
    }
}
