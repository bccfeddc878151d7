// wait.cuh: every wait for a peer is bounded. A rank that never launches its part of a call
// (its enqueue failed after its peers launched, it was killed, it runs other settings) would
// leave its peers spinning for ever. Instead a wait that lasts EarAllReduceParams::timeout_ns
// gives up: the kernel records the fault in its host-visible fault word, aborts the group on
// every rank (the abort word of each workspace, allreduce_params.h) and runs to its end
// without waiting any more. Every later call of the group, on any rank, finds its abort word
// set at its start (read after PDL's wait, so an abort by the previous kernel of its stream is
// seen) and does nothing more; waits that are under way find it at their next look and give
// up too.
//
// A call that failed must not look like one that succeeded: a CTA that gave up, or that found
// its group aborted, overwrites the call's whole outputs with NaN (every byte 0xFF: a NaN in
// f32, f16 and bf16 alike) as its last act, after its own stores (poison_outputs). A CTA that
// did not give up only ever stores correct sums. So after a failed call every element of the
// output is NaN or the correct value, never a partial sum, a rank's own input or what the
// buffer held before; NaN propagates through the layers that follow, and the host reports the
// fault (docs/DESIGN.md). Whole outputs, not a CTA's share: which elements a CTA stores depends
// on the family, and the failure path may be slow.
//
// The fast path pays a compare: after an unsuccessful poll a spin loop reads the SM's cycle
// counter and compares it with its wait's next look, held in a register (Waiting): no memory
// access. Only every kCyclesPerLook cycles does a wait look at the abort word and the clock
// (%globaltimer). A wait shorter than that never looks; the CTA's first look sets its deadline;
// once a wait of the CTA gave up, every wait of the CTA gives up at its next look, so a kernel
// that gave up ends soon. The words the CTA's threads share (the deadline, whether one gave up)
// are touched only by looks, and only with atomics: the threads race on them by design, and
// plain accesses made those races undefined (compute-sanitizer's racecheck reported them).
#pragma once

#include <stdint.h>

#include "allreduce_params.h"
#include "memory.cuh"

namespace ear {

// SM cycles between two looks: 2^16, 30-60 us at 1-2 GHz. A look costs a load of the abort
// word and a read of %globaltimer: nothing next to that, and nothing next to the bound.
constexpr long long kCyclesPerLook = 1ll << 16;

// What the waits of one CTA need to give up, filled by arm_waits at the start of a call. The
// rest (bound, fault word, generation, every rank's abort word) is read from the kernel's
// parameters, a __grid_constant__ that looks reach through a pointer: arming stays a few
// stores by one thread (filling the abort words of 16 ranks here cost a 2-rank 8 KiB call
// 0.2-0.4 us of its 1.7, one H200, simulated ranks).
struct WaitContext {
  const EarAllReduceParams* params;  // the kernel's own parameters
  const EarFusedParams* fused;       // the fused op's (its two outputs), NULL for a plain all-reduce
  unsigned long long deadline;       // 0 until the CTA's first look at the clock (atomics only)
  uint32_t gave_up;                  // the EAR_FAULT_* code once a wait of this CTA gave up (atomics
                                     // only, until the CTA's last barrier: poison_if_gave_up)
  uint32_t elem_bytes;               // bytes per element of the outputs
};

__device__ __forceinline__ WaitContext& wait_context() {
  __shared__ WaitContext ctx;
  return ctx;
}

// A workspace's abort word (allreduce_params.h).
__device__ __forceinline__ uint64_t* abort_word(void* ws) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(ws) + EAR_ABORT_OFFSET);
}

// The fault that a set abort word means: RELEASED when the host released the group, else
// ABORTED (a peer gave up).
__device__ __forceinline__ uint32_t abort_fault(uint64_t aborted) {
  return aborted == EAR_FAULT_RELEASED ? EAR_FAULT_RELEASED : EAR_FAULT_ABORTED;
}

// Writes generation << 8 | code into the fault word unless it already holds a fault of this
// generation: the first fault is the cause, the aborts it triggers on other CTAs come after.
__device__ __forceinline__ void record_fault(const EarAllReduceParams& p, uint32_t code) {
  if (p.fault == nullptr) return;
  __threadfence_system();  // with the abort word's release: a fault that caused it is seen here
  if ((ld_volatile_u64(p.fault) >> 8) != p.generation)
    st_release_sys(p.fault, (static_cast<uint64_t>(p.generation) << 8) | code);
}

// A wait of this CTA gives up. The first one records why; a timeout also aborts the group on
// every rank (the release orders the fault word before the abort words: a CTA that is aborted
// by them finds this fault recorded and leaves it).
__device__ __forceinline__ void give_up(WaitContext& w, uint32_t code) {
  if (atomicCAS(&w.gave_up, 0u, code) != 0u) return;
  const EarAllReduceParams& p = *w.params;
  record_fault(p, code);
  if (code == EAR_FAULT_TIMEOUT)
    for (int q = 0; q < p.nranks; ++q) st_release_sys(abort_word(p.peer_ws[q]), EAR_FAULT_ABORTED);
}

// The look, every kCyclesPerLook cycles of a wait: false once the CTA gave up, the group is
// aborted or the deadline passed.
__device__ __forceinline__ bool still_patient() {
  WaitContext& w = wait_context();
  if (atomicOr(&w.gave_up, 0u) != 0u) return false;
  const EarAllReduceParams& p = *w.params;
  const uint64_t aborted = ld_volatile_u64(abort_word(p.peer_ws[p.rank]));
  if (aborted != 0u) {  // by a peer that gave up (ABORTED), or by the host (RELEASED)
    give_up(w, abort_fault(aborted));
    return false;
  }
  if (p.timeout_ns == 0u) return true;
  const unsigned long long now = globaltimer();
  const unsigned long long deadline = atomicCAS(&w.deadline, 0ull, now + p.timeout_ns);  // the first look sets it
  if (deadline == 0ull || now < deadline) return true;
  give_up(w, EAR_FAULT_TIMEOUT);
  return false;
}

// One wait: declared where it starts, asked between two polls that have not seen the data.
struct Waiting {
  long long next_look;
  __device__ __forceinline__ Waiting() { next_look = clock64() + kCyclesPerLook; }
  // True to poll again.
  __device__ __forceinline__ bool keep_on() {
    if (clock64() < next_look) return true;
    next_look = clock64() + kCyclesPerLook;
    return still_patient();
  }
};

// The thread that arms a CTA's waits and reads our abort word: thread 0 of warp 1 when the CTA
// has one, so that it runs beside warp 0, whose thread 0 reads the call counters meanwhile (a
// warp runs its branches one after the other).
__device__ __forceinline__ bool is_arm_thread() { return threadIdx.x == (blockDim.x >= 64u ? 32u : 0u); }

// Start of a call (open_call, sync.cuh: before PDL's wait, so that it also overlaps the
// previous kernel). `p` must be the kernel's __grid_constant__ parameters (a pointer to them is
// kept). Returns our abort word to the arm thread (which reads it in read_call), NULL to
// every other thread.
// `fused`: the fused op's parameters when `p` is their all-reduce part (their outputs are the
// ones a failed call poisons), else NULL; `elem_bytes`: the element size of the outputs.
__device__ __forceinline__ uint64_t* arm_waits(const EarAllReduceParams& p, const EarFusedParams* fused,
                                               uint32_t elem_bytes) {
  if (!is_arm_thread()) return nullptr;
  WaitContext& w = wait_context();
  w.params = &p;  // before read_call's __syncthreads, as the zeros: no look reads them sooner
  w.fused = fused;
  w.deadline = 0;
  w.gave_up = 0;
  w.elem_bytes = elem_bytes;
  return abort_word(p.peer_ws[p.rank]);  // check_params vetted the rank
}

// Fills `bytes` bytes at `out` (16-byte aligned, the launch rule) with 0xFF, the CTA's threads
// striding over all of it.
__device__ __forceinline__ void fill_nan(void* out, uint64_t bytes) {
  if (out == nullptr) return;
  const uint4 nan = make_uint4(~0u, ~0u, ~0u, ~0u);
  const uint64_t vecs = bytes / 16u;
  for (uint64_t i = threadIdx.x; i < vecs; i += blockDim.x) reinterpret_cast<uint4*>(out)[i] = nan;
  for (uint64_t i = vecs * 16u + threadIdx.x; i < bytes; i += blockDim.x) static_cast<uint8_t*>(out)[i] = 0xFFu;
}

// The failed call's outputs, all of them, NaN: the all-reduce's output, or the fused op's
// normed and residual outputs. Every thread of the CTA takes part. Out of line: the fast path
// keeps its registers.
__device__ __noinline__ void poison_outputs() {
  const WaitContext& w = wait_context();
  if (w.fused != nullptr) {
    const uint64_t bytes = w.fused->tokens * w.fused->hidden * w.elem_bytes;
    fill_nan(w.fused->normed, bytes);
    fill_nan(w.fused->residual_out, bytes);
  } else {
    fill_nan(w.params->output, w.params->count * w.elem_bytes);
  }
}

// After begin_call's __syncthreads: a call of an aborted group does nothing but poison its
// outputs. Thread 0 records why, and the whole CTA exits (every thread read the same value).
__device__ __forceinline__ void bail_if_aborted(uint64_t aborted) {
  if (aborted == 0u) return;
  if (threadIdx.x == 0) record_fault(*wait_context().params, abort_fault(aborted));
  poison_outputs();
  asm volatile("exit;");
}

// The end of every call, reached by every thread of the CTA: if one of its waits gave up, the
// outputs become NaN after every store of this call (the barrier orders them). The barrier also
// ends the looks, so gave_up is read plainly here.
__device__ __forceinline__ void poison_if_gave_up() {
  __syncthreads();
  if (wait_context().gave_up != 0u) poison_outputs();
}

}  // namespace ear
