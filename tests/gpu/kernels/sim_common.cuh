// sim_common.cuh: harness plumbing shared by sim_ranks.cu (plain all-reduce), sim_fused.cu
// (fused all-reduce + residual + RMSNorm) and sim_faults.cu (bounded waits): CUDA error/hang
// handling, the dtype tables, the family and kernel tables (sim_families.cuh), the input
// generator, PASS/FAIL reporting, and the simulated communicator's ranks (SimRanks).
// Included once per harness translation unit (everything here is static or inline).
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <chrono>
#include <vector>

#include <cuda_runtime.h>

// ---------------------------------------------------------------------------------------
// Plumbing

static double g_timeout_s = 10.0;
static std::string g_case = "setup";

static void check_cuda(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::printf("CUDA error %s (%s) at line %d in case [%s]\n", cudaGetErrorString(e), what,
                line, g_case.c_str());
    std::fflush(stdout);
    std::_Exit(2);
  }
}
#define CK(x) check_cuda((x), #x, __LINE__)

// Watchdog: a deadlock (or a kernel far too slow) prints the case and exits non-zero.
static void wait_stream(cudaStream_t s) {
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) CK(e);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > g_timeout_s) {
      std::printf("HANG: no completion after %.0f s in case [%s]\n", g_timeout_s,
                  g_case.c_str());
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// ---------------------------------------------------------------------------------------
// Types, families, kernels

enum Dt { F32 = 0, F16 = 1, BF16 = 2 };
static const char* kDtName[] = {"f32", "f16", "bf16"};
static const int kElemSize[] = {4, 2, 2};

#include "sim_families.cuh"

// ---------------------------------------------------------------------------------------
// Inputs: bit patterns from a hash of (seed, rank, index). Values are +-[2^-4, 2^4) with
// random mantissas, plus 1/32 signed zeros (exercises the Lamport sentinel rewrite).

__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__host__ __device__ inline uint32_t gen_bits(uint64_t seed, int rank, uint64_t idx, int dt) {
  const uint64_t h = mix64(mix64(seed * 131u + static_cast<uint64_t>(rank)) ^ idx);
  const bool zero = (h >> 59) == 0;
  const uint32_t sign = static_cast<uint32_t>(h >> 58) & 1u;
  const uint32_t e = static_cast<uint32_t>(h >> 52) & 7u;
  if (dt == F32)
    return (sign << 31) | (zero ? 0u : (((123u + e) << 23) | static_cast<uint32_t>(h & 0x7FFFFFu)));
  if (dt == F16)
    return (sign << 15) | (zero ? 0u : (((11u + e) << 10) | static_cast<uint32_t>(h & 0x3FFu)));
  return (sign << 15) | (zero ? 0u : (((123u + e) << 7) | static_cast<uint32_t>(h & 0x7Fu)));
}
__host__ __device__ inline double decode(uint32_t bits, int dt) {
  if (dt == F16) {
    const int s = (bits >> 15) & 1, ex = (bits >> 10) & 31, man = bits & 1023;
    double v;
    if (ex == 31) v = man ? NAN : INFINITY;
    else if (ex == 0) v = ldexp(static_cast<double>(man), -24);
    else v = ldexp(1.0 + man / 1024.0, ex - 15);
    return s ? -v : v;
  }
  union {
    uint32_t u;
    float f;
  } c;
  c.u = dt == F32 ? bits : (bits << 16);
  return static_cast<double>(c.f);
}
__device__ inline uint32_t load_bits(const void* p, uint64_t i, int dt) {
  return dt == F32 ? static_cast<const uint32_t*>(p)[i] : static_cast<const uint16_t*>(p)[i];
}

__global__ void gen_kernel(void* buf, uint64_t count, int dt, uint64_t seed, int rank) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t b = gen_bits(seed, rank, i, dt);
    if (dt == F32) static_cast<uint32_t*>(buf)[i] = b;
    else static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(b);
  }
}
// Graph refresh: seed = *ctr * 1000 + salt, ctr advanced by bump_kernel at the graph's end.
__global__ void gen_from_counter(void* buf, uint64_t count, int dt, const uint64_t* ctr,
                                 uint64_t salt, int rank) {
  const uint64_t seed = *ctr * 1000u + salt;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const uint32_t b = gen_bits(seed, rank, i, dt);
    if (dt == F32) static_cast<uint32_t*>(buf)[i] = b;
    else static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(b);
  }
}
__global__ void bump_kernel(uint64_t* ctr) { *ctr += 1; }
// Adds to *dirty the number of CTAs that saw a vector (of n) that is not all zero.
__global__ void count_nonzero(const uint4* v, uint64_t n, unsigned* dirty) {
  bool any = false;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x)
    any |= (v[i].x | v[i].y | v[i].z | v[i].w) != 0u;
  if (__syncthreads_or(any) && threadIdx.x == 0) atomicAdd(dirty, 1u);
}

// Launches kernel k (one argument, by pointer in args) on stream s, with programmatic
// dependent launch when pdl is set (as the library launches).
static void launch_kernel(const void* k, dim3 grid, dim3 block, cudaStream_t s, bool pdl, void* arg) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  void* args[] = {arg};
  CK(cudaLaunchKernelExC(&cfg, k, args));
}

// What record() enqueues on stream s, captured into an executable graph.
template <typename F>
static cudaGraphExec_t capture_graph(cudaStream_t s, F&& record) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  record();
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  return e;
}

// ---------------------------------------------------------------------------------------
// Reporting

static int g_pass = 0, g_fail = 0;

static void report(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(bool ok, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::printf("%s ", ok ? "PASS" : "FAIL");
  std::vprintf(fmt, ap);
  std::printf("\n");
  va_end(ap);
  std::fflush(stdout);
  (ok ? g_pass : g_fail)++;
}

// Command line and device setup shared by the simulations: --quick, --one-launch, --no-timing,
// --timeout SECONDS. Returns false (after printing the usage) on anything else.
struct SimOptions {
  bool quick = false, one_launch = false, timing = true;
};
inline bool sim_start(int argc, char** argv, SimOptions* o) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) o->quick = true;
    else if (!std::strcmp(argv[i], "--one-launch")) o->one_launch = true;
    else if (!std::strcmp(argv[i], "--no-timing")) o->timing = false;
    else if (!std::strcmp(argv[i], "--timeout") && i + 1 < argc) g_timeout_s = std::atof(argv[++i]);
    else {
      std::printf("usage: %s [--quick] [--one-launch] [--timeout SECONDS] [--no-timing]\n", argv[0]);
      return false;
    }
  }
  // Up to 16 rank streams must run concurrently: the default of 8 hardware queues would
  // make two ranks share one queue, serialize their kernels and deadlock the spin-waits.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, mode %s%s\n", prop.name, prop.multiProcessorCount,
              o->quick ? "quick" : "full", o->one_launch ? ", one launch for all ranks" : ", one stream per rank");
  return true;
}

// ---------------------------------------------------------------------------------------
// Simulated communicator: N workspaces and state blocks on one device, one non-blocking
// stream per rank forked from / joined to an origin stream, timing events. Each harness
// derives its Sim from it and adds its buffers.

constexpr uint64_t kGuard = 256;  // bytes after every buffer that no kernel may write

struct SimRanks {
  int n = 0;
  int sms = 0;
  bool one_launch = false;
  uint64_t ws_max = 0;   // max message bytes the workspaces serve
  uint64_t buf_max = 0;  // bytes of each data buffer (without guard)
  cudaStream_t origin{};
  cudaStream_t st[EAR_MAX_RANKS]{};
  cudaEvent_t fork{}, join[EAR_MAX_RANKS]{}, t0{}, t1{};
  void* ws[EAR_MAX_RANKS]{};
  void* state[EAR_MAX_RANKS]{};
  uint64_t* faults = nullptr;  // each rank's fault word (mapped host memory), written by kernels that give up
  bool check_faults = true;    // destroy_ranks reports whether a fault word was written
  int pool_slots = 4096, pool_next = 0;  // one-launch mode: device param sets in a ring

  void init_ranks(int nranks, uint64_t ws_max_bytes, uint64_t buf_bytes, bool one) {
    n = nranks;
    one_launch = one;
    ws_max = ws_max_bytes;
    buf_max = buf_bytes;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaStreamCreateWithFlags(&origin, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaHostAlloc(reinterpret_cast<void**>(&faults), EAR_MAX_RANKS * sizeof(uint64_t), cudaHostAllocMapped));
    std::memset(faults, 0, EAR_MAX_RANKS * sizeof(uint64_t));
    const uint64_t wsb = EAR_WORKSPACE_BYTES(ws_max, n);
    for (int r = 0; r < n; ++r) {
      CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming));
      CK(cudaMalloc(&ws[r], wsb));
      CK(cudaMemset(ws[r], 0, wsb));
      CK(cudaMalloc(&state[r], EAR_STATE_BYTES));
      CK(cudaMemset(state[r], 0, EAR_STATE_BYTES));
    }
  }
  // The bounded waits' part of rank r's params (kernels/wait.cuh): its fault word, a bound below
  // the watchdog's, so that a hang shows as a fault.
  void bound_waits(EarAllReduceParams& p, int r) const {
    p.fault = faults + r;
    p.timeout_ns = static_cast<uint64_t>(g_timeout_s * 0.8e9);
    p.generation = 1;
  }
  void destroy_ranks() {
    CK(cudaDeviceSynchronize());
    unsigned gave_up = 0;
    for (int r = 0; r < n; ++r) gave_up += faults[r] != 0;
    if (check_faults) report(gave_up == 0, "n%d no kernel gave up waiting (fault words all zero; %u set)", n, gave_up);
    CK(cudaFreeHost(faults));
    for (int r = 0; r < n; ++r) {
      CK(cudaFree(ws[r]));
      CK(cudaFree(state[r]));
      CK(cudaStreamDestroy(st[r]));
      CK(cudaEventDestroy(join[r]));
    }
    CK(cudaStreamDestroy(origin));
    CK(cudaEventDestroy(fork));
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
  }
  // The two-shot protocol's invariant (twoshot.cu): between calls, every rank's gather and
  // the polled prefix of each of its stage rows are all zero. Reported as one case.
  void check_twoshot_areas() {
    g_case = "two-shot areas";
    CK(cudaDeviceSynchronize());
    unsigned* dirty = nullptr;
    CK(cudaMallocManaged(&dirty, sizeof(unsigned)));
    *dirty = 0;
    const uint64_t seg_bytes = EAR_TWOSHOT_SEG_BYTES(ws_max, n);
    const uint64_t prefix = std::min<uint64_t>(ear::twoshot_polled_seg(n), seg_bytes / 16);
    for (int r = 0; r < n; ++r) {
      const char* data = static_cast<const char*>(ws[r]) + EAR_SIGNAL_BYTES;
      for (int row = 0; row < 2 * (n - 1); ++row)
        count_nonzero<<<64, 256>>>(reinterpret_cast<const uint4*>(data + EAR_OFF_TWOSHOT_STAGE(ws_max, n) + row * seg_bytes),
                                   prefix, dirty);
      count_nonzero<<<256, 256>>>(reinterpret_cast<const uint4*>(data + EAR_OFF_TWOSHOT_GATHER(ws_max, n)),
                                  EAR_TWOSHOT_AREA_BYTES(ws_max, n) / 16, dirty);
    }
    CK(cudaDeviceSynchronize());
    report(*dirty == 0, "n%d two-shot gather and stage prefixes all zero after the calls (dirty CTAs: %u)", n, *dirty);
    CK(cudaFree(dirty));
  }
  // Largest grid that keeps all N grids co-resident (one CTA per SM assumed).
  int grid_cap() const { return std::max(1, std::min(EAR_MAX_BLOCKS, sms / n)); }
  void fork_ranks() {
    CK(cudaEventRecord(fork, origin));
    for (int r = 0; r < n; ++r) CK(cudaStreamWaitEvent(st[r], fork, 0));
  }
  void join_ranks() {
    for (int r = 0; r < n; ++r) {
      CK(cudaEventRecord(join[r], st[r]));
      CK(cudaStreamWaitEvent(origin, join[r], 0));
    }
  }
};
