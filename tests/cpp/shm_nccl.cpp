// A stand-in for libnccl.so.2 whose ranks are processes on ONE GPU (real NCCL refuses two ranks
// on one device), for multiprocess_one_gpu_test.cpp: the library's multi-process exchange and
// its NCCL fallback run through it. A communicator is an EdgellmShmComm (shm_nccl.h) that the
// test fills. It exports NCCL's queries (ncclCommCount, ncclCommUserRank, ncclCommCuDevice) and
// two collectives with NCCL's C signatures: ncclAllGather (any type) and ncclAllReduce (ncclSum
// of fp32, fp16 and bf16). Two builds of this file:
//   libedgellm_shm_nccl.so          links no CUDA (it builds on a machine without one): the
//                                   driver's cuMemcpyAsync and cuStreamSynchronize, looked up in
//                                   the libcuda.so.1 the process has already loaded, copy in the
//                                   stream's order; in a process without it (the CPU tests)
//                                   buffers are host memory, copied with memcpy.
//   libedgellm_shm_nccl_runtime.so  (EDGELLM_SHM_NCCL_RUNTIME) reaches the GPU through a CUDA
//                                   runtime of its own, linked statically as NCCL links its own:
//                                   cudaStreamSynchronize(stream), then a synchronous cudaMemcpy
//                                   (the legacy default stream, NOT the stream it was given) in
//                                   and out, as the stand-in of issue 39 did. Real NCCLs and
//                                   applications mix runtime and driver calls on the streams and
//                                   buffers the library hands them; the library's setup must be
//                                   safe for this one too.
//
// Protocol. Every rank maps the same file (EdgellmShmComm::path) MAP_SHARED: a header (the rank
// count and slot size, which the first rank sets and the others must match; per rank, how many
// calls it has posted, and what its last two calls were), then two slots of slotBytes per rank.
// Call k (counted per rank; every rank makes the same calls in the same order, as with NCCL) of
// rank r:
//   1. waits for its stream, copies its input into its slot k % 2, records the call (kind, bytes,
//      type), then publishes posted[r] = k + 1 (release);
//   2. waits until posted[q] >= k + 1 for every rank q (acquire), checks that all recorded the
//      same call, and reads every rank's slot k % 2: the gather in rank order, or the sum in rank
//      order 0..n-1 in fp32 (so every rank gets identical bytes), written to its output.
// Two slots suffice: rank r writes slot k % 2 again at call k + 2 only after it finished call
// k + 1, which needed every rank to post call k + 1, which each does only after it finished
// reading call k. Every wait is bounded (timeoutMs): then the call returns ncclSystemError and
// the communicator is broken (every later call fails at once); nothing here hangs, and no
// exception leaves a function of the C ABI.

#include "shm_nccl.h"

#ifdef EDGELLM_SHM_NCCL_RUNTIME
#include <cuda_runtime_api.h>
#endif

#include <cstdio>
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace
{
constexpr int kSuccess = 0;
constexpr int kSystemError = 2;
constexpr int kInvalidArgument = 4;
constexpr int kInvalidUsage = 5;

constexpr int kMaxRanks = 16;
constexpr uint64_t kDataOffset = 4096; // the header fits in the first page
constexpr uint64_t kKindAllGather = 1;
constexpr uint64_t kKindAllReduce = 2;

struct Call
{
    uint64_t kind;
    uint64_t bytes; //!< per rank
    uint64_t dtype;
};

struct Header
{
    uint64_t nranks;
    uint64_t slotBytes;
    uint64_t posted[kMaxRanks];
    Call calls[2][kMaxRanks]; //!< [slot][rank]
};
static_assert(sizeof(Header) <= kDataOffset, "the header fits before the slots");

#ifdef EDGELLM_SHM_NCCL_RUNTIME
// --- The CUDA runtime, this library's own ------------------------------------------------------
//! Waits for `stream`, then copies synchronously through the runtime's legacy default stream;
//! a failure is printed with the runtime's name for it (the test's output shows it).
bool copy(void* dst, void const* src, size_t bytes, void* stream)
{
    cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    char const* call = "cudaStreamSynchronize";
    if (e == cudaSuccess && bytes != 0)
    {
        e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
        call = "cudaMemcpy";
    }
    if (e != cudaSuccess)
    {
        std::fprintf(stderr, "shm-nccl (runtime), pid %d: %s failed: %s (%d)\n", static_cast<int>(getpid()), call,
            cudaGetErrorName(e), static_cast<int>(e));
        return false;
    }
    return true;
}
#else
// --- The CUDA driver, from the process's own libcuda ---------------------------------------------
using CuMemcpyAsync = int (*)(unsigned long long, unsigned long long, size_t, void*);
using CuStreamSynchronize = int (*)(void*);

struct Driver
{
    CuMemcpyAsync memcpyAsync = nullptr;
    CuStreamSynchronize streamSynchronize = nullptr;
};

//! The driver's functions, or nulls while the process has no libcuda.so.1 loaded (RTLD_NOLOAD:
//! never a copy of our own).
Driver driver()
{
    static Driver found;
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    if (found.memcpyAsync == nullptr || found.streamSynchronize == nullptr)
    {
        if (void* lib = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY))
        {
            found.memcpyAsync = reinterpret_cast<CuMemcpyAsync>(dlsym(lib, "cuMemcpyAsync"));
            found.streamSynchronize = reinterpret_cast<CuStreamSynchronize>(dlsym(lib, "cuStreamSynchronize"));
        }
    }
    return found;
}

//! Copies `bytes` between any two addresses (device or host: unified addressing) in `stream`'s
//! order, and waits for it. A process without the driver has host memory alone (the CPU tests):
//! a plain copy.
bool copy(void* dst, void const* src, size_t bytes, void* stream)
{
    Driver const d = driver();
    if (d.memcpyAsync == nullptr || d.streamSynchronize == nullptr)
    {
        if (bytes != 0)
        {
            std::memcpy(dst, src, bytes);
        }
        return true;
    }
    if (bytes != 0
        && d.memcpyAsync(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes, stream) != 0)
    {
        return false;
    }
    return d.streamSynchronize(stream) == 0;
}
#endif

// --- Element types -----------------------------------------------------------------------------
size_t typeSize(int dtype)
{
    switch (dtype)
    {
    case 0: // ncclInt8
    case 1: // ncclUint8
    case 10: // ncclFloat8e4m3
    case 11: return 1; // ncclFloat8e5m2
    case 6: // ncclFloat16
    case 9: return 2; // ncclBfloat16
    case 2: // ncclInt32
    case 3: // ncclUint32
    case 7: return 4; // ncclFloat32
    case 4: // ncclInt64
    case 5: // ncclUint64
    case 8: return 8; // ncclFloat64
    default: return 0;
    }
}

float bitsToFloat(uint32_t b)
{
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

uint32_t floatToBits(float f)
{
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

float halfToFloat(uint16_t h)
{
    uint32_t const sign = static_cast<uint32_t>(h & 0x8000U) << 16;
    uint32_t const exp = (h >> 10) & 0x1fU;
    uint32_t const mant = h & 0x3ffU;
    if (exp == 0) // zero or subnormal: mant * 2^-24
    {
        return bitsToFloat(sign | floatToBits(std::ldexp(static_cast<float>(mant), -24)));
    }
    if (exp == 31)
    {
        return bitsToFloat(sign | 0x7f800000U | (mant << 13));
    }
    return bitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

//! Round to nearest even, as the GPU's conversions do.
uint16_t floatToHalf(float f)
{
    uint32_t const x = floatToBits(f);
    auto const sign = static_cast<uint16_t>((x >> 16) & 0x8000U);
    uint32_t const abs = x & 0x7fffffffU;
    if (abs >= 0x7f800000U)
    {
        return sign | (abs > 0x7f800000U ? 0x7e00 : 0x7c00);
    }
    if (abs >= 0x477ff000U) // 65520 and above round to infinity
    {
        return sign | 0x7c00;
    }
    if (abs < 0x38800000U) // below 2^-14: a subnormal half (1024 rounds up into the smallest normal)
    {
        return sign | static_cast<uint16_t>(std::nearbyint(bitsToFloat(abs) * 16777216.0F));
    }
    uint32_t h = ((((abs >> 23) - 127 + 15) << 10) | ((abs & 0x7fffffU) >> 13));
    uint32_t const rest = abs & 0x1fffU;
    if (rest > 0x1000U || (rest == 0x1000U && (h & 1U) != 0))
    {
        ++h; // a carry into the exponent is the right result
    }
    return sign | static_cast<uint16_t>(h);
}

float bf16ToFloat(uint16_t b)
{
    return bitsToFloat(static_cast<uint32_t>(b) << 16);
}

uint16_t floatToBf16(float f)
{
    uint32_t const x = floatToBits(f);
    if ((x & 0x7fffffffU) > 0x7f800000U)
    {
        return static_cast<uint16_t>((x >> 16) | 0x40U); // a quiet NaN
    }
    return static_cast<uint16_t>((x + 0x7fffU + ((x >> 16) & 1U)) >> 16);
}

float load(uint8_t const* p, int dtype)
{
    uint16_t h;
    switch (dtype)
    {
    case 6: std::memcpy(&h, p, 2); return halfToFloat(h);
    case 9: std::memcpy(&h, p, 2); return bf16ToFloat(h);
    default: float f; std::memcpy(&f, p, 4); return f;
    }
}

void store(uint8_t* p, int dtype, float v)
{
    uint16_t h;
    switch (dtype)
    {
    case 6: h = floatToHalf(v); std::memcpy(p, &h, 2); return;
    case 9: h = floatToBf16(v); std::memcpy(p, &h, 2); return;
    default: std::memcpy(p, &v, 4); return;
    }
}

// --- The shared file ---------------------------------------------------------------------------
uint64_t slotBytes(EdgellmShmComm const& c)
{
    return c.slotBytes != 0 ? c.slotBytes : uint64_t{4} << 20;
}

Header* header(EdgellmShmComm& c)
{
    return static_cast<Header*>(c.mapping);
}

uint8_t* slot(EdgellmShmComm& c, uint64_t call, int rank)
{
    uint64_t const index = (call % 2) * static_cast<uint64_t>(c.nranks) + static_cast<uint64_t>(rank);
    return static_cast<uint8_t*>(c.mapping) + kDataOffset + index * slotBytes(c);
}

//! Maps the file at the first call; the first rank to get here sets the layout, the others must
//! match it.
int attach(EdgellmShmComm& c)
{
    if (c.mapping != nullptr)
    {
        return kSuccess;
    }
    if (c.nranks < 1 || c.nranks > kMaxRanks || c.rank < 0 || c.rank >= c.nranks
        || ::strnlen(c.path, sizeof c.path) == sizeof c.path)
    {
        return kInvalidArgument;
    }
    uint64_t const bytes = kDataOffset + 2 * static_cast<uint64_t>(c.nranks) * slotBytes(c);
    int const fd = ::open(c.path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
    {
        return kSystemError;
    }
    // Every rank sets the same size: a file grown by another rank keeps its contents.
    void* m = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0
        ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        : MAP_FAILED;
    ::close(fd);
    if (m == MAP_FAILED)
    {
        return kSystemError;
    }
    auto* h = static_cast<Header*>(m);
    uint64_t* const fields[2] = {&h->nranks, &h->slotBytes};
    uint64_t const mine[2] = {static_cast<uint64_t>(c.nranks), slotBytes(c)};
    for (int i = 0; i < 2; ++i)
    {
        uint64_t expected = 0;
        if (!__atomic_compare_exchange_n(fields[i], &expected, mine[i], false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
            && expected != mine[i])
        {
            ::munmap(m, bytes);
            return kInvalidUsage; // another communicator's file, or ranks that disagree
        }
    }
    c.mapping = m;
    c.mappedBytes = bytes;
    return kSuccess;
}

//! Waits until every rank posted call `call`; false at the bound.
bool waitForAll(EdgellmShmComm& c, uint64_t call)
{
    auto const deadline
        = std::chrono::steady_clock::now() + std::chrono::milliseconds(c.timeoutMs > 0 ? c.timeoutMs : 20000);
    for (uint32_t spins = 0;; ++spins)
    {
        bool all = true;
        for (int q = 0; q < c.nranks && all; ++q)
        {
            all = __atomic_load_n(&header(c)->posted[q], __ATOMIC_ACQUIRE) > call;
        }
        if (all)
        {
            return true;
        }
        if (std::chrono::steady_clock::now() >= deadline)
        {
            return false;
        }
        if (spins < 1000)
        {
            sched_yield();
        }
        else
        {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}

//! One collective of this rank: `count` elements of `dtype` from `send`, gathered
//! (kKindAllGather) or summed (kKindAllReduce) into `recv`.
int collective(void* comm, uint64_t kind, void const* send, void* recv, size_t count, int dtype, void* stream)
{
    size_t const size = typeSize(dtype);
    if (comm == nullptr || size == 0 || count > SIZE_MAX / size)
    {
        return kInvalidArgument;
    }
    size_t const bytes = count * size;
    auto& c = *static_cast<EdgellmShmComm*>(comm);
    if (c.broken != 0)
    {
        return kSystemError;
    }
    int const attached = attach(c);
    if (attached != kSuccess)
    {
        c.broken = 1;
        return attached;
    }
    uint64_t const call = c.calls;
    // A rank that fails posts nothing: its peers end at their bound.
    auto fail = [&c](int code) {
        c.broken = 1;
        return code;
    };
    if (bytes > slotBytes(c))
    {
        return fail(kInvalidArgument);
    }
    if (!copy(slot(c, call, c.rank), send, bytes, stream))
    {
        return fail(kSystemError);
    }
    header(c)->calls[call % 2][c.rank] = Call{kind, bytes, static_cast<uint64_t>(dtype)};
    __atomic_store_n(&header(c)->posted[c.rank], call + 1, __ATOMIC_RELEASE);
    c.calls = call + 1;
    if (!waitForAll(c, call))
    {
        return fail(kSystemError);
    }
    for (int q = 0; q < c.nranks; ++q)
    {
        Call const& other = header(c)->calls[call % 2][q];
        if (other.kind != kind || other.bytes != bytes || other.dtype != static_cast<uint64_t>(dtype))
        {
            return fail(kInvalidUsage); // the ranks' calls do not pair up
        }
    }
    std::vector<uint8_t> out;
    if (kind == kKindAllGather)
    {
        out.resize(bytes * static_cast<size_t>(c.nranks));
        for (int q = 0; q < c.nranks; ++q)
        {
            std::memcpy(out.data() + bytes * static_cast<size_t>(q), slot(c, call, q), bytes);
        }
    }
    else
    {
        out.resize(bytes);
        for (size_t i = 0; i < bytes; i += size)
        {
            float sum = load(slot(c, call, 0) + i, dtype);
            for (int q = 1; q < c.nranks; ++q)
            {
                sum += load(slot(c, call, q) + i, dtype);
            }
            store(out.data() + i, dtype, sum);
        }
    }
    if (!copy(recv, out.data(), out.size(), stream))
    {
        return fail(kSystemError);
    }
    // The test hook: this rank's call K (EDGELLM_TEST_SHM_NCCL_FAIL_CALL) completes on every rank
    // but reports ncclSystemError here, as an NCCL whose local part failed; later calls work.
    char const* failCall = std::getenv("EDGELLM_TEST_SHM_NCCL_FAIL_CALL");
    return failCall != nullptr && *failCall != '\0' && std::strtoull(failCall, nullptr, 10) == call ? kSystemError
                                                                                                    : kSuccess;
}
} // namespace

extern "C"
{
    int ncclCommCount(void* comm, int* count)
    {
        if (comm == nullptr || count == nullptr)
        {
            return kInvalidArgument;
        }
        *count = static_cast<EdgellmShmComm*>(comm)->nranks;
        return kSuccess;
    }
    int ncclCommUserRank(void* comm, int* rank)
    {
        if (comm == nullptr || rank == nullptr)
        {
            return kInvalidArgument;
        }
        *rank = static_cast<EdgellmShmComm*>(comm)->rank;
        return kSuccess;
    }
    int ncclCommCuDevice(void* comm, int* device)
    {
        if (comm == nullptr || device == nullptr)
        {
            return kInvalidArgument;
        }
        *device = static_cast<EdgellmShmComm*>(comm)->device;
        return kSuccess;
    }
    int ncclAllGather(void const* send, void* recv, size_t count, int dtype, void* comm, void* stream)
    {
        try
        {
            return collective(comm, kKindAllGather, send, recv, count, dtype, stream);
        }
        catch (...) // std::bad_alloc: no exception crosses the C ABI
        {
            return kSystemError;
        }
    }
    int ncclAllReduce(void const* send, void* recv, size_t count, int dtype, int op, void* comm, void* stream)
    {
        if (op != 0 || (dtype != 6 && dtype != 7 && dtype != 9)) // ncclSum of fp16, fp32, bf16
        {
            return kInvalidArgument;
        }
        try
        {
            return collective(comm, kKindAllReduce, send, recv, count, dtype, stream);
        }
        catch (...)
        {
            return kSystemError;
        }
    }
}
