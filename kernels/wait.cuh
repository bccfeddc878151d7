// wait.cuh: every wait for a peer is bounded. A rank that never launches its part of a call
// (its enqueue failed after its peers launched, it was killed, it runs other settings) would
// leave its peers spinning for ever. Instead a wait that lasts EarAllReduceParams::timeout_ns
// gives up: the kernel records the fault in its host-visible fault word, aborts the group on
// every rank (the abort word of each workspace, allreduce_params.h) and runs to its end
// without waiting any more (its output is wrong: the host reports it, docs/DESIGN.md). Every
// later call of the group, on any rank, finds its abort word set at its start (read after
// PDL's wait, so an abort by the previous kernel of its stream is seen) and does nothing;
// waits that are under way find it at their next look and give up too.
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
  unsigned long long deadline;       // 0 until the CTA's first look at the clock (atomics only)
  uint32_t gave_up;                  // the EAR_FAULT_* code once a wait of this CTA gave up (atomics only)
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
// kept). Returns our abort word to the arm thread (which reads it at begin_call), NULL to
// every other thread.
__device__ __forceinline__ uint64_t* arm_waits(const EarAllReduceParams& p) {
  if (!is_arm_thread()) return nullptr;
  WaitContext& w = wait_context();
  w.params = &p;  // before begin_call's __syncthreads, as the two zeros: no look reads them sooner
  w.deadline = 0;
  w.gave_up = 0;
  return abort_word(p.peer_ws[p.rank]);  // check_params vetted the rank
}

// After begin_call's __syncthreads: a call of an aborted group does nothing. Thread 0 records
// why, and the whole CTA exits (every thread read the same value).
__device__ __forceinline__ void bail_if_aborted(uint64_t aborted) {
  if (aborted == 0u) return;
  if (threadIdx.x == 0) record_fault(*wait_context().params, abort_fault(aborted));
  asm volatile("exit;");
}

}  // namespace ear
