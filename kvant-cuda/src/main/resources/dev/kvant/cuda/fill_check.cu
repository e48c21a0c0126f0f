// Pattern kernels for tests: every element gets a value derived from its own index, so a skipped, duplicated or
// shifted write is visible, and a check can tell which element went wrong. The host reference is
// FillPattern.value(i, seed) in the tests; both compute the same 32-bit integer arithmetic, so results match bit
// for bit.
//
// All three kernels:
// grid:   1-D, any size (grid-stride loop).
// block:  1-D, any size (256 in the tests).
// shared: none.
// thread: handles elements i, i + stride, i + 2·stride, ... independently.

// The pattern value of element i: a 32-bit mix (an xorshift-multiply finaliser) of both halves of the index and
// the seed. Any change to one input bit changes about half the output bits.
__device__ __forceinline__ unsigned int kvant_pattern(unsigned long long i, unsigned int seed) {
    unsigned int x = (unsigned int) i ^ ((unsigned int) (i >> 32) * 0x9E3779B9u) ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

// out[i] = pattern(i, seed) for i < n.
extern "C" __global__ void kvant_fill_pattern(unsigned int* __restrict__ out, long long n, unsigned int seed) {
    KVANT_GRID_ENTER();
    const long long stride = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = kvant_pattern((unsigned long long) i, seed);
    }
}

// Counts the elements with in[i] != pattern(i, seed) into *mismatches (one atomic per mismatch: cheap when the
// data is right, which is the case worth being fast for).
extern "C" __global__ void kvant_check_pattern(const unsigned int* __restrict__ in, long long n, unsigned int seed,
                                               unsigned long long* __restrict__ mismatches) {
    KVANT_GRID_ENTER();
    const long long stride = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (in[i] != kvant_pattern((unsigned long long) i, seed)) {
            atomicAdd(mismatches, 1ull);
        }
    }
}

// data[i] = data[i] * 16777619 + pattern(i, seed), wrapping mod 2^32: each application changes every element in
// a way that depends on the previous value, so k replays of a graph holding this kernel are told apart from k - 1.
extern "C" __global__ void kvant_mix_pattern(unsigned int* __restrict__ data, long long n, unsigned int seed) {
    KVANT_GRID_ENTER();
    const long long stride = (long long) gridDim.x * blockDim.x;
    for (long long i = (long long) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        data[i] = data[i] * 16777619u + kvant_pattern((unsigned long long) i, seed);
    }
}
