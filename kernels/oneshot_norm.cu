// oneshot_norm.cu: one-shot all-reduce fused with residual (+ bias) + RMSNorm, one flag
// barrier per call (ear_oneshot_barrier_norm_<t>_n<N>). Shared numerics and rows: fused.cuh.
//
// Protocol: the plain family's protocol, with the same workspace regions, signal slots
// and state counters (so plain and fused calls interleave on one communicator), described
// at the top of oneshot.cu. The differences:
//   oneshot_norm  bank seq % 2, vector (row*row_vecs + k) at 16*(row*row_vecs + k); CTA b
//                 stages its rows, barrier flag_value(seq, 0), reads its rows from every
//                 bank, sums, adds bias + residual, writes residual_out, normalises.
//                 seq += 1 (the bank reuse argument of oneshot.cu).
#include "fused.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void oneshot_barrier_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  check_fused<T, N>(p, EAR_FUSED_STAGE_BYTES(p.tokens, p.hidden, sizeof(T)), p.ar.ws_max_bytes);
  const uint64_t* const our_abort = open_call<T>(p.ar, &p);
  const CallCounters c = begin_call(p.ar, our_abort, next_barrier_call);
  const uint64_t m = p.ar.ws_max_bytes;
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  const uint64_t bank_off = EAR_OFF_ONESHOT(m, N) + (c.seq & 1u) * EAR_ONESHOT_BANK_BYTES(m);
  char* const own_bank = data_region(peer_base<N>(p.ar, p.ar.rank)) + bank_off;

  // 1. stage our rows (local writes).
  for_cta_rows<kCopyBatch>(
      p, hv, [&](uint64_t row, uint32_t k) { return load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok); },
      [&](uint64_t row, uint32_t k, const uint4& v) { st_vec(own_bank + (row * hv + k) * 16, v); });

  cta_barrier<N>(p.ar, flag_value(c.seq, 0));
  peers_done();  // every bank is complete: the rest only reads

  // 3. per row: pull from every bank, sum in rank order, + bias + residual, norm.
  for (uint64_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    rmsnorm_row<T, kRanksCache<N>, kPrefetchExtras<N>>(
        p, row, hv, vec_ok, false,
        [&](uint32_t k) {
          const uint64_t at = bank_off + (row * hv + k) * 16;
          RowIn<N> in;
#pragma unroll
          for (int r = 0; r < N; ++r) in.x.v[r] = ld_cg(data_region(p.ar.peer_ws[r]) + at);
          fetch_extras<T, N>(p, row, k, vec_ok, in);
          return in;
        },
        Arrived{}, [&](uint32_t k, const RowIn<N>& in) { return sum_add_residual<T, N>(p, in, row, k, vec_ok); });
  }

  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_FUSED_KERNEL, oneshot_barrier_norm, ear::oneshot_barrier_norm_body)
