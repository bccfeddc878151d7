// memory.cuh: how the kernels touch memory another rank may write, and in which order:
// L1-bypassing loads, one-instruction 16-byte stores, sys-scope release/acquire flag accesses,
// programmatic dependent launch and named CTA barriers. Every helper is an asm volatile with a
// memory clobber: the compiler keeps them in program order.
#pragma once

#include <stdint.h>

namespace ear {

// Memory access helpers. Everything another rank writes during a call is read with
// L1-bypassing loads (.cg / .volatile): L1 is not coherent, and a line of a peer's buffer
// left in L1 by an earlier call would be stale.

__device__ __forceinline__ uint4 ld_cg(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Input loads: plain (L1-allocating) is fine, nobody else writes our input during a call.
// Not .nc: the input may alias the output we write.
__device__ __forceinline__ uint4 ld_plain(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ uint4 ld_volatile(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// One 16-byte store instruction (Lamport relies on a 16-byte store never being split below
// 4-byte granularity; every word is checked anyway).
__device__ __forceinline__ void st_vec(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// 16-byte atomics (sm_90+): a value and a pointer published and read as one
// (cta_barrier_sharing, sync.cuh).
__device__ __forceinline__ void exch_b128_relaxed_sys(uint64_t* p, uint64_t lo, uint64_t hi) {
  asm volatile(
      "{ .reg .b128 d, b; mov.b128 b, {%1, %2}; atom.relaxed.sys.global.exch.b128 d, [%0], b; }" ::"l"(p), "l"(lo),
      "l"(hi)
      : "memory");
}
__device__ __forceinline__ void exch_b128_release_sys(uint64_t* p, uint64_t lo, uint64_t hi) {
  asm volatile(
      "{ .reg .b128 d, b; mov.b128 b, {%1, %2}; atom.release.sys.global.exch.b128 d, [%0], b; }" ::"l"(p), "l"(lo),
      "l"(hi)
      : "memory");
}
template <bool Acquire>
__device__ __forceinline__ void read_b128_sys(const uint64_t* p, uint64_t& lo, uint64_t& hi) {
  // A compare-and-swap of {0, 0} with {0, 0}: changes nothing, returns the 16 bytes atomically.
  if (Acquire)
    asm volatile(
        "{ .reg .b128 d, c; mov.b128 c, {%2, %2}; atom.acquire.sys.global.cas.b128 d, [%3], c, c; mov.b128 {%0, %1}, d; }"
        : "=l"(lo), "=l"(hi)
        : "l"(uint64_t{0}), "l"(p)
        : "memory");
  else
    asm volatile(
        "{ .reg .b128 d, c; mov.b128 c, {%2, %2}; atom.relaxed.sys.global.cas.b128 d, [%3], c, c; mov.b128 {%0, %1}, d; }"
        : "=l"(lo), "=l"(hi)
        : "l"(uint64_t{0}), "l"(p)
        : "memory");
}
#endif

__device__ __forceinline__ uint64_t ld_volatile_u64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}

// Nanoseconds of the GPU's global timer (the clock of the bounded waits, kernels/wait.cuh).
__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---------------------------------------------------------------------------------------
// Programmatic dependent launch. Harmless when the host did not set the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Named CTA barriers (id 0 is __syncthreads'): `threads` threads take part, whole warps.
// bar.arrive does not wait; like bar.sync it orders the caller's earlier memory accesses
// before the barrier completes for every participant (PTX ISA, barrier).
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace ear
