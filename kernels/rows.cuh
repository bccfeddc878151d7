// rows.cuh: token rows of the fused all-reduce + residual (+ bias) + RMSNorm kernels
// (fused.cuh): exact unpacking to fp32, row chunks with element-wise tails, and the
// fixed-order CTA sum of the norm.
#pragma once

#include "vectors.cuh"

namespace ear {

template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float (&f)[Elem<T>::E]);
template <>
__device__ __forceinline__ void unpack<float>(const uint4& v, float (&f)[4]) {
  f[0] = __uint_as_float(v.x);
  f[1] = __uint_as_float(v.y);
  f[2] = __uint_as_float(v.z);
  f[3] = __uint_as_float(v.w);
}
template <>
__device__ __forceinline__ void unpack<__half>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = f16_at(w[e], 0);
    f[2 * e + 1] = f16_at(w[e], 16);
  }
}
template <>
__device__ __forceinline__ void unpack<__nv_bfloat16>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = bf16_lo(w[e]);
    f[2 * e + 1] = bf16_hi(w[e]);
  }
}

// Chunk k of token row `row` of a [rows, hidden] tensor: elements [k*E, k*E + E) of the row,
// +0 bits past `hidden`. `vec_ok` (hidden * sizeof(T) % 16 == 0, base 16-byte aligned)
// allows one 16-byte access per full chunk; otherwise elements are moved one by one (rows
// are then not 16-byte aligned). Nothing past the row is read or written. Row 0 with
// vec_ok = true serves [hidden] vectors (gamma, bias).
template <typename T>
__device__ __forceinline__ uint4 load_row_chunk(const void* base, uint64_t row, uint32_t hidden,
                                                uint32_t k, bool vec_ok) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint32_t first = k * E;
  const uint64_t at = row * hidden + first;
  if (vec_ok && first + E <= hidden) return ld_plain(static_cast<const B*>(base) + at);
  return load_elems<T>(static_cast<const B*>(base) + at, first < hidden ? hidden - first : 0u);
}

template <typename T>
__device__ __forceinline__ void store_row_chunk(void* base, uint64_t row, uint32_t hidden,
                                                uint32_t k, bool vec_ok, uint4 v) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint32_t first = k * E;
  const uint64_t at = row * hidden + first;
  if (vec_ok && first + E <= hidden) {
    *reinterpret_cast<uint4*>(static_cast<B*>(base) + at) = v;
    return;
  }
  store_elems<T>(static_cast<B*>(base) + at, first < hidden ? hidden - first : 0u, v);
}

// Sum of `v` over the CTA (blockDim.x a multiple of 32, <= EAR_FUSED_MAX_THREADS), the same
// value in every thread. Fixed order for a given blockDim: xor butterfly inside each warp
// (a + b == b + a, so every lane ends with the same bits), then warp 0..W-1 in order from
// +0.0f. Same blockDim and inputs -> same bits on every rank. Safe to call repeatedly.
// The CTA barrier comes first (it also keeps the previous call's readers off part[]): warps
// that shuffle while others of the CTA still poll or load were slow. On 2 x H200 the fused
// Lamport took 3.93 / 6.67 / 10.9 us at 1 x 4096 / 32 x 8192 / 128 x 8192 with the shuffles
// first, 3.54 / 5.96 / 10.2 with a barrier before them (docs/PERFORMANCE.md).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[EAR_FUSED_MAX_THREADS / 32];
  __syncthreads();
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.0f;
  const uint32_t warps = blockDim.x >> 5;
  for (uint32_t w = 0; w < warps; ++w) t += part[w];
  return t;
}

}  // namespace ear

// ear_<FAMILY>_<TNAME>_n<N>(EarFusedParams) running BODY<T, N> on every CTA (*_norm.cu).
#define EAR_DEFINE_FUSED_KERNEL(FAMILY, BODY, TNAME, T, N)                                 \
  extern "C" __global__ void __launch_bounds__(EAR_FUSED_MAX_THREADS, 1)                    \
      ear_##FAMILY##_##TNAME##_n##N(const __grid_constant__ EarFusedParams params) {        \
    BODY<T, N>(params);                                                                     \
  }
