// twoshot.cu: two-shot all-reduce, push flavour (ear_twoshot_<t>_n<N>): reduce-scatter by
// pushing, then all-gather by pushing.
//
// Protocol (call number seq = State::seq, shared with oneshot.cu; identical on every rank):
//   vectors  vecs = ceil(count / E), split into N segments of seg = ceil(vecs / N) vectors;
//            segment s = vectors [s*seg, min(vecs, (s+1)*seg)) is owned by rank s.
//   layout   stage  = data region + EAR_OFF_TWOSHOT_STAGE,  row r (written by rank r) at
//                     r * EAR_TWOSHOT_SEG_BYTES(m, N);
//            gather = data region + EAR_OFF_TWOSHOT_GATHER, segment s (written by rank s)
//                     at s * EAR_TWOSHOT_SEG_BYTES(m, N). Row/segment strides come from the
//                     workspace size m, not from count, so they never change.
//   Thread (b, t) handles offsets j = b*512 + t (grid-stride) inside EVERY segment, in all
//   three phases, so it only ever needs what the same-index CTA of each rank wrote.
//   1. scatter  for every s != rank: push our input vector s*seg+j into rank s's stage row
//               `rank` at j (NVLink writes).
//   2. barrier  cta_barrier(2*seq+1).
//   3. reduce   sum, in rank order, our own input (row `rank`) and our stage rows at j for
//               our segment; write the result to our output and push it into gather
//               segment `rank` of every peer.
//   4. barrier  cta_barrier(2*seq+2).
//   5. gather   copy our gather segments s != rank at j into our output (local reads).
//   (begin_call advances seq for the next call; see State in common.cuh.)
//   In place: each output vector is written by the thread that read the matching input
//   vector, after reading it.
//
// Why reuse is safe with no bank rotation: rank r's stage and gather are written only by
// peers and read only by rank r. A peer writes r's stage in call seq+1 only after it has
// finished call seq, whose last barrier (4) needed every CTA of r to have arrived, i.e. to
// be done reading its stage rows in phase 3. A peer writes r's gather in call seq+1 only
// after the first barrier (phase 2) of call seq+1, which CTA b of r joins only once r's
// call seq (phase 5 included) has completed (stream order / griddepcontrol.wait). One-shot calls use a disjoint region, and their bank rule holds
// because every two-shot call also has a barrier joined by CTA 0 of every rank.
//
// Cost per rank: 2*(N-1)/N*S NVLink writes, local reads, two flag round trips.
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

  // 3. reduce our segment; the result goes to our output and to every peer's gather.
  const uint64_t own_first = static_cast<uint64_t>(rank) * seg;
  const uint64_t own_len = vecs > own_first ? (vecs - own_first < seg ? vecs - own_first : seg) : 0;
  batched_for<kReduceBatch<N>>(
      first, stride, own_len,
      [&](uint64_t j) {
        Ranks<N> v;
#pragma unroll
        for (int r = 0; r < N; ++r)
          v.v[r] = (r == rank) ? load_input<T>(p.input, own_first + j, p.count)
                               : ld_cg(my_stage + r * seg_bytes + j * 16);
        return v;
      },
      [&](uint64_t j, const Ranks<N>& v) {
        const uint4 sum = reduce_in_rank_order<T, N>(v.v);
#pragma unroll
        for (int q = 0; q < N; ++q)
          if (q != rank)
            st_vec(static_cast<char*>(p.peer_ws[q]) + gather_off + rank * seg_bytes + j * 16, sum);
        store_output<T>(p.output, own_first + j, p.count, sum);
      });

  cta_barrier<N>(p, 2 * c.seq + 2);

  // 5. gather the other segments from our own memory.
  batched_for<kReduceBatch<N>>(
      first, stride, seg,
      [&](uint64_t j) {
        Ranks<N> v;
#pragma unroll
        for (int s = 0; s < N; ++s)
          if (s != rank && s * seg + j < vecs) v.v[s] = ld_cg(my_gather + s * seg_bytes + j * 16);
        return v;
      },
      [&](uint64_t j, const Ranks<N>& v) {
#pragma unroll
        for (int s = 0; s < N; ++s)
          if (s != rank && s * seg + j < vecs) store_output<T>(p.output, s * seg + j, p.count, v.v[s]);
      });

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
