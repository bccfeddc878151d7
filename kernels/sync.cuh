// sync.cuh: how ranks and calls order each other: the local state block and its call counters
// (advanced only in-kernel: CUDA-graph safe), the cross-rank flags in the signal slots, the
// per-CTA cross-rank barrier, and the start and end of a call.
#pragma once

#include "memory.cuh"
#include "vectors.cuh"
#include "wait.cuh"

namespace ear {

// ---------------------------------------------------------------------------------------
// Local state block (EAR_STATE_BYTES, zero-filled once by the host): EAR_MAX_BLOCKS
// identical copies of the call counters, one per CTA index. CTA b reads copy b and, in the
// same call, writes the advanced counters into copies b, b + grid, b + 2*grid, ... (see
// write_next_counters): every copy is written once per call, by exactly one CTA, and no CTA
// reads a copy another CTA of the call writes. So there is no cross-CTA arrival count, no
// atomic, and nothing to do at the end of a call, and grids may change freely between calls.
// The next call reads the copies after griddepcontrol.wait (or the kernel boundary), i.e. after
// this grid completed and its writes are visible.
struct State {
  // One-shot and two-shot calls (plain and fused) completed on this workspace. Call `seq`
  // uses flag values flag_value(seq, i) (i < kFlagsPerCall: its barriers or chunks in
  // order), one-shot bank seq % 2 and two-shot stage parity seq % 2. Identical on every
  // rank because every rank issues the same call sequence.
  uint64_t seq;
  // Lamport calls completed; call `lam_seq` writes buffer lam_seq % 3.
  uint64_t lam_seq;
  // Vectors per row the previous Lamport call wrote (what this call must clear).
  uint64_t lam_prev_vecs;
  uint64_t pad_;
};
static_assert(sizeof(State) * EAR_MAX_BLOCKS <= EAR_STATE_BYTES, "State copies must fit EAR_STATE_BYTES");

// ---------------------------------------------------------------------------------------
// Cross-rank flags. slot[b][r] of rank q's signal region is written only by CTA b of rank r.
// Values are 64-bit and only ever increase on every slot: call `seq` publishes
// flag_value(seq, 0), flag_value(seq, 1), ... in order, so a slot left behind by an older
// call or a larger grid is always smaller than what a later call waits for (no ABA when
// grids or sizes change), and a peer that is one flag or one call ahead may overwrite our
// slot with a larger value without making us miss it (the wait is >=, not ==). 64 bits
// never wrap (2^58 calls).
constexpr uint32_t kFlagsPerCall = 64;
__device__ __forceinline__ uint64_t flag_value(uint64_t seq, uint32_t i) {
  return seq * kFlagsPerCall + i + 1;
}

// Lane q < N, q != rank, of the calling threads: publishes `value` into rank q's
// slot[blockIdx.x][rank] (st.release.sys: every write this thread has observed, e.g. the
// CTA's through a bar.sync, is ordered before it) and spins on our slot[blockIdx.x][q]
// until it holds a value >= `value` (ld.relaxed.sys, then one ld.acquire.sys), or gives up
// (wait.cuh). Other lanes return at once. Returns false when this lane gave up.
template <int N>
__device__ __forceinline__ bool flag_exchange(const EarAllReduceParams& p, uint64_t value, int q) {
  if (q < N && q != p.rank) {
    st_release_sys(signal_slot(peer_base<N>(p, q), blockIdx.x, p.rank), value);
    const uint64_t* mine = signal_slot(peer_base<N>(p, p.rank), blockIdx.x, q);
    // Spin relaxed, then acquire once: an ld.acquire invalidates the SM's L1 (CCTL.IVALL)
    // at every poll, under the feet of the CTA's other warps. The acquire load reads the
    // value the relaxed one saw or a later one of the same writer (coherence), so it
    // synchronizes with the peer's release all the same.
    Waiting wait;
    while (ld_relaxed_sys(mine) < value && wait.keep_on()) {
    }
    return ld_acquire_sys(mine) >= value;
  }
  return true;
}

// Cross-rank barrier of CTA blockIdx.x with the CTAs of the same index on every rank.
// Promise: everything this CTA wrote before the call (to any rank's memory) is visible to
// the same-index CTA of every peer after its barrier, and vice versa. flag_exchange between
// two __syncthreads: the first orders the CTA's writes before the publishing threads', the
// second hands their acquire to the whole CTA.
template <int N>
__device__ __forceinline__ void cta_barrier(const EarAllReduceParams& p, uint64_t value) {
  __syncthreads();
  flag_exchange<N>(p, value, static_cast<int>(threadIdx.x));
  __syncthreads();
}

// One-way cross-rank handoff of CTA blockIdx.x (the staged push, push.cuh): after a
// __syncthreads, thread 0 publishes `value` into rank `dst`'s slot[blockIdx.x][rank]
// (st.release.sys: the CTA's writes so far, to any rank, are ordered before it), while one
// thread of another warp (when the CTA has two) spins on our slot[blockIdx.x][src] until it holds
// a value >= `value` (relaxed, then one acquire, as flag_exchange), or gives up (wait.cuh); the
// second __syncthreads hands that acquire to the whole CTA. Two threads, so that the poll
// overlaps the release, which waits until the SM's stores have been performed. Orders our writes
// before dst's reads and src's writes before what the CTA does next: no more.
template <int N>
__device__ __forceinline__ void cta_handoff(const EarAllReduceParams& p, int dst, int src, uint64_t value) {
  __syncthreads();
  if (threadIdx.x == 0) st_release_sys(signal_slot(peer_base<N>(p, dst), blockIdx.x, p.rank), value);
  if (threadIdx.x == (blockDim.x > 32u ? 32u : 0u)) {
    const uint64_t* mine = signal_slot(peer_base<N>(p, p.rank), blockIdx.x, src);
    Waiting wait;
    while (ld_relaxed_sys(mine) < value && wait.keep_on()) {
    }
    ld_acquire_sys(mine);
  }
  __syncthreads();
}

// Whether this call's ranks tell each other where to read their inputs (a one-shot, or a 4+ rank
// two-shot, of a group living in one process, on sm_90 or newer: EAR_CALL_POINTERS, set by the
// host on every rank of the call or on none; the 2-rank two-shot, twoshot.cu, pushes and ignores
// it). Other calls use cta_barrier and the copies.
template <int N>
__device__ __forceinline__ bool exchanges_pointers(const EarAllReduceParams& p) {
#if __CUDA_ARCH__ >= 900
  return (p.flags & EAR_CALL_POINTERS) != 0u;
#else
  return false;  // the exchange needs 16-byte atomics
#endif
}

// Whether peers read our input in place this call: the host lets them (EAR_CALL_INPUT_SHARED)
// and the call exchanges pointers. `in_place_ok`: the kernel's own condition (the one-shot
// writes its output while peers still read, so not when output == input).
template <int N>
__device__ __forceinline__ bool shares_input(const EarAllReduceParams& p, bool in_place_ok) {
  return exchanges_pointers<N>(p) && (p.flags & EAR_CALL_INPUT_SHARED) != 0u && in_place_ok;
}

// cta_barrier of a call that exchanges pointers (exchanges_pointers): it also tells each peer
// where to read our input this call, `ours` (our input when peers read it in place, else NULL:
// our workspace's copy), and learns where to read theirs, theirs[q] (shared memory; NULL: the
// copy, and always for ourselves). Lane q writes {value, ours} into peer q's
// pointer_slot[blockIdx.x][rank] as ONE 16-byte atomic, so a peer never sees a value with
// another call's pointer, and spins on our pointer_slot[blockIdx.x][q] until its value is >=
// `value`. In place nothing else is published (the input was written before the call began,
// by kernels that completed), so the exchange is relaxed: no fence (1.5 us at 4 ranks and 1
// MiB, docs/PERFORMANCE.md), and read without an acquire. A copy publishes the copy,
// released, and is read with one acquire. Reading: value == `value`:
// the peer's pointer for this call. value > `value`: the peer has already moved on to its next
// call, which a peer that shares its input cannot do before we are done with it (the one-shot's
// cta_inputs_done, the two-shot's second barrier), so it did not share: its copy, which it has
// not overwritten (bank seq % 2, its next call writes the other). A wait that gave up: the
// copy, never a stale pointer.
template <int N>
__device__ __forceinline__ void cta_barrier_sharing(const EarAllReduceParams& p, uint64_t value, const void* ours,
                                                    const void** theirs) {
  __syncthreads();
  const int q = static_cast<int>(threadIdx.x);
  if (q < N) theirs[q] = nullptr;
#if __CUDA_ARCH__ >= 900
  if (q < N && q != p.rank) {
    uint64_t* const slot = pointer_slot(peer_base<N>(p, q), blockIdx.x, p.rank);
    if (ours != nullptr) exch_b128_relaxed_sys(slot, value, reinterpret_cast<uint64_t>(ours));
    else exch_b128_release_sys(slot, value, 0u);
    const uint64_t* const mine = pointer_slot(peer_base<N>(p, p.rank), blockIdx.x, q);
    uint64_t seen = 0, where = 0;
    read_b128_sys<false>(mine, seen, where);
    Waiting wait;
    while (seen < value && wait.keep_on()) read_b128_sys<false>(mine, seen, where);
    // Spun relaxed (see flag_exchange). An input in place was published relaxed: nothing to
    // acquire. A copy (or a peer that moved on: its exchanges are read-modify-writes, so a
    // later one still carries the copy's release) takes one acquire read.
    if (seen == value && where != 0) {
      theirs[q] = reinterpret_cast<const void*>(where);
    } else if (seen >= value) {
      read_b128_sys<true>(mine, seen, where);
      if (seen == value) theirs[q] = reinterpret_cast<const void*>(where);
    }
  }
#endif
  __syncthreads();
}

// End of a one-shot call that read peers' inputs in place, or let peers read ours
// (oneshot.cu): a call must not complete before every peer is done with its input, as the
// engine may overwrite it as soon as it does. Lane q tells peer q that this CTA is done with
// q's input when theirs[q] says it read it in place (`value` into q's
// slot[blockIdx.x][rank]), and, when peers read ours (`ours_read`), waits until peer q's
// same-index CTA has told us so. Relaxed, no fence: what it orders are our loads of q's input,
// and each of them returned before the __syncthreads (the CTA stored what they loaded before
// it), so none can be answered by a write q makes after seeing the flag. A release would
// also wait for our output's stores, which nobody needs (1.5 us at 4 ranks and 1 MiB).
template <int N>
__device__ __forceinline__ void cta_inputs_done(const EarAllReduceParams& p, uint64_t value, bool ours_read,
                                                const void* const* theirs) {
  __syncthreads();
  const int q = static_cast<int>(threadIdx.x);
  if (q < N && q != p.rank) {
    if (theirs[q] != nullptr) st_relaxed_sys(signal_slot(peer_base<N>(p, q), blockIdx.x, p.rank), value);
    if (ours_read) {
      const uint64_t* mine = signal_slot(peer_base<N>(p, p.rank), blockIdx.x, q);
      Waiting wait;
      while (ld_relaxed_sys(mine) < value && wait.keep_on()) {
      }
    }
  }
}

// The counters of a call, and what the call leaves for the next one.
struct CallCounters {
  uint64_t seq, lam_seq, lam_prev_vecs;
};

// Start of a call, before anything reads what the previous kernel wrote: arms the CTA's
// bounded waits (wait.cuh), then waits for the previous kernel (PDL). Arming depends on no
// memory, so with PDL it overlaps that kernel's tail. Returns our abort word to the thread that
// reads it in read_call, NULL to the others.
// `fused`: the fused op's parameters (`p` is their all-reduce part), whose outputs a failed
// call poisons; T: the element type (wait.cuh).
template <typename T>
__device__ __forceinline__ uint64_t* open_call(const EarAllReduceParams& p, const EarFusedParams* fused = nullptr) {
  uint64_t* const ours = arm_waits(p, fused, sizeof(T));
  pdl_wait();
  return ours;
}

// After open_call: thread 0 reads copy blockIdx.x of the counters and the arm thread (of
// another warp when the CTA has two: one round trip to memory for both) our abort word; both
// are broadcast (a call of an aborted group ends here, wait.cuh). Returns the call's counters;
// the caller then hands the next call its counters with write_next_counters, once, on every
// path that does not end here. The abort word is read after PDL's wait, so that an abort by the
// previous kernel of the stream is seen here.
__device__ __forceinline__ CallCounters read_call(const EarAllReduceParams& p, const uint64_t* ours) {
  __shared__ CallCounters s;
  __shared__ uint64_t aborted;
  CallCounters mine{};
  uint64_t abort_seen = 0;
  if (threadIdx.x == 0) {  // the loads first (one line), then the shared stores that wait for them
    const State* const copy = static_cast<const State*>(p.state) + blockIdx.x;
    mine = CallCounters{ld_volatile_u64(&copy->seq), ld_volatile_u64(&copy->lam_seq), ld_volatile_u64(&copy->lam_prev_vecs)};
  }
  if (ours != nullptr) abort_seen = ld_volatile_u64(ours);
  if (threadIdx.x == 0) s = mine;
  if (ours != nullptr) aborted = abort_seen;
  __syncthreads();
  bail_if_aborted(aborted);
  return s;
}

__device__ __forceinline__ void write_copy(State* dst, const CallCounters& n) {
  dst->seq = n.seq;
  dst->lam_seq = n.lam_seq;
  dst->lam_prev_vecs = n.lam_prev_vecs;
}

// The counters of the next call, `n`, into this CTA's copies (see State): copies
// blockIdx.x + j*gridDim.x, thread j first, then strided by blockDim.x; thread 0 rewrites the
// copy it read itself in read_call. Stores only, nothing waits for them; every thread of the
// CTA calls it, before finish_call. A Lamport call writes them after its push and clear, which
// they would otherwise delay (2 ranks, 8 KiB: 3.88-3.91 -> 3.71 us, one H100, simulated ranks).
// Contiguous ranges per CTA were 0.1-0.2 us slower in the barrier kernels (same run:
// docs/runs/2026-12-06-h100-counters-ab.txt, "Design choices" in docs/PERFORMANCE.md).
__device__ __forceinline__ void write_next_counters(const EarAllReduceParams& p, const CallCounters& n) {
  State* const st = static_cast<State*>(p.state);
  for (uint32_t copy = blockIdx.x + threadIdx.x * gridDim.x; copy < EAR_MAX_BLOCKS; copy += blockDim.x * gridDim.x)
    write_copy(st + copy, n);
}

// read_call, then the next call's counters next(c) handed on at once: the calls that wait for
// their peers before they store anything (the barrier families).
template <typename F>
__device__ __forceinline__ CallCounters begin_call(const EarAllReduceParams& p, const uint64_t* ours, F next) {
  const CallCounters c = read_call(p, ours);
  write_next_counters(p, next(c));
  return c;
}

// Advances of the two counter families.
__device__ __forceinline__ CallCounters next_barrier_call(CallCounters c) {
  ++c.seq;
  return c;
}
__device__ __forceinline__ CallCounters next_lamport_call(CallCounters c, uint64_t vecs) {
  ++c.lam_seq;
  c.lam_prev_vecs = vecs;
  return c;
}

// End of a call: let the dependent launch start (its griddepcontrol.wait still waits for
// this grid to complete and flush). No fence: see State. Then, if a wait of this CTA gave up,
// the call's outputs become NaN (wait.cuh); every thread of the CTA must get here.
__device__ __forceinline__ void finish_call() {
  pdl_trigger();
  poison_if_gave_up();
}

// The same trigger, earlier: once this CTA waits on no peer any more (what is left is local
// work, or loads of data known to have arrived). It is as safe as finish_call's: when every
// CTA has triggered, every peer CTA they waited on has started, and the dependent's CTAs,
// which wait for this grid only, take free SMs from a grid that no longer needs any. The
// dependent's launch then overlaps this call's epilogue (the fused kernels, fused.cuh).
// All threads of the CTA call it; finish_call's trigger is then a no-op.
__device__ __forceinline__ void peers_done() { pdl_trigger(); }

}  // namespace ear
