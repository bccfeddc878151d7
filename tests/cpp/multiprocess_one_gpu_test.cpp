// The multi-process path (one rank per process: the library's IPC exchange, its peer self-test
// with every rank's verdict gathered, and the NCCL fallback) on ONE GPU, issue 29. Real NCCL
// refuses two ranks on one device, so the ranks' communicator is the stand-in of
// shm_nccl.cpp (libedgellm_shm_nccl.so beside this binary): its collectives go through a shared
// file.
//   ShmNccl.*             the stand-in itself, on the CPU (threads as ranks, host buffers)
//   MultiProcessOneGpu.*  N processes on GPU 0 (fork, then exec of this binary's Child test):
//                         a healthy group forms on every rank and sums exactly; a self-test
//                         fault injected through EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT (a dropped
//                         or garbled write, a kernel never launched) makes EVERY rank use NCCL,
//                         quickly, with the line naming the pair, and the sums stay exact; a
//                         kernel still running when its host gives up (host-wait shorter than the
//                         bound) holds up no rank's gather of the verdicts; ranks
//                         with different tuning files (EDGELLM_TEST_TUNING_A/_B, made on the GPU
//                         machine by tools/gpu/contract_check.sh) use NCCL with the line naming
//                         them. A child that hangs is killed at a bound and fails the test.
//                         The children use the CUDA runtime before and after registering, and
//                         check that their context still works after the library's setup.
//   MultiProcessOneGpu.ARuntimeNccl*, AGatherThatFails*  issue 39: the same through
//                         libedgellm_shm_nccl_runtime.so (the stand-in on a CUDA runtime of its
//                         own: cudaStreamSynchronize, synchronous cudaMemcpy), healthy, with the
//                         self-test off, with a rank opting out, with a self-test fault; and a
//                         gather that fails on one rank (EDGELLM_TEST_SHM_NCCL_FAIL_CALL), which
//                         must still send every rank to NCCL without a wait.
// Without a GPU the MultiProcessOneGpu tests skip.

#include "gpu.h"
#include "library.h"
#include "shm_nccl.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace nvinfer1;

namespace
{
using Clock = std::chrono::steady_clock;
using AllReduceFn = int (*)(void const*, void*, size_t, int, int, void*, void*);
using AllGatherFn = int (*)(void const*, void*, size_t, int, void*, void*);
using QueryFn = int (*)(void*, int*);

constexpr int kFloat16 = 6;
constexpr int kFloat32 = 7;
constexpr int kBfloat16 = 9;

//! Which build of the stand-in a child uses (EDGELLM_TEST_MP1_NCCL): "runtime" for
//! libedgellm_shm_nccl_runtime.so (its own CUDA runtime), else libedgellm_shm_nccl.so (the driver).
constexpr char const* kNcclVar = "EDGELLM_TEST_MP1_NCCL";

//! The stand-in NCCL beside this binary (tools/gpu/stage_contract.sh copies it there too),
//! opened RTLD_LOCAL: its NCCL names interpose on nothing.
struct ShmNccl
{
    void* lib = nullptr;
    std::string error;
    AllReduceFn allReduce = nullptr;
    AllGatherFn allGather = nullptr;
    QueryFn count = nullptr, rank = nullptr, device = nullptr;

    ShmNccl()
    {
        std::string exe(4096, '\0');
        exe.resize(static_cast<size_t>(std::max<ssize_t>(0, readlink("/proc/self/exe", exe.data(), exe.size()))));
        char const* build = std::getenv(kNcclVar);
        std::string const name = build != nullptr && std::string(build) == "runtime" ? "libedgellm_shm_nccl_runtime.so"
                                                                                      : "libedgellm_shm_nccl.so";
        std::string const path = exe.substr(0, exe.rfind('/') + 1) + name;
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr)
        {
            error = dlerror();
            return;
        }
        allReduce = reinterpret_cast<AllReduceFn>(dlsym(lib, "ncclAllReduce"));
        allGather = reinterpret_cast<AllGatherFn>(dlsym(lib, "ncclAllGather"));
        count = reinterpret_cast<QueryFn>(dlsym(lib, "ncclCommCount"));
        rank = reinterpret_cast<QueryFn>(dlsym(lib, "ncclCommUserRank"));
        device = reinterpret_cast<QueryFn>(dlsym(lib, "ncclCommCuDevice"));
        if (!allReduce || !allGather || !count || !rank || !device)
        {
            error = "a symbol is missing from " + path;
        }
    }
};

ShmNccl& shm()
{
    static ShmNccl instance;
    return instance;
}

//! A new file for a group's communicator (removed first: a stale one would pair old calls).
std::string shmPath(std::string const& name)
{
    static int serial = 0;
    std::string const dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string path = dir + "/edgellm-shm-nccl-" + std::to_string(getpid()) + "-" + std::to_string(serial++) + "-" + name;
    unlink(path.c_str());
    return path;
}

EdgellmShmComm makeComm(std::string const& path, int nranks, int rank, int timeoutMs = 0)
{
    EdgellmShmComm c{};
    c.nranks = nranks;
    c.rank = rank;
    c.device = 0;
    c.timeoutMs = timeoutMs;
    std::strncpy(c.path, path.c_str(), sizeof c.path - 1);
    return c;
}

//! Exactly representable in FP16, BF16 and FP32, and so are sums of a few ranks: exact results.
float rankValue(int rank, size_t i)
{
    return static_cast<float>(static_cast<int>(i % 17) - 8) * 0.25F * static_cast<float>(rank + 1);
}

int ncclType(DataType t)
{
    return t == DataType::kFLOAT ? kFloat32 : t == DataType::kHALF ? kFloat16 : kBfloat16;
}

std::vector<uint8_t> encode(std::vector<float> const& v, DataType t)
{
    size_t const size = t == DataType::kFLOAT ? 4 : 2;
    std::vector<uint8_t> out(v.size() * size);
    for (size_t i = 0; i < v.size(); ++i)
    {
        uint16_t h = 0;
        if (t == DataType::kFLOAT)
        {
            std::memcpy(&out[4 * i], &v[i], 4);
            continue;
        }
        h = t == DataType::kHALF ? __half_as_ushort(__float2half_rn(v[i])) : __bfloat16_as_ushort(__float2bfloat16_rn(v[i]));
        std::memcpy(&out[2 * i], &h, 2);
    }
    return out;
}

//! Runs `body(rank)` on one thread per rank; returns each rank's problems ("" none).
std::vector<std::string> onRanks(int nranks, std::function<std::string(int)> const& body)
{
    std::vector<std::string> problems(static_cast<size_t>(nranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; ++r)
    {
        threads.emplace_back([&, r] { problems[static_cast<size_t>(r)] = body(r); });
    }
    for (auto& t : threads)
    {
        t.join();
    }
    return problems;
}

//! Skips a CPU test of the stand-in where the process has the CUDA driver loaded: its copies
//! then go through the driver, which host buffers on threads without a context cannot.
#define REQUIRE_NO_DRIVER_AND_THE_LIBRARY()                                                                            \
    if (dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY) != nullptr)                                                    \
    GTEST_SKIP() << "the CUDA driver is loaded in this process: MultiProcessOneGpu.* covers the stand-in there";     \
    ASSERT_EQ(shm().error, "")
} // namespace

// --- The stand-in NCCL on the CPU ----------------------------------------------------------------

TEST(ShmNccl, QueriesAnswerWhatTheCommunicatorSays)
{
    REQUIRE_NO_DRIVER_AND_THE_LIBRARY();
    EdgellmShmComm c = makeComm("/nonexistent", 4, 3);
    c.device = 5;
    int v = -1;
    EXPECT_EQ(shm().count(&c, &v), 0);
    EXPECT_EQ(v, 4);
    EXPECT_EQ(shm().rank(&c, &v), 0);
    EXPECT_EQ(v, 3);
    EXPECT_EQ(shm().device(&c, &v), 0);
    EXPECT_EQ(v, 5);
    EXPECT_NE(shm().count(nullptr, &v), 0);
}

TEST(ShmNccl, EveryRankGathersAndSumsTheSameBytes)
{
    REQUIRE_NO_DRIVER_AND_THE_LIBRARY();
    for (int nranks : {2, 3, 4})
    {
        std::string const path = shmPath("lockstep");
        auto problems = onRanks(nranks, [&](int rank) -> std::string {
            EdgellmShmComm c = makeComm(path, nranks, rank);
            // Many calls of changing sizes: both slots are reused many times.
            for (size_t call = 0; call < 60; ++call)
            {
                size_t const count = 1 + (call * 37) % 700;
                std::vector<uint8_t> mine(count), all(count * static_cast<size_t>(nranks));
                for (size_t i = 0; i < count; ++i)
                {
                    mine[i] = static_cast<uint8_t>(rank * 31 + i + call);
                }
                if (shm().allGather(mine.data(), all.data(), count, 1, &c, nullptr) != 0)
                {
                    return "all-gather failed at call " + std::to_string(call);
                }
                for (int q = 0; q < nranks; ++q)
                {
                    for (size_t i = 0; i < count; ++i)
                    {
                        if (all[static_cast<size_t>(q) * count + i] != static_cast<uint8_t>(q * 31 + i + call))
                        {
                            return "wrong gather at call " + std::to_string(call);
                        }
                    }
                }
                DataType const t = call % 3 == 0 ? DataType::kFLOAT : call % 3 == 1 ? DataType::kHALF : DataType::kBF16;
                std::vector<float> values(count), expected(count);
                for (size_t i = 0; i < count; ++i)
                {
                    values[i] = rankValue(rank, i + call);
                    for (int q = 0; q < nranks; ++q)
                    {
                        expected[i] += rankValue(q, i + call);
                    }
                }
                auto in = encode(values, t);
                std::vector<uint8_t> out(in.size());
                if (shm().allReduce(in.data(), out.data(), count, ncclType(t), 0, &c, nullptr) != 0)
                {
                    return "all-reduce failed at call " + std::to_string(call);
                }
                if (out != encode(expected, t))
                {
                    return "wrong sum at call " + std::to_string(call);
                }
                // In place, as the library's callers may.
                if (shm().allReduce(in.data(), in.data(), count, ncclType(t), 0, &c, nullptr) != 0 || in != out)
                {
                    return "in-place all-reduce differs at call " + std::to_string(call);
                }
            }
            return "";
        });
        unlink(path.c_str());
        for (int r = 0; r < nranks; ++r)
        {
            EXPECT_EQ(problems[static_cast<size_t>(r)], "") << nranks << " ranks, rank " << r;
        }
    }
}

TEST(ShmNccl, HalfAndBf16SumsRoundAsTheGpuDoes)
{
    // Random finite bit patterns (subnormals and ties included), summed in fp32 and rounded to
    // nearest even: what CUDA's own host conversions give.
    REQUIRE_NO_DRIVER_AND_THE_LIBRARY();
    for (DataType t : {DataType::kHALF, DataType::kBF16})
    {
        size_t const count = 1 << 14;
        std::vector<std::vector<uint16_t>> in(2, std::vector<uint16_t>(count));
        std::mt19937 rng(t == DataType::kHALF ? 1 : 2);
        uint16_t const expMask = t == DataType::kHALF ? 0x7c00 : 0x7f80;
        for (auto& v : in)
        {
            for (auto& x : v)
            {
                x = static_cast<uint16_t>(rng());
                if ((x & expMask) == expMask)
                {
                    x = static_cast<uint16_t>(x & ~0x4000); // finite
                }
            }
        }
        auto toFloat = [t](uint16_t b) {
            return t == DataType::kHALF ? __half2float(__ushort_as_half(b)) : __bfloat162float(__ushort_as_bfloat16(b));
        };
        std::vector<uint8_t> expected(2 * count);
        for (size_t i = 0; i < count; ++i)
        {
            float const sum = toFloat(in[0][i]) + toFloat(in[1][i]);
            uint16_t const b = t == DataType::kHALF ? __half_as_ushort(__float2half_rn(sum))
                                                    : __bfloat16_as_ushort(__float2bfloat16_rn(sum));
            std::memcpy(&expected[2 * i], &b, 2);
        }
        std::string const path = shmPath("rounding");
        std::vector<std::vector<uint8_t>> out(2, std::vector<uint8_t>(2 * count));
        auto problems = onRanks(2, [&](int rank) -> std::string {
            EdgellmShmComm c = makeComm(path, 2, rank);
            return shm().allReduce(in[static_cast<size_t>(rank)].data(), out[static_cast<size_t>(rank)].data(), count,
                       ncclType(t), 0, &c, nullptr)
                    == 0
                ? ""
                : "all-reduce failed";
        });
        unlink(path.c_str());
        EXPECT_EQ(problems, std::vector<std::string>(2, ""));
        EXPECT_EQ(out[0], expected) << "type " << static_cast<int>(t);
        EXPECT_EQ(out[1], expected) << "type " << static_cast<int>(t);
    }
}

TEST(ShmNccl, AMissingRankEndsItsPeersAtTheBoundNeverAHang)
{
    REQUIRE_NO_DRIVER_AND_THE_LIBRARY();
    std::string const path = shmPath("missing");
    std::vector<double> took(2);
    std::vector<int> codes(2, -1), after(2, -1);
    onRanks(2, [&](int rank) -> std::string {
        EdgellmShmComm c = makeComm(path, 2, rank, 1000);
        float x = 1.F, y = 0.F;
        if (shm().allReduce(&x, &y, 1, kFloat32, 0, &c, nullptr) != 0 || y != 2.F)
        {
            codes[static_cast<size_t>(rank)] = -2;
            return "";
        }
        if (rank == 1)
        {
            return ""; // rank 1 never makes the second call
        }
        auto const start = Clock::now();
        codes[0] = shm().allReduce(&x, &y, 1, kFloat32, 0, &c, nullptr);
        took[0] = std::chrono::duration<double>(Clock::now() - start).count();
        auto const again = Clock::now();
        after[0] = shm().allReduce(&x, &y, 1, kFloat32, 0, &c, nullptr);
        took[1] = std::chrono::duration<double>(Clock::now() - again).count();
        return "";
    });
    unlink(path.c_str());
    EXPECT_EQ(codes[1], -1) << "rank 1's one call succeeded";
    EXPECT_EQ(codes[0], 2) << "ncclSystemError at the bound";
    // Wide margins on the clock (CI has 2 busy cores): the wait lasted its bound, not forever,
    // and the later call did not wait a bound again.
    EXPECT_GE(took[0], 0.95);
    EXPECT_LT(took[0], 5.0);
    EXPECT_EQ(after[0], 2) << "a broken communicator fails every later call";
    EXPECT_LT(took[1], 0.5) << "at once";
}

TEST(ShmNccl, CallsThatDoNotPairUpFail)
{
    REQUIRE_NO_DRIVER_AND_THE_LIBRARY();
    std::string const path = shmPath("mismatch");
    std::vector<int> codes(2, -1);
    onRanks(2, [&](int rank) -> std::string {
        EdgellmShmComm c = makeComm(path, 2, rank, 2000);
        std::vector<float> x(8, 1.F), y(8);
        codes[static_cast<size_t>(rank)] = shm().allReduce(x.data(), y.data(), 4 + static_cast<size_t>(rank), kFloat32, 0, &c, nullptr);
        return "";
    });
    EXPECT_EQ(codes, std::vector<int>(2, 5)) << "ncclInvalidUsage on both ranks";
    // Another layout on the same file (another slot size) is refused before any call.
    EdgellmShmComm other = makeComm(path, 2, 0);
    other.slotBytes = 1 << 10;
    float x = 0.F;
    EXPECT_EQ(shm().allReduce(&x, &x, 1, kFloat32, 0, &other, nullptr), 5);
    unlink(path.c_str());
    EdgellmShmComm c = makeComm(shmPath("arguments"), 1, 0);
    EXPECT_EQ(shm().allReduce(&x, &x, 1, kFloat32, 1 /* ncclProd */, &c, nullptr), 4);
    EXPECT_EQ(shm().allReduce(&x, &x, 1, 2 /* ncclInt32 */, 0, &c, nullptr), 4);
    EXPECT_EQ(shm().allReduce(&x, &x, SIZE_MAX / 2, kFloat32, 0, &c, nullptr), 4) << "no overflow";
    EXPECT_EQ(shm().allReduce(&x, &x, 1, kFloat32, 0, &c, nullptr), 0) << "one rank: its own value";
    unlink(c.path);
}

// --- The library's multi-process path on one GPU ---------------------------------------------------
namespace
{

// What the parent tells each child (environment variables).
constexpr char const* kRankVar = "EDGELLM_TEST_MP1_RANK";
constexpr char const* kRanksVar = "EDGELLM_TEST_MP1_NRANKS";
constexpr char const* kShmVar = "EDGELLM_TEST_MP1_SHM";
constexpr char const* kExpectVar = "EDGELLM_TEST_MP1_EXPECT";   //!< "group" or "nccl"
constexpr char const* kLinesVar = "EDGELLM_TEST_MP1_LINES";     //!< '|'-separated texts the log must hold
constexpr char const* kAbsentVar = "EDGELLM_TEST_MP1_ABSENT";   //!< '|'-separated texts it must not
constexpr char const* kFaultVar = "EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT";

//! How long a child may take to register (the exchange, the self-test, its verdicts): a fault
//! costs at most the self-test's bound plus the host's grace (about 1 s), never a hang. Under a
//! sanitizer (which slows the CUDA calls of every process) EDGELLM_TEST_MP1_SETUP_BOUND_S
//! raises it.
double setupBoundSeconds()
{
    char const* bound = std::getenv("EDGELLM_TEST_MP1_SETUP_BOUND_S");
    return bound != nullptr && std::atof(bound) > 0 ? std::atof(bound) : 5.0;
}
//! How long the parent waits for all the children of a group before it kills them.
constexpr int kChildrenBoundSeconds = 60;

std::vector<std::string> split(char const* text, char separator = '|')
{
    std::vector<std::string> out;
    std::string s = text != nullptr ? text : "";
    for (size_t start = 0; !s.empty() && start <= s.size();)
    {
        size_t const end = std::min(s.find(separator, start), s.size());
        if (end > start)
        {
            out.push_back(s.substr(start, end - start));
        }
        start = end + 1;
    }
    return out;
}

//! "" when the process's CUDA context still works through the runtime (it allocates, writes
//! and reads a new buffer and `kept`, an allocation made before the library's setup), else what
//! failed: no setup step may leave the application's context broken (issue 39).
std::string deviceStillWorks(void* kept, size_t keptBytes)
{
    size_t const bytes = 1 << 20;
    void* fresh = nullptr;
    std::vector<uint8_t> back(bytes);
    auto failed = [](char const* what, cudaError_t e) {
        return std::string("after setup the application's ") + what + " failed: " + cudaGetErrorName(e) + "; ";
    };
    if (cudaError_t e = cudaMalloc(&fresh, bytes); e != cudaSuccess)
    {
        return failed("cudaMalloc", e);
    }
    std::string problem;
    for (auto [buffer, size] : {std::pair<void*, size_t>{fresh, bytes}, {kept, keptBytes}})
    {
        cudaError_t e = cudaMemset(buffer, 0x5a, size);
        e = e != cudaSuccess ? e : cudaMemcpy(back.data(), buffer, size, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
        {
            problem = failed("cudaMemset/cudaMemcpy", e);
            break;
        }
        if (std::any_of(back.begin(), back.begin() + static_cast<std::ptrdiff_t>(size), [](uint8_t b) { return b != 0x5a; }))
        {
            problem = "after setup the application's buffer did not read back what it wrote; ";
            break;
        }
    }
    cudaFree(fresh);
    return problem;
}

//! One rank's process: registers its shm communicator with the library (the exchange runs
//! then: EDGELLM_ALLREDUCE_EXCHANGE=register), checks the group and the log, runs all-reduces
//! through the plugin. Returns its problems ("" none).
std::string childRank(int rank, int nranks, std::string const& path, bool expectGroup)
{
    if (!shm().error.empty())
    {
        return "the stand-in NCCL: " + shm().error;
    }
    // As an inference runtime does: the CUDA runtime asks how much memory is free and allocates
    // before the communicator is registered, and uses the device after it (deviceStillWorks).
    size_t freeBytes = 0, totalBytes = 0;
    size_t const appBytes = 1 << 20;
    void* appBuffer = nullptr;
    if (cudaSetDevice(0) != cudaSuccess || cudaMemGetInfo(&freeBytes, &totalBytes) != cudaSuccess
        || cudaMalloc(&appBuffer, appBytes) != cudaSuccess)
    {
        return "no CUDA context on device 0";
    }
    auto init = testlib::symbol<bool (*)(void*, char const*)>("initEdgellmPlugins");
    if (init == nullptr || !init(&testlib::logger(), ""))
    {
        return "initEdgellmPlugins failed";
    }
    testlib::logger().clear();
    auto reg = testlib::symbol<bool (*)(int, void*, void*)>("edgellmRegisterNcclCommForAllReducePlugin");
    auto unreg = testlib::symbol<bool (*)(int, void*)>("edgellmUnregisterNcclCommForAllReducePlugin");
    auto customRanks = testlib::symbol<int (*)(int)>("edgellmAllReduceCustomRanks");
    EdgellmShmComm comm = makeComm(path, nranks, rank);
    auto const start = Clock::now();
    if (!reg(0, &comm, reinterpret_cast<void*>(shm().allReduce)))
    {
        return "register failed";
    }
    double const took = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("rank %d of %d: registered (exchange and self-test) in %.3f s\n", rank, nranks, took);
    std::string problems;
    int const custom = customRanks(0);
    if (custom != (expectGroup ? nranks : 0))
    {
        problems += "edgellmAllReduceCustomRanks(0) is " + std::to_string(custom) + ", expected "
            + std::to_string(expectGroup ? nranks : 0) + "; ";
    }
    if (took > setupBoundSeconds())
    {
        problems += "registration took " + std::to_string(took) + " s; ";
    }
    for (std::string const& line : split(std::getenv(kLinesVar)))
    {
        if (!testlib::logger().saw(line))
        {
            problems += "no log line holds '" + line + "'; ";
        }
    }
    for (std::string const& line : split(std::getenv(kAbsentVar)))
    {
        if (testlib::logger().saw(line))
        {
            problems += "a log line holds '" + line + "'; ";
        }
    }
    std::string const device = deviceStillWorks(appBuffer, appBytes);
    if (!device.empty())
    {
        // No sums: every call would fail, and the peers end theirs at the stand-in's bound.
        for (std::string const& m : testlib::logger().messages())
        {
            std::printf("rank %d log: %s\n", rank, m.c_str());
        }
        return problems + device;
    }

    // The sums, through the custom kernels or NCCL (the stand-in): exact either way.
    cudaStream_t stream{};
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    for (int32_t strategy : {3 /* AUTO */, 1 /* ONESHOT */})
    {
        for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
        {
            for (size_t count : {size_t{3}, size_t{4097}, size_t{1} << 16})
            {
                std::string const what = "strategy " + std::to_string(strategy) + " type "
                    + std::to_string(static_cast<int>(t)) + " count " + std::to_string(count);
                testlib::Fields f;
                f.i32("tp_size", nranks).i32("strategy", strategy);
                std::unique_ptr<IPluginV3> p(testlib::createPlugin(f));
                std::vector<float> mine(count), expected(count);
                for (size_t i = 0; i < count; ++i)
                {
                    mine[i] = rankValue(rank, i);
                    for (int q = 0; q < nranks; ++q)
                    {
                        expected[i] += rankValue(q, i);
                    }
                }
                auto host = encode(mine, t);
                void* in = nullptr;
                void* out = nullptr;
                cudaMalloc(&in, host.size());
                cudaMalloc(&out, host.size());
                // On the plugin's stream: a synchronous copy from pageable memory may return
                // before its DMA lands, and a non-blocking stream would not wait for it.
                cudaMemcpyAsync(in, host.data(), host.size(), cudaMemcpyHostToDevice, stream);
                cudaMemsetAsync(out, 0xff, host.size(), stream);
                PluginTensorDesc d = testlib::tensor({static_cast<int64_t>(count)}, t);
                void const* ins[1] = {in};
                void* outs[1] = {out};
                int32_t const status
                    = p ? testlib::views(p.get()).runtime->enqueue(&d, &d, ins, outs, nullptr, stream) : -98;
                std::vector<uint8_t> got(host.size());
                bool const synced = cudaStreamSynchronize(stream) == cudaSuccess
                    && cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess;
                cudaFree(in);
                cudaFree(out);
                if (status != 0 || !synced)
                {
                    // Every rank makes the same calls: a rank that stops here would leave its
                    // peers waiting; the others stop at their own failure or the bound.
                    problems += "enqueue failed (" + std::to_string(status) + "): " + what + "; ";
                    break;
                }
                if (got != encode(expected, t))
                {
                    problems += "wrong sum: " + what + "; ";
                }
            }
        }
    }
    cudaStreamDestroy(stream);
    cudaFree(appBuffer);
    if (!unreg(0, &comm) || customRanks(0) != 0)
    {
        problems += "unregistering did not release the group; ";
    }
    if (!problems.empty())
    {
        for (std::string const& m : testlib::logger().messages())
        {
            std::printf("rank %d log: %s\n", rank, m.c_str());
        }
    }
    return problems;
}

//! A group of `nranks` processes on GPU 0, each with `env` (a value nullptr: unset) and its own
//! `perRank` variables; fails unless every child passes within the bound.
struct GroupCase
{
    int nranks = 2;
    bool expectGroup = true;
    std::vector<std::string> lines;  //!< texts every rank's log must hold
    std::vector<std::string> absent; //!< texts no rank's log may hold
    std::string fault;               //!< EDGELLM_ALLREDUCE_TEST_SELFTEST_FAULT ("" unset)
    std::vector<std::string> tuning; //!< EDGELLM_ALLREDUCE_TUNING per rank ("" or missing: unset)
    std::string selftestMs;          //!< EDGELLM_ALLREDUCE_SELFTEST_MS ("" unset: the default bound)
};

//! Which stand-in the ranks use, and more environment per rank.
struct Variant
{
    std::string nccl;                 //!< the stand-in's build: "" (the driver) or "runtime"
    std::vector<std::string> rankEnv; //!< per rank, "NAME=VALUE" pairs, ';'-separated (missing: none)

    Variant(std::string build = "", std::vector<std::string> env = {})
        : nccl(std::move(build))
        , rankEnv(std::move(env))
    {
    }
};

std::string joined(std::vector<std::string> const& v)
{
    std::string out;
    for (std::string const& s : v)
    {
        out += (out.empty() ? "" : "|") + s;
    }
    return out;
}

void runGroup(GroupCase const& g, std::string const& name, Variant const& v = {})
{
    std::string const path = shmPath(name);
    std::vector<pid_t> children;
    for (int r = 0; r < g.nranks; ++r)
    {
        std::string const tuning = static_cast<size_t>(r) < g.tuning.size() ? g.tuning[static_cast<size_t>(r)] : "";
        std::string const env = static_cast<size_t>(r) < v.rankEnv.size() ? v.rankEnv[static_cast<size_t>(r)] : "";
        pid_t const pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0)
        {
            // A fresh process image (CUDA must not be used across fork): this binary, the Child test.
            setenv(kRankVar, std::to_string(r).c_str(), 1);
            setenv(kRanksVar, std::to_string(g.nranks).c_str(), 1);
            setenv(kShmVar, path.c_str(), 1);
            setenv(kExpectVar, g.expectGroup ? "group" : "nccl", 1);
            setenv(kLinesVar, joined(g.lines).c_str(), 1);
            setenv(kAbsentVar, joined(g.absent).c_str(), 1);
            setenv("EDGELLM_PLUGIN_PATH", testlib::pluginPath(), 1);
            // Every rank is on GPU 0, so the exchange must run at registration whatever the
            // machine's GPU count. The self-test keeps its default bound (50 ms; on an H200 the
            // ranks, time-slicing the GPU, pass it in a few ms) unless the environment sets one.
            setenv("EDGELLM_ALLREDUCE_EXCHANGE", "register", 1);
            unsetenv("EDGELLM_ALLREDUCE_STRATEGY");
            g.fault.empty() ? unsetenv(kFaultVar) : setenv(kFaultVar, g.fault.c_str(), 1);
            g.selftestMs.empty() ? unsetenv("EDGELLM_ALLREDUCE_SELFTEST_MS")
                                 : setenv("EDGELLM_ALLREDUCE_SELFTEST_MS", g.selftestMs.c_str(), 1);
            tuning.empty() ? unsetenv("EDGELLM_ALLREDUCE_TUNING") : setenv("EDGELLM_ALLREDUCE_TUNING", tuning.c_str(), 1);
            v.nccl.empty() ? unsetenv(kNcclVar) : setenv(kNcclVar, v.nccl.c_str(), 1);
            unsetenv("EDGELLM_TEST_SHM_NCCL_FAIL_CALL");
            for (std::string const& pair : split(env.c_str(), ';'))
            {
                size_t const eq = pair.find('=');
                setenv(pair.substr(0, eq).c_str(), eq == std::string::npos ? "" : pair.substr(eq + 1).c_str(), 1);
            }
            execl("/proc/self/exe", "child", "--gtest_filter=MultiProcessOneGpu.Child", static_cast<char*>(nullptr));
            _exit(127);
        }
        children.push_back(pid);
    }
    // Bounded: a child that hangs is killed, and that is a failure.
    auto const deadline = Clock::now() + std::chrono::seconds(kChildrenBoundSeconds);
    std::vector<int> status(children.size(), -1);
    std::vector<bool> done(children.size(), false);
    for (size_t left = children.size(); left > 0 && Clock::now() < deadline;)
    {
        for (size_t i = 0; i < children.size(); ++i)
        {
            if (!done[i] && waitpid(children[i], &status[i], WNOHANG) == children[i])
            {
                done[i] = true;
                --left;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (size_t i = 0; i < children.size(); ++i)
    {
        if (!done[i])
        {
            kill(children[i], SIGKILL);
            waitpid(children[i], &status[i], 0);
            ADD_FAILURE() << name << ": rank " << i << " did not finish within " << kChildrenBoundSeconds
                          << " s (a hang): killed";
            continue;
        }
        EXPECT_TRUE(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)
            << name << ": rank " << i << " failed (exit status " << status[i] << "; its output is above)";
    }
    unlink(path.c_str());
}

bool parentOnly()
{
    return std::getenv(kRankVar) == nullptr;
}

#define REQUIRE_PARENT_AND_GPU()                                                                                       \
    REQUIRE_GPU();                                                                                                     \
    if (!parentOnly())                                                                                                 \
    GTEST_SKIP() << "a child runs MultiProcessOneGpu.Child alone";                                                     \
    ASSERT_EQ(shm().error, "")

// The lines of a healthy group, and of one the self-test refused.
std::vector<std::string> const kReady = {"workspaces exchanged through NCCL"};
std::vector<std::string> const kNoFault = {"custom all-reduce unavailable", "peer self-test failed", "test hook"};
} // namespace

TEST(MultiProcessOneGpu, Child)
{
    char const* rank = std::getenv(kRankVar);
    char const* nranks = std::getenv(kRanksVar);
    char const* path = std::getenv(kShmVar);
    char const* expect = std::getenv(kExpectVar);
    if (rank == nullptr || nranks == nullptr || path == nullptr || expect == nullptr)
    {
        GTEST_SKIP() << "run by the other MultiProcessOneGpu tests, in a process of its own";
    }
    EXPECT_EQ(childRank(std::atoi(rank), std::atoi(nranks), path, std::string(expect) == "group"), "");
}

TEST(MultiProcessOneGpu, TwoRanksFormTheGroupAndSumExactly)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{2, true, kReady, kNoFault, "", {}, ""}, "healthy2");
}

TEST(MultiProcessOneGpu, FourRanksFormTheGroupAndSumExactly)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{4, true, kReady, kNoFault, "", {}, ""}, "healthy4");
}

TEST(MultiProcessOneGpu, ADroppedWriteMakesEveryRankUseNccl)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{2, false, {"the peer self-test failed: rank 0 -> rank 1", "(write lost)", "the NCCL path only"},
                 {"workspaces exchanged through NCCL"}, "drop:0>1", {}, ""},
        "drop2");
    runGroup(GroupCase{4, false, {"the peer self-test failed: rank 2 -> rank 1", "(write lost)"},
                 {"workspaces exchanged through NCCL"}, "drop:2>1", {}, ""},
        "drop4");
}

TEST(MultiProcessOneGpu, AGarbledWriteMakesEveryRankUseNccl)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{4, false, {"the peer self-test failed: rank 3 -> rank 0", "(write wrong)"},
                 {"workspaces exchanged through NCCL"}, "garble:3>0", {}, ""},
        "garble4");
}

TEST(MultiProcessOneGpu, AKernelNeverLaunchedMakesEveryRankUseNccl)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{2, false, {"the peer self-test failed: rank 1 (", "ran no self-test kernel"},
                 {"workspaces exchanged through NCCL"}, "not-launched:1", {}, ""},
        "notlaunched2");
}

TEST(MultiProcessOneGpu, AKernelStillRunningNeverHoldsUpTheVerdictsGather)
{
    REQUIRE_PARENT_AND_GPU();
    // What a peer load that never returns looks like to the host: rank 1's kernel waits for a
    // token rank 0 never writes, for its 8 s bound, while its host gives up after 50 ms. Rank 1
    // must still take part in the verdicts' gather at once (the setup scratch waits for its own
    // stream and copies on the legacy stream, which a non-blocking stream's kernel does not hold
    // up: a wait for the whole device would hold every rank for 8 s, past the setup bound), and
    // every rank uses NCCL; the group's memory is leaked, never freed under the kernel.
    runGroup(GroupCase{2, false, {"the peer self-test failed: rank 1's self-test kernel", "did not finish", "the NCCL path only"},
                 {"workspaces exchanged through NCCL"}, "drop:0>1,host-wait:50", {}, "8000"},
        "stillrunning2");
}

TEST(MultiProcessOneGpu, DifferentTuningFilesMakeEveryRankUseNccl)
{
    REQUIRE_PARENT_AND_GPU();
    char const* a = std::getenv("EDGELLM_TEST_TUNING_A");
    char const* b = std::getenv("EDGELLM_TEST_TUNING_B");
    if (a == nullptr || b == nullptr || *a == '\0' || *b == '\0')
    {
        GTEST_SKIP() << "needs EDGELLM_TEST_TUNING_A and _B: two valid tuning files of this machine whose tables "
                        "differ (tools/gpu/contract_check.sh makes them)";
    }
    // Each file must load (no refusal), or both ranks would have none and agree.
    std::vector<std::string> const loaded = {"AUTO uses its tables"};
    std::vector<std::string> const notRefused = {"AUTO uses its built-in tables"};
    std::vector<std::string> lines = loaded;
    lines.insert(lines.end(), {"rank 1 chooses kernels by other AUTO tables than rank 0: their tuning files differ",
                                  "EDGELLM_ALLREDUCE_TUNING", "the NCCL path only"});
    runGroup(GroupCase{2, false, lines, notRefused, "", {a, b}, ""}, "tuningAB");
    std::vector<std::string> absent = notRefused;
    absent.insert(absent.end(), kNoFault.begin(), kNoFault.end());
    std::vector<std::string> ready = loaded;
    ready.insert(ready.end(), kReady.begin(), kReady.end());
    runGroup(GroupCase{2, true, ready, absent, "", {a, a}, ""}, "tuningAA");
}

// --- Issue 39: an NCCL built on its own CUDA runtime, in applications that use the runtime --------
// The stand-in of libedgellm_shm_nccl_runtime.so waits for the library's stream with
// cudaStreamSynchronize and copies with synchronous cudaMemcpy on the legacy default stream (from
// pageable memory: it may return before its DMA lands). The children use the runtime before and
// after registering (cudaMemGetInfo, cudaMalloc; deviceStillWorks). At 6d35dd5 a rank's context
// died at the first setup gather (CUDA_ERROR_LAUNCH_FAILED) and its peer waited for a gather that
// never came; every case here must end with both ranks registered, correct sums and a working
// context.

TEST(MultiProcessOneGpu, ARuntimeNcclFormsTheGroup)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{2, true, kReady, kNoFault, "", {}, ""}, "runtime2", {"runtime"});
    runGroup(GroupCase{4, true, kReady, kNoFault, "", {}, ""}, "runtime4", {"runtime"});
}

TEST(MultiProcessOneGpu, ARuntimeNcclFormsTheGroupWithTheSelfTestOff)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{2, true, kReady, kNoFault, "", {}, "0"}, "runtime2_noselftest", {"runtime"});
}

TEST(MultiProcessOneGpu, ARuntimeNcclWithARankThatOptsOutUsesNcclEverywhere)
{
    REQUIRE_PARENT_AND_GPU();
    // Rank 1 has the custom kernels off (EDGELLM_ALLREDUCE_STRATEGY=NCCL): it takes part in the
    // exchange without a workspace, and every rank uses NCCL.
    std::vector<std::string> const absent = {"workspaces exchanged through NCCL", "failed with"};
    Variant const optOut{"runtime", {"", "EDGELLM_ALLREDUCE_STRATEGY=NCCL"}};
    runGroup(GroupCase{2, false, {}, absent, "", {}, ""}, "runtime2_optout", optOut);
    runGroup(GroupCase{2, false, {}, absent, "", {}, "0"}, "runtime2_optout_noselftest", optOut);
}

TEST(MultiProcessOneGpu, ARuntimeNcclWithASelfTestFaultUsesNcclEverywhere)
{
    REQUIRE_PARENT_AND_GPU();
    runGroup(GroupCase{2, false, {"the peer self-test failed: rank 0 -> rank 1", "(write lost)", "the NCCL path only"},
                 {"workspaces exchanged through NCCL"}, "drop:0>1", {}, ""},
        "runtime2_drop", {"runtime"});
}

TEST(MultiProcessOneGpu, AGatherThatFailsOnOneRankSendsEveryRankToNcclAndTheContextWorks)
{
    REQUIRE_PARENT_AND_GPU();
    // The stand-in's call K fails on rank 1 after every rank's data went through (an NCCL whose
    // local part failed). Rank 1 still makes every later gather, so rank 0 never waits for one;
    // both use NCCL (the sums run through it), each says why, and both contexts work
    // (deviceStillWorks). Each rank's own lines: EDGELLM_TEST_MP1_LINES in its environment.
    std::vector<std::string> const absent = {"workspaces exchanged through NCCL", "ncclAllReduce failed"};
    std::string const failed = "ncclAllGather failed with ncclResult_t 2 (ncclSystemError)|the NCCL path only";
    for (auto [call, seen] : {std::pair<char const*, char const*>{"0", "rank 1's first gather failed there"},
             {"1", "rank 1 stopped before the peer self-test"}})
    {
        for (char const* build : {"", "runtime"})
        {
            std::string const name = std::string("gatherfails") + call + (*build != '\0' ? "_runtime" : "");
            std::vector<std::string> const env = {std::string("EDGELLM_TEST_MP1_LINES=") + seen + "|the NCCL path only",
                std::string("EDGELLM_TEST_SHM_NCCL_FAIL_CALL=") + call + ";EDGELLM_TEST_MP1_LINES=" + failed};
            runGroup(GroupCase{2, false, {}, absent, "", {}, ""}, name, {build, env});
        }
    }
}
