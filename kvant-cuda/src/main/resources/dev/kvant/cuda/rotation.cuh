// rotation.cuh — the randomized Walsh-Hadamard rotation of the turbo formats (docs/KV_FORMATS.md) on the device, in
// the CPU's float operations and order, shared by the attention modules (quantize on write, queries, outputs) and
// the model module (kvant_rope_split rotates a prefill's queries, kvant_to_half_unrotated turns its attention output
// back). Follows a header generated in Java (dev.kvant.cuda.attention.RotationSource) that defines the constant
// tables kv_rot_sign and kv_rot_scale from dev.kvant.kv.Rotation.

// The rotation block of a head of d values: 128 where d is a multiple of 128, else 64.
__host__ __device__ constexpr int rot_block(int d) { return d % 128 == 0 ? 128 : 64; }

// One block of N values rotated in place (forward: D1, H/sqrt(N), D2) or back (inverse: D2, H/sqrt(N), D1) by one
// warp: lane l holds element 32j + l in x[j]. Butterfly distances 1..16 cross lanes (__shfl_xor_sync), 32 and 64
// cross registers of one lane, so no shared memory is needed. The stages run in the CPU kernel's order (distance
// 1, 2, 4, ..., N/2), each butterfly is (a, b) -> (a + b, a - b) with a the lower index, and the last stage is
// followed by the multiplication with D_post * fl(1/sqrt(N)): exactly the float operations of
// dev.kvant.kv.Rotation, so the rotated values are bitwise the CPU's.
template <int N>
__device__ __forceinline__ void wht_block(float* x, int lane, bool inverse) {
    constexpr int R = N / 32;
    constexpr int ni = N == 128 ? 1 : 0;
    const int pre = inverse ? 1 : 0;
    const int post = inverse ? 0 : 1;
#pragma unroll
    for (int j = 0; j < R; j++) {
        if ((kv_rot_sign[ni][pre][j] >> lane) & 1u) x[j] = -x[j];
    }
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            float y = __shfl_xor_sync(0xffffffffu, x[j], h);
            x[j] = (lane & h) ? __fsub_rn(y, x[j]) : __fadd_rn(x[j], y);
        }
    }
#pragma unroll
    for (int h = 1; h < R; h <<= 1) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            if (!(j & h)) {
                float a = x[j], b = x[j + h];
                x[j] = __fadd_rn(a, b);
                x[j + h] = __fsub_rn(a, b);
            }
        }
    }
    const float sc = kv_rot_scale[ni];
#pragma unroll
    for (int j = 0; j < R; j++) {
        x[j] = __fmul_rn(x[j], ((kv_rot_sign[ni][post][j] >> lane) & 1u) ? -sc : sc);
    }
}

// A head row of D values (x[j] = element 32j + lane) rotated block by block.
template <int D>
__device__ __forceinline__ void wht_row(float* x, int lane, bool inverse) {
    constexpr int N = rot_block(D);
#pragma unroll
    for (int b = 0; b < D / N; b++) wht_block<N>(x + b * (N / 32), lane, inverse);
}
