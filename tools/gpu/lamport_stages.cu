// lamport_stages.cu: where the time of the Lamport one-shot goes at decode sizes (16 B-256 KiB),
// on simulated ranks (N ranks on one GPU), with the benchmark's method: a CUDA graph of ops,
// each a fork of N rank streams, one launch per rank (grid <= SMs/N), a join; replayed back to
// back, µs per op, median over batches. Figures, not tests.
//
// Beside the library's kernel (lamport.cu, launched with PDL as the library does, and without)
// it runs stripped kernels written here, on the library's grid and block (EAR_LAMPORT_GRID,
// EAR_LAMPORT_BLOCK), with none of the library's guarantees: no bounded wait (a lost peer hangs
// them), no abort word, no NaN on failure, no parameter checks, no PDL. What they do, row by row:
//   floor         an empty kernel, one CTA (the fork/join alone)
//   empty         an empty kernel on the Lamport grid
//   copy          input -> output (one load and one store a vector)
//   state+copy    the same after a dependent read and write of a per-CTA call counter
//   sol@param     the Lamport protocol (push, clear the previous buffer, poll, reduce in rank
//                 order), its buffer given by a kernel parameter: no counter at all (needs a
//                 graph of a multiple of 3 ops, hence 21)
//   sol           the same with the buffer from a per-CTA call counter, as any graph-safe
//                 Lamport kernel must read it
// So `sol` is the speed of light of this protocol on this method: whatever a kernel adds for its
// guarantees comes on top. Then the library's body rebuilt here from its own pieces (lamport.cu's
// oneshot_lamport_body, with PDL off), whole ("replica") and without one piece at a time:
//   -check        no check_params
//   -begin        read_call and write_next_counters replaced by thread 0 reading and advancing
//                 its own copy of the counters (no abort word read, no copies for other grids)
//   -bounded      polls that never give up (no Waiting)
//   -finish       no finish_call (its barrier and the poison check)
//   -all          none of the four, and no arm_waits
// then with the counters read and handed on in other ways (start_call, hand_on below):
//   begin: no abort        without the abort word read
//   begin: own copy        the CTA's own copy only (no copies for other grids)
//   begin: early           the copies written before the push, not after the clear (the
//                          library before issue 42's last change)
// and whole, with cold code moved out of line (the same work, a shorter hot path):
//   +cold tails   the element-wise tails of partial vectors in functions of their own
//   +cold tails+look  and the bounded wait's look too
// Every row but floor, empty, copy and state+copy is compared bit for bit with the library's
// output; every row starts from zeroed buffers and counters.
//
// The replica is a copy of lamport.cu's body with switches (a measuring instrument, as the two-shot's
// stages are): when that body changes, change it here too; its row must time like the library's.
// Results: docs/PERFORMANCE.md, "Decode sizes against the peers" (issue 42).
//
// Built by tools/gpu/stage.sh (or: nvcc -O3 -std=c++17 -arch=sm_90 tools/gpu/lamport_stages.cu)
// usage: lamport_stages [--ranks 2,4,8] [--sizes 16,8K,64K,256K] [--replays 10] [--batches 20]
//                       [--ops 21] [--timeout SECONDS]
#include "stages_common.cuh"

namespace {

// The stripped kernels' own memory, per rank: 3 buffers x N rows of row_bytes, and one call
// counter per CTA index. Zeroed before every row.
struct Sol {
  char* lam[EAR_MAX_RANKS];  // every rank's Lamport area
  uint64_t* ctr;             // this rank's counters
  const void* input;
  void* output;
  uint64_t count, row_bytes;
  int rank;
  uint32_t buf;  // the buffer of this call when no counter is read (sol@param)
};

enum Mode : int { kEmpty, kCopy, kStateCopy, kSolParam, kSol };

template <int N, int M>
__global__ void stripped(const __grid_constant__ Sol s) {
  using T = __nv_bfloat16;
  if (M == kEmpty) return;
  const uint64_t vecs = ear::vec_count<T>(s.count);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // The first input is loaded before the counter, as the library does.
  const uint4 head = first < vecs ? ear::load_input<T>(s.input, first, s.count) : make_uint4(0, 0, 0, 0);
  uint64_t k = s.buf;
  if (M == kStateCopy || M == kSol) {
    __shared__ uint64_t seq;
    if (threadIdx.x == 0) seq = ear::ld_volatile_u64(s.ctr + blockIdx.x);
    __syncthreads();
    k = seq;
    if (threadIdx.x == 0) s.ctr[blockIdx.x] = k + 1;
  }
  if (M == kCopy || M == kStateCopy) {
    for (uint64_t i = first; i < vecs; i += stride)
      ear::store_output<T>(s.output, i, s.count, i == first ? head : ear::load_input<T>(s.input, i, s.count));
    return;
  }
  const uint64_t cur = k % 3u, prev = (k + 2u) % 3u;
  for (uint64_t i = first; i < vecs; i += stride) {
    const uint4 v = ear::lamport_sanitize(i == first ? head : ear::load_input<T>(s.input, i, s.count));
#pragma unroll
    for (int d = 1; d < N; ++d) {
      const int q = (s.rank + d) % N;
      ear::st_vec(s.lam[q] + (cur * N + s.rank) * s.row_bytes + i * 16, v);
    }
  }
  char* const mine = s.lam[s.rank];
  for (int r = 0; r < N; ++r)
    if (r != s.rank)
      for (uint64_t i = first; i < vecs; i += stride)
        ear::st_vec(mine + (prev * N + r) * s.row_bytes + i * 16, make_uint4(0, 0, 0, 0));
  const char* const rows = mine + cur * N * s.row_bytes;
  for (uint64_t i = first; i < vecs; i += stride) {
    ear::Ranks<N> v;
#pragma unroll
    for (int r = 0; r < N; ++r)
      v.v[r] = r == s.rank ? ear::load_input<T>(s.input, i, s.count) : ear::ld_volatile(rows + r * s.row_bytes + i * 16);
    while (!ear::lamport_poll<N>(v, s.rank, rows + i * 16, s.row_bytes)) {
    }
    ear::store_output<T>(s.output, i, s.count, ear::reduce_in_rank_order<T, N>(v.v));
  }
}

// The pieces of the library's Lamport body that a row may leave out (see the top), and two
// layouts of its code: kColdTails moves the element-wise tail of a partial vector (load_input,
// store_output) out of line, kColdLook the bounded wait's look (Waiting::keep_on).
enum Piece : uint32_t { kCheck = 1, kBounded = 4, kFinish = 8, kArm = 16, kAll = 29, kColdTails = 32, kColdLook = 64 };

template <typename T>
__device__ __noinline__ uint4 load_tail(const void* in, uint64_t vi, uint64_t count) {
  return ear::load_input<T>(in, vi, count);
}
template <typename T>
__device__ __noinline__ void store_tail(void* out, uint64_t vi, uint64_t count, uint4 v) {
  ear::store_output<T>(out, vi, count, v);
}
template <typename T, bool Cold>
__device__ __forceinline__ uint4 load_in(const void* in, uint64_t vi, uint64_t count) {
  if (!Cold) return ear::load_input<T>(in, vi, count);
  if (vi * ear::Elem<T>::E + ear::Elem<T>::E <= count) return ear::ld_plain(static_cast<const char*>(in) + vi * 16);
  return load_tail<T>(in, vi, count);
}
template <typename T, bool Cold>
__device__ __forceinline__ void store_out(void* out, uint64_t vi, uint64_t count, uint4 v) {
  if (!Cold) return ear::store_output<T>(out, vi, count, v);
  if (vi * ear::Elem<T>::E + ear::Elem<T>::E <= count) {
    *reinterpret_cast<uint4*>(static_cast<char*>(out) + vi * 16) = v;
    return;
  }
  store_tail<T>(out, vi, count, v);
}
__device__ __noinline__ bool look_cold() { return ear::still_patient(); }
// ear::Waiting with its look out of line.
struct ColdWaiting {
  long long next_look;
  __device__ __forceinline__ ColdWaiting() { next_look = clock64() + ear::kCyclesPerLook; }
  __device__ __forceinline__ bool keep_on() {
    if (clock64() < next_look) return true;
    next_look = clock64() + ear::kCyclesPerLook;
    return look_cold();
  }
};

// How a row reads its call counters and hands the next call its own (the library's read_call and
// write_next_counters, split): the library's way and the ways a row may take instead.
enum Begin : int {
  kBeginLibrary,       // read_call, then write_next_counters after the push and the clear (lamport.cu)
  kBeginOwn,           // thread 0 reads and advances its own copy only, at once: no abort word read,
                       // no copies for other grids (the row "-begin")
  kBeginNoAbort,       // the library's without the abort word read
  kBeginOwnCopy,       // the library's reads; only the CTA's own copy written, after the clear
  kBeginEarly,         // the library's, its copies written at once, before the push
};
template <int B>
constexpr bool kHandOnEarly = B == kBeginOwn || B == kBeginEarly;

template <int B>
__device__ __forceinline__ ear::CallCounters start_call(const EarAllReduceParams& p, const uint64_t* ours) {
  using namespace ear;
  if (B != kBeginOwn && B != kBeginNoAbort) return read_call(p, ours);
  __shared__ CallCounters s;
  if (threadIdx.x == 0) {
    const State* const copy = static_cast<const State*>(p.state) + blockIdx.x;
    s = CallCounters{B == kBeginOwn ? 0u : ld_volatile_u64(&copy->seq), ld_volatile_u64(&copy->lam_seq),
                     ld_volatile_u64(&copy->lam_prev_vecs)};
  }
  __syncthreads();
  return s;
}

template <int B>
__device__ __forceinline__ void hand_on(const EarAllReduceParams& p, const ear::CallCounters& n) {
  using namespace ear;
  State* const st = static_cast<State*>(p.state);
  if (B == kBeginOwn || B == kBeginOwnCopy) {
    if (threadIdx.x == 0) write_copy(st + blockIdx.x, n);
  } else {
    write_next_counters(p, n);
  }
}

template <int N, uint32_t P, int B>
__global__ void __launch_bounds__(EAR_BLOCK_THREADS, 1) ablated(const __grid_constant__ EarAllReduceParams p) {
  using T = __nv_bfloat16;
  using namespace ear;
  if (P & kCheck) check_params<T, N>(p, EAR_LAMPORT_MAX_MSG(p.ws_max_bytes), /*any_block=*/true);
  const uint64_t* const our_abort = (P & kArm) ? open_call<T>(p) : nullptr;
  const uint64_t vecs = vec_count<T>(p.count);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr bool kCold = (P & kColdTails) != 0;
  const auto load = [&](uint64_t i) { return lamport_sanitize(load_in<T, kCold>(p.input, i, p.count)); };
  uint4 head[1];
  load_batch(head, first, stride, vecs, load);
  const CallCounters c = start_call<B>(p, our_abort);
  const CallCounters next = next_lamport_call(c, vecs);
  if (kHandOnEarly<B>) hand_on<B>(p, next);
  const uint64_t m = p.ws_max_bytes;
  const uint64_t row_bytes = EAR_LAMPORT_ROW_BYTES(m);
  const uint64_t cur = c.lam_seq % 3u;
  const uint64_t prev = (c.lam_seq + 2u) % 3u;
  const uint64_t push_off = EAR_OFF_LAMPORT(m, N) + (cur * N + p.rank) * row_bytes;
  for_rest(head, first, stride, vecs, load, [&](uint64_t i, const uint4& v) { lamport_push<N>(p, push_off + i * 16, v); });
  char* const mine = data_region(peer_base<N>(p, p.rank)) + EAR_OFF_LAMPORT(m, N);
  lamport_clear<N>(mine, prev, p.rank, row_bytes, c.lam_prev_vecs, first, stride);
  if (!kHandOnEarly<B>) hand_on<B>(p, next);
  const char* const cur_rows = mine + cur * N * row_bytes;
  const auto load_all = [&](uint64_t i) {
    Ranks<N> v;
#pragma unroll
    for (int r = 0; r < N; ++r)
      v.v[r] = (r == p.rank) ? load_in<T, kCold>(p.input, i, p.count) : ld_volatile(cur_rows + r * row_bytes + i * 16);
    return v;
  };
  const auto poll = [&](uint64_t i, Ranks<N>& v) { return lamport_poll<N>(v, p.rank, cur_rows + i * 16, row_bytes); };
  const auto use = [&](uint64_t i, const Ranks<N>& v) {
    store_out<T, kCold>(p.output, i, p.count, reduce_in_rank_order<T, N>(v.v));
  };
  if ((P & kBounded) && (P & kColdLook)) {
    for (uint64_t i = first; i < vecs; i += stride) {
      Ranks<N> v = load_all(i);
      ColdWaiting wait;
      while (!poll(i, v) && wait.keep_on()) {
      }
      use(i, v);
    }
  } else if (P & kBounded) {
    batched_for_polled<1>(first, stride, vecs, load_all, poll, use);
  } else {
    for (uint64_t i = first; i < vecs; i += stride) {
      Ranks<N> v = load_all(i);
      while (!poll(i, v)) {
      }
      use(i, v);
    }
  }
  if (P & kFinish) finish_call();
}

__global__ void empty_rank(const EarAllReduceParams) {}

enum Kind { K_FLOOR, K_LIBRARY, K_STRIPPED };
struct Row {
  const char* name;
  Kind kind;
  const void* k[3];  // N = 2, 4, 8
  bool pdl;          // the library's kernel: launched with PDL
  bool full;         // compared with the library's output
};
#define LIB {(const void*)ear_oneshot_lamport_bf16_n2, (const void*)ear_oneshot_lamport_bf16_n4, (const void*)ear_oneshot_lamport_bf16_n8}
#define ST(M) {(const void*)stripped<2, M>, (const void*)stripped<4, M>, (const void*)stripped<8, M>}
#define AB(P, B) {(const void*)ablated<2, P, B>, (const void*)ablated<4, P, B>, (const void*)ablated<8, P, B>}
const Row kRows[] = {
    {"floor", K_FLOOR, {(const void*)empty_rank, (const void*)empty_rank, (const void*)empty_rank}, false, false},
    {"lamport (PDL)", K_LIBRARY, LIB, true, true},
    {"lamport (no PDL)", K_LIBRARY, LIB, false, true},
    {"empty", K_STRIPPED, ST(kEmpty), false, false},
    {"copy", K_STRIPPED, ST(kCopy), false, false},
    {"state+copy", K_STRIPPED, ST(kStateCopy), false, false},
    {"sol@param", K_STRIPPED, ST(kSolParam), false, true},
    {"sol", K_STRIPPED, ST(kSol), false, true},
    {"replica", K_LIBRARY, AB(kAll, kBeginLibrary), false, true},
    {"-check", K_LIBRARY, AB(kAll & ~kCheck, kBeginLibrary), false, true},
    {"-begin", K_LIBRARY, AB(kAll, kBeginOwn), false, true},
    {"-bounded", K_LIBRARY, AB(kAll & ~kBounded, kBeginLibrary), false, true},
    {"-finish", K_LIBRARY, AB(kAll & ~kFinish, kBeginLibrary), false, true},
    {"-all", K_LIBRARY, AB(0, kBeginOwn), false, true},
    {"begin: no abort", K_LIBRARY, AB(kAll, kBeginNoAbort), false, true},
    {"begin: own copy", K_LIBRARY, AB(kAll, kBeginOwnCopy), false, true},
    {"begin: early", K_LIBRARY, AB(kAll, kBeginEarly), false, true},
    {"+cold tails", K_LIBRARY, AB(kAll | kColdTails, kBeginLibrary), false, true},
    {"+cold tails+look", K_LIBRARY, AB(kAll | kColdTails | kColdLook, kBeginLibrary), false, true},
};
constexpr int kNumRows = sizeof(kRows) / sizeof(kRows[0]);
constexpr int kLibraryRow = 1;  // its output is the reference

struct Stages : stages::Ranks {
  char* lam[EAR_MAX_RANKS]{};
  uint64_t* ctr[EAR_MAX_RANKS]{};
  uint64_t row_bytes = 0;
  void init(int nranks, uint64_t bytes) {
    init_buffers(nranks, std::max<uint64_t>(bytes, 1u << 20), bytes);
    row_bytes = EAR_ROUND_UP(bytes, 16u);
    for (int r = 0; r < n; ++r) {
      CK(cudaMalloc(&lam[r], 3 * n * row_bytes));
      CK(cudaMalloc(&ctr[r], EAR_MAX_BLOCKS * sizeof(uint64_t)));
    }
  }
  void destroy() {
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < n; ++r) {
      CK(cudaFree(lam[r]));
      CK(cudaFree(ctr[r]));
    }
    destroy_buffers();
  }
  // Every row starts from zeroed buffers and counters: its own (the stripped kernels), or the
  // library's workspaces and state blocks (the ablated rows keep only their own copy of the
  // counters, which a grid of another size would then read stale).
  void zero_all() {
    for (int r = 0; r < n; ++r) {
      CK(cudaMemsetAsync(lam[r], 0, 3 * n * row_bytes, origin));
      CK(cudaMemsetAsync(ctr[r], 0, EAR_MAX_BLOCKS * sizeof(uint64_t), origin));
      CK(cudaMemsetAsync(ws[r], 0, EAR_WORKSPACE_BYTES(ws_max, n), origin));
      CK(cudaMemsetAsync(state[r], 0, EAR_STATE_BYTES, origin));
    }
    wait_stream(origin);
  }
  // The stripped kernels' parameters for the call that the library's `p` describes.
  Sol stripped_params(const EarAllReduceParams& p, uint32_t call) const {
    Sol sol{};
    for (int q = 0; q < n; ++q) sol.lam[q] = lam[q];
    sol.ctr = ctr[p.rank];
    sol.input = p.input;
    sol.output = p.output;
    sol.count = p.count;
    sol.row_bytes = row_bytes;
    sol.rank = p.rank;
    sol.buf = call % 3u;
    return sol;
  }
  void op(const Row& row, uint64_t count, uint32_t call) {
    const uint64_t vecs = EAR_CEIL_DIV(count * 2, EAR_VEC_BYTES);
    const dim3 grid = row.kind == K_FLOOR ? dim3(1) : dim3(EAR_LAMPORT_GRID(vecs, grid_cap()));
    const dim3 block = row.kind == K_FLOOR ? dim3(EAR_BLOCK_THREADS) : dim3(EAR_LAMPORT_BLOCK(vecs, grid_cap()));
    const void* k = row.k[n == 2 ? 0 : n == 4 ? 1 : 2];
    fork_ranks();
    for (int r = 0; r < n; ++r) {
      EarAllReduceParams p = params_of(r, count);
      bound_waits(p, r);
      if (row.kind == K_STRIPPED) {
        Sol sol = stripped_params(p, call);
        launch_kernel(k, grid, block, st[r], false, &sol);
      } else {
        launch_kernel(k, grid, block, st[r], row.pdl, &p);
      }
    }
    join_ranks();
  }
};

}  // namespace

int main(int argc, char** argv) {
  stages::Sweep w;
  w.ranks = {2, 4, 8};
  w.sizes = {16, 8u << 10, 64u << 10, 256u << 10};
  w.ops = 21;
  w.name_width = 22;
  w.value_width = 11;
  w.reference = "the library's Lamport";
  if (!stages::parse_args(argc, argv, w)) return 2;
  if (w.ops % 3 != 0) {
    std::printf("--ops must be a multiple of 3 (sol@param rotates 3 buffers by call index)\n");
    return 2;
  }
  for (uint64_t b : w.sizes)
    if (b % 2 != 0 || b > (2u << 20) || b == 0) {
      std::printf("sizes: even byte counts of bf16 messages, 2 B to 2 MiB (the Lamport family's range)\n");
      return 2;
    }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  CK(cudaSetDevice(0));
  stages::Rows<Stages> rows;
  rows.count = kNumRows;
  rows.ref = kLibraryRow;
  rows.name = [](int k) { return kRows[k].name; };
  rows.compared = [](int k) { return kRows[k].full; };
  // Every row but the floor starts from zeroed buffers and counters; so does its graph after the
  // compared op (sol@param's calls start from buffer 0).
  rows.prepare = [](Stages& s, int k) {
    if (kRows[k].kind != K_FLOOR) s.zero_all();
  };
  rows.op = [](Stages& s, int k, uint64_t count, uint32_t call) { s.op(kRows[k], count, call); };
  const int failed = stages::run_sweep(w, rows);
  if (failed < 0) return 2;
  return failed ? 1 : 0;
}
