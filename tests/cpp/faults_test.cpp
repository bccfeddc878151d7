// Fault injection at the C and C++ ABI, with no GPU needed (the GPU machine runs them too): null
// tensor arrays, volumes that overflow, a churn of failing calls, the fault query, communicators
// that cannot form a group (a stand-in NCCL describes any communicator: fake_nccl.cpp), and
// registrations racing unregistrations. Every call must return its failure value or succeed,
// log why, and never crash, hang or report a caught panic.

#include "library.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace nvinfer1;

namespace
{
//! Gives the library the suite's logger, with an empty log.
fake::Logger& freshLog()
{
    static bool const once = [] {
        auto init = testlib::symbol<bool (*)(void*, char const*)>("initEdgellmPlugins");
        return init != nullptr && init(&testlib::logger(), "");
    }();
    EXPECT_TRUE(once);
    testlib::logger().clear();
    return testlib::logger();
}

//! Lines of the log that contain `needle`.
size_t lines(std::string const& needle)
{
    size_t n = 0;
    for (auto const& m : testlib::logger().messages())
    {
        n += m.find(needle) != std::string::npos;
    }
    return n;
}

struct PluginDeleter
{
    void operator()(IPluginV3* p) const
    {
        delete p;
    }
};
using PluginPtr = std::unique_ptr<IPluginV3, PluginDeleter>;

PluginPtr plugin(int32_t tp)
{
    testlib::Fields f;
    f.i32("tp_size", tp);
    return PluginPtr(testlib::createPlugin(f));
}

//! The stand-in NCCL: its ncclAllReduce, and a communicator with the given answers.
struct FakeNccl
{
    struct Comm
    {
        int nranks, rank, device;
    };
    void* allReduce = nullptr;

    FakeNccl()
    {
        // Beside the test binary (tools/gpu/stage.sh copies it there too), opened RTLD_LOCAL: its
        // NCCL names interpose on nothing.
        std::string exe(4096, '\0');
        exe.resize(std::max<ssize_t>(0, readlink("/proc/self/exe", exe.data(), exe.size())));
        std::string const path = exe.substr(0, exe.rfind('/') + 1) + "libedgellm_fake_nccl.so";
        void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        EXPECT_NE(lib, nullptr) << dlerror();
        allReduce = lib != nullptr ? dlsym(lib, "ncclAllReduce") : nullptr;
    }
};

FakeNccl& nccl()
{
    static FakeNccl instance;
    return instance;
}

//! The registration API, and how many ranks a device's custom group has.
struct Registration
{
    bool (*reg)(int, void*, void*) = testlib::symbol<bool (*)(int, void*, void*)>("edgellmRegisterNcclCommForAllReducePlugin");
    bool (*unreg)(int, void*) = testlib::symbol<bool (*)(int, void*)>("edgellmUnregisterNcclCommForAllReducePlugin");
    int (*ranks)(int) = testlib::symbol<int (*)(int)>("edgellmAllReduceCustomRanks");
    void* allReduce = nccl().allReduce;
};
} // namespace

TEST(Faults, NullTensorArraysAreRejectedAndSaySo)
{
    fake::Logger& logger = freshLog();
    PluginPtr p = plugin(2);
    ASSERT_NE(p, nullptr);
    auto v = testlib::views(p.get());
    DynamicPluginTensorDesc d = testlib::dynamicTensor({1, 4096}, DataType::kHALF);
    EXPECT_EQ(v.build->configurePlugin(nullptr, 1, &d, 1), -1);
    EXPECT_EQ(v.build->configurePlugin(&d, 1, nullptr, 1), -1);
    EXPECT_TRUE(logger.saw("AllReducePlugin::configurePlugin: null tensor array from TensorRT"));
    EXPECT_FALSE(v.build->supportsFormatCombination(0, nullptr, 1, 1));
    EXPECT_TRUE(logger.saw("AllReducePlugin::supportsFormatCombination: null tensor array"));
    DataType out[1];
    EXPECT_EQ(v.build->getOutputDataTypes(out, 1, nullptr, 1), -1);
    EXPECT_TRUE(logger.saw("AllReducePlugin::getOutputDataTypes: null tensor array"));
    EXPECT_EQ(v.build->configurePlugin(&d, -1, &d, 1), -1);
    EXPECT_TRUE(logger.saw("invalid tensor counts from TensorRT (-1, 1)"));
    EXPECT_EQ(v.runtime->enqueue(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr), -1);
    EXPECT_TRUE(logger.saw("AllReducePlugin::enqueue: null tensor array"));
}

TEST(Faults, CountsNearInt32MaxAreRejectedWithoutOverflow)
{
    // A count near INT32_MAX made the sum of the two counts overflow, pass the limit, and read
    // or write far past 16-entry arrays. Each entry point must refuse before touching an array.
    fake::Logger& logger = freshLog();
    PluginPtr p = plugin(2);
    ASSERT_NE(p, nullptr);
    auto v = testlib::views(p.get());
    DynamicPluginTensorDesc d = testlib::dynamicTensor({1, 4096}, DataType::kHALF);
    PluginTensorDesc t = testlib::tensor({1, 4096}, DataType::kHALF);
    DataType types[1] = {DataType::kHALF};
    fake::ExprBuilder builder;
    DimsExprs shape = builder.dims({1, 4096});
    for (auto const& [a, b] : {std::pair<int32_t, int32_t>{1, INT32_MAX}, {INT32_MAX, 1}, {INT32_MAX, INT32_MAX},
             {17, 0}, {0, 17}, {INT32_MAX - 15, 16}})
    {
        logger.clear();
        EXPECT_EQ(v.build->getOutputDataTypes(types, b, types, a), -1);
        EXPECT_EQ(v.build->getOutputShapes(&shape, a, nullptr, 0, &shape, b, builder), -1);
        EXPECT_EQ(v.build->configurePlugin(&d, a, &d, b), -1);
        EXPECT_FALSE(v.build->supportsFormatCombination(0, &d, a, b));
        EXPECT_EQ(v.runtime->onShapeChange(&t, a, &t, b), -1);
        EXPECT_GE(lines("invalid tensor counts from TensorRT"), 5U) << a << ", " << b;
    }
}

TEST(Faults, UnalignedFusedTensorsAreRejectedAndNamed)
{
    // The fused op needs 16-byte aligned tensors: every misaligned one is named in the log line
    // of its rejection (distinct tensors are distinct kinds of line, none counted away).
    fake::Logger& logger = freshLog();
    testlib::Fields f;
    f.i32("tp_size", 2).i32("fusion_op", 1).f32("eps", 1e-6F);
    PluginPtr p(testlib::createPlugin(f));
    ASSERT_NE(p, nullptr);
    auto v = testlib::views(p.get());
    PluginTensorDesc in[3] = {testlib::tensor({2, 4096}, DataType::kHALF), testlib::tensor({2, 4096}, DataType::kHALF),
        testlib::tensor({4096}, DataType::kHALF)};
    PluginTensorDesc out[2] = {in[0], in[0]};
    char const* const names[5] = {"x (input 0)", "residual (input 1)", "gamma (input 2)", "normed (output 0)",
        "residual_out (output 1)"};
    for (int bad = 0; bad < 5; ++bad)
    {
        uintptr_t addr[5] = {0x10000, 0x20000, 0x30000, 0x40000, 0x50000};
        addr[bad] += 8;
        void const* inputs[3] = {reinterpret_cast<void const*>(addr[0]), reinterpret_cast<void const*>(addr[1]),
            reinterpret_cast<void const*>(addr[2])};
        void* outputs[2] = {reinterpret_cast<void*>(addr[3]), reinterpret_cast<void*>(addr[4])};
        logger.clear();
        EXPECT_EQ(v.runtime->enqueue(in, out, inputs, outputs, nullptr, nullptr), -1);
        EXPECT_TRUE(logger.saw(std::string("needs 16-byte aligned tensors; not aligned: ") + names[bad]))
            << names[bad];
    }
}

TEST(Faults, VolumesThatOverflowAreRejectedNotTruncated)
{
    freshLog();
    // tp_size 1: the copy path, which would otherwise copy count * element size bytes, wrapped.
    PluginPtr p = plugin(1);
    ASSERT_NE(p, nullptr);
    auto v = testlib::views(p.get());
    void const* in[1] = {reinterpret_cast<void const*>(0x1000)};
    void* out[1] = {reinterpret_cast<void*>(0x2000)};
    for (auto const& d : {testlib::tensor({int64_t(1) << 31, int64_t(1) << 31}, DataType::kFLOAT),
             testlib::tensor({INT64_MAX, 2}, DataType::kHALF), testlib::tensor({INT64_MAX, INT64_MAX}, DataType::kBF16)})
    {
        EXPECT_EQ(v.runtime->enqueue(&d, &d, in, out, nullptr, nullptr), -1);
        EXPECT_EQ(v.runtime->onShapeChange(&d, 1, &d, 1), -1);
    }
    EXPECT_GE(lines("a tensor of 4611686018427387904 elements of 4 bytes is larger than 2^63 - 1 bytes"), 1U);
    EXPECT_GE(lines("a tensor of 18446744073709551614 elements of 2 bytes is larger than 2^63 - 1 bytes"), 1U);
    EXPECT_GE(lines("tensor has an invalid shape"), 1U) << "INT64_MAX x INT64_MAX overflows the element count";
}

TEST(Faults, AChurnOfFailingCallsIsCountedNotRepeated)
{
    freshLog();
    PluginPtr p = plugin(2);
    ASSERT_NE(p, nullptr);
    auto v = testlib::views(p.get());
    PluginTensorDesc d = testlib::tensor({1, 4096}, DataType::kHALF);
    for (int i = 0; i < 1000; ++i)
    {
        EXPECT_EQ(v.runtime->onShapeChange(nullptr, 1, &d, 1), -1);
    }
    // The first nine of a kind, then the 10th, 100th and 1000th with the count (fewer when other
    // tests of this process logged the kind before).
    size_t const logged = lines("AllReducePlugin::onShapeChange: null tensor array");
    EXPECT_LE(logged, 9U + 3U);
    EXPECT_GE(logged, 3U);
    EXPECT_EQ(lines("[1000 times so far: repeats are counted, not logged]"), 1U);
}

TEST(Faults, TheFaultQueryNeedsNoGpu)
{
    auto lastError = testlib::symbol<int (*)(int)>("edgellmAllReduceLastError");
    ASSERT_NE(lastError, nullptr);
    EXPECT_EQ(lastError(-1), -1) << "a negative device";
    EXPECT_EQ(lastError(INT_MAX), -1) << "a device past the fault words";
    EXPECT_EQ(lastError(63), 0) << "no group has run on it";
}

TEST(Faults, CommunicatorsThatCannotFormAGroupAreRegisteredAndSayWhy)
{
    fake::Logger& logger = freshLog();
    Registration const a;
    ASSERT_NE(a.allReduce, nullptr);
    FakeNccl::Comm huge{INT_MAX, 0, 40}, outside{2, 5, 40}, elsewhere{2, 0, 3};
    // A communicator that says it has 2^31 - 1 ranks: nothing is sized by that count.
    EXPECT_TRUE(a.reg(40, &huge, a.allReduce));
    EXPECT_TRUE(logger.saw("a communicator of 2147483647 ranks: no custom kernels for that count"));
    EXPECT_TRUE(a.reg(40, &outside, a.allReduce)) << "rank 5 of 2";
    EXPECT_TRUE(a.reg(40, &elsewhere, a.allReduce)) << "a communicator of another device";
    EXPECT_TRUE(logger.saw("device 40: its communicator is on device 3"));
    EXPECT_EQ(a.ranks(40), 0);
    EXPECT_TRUE(a.unreg(40, &elsewhere));
    // Both ranks of a communicator in this process: the group's setup fails (no driver on a CPU
    // machine, no devices 41 and 42 on a GPU one), says why, and the registrations stand.
    FakeNccl::Comm r0{2, 0, 41}, r1{2, 1, 42};
    EXPECT_TRUE(a.reg(41, &r0, a.allReduce));
    EXPECT_TRUE(a.reg(42, &r1, a.allReduce));
    EXPECT_TRUE(logger.saw("custom all-reduce unavailable"));
    EXPECT_EQ(a.ranks(41), 0);
    EXPECT_EQ(a.ranks(42), 0);
    EXPECT_FALSE(logger.saw("panic")) << "every failure is an error, never a caught panic";
    EXPECT_TRUE(a.unreg(41, &r0));
    EXPECT_TRUE(a.unreg(42, &r1));
}

TEST(Faults, RegistrationsRacingUnregistrationsStayConsistent)
{
    fake::Logger& logger = freshLog();
    Registration const a;
    ASSERT_NE(a.allReduce, nullptr);
    // Two ranks of one communicator on devices 50 and 51, each registered and unregistered in a
    // loop by two threads: every registration forms (or fails to form) the group while others
    // remove its ranks.
    FakeNccl::Comm comms[2] = {{2, 0, 50}, {2, 1, 51}};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
    {
        threads.emplace_back([&, t] {
            int const r = t % 2;
            for (int i = 0; i < 100; ++i)
            {
                EXPECT_TRUE(a.reg(50 + r, &comms[r], a.allReduce));
                a.unreg(50 + r, &comms[r]); // false when the other thread of this rank was first
            }
        });
    }
    for (auto& th : threads)
    {
        th.join();
    }
    a.unreg(50, &comms[0]);
    a.unreg(51, &comms[1]);
    EXPECT_EQ(a.ranks(50), 0);
    EXPECT_EQ(a.ranks(51), 0);
    EXPECT_FALSE(logger.saw("panic"));
}

// Run by ctest with a stand-in driver (standin_driver.cpp) whose functions return a status no
// CUDA release lists: every call that reaches the driver fails with the number in its message.
// Skipped elsewhere (the machine's own driver, or none, answers there).
TEST(StandInDriver, AnUnlistedStatusIsAnErrorWithItsNumber)
{
    if (std::getenv("EDGELLM_TEST_STANDIN_DRIVER") == nullptr)
    {
        GTEST_SKIP() << "needs the stand-in driver (ctest plugin_trt*_standin_driver)";
    }
    fake::Logger& logger = freshLog();
    Registration r;
    FakeNccl::Comm comm{2, 0, 0}; // rank 0 of 2 on device 0: no group forms without rank 1
    ASSERT_TRUE(r.reg(0, &comm, r.allReduce));
    PluginTensorDesc d = testlib::tensor({1, 4096}, DataType::kHALF);
    void const* in[1] = {reinterpret_cast<void const*>(0x10000)};
    void* out[1] = {reinterpret_cast<void*>(0x20000)};
    for (int tp : {1, 2})
    {
        PluginPtr p = plugin(tp);
        ASSERT_NE(p, nullptr);
        auto v = testlib::views(p.get());
        logger.clear();
        EXPECT_EQ(v.runtime->enqueue(&d, &d, in, out, nullptr, nullptr), -1) << "tp_size " << tp;
        EXPECT_TRUE(logger.saw("CUDA error 987654, which the driver does not name")) << "tp_size " << tp;
    }
    EXPECT_TRUE(r.unreg(0, &comm));
}

