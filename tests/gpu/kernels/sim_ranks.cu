// sim_ranks.cu: N simulated ranks on ONE GPU for the all-reduce kernels of kernels/.
//
// Each rank owns a zero-filled workspace (EAR_WORKSPACE_BYTES) and state block on the same
// device; peer_ws[] holds all of them, so every cross-rank protocol runs for real (only
// NVLink is replaced by local HBM). By default each rank's launch goes to its own
// non-blocking stream, forked from and joined to an origin stream; grids are capped at
// SMs / N so all ranks' CTAs are co-resident (the kernels spin on peers). --one-launch
// instead runs all ranks in one launch (blockIdx.y = rank) for tools that serialize kernels.
//
// Every family of kernels/ear_families.h, and the 4+ rank two-shot, at every N (sim_common.cuh's
// slots). Checks, per case: every rank's output bit-identical to rank 0's and to the canonical
// fp32 rank-order sum (computed on the GPU from the generator); rank 0 within tolerance
// of an fp64 reference (computed on the GPU from the input generator, spot-checked on the
// CPU); no NaN left from the poisoned output; 256 guard bytes after the output untouched.
// Then per-rank CUDA graphs (refresh inputs from a device counter + a mixed sequence of all-
// reduces of different families/sizes/grids, some with PDL) replayed 1000 times with checks
// every 100th replay, and graph-replay timings (informational).
//
// Usage: sim_ranks [--quick] [--one-launch] [--timeout SECONDS] [--no-timing]
// Prints one line per case and "N passed, M failed"; exit code 0 only if all passed.
#include "sim_common.cuh"

static const double kTol[] = {1e-5, 2e-3, 1e-2};  // relative to sum_r |x_r|

// All ranks in one launch: blockIdx.y is the rank, params come from device memory. A slot's
// body is its kernel stem's (ear::<stem>_body).
template <typename T, int N, int FAM>
__global__ void __launch_bounds__(EAR_BLOCK_THREADS, 1)
    sim_all_ranks(const EarAllReduceParams* __restrict__ ps) {
  const EarAllReduceParams& p = ps[blockIdx.y];
#define EAR_SIM_BODY_(name, id, plain2, plainwide, ...)                      \
  if constexpr (FAM == id) ear::plain2##_body<T, N>(p);                       \
  if constexpr (FAM == WIDE && id == TWOSHOT) ear::plainwide##_body<T, N>(p);
  EAR_FOR_EACH_FAMILY(EAR_SIM_BODY_)
#undef EAR_SIM_BODY_
}
struct SimKernels {
  KernelRow k[kFams];
};
static const SimKernels kSimKernels = [] {
  SimKernels t{};
#define EAR_SIM_ONE_LAUNCH_(name, id, ...) sim_fill(t.k[id], SIM_TABLE_ROW(sim_all_ranks, id));
  EAR_FOR_EACH_FAMILY(EAR_SIM_ONE_LAUNCH_)
#undef EAR_SIM_ONE_LAUNCH_
  sim_fill(t.k[WIDE], SIM_TABLE_ROW(sim_all_ranks, WIDE));
  return t;
}();

struct CheckResult {
  unsigned mismatches;  // elements where some rank differs from rank 0 (bitwise)
  unsigned nonfinite;   // NaN/Inf in rank 0's output (poison left or overflow)
  unsigned guard_bad;   // guard bytes written
  unsigned max_err;     // float bits of the max relative error (non-negative floats sort as ints)
  unsigned not_canon;   // rank 0 differs from the fp32 sum in rank order 0..N-1 rounded once
};
struct OutPtrs {
  const void* p[EAR_MAX_RANKS];
};

__global__ void check_kernel(OutPtrs outs, int n, uint64_t count, int dt, uint64_t seed,
                             CheckResult* res) {
  float worst = 0.0f;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t b0 = load_bits(outs.p[0], i, dt);
    for (int r = 1; r < n; ++r)
      if (load_bits(outs.p[r], i, dt) != b0) {
        atomicAdd(&res->mismatches, 1u);
        break;
      }
    double ref = 0.0, mag = 0.0;
    for (int r = 0; r < n; ++r) {
      const double x = decode(gen_bits(seed, r, i, dt), dt);
      ref += x;
      mag += fabs(x);
    }
    // The contract's exact result: fp32 accumulator from +0.0f, ranks 0..N-1, one rounding.
    float acc = 0.0f;
    for (int r = 0; r < n; ++r) acc += static_cast<float>(decode(gen_bits(seed, r, i, dt), dt));
    const uint32_t canon = dt == F32   ? __float_as_uint(acc)
                           : dt == F16 ? static_cast<uint32_t>(__half_as_ushort(__float2half_rn(acc)))
                                       : static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc)));
    if (canon != b0) atomicAdd(&res->not_canon, 1u);
    const double got = decode(b0, dt);
    if (!isfinite(got)) {
      atomicAdd(&res->nonfinite, 1u);
      continue;
    }
    const double err = fabs(got - ref) / fmax(mag, 1e-30);
    worst = fmaxf(worst, static_cast<float>(err));
  }
  for (int o = 16; o > 0; o >>= 1) worst = fmaxf(worst, __shfl_xor_sync(0xffffffffu, worst, o));
  if ((threadIdx.x & 31) == 0 && worst > 0.0f) atomicMax(&res->max_err, __float_as_uint(worst));
  // Guard: the 256 bytes after the output must keep the 0xFF poison.
  if (blockIdx.x == 0 && threadIdx.x < 256) {
    const uint64_t off = count * (dt == F32 ? 4 : 2) + threadIdx.x;
    for (int r = 0; r < n; ++r)
      if (static_cast<const uint8_t*>(outs.p[r])[off] != 0xFFu) atomicAdd(&res->guard_bad, 1u);
  }
}

// ---------------------------------------------------------------------------------------
// Simulated communicator

struct Sim : SimRanks {
  void* in[EAR_MAX_RANKS]{};
  void* out[EAR_MAX_RANKS]{};
  EarAllReduceParams* dparams = nullptr;  // one-launch mode: pool of N-param sets
  // Whether the ranks exchange pointers (EAR_CALL_POINTERS: a group of one process; read by
  // the one-shot and the 4+ rank two-shot), and bit r: rank r lets its peers read its input in
  // place (EAR_CALL_INPUT_SHARED). run_case draws them per case: no exchange, or an exchange
  // with none, all, or a mix of the inputs shared.
  bool pointers = false;
  uint32_t shared_inputs = 0;
  CheckResult* dres = nullptr;

  void init(int nranks, uint64_t ws_max_bytes, uint64_t buf_bytes, bool one) {
    init_ranks(nranks, ws_max_bytes, buf_bytes, one);
    for (int r = 0; r < n; ++r) {
      CK(cudaMalloc(&in[r], buf_max + kGuard));
      CK(cudaMalloc(&out[r], buf_max + kGuard));
    }
    CK(cudaMalloc(&dparams, sizeof(EarAllReduceParams) * EAR_MAX_RANKS * pool_slots));
    CK(cudaMalloc(&dres, sizeof(CheckResult)));
    CK(cudaDeviceSynchronize());
  }
  void destroy() {
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < n; ++r) {
      CK(cudaFree(in[r]));
      CK(cudaFree(out[r]));
    }
    CK(cudaFree(dparams));
    CK(cudaFree(dres));
    destroy_ranks();
  }
  uint64_t max_msg(int fam) const { return sim_max_msg(fam, ws_max); }
  // The library's launch plan of rank r's call (ear_plan_of on the family's rule, flags
  // included: the pointer exchange where the simulation turns it on, the input shared where it
  // says rank r's is reachable).
  EarPlan plan(int fam, int dt, uint64_t count, int r = 0, bool in_place = false) const {
    const EarCallFacts facts = sim_facts(pointers, in_place, (shared_inputs >> r) & 1u);
    return sim_plan(plan_family(fam), EAR_OP_ALLREDUCE, count, 0, 0, kElemSize[dt], n, grid_cap(), facts);
  }
  int grid_rule(int fam, int dt, uint64_t count) const { return static_cast<int>(plan(fam, dt, count).grid); }
  // The block of a call: Lamport's depends on the size (any grid works with it).
  int block_rule(int fam, int dt, uint64_t count) const { return static_cast<int>(plan(fam, dt, count).block); }

  EarAllReduceParams params(int fam, int dt, int r, const void* input, void* output, uint64_t count) const {
    EarAllReduceParams p;
    std::memset(&p, 0, sizeof(p));
    for (int q = 0; q < n; ++q) p.peer_ws[q] = ws[q];
    p.state = state[r];
    p.input = input;
    p.output = output;
    p.count = count;
    p.ws_max_bytes = ws_max;
    p.rank = r;
    p.nranks = n;
    p.flags = plan(fam, dt, count, r, input == output).flags;
    bound_waits(p, r);
    return p;
  }

  // One all-reduce call on every rank. Stream mode, !per_rank: fork from / join to origin.
  // per_rank (graph capture of each rank's stream): launches on st[r] only.
  // One-launch mode: one launch on `one_stream` with params uploaded beforehand (upload()).
  struct Call {
    int fam, dt;
    uint64_t count;
    int grid;
    bool pdl;
    bool inplace;
    const EarAllReduceParams* dp;  // one-launch: device params (from upload)
  };
  const EarAllReduceParams* upload(const Call& c) {
    std::vector<EarAllReduceParams> ps(n);
    for (int r = 0; r < n; ++r) ps[r] = params(c.fam, c.dt, r, c.inplace ? out[r] : in[r], out[r], c.count);
    EarAllReduceParams* slot = dparams + static_cast<size_t>(pool_next) * EAR_MAX_RANKS;
    pool_next = (pool_next + 1) % pool_slots;
    CK(cudaMemcpy(slot, ps.data(), sizeof(EarAllReduceParams) * n, cudaMemcpyHostToDevice));
    return slot;
  }
  void launch_rank(const Call& c, int r, cudaStream_t s) {
    EarAllReduceParams p = params(c.fam, c.dt, r, c.inplace ? out[r] : in[r], out[r], c.count);
    launch_kernel(kKernels[c.fam][c.dt][n_index(n)], dim3(c.grid), dim3(block_rule(c.fam, c.dt, c.count)), s,
                  c.pdl, &p);
  }
  void launch_one(const Call& c, cudaStream_t s) {
    const EarAllReduceParams* dp = c.dp;
    launch_kernel(kSimKernels.k[c.fam][c.dt][n_index(n)], dim3(c.grid, n), dim3(block_rule(c.fam, c.dt, c.count)),
                  s, c.pdl, &dp);
  }
  void allreduce(Call c) {
    if (one_launch) {
      if (!c.dp) c.dp = upload(c);
      launch_one(c, origin);
      return;
    }
    fork_ranks();
    for (int r = 0; r < n; ++r) launch_rank(c, r, st[r]);
    join_ranks();
  }

  CheckResult check(int dt, uint64_t count, uint64_t seed) {
    CK(cudaMemsetAsync(dres, 0, sizeof(CheckResult), origin));
    OutPtrs o{};
    for (int r = 0; r < n; ++r) o.p[r] = out[r];
    const int blocks = static_cast<int>(std::min<uint64_t>(1024, (count + 255) / 256));
    check_kernel<<<std::max(blocks, 1), 256, 0, origin>>>(o, n, count, dt, seed, dres);
    CK(cudaGetLastError());
    CheckResult h{};
    CK(cudaMemcpyAsync(&h, dres, sizeof(h), cudaMemcpyDeviceToHost, origin));
    wait_stream(origin);
    return h;
  }
  // CPU fp64 spot check of rank 0's output at a few indices (validates the GPU reference).
  int cpu_spot_check(int dt, uint64_t count, uint64_t seed, uint64_t salt) {
    const int es = kElemSize[dt];
    int bad = 0;
    for (int k = 0; k < 48; ++k) {
      uint64_t i = k < 8 ? (k < 4 ? k : count - 1 - (k - 4)) : mix64(salt + k) % count;
      if (i >= count) continue;
      uint32_t bits = 0;
      CK(cudaMemcpy(&bits, static_cast<char*>(out[0]) + i * es, es, cudaMemcpyDeviceToHost));
      double ref = 0, mag = 0;
      for (int r = 0; r < n; ++r) {
        double x = decode(gen_bits(seed, r, i, dt), dt);
        ref += x;
        mag += std::fabs(x);
      }
      double got = decode(bits, dt);
      if (!(std::fabs(got - ref) <= kTol[dt] * std::max(mag, 1e-30))) ++bad;
    }
    return bad;
  }
};

// ---------------------------------------------------------------------------------------
// Tests

static bool evaluate(const CheckResult& h, int cpu_bad, int dt, float* err_out) {
  float err;
  std::memcpy(&err, &h.max_err, sizeof(err));
  *err_out = err;
  return h.mismatches == 0 && h.nonfinite == 0 && h.guard_bad == 0 && h.not_canon == 0 &&
         cpu_bad == 0 && err <= kTol[dt];
}

static void run_case(Sim& s, int fam, int dt, uint64_t count, bool inplace, int grid, bool pdl,
                     uint64_t seed) {
  // No pointer exchange, or one where peers read none, all, or a mix of the inputs in place
  // (seed bits).
  const uint32_t all = (1u << s.n) - 1u;
  const uint32_t pick = static_cast<uint32_t>(seed >> 40) % 4u;
  s.pointers = pick != 0;
  s.shared_inputs = pick <= 1 ? 0u : pick == 2 ? all : static_cast<uint32_t>(seed >> 20) & all;
  char name[256];
  std::snprintf(name, sizeof(name), "%s %s n%d count=%llu (%llu B) %s grid=%d%s %s shared=0x%x", kFamName[fam],
                kDtName[dt], s.n, (unsigned long long)count,
                (unsigned long long)(count * kElemSize[dt]), inplace ? "inplace" : "outofplace",
                grid, pdl ? " pdl" : "", s.pointers ? "pointers" : "copies", s.shared_inputs);
  g_case = name;
  const uint64_t bytes = count * kElemSize[dt];
  for (int r = 0; r < s.n; ++r) {
    // Poison the whole output (NaN in every dtype) and its guard, then write inputs.
    CK(cudaMemsetAsync(s.out[r], 0xFF, bytes + kGuard, s.origin));
    void* dst = inplace ? s.out[r] : s.in[r];
    const int blocks = static_cast<int>(std::min<uint64_t>(2048, (count + 255) / 256));
    gen_kernel<<<blocks, 256, 0, s.origin>>>(dst, count, dt, seed, r);
    CK(cudaGetLastError());
  }
  Sim::Call c{fam, dt, count, grid, pdl, inplace, nullptr};
  s.allreduce(c);
  wait_stream(s.origin);
  CK(cudaGetLastError());
  const CheckResult h = s.check(dt, count, seed);
  const int cpu_bad = s.cpu_spot_check(dt, count, seed, seed);
  float err;
  const bool ok = evaluate(h, cpu_bad, dt, &err);
  report(ok, "%s max_rel_err=%.3g mismatches=%u not_canonical=%u nonfinite=%u guard=%u cpu_bad=%d",
         name, err, h.mismatches, h.not_canon, h.nonfinite, h.guard_bad, cpu_bad);
}

// Per-rank CUDA graphs: refresh inputs from a device counter, then a mixed sequence of
// all-reduces (families, sizes, grids, PDL, in place) back to back, then bump the counter.
// Replayed `replays` times without host sync, checked every 100th replay and the last.
static void graph_test(Sim& s, int dt, int replays) {
  struct GCall {
    int fam;
    uint64_t count;
    int grid;  // 0: rule
    bool pdl, inplace;
  };
  const uint64_t big = std::min<uint64_t>((1u << 20) + 3, s.ws_max / kElemSize[dt]);
  const uint64_t mid = std::min<uint64_t>(65536 + 7, EAR_LAMPORT_MAX_MSG(s.ws_max) / kElemSize[dt]);
  const uint64_t half = std::min<uint64_t>((1u << 19) + 5, s.ws_max / kElemSize[dt]);
  const uint64_t push_max = EAR_PUSH_MAX_MSG(s.ws_max) / kElemSize[dt];
  std::vector<GCall> calls = {
      {LAMPORT, 4097, 0, false, false}, {TWOSHOT, big, 0, true, false},
      {ONESHOT, 1000, 1, true, true},   {PUSH, push_max, 0, true, false},
      {WIDE, half, 0, true, false},     {LAMPORT, mid, 0, true, false},
      {PUSH, 4097, 3, true, true},      {ONESHOT, big, 0, false, false},
      {WIDE, 1000, 3, false, true},     {TWOSHOT, 7, 1, true, true},
      {PUSH, 7, 1, false, false},       {WIDE, 7, 1, true, true},
      {LAMPORT, 1, 1, true, true},
  };
  // A slot no call above names gets one: a new family is in this test too.
  for (int fam = 0; fam < kFams; ++fam)
    if (std::none_of(calls.begin(), calls.end(), [&](const GCall& c) { return c.fam == fam; }))
      calls.push_back({fam, std::min<uint64_t>(4097, s.max_msg(fam) / kElemSize[dt]), 0, true, false});
  // Each call gets its own slice of the in/out buffers so all results survive the replay.
  std::vector<uint64_t> off(calls.size());
  uint64_t used = 0;
  for (size_t k = 0; k < calls.size(); ++k) {
    off[k] = used;
    used += EAR_ROUND_UP(calls[k].count * kElemSize[dt] + kGuard, 256);
  }
  if (used > s.buf_max) {
    std::printf("graph test buffers too small\n");
    std::_Exit(2);
  }
  char name[160];
  std::snprintf(name, sizeof(name), "graph %s n%d %zu calls x %d replays%s", kDtName[dt], s.n,
                calls.size(), replays, s.one_launch ? " one-launch" : "");
  g_case = name;

  uint64_t* ctr = nullptr;
  CK(cudaMalloc(&ctr, sizeof(uint64_t) * EAR_MAX_RANKS));
  CK(cudaMemset(ctr, 0, sizeof(uint64_t) * EAR_MAX_RANKS));
  // Poison the guards once; the graph never writes them.
  for (int r = 0; r < s.n; ++r)
    for (size_t k = 0; k < calls.size(); ++k)
      CK(cudaMemset(static_cast<char*>(s.out[r]) + off[k] + calls[k].count * kElemSize[dt],
                    0xFF, kGuard));

  auto call_for = [&](size_t k) {
    Sim::Call c{calls[k].fam, dt, calls[k].count,
                calls[k].grid ? calls[k].grid : s.grid_rule(calls[k].fam, dt, calls[k].count),
                calls[k].pdl, calls[k].inplace, nullptr};
    return c;
  };
  // Buffers of call k: offset views into in/out.
  auto with_slices = [&](size_t k, auto&& fn) {
    void* in0[EAR_MAX_RANKS];
    void* out0[EAR_MAX_RANKS];
    for (int r = 0; r < s.n; ++r) {
      in0[r] = s.in[r];
      out0[r] = s.out[r];
      s.in[r] = static_cast<char*>(s.in[r]) + off[k];
      s.out[r] = static_cast<char*>(s.out[r]) + off[k];
    }
    // By call: inputs read in place by all, none (copies exchanged), a mix, or no exchange.
    const uint32_t all = (1u << s.n) - 1u;
    s.pointers = k % 4 != 3;
    s.shared_inputs = k % 4 == 0 ? all : k % 4 == 2 ? 0x5u & all : 0u;
    fn();
    for (int r = 0; r < s.n; ++r) {
      s.in[r] = in0[r];
      s.out[r] = out0[r];
    }
  };
  auto refresh = [&](int r, cudaStream_t stream) {
    for (size_t k = 0; k < calls.size(); ++k) {
      void* dst = static_cast<char*>(calls[k].inplace ? s.out[r] : s.in[r]) + off[k];
      const int blocks = static_cast<int>(std::min<uint64_t>(1024, (calls[k].count + 255) / 256));
      gen_from_counter<<<blocks, 256, 0, stream>>>(dst, calls[k].count, dt, ctr + r, k, r);
      CK(cudaGetLastError());
    }
  };

  std::vector<cudaGraphExec_t> execs;
  if (s.one_launch) {
    std::vector<const EarAllReduceParams*> dps(calls.size());
    for (size_t k = 0; k < calls.size(); ++k) with_slices(k, [&] { dps[k] = s.upload(call_for(k)); });
    execs.push_back(capture_graph(s.origin, [&] {
      for (int r = 0; r < s.n; ++r) refresh(r, s.origin);
      for (size_t k = 0; k < calls.size(); ++k) {
        Sim::Call c = call_for(k);
        c.dp = dps[k];
        s.launch_one(c, s.origin);
      }
      for (int r = 0; r < s.n; ++r) bump_kernel<<<1, 1, 0, s.origin>>>(ctr + r);
    }));
  } else {
    for (int r = 0; r < s.n; ++r)
      execs.push_back(capture_graph(s.st[r], [&] {
        refresh(r, s.st[r]);
        for (size_t k = 0; k < calls.size(); ++k)
          with_slices(k, [&] { s.launch_rank(call_for(k), r, s.st[r]); });
        bump_kernel<<<1, 1, 0, s.st[r]>>>(ctr + r);
      }));
  }

  bool ok = true;
  float worst = 0.0f;
  unsigned mism = 0, nonf = 0, guard = 0;
  int checks = 0;
  CK(cudaDeviceSynchronize());
  for (int it = 0; it < replays && ok; ++it) {
    // No fork/join between replays: each rank's stream runs its replays back to back, so a
    // fast rank can run ahead of a slow one as far as the protocols allow.
    if (s.one_launch) {
      CK(cudaGraphLaunch(execs[0], s.origin));
    } else {
      for (int r = 0; r < s.n; ++r) CK(cudaGraphLaunch(execs[r], s.st[r]));
    }
    if (it % 100 == 99 || it == replays - 1) {
      if (!s.one_launch) s.join_ranks();
      wait_stream(s.origin);
      ++checks;
      for (size_t k = 0; k < calls.size(); ++k) {
        with_slices(k, [&] {
          const uint64_t seed = static_cast<uint64_t>(it) * 1000u + k;
          const CheckResult h = s.check(dt, calls[k].count, seed);
          const int cpu_bad = s.cpu_spot_check(dt, calls[k].count, seed, seed + 7);
          float err;
          if (!evaluate(h, cpu_bad, dt, &err)) {
            ok = false;
            std::printf("  replay %d call %zu (%s count=%llu) wrong: err=%.3g mism=%u not_canonical=%u nonfinite=%u guard=%u cpu_bad=%d\n",
                        it, k, kFamName[calls[k].fam], (unsigned long long)calls[k].count, err,
                        h.mismatches, h.not_canon, h.nonfinite, h.guard_bad, cpu_bad);
          }
          worst = std::max(worst, err);
          mism += h.mismatches + h.not_canon;
          nonf += h.nonfinite;
          guard += h.guard_bad;
        });
      }
    }
  }
  report(ok, "%s checks=%d max_rel_err=%.3g mismatches=%u nonfinite=%u guard=%u", name, checks,
         worst, mism, nonf, guard);
  for (auto e : execs) CK(cudaGraphExecDestroy(e));
  CK(cudaFree(ctr));
}

// Graph-replay timing (informational: N ranks share one GPU's HBM and SMs, no NVLink).
static void time_case(Sim& s, int fam, int dt, uint64_t bytes) {
  const uint64_t count = bytes / kElemSize[dt];
  if (bytes > s.max_msg(fam) || bytes > s.buf_max) return;
  char name[160];
  std::snprintf(name, sizeof(name), "time %s %s n%d %llu B", kFamName[fam], kDtName[dt], s.n,
                (unsigned long long)bytes);
  g_case = name;
  const int per_graph = bytes >= (16u << 20) ? 4 : 10;
  const int replays = bytes >= (16u << 20) ? 5 : 25;
  Sim::Call c{fam, dt, count, s.grid_rule(fam, dt, count), true, false, nullptr};
  std::vector<cudaGraphExec_t> execs;
  if (s.one_launch) {
    c.dp = s.upload(c);
    execs.push_back(capture_graph(s.origin, [&] {
      for (int k = 0; k < per_graph; ++k) s.launch_one(c, s.origin);
    }));
  } else {
    for (int r = 0; r < s.n; ++r)
      execs.push_back(capture_graph(s.st[r], [&] {
        for (int k = 0; k < per_graph; ++k) s.launch_rank(c, r, s.st[r]);
      }));
  }
  std::vector<float> us;
  for (int it = 0; it < replays + 2; ++it) {
    CK(cudaEventRecord(s.t0, s.origin));
    if (s.one_launch) {
      CK(cudaGraphLaunch(execs[0], s.origin));
    } else {
      s.fork_ranks();
      for (int r = 0; r < s.n; ++r) CK(cudaGraphLaunch(execs[r], s.st[r]));
      s.join_ranks();
    }
    CK(cudaEventRecord(s.t1, s.origin));
    wait_stream(s.origin);
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, s.t0, s.t1));
    if (it >= 2) us.push_back(ms * 1000.0f / per_graph);  // first two: warm-up
  }
  std::sort(us.begin(), us.end());
  std::printf("TIME %-8s %-4s n%-2d %9llu B  median %8.2f us per all-reduce (graph replay, %d ranks on one GPU)\n",
              kFamName[fam], kDtName[dt], s.n, (unsigned long long)bytes, us[us.size() / 2], s.n);
  std::fflush(stdout);
  for (auto e : execs) CK(cudaGraphExecDestroy(e));
}

int main(int argc, char** argv) {
  SimOptions opt;
  if (!sim_start(argc, argv, &opt)) return 2;
  const bool quick = opt.quick, one_launch = opt.one_launch, timing = opt.timing;

  const std::vector<int> ns = quick ? std::vector<int>{2, 4} : std::vector<int>{2, 4, 6, 8, 16};
  const std::vector<uint64_t> counts =
      quick ? std::vector<uint64_t>{1, 7, 4097, 65539}
            : std::vector<uint64_t>{1, 7, 8, 1000, 4097, 8192, 65539, 262144, (1u << 20) + 3,
                                    4u << 20, 16u << 20};
  const uint64_t ws_max = quick ? (16u << 20) : (64u << 20);  // quick: still a paced two-shot
  const int graph_replays = quick ? 200 : 1000;
  uint64_t rng = 12345;

  for (int n : ns) {
    Sim s;
    // Buffers also hold the graph test's slices (about 2 x 4 MiB + small ones).
    s.init(n, ws_max, std::max<uint64_t>(ws_max, 12u << 20), one_launch);
    if (s.grid_cap() * n > s.sms) {
      std::printf("GPU too small for n=%d\n", n);
      return 2;
    }
    int idx = 0;
    for (int dt = 0; dt < 3; ++dt)
      for (uint64_t count : counts)
        for (int inplace = 0; inplace < 2; ++inplace)
          for (int fam = 0; fam < kFams; ++fam) {  // families interleaved: mixed call sequence
            if (count * kElemSize[dt] > s.max_msg(fam)) continue;
            rng = mix64(rng);
            int grid = s.grid_rule(fam, dt, count);
            if (rng % 3 == 0) grid = 1 + static_cast<int>((rng >> 8) % s.grid_cap());
            run_case(s, fam, dt, count, inplace != 0, grid, (idx++ & 1) != 0, rng);
          }
    // Paced two-shot (above 8 MiB) on grids small enough that a CTA has more than 64 batches
    // (several per chunk, a short last chunk), and at the workspace limit; the same for the
    // 4+ rank two-shot (many batches per thread).
    for (int fam : {TWOSHOT, WIDE})
      for (int grid : {1, 3})
        for (uint64_t bytes : {uint64_t(8u << 20) + 48, ws_max}) {
          rng = mix64(rng);
          run_case(s, fam, BF16, bytes / kElemSize[BF16], grid == 3, grid, true, rng);
        }
    for (int dt = 0; dt < 3; ++dt) {
      if (quick && dt != BF16) continue;
      graph_test(s, dt, graph_replays);
    }
    s.check_twoshot_areas();
    if (timing && !quick && (n == 2 || n == 4 || n == 8)) {
      for (int fam = 0; fam < kFams; ++fam)
        for (int dt = 0; dt < 3; ++dt)
          for (uint64_t b : {uint64_t(8u << 10), uint64_t(1u << 20), uint64_t(64u << 20)})
            time_case(s, fam, dt, b);
    }
    s.destroy();
  }
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
