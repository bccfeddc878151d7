// twoshot.cu: two-shot all-reduce, push flavour (ear_twoshot_<t>_n<N>): reduce-scatter by
// pushing behind a barrier, then a Lamport all-gather (the payload is its own flag).
//
// Protocol (call number seq = State::seq, shared with oneshot.cu; identical on every rank):
//   vectors  vecs = ceil(count / E), split into N segments of seg = ceil(vecs / N) vectors;
//            segment s = vectors [s*seg, min(vecs, (s+1)*seg)) is owned by rank s.
//   layout   stage  = data region + EAR_OFF_TWOSHOT_STAGE,  row r (written by rank r) at
//                     r * EAR_TWOSHOT_SEG_BYTES(m, N);
//            gather = data region + EAR_OFF_TWOSHOT_GATHER, segment s (written by rank s)
//                     at s * EAR_TWOSHOT_SEG_BYTES(m, N); all zero between calls (the host
//                     zero-fills it; every call zeroes what it read). Row/segment strides
//                     come from the workspace size m, not from count, so they never change.
//   Thread (b, t) handles offsets j = b*512 + t (grid-stride) inside EVERY segment, in all
//   phases, so it only ever needs what the same-index thread of each rank wrote.
//   1. scatter  for every s != rank: push our input vector s*seg+j into rank s's stage row
//               `rank` at j (NVLink writes).
//   2. barrier  cta_barrier(2*seq+1).
//   3. reduce   batch by batch: sum, in rank order, our own input (row `rank`) and our stage
//               rows at j for our segment; write gather_canonical(sum) to our output and
//               push it (lamport_sanitize: no all-zero word) into gather segment `rank` of
//               every peer.
//   4. gather   one batch behind phase 3 (so these local copies overlap its NVLink pushes):
//               poll our gather segments s != rank at j until no word is zero, write
//               gather_canonical(value) to our output, zero the slot.
//   (begin_call advances seq for the next call; see State in common.cuh.)
//   In place: each output vector is written by the thread that read the matching input
//   vector, after reading it.
//
// Why reuse is safe with no bank rotation and one barrier: rank r's stage and gather are
// written only by peers and read only by rank r.
//   - stage: a peer s writes r's stage in call seq+1 only after its call seq completed,
//     which needed every gather vector r pushed in call seq, each computed from r's stage
//     loads: r has read its whole stage by then.
//   - gather: a peer writes r's gather in call seq+1 only after the barrier (phase 2) of
//     call seq+1, which CTA b of r joins only once r's call seq (its reads and zeroing of
//     the gather included) has completed (stream order / griddepcontrol.wait). Within a
//     call a slot is written once, so a poll never sees an older call's value.
//   One-shot calls use a disjoint region, and their bank rule holds because every two-shot
//   call also has a barrier joined by CTA 0 of every rank. The fused two-shot (fused_norm.cu)
//   shares stage and gather and also leaves the gather zeroed.
//
// Cost per rank: 2*(N-1)/N*S NVLink writes, local reads, one flag round trip.
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
  const uint64_t stage_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_STAGE(m, N);
  const uint64_t gather_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_GATHER(m, N);
  char* const my_stage = data_region(peer_base<N>(p, rank)) + EAR_OFF_TWOSHOT_STAGE(m, N);
  char* const my_gather = data_region(peer_base<N>(p, rank)) + EAR_OFF_TWOSHOT_GATHER(m, N);

  // 1. scatter: our piece of segment s goes to row `rank` of rank s's stage.
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
            st_vec(static_cast<char*>(p.peer_ws[s]) + stage_off + rank * seg_bytes + j * 16, v.v[s]);
      });

  cta_barrier<N>(p, 2 * c.seq + 1);

  // 3 + 4. reduce our segment a batch at a time; one batch behind, take the other segments
  // from our gather as they arrive.
  const uint64_t own_first = static_cast<uint64_t>(rank) * seg;
  const uint64_t own_len = vecs > own_first ? (vecs - own_first < seg ? vecs - own_first : seg) : 0;
  const auto reduce_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int r = 0; r < N; ++r)
      v.v[r] = (r == rank) ? load_input<T>(p.input, own_first + j, p.count) : ld_cg(my_stage + r * seg_bytes + j * 16);
    return v;
  };
  const auto reduce_use = [&](uint64_t j, const Ranks<N>& v) {
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
  for (uint64_t i0 = first; i0 < seg + step; i0 += step) {
    if (i0 < own_len) batch_step<U>(i0, stride, own_len, reduce_load, Arrived{}, reduce_use);
    if (i0 >= first + step) batch_step<U>(i0 - step, stride, seg, gather_load, gather_poll, gather_use);
  }

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
