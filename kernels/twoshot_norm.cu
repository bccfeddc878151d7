// twoshot_norm.cu: two-shot all-reduce fused with residual (+ bias) + RMSNorm, two flag
// barriers per call (ear_twoshot_barrier_norm_<t>_n<N>). Shared numerics and rows: fused.cuh.
//
// Protocol: the plain family's protocol, with the same workspace regions, signal slots
// and state counters (so plain and fused calls interleave on one communicator), described
// at the top of twoshot.cu. The differences:
//   twoshot_norm  row split into N column slices of cs = ceil(row_vecs/N) vectors, rank s
//                 owns slice s of every row; the stage row of writer r (the plain
//                 two-shot's, parity seq % 2) and gather segment s hold vector
//                 (row*cs + c) at 16*(row*cs + c).
//                   1. push slice s != rank of our x rows to our row of rank s's stage;
//                   2. barrier flag_value(seq, 0);
//                   3. our slice: own x + stage rows in rank order (the slots in the
//                      stage's polled prefix zeroed: the plain two-shot polls it), + bias
//                      + residual, round:
//                      write our residual_out and push it into gather segment `rank` of
//                      every peer;
//                   4. barrier flag_value(seq, 1);
//                   5. per row: residual_out slices s != rank from our gather (written to
//                      residual_out, the gather slot zeroed: the plain two-shot polls it),
//                      our slice re-read from residual_out, then the norm of the full row,
//                      locally on every rank (bit-identical: same rounded residual_out,
//                      same order).
//                 Reuse argument of twoshot.cu (stage parity seq % 2 read and zeroed in
//                 the call; gather written after barrier 2 and read before the call
//                 ends). The owner applies ITS residual and bias to its slice: these must
//                 be identical on every rank (TP).
#include "fused.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void twoshot_barrier_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  const uint64_t m = p.ar.ws_max_bytes;
  check_fused<T, N>(p, EAR_FUSED_TWOSHOT_SEG_NEED(p.tokens, p.hidden, sizeof(T), N),
                    EAR_TWOSHOT_SEG_BYTES(m, N));
  const uint64_t* const our_abort = open_call<T>(p.ar, &p);
  const CallCounters c = begin_call(p.ar, our_abort, next_barrier_call);
  const int rank = p.ar.rank;
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  const uint32_t cs = (hv + N - 1) / N;  // column slice, in vectors
  const uint64_t seg_bytes = EAR_TWOSHOT_SEG_BYTES(m, N);
  const uint64_t stage_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_STAGE(m, N);
  const uint64_t gather_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_GATHER(m, N);
  char* const mine = static_cast<char*>(peer_base<N>(p.ar, rank));
  const uint64_t par = c.seq & 1u;
  const auto stage_at = [&](int r, uint64_t row, uint32_t col) {
    return mine + stage_off + EAR_TWOSHOT_STAGE_ROW(par, r, rank, N) * seg_bytes + (row * cs + col) * 16;
  };

  // 1. scatter: slice s of our rows goes to row `rank` of rank s's stage (chunk k of a row
  // is column k % cs of slice k / cs).
  for_cta_rows<kCopyBatch>(
      p, hv, [&](uint64_t row, uint32_t k) { return load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok); },
      [&](uint64_t row, uint32_t k, const uint4& v) {
        const uint32_t s = k / cs;
        if (s != static_cast<uint32_t>(rank))
          st_vec(static_cast<char*>(peer_base<N>(p.ar, s)) + stage_off +
                     EAR_TWOSHOT_STAGE_ROW(par, rank, s, N) * seg_bytes + (row * cs + (k - s * cs)) * 16,
                 v);
      });

  cta_barrier<N>(p.ar, flag_value(c.seq, 0));

  // 3. our slice: reduce, + bias + residual, round; write it and push it to every peer.
  const uint32_t own_first = rank * cs;
  const uint32_t own_len = hv > own_first ? (hv - own_first < cs ? hv - own_first : cs) : 0u;
  const uint64_t rows = p.tokens > blockIdx.x ? (p.tokens - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  batched_for<kReduceBatch<N>>(
      threadIdx.x, blockDim.x, rows * own_len,
      [&](uint64_t f) {
        const uint64_t row = blockIdx.x + (f / own_len) * gridDim.x;
        const uint32_t col = static_cast<uint32_t>(f % own_len);
        const uint32_t k = own_first + col;
        RowIn<N> in;
#pragma unroll
        for (int r = 0; r < N; ++r)
          in.x.v[r] = (r == rank) ? load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok)
                                  : ld_cg(stage_at(r, row, col));
        fetch_extras<T, N>(p, row, k, vec_ok, in);
        return in;
      },
      [&](uint64_t f, const RowIn<N>& in) {
        const uint64_t row = blockIdx.x + (f / own_len) * gridDim.x;
        const uint32_t col = static_cast<uint32_t>(f % own_len);
        // The plain two-shot polls the stage's prefix: leave it zeroed (twoshot.cu).
        if (row * cs + col < twoshot_polled_seg(N)) {
#pragma unroll
          for (int r = 0; r < N; ++r)
            if (r != rank) st_vec(stage_at(r, row, col), make_uint4(0u, 0u, 0u, 0u));
        }
        const uint4 out = sum_add_residual<T, N>(p, in, row, own_first + col, vec_ok);
        const uint64_t slot = (row * cs + col) * 16;
#pragma unroll
        for (int q = 0; q < N; ++q)
          if (q != rank)
            st_vec(static_cast<char*>(p.ar.peer_ws[q]) + gather_off + rank * seg_bytes + slot, out);
      });

  cta_barrier<N>(p.ar, flag_value(c.seq, 1));
  peers_done();  // the gather is complete: the rest is local

  // 5. full rows from our gather segments and our own slice, then the norm, locally.
  for (uint64_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    rmsnorm_row<T>(
        p, row, hv, vec_ok, false,
        [&](uint32_t k) {
          const uint32_t s = k / cs;
          if (s == static_cast<uint32_t>(rank))  // written in phase 3 by this CTA (bar.sync since)
            return load_row_chunk<T>(p.residual_out, row, p.hidden, k, vec_ok);
          return ld_cg(mine + gather_off + s * seg_bytes + (row * cs + (k - s * cs)) * 16);
        },
        Arrived{},
        [&](uint32_t k, const uint4& v) {
          const uint32_t s = k / cs;
          if (s != static_cast<uint32_t>(rank)) {
            store_row_chunk<T>(p.residual_out, row, p.hidden, k, vec_ok, v);
            // The plain two-shot polls the gather: leave it zeroed (twoshot.cu).
            st_vec(mine + gather_off + s * seg_bytes + (row * cs + (k - s * cs)) * 16, make_uint4(0u, 0u, 0u, 0u));
          }
          return v;
        });
  }

  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_FUSED_KERNEL, twoshot_barrier_norm, ear::twoshot_barrier_norm_body)
