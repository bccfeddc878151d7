// twoshot_stages.cu: where the time of the 4+ rank two-shot goes, on simulated ranks (N ranks
// on one GPU), with the benchmark's method: a CUDA graph of 20 ops, each a fork of N rank
// streams, one launch per rank (grid <= SMs/N, PDL on), a join; replayed back to back, µs per
// op, median over batches. Figures, not tests: a row whose stages are all there is also
// compared bit for bit with the one-shot's output (the canonical sum) on fresh random inputs.
//
// Rows per (N, size): the floor (an empty kernel per rank), the one-shot and the 2-rank
// two-shot (twoshot.cu) as the library runs them, the 4+ rank two-shot (twoshot_wide.cu) as
// the library runs it ("wide"), its stages cumulatively (copy; + barrier; + reduce; +
// barrier; + gather = wide), and its reduce in copy order instead of reverse ("w:fifo"). Then
// the same kernels as a group of one process runs them: exchanging pointers with every input
// copied ("1s:pointers", "w:pointers": what a rank whose output is its input costs its group)
// and with every input read in place ("1s:in-place", "wide in-place", its stages "wi:").
// EAR_CALL_POINTERS is read by the one-shot at every N and by the 4+ rank two-shot: at N = 2 the
// two-shot's pointer rows are its copying ones.
//
// Built by tools/gpu/stage.sh (or: nvcc -O3 -std=c++17 -arch=sm_90 tools/gpu/twoshot_stages.cu);
// usage: twoshot_stages [--ranks 4,8,2] [--sizes 256K,1M,4M,16M,64M] [--replays 5] [--batches 10]
//                       [--ops 20] [--timeout SECONDS]
#include "stages_common.cuh"

using ear::kWideAll;
constexpr uint32_t kNoLifo = kWideAll & ~ear::kWideLifo;
constexpr uint32_t kCopy = ear::kWideCopy | ear::kWideLifo;
constexpr uint32_t kCopyB1 = kCopy | ear::kWideBarrier1;
constexpr uint32_t kCopyB1R = kCopyB1 | ear::kWideReduce;
constexpr uint32_t kCopyB1RB2 = kCopyB1R | ear::kWideBarrier2;

template <int N, uint32_t Opts>
__global__ void __launch_bounds__(EAR_BLOCK_THREADS, 1) wide_variant(const __grid_constant__ EarAllReduceParams p) {
  ear::twoshot_barrier_body<__nv_bfloat16, N, Opts>(p);
}
__global__ void empty_rank(const EarAllReduceParams) {}

enum Grid { G_NONE, G_ONESHOT, G_TWOSHOT };
constexpr uint32_t kPointers = EAR_CALL_POINTERS;
constexpr uint32_t kShared = EAR_CALL_POINTERS | EAR_CALL_INPUT_SHARED;
struct Row {
  const char* name;
  const void* k[3];  // N = 2, 4, 8
  Grid grid;
  bool full;       // every stage: compared with the one-shot's output
  uint32_t flags;  // EarAllReduceParams.flags of every rank (kShared: inputs read in place)
};
#define LIB(F) {(const void*)F##_n2, (const void*)F##_n4, (const void*)F##_n8}
#define WV(O) {(const void*)wide_variant<2, O>, (const void*)wide_variant<4, O>, (const void*)wide_variant<8, O>}
static const Row kRows[] = {
    {"floor", {(const void*)empty_rank, (const void*)empty_rank, (const void*)empty_rank}, G_NONE, false, 0},
    {"oneshot", LIB(ear_oneshot_barrier_bf16), G_ONESHOT, true, 0},
    {"1s:pointers", LIB(ear_oneshot_barrier_bf16), G_ONESHOT, true, kPointers},
    {"1s:in-place", LIB(ear_oneshot_barrier_bf16), G_ONESHOT, true, kShared},
    {"twoshot_polled", LIB(ear_twoshot_polled_bf16), G_TWOSHOT, true, 0},
    {"wide", LIB(ear_twoshot_barrier_bf16), G_TWOSHOT, true, 0},
    {"w:copy", WV(kCopy), G_TWOSHOT, false, 0},
    {"w:copy+b1", WV(kCopyB1), G_TWOSHOT, false, 0},
    {"w:copy+b1+reduce", WV(kCopyB1R), G_TWOSHOT, false, 0},
    {"w:..+b2", WV(kCopyB1RB2), G_TWOSHOT, false, 0},
    {"w:fifo", WV(kNoLifo), G_TWOSHOT, true, 0},
    {"w:pointers", LIB(ear_twoshot_barrier_bf16), G_TWOSHOT, true, kPointers},
    {"wide in-place", LIB(ear_twoshot_barrier_bf16), G_TWOSHOT, true, kShared},
    {"wi:b1", WV(kCopyB1), G_TWOSHOT, false, kShared},
    {"wi:b1+reduce", WV(kCopyB1R), G_TWOSHOT, false, kShared},
    {"wi:..+b2", WV(kCopyB1RB2), G_TWOSHOT, false, kShared},
    {"wi:fifo", WV(kNoLifo), G_TWOSHOT, true, kShared},
};
constexpr int kNumRows = sizeof(kRows) / sizeof(kRows[0]);

struct Stages : stages::Ranks {
  void init(int nranks, uint64_t bytes) { init_buffers(nranks, bytes, bytes); }
  void destroy() { destroy_buffers(); }
  void op(const Row& row, uint64_t count) {
    const uint64_t vecs = EAR_CEIL_DIV(count * 2, EAR_VEC_BYTES);
    const uint32_t grid = row.grid == G_ONESHOT ? EAR_GRID(vecs, grid_cap())
                          : row.grid == G_TWOSHOT ? EAR_GRID(EAR_CEIL_DIV(vecs, n), grid_cap())
                                                  : 1u;
    fork_ranks();
    for (int r = 0; r < n; ++r) {
      EarAllReduceParams p = params_of(r, count);
      p.flags = row.flags;
      launch_kernel(row.k[n == 2 ? 0 : n == 4 ? 1 : 2], dim3(grid), dim3(EAR_BLOCK_THREADS), st[r], true, &p);
    }
    join_ranks();
  }
};

int main(int argc, char** argv) {
  stages::Sweep w;
  w.ranks = {4, 8};
  w.sizes = {256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
  w.replays = 5;
  w.batches = 10;
  w.sizes_in_kib = true;
  w.reference = "the one-shot's";
  if (!stages::parse_args(argc, argv, w)) return 2;
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  CK(cudaSetDevice(0));
  stages::Rows<Stages> rows;
  rows.count = kNumRows;
  rows.ref = 1;  // the one-shot
  rows.name = [](int k) { return kRows[k].name; };
  rows.compared = [](int k) { return kRows[k].full; };
  rows.prepare = [](Stages&, int) {};
  rows.op = [](Stages& s, int k, uint64_t count, uint32_t) { s.op(kRows[k], count); };
  const int failed = stages::run_sweep(w, rows);
  if (failed < 0) return 2;
  return failed ? 1 : 0;
}
