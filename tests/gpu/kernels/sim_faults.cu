// sim_faults.cu: the bounded waits of every kernel family (kernels/wait.cuh) on N simulated
// ranks on ONE GPU (sim_common.cuh: N zero-filled workspaces and state blocks, a stream per
// rank, grids capped so all ranks are co-resident), each rank with its own fault word in mapped
// host memory. For each family of kernels/ear_families.h (plain, fused; the two-shot also paced
// and its 4+ rank kernel; those that exchange pointers also with inputs read in place: kinds())
// and N in {2, 4}, each case on a fresh group:
//   skip      every rank but the last launches, with a 50 ms bound: each one ends (no hang)
//             with a fault recorded (TIMEOUT, or ABORTED where a peer's abort came first; at
//             least one TIMEOUT) and its outputs all NaN (wait.cuh: a failed call poisons
//             them), and every workspace's abort word is set, the skipped rank's too;
//   late      then the skipped rank launches: it does nothing but poison its outputs, and
//             records ABORTED;
//   released  abort words set to EAR_FAULT_RELEASED (what the host writes when it releases a
//             group): every rank's launch only poisons its outputs and records RELEASED;
//   no bound  timeout 0 and an aborted group: every rank's launch still only poisons (ABORTED);
//   control   every rank launches with the bound set: correct sums, no fault.
// The watchdog (--timeout, default 10 s) turns a hang into a failure naming the case.
// --one-launch (for tools that serialize kernels, e.g. compute-sanitizer) skips the controls:
// serialized, a rank's kernel would wait for peers that cannot start, and give up; sim_ranks
// and sim_fused --one-launch run the bounded waits without a fault under the tools instead.
// Every other case needs no two kernels at once.
//
// Usage: sim_faults [--timeout SECONDS] [--one-launch]
// Prints one line per case and "N passed, M failed"; exit code 0 only if all passed.
#include "sim_common.cuh"


#include <tuple>

namespace {

// A case's kernel: a plain one (fam: its sim_common.cuh slot) or a fused one (fam: its family's
// id), for every family of kernels/ear_families.h; the two-shot also paced (above 8 MiB); the
// families whose flags rule exchanges pointers also with the ranks reading each other's inputs
// in place (EAR_CALL_POINTERS | EAR_CALL_INPUT_SHARED: the one-shot's end barrier, the
// 4+ rank two-shot's reads of peers' inputs; the 2-rank two-shot ignores the flags); and the
// 4+ rank two-shot (the WIDE slot), plain and in place.
struct Kind {
  const char* name;
  int fam;
  bool fused, paced, in_place;
};
std::vector<Kind> kinds() {
  std::vector<Kind> ks;
#define EAR_SIM_PLAIN_(name, id, ...)             \
  ks.push_back({#name, id, false, false, false}); \
  if (id == TWOSHOT) ks.push_back({#name " paced", id, false, true, false});
  EAR_FOR_EACH_FAMILY(EAR_SIM_PLAIN_)
#undef EAR_SIM_PLAIN_
#define EAR_SIM_FUSED_(name, id, ...) ks.push_back({#name "_norm", id, true, false, false});
  EAR_FOR_EACH_FAMILY(EAR_SIM_FUSED_)
#undef EAR_SIM_FUSED_
#define EAR_SIM_IN_PLACE_(name, id, plain2, plainwide, fused, grid, fgrid, cap, fit, flags, ...) \
  if (flags != EAR_FLAGS_RULE_NONE) ks.push_back({#name " in place", id, false, false, true});
  EAR_FOR_EACH_FAMILY(EAR_SIM_IN_PLACE_)
#undef EAR_SIM_IN_PLACE_
  // The two-shot's own kernel for 4 and more ranks (twoshot_wide.cu, the WIDE slot): the
  // "twoshot" kinds above run the 2-rank kernel at every N, as the family's slot does.
  ks.push_back({"twoshot_wide", WIDE, false, false, false});
  ks.push_back({"twoshot_wide in place", WIDE, false, false, true});
  return ks;
}

constexpr uint64_t kTokens = 4;
constexpr uint32_t kHidden = 4096;
constexpr uint64_t kWsMax = 16u << 20;

// Elements of one call (bf16); a plain kind's by its family's capacity rule (a new kind of rule
// fails this switch's build).
uint64_t count_of(const Kind& k) {
  if (k.paced) return (9u << 20) / 2;  // 9 MiB: paced by per-chunk flags
  if (k.fused) return kTokens * kHidden;
  switch (sim_rule(plan_family(k.fam)).capacity) {
    case EAR_CAPACITY_RULE_WORKSPACE: return 16384;
    case EAR_CAPACITY_RULE_LAMPORT: return 512;  // a small message, what Lamport serves
    case EAR_CAPACITY_RULE_PUSH: return sim_max_msg(k.fam, kWsMax) / 2;  // its largest: several vectors per thread
  }
  return 0;
}

struct FaultSim : SimRanks {
  void* in[EAR_MAX_RANKS]{};
  void* out[EAR_MAX_RANKS]{};
  void* residual = nullptr;  // fused: zeros
  void* gamma = nullptr;     // fused: ones
  void* normed[EAR_MAX_RANKS]{};

  void init(int nranks) {
    const uint64_t bytes = 10u << 20;
    init_ranks(nranks, kWsMax, bytes, false);
    for (int r = 0; r < n; ++r) {
      CK(cudaMalloc(&in[r], bytes));
      CK(cudaMalloc(&out[r], bytes));
      CK(cudaMalloc(&normed[r], bytes));
    }
    CK(cudaMalloc(&residual, bytes));
    CK(cudaMemset(residual, 0, bytes));
    CK(cudaMalloc(&gamma, kHidden * 2));
    std::vector<uint16_t> ones(kHidden, 0x3f80);  // bf16 1.0
    CK(cudaMemcpy(gamma, ones.data(), kHidden * 2, cudaMemcpyHostToDevice));
  }
  void destroy() {
    CK(cudaDeviceSynchronize());
    for (int r = 0; r < n; ++r) {
      CK(cudaFree(in[r]));
      CK(cudaFree(out[r]));
      CK(cudaFree(normed[r]));
    }
    CK(cudaFree(residual));
    CK(cudaFree(gamma));
    destroy_ranks();
  }
  // Rank r's inputs: every element 1.0 * (r + 1); outputs hold a marker (0x1111: a bf16 number,
  // neither the sum nor NaN).
  void fill(const Kind& k) {
    const uint64_t c = count_of(k);
    for (int r = 0; r < n; ++r) {
      const float value = static_cast<float>(r + 1);
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      const std::vector<uint16_t> v(c, static_cast<uint16_t>(bits >> 16));  // bf16: exact
      CK(cudaMemcpy(in[r], v.data(), c * 2, cudaMemcpyHostToDevice));
      CK(cudaMemset(out[r], 0x11, c * 2));
      CK(cudaMemset(normed[r], 0x11, c * 2));
    }
  }
  // Every rank's abort word set to `why` (0: live), as the host writes it.
  void set_abort(uint32_t why) {
    for (int r = 0; r < n; ++r)
      CK(cudaMemset(static_cast<char*>(ws[r]) + EAR_ABORT_OFFSET, 0, 8));
    if (why != 0)
      for (int r = 0; r < n; ++r) CK(cudaMemcpy(static_cast<char*>(ws[r]) + EAR_ABORT_OFFSET, &why, 4, cudaMemcpyHostToDevice));
  }
  uint64_t abort_word(int r) {
    uint64_t v = 0;
    CK(cudaMemcpy(&v, static_cast<char*>(ws[r]) + EAR_ABORT_OFFSET, 8, cudaMemcpyDeviceToHost));
    return v;
  }
  // Launches rank r's call of kind k on its stream, bound `timeout_ns`.
  void launch(const Kind& k, int r, uint64_t timeout_ns) {
    const uint64_t c = count_of(k);
    const int ni = n_index(n);
    EarFusedParams f;
    std::memset(&f, 0, sizeof(f));
    EarAllReduceParams& p = f.ar;
    for (int q = 0; q < n; ++q) p.peer_ws[q] = ws[q];
    p.state = state[r];
    p.input = in[r];
    p.output = k.fused ? nullptr : out[r];
    p.count = c;
    p.ws_max_bytes = ws_max;
    p.rank = r;
    p.nranks = n;
    bound_waits(p, r);
    p.timeout_ns = timeout_ns;
    if (!k.fused) {
      // The inputs read in place: the pointer exchange, every input reachable (one device).
      const bool shares = k.in_place;
      const EarPlan plan = sim_plan(plan_family(k.fam), EAR_OP_ALLREDUCE, c, 0, 0, 2, n, grid_cap(),
                                    sim_facts(shares, p.input == p.output, shares));
      p.flags = plan.flags;
      launch_kernel(kKernels[k.fam][BF16][ni], dim3(plan.grid), dim3(plan.block), st[r], false, &p);
      return;
    }
    f.residual = residual;
    f.gamma = gamma;
    f.residual_out = out[r];
    f.normed = normed[r];
    f.tokens = kTokens;
    f.hidden = kHidden;
    f.eps = 1e-6f;
    const EarPlan plan =
        sim_plan(k.fam, EAR_OP_RESIDUAL_RMSNORM, kTokens * kHidden, kTokens, kHidden, 2, n, grid_cap());
    launch_kernel(kFusedKernels[k.fam][BF16][ni], dim3(plan.grid), dim3(plan.block), st[r], false, &f);
  }
  // Whether every byte of rank r's outputs (residual_out and normed for the fused kinds) is
  // 0xFF: NaN everywhere, what a call that failed leaves.
  bool poisoned(const Kind& k, int r) {
    std::vector<uint8_t> h(count_of(k) * 2);
    bool all = true;
    for (void* o : {out[r], k.fused ? normed[r] : out[r]}) {
      CK(cudaMemcpy(h.data(), o, h.size(), cudaMemcpyDeviceToHost));
      all &= std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0xff; });
    }
    return all;
  }
  // Whether rank r's output (residual_out: the residual is zero) is 1 + 2 + ... + n everywhere.
  bool summed(const Kind& k, int r) {
    std::vector<uint16_t> h(count_of(k));
    CK(cudaMemcpy(h.data(), out[r], h.size() * 2, cudaMemcpyDeviceToHost));
    const float want = n * (n + 1) / 2.0f;
    return std::all_of(h.begin(), h.end(), [&](uint16_t b) {
      const uint32_t bits = static_cast<uint32_t>(b) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      return v == want;
    });
  }
  unsigned code(int r) const { return static_cast<unsigned>(faults[r] & 0xff); }
};

void sync_all(FaultSim& s) {
  for (int r = 0; r < s.n; ++r) wait_stream(s.st[r]);
}

void run(const Kind& k, int n, bool serialized) {
  const uint64_t bound = 50'000'000;  // 50 ms
  char name[96];
  std::snprintf(name, sizeof name, "%s n%d", k.name, n);
  {
    g_case = std::string(name) + " skip";
    FaultSim s;
    s.check_faults = false;
    s.init(n);
    s.fill(k);
    const int skipped = n - 1;
    for (int r = 0; r < n; ++r)
      if (r != skipped) s.launch(k, r, bound);
    sync_all(s);
    bool all_faulted = true, one_timeout = false, aborted_everywhere = true, all_nan = true;
    for (int r = 0; r < n; ++r) {
      if (r != skipped) {
        all_faulted &= s.code(r) == EAR_FAULT_TIMEOUT || s.code(r) == EAR_FAULT_ABORTED;
        all_faulted &= (s.faults[r] >> 8) == 1;  // the generation
        one_timeout |= s.code(r) == EAR_FAULT_TIMEOUT;
        all_nan &= s.poisoned(k, r);
      }
      aborted_everywhere &= s.abort_word(r) == EAR_FAULT_ABORTED;
    }
    report(all_faulted && one_timeout && s.faults[skipped] == 0,
           "%s skip: the %d launched ranks ended with a fault (codes %u %u %u %u), one a timeout", name, n - 1,
           s.code(0), s.code(1), n > 2 ? s.code(2) : 0, n > 3 ? s.code(3) : 0);
    report(aborted_everywhere, "%s skip: every workspace's abort word is set, the skipped rank's too", name);
    report(all_nan, "%s skip: every launched rank's outputs are NaN, none looks like a result", name);
    g_case = std::string(name) + " late";
    s.launch(k, skipped, bound);
    wait_stream(s.st[skipped]);
    report(s.code(skipped) == EAR_FAULT_ABORTED && s.poisoned(k, skipped),
           "%s late: the skipped rank's call only poisoned its outputs and recorded ABORTED (code %u)", name,
           s.code(skipped));
    s.destroy();
  }
  const std::tuple<uint32_t, uint64_t, const char*> dead[] = {{EAR_FAULT_RELEASED, bound, "released"},
                                                             {EAR_FAULT_ABORTED, 0, "no bound, aborted"}};
  for (const auto& [why, timeout, label] : dead) {
    g_case = std::string(name) + " " + label;
    FaultSim s;
    s.check_faults = false;
    s.init(n);
    s.fill(k);
    s.set_abort(why);
    for (int r = 0; r < n; ++r) s.launch(k, r, timeout);
    sync_all(s);
    bool nothing = true;
    for (int r = 0; r < n; ++r) nothing &= s.code(r) == why && s.poisoned(k, r);
    report(nothing, "%s %s: every rank's call only poisoned its outputs and recorded code %u", name, label, why);
    s.destroy();
  }
  if (!serialized) {
    g_case = std::string(name) + " control";
    FaultSim s;
    s.init(n);
    s.fill(k);
    for (int r = 0; r < n; ++r) s.launch(k, r, bound);
    sync_all(s);
    bool ok = true;
    for (int r = 0; r < n; ++r) ok &= s.faults[r] == 0 && s.summed(k, r);
    report(ok, "%s control: every rank launched with the bound set: correct sums, no fault", name);
    s.destroy();  // reports the fault words too
  }
}

}  // namespace

int main(int argc, char** argv) {
  SimOptions opt;
  if (!sim_start(argc, argv, &opt)) return 2;
  for (int n : {2, 4})
    for (const Kind& k : kinds()) run(k, n, opt.one_launch);
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}
