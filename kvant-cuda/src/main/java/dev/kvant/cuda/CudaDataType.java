package dev.kvant.cuda;

/** Element types of cuBLASLt matrices, with their {@code cudaDataType_t} values (library_types.h). */
public enum CudaDataType {
    F32(0, 4),
    F16(2, 2),
    BF16(14, 2);

    final int value;
    private final int bytes;

    CudaDataType(int value, int bytes) {
        this.value = value;
        this.bytes = bytes;
    }

    /** Bytes per element. */
    public int bytes() {
        return bytes;
    }
}
