// vectors.cuh: what every family computes with: 16-byte vectors of E elements, the fp32
// reduction in rank order (the reason every rank's result is bit-identical), messages as
// vectors with element-wise tails, access to the by-value params, and the batched grid-stride
// loops that keep several loads in flight per thread.
#pragma once

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "allreduce_params.h"
#include "memory.cuh"
#include "wait.cuh"

namespace ear {

// ---------------------------------------------------------------------------------------
// Element types: 16-byte vectors of E elements, accumulated in fp32.
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr int E = 4;
  using Bits = uint32_t;
  __device__ static __forceinline__ void add(float (&acc)[E], const uint4& v) {
    acc[0] += __uint_as_float(v.x);
    acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z);
    acc[3] += __uint_as_float(v.w);
  }
  __device__ static __forceinline__ uint4 pack(const float (&acc)[E]) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]),
                      __float_as_uint(acc[2]), __float_as_uint(acc[3]));
  }
};

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t bf16_bits(float x) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}
template <>
struct Elem<__nv_bfloat16> {
  static constexpr int E = 8;
  using Bits = uint16_t;
  __device__ static __forceinline__ void add2(float* acc, uint32_t w) {
    acc[0] += bf16_lo(w);
    acc[1] += bf16_hi(w);
  }
  __device__ static __forceinline__ void add(float (&acc)[E], const uint4& v) {
    add2(acc + 0, v.x);
    add2(acc + 2, v.y);
    add2(acc + 4, v.z);
    add2(acc + 6, v.w);
  }
  __device__ static __forceinline__ uint32_t pack2(const float* a) {
    return bf16_bits(a[0]) | (bf16_bits(a[1]) << 16);
  }
  __device__ static __forceinline__ uint4 pack(const float (&acc)[E]) {
    return make_uint4(pack2(acc + 0), pack2(acc + 2), pack2(acc + 4), pack2(acc + 6));
  }
};

__device__ __forceinline__ float f16_at(uint32_t w, int shift) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> shift)));
}
__device__ __forceinline__ uint32_t f16_bits(float x) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(x)));
}
template <>
struct Elem<__half> {
  static constexpr int E = 8;
  using Bits = uint16_t;
  __device__ static __forceinline__ void add2(float* acc, uint32_t w) {
    acc[0] += f16_at(w, 0);
    acc[1] += f16_at(w, 16);
  }
  __device__ static __forceinline__ void add(float (&acc)[E], const uint4& v) {
    add2(acc + 0, v.x);
    add2(acc + 2, v.y);
    add2(acc + 4, v.z);
    add2(acc + 6, v.w);
  }
  __device__ static __forceinline__ uint32_t pack2(const float* a) {
    return f16_bits(a[0]) | (f16_bits(a[1]) << 16);
  }
  __device__ static __forceinline__ uint4 pack(const float (&acc)[E]) {
    return make_uint4(pack2(acc + 0), pack2(acc + 2), pack2(acc + 4), pack2(acc + 6));
  }
};

// The canonical reduction every family uses: fp32, accumulator starting at +0.0f, ranks
// added in order 0..N-1, one rounding to T at the end. Same inputs give the same bits on
// every rank and in every family. Starting at +0.0f makes the result independent of the
// sign of zero inputs (+0 + -0 = +0), which lets Lamport rewrite +0 words as -0.
template <typename T, int N>
__device__ __forceinline__ uint4 reduce_in_rank_order(const uint4 (&v)[N]) {
  float acc[Elem<T>::E];
#pragma unroll
  for (int e = 0; e < Elem<T>::E; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int r = 0; r < N; ++r) Elem<T>::add(acc, v[r]);
  return Elem<T>::pack(acc);
}

// ---------------------------------------------------------------------------------------
// Messages are handled as vecs = ceil(count / E) 16-byte vectors; the last one may be
// partial. Partial vectors are loaded element-wise and padded with +0 bits, and stored
// element-wise, so nothing past `count` is ever read from input or written to output.
template <typename T>
__device__ __forceinline__ uint64_t vec_count(uint64_t count) {
  return (count + Elem<T>::E - 1) / Elem<T>::E;
}

// The first `valid` elements (fewer than a vector's, or none) of a partial vector, moved one
// by one, +0 bits after them: tails of a message, and rows that are not 16-byte aligned.
template <typename T>
__device__ __forceinline__ uint4 load_elems(const typename Elem<T>::Bits* src, uint64_t valid) {
  constexpr int E = Elem<T>::E;
  union {
    uint4 v;
    typename Elem<T>::Bits b[E];
  } u;
  u.v = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e < valid) u.b[e] = src[e];
  return u.v;
}
template <typename T>
__device__ __forceinline__ void store_elems(typename Elem<T>::Bits* dst, uint64_t valid, uint4 v) {
  constexpr int E = Elem<T>::E;
  union {
    uint4 v;
    typename Elem<T>::Bits b[E];
  } u;
  u.v = v;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e < valid) dst[e] = u.b[e];
}

template <typename T>
__device__ __forceinline__ uint4 load_input(const void* in, uint64_t vi, uint64_t count) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint64_t first = vi * E;
  if (first + E <= count) return ld_plain(static_cast<const char*>(in) + vi * 16);
  return load_elems<T>(static_cast<const B*>(in) + first, first < count ? count - first : 0);
}

template <typename T>
__device__ __forceinline__ void store_output(void* out, uint64_t vi, uint64_t count, uint4 v) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint64_t first = vi * E;
  if (first + E <= count) {
    *reinterpret_cast<uint4*>(static_cast<char*>(out) + vi * 16) = v;
    return;
  }
  store_elems<T>(static_cast<B*>(out) + first, first < count ? count - first : 0, v);
}

// ---------------------------------------------------------------------------------------
// Params access. peer_ws is indexed only with compile-time indices or through this select
// chain, so the by-value params never get copied to local memory.
template <int N>
__device__ __forceinline__ char* peer_base(const EarAllReduceParams& p, int q) {
  char* b = static_cast<char*>(p.peer_ws[0]);
#pragma unroll
  for (int r = 1; r < N; ++r)
    if (q == r) b = static_cast<char*>(p.peer_ws[r]);
  return b;
}

__device__ __forceinline__ char* data_region(void* ws) {
  return static_cast<char*>(ws) + EAR_SIGNAL_BYTES;
}

__device__ __forceinline__ uint64_t* signal_slot(void* ws, int block, int src_rank) {
  return static_cast<uint64_t*>(ws) + static_cast<uint64_t>(block) * EAR_MAX_RANKS + src_rank;
}

// The 16-byte {value, pointer} entry [block][src_rank] of the pointer slots.
__device__ __forceinline__ uint64_t* pointer_slot(void* ws, int block, int src_rank) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(ws) + EAR_POINTER_SLOTS_OFFSET) +
         2u * (static_cast<uint64_t>(block) * EAR_MAX_RANKS + src_rank);
}

// Traps on a broken launch contract instead of corrupting memory or hanging peers.
// any_block: any multiple of 32 up to EAR_BLOCK_THREADS (Lamport), else exactly that.
template <typename T, int N>
__device__ __forceinline__ void check_params(const EarAllReduceParams& p, uint64_t max_bytes,
                                             bool any_block = false) {
  const bool block_ok = any_block ? blockDim.x % 32u == 0 && blockDim.x <= EAR_BLOCK_THREADS
                                  : blockDim.x == EAR_BLOCK_THREADS;
  if (p.nranks != N || p.rank < 0 || p.rank >= N || gridDim.x > EAR_MAX_BLOCKS || !block_ok ||
      p.count * sizeof(T) > max_bytes)
    __trap();
}

// One 16-byte vector from each of N ranks (a batch element of batched_for).
template <int N>
struct Ranks {
  uint4 v[N];
};

// Vector i of every rank r from from[r] (a rank's input read in place, or its workspace copy:
// indexed alike, the copy's last vector zero-padded as load_input pads it), through L2. Whether
// vector i is whole is asked once, not per rank: a branch per load keeps the N loads from
// being issued together.
template <typename T, int N>
__device__ __forceinline__ Ranks<N> load_ranks_cg(const void* const* from, uint64_t i, uint64_t count) {
  constexpr int E = Elem<T>::E;
  Ranks<N> v;
  if (i * E + E <= count) {
#pragma unroll
    for (int r = 0; r < N; ++r) v.v[r] = ld_cg(static_cast<const char*>(from[r]) + i * 16);
  } else {
#pragma unroll
    for (int r = 0; r < N; ++r) v.v[r] = load_input<T>(from[r], i, count);
  }
  return v;
}

// Iterations per batch: pure copies keep 4 vectors in flight per thread; reductions keep
// N per iteration, so fewer iterations as N grows (registers: 4 * N * batch).
constexpr int kCopyBatch = 4;
template <int N>
constexpr int kReduceBatch = N <= 2 ? 4 : N <= 4 ? 2 : 1;

// ---------------------------------------------------------------------------------------
// Batched grid-stride loops. Every load/store helper above is an asm volatile with a memory
// clobber, which keeps the compiler from hoisting the next iteration's load above this
// iteration's store: a plain loop has one load in flight per thread. These issue up to U
// iterations' loads before the first use. Item i = first + u*stride.
// The poll of data that is complete once loaded (after a barrier, or local).
struct Arrived {
  template <typename I, typename V>
  __device__ bool operator()(I, const V&) const {
    return true;
  }
};

// The loads of one batch, all issued before any is used: v[u] = load(i0 + u*stride) for
// the items < n.
template <int U, typename V, typename Load>
__device__ __forceinline__ void load_batch(V (&v)[U], uint64_t i0, uint64_t stride, uint64_t n, Load load) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i0 + u * stride < n) v[u] = load(i0 + u * stride);
}

// One batch: items i0 + u*stride < n (u < U). poll(i, v) (Lamport): one polling step of item
// i, true once it has arrived; a batch's items are stepped together until all have (or the
// wait gives up, wait.cuh), before the first use.
template <int U, typename Load, typename Poll, typename Use>
__device__ __forceinline__ void batch_step(uint64_t i0, uint64_t stride, uint64_t n, Load load, Poll poll,
                                           Use use) {
  decltype(load(uint64_t{0})) v[U];
  load_batch(v, i0, stride, n, load);
  bool done;
  Waiting wait;
  do {
    done = true;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < n) done = poll(i0 + u * stride, v[u]) && done;
  } while (!done && wait.keep_on());
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i0 + u * stride < n) use(i0 + u * stride, v[u]);
}
// batch_step for data that has mostly arrived (the two-shot's stage): the batch's loads are
// issued together, then item by item: wait for that item alone, use it. A use then waits
// only for its own loads, not the whole batch's (on 2 x H200 the two-shot took 16.0 us at
// 4 MiB and 29.1 at 8 MiB this way, 16.7 and 31.2 with the batch polled together).
template <int U, typename Load, typename Poll, typename Use>
__device__ __forceinline__ void batch_step_each(uint64_t i0, uint64_t stride, uint64_t n, Load load, Poll poll,
                                                Use use) {
  decltype(load(uint64_t{0})) v[U];
  load_batch(v, i0, stride, n, load);
  Waiting wait;  // one for the batch
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i0 + u * stride < n) {
      while (!poll(i0 + u * stride, v[u]) && wait.keep_on()) {
      }
      use(i0 + u * stride, v[u]);
    }
}
template <int U, typename Load, typename Poll, typename Use>
__device__ __forceinline__ void batched_for_polled(uint64_t first, uint64_t stride, uint64_t n,
                                                   Load load, Poll poll, Use use) {
  for (uint64_t i0 = first; i0 < n; i0 += U * stride) batch_step<U>(i0, stride, n, load, poll, use);
}
template <int U, typename Load, typename Use>
__device__ __forceinline__ void batched_for(uint64_t first, uint64_t stride, uint64_t n,
                                            Load load, Use use) {
  batched_for_polled<U>(first, stride, n, load, Arrived{}, use);
}

// batched_for split in two: the first batch's loads (load_batch), issued early, e.g. before
// read_call's state read so that the two latencies overlap; then the rest (for_rest: the
// first batch's uses, then the remaining batches).
template <int U, typename V, typename Load, typename Use>
__device__ __forceinline__ void for_rest(const V (&head)[U], uint64_t first, uint64_t stride,
                                         uint64_t n, Load load, Use use) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (first + u * stride < n) use(first + u * stride, head[u]);
  batched_for<U>(first + U * stride, stride, n, load, use);
}

}  // namespace ear
