// twoshot_wide.cu: two-shot all-reduce for 4 and more ranks, pull flavour, two flag barriers
// (ear_twoshot_barrier_<t>_n<N>). The 2-rank two-shot (twoshot.cu) pushes through a polled
// stage and gather; at 4+ ranks on simulated ranks, with a rank's SMs/N CTAs, it moves 1.4x
// the bytes of this one (it zeroes what it polls) and took 1.3-1.6x as long from 4 MiB
// (docs/PERFORMANCE.md).
//
// Protocol (call number seq = State::seq, shared with oneshot.cu and twoshot.cu):
//   vectors  vecs = ceil(count / E), N segments of seg = ceil(vecs / N) vectors; segment s
//            = vectors [s*seg, min(vecs, (s+1)*seg)) is reduced by rank s.
//   layout   bank = the one-shot's bank seq % 2 (data region + EAR_OFF_ONESHOT + (seq % 2)
//            * EAR_ONESHOT_BANK_BYTES(m)), vector i at byte 16*i: a copy of our input in
//            every segment but ours, and our segment's sum in ours.
//   Thread t of CTA b handles offsets j = b*512 + t (grid-stride) inside EVERY segment, in
//   all phases, so it only ever reads what the same-index CTA of each rank wrote:
//   1. copy     for every s != rank, input vector s*seg+j into our bank (local writes);
//               skipped when peers read our input in place (EAR_CALL_POINTERS and
//               EAR_CALL_INPUT_SHARED: the group lives in one process and the host found our
//               input reachable);
//   2. barrier  cta_barrier(flag_value(seq, 0)); with EAR_CALL_POINTERS cta_barrier_sharing:
//               each rank also tells its peers where its vectors are this call: its input
//               (in place) or its bank (sync.cuh);
//   3. reduce   our input vector rank*seg+j and vector rank*seg+j of every peer, from where
//               it said (N-1 remote reads), summed in rank order 0..N-1; the sum goes to our
//               output and into our bank at rank*seg+j. Last-copied first when it reads some
//               peer's copy: its reads then hit the L2 lines step 1 wrote last (simulation, 4
//               / 8 ranks, 16 MiB: 87.9 / 147.5 us against 90.9 / 151.0 in copy order);
//   4. barrier  cta_barrier(flag_value(seq, 1));
//   5. gather   for every s != rank, bank vector s*seg+j of rank s (its sum) into our output,
//               in copy order (first the sums step 3 wrote last).
//   In place: each output vector is written by the thread that read the matching input
//   vector, after reading it. Peers read our input (when we let them) only in step 3 and
//   only outside our segment, and we write outside our segment only in step 5, after
//   barrier 2, which every peer passes only after its step 3.
//
// Why bank reuse is safe without an exit barrier: the one-shot's argument (oneshot.cu). Call
// seq writes bank seq % 2, which peers last read in call seq-2; this call completes on a rank
// only after every peer has started it (barrier 1, which every CTA takes), so a peer that
// starts call seq+2 has seen every rank complete seq+1, hence start it, hence complete seq.
//
// Cost per rank: (N-1)/N*S local copy (none when peers read our input in place), 2*(N-1)/N*S
// NVLink reads (steps 3 and 5), two flag round trips. On simulated ranks, where one GPU's
// memory carries every rank's bytes, the copy was what separated it from peers that reduce
// registered buffers in place (docs/PERFORMANCE.md).
#include "common.cuh"

namespace ear {

// What the body does (bits), for the per-stage timings of tools/gpu/twoshot_stages.cu; the
// kernels do all of it.
constexpr uint32_t kWideCopy = 1, kWideBarrier1 = 2, kWideReduce = 4, kWideBarrier2 = 8, kWideGather = 16;
// Step 3 in reverse order of step 1 (see the protocol).
constexpr uint32_t kWideLifo = 32;
constexpr uint32_t kWideAll = kWideCopy | kWideBarrier1 | kWideReduce | kWideBarrier2 | kWideGather | kWideLifo;

template <typename T, int N, uint32_t Opts = kWideAll>
__device__ __forceinline__ void twoshot_barrier_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, p.ws_max_bytes);
  const uint64_t* const our_abort = open_call<T>(p);
  const CallCounters c = begin_call(p, our_abort, next_barrier_call);
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
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;

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
  // Where each peer's vectors are this call (step 2): its input, or NULL for its bank; then
  // from[r], where step 3 reads rank r: our input, a peer's input in place, or a peer's bank
  // (indexed alike; a bank's last vector is zero-padded as load_input pads it).
  __shared__ const void* theirs[N];
  const void* from[N];
  const auto reduce_load = [&](uint64_t j) { return load_ranks_cg<T, N>(from, own_first + j, p.count); };
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

  constexpr int U = kReduceBatch<N>;
  const uint64_t step = U * stride;  // one batch of every thread
  const bool pointers = exchanges_pointers<N>(p);
  const bool shared_input = shares_input<N>(p, true);
  if ((Opts & kWideCopy) && !shared_input)
    for (uint64_t i0 = first; i0 < seg; i0 += step) batch_step<U>(i0, stride, seg, copy_load, Arrived{}, copy_use);
  if ((Opts & kWideBarrier1) && pointers) {
    cta_barrier_sharing<N>(p, flag_value(c.seq, 0), shared_input ? p.input : nullptr, theirs);
  } else {
    if (threadIdx.x < N) theirs[threadIdx.x] = nullptr;
    if (Opts & kWideBarrier1) cta_barrier<N>(p, flag_value(c.seq, 0));
    else __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < N; ++r) from[r] = r == rank ? p.input : theirs[r] != nullptr ? theirs[r] : bank(r);
  // Last-copied first only when some peer's copy is read: inputs read in place were not
  // touched by this call (4 / 8 ranks, 1 MiB, all in place: 0.2 us faster in copy order).
  bool reads_copies = false;
#pragma unroll
  for (int r = 0; r < N; ++r) reads_copies |= r != rank && theirs[r] == nullptr;
  const bool lifo = (Opts & kWideLifo) && reads_copies;
  if ((Opts & kWideReduce) && first < own_len) {
    const uint64_t batches = (own_len - first + step - 1) / step;
    for (uint64_t b = 0; b < batches; ++b)
      batch_step<U>(first + (lifo ? batches - 1 - b : b) * step, stride, own_len, reduce_load, Arrived{}, reduce_use);
  }
  if (Opts & kWideBarrier2) cta_barrier<N>(p, flag_value(c.seq, 1));
  if (Opts & kWideGather)
    for (uint64_t i0 = first; i0 < seg; i0 += step) batch_step<U>(i0, stride, seg, gather_load, Arrived{}, gather_use);
  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_KERNEL, twoshot_barrier, ear::twoshot_barrier_body)
