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
//                       [--timeout SECONDS]
#include "../../tests/gpu/kernels/sim_common.cuh"

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

__global__ void count_mismatch(const uint16_t* a, const uint16_t* b, uint64_t n, unsigned* bad) {
  unsigned mine = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    mine += a[i] != b[i];
  if (mine) atomicAdd(bad, mine);
}

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

struct Stages : SimRanks {
  void* in[EAR_MAX_RANKS]{};
  void* out[EAR_MAX_RANKS]{};
  void* ref = nullptr;
  unsigned* bad = nullptr;
  void init(int nranks, uint64_t bytes) {
    init_ranks(nranks, bytes, bytes, false);
    for (int r = 0; r < n; ++r) {
      CK(cudaMalloc(&in[r], bytes));
      CK(cudaMalloc(&out[r], bytes));
    }
    CK(cudaMalloc(&ref, bytes));
    CK(cudaMalloc(&bad, sizeof(unsigned)));
  }
  void destroy() {
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < n; ++r) {
      CK(cudaFree(in[r]));
      CK(cudaFree(out[r]));
    }
    CK(cudaFree(ref));
    CK(cudaFree(bad));
    destroy_ranks();
  }
  void op(const Row& row, uint64_t count) {
    const uint64_t vecs = EAR_CEIL_DIV(count * 2, EAR_VEC_BYTES);
    const uint32_t grid = row.grid == G_ONESHOT ? EAR_GRID(vecs, grid_cap())
                          : row.grid == G_TWOSHOT ? EAR_GRID(EAR_CEIL_DIV(vecs, n), grid_cap())
                                                  : 1u;
    fork_ranks();
    for (int r = 0; r < n; ++r) {
      EarAllReduceParams p;
      std::memset(&p, 0, sizeof(p));
      for (int q = 0; q < n; ++q) p.peer_ws[q] = ws[q];
      p.state = state[r];
      p.input = in[r];
      p.output = out[r];
      p.count = count;
      p.ws_max_bytes = ws_max;
      p.rank = r;
      p.nranks = n;
      p.flags = row.flags;
      launch_kernel(row.k[n == 2 ? 0 : n == 4 ? 1 : 2], dim3(grid), dim3(EAR_BLOCK_THREADS), st[r], true, &p);
    }
    join_ranks();
  }
  unsigned mismatches(uint64_t count) {
    CK(cudaMemsetAsync(bad, 0, sizeof(unsigned), origin));
    for (int r = 0; r < n; ++r)
      count_mismatch<<<512, 256, 0, origin>>>(static_cast<const uint16_t*>(out[r]), static_cast<const uint16_t*>(ref), count, bad);
    unsigned h = 0;
    CK(cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, origin));
    wait_stream(origin);
    return h;
  }
};

static std::vector<uint64_t> parse_list(const char* s, bool bytes) {
  std::vector<uint64_t> v;
  for (const char* p = s; *p;) {
    char* end;
    uint64_t x = std::strtoull(p, &end, 10);
    if (bytes && (*end == 'K' || *end == 'M')) x <<= (*end++ == 'K' ? 10 : 20);
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return v;
}

int main(int argc, char** argv) {
  std::vector<uint64_t> ranks = {4, 8}, sizes = {256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
  int replays = 5, batches = 10, ops = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks")) ranks = parse_list(argv[i + 1], false);
    else if (!std::strcmp(argv[i], "--sizes")) sizes = parse_list(argv[i + 1], true);
    else if (!std::strcmp(argv[i], "--replays")) replays = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches")) batches = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--timeout")) g_timeout_s = std::atof(argv[i + 1]);
    else {
      std::printf("usage: %s [--ranks 4,8] [--sizes 256K,1M] [--replays 5] [--batches 10] [--timeout S]\n", argv[0]);
      return 2;
    }
  }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  CK(cudaSetDevice(0));
  const uint64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  int failed = 0;
  for (uint64_t n : ranks) {
    if (n != 2 && n != 4 && n != 8) {
      std::printf("ranks 2, 4 and 8 only\n");
      return 2;
    }
    Stages s;
    s.init(static_cast<int>(n), max_bytes);
    std::printf("\nN = %llu, grid <= %d CTAs per rank, bf16, %d ops per graph, %d replays x %d batches, median us per op\n",
                (unsigned long long)n, s.grid_cap(), ops, replays, batches);
    std::printf("%-20s", "row");
    for (uint64_t b : sizes) std::printf(" %9lluK", (unsigned long long)(b >> 10));
    std::printf("\n");
    std::vector<std::vector<double>> t(kNumRows, std::vector<double>(sizes.size()));
    for (size_t si = 0; si < sizes.size(); ++si) {
      const uint64_t count = sizes[si] / 2;
      for (int r = 0; r < s.n; ++r) {
        gen_kernel<<<1024, 256, 0, s.origin>>>(s.in[r], count, BF16, 1000 + si, r);
        CK(cudaGetLastError());
      }
      for (int k = 0; k < kNumRows; ++k) {
        const Row& row = kRows[k];
        char name[128];
        std::snprintf(name, sizeof(name), "%s n%llu %llu B", row.name, (unsigned long long)n, (unsigned long long)sizes[si]);
        g_case = name;
        if (row.full) {
          for (int r = 0; r < s.n; ++r) CK(cudaMemsetAsync(s.out[r], 0xFF, sizes[si], s.origin));
          s.op(row, count);
          wait_stream(s.origin);
          CK(cudaGetLastError());
          if (k == 1) CK(cudaMemcpy(s.ref, s.out[0], sizes[si], cudaMemcpyDeviceToDevice));
          const unsigned bad = s.mismatches(count);
          if (bad) {
            std::printf("FAIL %s: %u elements differ from the one-shot's\n", name, bad);
            ++failed;
          }
        }
        cudaGraphExec_t g = capture_graph(s.origin, [&] {
          for (int o = 0; o < ops; ++o) s.op(row, count);
        });
        std::vector<double> us;
        for (int b = 0; b < batches + 2; ++b) {
          CK(cudaEventRecord(s.t0, s.origin));
          for (int rep = 0; rep < replays; ++rep) CK(cudaGraphLaunch(g, s.origin));
          CK(cudaEventRecord(s.t1, s.origin));
          wait_stream(s.origin);
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, s.t0, s.t1));
          if (b >= 2) us.push_back(ms * 1000.0 / (replays * ops));
        }
        CK(cudaGraphExecDestroy(g));
        std::sort(us.begin(), us.end());
        t[k][si] = us[us.size() / 2];
      }
    }
    for (int k = 0; k < kNumRows; ++k) {
      std::printf("%-20s", kRows[k].name);
      for (size_t si = 0; si < sizes.size(); ++si) std::printf(" %10.2f", t[k][si]);
      std::printf("\n");
    }
    std::fflush(stdout);
    s.destroy();
  }
  std::printf("%s\n", failed ? "some rows differ from the one-shot" : "every full row bit-identical to the one-shot");
  return failed ? 1 : 0;
}
