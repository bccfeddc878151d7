// Issue 39 without the library: one rank process of the setup gathers, as the library's exchange
// makes them, through the shared-memory stand-in NCCL built on its own CUDA runtime
// (libedgellm_shm_nccl_runtime.so: cudaStreamSynchronize, then a synchronous cudaMemcpy on the
// legacy default stream), in a process that uses the CUDA runtime itself. Each VARIANT is one way
// of handling the gathers' scratch; after three gathers the "application" allocates, writes and
// reads through the runtime, and the program prints every status.
//   pool     per gather: a new non-blocking stream, cuMemAllocAsync + cuMemsetD8Async +
//            cuMemcpyHtoDAsync, the gather, cuStreamSynchronize, cuMemcpyDtoHAsync +
//            cuStreamSynchronize, cuMemFreeAsync, cuStreamDestroy (the library at 6d35dd5)
//   pool-syncread   the same, the result read with a synchronous cuMemcpyDtoH
//   plain    the same with cuMemAlloc / cuMemFree instead of the pool
//   kept     one cuMemAlloc and one stream for good, the result read with a synchronous
//            cuMemcpyDtoH (the library after issue 39)
// Build and run (tools/gpu/issue39_check.sh does it on the GPU machine):
//   g++ -std=c++17 -I$CUDA/include -Itests/cpp setup_gather_repro.cpp -o repro -lcuda -lcudart -ldl
//   for r in 0 1; do ./repro VARIANT 2 $r /dev/shm/file LIBDIR & done; wait
#include "shm_nccl.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace
{
int rank = -1;
bool ok = true;

bool check(char const* what, CUresult r)
{
    if (r != CUDA_SUCCESS)
    {
        char const* name = nullptr;
        cuGetErrorName(r, &name);
        std::printf("rank %d: %s -> %s (%d)\n", rank, what, name ? name : "?", static_cast<int>(r));
        ok = false;
    }
    return r == CUDA_SUCCESS;
}

bool checkRt(char const* what, cudaError_t e)
{
    if (e != cudaSuccess)
    {
        std::printf("rank %d: %s -> %s (%d)\n", rank, what, cudaGetErrorName(e), static_cast<int>(e));
        ok = false;
    }
    return e == cudaSuccess;
}

using AllGather = int (*)(void const*, void*, size_t, int, void*, void*);
} // namespace

int main(int argc, char** argv)
{
    if (argc != 6)
    {
        std::fprintf(stderr, "usage: %s pool|pool-syncread|plain|kept NRANKS RANK SHMFILE LIBDIR\n", argv[0]);
        return 2;
    }
    std::string const variant = argv[1];
    int const nranks = std::atoi(argv[2]);
    rank = std::atoi(argv[3]);
    void* lib = dlopen((std::string(argv[5]) + "/libedgellm_shm_nccl_runtime.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    auto gatherFn = lib ? reinterpret_cast<AllGather>(dlsym(lib, "ncclAllGather")) : nullptr;
    if (gatherFn == nullptr)
    {
        std::printf("rank %d: no stand-in: %s\n", rank, dlerror());
        return 2;
    }
    EdgellmShmComm comm{};
    comm.nranks = nranks;
    comm.rank = rank;
    comm.timeoutMs = 5000;
    std::strncpy(comm.path, argv[4], sizeof comm.path - 1);

    // The application: the runtime first.
    size_t freeBytes = 0, totalBytes = 0;
    void* app = nullptr;
    checkRt("app cudaSetDevice", cudaSetDevice(0));
    checkRt("app cudaMemGetInfo", cudaMemGetInfo(&freeBytes, &totalBytes));
    checkRt("app cudaMalloc", cudaMalloc(&app, 1 << 20));

    // The library: the primary context pushed, as cuda::with_device does.
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    check("cuInit", cuInit(0));
    check("cuDeviceGet", cuDeviceGet(&dev, 0));
    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, dev));
    check("cuCtxPushCurrent", cuCtxPushCurrent(ctx));
    size_t const n = 256, bytes = n * (1 + static_cast<size_t>(nranks));
    CUstream keptStream = nullptr;
    CUdeviceptr keptMemory = 0;
    if (variant == "kept")
    {
        check("cuMemAlloc (kept)", cuMemAlloc(&keptMemory, 64 << 10));
        check("cuStreamCreate (kept)", cuStreamCreate(&keptStream, CU_STREAM_NON_BLOCKING));
    }
    for (int g = 0; g < 3 && ok; ++g)
    {
        std::vector<unsigned char> mine(n, static_cast<unsigned char>(rank * 16 + g)), all(n * nranks);
        CUstream s = keptStream;
        CUdeviceptr p = keptMemory;
        bool const pool = variant == "pool" || variant == "pool-syncread";
        if (variant != "kept")
        {
            check("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
            check(pool ? "cuMemAllocAsync" : "cuMemAlloc", pool ? cuMemAllocAsync(&p, bytes, s) : cuMemAlloc(&p, bytes));
        }
        check("cuMemsetD8Async", cuMemsetD8Async(p, 0, bytes, s));
        check("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync(p, mine.data(), n, s));
        int const code = gatherFn(reinterpret_cast<void*>(p), reinterpret_cast<void*>(p + n), n, 1, &comm, s);
        if (code != 0)
        {
            std::printf("rank %d: gather %d: ncclAllGather -> %d\n", rank, g, code);
            ok = false;
        }
        check("cuStreamSynchronize", cuStreamSynchronize(s));
        if (variant == "pool")
        {
            check("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync(all.data(), p + n, all.size(), s));
            check("cuStreamSynchronize (read)", cuStreamSynchronize(s));
        }
        else
        {
            check("cuMemcpyDtoH", cuMemcpyDtoH(all.data(), p + n, all.size()));
        }
        for (int q = 0; q < nranks && ok; ++q)
        {
            if (all[static_cast<size_t>(q) * n] != static_cast<unsigned char>(q * 16 + g))
            {
                std::printf("rank %d: gather %d: rank %d's bytes are wrong (%d)\n", rank, g, q, all[q * n]);
                ok = false;
            }
        }
        if (variant != "kept")
        {
            check(pool ? "cuMemFreeAsync" : "cuMemFree", pool ? cuMemFreeAsync(p, s) : cuMemFree(p));
            check("cuStreamDestroy", cuStreamDestroy(s));
        }
    }
    CUcontext popped = nullptr;
    check("cuCtxPopCurrent", cuCtxPopCurrent(&popped));

    // The application again.
    void* more = nullptr;
    std::vector<unsigned char> back(1 << 20);
    checkRt("app cudaMalloc after", cudaMalloc(&more, 1 << 20))
        && checkRt("app cudaMemset after", cudaMemset(more, 7, 1 << 20))
        && checkRt("app cudaMemcpy after", cudaMemcpy(back.data(), more, 1 << 20, cudaMemcpyDeviceToHost));
    std::printf("rank %d: variant %s: %s\n", rank, variant.c_str(), ok && back[12345] == 7 ? "OK" : "FAILED");
    return ok ? 0 : 1;
}
