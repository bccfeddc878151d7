// stages_common.cuh: what the stage tools share (twoshot_stages.cu, lamport_stages.cu): N
// simulated ranks with one bf16 input and output each and a reference output, the bit-for-bit
// comparison with it, the timing of a captured graph of ops with the benchmark's method, the
// command line's lists and the printed table.
#pragma once

#include <functional>

#include "../../tests/gpu/kernels/sim_common.cuh"

namespace stages {

__global__ void count_mismatch(const uint16_t* a, const uint16_t* b, uint64_t n, unsigned* bad) {
  unsigned mine = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    mine += a[i] != b[i];
  if (mine) atomicAdd(bad, mine);
}

struct Ranks : SimRanks {
  void* in[EAR_MAX_RANKS]{};
  void* out[EAR_MAX_RANKS]{};
  void* ref = nullptr;
  unsigned* bad = nullptr;
  void init_buffers(int nranks, uint64_t ws_max_bytes, uint64_t bytes) {
    init_ranks(nranks, ws_max_bytes, bytes, false);
    for (int r = 0; r < n; ++r) {
      CK(cudaMalloc(&in[r], bytes));
      CK(cudaMalloc(&out[r], bytes));
    }
    CK(cudaMalloc(&ref, bytes));
    CK(cudaMalloc(&bad, sizeof(unsigned)));
  }
  void destroy_buffers() {
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < n; ++r) {
      CK(cudaFree(in[r]));
      CK(cudaFree(out[r]));
    }
    CK(cudaFree(ref));
    CK(cudaFree(bad));
    destroy_ranks();
  }
  // Rank r's parameters for an all-reduce of `count` bf16 elements from in[r] into out[r].
  EarAllReduceParams params_of(int r, uint64_t count) const {
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
    return p;
  }
  // Fresh inputs of `count` bf16 elements for every rank, from `seed`.
  void generate(uint64_t count, uint64_t seed) {
    for (int r = 0; r < n; ++r) {
      gen_kernel<<<1024, 256, 0, origin>>>(in[r], count, BF16, seed, r);
      CK(cudaGetLastError());
    }
  }
  // Elements of every rank's output (count bf16) that differ from ref.
  unsigned mismatches(uint64_t count) {
    CK(cudaMemsetAsync(bad, 0, sizeof(unsigned), origin));
    for (int r = 0; r < n; ++r)
      count_mismatch<<<512, 256, 0, origin>>>(static_cast<const uint16_t*>(out[r]), static_cast<const uint16_t*>(ref), count, bad);
    unsigned h = 0;
    CK(cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, origin));
    wait_stream(origin);
    return h;
  }
  // Median µs per op of a graph that `record` captures (`ops` ops): 2 warm-up batches, then
  // `batches` batches of `replays` replays back to back.
  double median_us(int replays, int batches, int ops, const std::function<void()>& record) {
    cudaGraphExec_t g = capture_graph(origin, record);
    std::vector<double> us;
    for (int b = 0; b < batches + 2; ++b) {
      CK(cudaEventRecord(t0, origin));
      for (int rep = 0; rep < replays; ++rep) CK(cudaGraphLaunch(g, origin));
      CK(cudaEventRecord(t1, origin));
      wait_stream(origin);
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      if (b >= 2) us.push_back(ms * 1000.0 / (replays * ops));
    }
    CK(cudaGraphExecDestroy(g));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }
};

// "2,4,8" or, with bytes, "16,8K,1M".
inline std::vector<uint64_t> parse_list(const char* s, bool bytes) {
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

// What a stage tool sweeps, and how its table looks.
struct Sweep {
  std::vector<uint64_t> ranks, sizes;  // N in {2, 4, 8}; message bytes (bf16)
  int replays = 10, batches = 20, ops = 20;
  int name_width = 20, value_width = 10;
  bool sizes_in_kib = false;  // column heads in KiB, else in bytes
  const char* reference = "";  // whose output the compared rows match, e.g. "the one-shot's"
};

// The command line into w (its defaults as given): --ranks, --sizes, --replays, --batches, --ops,
// --timeout (the watchdog, sim_common.cuh). False, after printing the usage, on anything else.
inline bool parse_args(int argc, char** argv, Sweep& w) {
  for (int i = 1; i < argc; i += 2) {
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v && !std::strcmp(argv[i], "--ranks")) w.ranks = parse_list(v, false);
    else if (v && !std::strcmp(argv[i], "--sizes")) w.sizes = parse_list(v, true);
    else if (v && !std::strcmp(argv[i], "--replays")) w.replays = std::atoi(v);
    else if (v && !std::strcmp(argv[i], "--batches")) w.batches = std::atoi(v);
    else if (v && !std::strcmp(argv[i], "--ops")) w.ops = std::atoi(v);
    else if (v && !std::strcmp(argv[i], "--timeout")) g_timeout_s = std::atof(v);
    else {
      std::printf("usage: %s [--ranks 2,4,8] [--sizes 16,8K,1M] [--replays N] [--batches N] [--ops N] [--timeout SECONDS]\n",
                  argv[0]);
      return false;
    }
  }
  if (w.ranks.empty() || w.sizes.empty() || w.replays < 1 || w.batches < 1 || w.ops < 1) {
    std::printf("%s: empty lists or counts below 1\n", argv[0]);
    return false;
  }
  return true;
}

// A tool's rows: how many, their names, which are compared (with row `ref`, which comes first
// among them), what runs before each (prepare) and one op of a row (op: its call index too).
template <typename S>
struct Rows {
  int count = 0, ref = 0;
  std::function<const char*(int)> name;
  std::function<bool(int)> compared;
  std::function<void(S&, int)> prepare;
  std::function<void(S&, int, uint64_t, uint32_t)> op;
};

// For every N a fresh S (S::init(n, largest size), S::destroy()), for every size fresh inputs,
// for every row: prepare; a compared row also runs one op on outputs poisoned with 0xFF and is
// compared bit for bit with the reference row's output (then prepared again, so the graph starts
// as the op did); then the graph's median per op. Prints a table per N; returns the number of
// rows that differed, or -1 for a rank count other than 2, 4, 8.
template <typename S>
int run_sweep(const Sweep& w, const Rows<S>& rows) {
  const uint64_t max_bytes = *std::max_element(w.sizes.begin(), w.sizes.end());
  int failed = 0;
  for (uint64_t n : w.ranks) {
    if (n != 2 && n != 4 && n != 8) {
      std::printf("ranks 2, 4 and 8 only\n");
      return -1;
    }
    S s;
    s.init(static_cast<int>(n), max_bytes);
    std::printf("\nN = %llu, grid <= %d CTAs per rank, bf16, %d ops per graph, %d replays x %d batches (+2 warm-up), median us per op\n",
                (unsigned long long)n, s.grid_cap(), w.ops, w.replays, w.batches);
    std::printf("%-*s", w.name_width, "row");
    for (uint64_t b : w.sizes)
      std::printf(" %*llu%c", w.value_width - 1, (unsigned long long)(w.sizes_in_kib ? b >> 10 : b), w.sizes_in_kib ? 'K' : 'B');
    std::printf("\n");
    std::vector<std::vector<double>> t(rows.count, std::vector<double>(w.sizes.size()));
    for (size_t si = 0; si < w.sizes.size(); ++si) {
      const uint64_t bytes = w.sizes[si], count = bytes / 2;
      s.generate(count, 1000 + si);
      for (int k = 0; k < rows.count; ++k) {
        char name[128];
        std::snprintf(name, sizeof(name), "%s n%llu %llu B", rows.name(k), (unsigned long long)n, (unsigned long long)bytes);
        g_case = name;
        rows.prepare(s, k);
        if (rows.compared(k)) {
          for (int r = 0; r < s.n; ++r) CK(cudaMemsetAsync(s.out[r], 0xFF, bytes, s.origin));
          rows.op(s, k, count, 0);
          wait_stream(s.origin);
          CK(cudaGetLastError());
          if (k == rows.ref) CK(cudaMemcpy(s.ref, s.out[0], bytes, cudaMemcpyDeviceToDevice));
          const unsigned bad = s.mismatches(count);
          if (bad) {
            std::printf("FAIL %s: %u elements differ from %s\n", name, bad, w.reference);
            ++failed;
          }
          rows.prepare(s, k);
        }
        t[k][si] = s.median_us(w.replays, w.batches, w.ops, [&] {
          for (int o = 0; o < w.ops; ++o) rows.op(s, k, count, static_cast<uint32_t>(o));
        });
      }
    }
    for (int k = 0; k < rows.count; ++k) {
      std::printf("%-*s", w.name_width, rows.name(k));
      for (double v : t[k]) std::printf(" %*.2f", w.value_width, v);
      std::printf("\n");
    }
    std::fflush(stdout);
    s.destroy();
  }
  std::printf("%s\n", failed ? "some compared rows differ" : "every compared row bit-identical");
  return failed;
}

}  // namespace stages
