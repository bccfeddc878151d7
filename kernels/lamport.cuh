// lamport.cuh: data that is its own arrival flag (lamport.cu, the two-shot's polled stage and
// gather in twoshot.cu, the fused kernels): the sentinel rule, push, poll and clear, and the
// two-shot's polled-prefix rule.
#pragma once

#include "memory.cuh"
#include "vectors.cuh"

namespace ear {

// Two-shot stage rule (twoshot.cu, twoshot_norm.cu). Messages above kTwoShotPacedAbove
// bytes are paced by per-chunk flags; smaller ones poll the stage, and so read only the
// first twoshot_polled_seg(N) vectors of a stage row. Every call leaves that prefix of the
// rows it read zeroed (a large call zeroes nothing else: the zeroing is an HBM pass).
constexpr uint64_t kTwoShotPacedAbove = 8ull << 20;
__host__ __device__ constexpr uint64_t twoshot_polled_seg(int n) {
  return (kTwoShotPacedAbove / EAR_VEC_BYTES + n - 1) / n;
}

// Lamport payload rule (lamport.cu, lamport_norm.cu): an all-zero 32-bit word means "not
// arrived"; senders send all-zero words as 0x80000000 (-0 bits).
__device__ __forceinline__ uint32_t lamport_word(uint32_t w) { return w == 0u ? 0x80000000u : w; }
__device__ __forceinline__ uint4 lamport_sanitize(uint4 v) {
  return make_uint4(lamport_word(v.x), lamport_word(v.y), lamport_word(v.z), lamport_word(v.w));
}
// Lamport all-gather payload (twoshot.cu): gathered values are copied, not summed, so the
// sentinel rewrite must be undone exactly. The one word senders rewrite zeros to,
// 0x80000000, is -0.0f (never an fp32 sum: the accumulator starts at +0.0f) or an f16/bf16
// pair (+0, -0), which only a tiny negative sum rounded to T makes; gather_canonical maps it
// to +0. Owners store and send canonical values (sanitized), receivers store
// gather_canonical(received): the same bits on every rank.
__device__ __forceinline__ uint4 gather_canonical(uint4 v) {
  const auto c = [](uint32_t w) { return w == 0x80000000u ? 0u : w; };
  return make_uint4(c(v.x), c(v.y), c(v.z), c(v.w));
}
__device__ __forceinline__ bool lamport_arrived(const uint4& v) {
  return v.x != 0u && v.y != 0u && v.z != 0u && v.w != 0u;
}

// Stores vector v at byte `off` of the data region of every peer, starting at the next rank
// (spreads the NVLink traffic over the links).
template <int N>
__device__ __forceinline__ void lamport_push(const EarAllReduceParams& p, uint64_t off, const uint4& v) {
#pragma unroll
  for (int d = 1; d < N; ++d) {
    int q = p.rank + d;
    q = q >= N ? q - N : q;
    st_vec(data_region(peer_base<N>(p, q)) + off, v);
  }
}

// This CTA's even, contiguous share of a flat pass over `vecs` vectors (at most 2^32), in
// whole warps: its threads take first, first + blockDim.x, ... below end (first may be past
// end). Spreads the pass over every CTA whatever the block size: a fused Lamport grid has
// more CTAs than rows when the rows are few (lamport_norm.cu). 32-bit: no 64-bit division.
struct CtaShare {
  uint64_t first, end;
};
__device__ __forceinline__ CtaShare cta_share(uint64_t vecs) {
  const uint32_t n = static_cast<uint32_t>(vecs);
  const uint32_t per = ((n + gridDim.x - 1u) / gridDim.x + 31u) & ~31u;
  const uint64_t begin = static_cast<uint64_t>(blockIdx.x) * per;
  return {begin + threadIdx.x, begin + per < n ? begin + per : n};
}

// Zeroes vectors first, first + stride, ... below `vecs` of every peer row of buffer `buf` in
// our Lamport area `lam` (what the previous call wrote there): the whole grid's strides, or one
// CTA's share (cta_share), together cover the previous call's vectors.
template <int N>
__device__ __forceinline__ void lamport_clear(char* lam, uint64_t buf, int rank, uint64_t row_bytes,
                                              uint64_t vecs, uint64_t first, uint64_t stride) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r == rank) continue;
    char* row = lam + (buf * N + r) * row_bytes;
    for (uint64_t i = first; i < vecs; i += stride) st_vec(row + i * 16, zero);
  }
}

// One polling step: reloads (ld.volatile) each peer vector (rank r's at at(r), or at
// `at + r * row_bytes`) that has not arrived yet (a zero word); true if all had arrived.
// v.v[rank] is our own value, left alone. Callers waiting on several vectors step all of
// them in one loop, so their reloads are in flight together (one memory latency per round,
// not one per vector).
template <int N, typename At>
__device__ __forceinline__ bool lamport_poll_at(Ranks<N>& v, int rank, At at) {
  bool arrived = true;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r != rank && !lamport_arrived(v.v[r])) {
      arrived = false;
      v.v[r] = ld_volatile(at(r));
    }
  }
  return arrived;
}
template <int N>
__device__ __forceinline__ bool lamport_poll(Ranks<N>& v, int rank, const char* at, uint64_t row_bytes) {
  return lamport_poll_at<N>(v, rank, [&](int r) { return at + r * row_bytes; });
}

}  // namespace ear
