// The three ways TensorRT and Edge-LLM find the creator, in the order a process meets them, and
// logging through the TensorRT logger (whose layout differs between TensorRT 10 and 11).
// Each test sets up what it needs, so they pass in any order (--gtest_shuffle).

#include "library.h"

#include <gtest/gtest.h>

using namespace nvinfer1;

namespace
{
fake::Logger& testLogger()
{
    return testlib::logger();
}

//! Gives the library a logger finder that finds testLogger(), with an empty log. A logger given
//! through initEdgellmPlugins (testLogger() in these tests) takes precedence over the finder.
void logThroughTheFinder()
{
    static fake::LoggerFinder finder(&testLogger());
    auto setLoggerFinder = testlib::symbol<void (*)(ILoggerFinder*)>("setLoggerFinder");
    ASSERT_NE(setLoggerFinder, nullptr);
    setLoggerFinder(&finder);
    testLogger().clear();
}
} // namespace

TEST(Registration, StaticRegistrationAtLoad)
{
    testlib::library();
    EXPECT_EQ(fake::Registry::instance().count("AllReducePlugin", ""), 1);
    IPluginCreatorV3One* c = testlib::creator();
    ASSERT_NE(c, nullptr);
    EXPECT_STREQ(c->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE");
    EXPECT_STREQ(c->getPluginName(), "AllReducePlugin");
    EXPECT_STREQ(c->getPluginVersion(), "1");
    EXPECT_STREQ(c->getPluginNamespace(), "");
}

TEST(Registration, LoggerFinderIsUsedBeforeAnyLogger)
{
    logThroughTheFinder();
    auto reg = testlib::symbol<bool (*)(int, void*, void*)>("edgellmRegisterNcclCommForAllReducePlugin");
    EXPECT_FALSE(reg(-1, nullptr, nullptr));
    EXPECT_TRUE(testLogger().saw("negative CUDA device id")) << "the error reached the logger the finder gave";
}

TEST(Registration, InitEdgellmPluginsRegistersANamespaceOnce)
{
    auto init = testlib::symbol<bool (*)(void*, char const*)>("initEdgellmPlugins");
    ASSERT_NE(init, nullptr);
    EXPECT_TRUE(init(&testLogger(), "edgellm"));
    EXPECT_TRUE(init(&testLogger(), "edgellm")) << "a second call is not an error";
    EXPECT_EQ(fake::Registry::instance().count("AllReducePlugin", "edgellm"), 1);
    ASSERT_NE(testlib::creator("edgellm"), nullptr);
    EXPECT_STREQ(testlib::creator("edgellm")->getPluginNamespace(), "edgellm");
    EXPECT_TRUE(init(nullptr, nullptr)) << "namespace \"\" is already registered statically";
    EXPECT_EQ(fake::Registry::instance().count("AllReducePlugin", ""), 1);
}

TEST(Registration, LoggerGetsErrorsWithTheirCause)
{
    logThroughTheFinder();
    testlib::Fields f;
    f.i32("tp_size", 2).i32("bogus", 1);
    EXPECT_EQ(testlib::createPlugin(f), nullptr);
    EXPECT_TRUE(testLogger().saw("unknown plugin field 'bogus'"));
    EXPECT_TRUE(testLogger().saw("1: ")) << "logged with severity kERROR";
}

TEST(Registration, LoadLibraryAfterStaticRegistration)
{
    fake::Registry& registry = fake::Registry::instance();
    ASSERT_TRUE(registry.simulateLoadLibrary(testlib::pluginPath()));
    EXPECT_EQ(registry.count("AllReducePlugin", ""), 1);
    ASSERT_TRUE(registry.simulateLoadLibrary(testlib::pluginPath())) << "a second loadLibrary works too";
    EXPECT_EQ(registry.count("AllReducePlugin", ""), 1);
    auto init = testlib::symbol<bool (*)(void*, char const*)>("initEdgellmPlugins");
    EXPECT_TRUE(init(&testLogger(), "")) << "initEdgellmPlugins sees the creator loadLibrary registered";
    EXPECT_EQ(registry.count("AllReducePlugin", ""), 1);
    EXPECT_NE(testlib::creator(""), nullptr);
}

TEST(Registration, GetPluginCreatorsHasNoV2Creators)
{
    auto get = testlib::symbol<IPluginCreator* const* (*) (int32_t&)>("getPluginCreators");
    ASSERT_NE(get, nullptr);
    int32_t n = -1;
    EXPECT_NE(get(n), nullptr);
    EXPECT_EQ(n, 0);
}

TEST(Registration, AnotherLibrarysCreatorIsReplacedWithAWarning)
{
    // A creator of the same name already in a namespace (an Edge-LLM library loaded before this
    // one, say): ours wins AllReducePlugin whatever the order, with a warning naming the library.
    struct Other final : public IPluginCreatorV3One
    {
        char const* getPluginName() const noexcept override { return "AllReducePlugin"; }
        char const* getPluginVersion() const noexcept override { return "1"; }
        char const* getPluginNamespace() const noexcept override { return "other"; }
        PluginFieldCollection const* getFieldNames() noexcept override { return nullptr; }
        IPluginV3* createPlugin(char const*, PluginFieldCollection const*, TensorRTPhase) noexcept override
        {
            return nullptr;
        }
    };
    static Other other;
    ASSERT_TRUE(fake::Registry::instance().registerCreator(other, "other"));
    testLogger().clear();
    auto init = testlib::symbol<bool (*)(void*, char const*)>("initEdgellmPlugins");
    EXPECT_TRUE(init(&testLogger(), "other"));
    EXPECT_TRUE(testLogger().saw("is replaced by edgellm-allreduce's"));
    EXPECT_TRUE(testLogger().saw("2: ")) << "logged with severity kWARNING";
    IPluginCreatorInterface* now = fake::Registry::instance().getCreator("AllReducePlugin", "1", "other");
    EXPECT_NE(now, &other);
    EXPECT_EQ(now, testlib::creator("other"));
    EXPECT_STREQ(testlib::creator("other")->getPluginNamespace(), "other");
    EXPECT_EQ(fake::Registry::instance().count("AllReducePlugin", "other"), 1);
}
