// fused_norm.cu: all-reduce fused with residual (+ bias) + RMSNorm, three rank families
// (ear_oneshot_barrier_norm_<t>_n<N>: one barrier; ear_twoshot_barrier_norm_<t>_n<N>: two;
// ear_oneshot_lamport_norm_<t>_n<N>: none, the payload is its own flag) and the
// rank-less epilogue alone (ear_residual_rmsnorm_<t>, after an NCCL all-reduce). The host
// contract (EarFusedParams, EAR_FUSED_BLOCK/GRID, size rules) is in allreduce_params.h.
//
// Numerics (every kernel, every rank): per element, in fp32,
//   acc = +0.0f; acc += x_0; ...; acc += x_{N-1};   (rank order, as reduce_in_rank_order)
//   acc += bias (if any); acc += residual;           residual_out = round_T(acc)
// then per token row, from the T-ROUNDED residual_out r (so normed is a pure function of
// the stored residual_out, whichever family produced it):
//   ss = sum of fmaf(r_i, r_i, .) over the row: each thread over its chunks in order, then
//        block_sum (fixed order for the block size EAR_FUSED_BLOCK(hidden, elem))
//   s  = 1.0f / sqrtf(ss / hidden + eps)             (IEEE div and sqrt, not rsqrtf)
//   normed_i = round_T((r_i * s) * gamma_i)
// The standalone kernel gets x already summed and rounded to T (by NCCL) and applies the
// same formula with N = 1. NaN/Inf propagate as in IEEE arithmetic (an Inf in a row makes
// ss = Inf, s = 0: the Inf element becomes NaN, the others +-0, as in an fp64 reference);
// the fp32 sum of squares overflows for |r| >~ 1.8e19 / sqrt(hidden) (bf16/f32 only).
//
// Work mapping (all families): CTA b handles token rows b, b + gridDim.x, ... in EVERY
// phase (Lamport out of place: the push is spread flat over the whole grid, which may have
// more CTAs than rows; nothing waits on who pushed what); inside a row, thread t handles 16-byte chunks k = t, t + blockDim.x, ... (chunk k
// = elements [k*E, k*E+E) of the row; the last chunk of a row may be partial). A row is
// staged with a pitch of row_vecs = ceil(hidden*elem/16) vectors (rows padded to 16 bytes,
// padding = +0), so a vector never straddles two rows and the per-CTA barriers suffice:
// each CTA only ever needs what the same-index CTA of each rank wrote for the same rows.
// In place: normed may equal x and residual_out may equal residual. Every element of x or
// residual of a row is read, by this CTA only, before any write of that row's outputs (the
// norm's block_sum separates the reads from the normed stores; residual chunk k is read and
// residual_out chunk k written by the same thread).
//
// The norm keeps a thread's first KC chunks of a row in registers with their inputs, all
// loaded (and, for Lamport, polled) together before the first is used (rows up to KC*512
// vectors; KC = kCache for the two-shot and the standalone kernel, kRanksCache<N> for the
// families that fetch N vectors per chunk); chunks beyond that are re-read from residual_out
// (written by the same thread) for the normed pass.
//
// Protocols: the plain families' protocols, with the same workspace regions, signal slots
// and state counters (so plain and fused calls interleave on one communicator), described
// at the top of oneshot.cu, twoshot.cu, lamport.cu. Differences:
//   oneshot_norm  bank seq % 2, vector (row*row_vecs + k) at 16*(row*row_vecs + k); CTA b
//                 stages its rows, barrier flag_value(seq, 0), reads its rows from every
//                 bank, sums, adds bias + residual, writes residual_out, normalises.
//                 seq += 1 (the bank reuse argument of oneshot.cu).
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
//   lamport_norm  buffer lam_seq % 3, row r of a buffer holds rank r's padded rows, vector
//                 (row*row_vecs + k); 1. push all our rows (sanitized, 16-byte stores; every
//                 CTA a flat share out of place, each CTA its own rows in place),
//                 2. clear the previous call's lam_prev_vecs vectors of each peer row
//                 (flat grid-stride: any mapping clears the same set), 3. per row: poll the
//                 peers' vectors until no word is zero, sum in rank order (own value from
//                 x), + bias + residual, norm. lam_prev_vecs = tokens*row_vecs. The -0
//                 sentinel rewrite only touches the x payload: it is summed into an fp32
//                 accumulator that starts at +0.0f (never -0), before bias and residual, so
//                 results are unchanged. Plain path only (no clusters/DSMEM): one CTA per
//                 row, works on sm_80+.
#include "common.cuh"

namespace ear {

// Chunks per thread the norm keeps in registers (rows up to KC*blockDim vectors stay in
// registers, with their fetched inputs and gamma). Families that fetch N vectors per chunk
// keep fewer as N grows, to stay under the 128-register cap of a 512-thread CTA.
constexpr int kCache = 4;
template <int N>
constexpr int kRanksCache = N <= 4 ? 2 : 1;

// Every (row, k) chunk of this CTA's token rows (rows blockIdx.x, blockIdx.x + gridDim.x,
// ...), batched: load(row, k) for a batch of chunks, then use(row, k, loaded) for each. The
// CTA that owns a row is the only one that reads its x (in place, normed may equal x).
template <int U, typename Load, typename Use>
__device__ __forceinline__ void for_cta_rows(const EarFusedParams& p, uint32_t hv, Load load, Use use) {
  const uint64_t rows = p.tokens > blockIdx.x ? (p.tokens - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const auto at = [&](uint64_t f, uint64_t& row, uint32_t& k) {
    row = blockIdx.x + (f / hv) * gridDim.x;
    k = static_cast<uint32_t>(f % hv);
  };
  batched_for<U>(
      threadIdx.x, blockDim.x, rows * hv,
      [&](uint64_t f) {
        uint64_t row;
        uint32_t k;
        at(f, row, k);
        return load(row, k);
      },
      [&](uint64_t f, const decltype(load(uint64_t{0}, 0u))& v) {
        uint64_t row;
        uint32_t k;
        at(f, row, k);
        use(row, k, v);
      });
}

template <typename T>
__device__ __forceinline__ uint32_t row_vecs(uint32_t hidden) {
  return static_cast<uint32_t>(EAR_FUSED_ROW_VECS(hidden, sizeof(T)));
}

// Traps on a broken launch contract. N = 0: the rank-less kernel.
template <typename T, int N>
__device__ __forceinline__ void check_fused(const EarFusedParams& p, uint64_t need, uint64_t cap) {
  const bool ranks_bad =
      N > 0 && (p.ar.nranks != N || p.ar.rank < 0 || p.ar.rank >= N || gridDim.x > EAR_MAX_BLOCKS);
  if (ranks_bad || blockDim.x != EAR_FUSED_BLOCK(p.hidden, sizeof(T)) || p.tokens == 0 ||
      p.hidden == 0 || p.ar.count != p.tokens * p.hidden || need > cap)
    __trap();
}

// The inputs of residual_out chunk k of a row: x from each of N ranks (loaded, or for Lamport
// polled, by the family), and the bias and residual chunks. Loaded by fetch_extras before
// anything waits, so all of a thread's loads for a row are in flight together.
template <int N>
struct RowIn {
  Ranks<N> x;
  uint4 bias, res;
};

// Lamport push batch: at N = 16 the 15 peer addresses take the registers a batch would.
template <int N>
constexpr int kPushBatch = N >= 16 ? 1 : kCopyBatch;

// At N >= 16 the N vectors already fill the registers: bias and residual are then loaded by
// sum_add_residual, when they are used.
template <int N>
constexpr bool kPrefetchExtras = N < 16;

template <typename T, int N>
__device__ __forceinline__ void fetch_extras(const EarFusedParams& p, uint64_t row, uint32_t k,
                                             bool vec_ok, RowIn<N>& in) {
  if (!kPrefetchExtras<N>) return;
  if (p.bias != nullptr) in.bias = load_row_chunk<T>(p.bias, 0, p.hidden, k, true);
  in.res = load_row_chunk<T>(p.residual, row, p.hidden, k, vec_ok);
}

// residual_out chunk k = round_T(((+0 + x_0 + ... + x_{N-1}) + bias (if any)) + residual),
// stored and returned.
template <typename T, int N>
__device__ __forceinline__ uint4 sum_add_residual(const EarFusedParams& p, const RowIn<N>& in,
                                                  uint64_t row, uint32_t k, bool vec_ok) {
  float acc[Elem<T>::E];
#pragma unroll
  for (int e = 0; e < Elem<T>::E; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int r = 0; r < N; ++r) Elem<T>::add(acc, in.x.v[r]);
  if (p.bias != nullptr)
    Elem<T>::add(acc, kPrefetchExtras<N> ? in.bias : load_row_chunk<T>(p.bias, 0, p.hidden, k, true));
  Elem<T>::add(acc, kPrefetchExtras<N> ? in.res : load_row_chunk<T>(p.residual, row, p.hidden, k, vec_ok));
  const uint4 out = Elem<T>::pack(acc);
  store_row_chunk<T>(p.residual_out, row, p.hidden, k, vec_ok, out);
  return out;
}

template <typename T>
__device__ __forceinline__ float add_squares(float ss, const uint4& v) {
  float f[Elem<T>::E];
  unpack<T>(v, f);
#pragma unroll
  for (int e = 0; e < Elem<T>::E; ++e) ss = __fmaf_rn(f[e], f[e], ss);
  return ss;
}

template <typename T>
__device__ __forceinline__ uint4 apply_norm(const uint4& r, const uint4& g, float s) {
  float fr[Elem<T>::E], fg[Elem<T>::E];
  unpack<T>(r, fr);
  unpack<T>(g, fg);
#pragma unroll
  for (int e = 0; e < Elem<T>::E; ++e) fr[e] = __fmul_rn(__fmul_rn(fr[e], s), fg[e]);
  return Elem<T>::pack(fr);
}

// The RMSNorm of token row `row`, called by all threads of the CTA. The family gives
// fetch(k): issue the loads chunk k needs, return them (nothing waits yet); poll(k, fetched):
// one polling step, true once the chunk's data has arrived (Lamport; else always true); and
// finish(k, fetched): store residual_out chunk k and return it (T bits, +0 past hidden).
// The first KC chunks of the thread are all fetched (with their gamma) and polled together
// before the first finish: one memory latency per row instead of one per chunk.
// last_wait: this row's polls are the CTA's last wait on a peer (peers_done once the whole
// CTA is past them, i.e. after block_sum's barrier).
template <typename T, int KC = kCache, bool PrefetchGamma = true, typename Fetch, typename Poll,
          typename Finish>
__device__ __forceinline__ void rmsnorm_row(const EarFusedParams& p, uint64_t row, uint32_t hv,
                                            bool vec_ok, bool last_wait, Fetch&& fetch, Poll&& poll,
                                            Finish&& finish) {
  using In = decltype(fetch(0u));
  In in[KC];
  uint4 gamma[KC];
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const uint32_t k = threadIdx.x + j * blockDim.x;
    if (k < hv) {
      in[j] = fetch(k);
      if (PrefetchGamma) gamma[j] = load_row_chunk<T>(p.gamma, 0, p.hidden, k, true);
    }
  }
  bool done;
  do {
    done = true;
#pragma unroll
    for (int j = 0; j < KC; ++j)
      if (threadIdx.x + j * blockDim.x < hv) done = poll(threadIdx.x + j * blockDim.x, in[j]) && done;
  } while (!done);
  uint4 cache[KC];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const uint32_t k = threadIdx.x + j * blockDim.x;
    if (k < hv) {
      cache[j] = finish(k, in[j]);
      ss = add_squares<T>(ss, cache[j]);
    }
  }
  for (uint32_t k = threadIdx.x + KC * blockDim.x; k < hv; k += blockDim.x) {
    In one = fetch(k);
    while (!poll(k, one)) {
    }
    ss = add_squares<T>(ss, finish(k, one));
  }
  const float total = block_sum(ss);
  if (last_wait) peers_done();
  const float s = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(total, static_cast<float>(p.hidden)), p.eps)));
#pragma unroll
  for (int j = 0; j < KC; ++j) {
    const uint32_t k = threadIdx.x + j * blockDim.x;
    if (k < hv) {
      const uint4 g = PrefetchGamma ? gamma[j] : load_row_chunk<T>(p.gamma, 0, p.hidden, k, true);
      store_row_chunk<T>(p.normed, row, p.hidden, k, vec_ok, apply_norm<T>(cache[j], g, s));
    }
  }
  for (uint32_t k = threadIdx.x + KC * blockDim.x; k < hv; k += blockDim.x)
    store_row_chunk<T>(p.normed, row, p.hidden, k, vec_ok,
                       apply_norm<T>(load_row_chunk<T>(p.residual_out, row, p.hidden, k, vec_ok),
                                     load_row_chunk<T>(p.gamma, 0, p.hidden, k, true), s));
}

// ---------------------------------------------------------------------------------------
template <typename T, int N>
__device__ __forceinline__ void oneshot_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  check_fused<T, N>(p, EAR_FUSED_STAGE_BYTES(p.tokens, p.hidden, sizeof(T)), p.ar.ws_max_bytes);
  pdl_wait();
  const CallCounters c = begin_call(p.ar, next_barrier_call);
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

// ---------------------------------------------------------------------------------------
template <typename T, int N>
__device__ __forceinline__ void twoshot_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  const uint64_t m = p.ar.ws_max_bytes;
  check_fused<T, N>(p, EAR_FUSED_TWOSHOT_SEG_NEED(p.tokens, p.hidden, sizeof(T), N),
                    EAR_TWOSHOT_SEG_BYTES(m, N));
  pdl_wait();
  const CallCounters c = begin_call(p.ar, next_barrier_call);
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

// ---------------------------------------------------------------------------------------
template <typename T, int N>
__device__ __forceinline__ void lamport_norm_body(const EarFusedParams& p) {
  const uint32_t hv = row_vecs<T>(p.hidden);
  const uint64_t m = p.ar.ws_max_bytes;
  check_fused<T, N>(p, EAR_FUSED_STAGE_BYTES(p.tokens, p.hidden, sizeof(T)), EAR_LAMPORT_MAX_MSG(m));
  pdl_wait();
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  const bool in_place = p.normed == p.ar.input;
  const uint64_t vecs = p.tokens * hv;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto load = [&](uint64_t row, uint32_t k) {
    return lamport_sanitize(load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok));
  };
  const auto load_flat = [&](uint64_t i) { return load(i / hv, static_cast<uint32_t>(i % hv)); };
  const CallCounters c = begin_call(p.ar, [&](CallCounters k) { return next_lamport_call(k, vecs); });
  const int rank = p.ar.rank;
  const uint64_t row_bytes = EAR_LAMPORT_ROW_BYTES(m);
  const uint64_t cur = c.lam_seq % 3u;
  const uint64_t prev = (c.lam_seq + 2u) % 3u;

  // 1. push all our rows into row `rank` of buffer `cur` of every peer. Out of place, every
  // CTA of the grid (it may exceed tokens) pushes a flat share; in place (normed == x) each
  // CTA pushes only the rows it owns, so no CTA reads x of a row whose owner may already have
  // written normed over it.
  const uint64_t push_off = EAR_OFF_LAMPORT(m, N) + (cur * N + rank) * row_bytes;
  const auto push = [&](uint64_t row, uint32_t k, const uint4& v) {
    lamport_push<N>(p.ar, push_off + (row * hv + k) * 16, v);
  };
  // The flat push goes one vector at a time (not in batches): stores then leave in row
  // order, so early rows arrive first and their CTAs start the norm while later rows are in
  // flight (0.2-0.5 µs faster at every decode shape on 2 x H200, docs/PERFORMANCE.md).
  if (in_place) {
    for_cta_rows<kPushBatch<N>>(p, hv, load, push);
  } else {
    // Flat vector i is (row i / hv, chunk i % hv) and lands at 16 i; with rows a multiple of
    // 16 bytes (vec_ok) it is also vector i of x: no 64-bit division (0.1 us at 1 x 4096).
    const auto load_at = [&](uint64_t i) {
      return vec_ok ? lamport_sanitize(load_input<T>(p.ar.input, i, p.ar.count)) : load_flat(i);
    };
    batched_for<1>(first, stride, vecs, load_at,
                   [&](uint64_t i, const uint4& v) { lamport_push<N>(p.ar, push_off + i * 16, v); });
  }

  char* const lam = data_region(peer_base<N>(p.ar, rank)) + EAR_OFF_LAMPORT(m, N);

  // 2. clear what the previous Lamport call (plain or fused) left in our buffer `prev`.
  lamport_clear<N>(lam, prev, rank, row_bytes, c.lam_prev_vecs, first, stride);

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

// ---------------------------------------------------------------------------------------
// No ranks, no workspace, no state: x (already all-reduced, in T) + bias + residual, norm.
template <typename T>
__device__ __forceinline__ void residual_rmsnorm_body(const EarFusedParams& p) {
  check_fused<T, 0>(p, 0, 0);
  pdl_wait();
  peers_done();  // no peers: the dependent's launch overlaps the whole kernel
  const uint32_t hv = row_vecs<T>(p.hidden);
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  for (uint64_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    rmsnorm_row<T>(
        p, row, hv, vec_ok, false,
        [&](uint32_t k) {
          RowIn<1> in;
          in.x.v[0] = load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok);
          fetch_extras<T, 1>(p, row, k, vec_ok, in);
          return in;
        },
        Arrived{}, [&](uint32_t k, const RowIn<1>& in) { return sum_add_residual<T, 1>(p, in, row, k, vec_ok); });
  }
}

}  // namespace ear

#define EAR_DEFINE_RMSNORM_KERNEL(TNAME, T)                                                 \
  extern "C" __global__ void __launch_bounds__(EAR_FUSED_MAX_THREADS, 1)                    \
      ear_residual_rmsnorm_##TNAME(const EarFusedParams params) {                          \
    ear::residual_rmsnorm_body<T>(params);                                                  \
  }

EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f32, float, 2)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f32, float, 4)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f32, float, 6)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f32, float, 8)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f32, float, 16)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f16, __half, 2)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f16, __half, 4)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f16, __half, 6)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f16, __half, 8)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, f16, __half, 16)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, bf16, __nv_bfloat16, 2)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, bf16, __nv_bfloat16, 4)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, bf16, __nv_bfloat16, 6)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, bf16, __nv_bfloat16, 8)
EAR_DEFINE_FUSED_KERNEL(oneshot_barrier_norm, ear::oneshot_norm_body, bf16, __nv_bfloat16, 16)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f32, float, 2)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f32, float, 4)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f32, float, 6)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f32, float, 8)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f32, float, 16)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f16, __half, 2)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f16, __half, 4)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f16, __half, 6)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f16, __half, 8)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, f16, __half, 16)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, bf16, __nv_bfloat16, 2)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, bf16, __nv_bfloat16, 4)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, bf16, __nv_bfloat16, 6)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, bf16, __nv_bfloat16, 8)
EAR_DEFINE_FUSED_KERNEL(twoshot_barrier_norm, ear::twoshot_norm_body, bf16, __nv_bfloat16, 16)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f32, float, 2)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f32, float, 4)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f32, float, 6)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f32, float, 8)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f32, float, 16)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f16, __half, 2)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f16, __half, 4)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f16, __half, 6)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f16, __half, 8)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, f16, __half, 16)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, bf16, __nv_bfloat16, 2)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, bf16, __nv_bfloat16, 4)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, bf16, __nv_bfloat16, 6)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, bf16, __nv_bfloat16, 8)
EAR_DEFINE_FUSED_KERNEL(oneshot_lamport_norm, ear::lamport_norm_body, bf16, __nv_bfloat16, 16)
EAR_DEFINE_RMSNORM_KERNEL(f32, float)
EAR_DEFINE_RMSNORM_KERNEL(f16, __half)
EAR_DEFINE_RMSNORM_KERNEL(bf16, __nv_bfloat16)
