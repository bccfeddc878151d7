// probe.cu: the link probe (`edgellm-allreduce-bench probe`, src/launch/probe.rs launches it):
// what the SMs get out of the link under a peer's memory or pinned host memory (NVLink, PCIe
// peer-to-peer, a GPU's own PCIe link to the host), measured with the two accesses the
// all-reduce kernels make across it. The caller chooses which side is remote; nothing here
// knows, and nothing here is part of the cross-rank contract (the parameter blocks live here,
// mirrored in src/launch/probe.rs, their sizes checked on both sides).
//
// ear_probe_copy: `bytes` from `src` to `dst`, `reps` times, 16-byte vectors over a grid-stride
// loop, each thread with EAR_PROBE_UNROLL loads in flight before its stores. Push (local src,
// remote dst) times SM stores over the link (posted writes); pull (remote src, local dst) SM
// loads (non-posted reads: each waits for its completion to come back). The host times the
// launch and divides `bytes * reps` by it. Loads are `ld.global.cv`: never from L1, and a line
// of system memory that this GPU's L2 holds is discarded and fetched again (PTX ISA, cache
// operators), so a repeat of a transfer that fits the L2 still crosses the link. Stores are the
// kernels' plain 16-byte stores.
//
// ear_probe_latency: one thread, `iters` dependent round trips between two %globaltimer reads;
// the elapsed ns go to out[0] (the host divides by iters). LOAD: pointer chasing through a ring
// of EAR_PROBE_RING_SLOTS slots, one per 128-byte line, at the start of `remote` (the kernel
// writes the ring first, so the host fills nothing): each load (`ld.global.cv`, as the copy's)
// takes its address from the previous load's value, so no two overlap and each costs one read
// round trip. STORE: an 8-byte store into
// `remote` then fence.sc.sys, which returns once the store is performed for the whole system:
// the cost of making one posted write visible. One untimed lap first (TLB, first touch).
#include <stddef.h>
#include <stdint.h>

#include "memory.cuh"

#define EAR_PROBE_THREADS 512
#define EAR_PROBE_UNROLL 4
#define EAR_PROBE_RING_SLOTS 32
#define EAR_PROBE_RING_STRIDE 128
#define EAR_PROBE_LOAD 0u
#define EAR_PROBE_STORE 1u

typedef struct {
  const void* src;
  void* dst;
  uint64_t bytes;  // a multiple of 16; src and dst 16-byte aligned
  uint64_t reps;
} EarProbeCopyParams;

typedef struct {
  uint64_t* remote;  // EAR_PROBE_RING_SLOTS * EAR_PROBE_RING_STRIDE bytes, 128-byte aligned
  uint64_t* out;     // out[0]: elapsed ns; out[1]: the chase's last slot (every load is used)
  uint32_t iters;
  uint32_t mode;  // EAR_PROBE_LOAD or EAR_PROBE_STORE
} EarProbeLatencyParams;

// The Rust mirrors (src/launch/probe.rs: CopyParams, LatencyParams, THREADS, RING_BYTES) assert
// the same figures.
static_assert(sizeof(EarProbeCopyParams) == 32 && offsetof(EarProbeCopyParams, bytes) == 16 &&
                  offsetof(EarProbeCopyParams, reps) == 24,
              "EarProbeCopyParams is mirrored by CopyParams in src/launch/probe.rs");
static_assert(sizeof(EarProbeLatencyParams) == 24 && offsetof(EarProbeLatencyParams, iters) == 16 &&
                  offsetof(EarProbeLatencyParams, mode) == 20,
              "EarProbeLatencyParams is mirrored by LatencyParams in src/launch/probe.rs");
static_assert(EAR_PROBE_RING_SLOTS * EAR_PROBE_RING_STRIDE == 4096, "RING_BYTES in src/launch/probe.rs");
static_assert(EAR_PROBE_THREADS == 512, "THREADS in src/launch/probe.rs");

namespace ear {

__device__ __forceinline__ uint4 ld_cv(const void* p) {
  uint4 v;
  asm volatile("ld.global.cv.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ uint64_t ld_cv_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// %globaltimer as memory.cuh reads it, but a compiler barrier too: no access moves across it.
__device__ __forceinline__ uint64_t clock_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

__device__ __forceinline__ void fence_sc_sys() {
  asm volatile("fence.sc.sys;" ::: "memory");
}

__device__ __forceinline__ void probe_copy(const EarProbeCopyParams& p) {
  if (((reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst) | p.bytes) & 15u) != 0u) __trap();
  const uint4* const src = static_cast<const uint4*>(p.src);
  uint4* const dst = static_cast<uint4*>(p.dst);
  const uint64_t n = p.bytes / 16u;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (uint64_t rep = 0; rep < p.reps; ++rep) {
    uint64_t i = first;
    for (; i + (EAR_PROBE_UNROLL - 1) * stride < n; i += EAR_PROBE_UNROLL * stride) {
      uint4 v[EAR_PROBE_UNROLL];
#pragma unroll
      for (int k = 0; k < EAR_PROBE_UNROLL; ++k) v[k] = ld_cv(src + i + k * stride);
#pragma unroll
      for (int k = 0; k < EAR_PROBE_UNROLL; ++k) st_vec(dst + i + k * stride, v[k]);
    }
    for (; i < n; i += stride) st_vec(dst + i, ld_cv(src + i));
  }
}

__device__ __forceinline__ void probe_latency(const EarProbeLatencyParams& p) {
  if (gridDim.x != 1u || blockDim.x != 1u || p.remote == nullptr || p.out == nullptr || p.iters == 0u ||
      (reinterpret_cast<uintptr_t>(p.remote) & (EAR_PROBE_RING_STRIDE - 1)) != 0u ||
      (p.mode != EAR_PROBE_LOAD && p.mode != EAR_PROBE_STORE))
    __trap();
  constexpr uint64_t step = EAR_PROBE_RING_STRIDE / sizeof(uint64_t);
  uint64_t* const ring = p.remote;
  uint64_t start = 0, end = 0;
  if (p.mode == EAR_PROBE_LOAD) {
    uint64_t at = 0;
    for (uint64_t s = 0; s < EAR_PROBE_RING_SLOTS; ++s)
      *reinterpret_cast<volatile uint64_t*>(ring + s * step) = ((s + 1) % EAR_PROBE_RING_SLOTS) * step;
    fence_sc_sys();
    for (int s = 0; s < EAR_PROBE_RING_SLOTS; ++s) at = ld_cv_u64(ring + at);
    start = clock_ns();
    for (uint32_t it = 0; it < p.iters; ++it) at = ld_cv_u64(ring + at);
    // Issues once the last load is back (a GPU issues in order): the clock is read after it.
    *reinterpret_cast<volatile uint64_t*>(p.out + 1) = at / step;
    end = clock_ns();
  } else {
    for (uint64_t s = 0; s < EAR_PROBE_RING_SLOTS; ++s) {
      *reinterpret_cast<volatile uint64_t*>(ring + s * step) = s;
      fence_sc_sys();
    }
    start = clock_ns();
    for (uint32_t it = 0; it < p.iters; ++it) {
      *reinterpret_cast<volatile uint64_t*>(ring + (it % EAR_PROBE_RING_SLOTS) * step) = it;
      fence_sc_sys();
    }
    end = clock_ns();
  }
  p.out[0] = end - start;
}

}  // namespace ear

extern "C" __global__ void __launch_bounds__(EAR_PROBE_THREADS)
    ear_probe_copy(const __grid_constant__ EarProbeCopyParams params) {
  ear::probe_copy(params);
}

extern "C" __global__ void __launch_bounds__(1) ear_probe_latency(const __grid_constant__ EarProbeLatencyParams params) {
  ear::probe_latency(params);
}
