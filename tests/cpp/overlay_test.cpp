// The overlay as Edge-LLM's runtimes meet it: Edge-LLM's own plugin library (0.11, from the PyPI
// wheel) is the base, loaded against the stand-in libnvinfer this executable links. Each suite is
// one way a process loads the library, so ctest runs each in a process of its own, with the
// environment that suite names (tests/CMakeLists.txt): EDGELLM_ALLREDUCE_BASE_LIBRARY as the user
// sets it, EDGELLM_OVERLAY_TEST_BASE for the base a test loads itself.

#include "fake_tensorrt.h"

#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace
{
//! The creators Edge-LLM 0.11's library registers (nm/registry of the tensorrt-edgellm 0.11.0 wheel).
std::vector<std::string> const kEdgeLlm011Creators = {"AllReducePlugin", "AttentionPlugin",
    "DFlash2GroupedDynamicConvPlugin", "DFlashTargetKVCacheUpdate", "Fp16MoePlugin", "FusedNvfp4GemmAllReducePlugin",
    "gated_delta_net", "Gemma4AudioAttentionPlugin", "Int4GroupwiseGemmPlugin", "Int4GroupwiseGemmPluginV2",
    "Int4MoePlugin", "LayerNormPlugin", "causal_conv1d", "update_ssm_state", "Nvfp4A16BlackwellMoePlugin",
    "Nvfp4A16BlackwellGemmPlugin", "Nvfp4A16GemmPlugin", "Nvfp4A16MoePlugin", "Nvfp4MoePlugin",
    "NvFP4MoEPluginGeforce", "QkvConcatPlugin", "QsaAttentionPlugin", "RmsNormPlugin", "ViTAttentionPlugin"};

//! Edge-LLM's C ABI, 0.10 and 0.11 together.
std::vector<char const*> const kUpstreamExports = {"initEdgellmPlugins", "edgellmRegisterNcclCommForAllReducePlugin",
    "edgellmUnregisterNcclCommForAllReducePlugin", "edgellmRegisterFusedNvfp4WeightResource",
    "edgellmUnregisterFusedNvfp4WeightResource", "edgellm_dflash_configure_pages_per_slot"};

using Init = bool (*)(void*, char const*);
using RegisterNccl = bool (*)(int, void*, void*);
using UnregisterNccl = bool (*)(int, void*);
using RegisterWeight = bool (*)(int32_t, int32_t, void const*, void const*, int32_t, int32_t, int32_t);
using UnregisterWeight = bool (*)(int32_t, int32_t);
using ConfigurePages = bool (*)(void*, int32_t);

std::string canonical(std::string const& path)
{
    char buffer[PATH_MAX];
    return realpath(path.c_str(), buffer) != nullptr ? std::string(buffer) : path;
}

std::string env(char const* name)
{
    char const* value = std::getenv(name);
    return value != nullptr ? value : "";
}

//! The library under test: $EDGELLM_PLUGIN_PATH (as Edge-LLM's runtime reads it), else the build's.
char const* ourPath()
{
    static std::string const path = env("EDGELLM_PLUGIN_PATH").empty() ? EDGELLM_PLUGIN_PATH : env("EDGELLM_PLUGIN_PATH");
    return path.c_str();
}

//! What the process writes to stderr while it lives (this library logs there until it has a logger).
class StderrCapture
{
public:
    StderrCapture()
        : mFile(std::tmpfile())
        , mSaved(dup(STDERR_FILENO))
    {
        std::fflush(stderr);
        dup2(fileno(mFile), STDERR_FILENO);
    }
    ~StderrCapture()
    {
        std::fflush(stderr);
        dup2(mSaved, STDERR_FILENO);
        close(mSaved);
        std::fclose(mFile);
    }
    std::string text()
    {
        std::fflush(stderr);
        std::string all;
        std::rewind(mFile);
        char chunk[4096];
        for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, mFile)) > 0;)
        {
            all.append(chunk, n);
        }
        std::fprintf(stdout, "%s", all.c_str()); // keep it in the test's log
        return all;
    }

private:
    FILE* mFile;
    int mSaved;
};

int occurrences(std::string const& text, std::string const& needle)
{
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    {
        ++n;
    }
    return n;
}

//! Loads this library as Edge-LLM's C++ runtime does (loadEdgellmPluginLib: local, lazy, never unloaded).
void* loadAsEdgeLlmRuntime()
{
    void* handle = dlopen(ourPath(), RTLD_LAZY | RTLD_NODELETE);
    EXPECT_NE(handle, nullptr) << dlerror();
    return handle;
}

std::string ownerOf(char const* name, char const* ns)
{
    return canonical(fake::ownerOf(fake::Registry::instance().getCreator(name, "1", ns)));
}

void expectEveryCreatorIn(char const* ns)
{
    fake::Registry& registry = fake::Registry::instance();
    for (std::string const& name : kEdgeLlm011Creators)
    {
        EXPECT_NE(registry.getCreator(name.c_str(), "1", ns), nullptr) << name << " in namespace '" << ns << "'";
    }
    EXPECT_EQ(registry.countIn(ns), static_cast<int>(kEdgeLlm011Creators.size()));
    EXPECT_EQ(ownerOf("AllReducePlugin", ns), canonical(ourPath())) << "ours serves AllReducePlugin";
    // The others are the base's: in "" its own creators, elsewhere ours forwarding to them.
    auto* rms = static_cast<IPluginCreatorV3One*>(registry.getCreator("RmsNormPlugin", "1", ns));
    ASSERT_NE(rms, nullptr);
    EXPECT_STREQ(rms->getPluginNamespace(), ns);
    if (std::string(ns).empty())
    {
        EXPECT_EQ(ownerOf("RmsNormPlugin", ns), canonical(env("EDGELLM_OVERLAY_TEST_BASE")));
    }
}

void expectNoDuplicateRegistration()
{
    std::vector<std::string> const refused = fake::Registry::instance().refused();
    EXPECT_TRUE(refused.empty()) << "TensorRT would log a duplicate registration of " << refused.front();
}

//! Loads ours where no base can serve (off, broken, missing): only ours is registered, serving
//! AllReducePlugin. Returns what it logged while loading.
std::string loadAloneAndLog(void*& ours)
{
    StderrCapture log;
    ours = loadAsEdgeLlmRuntime();
    EXPECT_EQ(fake::Registry::instance().countIn(""), 1);
    EXPECT_EQ(ownerOf("AllReducePlugin", ""), canonical(ourPath()));
    return log.text();
}

//! The registrations of Edge-LLM's C ABI reach both libraries: ours (its C++ getter) and the
//! base (its own unregister succeeds only for what it holds).
void expectForwarding(void* ours)
{
    void* base = dlopen(env("EDGELLM_OVERLAY_TEST_BASE").c_str(), RTLD_LAZY | RTLD_NOLOAD);
    ASSERT_NE(base, nullptr) << "the base is loaded";
    auto reg = reinterpret_cast<RegisterNccl>(dlsym(ours, "edgellmRegisterNcclCommForAllReducePlugin"));
    auto unreg = reinterpret_cast<UnregisterNccl>(dlsym(ours, "edgellmUnregisterNcclCommForAllReducePlugin"));
    auto baseUnreg = reinterpret_cast<UnregisterNccl>(dlsym(base, "edgellmUnregisterNcclCommForAllReducePlugin"));
    auto ourComm = reinterpret_cast<void* (*) (int)>(dlsym(ours, "_ZN11trt_edgellm7plugins20getNcclCommForDeviceEi"));
    ASSERT_TRUE(reg && unreg && baseUnreg && ourComm);
    ASSERT_NE(baseUnreg, unreg) << "the base's export is its own";
    void* comm = reinterpret_cast<void*>(0x1000);
    void* allReduce = reinterpret_cast<void*>(0x2000);

    ASSERT_TRUE(reg(3, comm, allReduce));
    EXPECT_EQ(ourComm(3), comm);
    EXPECT_TRUE(baseUnreg(3, comm)) << "the registration reached the base";
    ASSERT_TRUE(reg(3, comm, allReduce));
    EXPECT_TRUE(unreg(3, comm));
    EXPECT_EQ(ourComm(3), nullptr);
    EXPECT_FALSE(baseUnreg(3, comm)) << "the unregistration reached the base";

    auto regWeight = reinterpret_cast<RegisterWeight>(dlsym(ours, "edgellmRegisterFusedNvfp4WeightResource"));
    auto unregWeight = reinterpret_cast<UnregisterWeight>(dlsym(ours, "edgellmUnregisterFusedNvfp4WeightResource"));
    auto baseUnregWeight = reinterpret_cast<UnregisterWeight>(dlsym(base, "edgellmUnregisterFusedNvfp4WeightResource"));
    ASSERT_TRUE(regWeight && unregWeight && baseUnregWeight);
    static uint8_t const weight[16] = {}, scale[16] = {};
    EXPECT_FALSE(regWeight(0, 7, weight, scale, 16, 33, 2)) << "the base's own validation answers";
    ASSERT_TRUE(regWeight(0, 7, weight, scale, 16, 32, 2));
    EXPECT_TRUE(baseUnregWeight(0, 7)) << "the weight registration reached the base";
    ASSERT_TRUE(regWeight(0, 7, weight, scale, 16, 32, 2));
    EXPECT_TRUE(unregWeight(0, 7));
    EXPECT_FALSE(baseUnregWeight(0, 7)) << "the weight unregistration reached the base";
    dlclose(base);
}

//! A plugin of the base, created through the registry and destroyed, as an engine build does.
void expectBasePluginLifecycle(char const* ns)
{
    auto* creator = static_cast<IPluginCreatorV3One*>(
        fake::Registry::instance().getCreator("Int4GroupwiseGemmPlugin", "1", ns));
    ASSERT_NE(creator, nullptr);
    int32_t const n = 4096, k = 4096, group = 128;
    std::vector<PluginField> fields = {{"gemm_n", &n, PluginFieldType::kINT32, 1},
        {"gemm_k", &k, PluginFieldType::kINT32, 1}, {"group_size", &group, PluginFieldType::kINT32, 1}};
    PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
    IPluginV3* plugin = creator->createPlugin("int4_gemm", &fc, TensorRTPhase::kBUILD);
    ASSERT_NE(plugin, nullptr);
    auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    ASSERT_NE(core, nullptr);
    EXPECT_STREQ(core->getPluginName(), "Int4GroupwiseGemmPlugin");
    delete plugin;
}

} // namespace

// Edge-LLM's C++ runtime: EDGELLM_PLUGIN_PATH names this library, which it loads RTLD_LOCAL and
// initialises; the base is named by EDGELLM_ALLREDUCE_BASE_LIBRARY.
TEST(OverlayRuntime, EveryCreatorFindableOursServesAllReduce)
{
    StderrCapture log;
    void* ours = loadAsEdgeLlmRuntime();
    ASSERT_NE(ours, nullptr);
    auto init = reinterpret_cast<Init>(dlsym(ours, "initEdgellmPlugins"));
    ASSERT_NE(init, nullptr);
    static fake::Logger logger;
    EXPECT_TRUE(init(&logger, ""));
    expectEveryCreatorIn("");
    expectNoDuplicateRegistration();
    EXPECT_EQ(occurrences(log.text(), "serves every plugin but AllReducePlugin"), 1);

    // Every export of Edge-LLM 0.10 and 0.11, and global ones although the load was local.
    for (char const* name : kUpstreamExports)
    {
        EXPECT_NE(dlsym(ours, name), nullptr) << name;
    }
    EXPECT_EQ(dlsym(RTLD_DEFAULT, "edgellmRegisterNcclCommForAllReducePlugin"),
        dlsym(ours, "edgellmRegisterNcclCommForAllReducePlugin"))
        << "Edge-LLM's runtime finds the registration through dlsym(RTLD_DEFAULT)";
    EXPECT_EQ(dlsym(RTLD_DEFAULT, "edgellmRegisterFusedNvfp4WeightResource"),
        dlsym(ours, "edgellmRegisterFusedNvfp4WeightResource"));
    expectForwarding(ours);
    expectBasePluginLifecycle("");

    // 0.11 has no DFlash builder hook: the answer is upstream's "nothing configured", with the reason logged.
    logger.clear();
    auto configure = reinterpret_cast<ConfigurePages>(dlsym(ours, "edgellm_dflash_configure_pages_per_slot"));
    EXPECT_FALSE(configure(nullptr, 4));
    EXPECT_TRUE(logger.saw("edgellm_dflash_configure_pages_per_slot")) << "the refusal names the function";
    EXPECT_TRUE(logger.saw("does not export it"));

    // A namespace: ours and every creator of the base registered there too, and working.
    EXPECT_TRUE(init(&logger, "edgellm"));
    expectEveryCreatorIn("edgellm");
    expectNoDuplicateRegistration();
    expectBasePluginLifecycle("edgellm");
    EXPECT_TRUE(init(&logger, "edgellm")) << "a second call is not an error";
    expectNoDuplicateRegistration();
}

// TensorRT's IPluginRegistry::loadLibrary / trtexec --dynamicPlugins: getCreators hands over all
// 24, none registered twice, however often it is called.
TEST(OverlayLoadLibrary, EveryCreatorFindableNoDuplicates)
{
    fake::Registry& registry = fake::Registry::instance();
    ASSERT_TRUE(registry.simulateLoadLibrary(ourPath()));
    expectEveryCreatorIn("");
    expectNoDuplicateRegistration();
    ASSERT_TRUE(registry.simulateLoadLibrary(ourPath()));
    expectEveryCreatorIn("");
    expectNoDuplicateRegistration();
    expectBasePluginLifecycle("");
}

// Edge-LLM's library loaded first (another component of the process): ours replaces its
// AllReducePlugin and adopts it as the base, with no setting.
TEST(OverlayBaseFirst, OursReplacesAllReduceAndForwardsToIt)
{
    ASSERT_TRUE(env("EDGELLM_ALLREDUCE_BASE_LIBRARY").empty());
    void* base = dlopen(env("EDGELLM_OVERLAY_TEST_BASE").c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    ASSERT_NE(base, nullptr) << dlerror();
    EXPECT_EQ(ownerOf("AllReducePlugin", ""), canonical(env("EDGELLM_OVERLAY_TEST_BASE")));
    void* ours = loadAsEdgeLlmRuntime();
    ASSERT_NE(ours, nullptr);
    expectEveryCreatorIn("");
    expectNoDuplicateRegistration();
    expectForwarding(ours);
}

// EDGELLM_ALLREDUCE_BASE_LIBRARY=none: ours alone, and the base's functions say why they cannot run.
TEST(OverlayOff, OursAloneAndTheBasesFunctionsRefuse)
{
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    ASSERT_NE(ours, nullptr);
    EXPECT_EQ(occurrences(text, "Edge-LLM"), 0) << "the overlay being off is not worth a warning";
    auto regWeight = reinterpret_cast<RegisterWeight>(dlsym(ours, "edgellmRegisterFusedNvfp4WeightResource"));
    static uint8_t const weight[16] = {}, scale[16] = {};
    StderrCapture refusal;
    EXPECT_FALSE(regWeight(0, 7, weight, scale, 16, 32, 2));
    EXPECT_NE(refusal.text().find("EDGELLM_ALLREDUCE_BASE_LIBRARY=none"), std::string::npos);
    auto reg = reinterpret_cast<RegisterNccl>(dlsym(ours, "edgellmRegisterNcclCommForAllReducePlugin"));
    auto unreg = reinterpret_cast<UnregisterNccl>(dlsym(ours, "edgellmUnregisterNcclCommForAllReducePlugin"));
    void* comm = reinterpret_cast<void*>(0x1000);
    EXPECT_TRUE(reg(3, comm, reinterpret_cast<void*>(0x2000))) << "AllReduce needs no base";
    EXPECT_TRUE(unreg(3, comm));
}

// A base that refuses the NCCL registrations ours accepts (refusing_base.cpp): the two stay in
// step, so ours does not keep what the base refused, and the failure says so.
TEST(OverlayRefusingBase, NeitherLibraryHoldsWhatTheBaseRefused)
{
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    ASSERT_NE(ours, nullptr);
    auto reg = reinterpret_cast<RegisterNccl>(dlsym(ours, "edgellmRegisterNcclCommForAllReducePlugin"));
    auto unreg = reinterpret_cast<UnregisterNccl>(dlsym(ours, "edgellmUnregisterNcclCommForAllReducePlugin"));
    auto ourComm = reinterpret_cast<void* (*) (int)>(dlsym(ours, "_ZN11trt_edgellm7plugins20getNcclCommForDeviceEi"));
    ASSERT_TRUE(reg && unreg && ourComm);
    void* comm = reinterpret_cast<void*>(0x1000);
    StderrCapture log;
    EXPECT_FALSE(reg(3, comm, reinterpret_cast<void*>(0x2000)));
    EXPECT_EQ(ourComm(3), nullptr) << "ours did not keep a registration the base refused";
    EXPECT_FALSE(unreg(3, comm)) << "nothing to unregister in either";
    std::string const said = log.text();
    EXPECT_NE(said.find("refused edgellmRegisterNcclCommForAllReducePlugin"), std::string::npos) << said;
    EXPECT_NE(said.find("no communicator is registered for device 3"), std::string::npos) << said;
}

// A base named by a path that is a FIFO: reading or loading it would block the process before
// main. It is refused, with one error, before it is opened.
TEST(OverlayFifo, ABaseThatIsNoFileIsRefusedWithoutBlocking)
{
    std::string const fifo = "/tmp/edgellm-overlay-fifo-" + std::to_string(getpid()) + ".so";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    setenv("EDGELLM_ALLREDUCE_BASE_LIBRARY", fifo.c_str(), 1);
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    unlink(fifo.c_str());
    EXPECT_EQ(occurrences(text, "is not a regular file"), 1) << text;
}

// A setting that makes no sense is named when the library is loaded, before any all-reduce
// runs (a process that only builds engines hears of it too), and only once.
TEST(OverlaySettings, BadValuesAreNamedAtLoad)
{
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    ASSERT_NE(ours, nullptr);
    EXPECT_EQ(occurrences(text, "EDGELLM_ALLREDUCE_MAX_BLOCKS=lots is not a CTA count from 1 to 128: ignored"), 1) << text;
    EXPECT_EQ(occurrences(text, "EDGELLM_ALLREDUCE_TIMEOUT_MS=soon is not a number of milliseconds"), 1) << text;
}

// A base that cannot be loaded: one clear error naming the file and the loader's reason; ours works.
TEST(OverlayBroken, OneClearErrorAndOursAlone)
{
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    std::string const broken = env("EDGELLM_ALLREDUCE_BASE_LIBRARY");
    EXPECT_EQ(occurrences(text, "could not be loaded"), 1);
    EXPECT_NE(text.find(broken), std::string::npos) << "the error names the file";
    EXPECT_NE(text.find("invalid ELF header"), std::string::npos) << "and the loader's reason";
}

// A base built for another TensorRT major than the process runs: refused before it is loaded.
TEST(OverlayWrongTensorRT, RefusedBeforeItIsLoaded)
{
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    EXPECT_EQ(occurrences(text, "is built for libnvinfer.so.11, but this process runs libnvinfer.so.10"), 1);
    EXPECT_EQ(dlopen(env("EDGELLM_ALLREDUCE_BASE_LIBRARY").c_str(), RTLD_LAZY | RTLD_NOLOAD), nullptr)
        << "it was never loaded";
}

// No base installed and none named: one warning saying where it looked; ours works.
TEST(OverlayMissing, OneWarningAndOursAlone)
{
    void* ours = nullptr;
    std::string const text = loadAloneAndLog(ours);
    EXPECT_EQ(occurrences(text, "no Edge-LLM plugin library"), 1);
    EXPECT_NE(text.find("libNvInfer_edgellm_plugin_base.so"), std::string::npos) << "it says where it looked";
}

// On a GPU (the H200 run, with the real CUDA libraries under the base): ours runs AllReducePlugin
// (tp_size 1: a copy on the stream) while the base serves the rest.
TEST(OverlayGpu, OursEnqueuesBesideTheBase)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    {
        GTEST_SKIP() << "no CUDA device";
    }
    void* ours = loadAsEdgeLlmRuntime();
    ASSERT_NE(ours, nullptr);
    static fake::Logger logger;
    ASSERT_TRUE(reinterpret_cast<Init>(dlsym(ours, "initEdgellmPlugins"))(&logger, ""));
    expectEveryCreatorIn("");
    expectBasePluginLifecycle("");

    auto* creator = static_cast<IPluginCreatorV3One*>(fake::Registry::instance().getCreator("AllReducePlugin", "1", ""));
    ASSERT_NE(creator, nullptr);
    int32_t const tpSize = 1;
    PluginField field{"tp_size", &tpSize, PluginFieldType::kINT32, 1};
    PluginFieldCollection fc{1, &field};
    IPluginV3* plugin = creator->createPlugin("allreduce", &fc, TensorRTPhase::kRUNTIME);
    ASSERT_NE(plugin, nullptr);
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    ASSERT_NE(runtime, nullptr);

    int64_t const count = 4096;
    std::vector<uint16_t> host(count);
    for (int64_t i = 0; i < count; ++i)
    {
        host[i] = static_cast<uint16_t>(0x3c00 + (i % 1000)); // fp16 values from 1.0 up
    }
    size_t const bytes = host.size() * sizeof(uint16_t);
    void* in = nullptr;
    void* out = nullptr;
    cudaStream_t stream{};
    ASSERT_EQ(cudaMalloc(&in, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out, bytes), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(out, 0, bytes), cudaSuccess);
    PluginTensorDesc desc{};
    desc.dims.nbDims = 2;
    desc.dims.d[0] = 1;
    desc.dims.d[1] = count;
    desc.type = DataType::kHALF;
    desc.format = TensorFormat::kLINEAR;
    void const* ins[1] = {in};
    void* outs[1] = {out};
    EXPECT_EQ(runtime->enqueue(&desc, &desc, ins, outs, nullptr, stream), 0);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<uint16_t> got(count);
    ASSERT_EQ(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, host);
    delete plugin;
    cudaStreamDestroy(stream);
    cudaFree(in);
    cudaFree(out);
}
