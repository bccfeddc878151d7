// twoshot.cu: two-shot all-reduce, push flavour (ear_twoshot_<t>_n<N>): a Lamport
// reduce-scatter (the payload is its own flag) into a stage that alternates between two
// parities, then a Lamport all-gather. Every wait is a poll on data; messages above
// kTwoShotBarrierAbove also take one barrier after the scatter (pacing, not correctness).
//
// Protocol (call number seq = State::seq, shared with oneshot.cu; identical on every rank):
//   vectors  vecs = ceil(count / E), split into N segments of seg = ceil(vecs / N) vectors;
//            segment s = vectors [s*seg, min(vecs, (s+1)*seg)) is owned by rank s.
//   layout   stage  = data region + EAR_OFF_TWOSHOT_STAGE; what rank w sends rank r in call
//                     seq lands in r's row EAR_TWOSHOT_STAGE_ROW(seq % 2, w, r, N), at
//                     row * EAR_TWOSHOT_SEG_BYTES(m, N);
//            gather = data region + EAR_OFF_TWOSHOT_GATHER, segment s (written by rank s)
//                     at s * EAR_TWOSHOT_SEG_BYTES(m, N).
//            The gather is all zero between calls, and so is the polled prefix of the
//            stage rows, their first twoshot_polled_seg(N) vectors (common.cuh): the host
//            zero-fills both, every call zeroes what it read of them. Strides come from
//            the workspace size m, not from count.
//   Thread (b, t) handles offsets j = b*512 + t (grid-stride) inside EVERY segment, in all
//   phases, so it only ever needs what the same-index thread of each rank wrote.
//   1. scatter  for every s != rank: push lamport_sanitize(our input vector s*seg+j) into
//               our row of rank s's stage at j (NVLink writes).
//   (barrier   cta_barrier(2*seq+1), only if count * sizeof(T) > kTwoShotBarrierAbove.)
//   2. reduce   batch by batch: poll our stage rows at j for our segment until no word is
//               zero (after the barrier: no check), zero them if j is in the polled prefix,
//               sum in rank order our own input and the rows; write gather_canonical(sum)
//               to our output and push it (sanitized) into gather segment `rank` of every
//               peer. (The sanitize rewrite of the scattered input is exact: a -0 summand
//               leaves an accumulator that starts at +0.0f unchanged.)
//   3. gather   one batch behind phase 2 (so these local copies overlap its NVLink pushes):
//               poll our gather segments s != rank at j until no word is zero, write
//               gather_canonical(value) to our output, zero the slot.
//   (begin_call advances seq for the next call; see State in common.cuh.)
//   In place: each output vector is written by the thread that read the matching input
//   vector, after reading it.
//
// Why reuse is safe without the barrier. Every call of every family completes on a rank only
// after every peer has started it (here: segment 0 is never empty, its owner needs every
// rank's scatter and every other rank needs its owner's gather), i.e. after every peer has
// completed its previous call (stream order / griddepcontrol.wait: all its writes done).
// Rank r's stage and gather are written only by peers and read (and zeroed) only by r.
//   - stage, parity seq % 2: next written in call seq+2 (or later), which a peer starts only
//     after its call seq+1 completed, i.e. after r started call seq+1, i.e. after r's call
//     seq (its polls and its zeroing) completed. One parity would not do: r's zero stores
//     of call seq are not ordered before its gather pushes of call seq, which is all a peer
//     waits for before its call seq+1 rewrites the row.
//   - gather: a peer writes r's gather slot (s, j) in call seq+1 only after summing the
//     vector r scattered to it for (s, j) in call seq+1, i.e. after r's call seq completed.
//   Within a call every slot is written once, so a poll never sees an older call's value.
//   One-shot calls use a disjoint region (their bank rule rests on the same "complete only
//   after every peer started" property). The fused two-shot (fused_norm.cu) uses the same
//   stage rows and gather and leaves the gather and the stage's polled prefix zeroed too.
//
// Cost per rank: 2*(N-1)/N*S NVLink writes, local reads and zeroing; a flag round trip
// above kTwoShotBarrierAbove only.
#include "common.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void twoshot_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, p.ws_max_bytes);
  pdl_wait();
  const CallCounters c = begin_call(p, next_barrier_call);
  const uint64_t m = p.ws_max_bytes;
  const int rank = p.rank;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t seg = (vecs + N - 1) / N;
  const uint64_t seg_bytes = EAR_TWOSHOT_SEG_BYTES(m, N);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;

  // Peer addresses are recomputed from the params (constant bank) at each use: arrays of
  // 2N pointers would take 4N registers.
  const uint64_t par = c.seq & 1u;
  const uint64_t stage_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_STAGE(m, N);
  const uint64_t gather_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_GATHER(m, N);
  char* const my_stage = data_region(peer_base<N>(p, rank)) + EAR_OFF_TWOSHOT_STAGE(m, N);
  char* const my_gather = data_region(peer_base<N>(p, rank)) + EAR_OFF_TWOSHOT_GATHER(m, N);

  // 1. scatter: our piece of segment s goes to our row of rank s's stage.
  batched_for<kReduceBatch<N>>(
      first, stride, seg,
      [&](uint64_t j) {
        Ranks<N> v;
#pragma unroll
        for (int s = 0; s < N; ++s) {
          const uint64_t vi = s * seg + j;
          if (s != rank && vi < vecs) v.v[s] = load_input<T>(p.input, vi, p.count);
        }
        return v;
      },
      [&](uint64_t j, const Ranks<N>& v) {
#pragma unroll
        for (int s = 0; s < N; ++s)
          if (s != rank && s * seg + j < vecs)
            st_vec(static_cast<char*>(p.peer_ws[s]) + stage_off +
                       EAR_TWOSHOT_STAGE_ROW(par, rank, s, N) * seg_bytes + j * 16,
                   lamport_sanitize(v.v[s]));
      });
  // Large messages only: a barrier here keeps each CTA in step with its peers (the polls
  // below need no check; a segment this long goes past the polled prefix). Measured on
  // 2 x H200: 200.5 us at 64 MiB with it, 216-227 without, level at 16 MiB (56.1 against
  // 56.5); without it 1.4 us faster at 8 MiB and 0.7 at 4 MiB (docs/PERFORMANCE.md).
  const bool paced = p.count * sizeof(T) > kTwoShotBarrierAbove;
  if (paced) cta_barrier<N>(p, 2 * c.seq + 1);

  // 2 + 3. reduce our segment a batch at a time as the peers' pieces arrive; one batch
  // behind, take the other segments from our gather as they arrive.
  const uint64_t own_first = static_cast<uint64_t>(rank) * seg;
  const uint64_t own_len = vecs > own_first ? (vecs - own_first < seg ? vecs - own_first : seg) : 0;
  const auto stage_at = [&](int r, uint64_t j) {
    return my_stage + EAR_TWOSHOT_STAGE_ROW(par, r, rank, N) * seg_bytes + j * 16;
  };
  const auto reduce_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int r = 0; r < N; ++r)
      v.v[r] = (r == rank) ? load_input<T>(p.input, own_first + j, p.count) : ld_volatile(stage_at(r, j));
    return v;
  };
  const auto reduce_poll = [&](uint64_t j, Ranks<N>& v) {
    return lamport_poll_at<N>(v, rank, [&](int r) { return stage_at(r, j); });
  };
  const auto reduce_use = [&](uint64_t j, const Ranks<N>& v) {
    if (j < twoshot_polled_seg(N)) {
#pragma unroll
      for (int r = 0; r < N; ++r)
        if (r != rank) st_vec(stage_at(r, j), make_uint4(0u, 0u, 0u, 0u));
    }
    const uint4 sum = gather_canonical(reduce_in_rank_order<T, N>(v.v));
    const uint4 sent = lamport_sanitize(sum);
#pragma unroll
    for (int q = 0; q < N; ++q)
      if (q != rank) st_vec(static_cast<char*>(p.peer_ws[q]) + gather_off + rank * seg_bytes + j * 16, sent);
    store_output<T>(p.output, own_first + j, p.count, sum);
  };
  // Segments that end before j (the last one may be short) get nothing: marked arrived.
  const auto gather_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank)
        v.v[s] = s * seg + j < vecs ? ld_volatile(my_gather + s * seg_bytes + j * 16) : make_uint4(1u, 1u, 1u, 1u);
    return v;
  };
  const auto gather_poll = [&](uint64_t j, Ranks<N>& v) {
    return lamport_poll<N>(v, rank, my_gather + j * 16, seg_bytes);
  };
  const auto gather_use = [&](uint64_t j, const Ranks<N>& v) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank && s * seg + j < vecs) {
        store_output<T>(p.output, s * seg + j, p.count, gather_canonical(v.v[s]));
        st_vec(my_gather + s * seg_bytes + j * 16, make_uint4(0u, 0u, 0u, 0u));
      }
  };
  constexpr int U = kReduceBatch<N>;
  const uint64_t step = U * stride;
  const auto reduce_and_gather = [&](auto stage_poll) {
    for (uint64_t i0 = first; i0 < seg + step; i0 += step) {
      if (i0 < own_len) batch_step_each<U>(i0, stride, own_len, reduce_load, stage_poll, reduce_use);
      if (i0 >= first + step) batch_step<U>(i0 - step, stride, seg, gather_load, gather_poll, gather_use);
    }
  };
  // After the barrier the stage is complete: the reduce is compiled without the arrival
  // check (an instantiation of its own; skipping the check at run time measured as slow as
  // keeping it: 206 us at 64 MiB on 2 x H200, against 200.5-201.5).
  if (paced) reduce_and_gather(Arrived{});
  else reduce_and_gather(reduce_poll);

  finish_call();
}

}  // namespace ear

EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f32, float, 2)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f32, float, 4)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f32, float, 6)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f32, float, 8)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f32, float, 16)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f16, __half, 2)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f16, __half, 4)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f16, __half, 6)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f16, __half, 8)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, f16, __half, 16)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, bf16, __nv_bfloat16, 2)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, bf16, __nv_bfloat16, 4)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, bf16, __nv_bfloat16, 6)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, bf16, __nv_bfloat16, 8)
EAR_DEFINE_KERNEL(twoshot, ear::twoshot_body, bf16, __nv_bfloat16, 16)
