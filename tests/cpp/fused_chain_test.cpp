// The fused node that edgellm-allreduce-fuse (fuse/) writes in place of an Edge-LLM decoder
// chain computes what the chain computed. The chain: our plain all-reduce (tp_size 1: one rank),
// then the residual Add and the RMSNorm as the ONNX graph's primitive ops, evaluated here on the
// host op by op in the graph's types (fp32 inside the Cast pair). The fused node: the plugin
// created from the fields the pass writes (fusion_op = 1, eps as the graph's constant, has_bias),
// as TensorRT's ONNX parser hands over a node's INT and FLOAT attributes (kINT32, kFLOAT32).
// Skipped without a GPU; on the H200 through tools/gpu/run_gpu_tests.sh.

#include "gpu.h"
#include "library.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>

using namespace nvinfer1;

namespace
{
// The eps the pass writes for the fixture fuse/tests/fixtures/edgellm-0.11-qwen3-tp2 (its
// checkpoint's rms_norm_eps as the graph's fp32 constant; fuse/tests/cli.rs checks the value).
constexpr float kFixtureEps = 1e-6F;

struct PluginDeleter
{
    void operator()(IPluginV3* p) const { delete p; }
};
using PluginPtr = std::unique_ptr<IPluginV3, PluginDeleter>;

//! The norm's weight multiply: after the cast back (Edge-LLM's `weight.to(dtype) * x.to(dtype)`),
//! or before it with an fp32 weight, which the pass converts to x's type for the plugin.
enum class Weight
{
    kAfterCast,
    kBeforeCastFp32
};

struct Case
{
    DataType type;
    size_t tokens, hidden;
    Weight weight;
    bool bias;
};

//! Rounds an fp32 value to `t` (nearest even), as a Cast node or an op of type `t` does.
float round(float v, DataType t)
{
    if (t == DataType::kHALF)
    {
        return __half2float(__float2half_rn(v));
    }
    return t == DataType::kBF16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

size_t elementSize(DataType t)
{
    return t == DataType::kFLOAT ? 4 : 2;
}

//! Host values (already representable in `t`) <-> the device's bytes.
std::vector<uint8_t> encode(std::vector<float> const& v, DataType t)
{
    std::vector<uint8_t> out(v.size() * elementSize(t));
    for (size_t i = 0; i < v.size(); ++i)
    {
        if (t == DataType::kFLOAT)
        {
            std::memcpy(&out[4 * i], &v[i], 4);
            continue;
        }
        uint16_t const bits = t == DataType::kHALF ? __half_as_ushort(__float2half_rn(v[i]))
                                                   : __bfloat16_as_ushort(__float2bfloat16_rn(v[i]));
        std::memcpy(&out[2 * i], &bits, 2);
    }
    return out;
}

std::vector<float> decode(std::vector<uint8_t> const& b, DataType t)
{
    std::vector<float> out(b.size() / elementSize(t));
    for (size_t i = 0; i < out.size(); ++i)
    {
        if (t == DataType::kFLOAT)
        {
            std::memcpy(&out[i], &b[4 * i], 4);
            continue;
        }
        uint16_t bits = 0;
        std::memcpy(&bits, &b[2 * i], 2);
        out[i] = t == DataType::kHALF ? __half2float(__ushort_as_half(bits)) : __bfloat162float(__ushort_as_bfloat16(bits));
    }
    return out;
}

struct Device
{
    void* ptr = nullptr;
    explicit Device(std::vector<uint8_t> const& host)
    {
        cudaMalloc(&ptr, host.size());
        cudaMemcpy(ptr, host.data(), host.size(), cudaMemcpyHostToDevice);
    }
    std::vector<uint8_t> read(size_t bytes) const
    {
        std::vector<uint8_t> out(bytes);
        cudaMemcpy(out.data(), ptr, bytes, cudaMemcpyDeviceToHost);
        return out;
    }
    ~Device() { cudaFree(ptr); }
};

PluginPtr plugin(testlib::Fields& f)
{
    return PluginPtr(testlib::createPlugin(f));
}

//! The inputs of one chain, random, rounded to the case's type (gamma32: the fp32 weight).
struct Inputs
{
    std::vector<float> x, residual, gamma32, gamma, bias;
};

Inputs inputs(Case const& c, uint32_t seed)
{
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> act(-2.F, 2.F), w(0.5F, 1.5F);
    auto draw = [&](size_t n, auto& dist, DataType t) {
        std::vector<float> v(n);
        for (float& e : v)
        {
            e = round(dist(rng), t);
        }
        return v;
    };
    size_t const n = c.tokens * c.hidden;
    Inputs in{draw(n, act, c.type), draw(n, act, c.type), {}, {}, draw(c.hidden, act, c.type)};
    in.gamma32 = draw(c.hidden, w, c.weight == Weight::kBeforeCastFp32 ? DataType::kFLOAT : c.type);
    // What the fused node reads: the weight itself, or the pass's copy in x's type.
    in.gamma.resize(c.hidden);
    for (size_t j = 0; j < c.hidden; ++j)
    {
        in.gamma[j] = round(in.gamma32[j], c.type);
    }
    return in;
}

//! The original graph after the all-reduce `ar`: [Add bias,] Add residual (in x's type), then
//! Cast fp32, Pow 2, ReduceMean, Add eps, Sqrt, Reciprocal, Mul, then Cast back and Mul weight
//! (or Mul fp32 weight and Cast back). Returns (normed, sum).
std::pair<std::vector<float>, std::vector<float>> chain(Case const& c, Inputs const& in, std::vector<float> const& ar, float eps)
{
    DataType const t = c.type;
    std::vector<float> sum(ar.size()), normed(ar.size());
    for (size_t row = 0; row < c.tokens; ++row)
    {
        float* s = &sum[row * c.hidden];
        double squares = 0;
        for (size_t j = 0; j < c.hidden; ++j)
        {
            size_t const i = row * c.hidden + j;
            float const biased = c.bias ? round(static_cast<float>(static_cast<double>(ar[i]) + in.bias[j]), t) : ar[i];
            s[j] = round(static_cast<float>(static_cast<double>(in.residual[i]) + biased), t);
            float const xf = s[j];
            float const sq = xf * xf;
            squares += sq;
        }
        float const mean = static_cast<float>(squares / static_cast<double>(c.hidden));
        float const inv = 1.F / std::sqrt(mean + eps);
        for (size_t j = 0; j < c.hidden; ++j)
        {
            float const n = s[j] * inv;
            normed[row * c.hidden + j] = c.weight == Weight::kAfterCast ? round(in.gamma32[j] * round(n, t), t)
                                                                        : round(n * in.gamma32[j], t);
        }
    }
    return {normed, sum};
}

//! Every element within `units` units in the last place of `t` (relative; below magnitude 1,
//! those of 1). The chain rounds more often than the plugin, which rounds residual_out once and
//! normed once: the normalised value before the weight multiply (or the weight to x's type), and
//! with a bias the biased value too (then normed differs by up to 2 units, residual_out by up to
//! 2 as well, in an fp64 emulation of both).
void expectClose(
    std::vector<float> const& got, std::vector<float> const& want, DataType t, double units, std::string const& what)
{
    double const ulp = t == DataType::kFLOAT ? std::ldexp(1.0, -23) : t == DataType::kHALF ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    double const tolerance = t == DataType::kFLOAT ? 1e-5 : units * ulp;
    ASSERT_EQ(got.size(), want.size()) << what;
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
    {
        double const err = std::abs(static_cast<double>(got[i]) - want[i]) / std::max(1.0, std::abs(static_cast<double>(want[i])));
        worst = std::max(worst, err);
        bad += !(err <= tolerance);
    }
    EXPECT_EQ(bad, 0U) << what << ": worst relative error " << worst << ", tolerance " << tolerance;
}

char const* typeName(DataType t)
{
    return t == DataType::kFLOAT ? "fp32" : t == DataType::kHALF ? "fp16" : "bf16";
}

} // namespace

TEST(GpuFusedChain, FusedNodeEqualsTheChainItReplaces)
{
    REQUIRE_GPU();
    std::vector<Case> cases;
    for (DataType t : {DataType::kHALF, DataType::kBF16, DataType::kFLOAT})
    {
        // The fixture's hidden size and decode-to-prefill shapes of real models.
        for (auto [tokens, hidden] : {std::pair<size_t, size_t>{4, 64}, {1, 4096}, {16, 5120}, {128, 8192}})
        {
            cases.push_back({t, tokens, hidden, Weight::kAfterCast, false});
        }
        cases.push_back({t, 16, 4096, Weight::kBeforeCastFp32, false});
        cases.push_back({t, 16, 4096, Weight::kAfterCast, true});
    }
    for (Case const& c : cases)
    {
        std::string const what = std::string(typeName(c.type)) + " " + std::to_string(c.tokens) + "x" + std::to_string(c.hidden)
            + (c.weight == Weight::kAfterCast ? " weight after the cast" : " fp32 weight before the cast") + (c.bias ? " bias" : "");
        Inputs const in = inputs(c, static_cast<uint32_t>(c.tokens * 131 + c.hidden + static_cast<int>(c.type)));
        size_t const bytes = c.tokens * c.hidden * elementSize(c.type);
        PluginTensorDesc const xd = testlib::tensor({static_cast<int64_t>(c.tokens), static_cast<int64_t>(c.hidden)}, c.type);
        PluginTensorDesc const wd = testlib::tensor({static_cast<int64_t>(c.hidden)}, c.type);

        // The original graph: the plain all-reduce node on the device, the rest on the host.
        testlib::Fields plainFields;
        plainFields.i32("tp_size", 1);
        PluginPtr plain = plugin(plainFields);
        ASSERT_NE(plain, nullptr) << what;
        Device x(encode(in.x, c.type)), ar(std::vector<uint8_t>(bytes, 0xff));
        void const* plainIn[1] = {x.ptr};
        void* plainOut[1] = {ar.ptr};
        ASSERT_EQ(testlib::views(plain.get()).runtime->enqueue(&xd, &xd, plainIn, plainOut, nullptr, nullptr), 0) << what;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        auto [wantNormed, wantSum] = chain(c, in, decode(ar.read(bytes), c.type), kFixtureEps);

        // The fused node the pass writes.
        testlib::Fields fusedFields;
        fusedFields.i32("tp_size", 1).i32("fusion_op", 1).f32("eps", kFixtureEps);
        if (c.bias)
        {
            fusedFields.i32("has_bias", 1);
        }
        PluginPtr fused = plugin(fusedFields);
        ASSERT_NE(fused, nullptr) << what;
        Device residual(encode(in.residual, c.type)), gamma(encode(in.gamma, c.type)), bias(encode(in.bias, c.type));
        Device normed(std::vector<uint8_t>(bytes, 0xff)), sum(std::vector<uint8_t>(bytes, 0xff));
        PluginTensorDesc const fin[4] = {xd, xd, wd, wd};
        PluginTensorDesc const fout[2] = {xd, xd};
        void const* fusedIn[4] = {x.ptr, residual.ptr, gamma.ptr, bias.ptr};
        void* fusedOut[2] = {normed.ptr, sum.ptr};
        ASSERT_EQ(testlib::views(fused.get()).runtime->enqueue(fin, fout, fusedIn, fusedOut, nullptr, nullptr), 0) << what;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;

        double const units = c.bias ? 3 : 2;
        expectClose(decode(sum.read(bytes), c.type), wantSum, c.type, units, what + ": residual_out");
        expectClose(decode(normed.read(bytes), c.type), wantNormed, c.type, units, what + ": normed");
    }
}
