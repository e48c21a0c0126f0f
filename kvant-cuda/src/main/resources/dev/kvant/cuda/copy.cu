// kvant_copy16 — dst[i] = src[i] for n16 16-byte words: the device copy-bandwidth probe, and the simplest kernel
// that proves the Java → NVRTC → cubin → cuLaunchKernel chain end to end.
//
// grid:   1-D, any size; DeviceCopy launches min(ceil(n16 / 256), 8 blocks per SM) — enough resident warps to keep
//         every memory channel busy, few enough that the grid-stride loop amortises the block start-up.
// block:  1-D, 256 threads.
// shared: none.
// thread: moves one 16-byte word per iteration of a grid-stride loop (one 128-bit load, one 128-bit store), so a
//         warp moves 512 contiguous bytes per iteration: fully coalesced.
// exact:  a copy; src and dst must be 16-byte aligned and must not overlap (__restrict__).

extern "C" __global__ void kvant_copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n16) {
    KVANT_GRID_ENTER();
    const long long stride = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) {
        dst[i] = src[i];
    }
}
