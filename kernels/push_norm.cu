// push_norm.cu: staged push all-reduce fused with residual (+ bias) + RMSNorm, N-1 flag
// handoffs per call (ear_push_staged_norm_<t>_n<N>). Shared numerics and rows: fused.cuh.
//
// Protocol: the plain family's protocol, with the same workspace regions, signal slots and
// state counters (so plain and fused calls interleave on one communicator), described at the
// top of push.cu. The differences:
//   push_norm  row(seq % 2, s, q) holds rank s's padded token rows, vector (row*row_vecs + k)
//              at 16*(row*row_vecs + k); CTA b handles token rows b, b + grid, ... in every
//              phase. 1. passes: our rows into our row of dst = rank + k, handoff with dst and
//              src = rank - k (push.cuh), k = 1..N-1; 2. per token row: our x and every
//              peer's row from our region, summed in rank order, + bias + residual, norm.
//              seq += 1 (the row reuse argument of push.cu).
#include "fused.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void push_staged_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  const uint64_t m = p.ar.ws_max_bytes;
  check_fused<T, N>(p, EAR_FUSED_STAGE_BYTES(p.tokens, p.hidden, sizeof(T)), EAR_PUSH_MAX_MSG(m));
  const uint64_t* const our_abort = open_call<T>(p.ar, &p);
  const CallCounters c = begin_call(p.ar, our_abort, next_barrier_call);
  const int rank = p.ar.rank;
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  const auto load = [&](uint64_t row, uint32_t k) { return load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok); };

  // 1. our rows into our row of each peer, one peer per pass.
  push_passes<N>(p.ar, c.seq, [&](char* to) {
    for_cta_rows<kCopyBatch>(p, hv, load,
                             [&](uint64_t row, uint32_t k, const uint4& v) { st_vec(to + (row * hv + k) * 16, v); });
  });
  peers_done();  // every peer's rows are in our region: the rest is local

  // 2. per row: our x and every peer's row, summed in rank order, + bias + residual, norm.
  const char* const rows = push_rows<N>(peer_base<N>(p.ar, rank), m, c.seq & 1u);
  const uint64_t row_bytes = EAR_PUSH_ROW_BYTES(m);
  for (uint64_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    rmsnorm_row<T, kRanksCache<N>, kPrefetchExtras<N>>(
        p, row, hv, vec_ok, false,
        [&](uint32_t k) {
          const uint64_t at = (row * hv + k) * 16;
          RowIn<N> in;
#pragma unroll
          for (int r = 0; r < N; ++r)
            in.x.v[r] = r == rank ? load(row, k) : ld_cg(rows + (r - (r > rank)) * row_bytes + at);
          fetch_extras<T, N>(p, row, k, vec_ok, in);
          return in;
        },
        Arrived{}, [&](uint32_t k, const RowIn<N>& in) { return sum_add_residual<T, N>(p, in, row, k, vec_ok); });
  }

  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_FUSED_KERNEL, push_staged_norm, ear::push_staged_norm_body)
