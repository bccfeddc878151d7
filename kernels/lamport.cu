// lamport.cu: one-shot all-reduce, Lamport push flavour (ear_oneshot_lamport_<t>_n<N>): no
// barrier; the payload is its own flag. For small messages (count * elem_size <=
// EAR_LAMPORT_MAX_MSG(ws_max_bytes), at most 2 MiB).
//
// Protocol (call number k = State::lam_seq, identical on every rank; counted separately
// from the one-shot and two-shot calls):
//   layout   lam(q, buf, row) = data region of rank q + EAR_OFF_LAMPORT
//                               + (buf * N + row) * EAR_LAMPORT_ROW_BYTES(m)
//            3 buffers x N rows per rank; row r of rank q's buffer is written only by rank
//            r, read and cleared only by rank q. Row `q` of rank q is never used.
//   empty    an all-zero 32-bit word is "not arrived" (the host zero-fills the workspace).
//            Senders rewrite every all-zero word of their data as 0x80000000 (a -0 in the
//            high half for f16/bf16 pairs, -0.0f for f32); the sum is unchanged because the
//            fp32 accumulator starts at +0.0f and never becomes -0 (common.cuh). Every word
//            of a 16-byte vector is checked, so a store seen in pieces is still waited for.
//   1. push   thread (b, t) takes vectors i = b*blockDim + t (grid-stride; the block is
//             EAR_LAMPORT_BLOCK: 128..512 threads), and stores each one
//             (16-byte stores) into lam(q, k % 3, rank) at 16*i of every peer q.
//   2. clear  our buffer (k + 2) % 3 = the buffer of call k-1: zero the State::lam_prev_vecs
//             vectors that call wrote in each peer row.
//   3. reduce for the same vectors i, poll (ld.volatile, 16 bytes) lam(rank, k % 3, r) of
//             every peer r until no word is zero, sum in rank order 0..N-1 (own value from
//             our input), write our output (after reading input i: in place is safe).
//   (after the clear, write_next_counters sets lam_prev_vecs = vecs and lam_seq = k + 1 for
//   the next call.)
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

template <typename T, int N>
__device__ __forceinline__ void oneshot_lamport_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, EAR_LAMPORT_MAX_MSG(p.ws_max_bytes), /*any_block=*/true);
  const uint64_t* const our_abort = open_call<T>(p);
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // The first input does not depend on the counters: loading it before read_call overlaps
  // its latency with the state read's. The push goes one vector at a time: each store leaves
  // as soon as its load returns (batches of 4 measured 0.1-0.3 µs slower at 1 KiB-2 MiB on
  // 2 x H200, docs/PERFORMANCE.md).
  const auto load = [&](uint64_t i) { return lamport_sanitize(load_input<T>(p.input, i, p.count)); };
  uint4 head[1];
  load_batch(head, first, stride, vecs, load);
  const CallCounters c = read_call(p, our_abort);
  const uint64_t m = p.ws_max_bytes;
  const int rank = p.rank;
  const uint64_t row_bytes = EAR_LAMPORT_ROW_BYTES(m);
  const uint64_t cur = c.lam_seq % 3u;
  const uint64_t prev = (c.lam_seq + 2u) % 3u;

  // 1. push our vectors into row `rank` of buffer `cur` of every peer.
  const uint64_t push_off = EAR_OFF_LAMPORT(m, N) + (cur * N + rank) * row_bytes;
  const auto push = [&](uint64_t i, const uint4& v) { lamport_push<N>(p, push_off + i * 16, v); };
  for_rest(head, first, stride, vecs, load, push);

  char* const mine = data_region(peer_base<N>(p, rank)) + EAR_OFF_LAMPORT(m, N);

  // 2. clear what call k-1 left in our buffer `prev`.
  lamport_clear<N>(mine, prev, rank, row_bytes, c.lam_prev_vecs, first, stride);
  // The next call's counters after the push and the clear, which they would delay, and before
  // the poll, which waits anyway.
  write_next_counters(p, next_lamport_call(c, vecs));

  // 3. wait for every peer's vector i, then reduce in rank order, one vector at a time: at
  // decode sizes a thread has one vector, and the batched loop's code (batches of 4 at N = 2,
  // 2 at N = 4) cost 0.15-0.25 us per call at 8-256 KiB on one H100 even so
  // (docs/PERFORMANCE.md, "Design choices the code cites").
  // Row r of buffer `cur` is at cur_rows + r * row_bytes (computed per use: an array of N
  // row pointers costs 2N registers and spills at N = 16).
  const char* const cur_rows = mine + cur * N * row_bytes;
  batched_for_polled<1>(
      first, stride, vecs,
      [&](uint64_t i) {
        Ranks<N> v;
#pragma unroll
        for (int r = 0; r < N; ++r)
          v.v[r] = (r == rank) ? load_input<T>(p.input, i, p.count)
                               : ld_volatile(cur_rows + r * row_bytes + i * 16);
        return v;
      },
      [&](uint64_t i, Ranks<N>& v) { return lamport_poll<N>(v, rank, cur_rows + i * 16, row_bytes); },
      [&](uint64_t i, const Ranks<N>& v) {
        store_output<T>(p.output, i, p.count, reduce_in_rank_order<T, N>(v.v));
      });

  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_KERNEL, oneshot_lamport, ear::oneshot_lamport_body)
