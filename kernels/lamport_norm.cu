// lamport_norm.cu: Lamport one-shot all-reduce fused with residual (+ bias) + RMSNorm, no
// barrier: the payload is its own flag (ear_oneshot_lamport_norm_<t>_n<N>). Shared numerics
// and rows: fused.cuh.
//
// Protocol: the plain family's protocol, with the same workspace regions, signal slots
// and state counters (so plain and fused calls interleave on one communicator), described
// at the top of lamport.cu. The differences:
//   lamport_norm  buffer lam_seq % 3, row r of a buffer holds rank r's padded rows, vector
//                 (row*row_vecs + k); 1. push all our rows (sanitized, 16-byte stores; out
//                 of place every CTA an even contiguous share (cta_share), in place each
//                 CTA its own rows), 2. clear the previous call's lam_prev_vecs vectors of
//                 each peer row (even shares: any mapping clears the same set), 3. per
//                 row: poll the peers' vectors until no word is zero, sum in rank order
//                 (own value from x), + bias + residual, norm. lam_prev_vecs =
//                 tokens*row_vecs. The -0 sentinel rewrite only touches the x payload: it
//                 is summed into an fp32 accumulator that starts at +0.0f (never -0),
//                 before bias and residual, so results are unchanged. Plain path only (no
//                 clusters/DSMEM): one CTA per row, works on sm_80+.
#include "fused.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void oneshot_lamport_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  const uint64_t m = p.ar.ws_max_bytes;
  check_fused<T, N>(p, EAR_FUSED_STAGE_BYTES(p.tokens, p.hidden, sizeof(T)), EAR_LAMPORT_MAX_MSG(m));
  const uint64_t* const our_abort = open_call<T>(p.ar, &p);
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  const bool in_place = p.normed == p.ar.input;
  const uint64_t vecs = p.tokens * hv;
  const auto load = [&](uint64_t row, uint32_t k) {
    return lamport_sanitize(load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok));
  };
  const auto load_flat = [&](uint64_t i) { return load(i / hv, static_cast<uint32_t>(i % hv)); };
  const CallCounters c = read_call(p.ar, our_abort);
  const int rank = p.ar.rank;
  const uint64_t row_bytes = EAR_LAMPORT_ROW_BYTES(m);
  const uint64_t cur = c.lam_seq % 3u;
  const uint64_t prev = (c.lam_seq + 2u) % 3u;

  // 1. push all our rows into row `rank` of buffer `cur` of every peer. Out of place, every
  // CTA of the grid (more CTAs than rows when rows are few) pushes an even share; in place
  // (normed == x) each CTA pushes only the rows it owns, so no CTA reads x of a row whose
  // owner may already have written normed over it.
  const uint64_t push_off = EAR_OFF_LAMPORT(m, N) + (cur * N + rank) * row_bytes;
  const auto push = [&](uint64_t row, uint32_t k, const uint4& v) {
    lamport_push<N>(p.ar, push_off + (row * hv + k) * 16, v);
  };
  // The push goes one vector at a time (not in batches): stores then leave in row order, so
  // early rows arrive first and their CTAs start the norm while later rows are in flight
  // (0.2-0.5 µs faster at every decode shape on 2 x H200, docs/PERFORMANCE.md).
  if (in_place) {
    for_cta_rows<kPushBatch<N>>(p, hv, load, push);
  } else {
    // Flat vector i is (row i / hv, chunk i % hv) and lands at 16 i; with rows a multiple of
    // 16 bytes (vec_ok) it is also vector i of x: no 64-bit division (0.1 us at 1 x 4096).
    const auto load_at = [&](uint64_t i) {
      return vec_ok ? lamport_sanitize(load_input<T>(p.ar.input, i, p.ar.count)) : load_flat(i);
    };
    const CtaShare share = cta_share(vecs);
    batched_for<1>(share.first, blockDim.x, share.end, load_at,
                   [&](uint64_t i, const uint4& v) { lamport_push<N>(p.ar, push_off + i * 16, v); });
  }

  char* const lam = data_region(peer_base<N>(p.ar, rank)) + EAR_OFF_LAMPORT(m, N);

  // 2. clear what the previous Lamport call (plain or fused) left in our buffer `prev`, in
  // even shares as the push.
  const CtaShare cleared = cta_share(c.lam_prev_vecs);
  lamport_clear<N>(lam, prev, rank, row_bytes, cleared.end, cleared.first, blockDim.x);
  write_next_counters(p.ar, next_lamport_call(c, vecs));  // after the push, as lamport.cu

  // 3. per row: wait for every peer's chunk, sum in rank order, + bias + residual, norm.
  const char* const cur_rows = lam + cur * N * row_bytes;
  for (uint64_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    rmsnorm_row<T, kRanksCache<N>, kPrefetchExtras<N>>(
        p, row, hv, vec_ok, row + gridDim.x >= p.tokens,
        [&](uint32_t k) {
          const char* const at = cur_rows + (row * hv + k) * 16;
          RowIn<N> in;
#pragma unroll
          for (int r = 0; r < N; ++r)
            in.x.v[r] = (r == rank) ? load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok)
                                    : ld_volatile(at + r * row_bytes);
          fetch_extras<T, N>(p, row, k, vec_ok, in);
          return in;
        },
        [&](uint32_t k, RowIn<N>& in) { return lamport_poll<N>(in.x, rank, cur_rows + (row * hv + k) * 16, row_bytes); },
        [&](uint32_t k, const RowIn<N>& in) { return sum_add_residual<T, N>(p, in, row, k, vec_ok); });
  }

  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_FUSED_KERNEL, oneshot_lamport_norm, ear::oneshot_lamport_norm_body)
