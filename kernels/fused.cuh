// fused.cuh: what the fused all-reduce + residual (+ bias) + RMSNorm kernels share
// (oneshot_norm.cu, twoshot_norm.cu, lamport_norm.cu, rmsnorm.cu): their numerics, work mapping
// and the row loops and RMSNorm of a token row. The host contract (EarFusedParams,
// EAR_FUSED_BLOCK/GRID, size rules) is in allreduce_params.h.
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
// phase (Lamport out of place: the push is spread in even shares over the whole grid, which
// may have more CTAs than rows; nothing waits on who pushed what); inside a row, thread t handles 16-byte chunks k = t, t + blockDim.x, ... (chunk k
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
#pragma once

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
  Waiting wait;
  do {
    done = true;
#pragma unroll
    for (int j = 0; j < KC; ++j)
      if (threadIdx.x + j * blockDim.x < hv) done = poll(threadIdx.x + j * blockDim.x, in[j]) && done;
  } while (!done && wait.keep_on());
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
    Waiting wait;
    while (!poll(k, one) && wait.keep_on()) {
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

}  // namespace ear
