// Every method of AllReducePlugin and AllReducePluginCreator as TensorRT calls them, with
// Edge-LLM 0.11's behaviour for a plugin created from tp_size alone, and bad inputs.

#include "library.h"

#include <gtest/gtest.h>

#include <memory>

using namespace nvinfer1;
using testlib::Fields;

namespace
{
struct PluginDeleter
{
    void operator()(IPluginV3* p) const { delete p; }
};
using PluginPtr = std::unique_ptr<IPluginV3, PluginDeleter>;

PluginPtr makePlugin(int32_t tpSize)
{
    Fields f;
    f.i32("tp_size", tpSize);
    return PluginPtr(testlib::createPlugin(f));
}

std::vector<uint8_t> bytesOf(int32_t v)
{
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
}
} // namespace

TEST(Creator, DeclaresItsFields)
{
    IPluginCreatorV3One* c = testlib::creator();
    ASSERT_NE(c, nullptr);
    PluginFieldCollection const* fc = c->getFieldNames();
    ASSERT_NE(fc, nullptr);
    ASSERT_EQ(fc->nbFields, 6);
    std::vector<std::pair<std::string, PluginFieldType>> expected{{"tp_size", PluginFieldType::kINT32},
        {"strategy", PluginFieldType::kINT32}, {"config", PluginFieldType::kINT32},
        {"fusion_op", PluginFieldType::kINT32}, {"eps", PluginFieldType::kFLOAT32},
        {"has_bias", PluginFieldType::kINT32}};
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        EXPECT_EQ(fc->fields[i].name, expected[i].first);
        EXPECT_EQ(fc->fields[i].type, expected[i].second);
        EXPECT_EQ(fc->fields[i].length, 1);
    }
}

TEST(Plugin, IdentityAndCapabilities)
{
    PluginPtr p = makePlugin(2);
    ASSERT_NE(p, nullptr);
    auto v = testlib::views(p.get());
    ASSERT_NE(v.core, nullptr);
    ASSERT_NE(v.build, nullptr);
    ASSERT_NE(v.runtime, nullptr);
    EXPECT_STREQ(v.core->getInterfaceInfo().kind, "PLUGIN_V3ONE_CORE");
    EXPECT_STREQ(v.build->getInterfaceInfo().kind, "PLUGIN_V3ONE_BUILD");
    EXPECT_EQ(v.build->getInterfaceInfo().major, 1);
    EXPECT_STREQ(v.runtime->getInterfaceInfo().kind, "PLUGIN_V3ONE_RUNTIME");
    EXPECT_STREQ(p->getInterfaceInfo().kind, "PLUGIN");
    EXPECT_STREQ(v.core->getPluginName(), "AllReducePlugin");
    EXPECT_STREQ(v.core->getPluginVersion(), "1");
    EXPECT_STREQ(v.core->getPluginNamespace(), "");
    EXPECT_EQ(p->getCapabilityInterface(static_cast<PluginCapabilityType>(7)), nullptr);
}

TEST(Plugin, NamespaceComesFromTheCreator)
{
    testlib::Fields f;
    f.i32("tp_size", 2);
    auto init = testlib::symbol<bool (*)(void*, char const*)>("initEdgellmPlugins");
    ASSERT_TRUE(init(nullptr, "ns_for_plugin"));
    PluginPtr p(testlib::createPlugin(f, "ns_for_plugin"));
    ASSERT_NE(p, nullptr);
    EXPECT_STREQ(testlib::views(p.get()).core->getPluginNamespace(), "ns_for_plugin");
    PluginPtr copy(p->clone());
    EXPECT_STREQ(testlib::views(copy.get()).core->getPluginNamespace(), "ns_for_plugin");
}

TEST(Plugin, OneOutputOfTheInputsTypeAndShape)
{
    PluginPtr p = makePlugin(4);
    auto v = testlib::views(p.get());
    EXPECT_EQ(v.build->getNbOutputs(), 1);
    for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    {
        DataType out = DataType::kINT8;
        EXPECT_EQ(v.build->getOutputDataTypes(&out, 1, &t, 1), 0);
        EXPECT_EQ(out, t);
    }
    DataType in2[2] = {DataType::kHALF, DataType::kHALF};
    DataType out = DataType::kINT8;
    EXPECT_EQ(v.build->getOutputDataTypes(&out, 1, in2, 2), -1);
    DataType i32 = DataType::kINT32;
    EXPECT_EQ(v.build->getOutputDataTypes(&out, 1, &i32, 1), -1);

    fake::ExprBuilder builder;
    DimsExprs in = builder.dims({-1, 4096});
    DimsExprs outDims{};
    EXPECT_EQ(v.build->getOutputShapes(&in, 1, nullptr, 0, &outDims, 1, builder), 0);
    ASSERT_EQ(outDims.nbDims, 2);
    EXPECT_EQ(outDims.d[0], in.d[0]);
    EXPECT_EQ(outDims.d[1], in.d[1]);
    DimsExprs two[2] = {in, in};
    EXPECT_EQ(v.build->getOutputShapes(two, 2, nullptr, 0, &outDims, 1, builder), -1);
}

TEST(Plugin, FormatsAreLinearFloatHalfBf16WithMatchingTypes)
{
    PluginPtr p = makePlugin(2);
    auto v = testlib::views(p.get());
    using testlib::dynamicTensor;
    for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    {
        DynamicPluginTensorDesc io[2] = {dynamicTensor({1, 4096}, t), dynamicTensor({1, 4096}, t)};
        EXPECT_TRUE(v.build->supportsFormatCombination(0, io, 1, 1));
        EXPECT_TRUE(v.build->supportsFormatCombination(1, io, 1, 1));
    }
    DynamicPluginTensorDesc mixed[2] = {dynamicTensor({1, 4096}, DataType::kHALF), dynamicTensor({1, 4096}, DataType::kFLOAT)};
    EXPECT_FALSE(v.build->supportsFormatCombination(1, mixed, 1, 1));
    for (DataType t : {DataType::kINT8, DataType::kINT32, DataType::kBOOL, DataType::kFP8, DataType::kINT64})
    {
        DynamicPluginTensorDesc io[2] = {dynamicTensor({8}, t), dynamicTensor({8}, t)};
        EXPECT_FALSE(v.build->supportsFormatCombination(0, io, 1, 1)) << static_cast<int>(t);
    }
    DynamicPluginTensorDesc chw[2] = {dynamicTensor({1, 8, 4, 4}, DataType::kHALF, TensorFormat::kCHW2),
        dynamicTensor({1, 8, 4, 4}, DataType::kHALF, TensorFormat::kCHW2)};
    EXPECT_FALSE(v.build->supportsFormatCombination(0, chw, 1, 1));
    DynamicPluginTensorDesc io[2] = {dynamicTensor({8}, DataType::kHALF), dynamicTensor({8}, DataType::kHALF)};
    EXPECT_FALSE(v.build->supportsFormatCombination(2, io, 1, 1));
    EXPECT_FALSE(v.build->supportsFormatCombination(-1, io, 1, 1));
    EXPECT_FALSE(v.build->supportsFormatCombination(0, nullptr, 1, 1));
}

TEST(Plugin, ConfigureWorkspaceAndShapeChange)
{
    PluginPtr p = makePlugin(2);
    auto v = testlib::views(p.get());
    DynamicPluginTensorDesc in = testlib::dynamicTensor({2, 4096}, DataType::kHALF);
    DynamicPluginTensorDesc out = in;
    EXPECT_EQ(v.build->configurePlugin(&in, 1, &out, 1), 0);
    EXPECT_EQ(v.build->configurePlugin(&in, 2, &out, 1), -1);
    EXPECT_EQ(v.build->getWorkspaceSize(&in, 1, &out, 1), 0U);
    PluginTensorDesc rin = testlib::tensor({3, 4096}, DataType::kHALF);
    PluginTensorDesc rout = rin;
    EXPECT_EQ(v.runtime->onShapeChange(&rin, 1, &rout, 1), 0);
    PluginTensorDesc wrong = testlib::tensor({3, 4095}, DataType::kHALF);
    EXPECT_EQ(v.runtime->onShapeChange(&rin, 1, &wrong, 1), -1);
    EXPECT_EQ(v.runtime->onShapeChange(nullptr, 1, &rout, 1), -1);
}

TEST(Plugin, SerializesOnlyTpSizeAtDefaults)
{
    PluginPtr p = makePlugin(2);
    auto fields = testlib::serialized(testlib::views(p.get()).runtime);
    ASSERT_EQ(fields.size(), 1U);
    EXPECT_EQ(fields[0].first, "tp_size");
    EXPECT_EQ(fields[0].second, bytesOf(2));
}

TEST(Plugin, EveryFieldRoundTripsThroughSerialization)
{
    Fields f;
    f.i32("tp_size", 8).i32("strategy", 1).i32("config", 1).f32("eps", 1e-5F);
    PluginPtr p(testlib::createPlugin(f));
    ASSERT_NE(p, nullptr);
    auto first = testlib::serialized(testlib::views(p.get()).runtime);
    ASSERT_EQ(first.size(), 4U);
    Fields again;
    for (auto const& [name, bytes] : first)
    {
        again.raw(name.c_str(), name == "eps" ? PluginFieldType::kFLOAT32 : PluginFieldType::kINT32, bytes, 1);
    }
    PluginPtr q(testlib::createPlugin(again));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(testlib::serialized(testlib::views(q.get()).runtime), first);
}

TEST(Plugin, CloneAndAttachToContextKeepTheConfiguration)
{
    Fields f;
    f.i32("tp_size", 4).i32("strategy", 2);
    PluginPtr p(testlib::createPlugin(f));
    ASSERT_NE(p, nullptr);
    auto const expected = testlib::serialized(testlib::views(p.get()).runtime);
    PluginPtr c(p->clone());
    ASSERT_NE(c, nullptr);
    EXPECT_NE(c.get(), p.get());
    EXPECT_EQ(testlib::serialized(testlib::views(c.get()).runtime), expected);
    PluginPtr a(testlib::views(p.get()).runtime->attachToContext(nullptr));
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(testlib::serialized(testlib::views(a.get()).runtime), expected);
}

TEST(Creator, BadFieldsFailCleanly)
{
    IPluginCreatorV3One* c = testlib::creator();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->createPlugin("x", nullptr, TensorRTPhase::kBUILD), nullptr) << "tp_size is required";
    EXPECT_EQ(c->createPlugin(nullptr, nullptr, TensorRTPhase::kRUNTIME), nullptr);
    PluginFieldCollection empty{};
    EXPECT_EQ(c->createPlugin("x", &empty, TensorRTPhase::kBUILD), nullptr);
    PluginFieldCollection dangling{3, nullptr};
    EXPECT_EQ(c->createPlugin("x", &dangling, TensorRTPhase::kBUILD), nullptr);

    std::vector<Fields> bad(10);
    bad[0].i32("tp_size", 0);
    bad[1].i32("tp_size", -2);
    bad[2].i32("tp_size", 2).i32("strategy", 9);
    bad[3].i32("tp_size", 2).i32("config", 8);
    bad[4].i32("tp_size", 2).i32("fusion_op", 5);
    bad[5].i32("tp_size", 2).i32("eps", 1);
    bad[6].f32("tp_size", 2.F);
    bad[7].raw("tp_size", PluginFieldType::kINT32, {}, 1);
    bad[8].raw("tp_size", PluginFieldType::kINT32, bytesOf(2), 0);
    bad[9].i32("tp_size", 2).i32("tp_size", 2);
    for (size_t i = 0; i < bad.size(); ++i)
    {
        EXPECT_EQ(testlib::createPlugin(bad[i]), nullptr) << "case " << i;
    }
    Fields nullName;
    nullName.i32("tp_size", 2);
    PluginFieldCollection const* fc = nullName.get();
    const_cast<PluginField*>(fc->fields)[0].name = nullptr;
    EXPECT_EQ(c->createPlugin("x", fc, TensorRTPhase::kBUILD), nullptr);
}

TEST(Creator, Int64TpSizeFromOnnxIsAccepted)
{
    Fields f;
    int64_t tp = 2;
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), &tp, 8);
    f.raw("tp_size", PluginFieldType::kINT64, b, 1);
    PluginPtr p(testlib::createPlugin(f));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(testlib::serialized(testlib::views(p.get()).runtime)[0].second, bytesOf(2));
}

TEST(Fused, InterfaceOfTheFusedOp)
{
    for (bool bias : {false, true})
    {
        Fields f;
        f.i32("tp_size", 2).i32("fusion_op", 1).f32("eps", 1e-5F).i32("has_bias", bias ? 1 : 0);
        PluginPtr p(testlib::createPlugin(f));
        ASSERT_NE(p, nullptr);
        auto v = testlib::views(p.get());
        int32_t const nbIn = bias ? 4 : 3;
        EXPECT_EQ(v.build->getNbOutputs(), 2);
        std::vector<DataType> in(nbIn, DataType::kBF16);
        DataType out[2] = {DataType::kINT8, DataType::kINT8};
        EXPECT_EQ(v.build->getOutputDataTypes(out, 2, in.data(), nbIn), 0);
        EXPECT_EQ(out[0], DataType::kBF16);
        EXPECT_EQ(out[1], DataType::kBF16);
        in[2] = DataType::kHALF;
        EXPECT_EQ(v.build->getOutputDataTypes(out, 2, in.data(), nbIn), -1) << "gamma of another type";
        EXPECT_EQ(v.build->getOutputDataTypes(out, 1, in.data(), 1), -1) << "the plain interface";

        fake::ExprBuilder builder;
        std::vector<DimsExprs> shapes{builder.dims({-1, 4096}), builder.dims({-1, 4096}), builder.dims({4096})};
        if (bias)
        {
            shapes.push_back(builder.dims({4096}));
        }
        shapes[1].d[0] = shapes[0].d[0];
        DimsExprs outs[2]{};
        ASSERT_EQ(v.build->getOutputShapes(shapes.data(), nbIn, nullptr, 0, outs, 2, builder), 0);
        for (auto const& o : outs)
        {
            ASSERT_EQ(o.nbDims, 2);
            EXPECT_EQ(o.d[0], shapes[0].d[0]);
            EXPECT_EQ(o.d[1], shapes[0].d[1]);
        }
        shapes[2] = builder.dims({4095});
        EXPECT_EQ(v.build->getOutputShapes(shapes.data(), nbIn, nullptr, 0, outs, 2, builder), -1) << "gamma size";

        std::vector<DynamicPluginTensorDesc> io(nbIn + 2, testlib::dynamicTensor({2, 4096}, DataType::kHALF));
        for (int32_t pos = 0; pos < nbIn + 2; ++pos)
        {
            EXPECT_TRUE(v.build->supportsFormatCombination(pos, io.data(), nbIn, 2)) << pos;
        }
        io[nbIn] = testlib::dynamicTensor({2, 4096}, DataType::kFLOAT);
        EXPECT_FALSE(v.build->supportsFormatCombination(nbIn, io.data(), nbIn, 2));

        PluginTensorDesc x = testlib::tensor({2, 4096}, DataType::kHALF);
        PluginTensorDesc g = testlib::tensor({4096}, DataType::kHALF);
        std::vector<PluginTensorDesc> rin{x, x, g};
        if (bias)
        {
            rin.push_back(g);
        }
        PluginTensorDesc rout[2] = {x, x};
        EXPECT_EQ(v.runtime->onShapeChange(rin.data(), nbIn, rout, 2), 0);
        rin[1] = testlib::tensor({2, 4095}, DataType::kHALF);
        EXPECT_EQ(v.runtime->onShapeChange(rin.data(), nbIn, rout, 2), -1) << "residual shape";
        auto fields = testlib::serialized(v.runtime);
        EXPECT_EQ(fields.size(), bias ? 4U : 3U) << "tp_size, fusion_op, eps (, has_bias)";
    }
    Fields seedConfig;
    seedConfig.i32("tp_size", 2).i32("config", 2);
    PluginPtr q(testlib::createPlugin(seedConfig));
    ASSERT_NE(q, nullptr) << "the seed's config bit RESIDUAL_RMS_NORM fuses too";
    EXPECT_EQ(testlib::views(q.get()).build->getNbOutputs(), 2);
    Fields biasAlone;
    biasAlone.i32("tp_size", 2).i32("has_bias", 1);
    EXPECT_EQ(testlib::createPlugin(biasAlone), nullptr) << "has_bias without fusion";
}

TEST(Plugin, EnqueueRejectsBadCallsWithoutAGpu)
{
    PluginPtr p = makePlugin(2);
    auto v = testlib::views(p.get());
    PluginTensorDesc d = testlib::tensor({1, 4096}, DataType::kHALF);
    void const* in[1] = {reinterpret_cast<void const*>(0x1000)};
    void* out[1] = {reinterpret_cast<void*>(0x2000)};
    EXPECT_EQ(v.runtime->enqueue(nullptr, &d, in, out, nullptr, nullptr), -1);
    EXPECT_EQ(v.runtime->enqueue(&d, &d, nullptr, out, nullptr, nullptr), -1);
    void const* nullIn[1] = {nullptr};
    EXPECT_EQ(v.runtime->enqueue(&d, &d, nullIn, out, nullptr, nullptr), -1);
    PluginTensorDesc f32 = testlib::tensor({1, 4096}, DataType::kFLOAT);
    EXPECT_EQ(v.runtime->enqueue(&d, &f32, in, out, nullptr, nullptr), -1);
    PluginTensorDesc i8 = testlib::tensor({1, 4096}, DataType::kINT8);
    EXPECT_EQ(v.runtime->enqueue(&i8, &i8, in, out, nullptr, nullptr), -1);
    PluginTensorDesc empty = testlib::tensor({0, 4096}, DataType::kHALF);
    EXPECT_EQ(v.runtime->enqueue(&empty, &empty, in, out, nullptr, nullptr), 0) << "nothing to reduce";
}
