// twoshot.cu: two-shot all-reduce, push flavour, polled (ear_twoshot_polled_<t>_n<N>): a Lamport
// reduce-scatter (the payload is its own flag) into a stage that alternates between two
// parities, then a Lamport all-gather. Messages up to kTwoShotPacedAbove wait only by
// polling data; larger ones are paced by per-chunk flags (below).
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
//   Thread t of CTA b handles offsets j = b*W + t (grid-stride) inside EVERY segment, in all
//   phases, so it only ever needs what the same-index thread of each rank wrote. W = 512;
//   in a paced call warp 0 handles the flags and W = 480 "movers" (warps 1-15) the data.
//   1. scatter  for every s != rank: push lamport_sanitize(our input vector s*seg+j) into
//               our row of rank s's stage at j (NVLink writes).
//   2. reduce   batch by batch: poll our stage rows at j for our segment until no word is
//               zero (paced: the same for the chunks wholly in the polled prefix; past it,
//               wait for the chunk's flags instead, no check), zero them if j is in the
//               polled prefix, sum in rank order our own input and the rows; write
//               gather_canonical(sum) to our output and push it (sanitized) into gather
//               segment `rank` of every peer. (The sanitize rewrite of the scattered input
//               is exact: a -0 summand leaves an accumulator that starts at +0.0f unchanged.)
//   3. gather   one batch behind phase 2 (so these local copies overlap its NVLink pushes):
//               poll our gather segments s != rank at j until no word is zero, write
//               gather_canonical(value) to our output, zero the slot.
//   Paced (count * sizeof(T) > kTwoShotPacedAbove): the movers' batches are grouped in
//   chunks (at most kFlagsPerCall per CTA), and the phases pipelined: step k scatters chunk
//   k, then waits for chunk k-2 (polls it if it lies in the polled prefix, else waits for its
//   flags) and reduces it (each reduced batch followed by the gather of the one before).
//   Warp 0 publishes flag_value(seq, k) to every peer once the movers have issued chunk k's
//   scatter (bar.arrive / bar.sync, then flag_exchange) and waits for theirs, so a chunk's
//   flag round trip overlaps the next chunks' scatter.
//   (begin_call advances seq for the next call; see State in common.cuh.)
//   In place: each output vector is written by the thread that read the matching input
//   vector, after reading it.
//
// Why reuse is safe without an exit barrier. Every call of every family completes on a rank
// only after every peer has started it (here: segment 0 is never empty, its owner needs every
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
//   after every peer started" property). The fused two-shot (twoshot_norm.cu) uses the same
//   stage rows and gather and leaves the gather and the stage's polled prefix zeroed too.
//
// Cost per rank: 2*(N-1)/N*S NVLink writes, local reads and zeroing; paced: a flag round
// trip per chunk, overlapped with the next chunks' transfer.
#include "common.cuh"

namespace ear {

// Paced path: chunks scattered ahead of the one being reduced (2 x H200, 16 / 64 MiB: depth 1
// 53.2 / 192.0 us, 2: 52.8 / 191.6, 3: 53.0 / 192.0, 5: 53.2 / 192.7).
constexpr uint32_t kPipelineDepth = 2;
// Named barriers of the paced path (id 0 is __syncthreads'), kIds per kind, chunk k on
// id + k % kIds: kScattered, the movers have issued chunk k's scatter; kReady, every peer's
// chunk k has landed in our stage.
constexpr uint32_t kIds = kPipelineDepth + 1;  // ids per barrier kind (see the reuse rule)
constexpr uint32_t kScattered = 1, kReady = 1 + kIds;
static_assert(kReady + kIds <= 16, "16 named barriers per CTA");

// bar.sync (sync) or bar.arrive on id Base + r, r < kIds, all kThreads threads taking part.
// The id is a literal in every branch: a computed id makes ptxas reserve all 16 barriers.
template <uint32_t Base, uint32_t I = 0>
__device__ __forceinline__ void bar_op(bool sync, uint32_t r) {
  if constexpr (I + 1 < kIds) {
    if (r != I) return bar_op<Base, I + 1>(sync, r);
  }
  if (sync) bar_sync(Base + I, kThreads);
  else bar_arrive(Base + I, kThreads);
}

// Vectors per thread per batch (registers: 4 * N * batch). 2 at 2 ranks: on 2 x H200,
// against 4, 4 / 16 / 64 MiB took 14.9 / 53.2 / 191.8 us instead of 15.5 / 54.4 / 194.6 (more,
// smaller chunks; pipeline one deep); 1 was slower above 8 MiB (55.7 us at 16 MiB).
template <int N>
constexpr int kTwoShotBatch = N <= 4 ? 2 : 1;
// The gather of a batch follows the reduce of the batch this many batches later (paced path
// on 2 x H200, pipeline one deep, 16 / 64 MiB: lag 0 53.1 / 193.2 us, 1: 53.2 / 191.8, 2: 54.3 /
// 192.9, 4: 56.6 / 196.6).
constexpr uint32_t kGatherLag = 1;

template <typename T, int N>
__device__ __forceinline__ void twoshot_polled_body(const EarAllReduceParams& p) {
  check_params<T, N>(p, p.ws_max_bytes);
  const uint64_t* const our_abort = open_call<T>(p);
  const CallCounters c = begin_call(p, our_abort, next_barrier_call);
  const uint64_t m = p.ws_max_bytes;
  const int rank = p.rank;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t seg = (vecs + N - 1) / N;
  const uint64_t seg_bytes = EAR_TWOSHOT_SEG_BYTES(m, N);
  // Paced (large) calls give warp 0 to the flags; the other warps move the data.
  const bool paced = p.count * sizeof(T) > kTwoShotPacedAbove;
  const uint32_t movers = paced ? kThreads - 32 : kThreads;
  const uint32_t mover = threadIdx.x - (kThreads - movers);  // wraps for warp 0 when paced
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * movers;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * movers + mover;

  // Peer addresses are recomputed from the params (constant bank) at each use: arrays of
  // 2N pointers would take 4N registers.
  const uint64_t par = c.seq & 1u;
  const uint64_t stage_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_STAGE(m, N);
  const uint64_t gather_off = EAR_SIGNAL_BYTES + EAR_OFF_TWOSHOT_GATHER(m, N);
  char* const my_stage = data_region(peer_base<N>(p, rank)) + EAR_OFF_TWOSHOT_STAGE(m, N);
  char* const my_gather = data_region(peer_base<N>(p, rank)) + EAR_OFF_TWOSHOT_GATHER(m, N);

  // 1. scatter: our piece of segment s goes to our row of rank s's stage.
  const auto scatter_load = [&](uint64_t j) {
    Ranks<N> v;
#pragma unroll
    for (int s = 0; s < N; ++s) {
      const uint64_t vi = s * seg + j;
      if (s != rank && vi < vecs) v.v[s] = load_input<T>(p.input, vi, p.count);
    }
    return v;
  };
  const auto scatter_use = [&](uint64_t j, const Ranks<N>& v) {
#pragma unroll
    for (int s = 0; s < N; ++s)
      if (s != rank && s * seg + j < vecs)
        st_vec(static_cast<char*>(p.peer_ws[s]) + stage_off + EAR_TWOSHOT_STAGE_ROW(par, rank, s, N) * seg_bytes +
                   j * 16,
               lamport_sanitize(v.v[s]));
  };

  // 2. reduce our segment as the peers' pieces arrive; 3. one step behind, take the other
  // segments from our gather as they arrive.
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
  constexpr int U = kTwoShotBatch<N>;
  const uint64_t step = U * stride;  // one batch of every thread
  const auto scatter_batch = [&](uint64_t i0) {
    if (i0 < seg) batch_step<U>(i0, stride, seg, scatter_load, Arrived{}, scatter_use);
  };
  const auto gather_batch = [&](uint64_t i0) {
    if (i0 < seg) batch_step<U>(i0, stride, seg, gather_load, gather_poll, gather_use);
  };

  if (!paced) {
    // Small messages: no flags at all, every wait is a poll on data.
    const uint64_t lag = kGatherLag * step;
    for (uint64_t i0 = first; i0 < seg; i0 += step) scatter_batch(i0);
    for (uint64_t i0 = first; i0 < seg + lag; i0 += step) {
      if (i0 < own_len) batch_step_each<U>(i0, stride, own_len, reduce_load, reduce_poll, reduce_use);
      if (i0 >= first + lag) gather_batch(i0 - lag);
    }
    finish_call();
    return;
  }

  // Large messages: a pipeline of chunks (chunk k = batches [k*cb, (k+1)*cb) of every
  // mover), each past the polled prefix with its own flag, flag_value(seq, k). The movers
  // scatter chunk k+D before they wait for chunk k (D = kPipelineDepth), so the link stays
  // busy while chunk k's flags make their round trip; warp 0 publishes chunk k's flag once
  // the movers have issued its scatter and waits for the peers'. After a flag the stage chunk is complete: the reduce
  // is compiled without the arrival check. Flags pace the CTAs as much as they order the
  // data: with polls only, 64 MiB took 216-227 us on 2 x H200; with one barrier after the
  // whole scatter 200.5; pipelined 191.5-191.7 (docs/PERFORMANCE.md).
  // A barrier id is reused for chunk k+kIds only after its chunk-k instance completed: the
  // movers arrive at kScattered(k+D+1) in step k+D+1, after step k+D waited on kReady(k),
  // which warp 0 arrives at after kScattered(k); warp 0 arrives at kReady(k+D+1) after
  // kScattered(k+D+1), which the movers reach after kReady(k). Polled chunks (below) touch
  // no barrier, and they are a prefix, so the flagged chunks' ids stay consecutive.
  const uint64_t cta_first = static_cast<uint64_t>(blockIdx.x) * movers;
  const uint32_t batches = seg > cta_first ? static_cast<uint32_t>((seg - cta_first + step - 1) / step) : 0u;
  const uint32_t cb = (batches + kFlagsPerCall - 1) / kFlagsPerCall;
  const uint32_t chunks = cb == 0 ? 0u : (batches + cb - 1) / cb;  // <= kFlagsPerCall
  // Chunks k < polled lie wholly in the stage's polled prefix (their vectors j < (k+1) *
  // chunk_vecs <= twoshot_polled_seg): they are polled like a small call's stage, with no
  // flag. A flag's st.release takes 7-10 us, as long as the SM's whole queue of NVLink
  // stores (the next chunks' included) takes to drain, so fewer flags stall the movers less
  // (2 x H200, 12 / 16 / 24 MiB: 40.8 / 52.8 / 75.8 us with a flag per chunk, 40.5 / 52.4 /
  // 75.6 with the prefix polled; a 12 or 16 MiB prefix was slower: 41.3-44.2 at 12 MiB).
  const uint64_t chunk_vecs = static_cast<uint64_t>(cb) * step;
  const uint32_t polled =
      chunk_vecs == 0 ? 0u : static_cast<uint32_t>(min(static_cast<uint64_t>(chunks), twoshot_polled_seg(N) / chunk_vecs));
  if (threadIdx.x < 32) {
    for (uint32_t k = polled; k < chunks; ++k) {
      bar_op<kScattered>(true, k % kIds);
      flag_exchange<N>(p, flag_value(c.seq, k), static_cast<int>(threadIdx.x));
      __syncwarp();
      bar_op<kReady>(false, k % kIds);
    }
  } else if (chunks > 0) {
    const uint32_t total = chunks * cb;  // batches, empty ones (past seg) included
    const auto at = [&](uint32_t b) { return first + static_cast<uint64_t>(b) * step; };
    // Step j: scatter chunk j; reduce chunk j-D once its flags are in, each reduced batch
    // followed by the gather of the batch kGatherLag before it (the last step only
    // gathers). Each phase is written once: fewer registers than a prologue and epilogue.
    constexpr uint32_t D = kPipelineDepth;
    for (uint32_t j = 0; j < chunks + D + 1; ++j) {
      if (j < chunks) {
#pragma unroll 1
        for (uint32_t b = j * cb; b < (j + 1) * cb; ++b) scatter_batch(at(b));
        if (j >= polled) bar_op<kScattered>(false, j % kIds);
      }
      if (j < D) continue;
      const uint32_t k = j - D;  // the chunk to reduce
      const bool reducing = k < chunks;
      const bool poll = k < polled;
      if (reducing && !poll) bar_op<kReady>(true, k % kIds);
      const uint32_t end = reducing ? (k + 1) * cb : total + kGatherLag;
#pragma unroll 1
      for (uint32_t b = k * cb; b < end; ++b) {
        const uint64_t i0 = at(b);
        if (reducing && i0 < own_len) {
          if (poll) batch_step_each<U>(i0, stride, own_len, reduce_load, reduce_poll, reduce_use);
          else batch_step_each<U>(i0, stride, own_len, reduce_load, Arrived{}, reduce_use);
        }
        if (b >= kGatherLag) gather_batch(at(b - kGatherLag));
      }
    }
  }
  finish_call();
}

}  // namespace ear

EAR_DEFINE_INSTANCES(EAR_DEFINE_KERNEL, twoshot_polled, ear::twoshot_polled_body)
