package dev.kvant.cuda;

/**
 * Whether the CUDA backend can run in this process, and if not, why. Returned by {@link Cuda#available()}.
 *
 * @param ok            true where libcuda.so.1 loaded, cuInit succeeded and at least one device exists
 * @param reason        what was found ("2 devices, driver 13.0") or what stands in the way, in words a user can act on
 * @param driverVersion the driver's CUDA version as cuDriverGetVersion reports it (13000 for 13.0); 0 when unknown
 * @param deviceCount   the number of CUDA devices; 0 when unknown or none
 */
public record CudaAvailability(boolean ok, String reason, int driverVersion, int deviceCount) {

    static CudaAvailability unavailable(String reason) {
        return new CudaAvailability(false, reason, 0, 0);
    }
}
