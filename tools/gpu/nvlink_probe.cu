// nvlink_probe.cu: the ceiling of GPU 0 <-> GPU 1 transfers, one way and both ways at once,
// for the ways a kernel can move data over NVLink: SM stores into the peer (push), SM loads
// from the peer (pull), the copy engine (cudaMemcpyAsync between peers), TMA bulk copies
// through shared memory (push and pull), and the copy engine and SM pushes sharing a
// transfer. Prints GB/s per direction (the slower GPU when both send). These are the
// ceilings docs/PERFORMANCE.md compares the two-shot kernel against.
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/gpu/nvlink_probe.cu -o nvlink_probe
//   ./nvlink_probe [MiB per direction, default 32] [launches per timing, default 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CHECK(x)                                                                        \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

// SM copy, U 16-byte vectors per thread in flight: loads of the batch first, then stores.
template <int U>
__global__ void __launch_bounds__(1024) sm_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, uint64_t n) {
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i0 = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < n; i0 += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < n) v[u] = __ldcg(src + i0 + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < n) dst[i0 + u * stride] = v[u];
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// TMA bulk copy global -> shared -> global by one thread per CTA, two stages of `chunk`
// bytes: the load of chunk k+1 overlaps the store of chunk k.
__global__ void tma_copy(const char* __restrict__ src, char* __restrict__ dst, uint64_t bytes,
                         uint32_t chunk) {
  extern __shared__ __align__(128) char stage[];
  __shared__ __align__(8) uint64_t bar[2];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < 2; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  uint32_t phase[2] = {0, 0};
  int it = 0;
  for (uint64_t off = (uint64_t)blockIdx.x * chunk; off < bytes; off += (uint64_t)gridDim.x * chunk, ++it) {
    const int s = it & 1;
    const uint32_t len = (uint32_t)(bytes - off < chunk ? bytes - off : chunk);
    const uint32_t buf = smem_addr(stage + s * chunk);
    const uint32_t b = smem_addr(&bar[s]);
    // The store that last read this stage (two iterations ago) must be done reading it.
    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(len) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(buf),
        "l"(src + off), "r"(len), "r"(b)
        : "memory");
    asm volatile(
        "{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" ::"r"(b),
        "r"(phase[s])
        : "memory");
    phase[s] ^= 1u;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + off), "r"(buf), "r"(len)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct Gpu {
  int dev;
  cudaStream_t s, s2;
  cudaEvent_t a, b, fork, join;
  char* local;   // source of pushes, destination of pulls
  char* inbox;   // what the peer pushes into / pulls from
};

static uint64_t g_bytes;
static int g_iters;

// Runs op(g, peer) g_iters times on each active GPU (launches interleaved so both run at once)
// and returns the slower GPU's GB/s.
static double measure(Gpu* g, bool both, const std::function<void(Gpu&, Gpu&)>& op) {
  const int n = both ? 2 : 1;
  for (int w = 0; w < 2; ++w)
    for (int d = 0; d < n; ++d) {
      CHECK(cudaSetDevice(g[d].dev));
      op(g[d], g[1 - d]);
    }
  for (int d = 0; d < n; ++d) {
    CHECK(cudaSetDevice(g[d].dev));
    CHECK(cudaStreamSynchronize(g[d].s));
    CHECK(cudaEventRecord(g[d].a, g[d].s));
  }
  for (int it = 0; it < g_iters; ++it)
    for (int d = 0; d < n; ++d) {
      CHECK(cudaSetDevice(g[d].dev));
      op(g[d], g[1 - d]);
    }
  double worst = 1e30;
  for (int d = 0; d < n; ++d) {
    CHECK(cudaSetDevice(g[d].dev));
    CHECK(cudaEventRecord(g[d].b, g[d].s));
    CHECK(cudaEventSynchronize(g[d].b));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, g[d].a, g[d].b));
    worst = std::min(worst, (double)g_bytes * g_iters / (ms * 1e-3) / 1e9);
  }
  return worst;
}

template <int U>
static void sm(Gpu& me, Gpu& peer, bool push, int grid, int threads, uint64_t bytes, cudaStream_t s) {
  const uint4* src = reinterpret_cast<const uint4*>(push ? me.local : peer.inbox);
  uint4* dst = reinterpret_cast<uint4*>(push ? peer.inbox : me.local);
  sm_copy<U><<<grid, threads, 0, s>>>(src, dst, bytes / 16);
}

static void sm_any(int u, Gpu& me, Gpu& peer, bool push, int grid, int threads, uint64_t bytes, cudaStream_t s) {
  if (u == 1) sm<1>(me, peer, push, grid, threads, bytes, s);
  else if (u == 4) sm<4>(me, peer, push, grid, threads, bytes, s);
  else sm<8>(me, peer, push, grid, threads, bytes, s);
}

int main(int argc, char** argv) {
  g_bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 32) << 20;
  g_iters = argc > 2 ? std::atoi(argv[2]) : 20;
  int ndev = 0;
  CHECK(cudaGetDeviceCount(&ndev));
  if (ndev < 2) {
    std::printf("nvlink_probe needs 2 GPUs (found %d)\n", ndev);
    return 2;
  }
  Gpu g[2];
  int sms = 0;
  for (int d = 0; d < 2; ++d) {
    g[d].dev = d;
    CHECK(cudaSetDevice(d));
    CHECK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CHECK(cudaStreamCreateWithFlags(&g[d].s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&g[d].s2, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&g[d].a));
    CHECK(cudaEventCreate(&g[d].b));
    CHECK(cudaEventCreateWithFlags(&g[d].fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&g[d].join, cudaEventDisableTiming));
    CHECK(cudaMalloc(&g[d].local, g_bytes));
    CHECK(cudaMalloc(&g[d].inbox, g_bytes));
    CHECK(cudaMemset(g[d].local, 1, g_bytes));
    CHECK(cudaMemset(g[d].inbox, 2, g_bytes));
    CHECK(cudaFuncSetAttribute(tma_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * 64 * 1024));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
  }
  std::printf("nvlink_probe: %llu MiB per direction, %d launches per timing, %d SMs; GB/s per direction\n",
              (unsigned long long)(g_bytes >> 20), g_iters, sms);
  std::printf("%-34s %10s %10s\n", "way", "one way", "both ways");
  const auto row = [&](const char* name, const std::function<void(Gpu&, Gpu&)>& op) {
    const double one = measure(g, false, op);
    const double two = measure(g, true, op);
    std::printf("%-34s %10.1f %10.1f\n", name, one, two);
    std::fflush(stdout);
  };
  char name[96];
  for (int push = 1; push >= 0; --push)
    for (int grid : {sms / 2, 128, sms, 2 * sms, 4 * sms})
      for (int threads : {256, 512, 1024})
        for (int u : {1, 4, 8}) {
          if (grid * threads > sms * 2048) continue;  // more threads than fit resident
          std::snprintf(name, sizeof name, "sm %s grid %d x %d, %d in flight", push ? "push" : "pull", grid, threads, u);
          row(name, [=](Gpu& me, Gpu& peer) { sm_any(u, me, peer, push, grid, threads, g_bytes, me.s); });
        }
  row("copy engine (cudaMemcpyAsync)",
      [](Gpu& me, Gpu& peer) { CHECK(cudaMemcpyAsync(peer.inbox, me.local, g_bytes, cudaMemcpyDefault, me.s)); });
  for (int push = 1; push >= 0; --push)
    for (uint32_t chunk : {16u << 10, 32u << 10, 64u << 10})
      for (int per_sm : {1, 2, 3}) {
        if (2ull * chunk * per_sm > 200u << 10) continue;
        const int grid = sms * per_sm;
        std::snprintf(name, sizeof name, "tma %s %u KiB x 2, %d CTA/SM", push ? "push" : "pull", chunk >> 10, per_sm);
        row(name, [=](Gpu& me, Gpu& peer) {
          const char* src = push ? me.local : peer.inbox;
          char* dst = push ? peer.inbox : me.local;
          tma_copy<<<grid, 32, 2 * chunk, me.s>>>(src, dst, g_bytes, chunk);
        });
      }
  // The copy engine takes a share of the bytes, SM pushes (grid 128 x 512, 4 in flight)
  // the rest, on a forked stream.
  for (int pct : {25, 50, 75}) {
    std::snprintf(name, sizeof name, "copy engine %d%% + sm push", pct);
    row(name, [=](Gpu& me, Gpu& peer) {
      const uint64_t ce = (g_bytes * pct / 100) & ~uint64_t{4095};
      CHECK(cudaEventRecord(me.fork, me.s));
      CHECK(cudaStreamWaitEvent(me.s2, me.fork, 0));
      CHECK(cudaMemcpyAsync(peer.inbox, me.local, ce, cudaMemcpyDefault, me.s2));
      sm_copy<4><<<128, 512, 0, me.s>>>(reinterpret_cast<const uint4*>(me.local + ce),
                                        reinterpret_cast<uint4*>(peer.inbox + ce), (g_bytes - ce) / 16);
      CHECK(cudaEventRecord(me.join, me.s2));
      CHECK(cudaStreamWaitEvent(me.s, me.join, 0));
    });
  }
  return 0;
}
