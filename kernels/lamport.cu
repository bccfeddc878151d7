// lamport.cu: one-shot all-reduce, Lamport push flavour (ear_lamport_<t>_n<N>): no barrier;
// the payload is its own flag. For small messages (count * elem_size <=
// EAR_LAMPORT_MAX_MSG(ws_max_bytes), at most 2 MiB).
//
// Protocol (call number k = State::lam_seq, identical on every rank; counted separately
// from the barrier families):
//   layout   lam(q, buf, row) = data region of rank q + EAR_OFF_LAMPORT
//                               + (buf * N + row) * EAR_LAMPORT_ROW_BYTES(m)
//            3 buffers x N rows per rank; row r of rank q's buffer is written only by rank
//            r, read and cleared only by rank q. Row `q` of rank q is never used.
//   empty    an all-zero 32-bit word is "not arrived" (the host zero-fills the workspace).
//            Senders rewrite every all-zero word of their data as 0x80000000 (a -0 in the
//            high half for f16/bf16 pairs, -0.0f for f32); the sum is unchanged because the
//            fp32 accumulator starts at +0.0f and never becomes -0 (common.cuh). Every word
//            of a 16-byte vector is checked, so a store seen in pieces is still waited for.
//   1. push   thread (b, t) takes vectors i = b*512 + t (grid-stride), and stores each one
//             (16-byte stores) into lam(q, k % 3, rank) at 16*i of every peer q.
//   2. clear  our buffer (k + 2) % 3 = the buffer of call k-1: zero the State::lam_prev_vecs
//             vectors that call wrote in each peer row.
//   3. reduce for the same vectors i, poll (ld.volatile, 16 bytes) lam(rank, k % 3, r) of
//             every peer r until no word is zero, sum in rank order 0..N-1 (own value from
//             our input), write our output (after reading input i: in place is safe).
//   4. finish the last CTA sets lam_prev_vecs = vecs and lam_seq = k + 1.
//
// Why the three buffers are safe without any barrier. Invariant: when rank q starts call k,
// its buffers k % 3 and (k+1) % 3 are all zero; buffer (k-1) % 3 holds call k-1's data.
//   - q clears (k-1) % 3 during call k. Nobody writes it then: peers wrote it in call k-1,
//     and q finished call k-1 only after seeing every one of those vectors; a peer would
//     write it again only in call k+2, which needs q's pushes of call k+1.
//   - a peer may run one call ahead (k+1) and write buffer (k+1) % 3 of q while q is still
//     in call k: that buffer was cleared by q in call k-1, which completed before q pushed
//     anything in call k, which the peer needed to finish call k. It cannot run two calls
//     ahead: finishing call k+1 needs q's pushes of call k+1.
//   - the clear size comes from State, so message sizes and grids may change freely
//     between calls (count must be identical on every rank for the same call).
//   Ordering relies on the 16-byte payload store itself, as in TRT-LLM/FlashInfer: the
//   consumer reads nothing else the producer wrote in this call.
//
// Cost per rank: (N-1)*S NVLink writes, (N-1)*S local clears of the previous call, no flag
// round trip.
#include "common.cuh"

namespace ear {

__device__ __forceinline__ uint32_t lamport_word(uint32_t w) { return w == 0u ? 0x80000000u : w; }
__device__ __forceinline__ uint4 lamport_sanitize(uint4 v) {
  return make_uint4(lamport_word(v.x), lamport_word(v.y), lamport_word(v.z), lamport_word(v.w));
}
__device__ __forceinline__ bool lamport_arrived(const uint4& v) {
  return v.x != 0u && v.y != 0u && v.z != 0u && v.w != 0u;
}

template <typename T, int N>
__device__ __forceinline__ void lamport_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, EAR_LAMPORT_MAX_MSG(p.ws_max_bytes));
  pdl_wait();
  const CallCounters c = read_state(p);
  const uint64_t m = p.ws_max_bytes;
  const int rank = p.rank;
  const uint64_t row_bytes = EAR_LAMPORT_ROW_BYTES(m);
  const uint64_t cur = c.lam_seq % 3u;
  const uint64_t prev = (c.lam_seq + 2u) % 3u;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;

  // 1. push our vectors into row `rank` of buffer `cur` of every peer.
  for (uint64_t i = first; i < vecs; i += stride) {
    const uint4 v = lamport_sanitize(load_input<T>(p.input, i, p.count));
#pragma unroll
    for (int d = 1; d < N; ++d) {  // start at the next rank: spreads the NVLink traffic
      int q = rank + d;
      q = q >= N ? q - N : q;
      char* dst = data_region(peer_base<N>(p, q)) + EAR_OFF_LAMPORT(m, N) +
                  (cur * N + rank) * row_bytes + i * 16;
      st_vec(dst, v);
    }
  }

  char* const mine = data_region(peer_base<N>(p, rank)) + EAR_OFF_LAMPORT(m, N);

  // 2. clear what call k-1 left in our buffer `prev`.
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r == rank) continue;
    char* row = mine + (prev * N + r) * row_bytes;
    for (uint64_t i = first; i < c.lam_prev_vecs; i += stride) st_vec(row + i * 16, zero);
  }

  // 3. wait for every peer's vector i, then reduce in rank order.
  // Row r of buffer `cur` is at cur_rows + r * row_bytes (computed per use: an array of N
  // row pointers costs 2N registers and spills at N = 16).
  const char* const cur_rows = mine + cur * N * row_bytes;
  for (uint64_t i = first; i < vecs; i += stride) {
    const char* const at = cur_rows + i * 16;
    uint4 v[N];
#pragma unroll
    for (int r = 0; r < N; ++r)
      v[r] = (r == rank) ? load_input<T>(p.input, i, p.count) : ld_volatile(at + r * row_bytes);
    bool done;
    do {
      done = true;
#pragma unroll
      for (int r = 0; r < N; ++r) {
        if (r != rank && !lamport_arrived(v[r])) {
          done = false;
          v[r] = ld_volatile(at + r * row_bytes);
        }
      }
    } while (!done);
    store_output<T>(p.output, i, p.count, reduce_in_rank_order<T, N>(v));
  }

  finish_call(p, [&](State* st) {
    st->lam_prev_vecs = vecs;
    st->lam_seq = c.lam_seq + 1;
  });
}

}  // namespace ear

EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f32, float, 2)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f32, float, 4)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f32, float, 6)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f32, float, 8)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f32, float, 16)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f16, __half, 2)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f16, __half, 4)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f16, __half, 6)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f16, __half, 8)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, f16, __half, 16)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, bf16, __nv_bfloat16, 2)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, bf16, __nv_bfloat16, 4)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, bf16, __nv_bfloat16, 6)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, bf16, __nv_bfloat16, 8)
EAR_DEFINE_KERNEL(lamport, ear::lamport_body, bf16, __nv_bfloat16, 16)
