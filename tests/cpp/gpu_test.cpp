// GPU tests: run on the H200 (tools/gpu/run_gpu_tests.sh); without a GPU, ctest's *_gpu entries
// report them skipped (main.cpp). The plugin is driven exactly as TensorRT drives it (enqueue on
// a stream with device buffers), the NCCL path with a real one-rank communicator from the process's NCCL (EDGELLM_TEST_NCCL_LIBRARY or
// libnccl.so.2), registered the Edge-LLM way.

#include "gpu.h"
#include "library.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace nvinfer1;

namespace
{
#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

struct PluginDeleter
{
    void operator()(IPluginV3* p) const { delete p; }
};
using PluginPtr = std::unique_ptr<IPluginV3, PluginDeleter>;

PluginPtr makePlugin(int32_t tpSize)
{
    testlib::Fields f;
    f.i32("tp_size", tpSize);
    return PluginPtr(testlib::createPlugin(f));
}

size_t sizeOf(DataType t)
{
    return t == DataType::kFLOAT ? 4 : 2;
}

//! Random finite values as raw bits (exponent never all ones), any sign, zeros and denormals too.
std::vector<uint8_t> randomTensor(size_t count, DataType t, uint32_t seed)
{
    std::mt19937 rng(seed);
    std::vector<uint8_t> bytes(count * sizeOf(t));
    for (size_t i = 0; i < count; ++i)
    {
        if (t == DataType::kFLOAT)
        {
            uint32_t v = rng();
            if (((v >> 23) & 0xff) == 0xff)
            {
                v &= ~(1U << 30);
            }
            std::memcpy(&bytes[4 * i], &v, 4);
        }
        else
        {
            auto v = static_cast<uint16_t>(rng());
            uint16_t const expMask = t == DataType::kHALF ? 0x7c00 : 0x7f80;
            if ((v & expMask) == expMask)
            {
                v &= static_cast<uint16_t>(~0x4000);
            }
            std::memcpy(&bytes[2 * i], &v, 2);
        }
    }
    return bytes;
}

struct DeviceBuffer
{
    void* ptr = nullptr;
    explicit DeviceBuffer(size_t bytes) { cudaMalloc(&ptr, bytes); }
    ~DeviceBuffer() { cudaFree(ptr); }
};

//! Runs one enqueue of `plugin` on `stream` with `input` and returns the output bytes.
int32_t runEnqueue(IPluginV3* plugin, std::vector<int64_t> const& dims, DataType t, void const* in, void* out,
    cudaStream_t stream)
{
    PluginTensorDesc d = testlib::tensor(dims, t);
    void const* ins[1] = {in};
    void* outs[1] = {out};
    return testlib::views(plugin).runtime->enqueue(&d, &d, ins, outs, nullptr, stream);
}

// --- NCCL, loaded as Edge-LLM's runtime loads it -------------------------------------------------
using ncclComm_t = void*;
using AllReduceFn = int (*)(void const*, void*, size_t, int, int, void*, cudaStream_t);
std::atomic<int> gNcclCalls{0};
std::atomic<int> gLastDtype{-1};
AllReduceFn gRealAllReduce = nullptr;

//! Stands in for ncclAllReduce in the registry: counts calls and forwards to NCCL.
int countingAllReduce(void const* s, void* r, size_t n, int dtype, int op, void* comm, cudaStream_t st)
{
    ++gNcclCalls;
    gLastDtype = dtype;
    return gRealAllReduce(s, r, n, dtype, op, comm, st);
}

void* loadNccl()
{
    char const* path = std::getenv("EDGELLM_TEST_NCCL_LIBRARY");
    return dlopen(path != nullptr ? path : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
}

//! A driver function through the runtime (the test links no libcuda), or null.
template <typename Fn>
Fn driverFunction(char const* name)
{
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cudaGetDriverEntryPointByVersion(name, &f, 12030, cudaEnableDefault, &found);
    return found == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(f) : nullptr;
}

//! Which kernels `enqueue` really launches on `stream`: it is captured into a CUDA graph whose
//! kernel nodes the driver names; then the graph runs (so every rank's calls stay paired, and
//! the caller can check what it computed). `status` is enqueue's return value. A name "?" is a
//! kernel the driver could not name; a capture that fails gives {"<capture failed>"}.
std::vector<std::string> launchedKernels(cudaStream_t stream, std::function<int32_t()> const& enqueue, int32_t& status)
{
    using NodeParams = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
    using FuncName = CUresult (*)(char const**, CUfunction);
    using KernelName = CUresult (*)(char const**, CUkernel);
    static auto const nodeParams = driverFunction<NodeParams>("cuGraphKernelNodeGetParams");
    static auto const funcName = driverFunction<FuncName>("cuFuncGetName");
    static auto const kernelName = driverFunction<KernelName>("cuKernelGetName");
    cudaGraph_t graph = nullptr;
    if (nodeParams == nullptr || funcName == nullptr
        || cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    {
        return {"<capture failed>"};
    }
    status = enqueue();
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || graph == nullptr)
    {
        return {"<capture failed>"};
    }
    size_t n = 0;
    cudaGraphGetNodes(graph, nullptr, &n);
    std::vector<cudaGraphNode_t> nodes(n);
    cudaGraphGetNodes(graph, nodes.data(), &n);
    std::vector<std::string> names;
    for (cudaGraphNode_t node : nodes)
    {
        cudaGraphNodeType type{};
        CUDA_KERNEL_NODE_PARAMS params{};
        if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel
            || nodeParams(node, &params) != CUDA_SUCCESS)
        {
            continue;
        }
        char const* name = nullptr;
        bool const named = params.func != nullptr ? funcName(&name, params.func) == CUDA_SUCCESS
                                                  : kernelName != nullptr && kernelName(&name, params.kern) == CUDA_SUCCESS;
        names.emplace_back(named && name != nullptr ? name : "?");
    }
    cudaGraphExec_t exec = nullptr;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess || cudaGraphLaunch(exec, stream) != cudaSuccess)
    {
        names.emplace_back("<graph launch failed>");
    }
    cudaStreamSynchronize(stream);
    if (exec != nullptr)
    {
        cudaGraphExecDestroy(exec);
    }
    cudaGraphDestroy(graph);
    return names;
}

//! "" when the custom kernels among `names` (those named ear_*) are exactly one, named
//! `prefix`*, or, for prefix "", when there is none (the NCCL path); else what was found.
std::string customPathIs(std::vector<std::string> const& names, std::string const& prefix)
{
    std::vector<std::string> custom;
    std::copy_if(names.begin(), names.end(), std::back_inserter(custom),
        [](std::string const& n) { return n.rfind("ear_", 0) == 0; });
    bool const ok = prefix.empty() ? custom.empty() : custom.size() == 1 && custom[0].rfind(prefix, 0) == 0;
    if (ok)
    {
        return "";
    }
    std::string all;
    for (std::string const& n : names)
    {
        all += n + " ";
    }
    return "expected " + (prefix.empty() ? std::string("no custom kernel") : prefix + "*") + ", launched: " + all;
}
} // namespace

TEST(Gpu, PassthroughCopiesTheInputForOneRank)
{
    REQUIRE_GPU();
    PluginPtr p = makePlugin(1);
    ASSERT_NE(p, nullptr);
    cudaStream_t stream{};
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    {
        for (size_t count : {size_t{1}, size_t{4097}, size_t{3} * 4096})
        {
            auto host = randomTensor(count, t, static_cast<uint32_t>(count));
            size_t const bytes = host.size();
            DeviceBuffer in(bytes), out(bytes);
            CUDA_OK(cudaMemcpy(in.ptr, host.data(), bytes, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(out.ptr, 0xff, bytes));
            ASSERT_EQ(runEnqueue(p.get(), {1, static_cast<int64_t>(count)}, t, in.ptr, out.ptr, stream), 0);
            CUDA_OK(cudaStreamSynchronize(stream));
            std::vector<uint8_t> got(bytes);
            CUDA_OK(cudaMemcpy(got.data(), out.ptr, bytes, cudaMemcpyDeviceToHost));
            EXPECT_EQ(got, host) << "type " << static_cast<int>(t) << " count " << count;
            // In place is a no-op that leaves the data alone.
            ASSERT_EQ(runEnqueue(p.get(), {static_cast<int64_t>(count)}, t, out.ptr, out.ptr, stream), 0);
            CUDA_OK(cudaStreamSynchronize(stream));
            CUDA_OK(cudaMemcpy(got.data(), out.ptr, bytes, cudaMemcpyDeviceToHost));
            EXPECT_EQ(got, host);
        }
    }
    CUDA_OK(cudaStreamDestroy(stream));
}

TEST(Gpu, PassthroughIsCapturedInACudaGraph)
{
    REQUIRE_GPU();
    PluginPtr p = makePlugin(1);
    cudaStream_t stream{};
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    size_t const count = 8192;
    DeviceBuffer in(count * 2), out(count * 2);
    cudaGraph_t graph{};
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    ASSERT_EQ(runEnqueue(p.get(), {static_cast<int64_t>(count)}, DataType::kHALF, in.ptr, out.ptr, stream), 0);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec{};
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (uint32_t replay = 0; replay < 5; ++replay)
    {
        auto host = randomTensor(count, DataType::kHALF, 100 + replay);
        CUDA_OK(cudaMemcpy(in.ptr, host.data(), host.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(out.ptr, 0, host.size()));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        std::vector<uint8_t> got(host.size());
        CUDA_OK(cudaMemcpy(got.data(), out.ptr, got.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(got, host) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
}

TEST(Gpu, UnregisteredDeviceFailsCleanly)
{
    REQUIRE_GPU();
    int device = 0;
    CUDA_OK(cudaGetDevice(&device));
    void* comm = testlib::symbol<void* (*) (int)>("_ZN11trt_edgellm7plugins20getNcclCommForDeviceEi")(device);
    ASSERT_EQ(comm, nullptr) << "nothing may be registered for this test";
    PluginPtr p = makePlugin(2);
    DeviceBuffer in(4096 * 2), out(4096 * 2);
    CUDA_OK(cudaMemset(out.ptr, 0x7f, 4096 * 2));
    EXPECT_EQ(runEnqueue(p.get(), {1, 4096}, DataType::kHALF, in.ptr, out.ptr, nullptr), -1);
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t first = 0;
    CUDA_OK(cudaMemcpy(&first, out.ptr, 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(first, 0x7f7f) << "a failed enqueue writes nothing";
}

TEST(Gpu, NcclOneRankCommunicatorForEveryType)
{
    REQUIRE_GPU();
    void* nccl = loadNccl();
    if (nccl == nullptr)
    {
        GTEST_SKIP() << "no NCCL library (set EDGELLM_TEST_NCCL_LIBRARY)";
    }
    using InitAll = int (*)(ncclComm_t*, int, int const*);
    using Destroy = int (*)(ncclComm_t);
    auto initAll = reinterpret_cast<InitAll>(dlsym(nccl, "ncclCommInitAll"));
    auto destroy = reinterpret_cast<Destroy>(dlsym(nccl, "ncclCommDestroy"));
    gRealAllReduce = reinterpret_cast<AllReduceFn>(dlsym(nccl, "ncclAllReduce"));
    ASSERT_TRUE(initAll && destroy && gRealAllReduce);
    int device = 0;
    CUDA_OK(cudaGetDevice(&device));
    ncclComm_t comm = nullptr;
    ASSERT_EQ(initAll(&comm, 1, &device), 0);
    auto reg = testlib::symbol<bool (*)(int, void*, void*)>("edgellmRegisterNcclCommForAllReducePlugin");
    auto unreg = testlib::symbol<bool (*)(int, void*)>("edgellmUnregisterNcclCommForAllReducePlugin");
    ASSERT_TRUE(reg(device, comm, reinterpret_cast<void*>(&countingAllReduce)));

    PluginPtr p = makePlugin(2);
    cudaStream_t stream{};
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    struct Case
    {
        DataType type;
        int ncclCode;
    };
    for (Case c : {Case{DataType::kHALF, 6}, Case{DataType::kFLOAT, 7}, Case{DataType::kBF16, 9}})
    {
        size_t const count = 3 * 4096 + 5;
        auto host = randomTensor(count, c.type, 7 + c.ncclCode);
        DeviceBuffer in(host.size()), out(host.size());
        CUDA_OK(cudaMemcpy(in.ptr, host.data(), host.size(), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(out.ptr, 0xff, host.size()));
        int const before = gNcclCalls;
        ASSERT_EQ(runEnqueue(p.get(), {static_cast<int64_t>(count)}, c.type, in.ptr, out.ptr, stream), 0);
        CUDA_OK(cudaStreamSynchronize(stream));
        EXPECT_EQ(gNcclCalls - before, 1) << "enqueue went through the registered ncclAllReduce";
        EXPECT_EQ(gLastDtype, c.ncclCode);
        std::vector<uint8_t> got(host.size());
        CUDA_OK(cudaMemcpy(got.data(), out.ptr, got.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(got, host) << "a one-rank sum is the input, type " << static_cast<int>(c.type);
    }
    EXPECT_TRUE(unreg(device, comm));
    PluginPtr q = makePlugin(2);
    DeviceBuffer in(64), out(64);
    EXPECT_EQ(runEnqueue(q.get(), {32}, DataType::kHALF, in.ptr, out.ptr, stream), -1) << "unregistered again";
    cudaStreamDestroy(stream);
    destroy(comm);
}

namespace
{
int gpuCount()
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

//! Exactly representable in FP16, BF16 and FP32, and so are sums of a few ranks: exact results.
float rankValue(int rank, size_t i)
{
    return static_cast<float>(static_cast<int>(i % 17) - 8) * 0.25F * static_cast<float>(rank + 1);
}

std::vector<uint8_t> encode(std::vector<float> const& v, DataType t)
{
    std::vector<uint8_t> out(v.size() * sizeOf(t));
    for (size_t i = 0; i < v.size(); ++i)
    {
        uint32_t bits = 0;
        std::memcpy(&bits, &v[i], 4);
        if (t == DataType::kFLOAT)
        {
            std::memcpy(&out[4 * i], &bits, 4);
        }
        else if (t == DataType::kBF16)
        {
            auto b = static_cast<uint16_t>(bits >> 16); // exact: the values have few mantissa bits
            std::memcpy(&out[2 * i], &b, 2);
        }
        else
        {
            // FP16 of a value with few mantissa bits and a small exponent: rebuild the fields.
            uint32_t const sign = (bits >> 16) & 0x8000U;
            int32_t const exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
            uint32_t const mant = (bits >> 13) & 0x3ffU;
            auto h = static_cast<uint16_t>(v[i] == 0.F ? 0 : (sign | (static_cast<uint32_t>(exp) << 10) | mant));
            std::memcpy(&out[2 * i], &h, 2);
        }
    }
    return out;
}
} // namespace

// --- Fused all-reduce + residual (+ bias) + RMSNorm ------------------------------------------
namespace
{
float toFloat(uint16_t bits, DataType t)
{
    return t == DataType::kHALF ? __half2float(__ushort_as_half(bits)) : __bfloat162float(__ushort_as_bfloat16(bits));
}

uint16_t fromFloat(float v, DataType t)
{
    return t == DataType::kHALF ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

//! Values of `n` elements of type t, random in [-2, 2), rounded to t; as raw bytes and as floats.
struct Tensor
{
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};

Tensor randomValues(size_t n, DataType t, uint32_t seed)
{
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-2.F, 2.F);
    Tensor out{std::vector<uint8_t>(n * sizeOf(t)), std::vector<float>(n)};
    for (size_t i = 0; i < n; ++i)
    {
        float v = dist(rng);
        if (t == DataType::kFLOAT)
        {
            std::memcpy(&out.bytes[4 * i], &v, 4);
        }
        else
        {
            uint16_t b = fromFloat(v, t);
            v = toFloat(b, t);
            std::memcpy(&out.bytes[2 * i], &b, 2);
        }
        out.values[i] = v;
    }
    return out;
}

std::vector<double> decodeAll(std::vector<uint8_t> const& bytes, DataType t)
{
    std::vector<double> out(bytes.size() / sizeOf(t));
    for (size_t i = 0; i < out.size(); ++i)
    {
        if (t == DataType::kFLOAT)
        {
            float f = 0;
            std::memcpy(&f, &bytes[4 * i], 4);
            out[i] = f;
        }
        else
        {
            uint16_t b = 0;
            std::memcpy(&b, &bytes[2 * i], 2);
            out[i] = toFloat(b, t);
        }
    }
    return out;
}

double tolerance(DataType t)
{
    return t == DataType::kFLOAT ? 1e-5 : t == DataType::kHALF ? 2e-3 : 1e-2;
}

//! ||got - ref|| / ||ref||.
double relError(std::vector<double> const& got, std::vector<double> const& ref)
{
    double e = 0, n = 0;
    for (size_t i = 0; i < ref.size(); ++i)
    {
        e += (got[i] - ref[i]) * (got[i] - ref[i]);
        n += ref[i] * ref[i];
    }
    return std::sqrt(e / std::max(n, 1e-30));
}

struct FusedCase
{
    size_t tokens, hidden;
    bool bias;
    DataType type;
};

//! The per-rank inputs of one fused case and the fp64 reference of both outputs.
struct FusedData
{
    std::vector<Tensor> x; // per rank
    Tensor residual, gamma, bias;
    std::vector<double> residualOut, normed;
};

FusedData fusedData(FusedCase const& c, int ranks, float eps, uint32_t seed)
{
    FusedData d;
    size_t const n = c.tokens * c.hidden;
    for (int r = 0; r < ranks; ++r)
    {
        d.x.push_back(randomValues(n, c.type, seed + 17 * r));
    }
    d.residual = randomValues(n, c.type, seed + 1000);
    d.gamma = randomValues(c.hidden, c.type, seed + 2000);
    d.bias = randomValues(c.hidden, c.type, seed + 3000);
    d.residualOut.resize(n);
    d.normed.resize(n);
    for (size_t row = 0; row < c.tokens; ++row)
    {
        double ss = 0;
        for (size_t j = 0; j < c.hidden; ++j)
        {
            size_t const i = row * c.hidden + j;
            double v = d.residual.values[i] + (c.bias ? d.bias.values[j] : 0.0);
            for (int r = 0; r < ranks; ++r)
            {
                v += d.x[r].values[i];
            }
            d.residualOut[i] = v;
            ss += v * v;
        }
        double const scale = 1.0 / std::sqrt(ss / static_cast<double>(c.hidden) + eps);
        for (size_t j = 0; j < c.hidden; ++j)
        {
            size_t const i = row * c.hidden + j;
            d.normed[i] = d.residualOut[i] * scale * d.gamma.values[j];
        }
    }
    return d;
}

//! Runs the fused plugin for one rank on the current device; returns (normed, residual_out).
//! With `kernels`, the enqueue is captured and run as a graph on `stream`, and `kernels` gets
//! the names of the kernels it launched (launchedKernels).
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> runFused(IPluginV3* plugin, FusedCase const& c,
    FusedData const& d, int rank, cudaStream_t stream = nullptr, std::vector<std::string>* kernels = nullptr)
{
    size_t const bytes = c.tokens * c.hidden * sizeOf(c.type);
    size_t const wbytes = c.hidden * sizeOf(c.type);
    DeviceBuffer x(bytes), res(bytes), gamma(wbytes), bias(wbytes), normed(bytes), resOut(bytes);
    cudaMemcpy(x.ptr, d.x[rank].bytes.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(res.ptr, d.residual.bytes.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(gamma.ptr, d.gamma.bytes.data(), wbytes, cudaMemcpyHostToDevice);
    cudaMemcpy(bias.ptr, d.bias.bytes.data(), wbytes, cudaMemcpyHostToDevice);
    cudaMemset(normed.ptr, 0xff, bytes);
    cudaMemset(resOut.ptr, 0xff, bytes);
    PluginTensorDesc xd = testlib::tensor({static_cast<int64_t>(c.tokens), static_cast<int64_t>(c.hidden)}, c.type);
    PluginTensorDesc wd = testlib::tensor({static_cast<int64_t>(c.hidden)}, c.type);
    PluginTensorDesc in[4] = {xd, xd, wd, wd};
    PluginTensorDesc out[2] = {xd, xd};
    void const* ins[4] = {x.ptr, res.ptr, gamma.ptr, bias.ptr};
    void* outs[2] = {normed.ptr, resOut.ptr};
    std::pair<std::vector<uint8_t>, std::vector<uint8_t>> result;
    cudaDeviceSynchronize(); // the copies and poison above are in place before `stream` runs
    auto enqueue = [&] { return testlib::views(plugin).runtime->enqueue(in, out, ins, outs, nullptr, stream); };
    int32_t status = -1;
    if (kernels != nullptr)
    {
        *kernels = launchedKernels(stream, enqueue, status);
    }
    else
    {
        status = enqueue();
    }
    if (status != 0)
    {
        return result;
    }
    cudaDeviceSynchronize();
    result.first.resize(bytes);
    result.second.resize(bytes);
    cudaMemcpy(result.first.data(), normed.ptr, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(result.second.data(), resOut.ptr, bytes, cudaMemcpyDeviceToHost);
    return result;
}

PluginPtr makeFused(int32_t tp, int32_t strategy, bool bias, float eps)
{
    testlib::Fields f;
    f.i32("tp_size", tp).i32("strategy", strategy).i32("fusion_op", 1).i32("has_bias", bias ? 1 : 0).f32("eps", eps);
    return PluginPtr(testlib::createPlugin(f));
}

std::vector<FusedCase> fusedCases()
{
    std::vector<FusedCase> cases;
    for (DataType t : {DataType::kHALF, DataType::kBF16, DataType::kFLOAT})
    {
        for (auto [tokens, hidden] : {std::pair<size_t, size_t>{1, 4096}, {3, 1000}, {16, 5120}, {128, 8192}})
        {
            cases.push_back({tokens, hidden, tokens % 2 == 1, t});
        }
    }
    return cases;
}
} // namespace

namespace
{
//! The kernel a 2-rank plain all-reduce of `bytes` must launch under `strategy` ("": NCCL's).
std::string plainKernel(int32_t strategy, size_t bytes, bool custom)
{
    switch (custom ? strategy : 0)
    {
    case 1: return "ear_oneshot_barrier_";
    case 2: return "ear_twoshot_polled_";
    case 3: return bytes <= (size_t{2} << 20) ? "ear_oneshot_lamport_" : "ear_twoshot_polled_"; // AUTO_TABLE, 2 ranks
    default: return "";
    }
}

//! The one custom kernel a 2-rank fused call of `bytes` must launch under `strategy`.
std::string fusedKernel(int32_t strategy, size_t bytes, bool custom)
{
    switch (custom ? strategy : 0)
    {
    case 1: return "ear_oneshot_barrier_norm_";
    case 2: return "ear_twoshot_barrier_norm_";
    case 3: return bytes <= (size_t{2} << 20) ? "ear_oneshot_lamport_norm_" : "ear_oneshot_barrier_norm_"; // FUSED_AUTO_TABLE
    default: return "ear_residual_rmsnorm_"; // after NCCL
    }
}
} // namespace

// Two real GPUs, one thread per rank as Edge-LLM drives them, communicators from
// ncclCommInitAll registered the Edge-LLM way: every strategy (NCCL, ONESHOT, TWOSHOT, AUTO) and
// type sums rank-dependent inputs exactly, both ranks agree bit for bit, and each call runs the
// path its strategy asks for (the kernels it launched, named by the driver from a captured graph:
// a strategy that fell back to NCCL fails here).
TEST(Gpu, TwoRanksSumThroughEveryStrategy)
{
    REQUIRE_GPU();
    if (gpuCount() < 2)
    {
        GTEST_SKIP() << "needs 2 GPUs";
    }
    void* nccl = loadNccl();
    ASSERT_NE(nccl, nullptr) << "no NCCL library (set EDGELLM_TEST_NCCL_LIBRARY)";
    using InitAll = int (*)(ncclComm_t*, int, int const*);
    using Destroy = int (*)(ncclComm_t);
    auto initAll = reinterpret_cast<InitAll>(dlsym(nccl, "ncclCommInitAll"));
    auto destroy = reinterpret_cast<Destroy>(dlsym(nccl, "ncclCommDestroy"));
    void* allReduce = dlsym(nccl, "ncclAllReduce");
    ASSERT_TRUE(initAll && destroy && allReduce);
    int const devices[2] = {0, 1};
    ncclComm_t comms[2] = {};
    ASSERT_EQ(initAll(comms, 2, devices), 0);
    auto reg = testlib::symbol<bool (*)(int, void*, void*)>("edgellmRegisterNcclCommForAllReducePlugin");
    auto unreg = testlib::symbol<bool (*)(int, void*)>("edgellmUnregisterNcclCommForAllReducePlugin");
    auto customRanks = testlib::symbol<int (*)(int)>("edgellmAllReduceCustomRanks");
    ASSERT_TRUE(reg(0, comms[0], allReduce));
    EXPECT_EQ(customRanks(0), 0) << "one of two ranks registered: no group yet";
    ASSERT_TRUE(reg(1, comms[1], allReduce));
    int canAccess = 0;
    cudaDeviceCanAccessPeer(&canAccess, 0, 1);
    EXPECT_EQ(customRanks(0), canAccess ? 2 : 0);
    EXPECT_EQ(customRanks(1), canAccess ? 2 : 0);
    bool const custom = customRanks(0) == 2;

    for (int32_t strategy : {0, 1, 2, 3})
    {
        for (DataType t : {DataType::kHALF, DataType::kFLOAT, DataType::kBF16})
        {
            for (size_t count : {size_t{1}, size_t{4097}, size_t{64} * 1024, size_t{1} << 20, size_t{3} << 20})
            {
                std::vector<float> expected(count);
                for (size_t i = 0; i < count; ++i)
                {
                    expected[i] = rankValue(0, i) + rankValue(1, i);
                }
                std::vector<std::vector<uint8_t>> results(2), replayed(2);
                std::vector<std::vector<std::string>> kernels(2);
                std::vector<int32_t> status(2, -99), graphStatus(2, -99);
                std::vector<std::thread> ranks;
                for (int r = 0; r < 2; ++r)
                {
                    ranks.emplace_back([&, r] {
                        cudaSetDevice(r);
                        testlib::Fields f;
                        f.i32("tp_size", 2).i32("strategy", strategy);
                        PluginPtr p(testlib::createPlugin(f));
                        std::vector<float> mine(count);
                        for (size_t i = 0; i < count; ++i)
                        {
                            mine[i] = rankValue(r, i);
                        }
                        auto host = encode(mine, t);
                        DeviceBuffer in(host.size()), out(host.size());
                        cudaStream_t stream{};
                        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
                        cudaMemcpy(in.ptr, host.data(), host.size(), cudaMemcpyHostToDevice);
                        cudaMemset(out.ptr, 0xff, host.size());
                        auto enqueue = [&] {
                            return p ? runEnqueue(p.get(), {static_cast<int64_t>(count)}, t, in.ptr, out.ptr, stream) : -98;
                        };
                        status[r] = enqueue();
                        cudaStreamSynchronize(stream);
                        results[r].resize(host.size());
                        cudaMemcpy(results[r].data(), out.ptr, host.size(), cudaMemcpyDeviceToHost);
                        // The same call again, captured: which kernels it launches, and the replay's sum.
                        cudaMemsetAsync(out.ptr, 0xff, host.size(), stream);
                        cudaStreamSynchronize(stream);
                        kernels[r] = launchedKernels(stream, enqueue, graphStatus[r]);
                        replayed[r].resize(host.size());
                        cudaMemcpy(replayed[r].data(), out.ptr, host.size(), cudaMemcpyDeviceToHost);
                        cudaStreamDestroy(stream);
                    });
                }
                for (auto& th : ranks)
                {
                    th.join();
                }
                std::string const what = "strategy " + std::to_string(strategy) + " type "
                    + std::to_string(static_cast<int>(t)) + " count " + std::to_string(count);
                ASSERT_EQ(status[0], 0) << what;
                ASSERT_EQ(status[1], 0) << what;
                EXPECT_EQ(results[0], results[1]) << "ranks differ: " << what;
                EXPECT_EQ(results[0], encode(expected, t)) << "wrong sum: " << what;
                std::string const path = plainKernel(strategy, count * sizeOf(t), custom);
                for (int r = 0; r < 2; ++r)
                {
                    EXPECT_EQ(graphStatus[r], 0) << "captured: " << what;
                    EXPECT_EQ(replayed[r], results[0]) << "graph replay, rank " << r << ": " << what;
                    EXPECT_EQ(customPathIs(kernels[r], path), "") << "rank " << r << ": " << what;
                }
            }
        }
    }
    // The fused op through every strategy: both ranks identical, within tolerance of fp64.
    float const eps = 1e-6F;
    for (int32_t strategy : {0, 1, 2, 3})
    {
        for (FusedCase const& c : fusedCases())
        {
            FusedData d = fusedData(c, 2, eps, static_cast<uint32_t>(strategy * 7 + c.hidden));
            std::pair<std::vector<uint8_t>, std::vector<uint8_t>> results[2], replayed[2];
            std::vector<std::string> kernels[2];
            std::vector<std::thread> ranks;
            for (int r = 0; r < 2; ++r)
            {
                ranks.emplace_back([&, r] {
                    cudaSetDevice(r);
                    PluginPtr p = makeFused(2, strategy, c.bias, eps);
                    if (p)
                    {
                        results[r] = runFused(p.get(), c, d, r);
                        cudaStream_t stream{};
                        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
                        replayed[r] = runFused(p.get(), c, d, r, stream, &kernels[r]);
                        cudaStreamDestroy(stream);
                    }
                });
            }
            for (auto& th : ranks)
            {
                th.join();
            }
            std::string const what = "fused strategy " + std::to_string(strategy) + " " + std::to_string(c.tokens) + "x"
                + std::to_string(c.hidden) + " type " + std::to_string(static_cast<int>(c.type)) + (c.bias ? " bias" : "");
            ASSERT_FALSE(results[0].first.empty()) << what;
            ASSERT_FALSE(results[1].first.empty()) << what;
            EXPECT_EQ(results[0], results[1]) << "ranks differ: " << what;
            EXPECT_LT(relError(decodeAll(results[0].second, c.type), d.residualOut), tolerance(c.type)) << what;
            EXPECT_LT(relError(decodeAll(results[0].first, c.type), d.normed), 2 * tolerance(c.type)) << what;
            std::string const path = fusedKernel(strategy, c.tokens * c.hidden * sizeOf(c.type), custom);
            for (int r = 0; r < 2; ++r)
            {
                EXPECT_EQ(replayed[r], results[0]) << "graph replay, rank " << r << ": " << what;
                EXPECT_EQ(customPathIs(kernels[r], path), "") << "rank " << r << ": " << what;
            }
        }
    }

    EXPECT_TRUE(unreg(0, comms[0]));
    EXPECT_EQ(customRanks(1), 0) << "unregistering one rank releases the group";
    EXPECT_TRUE(unreg(1, comms[1]));
    destroy(comms[0]);
    destroy(comms[1]);
}

TEST(Gpu, FusedResidualRmsNormOneRank)
{
    REQUIRE_GPU();
    float const eps = 1e-5F;
    for (FusedCase const& c : fusedCases())
    {
        PluginPtr p = makeFused(1, 3, c.bias, eps);
        ASSERT_NE(p, nullptr);
        FusedData d = fusedData(c, 1, eps, static_cast<uint32_t>(c.tokens * 31 + c.hidden));
        auto [normed, resOut] = runFused(p.get(), c, d, 0);
        ASSERT_FALSE(normed.empty()) << "enqueue failed";
        std::string const what = std::to_string(c.tokens) + "x" + std::to_string(c.hidden) + " type "
            + std::to_string(static_cast<int>(c.type)) + (c.bias ? " bias" : "");
        EXPECT_LT(relError(decodeAll(resOut, c.type), d.residualOut), tolerance(c.type)) << what;
        EXPECT_LT(relError(decodeAll(normed, c.type), d.normed), 2 * tolerance(c.type)) << what;
    }
}

// A library without a kernel image for this GPU (tools/gpu/no_image_check.sh builds one with
// sm_100 SASS and PTX only and runs it on an sm_90): the plain paths are the tests above (copy,
// NCCL); the fused op, whose norm kernel cannot run here, fails at configure time with a clear
// error and never reaches an enqueue that would fail by surprise.
TEST(NoKernelImage, FusedOpFailsAtConfigureTime)
{
    REQUIRE_GPU();
    if (std::getenv("EDGELLM_TEST_EXPECT_NO_KERNEL_IMAGE") == nullptr)
    {
        GTEST_SKIP() << "run by tools/gpu/no_image_check.sh against a library without an image for this GPU";
    }
    FusedCase const c{4, 4096, false, DataType::kHALF};
    for (int32_t tp : {1, 2})
    {
        PluginPtr p = makeFused(tp, 3, false, 1e-5F);
        ASSERT_NE(p, nullptr) << "creating the plugin needs no kernel";
        DynamicPluginTensorDesc in[3] = {testlib::dynamicTensor({4, 4096}, c.type), testlib::dynamicTensor({4, 4096}, c.type),
            testlib::dynamicTensor({4096}, c.type)};
        DynamicPluginTensorDesc out[2] = {in[0], in[0]};
        EXPECT_EQ(testlib::views(p.get()).build->configurePlugin(in, 3, out, 2), -1) << "tp_size " << tp;
        PluginTensorDesc rin[3] = {in[0].desc, in[1].desc, in[2].desc};
        PluginTensorDesc rout[2] = {in[0].desc, in[0].desc};
        EXPECT_EQ(testlib::views(p.get()).runtime->onShapeChange(rin, 3, rout, 2), -1) << "tp_size " << tp;
        // Enqueued all the same, it fails cleanly (-1) and writes nothing.
        FusedData d = fusedData(c, 1, 1e-5F, 5);
        EXPECT_TRUE(runFused(p.get(), c, d, 0).first.empty()) << "tp_size " << tp;
    }
}

// --- Multi-process: one rank per process (MPI style), ncclCommInitRank, workspaces exchanged ----
namespace
{
struct NcclUniqueId
{
    char internal[128];
};

//! What one rank's process checks: the workspaces come up through the IPC exchange at
//! registration (the process sees one GPU, so its peer must be elsewhere), and every strategy
//! sums exactly. Returns an empty string on success.
std::string childRank(int rank, NcclUniqueId const& id)
{
    void* nccl = loadNccl();
    if (nccl == nullptr)
    {
        return "no NCCL";
    }
    using InitRank = int (*)(ncclComm_t*, int, NcclUniqueId, int);
    using Destroy = int (*)(ncclComm_t);
    auto initRank = reinterpret_cast<InitRank>(dlsym(nccl, "ncclCommInitRank"));
    auto destroy = reinterpret_cast<Destroy>(dlsym(nccl, "ncclCommDestroy"));
    void* allReduce = dlsym(nccl, "ncclAllReduce");
    cudaSetDevice(0);
    ncclComm_t comm = nullptr;
    if (initRank(&comm, 2, id, rank) != 0)
    {
        return "ncclCommInitRank failed";
    }
    auto reg = testlib::symbol<bool (*)(int, void*, void*)>("edgellmRegisterNcclCommForAllReducePlugin");
    auto unreg = testlib::symbol<bool (*)(int, void*)>("edgellmUnregisterNcclCommForAllReducePlugin");
    auto customRanks = testlib::symbol<int (*)(int)>("edgellmAllReduceCustomRanks");
    if (!reg(0, comm, allReduce))
    {
        return "register failed";
    }
    if (customRanks(0) != 2)
    {
        return "no custom group after the exchange";
    }
    for (int32_t strategy : {0, 1, 2, 3})
    {
        for (DataType t : {DataType::kHALF, DataType::kFLOAT, DataType::kBF16})
        {
            for (size_t count : {size_t{3}, size_t{4097}, size_t{1} << 20})
            {
                testlib::Fields f;
                f.i32("tp_size", 2).i32("strategy", strategy);
                PluginPtr p(testlib::createPlugin(f));
                std::vector<float> mine(count), expected(count);
                for (size_t i = 0; i < count; ++i)
                {
                    mine[i] = rankValue(rank, i);
                    expected[i] = rankValue(0, i) + rankValue(1, i);
                }
                auto host = encode(mine, t);
                DeviceBuffer in(host.size()), out(host.size());
                cudaMemcpy(in.ptr, host.data(), host.size(), cudaMemcpyHostToDevice);
                cudaMemset(out.ptr, 0xff, host.size());
                if (!p || runEnqueue(p.get(), {static_cast<int64_t>(count)}, t, in.ptr, out.ptr, nullptr) != 0)
                {
                    return "enqueue failed, strategy " + std::to_string(strategy);
                }
                cudaDeviceSynchronize();
                std::vector<uint8_t> got(host.size());
                cudaMemcpy(got.data(), out.ptr, got.size(), cudaMemcpyDeviceToHost);
                if (got != encode(expected, t))
                {
                    return "wrong sum: strategy " + std::to_string(strategy) + " type "
                        + std::to_string(static_cast<int>(t)) + " count " + std::to_string(count);
                }
            }
        }
    }
    if (!unreg(0, comm) || customRanks(0) != 0)
    {
        return "unregister did not release the group";
    }
    destroy(comm);
    return "";
}
} // namespace

TEST(MultiProcess, Child)
{
    char const* rank = std::getenv("EDGELLM_TEST_CHILD_RANK");
    char const* hex = std::getenv("EDGELLM_TEST_NCCL_ID");
    if (rank == nullptr || hex == nullptr)
    {
        GTEST_SKIP() << "run by MultiProcess.TwoProcessesExchangeWorkspaces";
    }
    NcclUniqueId id{};
    for (size_t i = 0; i < sizeof id.internal; ++i)
    {
        id.internal[i] = static_cast<char>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
    }
    EXPECT_EQ(childRank(std::atoi(rank), id), "");
}

TEST(MultiProcess, TwoProcessesExchangeWorkspaces)
{
    REQUIRE_GPU();
    if (gpuCount() < 2 || std::getenv("EDGELLM_TEST_CHILD_RANK") != nullptr)
    {
        GTEST_SKIP() << "needs 2 GPUs";
    }
    void* nccl = loadNccl();
    ASSERT_NE(nccl, nullptr);
    auto getId = reinterpret_cast<int (*)(NcclUniqueId*)>(dlsym(nccl, "ncclGetUniqueId"));
    NcclUniqueId id{};
    ASSERT_EQ(getId(&id), 0);
    std::string hex;
    char byte[3];
    for (char c : id.internal)
    {
        std::snprintf(byte, sizeof byte, "%02x", static_cast<unsigned char>(c));
        hex += byte;
    }
    std::vector<pid_t> children;
    for (int r = 0; r < 2; ++r)
    {
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0)
        {
            // A fresh process image (CUDA must not be used across fork): this binary, the child test.
            setenv("EDGELLM_TEST_CHILD_RANK", std::to_string(r).c_str(), 1);
            setenv("EDGELLM_TEST_NCCL_ID", hex.c_str(), 1);
            setenv("CUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1);
            setenv("EDGELLM_PLUGIN_PATH", testlib::pluginPath(), 1);
            execl("/proc/self/exe", "child", "--gtest_filter=MultiProcess.Child", static_cast<char*>(nullptr));
            _exit(127);
        }
        children.push_back(pid);
    }
    for (pid_t pid : children)
    {
        int status = 0;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exit status " << status;
    }
}
