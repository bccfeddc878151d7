// twoshot_wide.cu: two-shot all-reduce for 4 and more ranks, pull flavour, flag barriers
// (ear_twoshot_barrier_<t>_n<N>). The 2-rank two-shot (twoshot.cu) pushes through a polled
// stage; at 4+ ranks a rank has SMs/N CTAs, and the polled stage and gather cost two
// zeroing passes and a wait per vector that so few CTAs cannot hide (docs/PERFORMANCE.md).
//
// Protocol (call number seq = State::seq, shared with oneshot.cu and twoshot.cu):
//   vectors  vecs = ceil(count / E), N segments of seg = ceil(vecs / N) vectors; segment s
//            = vectors [s*seg, min(vecs, (s+1)*seg)) is reduced by rank s.
//   layout   bank = the one-shot's bank seq % 2 (data region + EAR_OFF_ONESHOT + (seq % 2)
//            * EAR_ONESHOT_BANK_BYTES(m)), vector i at byte 16*i: a copy of our input in
//            every segment but ours, and our segment's sum in ours.
//   Thread t of CTA b handles offsets j = b*512 + t (grid-stride) inside EVERY segment, in
//   all phases, so it only ever reads what the same-index CTA of each rank wrote. A CTA's
//   offsets are cut into chunks of rounds (below); for chunk c:
//   1. copy     for every s != rank, input vector s*seg+j into our bank (local writes);
//   2. barrier  cta_barrier(flag_value(seq, 2c));
//   3. reduce   our input vector rank*seg+j and bank vector rank*seg+j of every peer (N-1
//               remote reads), summed in rank order 0..N-1; the sum goes to our output and
//               into our bank at rank*seg+j;
//   4. barrier  cta_barrier(flag_value(seq, 2c+1));
//   5. gather   for every s != rank, bank vector s*seg+j of rank s (its sum) into our output.
//   Large calls (chunks > 1) also discard, after step 4, the L2 lines of our bank that step 1
//   wrote (every reader has read them): the lines are rewritten before they are read again,
//   so their write-back to memory is skipped.
//   In place: each output vector is written by the thread that read the matching input
//   vector, after reading it; peers read only our bank.
//
// Why bank reuse is safe without an exit barrier: the one-shot's argument (oneshot.cu). Call
// seq writes bank seq % 2, which peers last read in call seq-2; this call completes on a rank
// only after every peer has started it (barrier 2c of every chunk), so a peer that starts
// call seq+2 has seen every rank complete seq+1, hence start it, hence complete seq. Every
// chunk of a CTA is the same on every rank (rounds depend on seg, the grid and the CTA index
// only), so the flag values match; at most kFlagsPerCall / 2 chunks per call.
//
// Cost per rank: (N-1)/N*S local copy, 2*(N-1)/N*S NVLink reads (steps 3 and 5), two flag
// round trips per chunk.
#include "common.cuh"

namespace ear {

// What the body does (bits), for the per-stage timings of tools/gpu/twoshot_stages.cu; the
// kernels run every stage.
constexpr uint32_t kWideCopy = 1, kWideBarrier1 = 2, kWideReduce = 4, kWideBarrier2 = 8, kWideGather = 16;
// Step 3 walks its rounds last-written first (its bank reads then hit the L2 lines step 1
// wrote last), step 5 first-written first (the sums step 3 wrote last).
constexpr uint32_t kWideLifo = 32;
// After step 4, discard (no write-back) the bank lines step 1 wrote in the chunk.
constexpr uint32_t kWideDiscard = 64;
constexpr uint32_t kWideAll = kWideCopy | kWideBarrier1 | kWideReduce | kWideBarrier2 | kWideGather | kWideLifo | kWideDiscard;
// Chunks: a chunk of a CTA holds as many rounds (one vector per thread per segment) as keep
// about ChunkKiB KiB of every rank's bank traffic in flight together (N ranks x N segments x
// the grid's 512-thread rounds of 16 bytes), at least one; 0: one chunk per call.
constexpr uint32_t kWideChunkKiB = 16u << 10;

// discard.global.L2: the 128-byte line's contents become undefined and are not written back.
__device__ __forceinline__ void discard_l2_line(void* p) {
  asm volatile("discard.global.L2 [%0], 128;" ::"l"(p) : "memory");
}

template <typename T, int N, uint32_t ChunkKiB = kWideChunkKiB, uint32_t Opts = kWideAll>
__device__ __forceinline__ void twoshot_wide_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, p.ws_max_bytes);
  pdl_wait();
  const CallCounters c = begin_call(p, next_barrier_call);
  const uint64_t m = p.ws_max_bytes;
  const int rank = p.rank;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t seg = (vecs + N - 1) / N;
  const uint64_t own_first = static_cast<uint64_t>(rank) * seg;
  const uint64_t own_len = vecs > own_first ? (vecs - own_first < seg ? vecs - own_first : seg) : 0;
  const uint64_t bank_off = EAR_OFF_ONESHOT(m, N) + (c.seq & 1u) * EAR_ONESHOT_BANK_BYTES(m);
  char* const own_bank = data_region(peer_base<N>(p, rank)) + bank_off;
  // Rank r's bank; r is a compile-time index in every caller (unrolled loops).
  const auto bank = [&](int r) { return data_region(p.peer_ws[r]) + bank_off; };
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads;
  const uint64_t cta_first = static_cast<uint64_t>(blockIdx.x) * kThreads;
  const uint64_t first = cta_first + threadIdx.x;

  // Rounds of this CTA (thread 0's, the most of any of its threads), in chunks.
  const uint64_t rounds = seg > cta_first ? (seg - cta_first + stride - 1) / stride : 0;
  uint64_t per = rounds;
  if (ChunkKiB != 0) {
    const uint64_t round_bytes = static_cast<uint64_t>(N) * N * stride * EAR_VEC_BYTES;
    per = (static_cast<uint64_t>(ChunkKiB) << 10) / round_bytes;
    per = per < 1 ? 1 : per;
  }
  constexpr uint64_t kMaxChunks = kFlagsPerCall / 2;
  if (per * kMaxChunks < rounds) per = (rounds + kMaxChunks - 1) / kMaxChunks;
  const uint32_t chunks = rounds == 0 ? 0u : static_cast<uint32_t>((rounds + per - 1) / per);
  const bool discard = (Opts & kWideDiscard) && chunks > 1;

  const auto copy_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank && s * seg + j < vecs) v.v[s] = load_input<T>(p.input, s * seg + j, p.count);
    return v;
  };
  const auto copy_use = [&](uint64_t j, const Ranks<N>& v) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank && s * seg + j < vecs) st_vec(own_bank + (s * seg + j) * 16, v.v[s]);
  };
  const auto reduce_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int r = 0; r < N; ++r)
      v.v[r] = r == rank ? load_input<T>(p.input, own_first + j, p.count) : ld_cg(bank(r) + (own_first + j) * 16);
    return v;
  };
  const auto reduce_use = [&](uint64_t j, const Ranks<N>& v) {
    const uint4 sum = reduce_in_rank_order<T, N>(v.v);
    store_output<T>(p.output, own_first + j, p.count, sum);
    st_vec(own_bank + (own_first + j) * 16, sum);
  };
  const auto gather_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank && s * seg + j < vecs) v.v[s] = ld_cg(bank(s) + (s * seg + j) * 16);
    return v;
  };
  const auto gather_use = [&](uint64_t j, const Ranks<N>& v) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank && s * seg + j < vecs) store_output<T>(p.output, s * seg + j, p.count, v.v[s]);
  };
  // A line of our bank that step 1 wrote is discarded by the thread of its first vector when
  // all 8 vectors are this CTA's, in this round and segment (then they are threads t..t+7).
  const auto discard_lines = [&](uint64_t j) {
#pragma unroll
    for (int s = 0; s < N; ++s) {
      const uint64_t i = s * seg + j;
      if (s != rank && i % 8 == 0 && j + 7 < seg && i + 7 < vecs && threadIdx.x + 7 < kThreads)
        discard_l2_line(own_bank + i * 16);
    }
  };

  constexpr int U = kReduceBatch<N>;
  for (uint32_t ch = 0; ch < chunks; ++ch) {
    const uint64_t k0 = ch * per;
    const uint64_t k1 = k0 + per < rounds ? k0 + per : rounds;
    const uint64_t end = first + k1 * stride;  // this thread's items of the chunk lie below
    const uint64_t seg_end = end < seg ? end : seg, own_end = end < own_len ? end : own_len;
    if (Opts & kWideCopy)
      for (uint64_t k = k0; k < k1; k += U) batch_step<U>(first + k * stride, stride, seg_end, copy_load, Arrived{}, copy_use);
    if (Opts & kWideBarrier1) cta_barrier<N>(p, flag_value(c.seq, 2 * ch));
    if (Opts & kWideReduce) {
      const uint64_t batches = (k1 - k0 + U - 1) / U;
      for (uint64_t q = 0; q < batches; ++q) {
        const uint64_t k = k0 + ((Opts & kWideLifo) ? batches - 1 - q : q) * U;
        batch_step<U>(first + k * stride, stride, own_end, reduce_load, Arrived{}, reduce_use);
      }
    }
    if (Opts & kWideBarrier2) cta_barrier<N>(p, flag_value(c.seq, 2 * ch + 1));
    if (discard)
      for (uint64_t k = k0; k < k1 && first + k * stride < seg; ++k) discard_lines(first + k * stride);
    if (Opts & kWideGather)
      for (uint64_t k = k0; k < k1; k += U) batch_step<U>(first + k * stride, stride, seg_end, gather_load, Arrived{}, gather_use);
  }
  finish_call();
}

}  // namespace ear

EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f32, float, 2)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f32, float, 4)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f32, float, 6)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f32, float, 8)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f32, float, 16)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f16, __half, 2)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f16, __half, 4)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f16, __half, 6)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f16, __half, 8)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, f16, __half, 16)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, bf16, __nv_bfloat16, 2)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, bf16, __nv_bfloat16, 4)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, bf16, __nv_bfloat16, 6)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, bf16, __nv_bfloat16, 8)
EAR_DEFINE_KERNEL(twoshot_barrier, ear::twoshot_wide_body, bf16, __nv_bfloat16, 16)
