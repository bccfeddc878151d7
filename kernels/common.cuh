// common.cuh: primitives shared by the all-reduce kernel families (oneshot.cu, twoshot.cu,
// lamport.cu): 16-byte packed vectors, fp32 accumulation in rank order, sys-scope flag
// load/store, the per-CTA cross-rank barrier, the local state block and the end-of-call
// epilogue. The contract with the host is kernels/allreduce_params.h.
#pragma once

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "allreduce_params.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the all-reduce kernels need sm_80 or newer"
#endif

namespace ear {

constexpr int kThreads = EAR_BLOCK_THREADS;

// ---------------------------------------------------------------------------------------
// Local state block (EAR_STATE_BYTES, zero-filled once by the host): EAR_MAX_BLOCKS
// identical copies of the call counters, one per CTA index. CTA b reads copy b and, in the
// same call, writes the advanced counters into copies b, b + grid, b + 2*grid, ... (see
// begin_call): every copy is written once per call, by exactly one CTA, and no CTA reads a
// copy another CTA of the call writes. So there is no cross-CTA arrival count, no atomic,
// and nothing to do at the end of a call, and grids may change freely between calls. The
// next call reads the copies after griddepcontrol.wait (or the kernel boundary), i.e. after
// this grid completed and its writes are visible.
struct State {
  // One-shot and two-shot calls (plain and fused) completed on this workspace. Call `seq`
  // uses flag values flag_value(seq, i) (i < kFlagsPerCall: its barriers or chunks in
  // order), one-shot bank seq % 2 and two-shot stage parity seq % 2. Identical on every
  // rank because every rank issues the same call sequence.
  uint64_t seq;
  // Lamport calls completed; call `lam_seq` writes buffer lam_seq % 3.
  uint64_t lam_seq;
  // Vectors per row the previous Lamport call wrote (what this call must clear).
  uint64_t lam_prev_vecs;
  uint64_t pad_;
};
static_assert(sizeof(State) * EAR_MAX_BLOCKS <= EAR_STATE_BYTES, "State copies must fit EAR_STATE_BYTES");

// ---------------------------------------------------------------------------------------
// Memory access helpers. Everything another rank writes during a call is read with
// L1-bypassing loads (.cg / .volatile): L1 is not coherent, and a line of a peer's buffer
// left in L1 by an earlier call would be stale.

__device__ __forceinline__ uint4 ld_cg(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// Input loads: plain (L1-allocating) is fine, nobody else writes our input during a call.
// Not .nc: the input may alias the output we write.
__device__ __forceinline__ uint4 ld_plain(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ uint4 ld_volatile(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// One 16-byte store instruction (Lamport relies on a 16-byte store never being split below
// 4-byte granularity; every word is checked anyway).
__device__ __forceinline__ void st_vec(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t ld_volatile_u64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}

// ---------------------------------------------------------------------------------------
// Programmatic dependent launch. Harmless when the host did not set the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------
// Element types: 16-byte vectors of E elements, accumulated in fp32.
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr int E = 4;
  using Bits = uint32_t;
  __device__ static __forceinline__ void add(float (&acc)[E], const uint4& v) {
    acc[0] += __uint_as_float(v.x);
    acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z);
    acc[3] += __uint_as_float(v.w);
  }
  __device__ static __forceinline__ uint4 pack(const float (&acc)[E]) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]),
                      __float_as_uint(acc[2]), __float_as_uint(acc[3]));
  }
};

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t bf16_bits(float x) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}
template <>
struct Elem<__nv_bfloat16> {
  static constexpr int E = 8;
  using Bits = uint16_t;
  __device__ static __forceinline__ void add2(float* acc, uint32_t w) {
    acc[0] += bf16_lo(w);
    acc[1] += bf16_hi(w);
  }
  __device__ static __forceinline__ void add(float (&acc)[E], const uint4& v) {
    add2(acc + 0, v.x);
    add2(acc + 2, v.y);
    add2(acc + 4, v.z);
    add2(acc + 6, v.w);
  }
  __device__ static __forceinline__ uint32_t pack2(const float* a) {
    return bf16_bits(a[0]) | (bf16_bits(a[1]) << 16);
  }
  __device__ static __forceinline__ uint4 pack(const float (&acc)[E]) {
    return make_uint4(pack2(acc + 0), pack2(acc + 2), pack2(acc + 4), pack2(acc + 6));
  }
};

__device__ __forceinline__ float f16_at(uint32_t w, int shift) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> shift)));
}
__device__ __forceinline__ uint32_t f16_bits(float x) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(x)));
}
template <>
struct Elem<__half> {
  static constexpr int E = 8;
  using Bits = uint16_t;
  __device__ static __forceinline__ void add2(float* acc, uint32_t w) {
    acc[0] += f16_at(w, 0);
    acc[1] += f16_at(w, 16);
  }
  __device__ static __forceinline__ void add(float (&acc)[E], const uint4& v) {
    add2(acc + 0, v.x);
    add2(acc + 2, v.y);
    add2(acc + 4, v.z);
    add2(acc + 6, v.w);
  }
  __device__ static __forceinline__ uint32_t pack2(const float* a) {
    return f16_bits(a[0]) | (f16_bits(a[1]) << 16);
  }
  __device__ static __forceinline__ uint4 pack(const float (&acc)[E]) {
    return make_uint4(pack2(acc + 0), pack2(acc + 2), pack2(acc + 4), pack2(acc + 6));
  }
};

// The canonical reduction every family uses: fp32, accumulator starting at +0.0f, ranks
// added in order 0..N-1, one rounding to T at the end. Same inputs give the same bits on
// every rank and in every family. Starting at +0.0f makes the result independent of the
// sign of zero inputs (+0 + -0 = +0), which lets Lamport rewrite +0 words as -0.
template <typename T, int N>
__device__ __forceinline__ uint4 reduce_in_rank_order(const uint4 (&v)[N]) {
  float acc[Elem<T>::E];
#pragma unroll
  for (int e = 0; e < Elem<T>::E; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int r = 0; r < N; ++r) Elem<T>::add(acc, v[r]);
  return Elem<T>::pack(acc);
}

// ---------------------------------------------------------------------------------------
// Messages are handled as vecs = ceil(count / E) 16-byte vectors; the last one may be
// partial. Partial vectors are loaded element-wise and padded with +0 bits, and stored
// element-wise, so nothing past `count` is ever read from input or written to output.
template <typename T>
__device__ __forceinline__ uint64_t vec_count(uint64_t count) {
  return (count + Elem<T>::E - 1) / Elem<T>::E;
}

// The first `valid` elements (fewer than a vector's, or none) of a partial vector, moved one
// by one, +0 bits after them: tails of a message, and rows that are not 16-byte aligned.
template <typename T>
__device__ __forceinline__ uint4 load_elems(const typename Elem<T>::Bits* src, uint64_t valid) {
  constexpr int E = Elem<T>::E;
  union {
    uint4 v;
    typename Elem<T>::Bits b[E];
  } u;
  u.v = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e < valid) u.b[e] = src[e];
  return u.v;
}
template <typename T>
__device__ __forceinline__ void store_elems(typename Elem<T>::Bits* dst, uint64_t valid, uint4 v) {
  constexpr int E = Elem<T>::E;
  union {
    uint4 v;
    typename Elem<T>::Bits b[E];
  } u;
  u.v = v;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e < valid) dst[e] = u.b[e];
}

template <typename T>
__device__ __forceinline__ uint4 load_input(const void* in, uint64_t vi, uint64_t count) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint64_t first = vi * E;
  if (first + E <= count) return ld_plain(static_cast<const char*>(in) + vi * 16);
  return load_elems<T>(static_cast<const B*>(in) + first, first < count ? count - first : 0);
}

template <typename T>
__device__ __forceinline__ void store_output(void* out, uint64_t vi, uint64_t count, uint4 v) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint64_t first = vi * E;
  if (first + E <= count) {
    *reinterpret_cast<uint4*>(static_cast<char*>(out) + vi * 16) = v;
    return;
  }
  store_elems<T>(static_cast<B*>(out) + first, first < count ? count - first : 0, v);
}

// ---------------------------------------------------------------------------------------
// Params access. peer_ws is indexed only with compile-time indices or through this select
// chain, so the by-value params never get copied to local memory.
template <int N>
__device__ __forceinline__ char* peer_base(const EarAllReduceParams& p, int q) {
  char* b = static_cast<char*>(p.peer_ws[0]);
#pragma unroll
  for (int r = 1; r < N; ++r)
    if (q == r) b = static_cast<char*>(p.peer_ws[r]);
  return b;
}

__device__ __forceinline__ char* data_region(void* ws) {
  return static_cast<char*>(ws) + EAR_SIGNAL_BYTES;
}

__device__ __forceinline__ uint64_t* signal_slot(void* ws, int block, int src_rank) {
  return static_cast<uint64_t*>(ws) + static_cast<uint64_t>(block) * EAR_MAX_RANKS + src_rank;
}

// Traps on a broken launch contract instead of corrupting memory or hanging peers.
// any_block: any multiple of 32 up to EAR_BLOCK_THREADS (Lamport), else exactly that.
template <typename T, int N>
__device__ __forceinline__ void check_params(const EarAllReduceParams& p, uint64_t max_bytes,
                                             bool any_block = false) {
  const bool block_ok = any_block ? blockDim.x % 32u == 0 && blockDim.x <= EAR_BLOCK_THREADS
                                  : blockDim.x == EAR_BLOCK_THREADS;
  if (p.nranks != N || p.rank < 0 || p.rank >= N || gridDim.x > EAR_MAX_BLOCKS || !block_ok ||
      p.count * sizeof(T) > max_bytes)
    __trap();
}

// ---------------------------------------------------------------------------------------
// Cross-rank flags. slot[b][r] of rank q's signal region is written only by CTA b of rank r.
// Values are 64-bit and only ever increase on every slot: call `seq` publishes
// flag_value(seq, 0), flag_value(seq, 1), ... in order, so a slot left behind by an older
// call or a larger grid is always smaller than what a later call waits for (no ABA when
// grids or sizes change), and a peer that is one flag or one call ahead may overwrite our
// slot with a larger value without making us miss it (the wait is >=, not ==). 64 bits
// never wrap (2^58 calls).
constexpr uint32_t kFlagsPerCall = 64;
__device__ __forceinline__ uint64_t flag_value(uint64_t seq, uint32_t i) {
  return seq * kFlagsPerCall + i + 1;
}

// Lane q < N, q != rank, of the calling threads: publishes `value` into rank q's
// slot[blockIdx.x][rank] (st.release.sys: every write this thread has observed, e.g. the
// CTA's through a bar.sync, is ordered before it) and spins on our slot[blockIdx.x][q]
// until it holds a value >= `value` (ld.relaxed.sys, then one ld.acquire.sys). Other lanes
// return at once.
template <int N>
__device__ __forceinline__ void flag_exchange(const EarAllReduceParams& p, uint64_t value, int q) {
  if (q < N && q != p.rank) {
    st_release_sys(signal_slot(peer_base<N>(p, q), blockIdx.x, p.rank), value);
    const uint64_t* mine = signal_slot(peer_base<N>(p, p.rank), blockIdx.x, q);
    // Spin relaxed, then acquire once: an ld.acquire invalidates the SM's L1 (CCTL.IVALL)
    // at every poll, under the feet of the CTA's other warps. The acquire load reads the
    // value the relaxed one saw or a later one of the same writer (coherence), so it
    // synchronizes with the peer's release all the same.
    while (ld_relaxed_sys(mine) < value) {
    }
    (void)ld_acquire_sys(mine);
  }
}

// Cross-rank barrier of CTA blockIdx.x with the CTAs of the same index on every rank.
// Promise: everything this CTA wrote before the call (to any rank's memory) is visible to
// the same-index CTA of every peer after its barrier, and vice versa. flag_exchange between
// two __syncthreads: the first orders the CTA's writes before the publishing threads', the
// second hands their acquire to the whole CTA.
template <int N>
__device__ __forceinline__ void cta_barrier(const EarAllReduceParams& p, uint64_t value) {
  __syncthreads();
  flag_exchange<N>(p, value, static_cast<int>(threadIdx.x));
  __syncthreads();
}

// Named CTA barriers (id 0 is __syncthreads'): `threads` threads take part, whole warps.
// bar.arrive does not wait; like bar.sync it orders the caller's earlier memory accesses
// before the barrier completes for every participant (PTX ISA, barrier).
__device__ __forceinline__ void bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The counters of a call, and what the call leaves for the next one.
struct CallCounters {
  uint64_t seq, lam_seq, lam_prev_vecs;
};

// Start of a call, after pdl_wait: thread 0 reads copy blockIdx.x of the counters and
// broadcasts them; then copies blockIdx.x + j*gridDim.x (j = threadIdx.x, then strided by
// blockDim.x) get next(c); thread 0 rewrites the copy it read itself, after reading it.
// Stores only, nothing waits for them.
template <typename F>
__device__ __forceinline__ CallCounters begin_call(const EarAllReduceParams& p, F next) {
  __shared__ CallCounters s;
  State* const st = static_cast<State*>(p.state);
  if (threadIdx.x == 0) {
    const State* mine = st + blockIdx.x;
    s.seq = ld_volatile_u64(&mine->seq);
    s.lam_seq = ld_volatile_u64(&mine->lam_seq);
    s.lam_prev_vecs = ld_volatile_u64(&mine->lam_prev_vecs);
  }
  __syncthreads();
  const CallCounters c = s;
  const CallCounters n = next(c);
  for (uint32_t copy = blockIdx.x + threadIdx.x * gridDim.x; copy < EAR_MAX_BLOCKS;
       copy += blockDim.x * gridDim.x) {
    State* dst = st + copy;
    dst->seq = n.seq;
    dst->lam_seq = n.lam_seq;
    dst->lam_prev_vecs = n.lam_prev_vecs;
  }
  return c;
}

// Advances of the two counter families.
__device__ __forceinline__ CallCounters next_barrier_call(CallCounters c) {
  ++c.seq;
  return c;
}
__device__ __forceinline__ CallCounters next_lamport_call(CallCounters c, uint64_t vecs) {
  ++c.lam_seq;
  c.lam_prev_vecs = vecs;
  return c;
}

// End of a call: let the dependent launch start (its griddepcontrol.wait still waits for
// this grid to complete and flush). No fence: see State.
__device__ __forceinline__ void finish_call() { pdl_trigger(); }

// The same trigger, earlier: once this CTA waits on no peer any more (what is left is local
// work, or loads of data known to have arrived). It is as safe as finish_call's: when every
// CTA has triggered, every peer CTA they waited on has started, and the dependent's CTAs,
// which wait for this grid only, take free SMs from a grid that no longer needs any. The
// dependent's launch then overlaps this call's epilogue (fused kernels, docs/KERNELS.md).
// All threads of the CTA call it; finish_call's trigger is then a no-op.
__device__ __forceinline__ void peers_done() { pdl_trigger(); }

// One 16-byte vector from each of N ranks (a batch element of batched_for).
template <int N>
struct Ranks {
  uint4 v[N];
};

// Two-shot stage rule (twoshot.cu, fused_norm.cu). Messages above kTwoShotPacedAbove
// bytes are paced by per-chunk flags; smaller ones poll the stage, and so read only the
// first twoshot_polled_seg(N) vectors of a stage row. Every call leaves that prefix of the
// rows it read zeroed (a large call zeroes nothing else: the zeroing is an HBM pass).
constexpr uint64_t kTwoShotPacedAbove = 8ull << 20;
__host__ __device__ constexpr uint64_t twoshot_polled_seg(int n) {
  return (kTwoShotPacedAbove / EAR_VEC_BYTES + n - 1) / n;
}

// Iterations per batch: pure copies keep 4 vectors in flight per thread; reductions keep
// N per iteration, so fewer iterations as N grows (registers: 4 * N * batch).
constexpr int kCopyBatch = 4;
template <int N>
constexpr int kReduceBatch = N <= 2 ? 4 : N <= 4 ? 2 : 1;

// Lamport payload rule (lamport.cu, fused_norm.cu): an all-zero 32-bit word means "not
// arrived"; senders send all-zero words as 0x80000000 (-0 bits).
__device__ __forceinline__ uint32_t lamport_word(uint32_t w) { return w == 0u ? 0x80000000u : w; }
__device__ __forceinline__ uint4 lamport_sanitize(uint4 v) {
  return make_uint4(lamport_word(v.x), lamport_word(v.y), lamport_word(v.z), lamport_word(v.w));
}
// Lamport all-gather payload (twoshot.cu): gathered values are copied, not summed, so the
// sentinel rewrite must be undone exactly. The one word senders rewrite zeros to,
// 0x80000000, is -0.0f (never an fp32 sum: the accumulator starts at +0.0f) or an f16/bf16
// pair (+0, -0), which only a tiny negative sum rounded to T makes; gather_canonical maps it
// to +0. Owners store and send canonical values (sanitized), receivers store
// gather_canonical(received): the same bits on every rank.
__device__ __forceinline__ uint4 gather_canonical(uint4 v) {
  const auto c = [](uint32_t w) { return w == 0x80000000u ? 0u : w; };
  return make_uint4(c(v.x), c(v.y), c(v.z), c(v.w));
}
__device__ __forceinline__ bool lamport_arrived(const uint4& v) {
  return v.x != 0u && v.y != 0u && v.z != 0u && v.w != 0u;
}

// Stores vector v at byte `off` of the data region of every peer, starting at the next rank
// (spreads the NVLink traffic over the links).
template <int N>
__device__ __forceinline__ void lamport_push(const EarAllReduceParams& p, uint64_t off, const uint4& v) {
#pragma unroll
  for (int d = 1; d < N; ++d) {
    int q = p.rank + d;
    q = q >= N ? q - N : q;
    st_vec(data_region(peer_base<N>(p, q)) + off, v);
  }
}

// Zeroes the first `vecs` vectors of every peer row of buffer `buf` in our Lamport area `lam`
// (what the previous call wrote there), grid-stride from `first`.
template <int N>
__device__ __forceinline__ void lamport_clear(char* lam, uint64_t buf, int rank, uint64_t row_bytes,
                                              uint64_t vecs, uint64_t first, uint64_t stride) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r == rank) continue;
    char* row = lam + (buf * N + r) * row_bytes;
    for (uint64_t i = first; i < vecs; i += stride) st_vec(row + i * 16, zero);
  }
}

// One polling step: reloads (ld.volatile) each peer vector (rank r's at at(r), or at
// `at + r * row_bytes`) that has not arrived yet (a zero word); true if all had arrived.
// v.v[rank] is our own value, left alone. Callers waiting on several vectors step all of
// them in one loop, so their reloads are in flight together (one memory latency per round,
// not one per vector).
template <int N, typename At>
__device__ __forceinline__ bool lamport_poll_at(Ranks<N>& v, int rank, At at) {
  bool arrived = true;
#pragma unroll
  for (int r = 0; r < N; ++r) {
    if (r != rank && !lamport_arrived(v.v[r])) {
      arrived = false;
      v.v[r] = ld_volatile(at(r));
    }
  }
  return arrived;
}
template <int N>
__device__ __forceinline__ bool lamport_poll(Ranks<N>& v, int rank, const char* at, uint64_t row_bytes) {
  return lamport_poll_at<N>(v, rank, [&](int r) { return at + r * row_bytes; });
}

// ---------------------------------------------------------------------------------------
// Batched grid-stride loops. Every load/store helper above is an asm volatile with a memory
// clobber, which keeps the compiler from hoisting the next iteration's load above this
// iteration's store: a plain loop has one load in flight per thread. These issue up to U
// iterations' loads before the first use. Item i = first + u*stride.
// The poll of data that is complete once loaded (after a barrier, or local).
struct Arrived {
  template <typename I, typename V>
  __device__ bool operator()(I, const V&) const {
    return true;
  }
};

// The loads of one batch, all issued before any is used: v[u] = load(i0 + u*stride) for
// the items < n.
template <int U, typename V, typename Load>
__device__ __forceinline__ void load_batch(V (&v)[U], uint64_t i0, uint64_t stride, uint64_t n, Load load) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i0 + u * stride < n) v[u] = load(i0 + u * stride);
}

// One batch: items i0 + u*stride < n (u < U). poll(i, v) (Lamport): one polling step of item
// i, true once it has arrived; a batch's items are stepped together until all have, before
// the first use.
template <int U, typename Load, typename Poll, typename Use>
__device__ __forceinline__ void batch_step(uint64_t i0, uint64_t stride, uint64_t n, Load load, Poll poll,
                                           Use use) {
  decltype(load(uint64_t{0})) v[U];
  load_batch(v, i0, stride, n, load);
  bool done;
  do {
    done = true;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < n) done = poll(i0 + u * stride, v[u]) && done;
  } while (!done);
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i0 + u * stride < n) use(i0 + u * stride, v[u]);
}
// batch_step for data that has mostly arrived (the two-shot's stage): the batch's loads are
// issued together, then item by item: wait for that item alone, use it. A use then waits
// only for its own loads, not the whole batch's (on 2 x H200 the two-shot took 16.0 us at
// 4 MiB and 29.1 at 8 MiB this way, 16.7 and 31.2 with the batch polled together).
template <int U, typename Load, typename Poll, typename Use>
__device__ __forceinline__ void batch_step_each(uint64_t i0, uint64_t stride, uint64_t n, Load load, Poll poll,
                                                Use use) {
  decltype(load(uint64_t{0})) v[U];
  load_batch(v, i0, stride, n, load);
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (i0 + u * stride < n) {
      while (!poll(i0 + u * stride, v[u])) {
      }
      use(i0 + u * stride, v[u]);
    }
}
template <int U, typename Load, typename Poll, typename Use>
__device__ __forceinline__ void batched_for_polled(uint64_t first, uint64_t stride, uint64_t n,
                                                   Load load, Poll poll, Use use) {
  for (uint64_t i0 = first; i0 < n; i0 += U * stride) batch_step<U>(i0, stride, n, load, poll, use);
}
template <int U, typename Load, typename Use>
__device__ __forceinline__ void batched_for(uint64_t first, uint64_t stride, uint64_t n,
                                            Load load, Use use) {
  batched_for_polled<U>(first, stride, n, load, Arrived{}, use);
}

// batched_for split in two: the first batch's loads (load_batch), issued early, e.g. before
// begin_call's state read so that the two latencies overlap; then the rest (for_rest: the
// first batch's uses, then the remaining batches).
template <int U, typename V, typename Load, typename Use>
__device__ __forceinline__ void for_rest(const V (&head)[U], uint64_t first, uint64_t stride,
                                         uint64_t n, Load load, Use use) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (first + u * stride < n) use(first + u * stride, head[u]);
  batched_for<U>(first + U * stride, stride, n, load, use);
}

}  // namespace ear

// Each kernel file lists its 15 extern "C" kernels with this macro, in one place at its end:
// ear_<FAMILY>_<TNAME>_n<N>(EarAllReduceParams) running BODY<T, N> on every CTA.
#define EAR_DEFINE_KERNEL(FAMILY, BODY, TNAME, T, N)                                       \
  extern "C" __global__ void __launch_bounds__(EAR_BLOCK_THREADS, 1)                        \
      ear_##FAMILY##_##TNAME##_n##N(const EarAllReduceParams params) {                     \
    BODY<T, N>(params);                                                                     \
  }

// =======================================================================================
// Fused all-reduce + residual (+ bias) + RMSNorm (kernels/fused_norm.cu): token-row
// primitives. Additions only; nothing above depends on them.
namespace ear {

// Exact T -> fp32 of the E elements of a vector (sign of zero kept, NaN stays NaN).
template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float (&f)[Elem<T>::E]);
template <>
__device__ __forceinline__ void unpack<float>(const uint4& v, float (&f)[4]) {
  f[0] = __uint_as_float(v.x);
  f[1] = __uint_as_float(v.y);
  f[2] = __uint_as_float(v.z);
  f[3] = __uint_as_float(v.w);
}
template <>
__device__ __forceinline__ void unpack<__half>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = f16_at(w[e], 0);
    f[2 * e + 1] = f16_at(w[e], 16);
  }
}
template <>
__device__ __forceinline__ void unpack<__nv_bfloat16>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = bf16_lo(w[e]);
    f[2 * e + 1] = bf16_hi(w[e]);
  }
}

// Chunk k of token row `row` of a [rows, hidden] tensor: elements [k*E, k*E + E) of the row,
// +0 bits past `hidden`. `vec_ok` (hidden * sizeof(T) % 16 == 0, base 16-byte aligned)
// allows one 16-byte access per full chunk; otherwise elements are moved one by one (rows
// are then not 16-byte aligned). Nothing past the row is read or written. Row 0 with
// vec_ok = true serves [hidden] vectors (gamma, bias).
template <typename T>
__device__ __forceinline__ uint4 load_row_chunk(const void* base, uint64_t row, uint32_t hidden,
                                                uint32_t k, bool vec_ok) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint32_t first = k * E;
  const uint64_t at = row * hidden + first;
  if (vec_ok && first + E <= hidden) return ld_plain(static_cast<const B*>(base) + at);
  return load_elems<T>(static_cast<const B*>(base) + at, first < hidden ? hidden - first : 0u);
}

template <typename T>
__device__ __forceinline__ void store_row_chunk(void* base, uint64_t row, uint32_t hidden,
                                                uint32_t k, bool vec_ok, uint4 v) {
  constexpr int E = Elem<T>::E;
  using B = typename Elem<T>::Bits;
  const uint32_t first = k * E;
  const uint64_t at = row * hidden + first;
  if (vec_ok && first + E <= hidden) {
    *reinterpret_cast<uint4*>(static_cast<B*>(base) + at) = v;
    return;
  }
  store_elems<T>(static_cast<B*>(base) + at, first < hidden ? hidden - first : 0u, v);
}

// Sum of `v` over the CTA (blockDim.x a multiple of 32, <= EAR_FUSED_MAX_THREADS), the same
// value in every thread. Fixed order for a given blockDim: xor butterfly inside each warp
// (a + b == b + a, so every lane ends with the same bits), then warp 0..W-1 in order from
// +0.0f. Same blockDim and inputs -> same bits on every rank. Safe to call repeatedly.
// The CTA barrier comes first (it also keeps the previous call's readers off part[]): warps
// that shuffle while others of the CTA still poll or load were slow. On 2 x H200 the fused
// Lamport took 3.93 / 6.67 / 10.9 us at 1 x 4096 / 32 x 8192 / 128 x 8192 with the shuffles
// first, 3.54 / 5.96 / 10.2 with a barrier before them (docs/PERFORMANCE.md).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[EAR_FUSED_MAX_THREADS / 32];
  __syncthreads();
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.0f;
  const uint32_t warps = blockDim.x >> 5;
  for (uint32_t w = 0; w < warps; ++w) t += part[w];
  return t;
}

}  // namespace ear

// ear_<FAMILY>_<TNAME>_n<N>(EarFusedParams) running BODY<T, N> on every CTA (fused_norm.cu).
#define EAR_DEFINE_FUSED_KERNEL(FAMILY, BODY, TNAME, T, N)                                 \
  extern "C" __global__ void __launch_bounds__(EAR_FUSED_MAX_THREADS, 1)                    \
      ear_##FAMILY##_##TNAME##_n##N(const EarFusedParams params) {                         \
    BODY<T, N>(params);                                                                     \
  }
