// Links libNvInfer_edgellm_plugin.so and uses it as a C++ program that includes the public
// header would: constructs the classes directly, calls the free functions by their C++ names.
#include <trt_edgellm/plugins/allReducePlugin.h>

#include <cstdio>
#include <cstring>
#include <memory>

#define CHECK(cond)                                                                                                    \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(cond))                                                                                                   \
        {                                                                                                              \
            std::fprintf(stderr, "FAILED: %s (line %d)\n", #cond, __LINE__);                                           \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

int main()
{
    using namespace trt_edgellm::plugins;
    auto plugin = std::make_unique<AllReducePlugin>("consumer", 2);
    CHECK(std::strcmp(plugin->getPluginName(), "AllReducePlugin") == 0);
    CHECK(std::strcmp(plugin->getPluginVersion(), "1") == 0);
    plugin->setPluginNamespace("consumer_ns");
    CHECK(std::strcmp(plugin->getPluginNamespace(), "consumer_ns") == 0);
    CHECK(plugin->getNbOutputs() == 1);
    nvinfer1::PluginFieldCollection const* fc = plugin->getFieldsToSerialize();
    CHECK(fc != nullptr && fc->nbFields == 1 && std::strcmp(fc->fields[0].name, "tp_size") == 0);

    std::unique_ptr<nvinfer1::IPluginV3> copy(plugin->clone());
    CHECK(copy != nullptr);

    AllReducePlugin fromFields("consumer", fc);
    CHECK(fromFields.getNbOutputs() == 1);
    bool threw = false;
    try
    {
        AllReducePlugin bad("consumer", 0);
    }
    catch (std::exception const& e)
    {
        threw = std::strstr(e.what(), "tp_size") != nullptr;
    }
    CHECK(threw);

    AllReducePluginCreator creator;
    CHECK(std::strcmp(creator.getPluginName(), "AllReducePlugin") == 0);
    CHECK(creator.getFieldNames()->nbFields == 6);
    std::unique_ptr<nvinfer1::IPluginV3> created(creator.createPlugin("x", fc, nvinfer1::TensorRTPhase::kRUNTIME));
    CHECK(created != nullptr);
    CHECK(creator.createPlugin("x", nullptr, nvinfer1::TensorRTPhase::kRUNTIME) == nullptr);

    int comm = 0;
    int fn = 0;
    registerNcclCommForAllReducePlugin(3, &comm, &fn);
    void* c = nullptr;
    void* f = nullptr;
    getNcclRegistrationForDevice(3, &c, &f);
    CHECK(c == &comm && f == &fn);
    CHECK(getNcclCommForDevice(3) == &comm);
    CHECK(getNcclAllReduceFunc() == &fn);
    CHECK(edgellmUnregisterNcclCommForAllReducePlugin(3, &comm));
    CHECK(getNcclCommForDevice(3) == nullptr);
    CHECK(initEdgellmPlugins(nullptr, "")); // no TensorRT in this process: nothing to register with
    std::puts("consumer: all checks passed");
    return 0;
}
