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
// begin_call): every copy is written once per call, by exactly one CTA, and no CTA reads a
// copy another CTA of the call writes. So there is no cross-CTA arrival count, no atomic,
// and nothing to do at the end of a call, and grids may change freely between calls. The
// next call reads the copies after griddepcontrol.wait (or the kernel boundary), i.e. after
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

// cta_barrier that also tells each peer where to read our input this call and learns where to
// read theirs (the 4+ rank two-shot, twoshot_wide.cu). `ours`: our input when peers may read
// it in place (EAR_CALL_INPUT_SHARED), else NULL (read our workspace's copy). Lane q writes it
// into peer q's pointer_slot[blockIdx.x][rank] before its flag's release, and after the
// acquire reads peer q's from our own pointer_slot[blockIdx.x][q] into theirs[q] (shared
// memory; NULL for ourselves, and for a peer whose flag never came: a wait that gave up reads
// the copy, never a stale pointer). Peer q rewrites that slot only at this barrier of its
// next call, which it reaches only after our next barrier of this one.
template <int N>
__device__ __forceinline__ void cta_barrier_sharing(const EarAllReduceParams& p, uint64_t value, const void* ours,
                                                    const void** theirs) {
  __syncthreads();
  const int q = static_cast<int>(threadIdx.x);
  if (q < N && q != p.rank)
    *pointer_slot(peer_base<N>(p, q), blockIdx.x, p.rank) = reinterpret_cast<uint64_t>(ours);
  const bool arrived = flag_exchange<N>(p, value, q);
  if (q < N)
    theirs[q] = q == p.rank || !arrived ? nullptr
                                        : reinterpret_cast<const void*>(
                                              ld_volatile_u64(pointer_slot(peer_base<N>(p, p.rank), blockIdx.x, q)));
  __syncthreads();
}

// The counters of a call, and what the call leaves for the next one.
struct CallCounters {
  uint64_t seq, lam_seq, lam_prev_vecs;
};

// Start of a call, before anything reads what the previous kernel wrote: arms the CTA's
// bounded waits (wait.cuh), then waits for the previous kernel (PDL). Arming depends on no
// memory, so with PDL it overlaps that kernel's tail. Returns our abort word to the thread that
// reads it in begin_call, NULL to the others.
__device__ __forceinline__ uint64_t* open_call(const EarAllReduceParams& p) {
  uint64_t* const ours = arm_waits(p);
  pdl_wait();
  return ours;
}

// After open_call: thread 0 reads copy blockIdx.x of the counters and the arm thread (of
// another warp when the CTA has two: one round trip to memory for both) our abort word; both
// are broadcast (a call of an aborted group ends here, wait.cuh). Then copies blockIdx.x + j*gridDim.x
// (j = threadIdx.x, then strided by blockDim.x) get next(c); thread 0 rewrites the copy it read
// itself, after reading it. Stores only, nothing waits for them. The abort word is read after
// PDL's wait, so that an abort by the previous kernel of the stream is seen here.
template <typename F>
__device__ __forceinline__ CallCounters begin_call(const EarAllReduceParams& p, const uint64_t* ours, F next) {
  __shared__ CallCounters s;
  __shared__ uint64_t aborted;
  State* const st = static_cast<State*>(p.state);
  CallCounters mine{};
  uint64_t abort_seen = 0;
  if (threadIdx.x == 0) {  // the loads first, then the stores that wait for them
    const State* copy = st + blockIdx.x;
    mine.seq = ld_volatile_u64(&copy->seq);
    mine.lam_seq = ld_volatile_u64(&copy->lam_seq);
    mine.lam_prev_vecs = ld_volatile_u64(&copy->lam_prev_vecs);
  }
  if (ours != nullptr) abort_seen = ld_volatile_u64(ours);
  if (threadIdx.x == 0) s = mine;
  if (ours != nullptr) aborted = abort_seen;
  __syncthreads();
  bail_if_aborted(aborted);
  const CallCounters c = s;
  const CallCounters n = next(c);
  for (uint32_t copy = blockIdx.x + threadIdx.x * gridDim.x; copy < EAR_MAX_BLOCKS;
       copy += blockDim.x * gridDim.x) {
    State* dst = st + copy;
    dst->seq = n.seq;
    dst->lam_seq = n.lam_seq;
    dst->lam_prev_vecs = n.lam_prev_vecs;
  }
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
// this grid to complete and flush). No fence: see State.
__device__ __forceinline__ void finish_call() { pdl_trigger(); }

// The same trigger, earlier: once this CTA waits on no peer any more (what is left is local
// work, or loads of data known to have arrived). It is as safe as finish_call's: when every
// CTA has triggered, every peer CTA they waited on has started, and the dependent's CTAs,
// which wait for this grid only, take free SMs from a grid that no longer needs any. The
// dependent's launch then overlaps this call's epilogue (the fused kernels, fused.cuh).
// All threads of the CTA call it; finish_call's trigger is then a no-op.
__device__ __forceinline__ void peers_done() { pdl_trigger(); }

}  // namespace ear
