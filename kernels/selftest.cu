// selftest.cu: the peer self-test, run once per rank before the custom kernels of a group are
// trusted (src/group/selftest.rs launches it and decides). It checks the two ways the all-reduce
// kernels use the links between the ranks' GPUs: stores into a peer's memory (every family
// pushes data or flags into peers' workspaces) and loads from a peer's memory (the one-shot and
// the wide two-shot pull). A fabric that breaks them (PCIe ACS routing peer traffic through the
// root complex, an IOMMU that drops or remaps it) can make stores vanish, loads return garbage,
// or a load never return; the all-reduce kernels would then hang (until their own bound) or sum
// garbage, silently. The test finds it in well under a second, and names the pair.
//
// The read path is probed only when a family that loads from peers may run on the group
// (probe_reads: the host decides it alike on every rank; src/group/selftest.rs): where none may,
// the kernel issues no peer load at all, since on some platforms (peer writes only) a peer load
// never returns and would wedge the GPU, and reports the reads SKIPPED.
//
// Protocol. One launch per rank (grid 1, block EAR_SELFTEST_THREADS, EarSelfTestParams by
// value), every rank at about the same time, each on its own device and stream; the ranks'
// workspaces are mapped into each other (allreduce_params.h: the self-test area after the data
// region). Lane q of rank r:
//   1. q == r: writes r's own token EAR_SELFTEST_TOKEN(r, r, round) into r's local slot.
//      q != r: writes EAR_SELFTEST_TOKEN(r, q, round) into inbox[r] of rank q's workspace (a
//      store over the link), unless injected otherwise (skip_mask: no store; garble_mask: a
//      wrong token) or q's workspace is not mapped (a NULL entry). A token is one 16-byte store
//      (st.global.v4, as the kernels' data) of the token and its complement.
//   2. q != r: polls, until a deadline timeout_ns after the kernel's start (%globaltimer, as
//      the bounded waits of wait.cuh), two slots with 16-byte volatile loads: inbox[q] of r's own
//      workspace, for q's token (the WRITE path q -> r), and the local slot of q's workspace, for
//      q's own token (the READ path r -> q: a load over the link). Each is PASSED once it holds
//      the exact 16 bytes; at the deadline a slot still pending is NOT_SEEN when it holds zero
//      or an earlier round's token of the same pair (nothing arrived), else WRONG (garbled).
//   3. Lane q writes its verdicts, write[q] and read[q], into r's result block (host-mapped) as
//      soon as each is known; once every lane has, lane 0 writes `done` = r's own token after a
//      system fence: the host reads a block whose `done` matches as complete.
// Nothing waits for anything else, so a rank whose peer never launched still ends at its
// deadline (plus one poll), with NOT_SEEN for that peer. A load that never returns (the one
// failure a kernel cannot bound) keeps the kernel from ending: the host gives up at a deadline
// of its own, reports the rank as not finished and never frees memory the kernel may touch
// (src/group/selftest.rs).
//
// The area is left as it is: a peer may still be reading our local slot or writing our inbox
// when we end, and no all-reduce kernel reads or writes the area (a dedicated region), so there
// is nothing to clean. Tokens carry the round: a later self-test of the same workspaces (a new
// round) never takes an old token for its own (it is NOT_SEEN until the new one arrives). The
// kernel touches no shared memory and no state block, and no signal slot or abort word: it
// cannot disturb a group that already runs all-reduces.
#include <stdint.h>

#include "allreduce_params.h"
#include "memory.cuh"

namespace ear {

// 16-byte slot `i` bytes into the self-test area of workspace `ws`.
__device__ __forceinline__ void* selftest_slot(void* ws, uint64_t m, int n, uint64_t i) {
  return static_cast<char*>(ws) + EAR_SELFTEST_OFFSET(m, static_cast<uint64_t>(n)) + i;
}

// A token as stored: its two halves, then their complements.
__device__ __forceinline__ uint4 token_vec(uint64_t token) {
  const uint32_t lo = static_cast<uint32_t>(token), hi = static_cast<uint32_t>(token >> 32);
  return make_uint4(lo, hi, ~lo, ~hi);
}

__device__ __forceinline__ bool same(uint4 a, uint4 b) {
  return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w;
}

// A pending slot's verdict at the deadline: NOT_SEEN if it holds nothing new (zero, or a token of
// this pair from an earlier round: the magic, the pair, and the complement all in place), else
// WRONG.
__device__ __forceinline__ uint32_t at_deadline(uint4 seen, int src, int dst) {
  if (seen.x == 0u && seen.y == 0u && seen.z == 0u && seen.w == 0u) return EAR_SELFTEST_NOT_SEEN;
  const uint64_t token = (static_cast<uint64_t>(seen.y) << 32) | seen.x;
  const uint64_t round = (token >> 16) & 0xFFFFu;
  const bool older = same(seen, token_vec(EAR_SELFTEST_TOKEN(src, dst, round)));
  return older ? EAR_SELFTEST_NOT_SEEN : EAR_SELFTEST_WRONG;
}

__device__ __forceinline__ void st_volatile_u32(uint32_t* p, uint32_t v) {
  *reinterpret_cast<volatile uint32_t*>(p) = v;
}

__device__ __forceinline__ void selftest(const EarSelfTestParams& p) {
  const int n = p.nranks, r = p.rank, q = static_cast<int>(threadIdx.x);
  if (gridDim.x != 1u || blockDim.x != EAR_SELFTEST_THREADS || n < 1 || n > EAR_MAX_RANKS || r < 0 || r >= n ||
      p.result == nullptr || p.peer_ws[r] == nullptr)
    __trap();
  const uint64_t m = p.ws_max_bytes;
  const uint64_t deadline = globaltimer() + p.timeout_ns;
  const uint64_t start = deadline - p.timeout_ns;
  EarSelfTestResult* const out = p.result;
  const bool peer = q < n && q != r;
  void* const theirs = peer ? p.peer_ws[q] : nullptr;

  // 1. Our tokens: our own slot, and our inbox slot in every mapped peer's workspace.
  if (q == r) {
    const uint64_t token = EAR_SELFTEST_TOKEN(r, r, p.round) ^ static_cast<uint64_t>((p.garble_mask >> r) & 1u);
    st_vec(selftest_slot(p.peer_ws[r], m, n, EAR_SELFTEST_LOCAL), token_vec(token));
  } else if (peer && theirs != nullptr && ((p.skip_mask >> q) & 1u) == 0u) {
    const uint64_t token = EAR_SELFTEST_TOKEN(r, q, p.round) ^ (static_cast<uint64_t>((p.garble_mask >> q) & 1u) << 40);
    st_vec(selftest_slot(theirs, m, n, EAR_SELFTEST_INBOX(r)), token_vec(token));
  }

  // 2. Peer q's token in our inbox (write path q -> r) and in q's own slot (read path r -> q).
  if (peer) {
    const void* inbox = selftest_slot(p.peer_ws[r], m, n, EAR_SELFTEST_INBOX(q));
    const void* local = theirs != nullptr ? selftest_slot(theirs, m, n, EAR_SELFTEST_LOCAL) : nullptr;
    const uint4 want_write = token_vec(EAR_SELFTEST_TOKEN(q, r, p.round));
    const uint4 want_read = token_vec(EAR_SELFTEST_TOKEN(q, q, p.round));
    uint32_t write = EAR_SELFTEST_PENDING;
    uint32_t read = !p.probe_reads ? EAR_SELFTEST_SKIPPED : local != nullptr ? EAR_SELFTEST_PENDING : EAR_SELFTEST_UNMAPPED;
    if (read != EAR_SELFTEST_PENDING) st_volatile_u32(&out->read[q], read);
    uint4 seen_write = make_uint4(0u, 0u, 0u, 0u), seen_read = seen_write;
    for (;;) {
      if (write == EAR_SELFTEST_PENDING) {
        seen_write = ld_volatile(inbox);
        if (same(seen_write, want_write)) {
          write = EAR_SELFTEST_PASSED;
          st_volatile_u32(&out->write[q], write);
        }
      }
      if (read == EAR_SELFTEST_PENDING) {
        seen_read = ld_volatile(local);
        if (same(seen_read, want_read)) {
          read = EAR_SELFTEST_PASSED;
          st_volatile_u32(&out->read[q], read);
        }
      }
      if (write != EAR_SELFTEST_PENDING && read != EAR_SELFTEST_PENDING) break;
      if (globaltimer() >= deadline) {
        if (write == EAR_SELFTEST_PENDING) st_volatile_u32(&out->write[q], at_deadline(seen_write, q, r));
        if (read == EAR_SELFTEST_PENDING) st_volatile_u32(&out->read[q], at_deadline(seen_read, q, q));
        break;
      }
      __nanosleep(100);  // a failing peer is polled for the whole bound: spare its link
    }
  }

  // 3. Done: every lane's entries are written (syncwarp orders them before lane 0's fence).
  __syncwarp();
  if (q == 0) {
    out->elapsed_ns = globaltimer() - start;
    __threadfence_system();
    st_release_sys(&out->done, EAR_SELFTEST_TOKEN(r, r, p.round));
  }
}

}  // namespace ear

extern "C" __global__ void __launch_bounds__(EAR_SELFTEST_THREADS, 1)
    ear_selftest(const __grid_constant__ EarSelfTestParams params) {
  ear::selftest(params);
}

// The bandwidth check, launched after ear_selftest on the same stream where the group's ranks
// are on separate GPUs: EAR_SELFTEST_PUSH_CTAS CTAs store `bytes` from our workspace into the
// next rank's, 16-byte vectors grid-stride, as the pushing kernels move their data. Each thread
// fences at system scope after its stores (they are then performed where the peer sees them), and
// each CTA records its time from its own start; the slowest CTA's is the result (atomicMax into a
// zeroed word). A fabric that carries peer writes at a small fraction of a PCIe link's rate (PCIe
// ACS routing through the root complex, a misconfigured switch) takes NCCL (src/group/selftest.rs).
// It writes the next rank's one-shot bank 0, which no call reads before staging it again.
extern "C" __global__ void __launch_bounds__(EAR_SELFTEST_PUSH_THREADS, 1)
    ear_selftest_push(const __grid_constant__ EarSelfTestPushParams p) {
  const uint64_t start = ear::globaltimer();
  const uint64_t vecs = p.bytes / 16u;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const char* src = static_cast<const char*>(p.src);
  char* dst = static_cast<char*>(p.dst);
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs; i += stride)
    ear::st_vec(dst + 16u * i, *reinterpret_cast<const uint4*>(src + 16u * i));
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned long long*>(&p.result->push_ns),
              static_cast<unsigned long long>(ear::globaltimer() - start));
}
