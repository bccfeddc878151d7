// push.cu: staged push all-reduce for PCIe (ear_push_staged_<t>_n<N>). On PCIe workstations
// peer writes are the fast and safe direction (posted; on some platforms peer reads never
// complete), and all-to-all peer traffic collapses on a root complex. So a rank only ever
// stores into peers and polls its own memory, and sends to one peer and receives from one peer
// at a time. For messages up to EAR_PUSH_MAX_MSG(ws_max_bytes) (1 MiB).
//
// Protocol (call number seq = State::seq, shared with the one-shot and two-shot families;
// identical on every rank):
//   layout   push region of rank q = data region + EAR_OFF_PUSH: 2 parities x (N-1) rows of
//            EAR_PUSH_ROW_BYTES(m). row(par, s, q) = row EAR_PUSH_ROW(par, s, q, N) holds rank
//            s's vectors, vector i at byte 16*i; written only by rank s, read only by rank q.
//   Thread t of CTA b handles vectors i = b*512 + t (grid-stride) in every phase, so it only
//   reads what the same-index thread of each rank wrote, and per-CTA flags suffice.
//   1. passes  for k = 1..N-1, dst = (rank + k) mod N, src = (rank - k) mod N: store our input
//              vectors into row(seq % 2, rank, dst) of dst (remote stores, never a remote
//              load); bar.sync, and one thread publishes flag_value(seq, k-1) into dst's
//              slot[b][rank] (st.release.sys: cumulative over the CTA's stores) while another
//              waits in OUR slot[b][src] for flag_value(seq, k-1) (>=, bounded, wait.cuh), one
//              acquire, bar.sync (sync.cuh, cta_handoff). Pass k+1 starts only then. In pass k
//              rank r writes to r+k and is written to by r-k: every rank has one outbound and
//              one inbound peer per pass. (The waits between passes pace the traffic; what the
//              reduce needs is only that all N-1 have returned.) At N = 2: one pass, a push
//              one-shot.
//   2. reduce  every peer's vectors are now in our region: for the same vectors i, our own
//              input and row(seq % 2, r, rank) for every r != rank (local loads), summed in
//              rank order 0..N-1 in fp32, written to our output. The same thread reads input i
//              (in every pass and here) before it writes output i: in place is safe.
//   (begin_call advances seq for the next call; see State in sync.cuh.)
//
// Why the flags are right. slot[b][s] of rank q is written only by CTA b of rank s, with values
// that only increase (sync.cuh). In call seq rank s writes it once, in pass k = (q - s) mod N,
// with flag_value(seq, k-1): exactly what q's CTA b waits for in its pass k, whose src is s.
// Whatever an earlier call of any family left in the slot is at most flag_value(seq-1,
// kFlagsPerCall-1) < flag_value(seq, 0), also where the grids differ: a CTA index this call
// has and earlier calls did not finds an old value or zero, and a CTA index of an earlier,
// larger grid is simply not waited on. A larger value means s is already in a later call,
// which it starts only after its call seq completed (its stores included; its later release
// covers them across the kernel boundary). A wait that sees its value therefore sees s's rows.
//
// Why row reuse is safe without an exit barrier. Rank s writes the rows of parity seq % 2 at q
// in call seq, and q reads them at the end of call seq; the next call that writes them is seq+2.
//   - A call of any family completes on a rank only after every peer has started it (oneshot.cu;
//     here: every CTA of s, also one with no vectors, waits in its N-1 passes for a flag of the
//     call from every peer q, which q publishes only after its begin_call, i.e. after its
//     previous call completed).
//   - s starts call seq+2 only after its call seq+1 completed (stream order, or
//     griddepcontrol.wait under PDL, which waits for the whole previous grid), hence after q
//     started call seq+1, hence after q's call seq completed: every CTA of q's grid of call seq,
//     all its loads of the rows returned (they fed its output). So q's reads of call seq are done
//     before s writes the rows again, whatever the grids and sizes of the calls seq, seq+1 and
//     seq+2 and whichever family runs seq+1.
//   - s can run one call ahead of q (s in seq+1 while q still reads seq's rows): it then writes
//     q's rows of the other parity, last read by q in call seq-1, which completed, and q's slots
//     with larger values (above). It cannot run two calls ahead (above).
//   - A CTA that gave up (wait.cuh) still stores and publishes in its remaining passes. Its
//     rank's earlier calls did not give up (a wait that gives up leaves our abort word set, and
//     the next call ends in begin_call), so every peer has completed call seq-2 and reads rows of
//     parity seq % 2 only in its call seq, where they hold exactly what we store.
//   The one-shot's banks and the two-shot's stage rest on the same "complete only after every
//   peer started" property, which a push call provides: the families interleave on one
//   communicator.
//
// Cost per rank: (N-1)*S peer writes, one peer at a time; N-1 flag handoffs on the critical path;
// (N-1)*S local reads.
#include "common.cuh"

namespace ear {

template <typename T, int N>
__device__ __forceinline__ void push_staged_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, EAR_PUSH_MAX_MSG(p.ws_max_bytes));
  const uint64_t* const our_abort = open_call<T>(p);
  const CallCounters c = begin_call(p, our_abort, next_barrier_call);
  const int rank = p.rank;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kThreads;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const auto load = [&](uint64_t i) { return load_input<T>(p.input, i, p.count); };

  // 1. our vectors into our row of each peer, one peer per pass.
  push_passes<N>(p, c.seq, [&](char* row) {
    batched_for<kCopyBatch>(first, stride, vecs, load, [&](uint64_t i, const uint4& v) { st_vec(row + i * 16, v); });
  });

  // 2. reduce in rank order: our input, every peer's row in our region.
  const char* const rows = push_rows<N>(peer_base<N>(p, rank), p.ws_max_bytes, c.seq & 1u);
  const uint64_t row_bytes = EAR_PUSH_ROW_BYTES(p.ws_max_bytes);
  batched_for<kReduceBatch<N>>(
      first, stride, vecs,
      [&](uint64_t i) {
        Ranks<N> v;
#pragma unroll
        for (int r = 0; r < N; ++r)
          v.v[r] = r == rank ? load(i) : ld_cg(rows + (r - (r > rank)) * row_bytes + i * 16);
        return v;
      },
      [&](uint64_t i, const Ranks<N>& v) { store_output<T>(p.output, i, p.count, reduce_in_rank_order<T, N>(v.v)); });

  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_KERNEL, push_staged, ear::push_staged_body)
