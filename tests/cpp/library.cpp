#include "library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

namespace testlib
{
using namespace nvinfer1;

char const* pluginPath()
{
    char const* env = std::getenv("EDGELLM_PLUGIN_PATH");
    return env != nullptr && *env != '\0' ? env : EDGELLM_PLUGIN_PATH;
}

void* library()
{
    static void* handle = [] {
        char const* path = pluginPath();
        void* h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (h == nullptr)
        {
            std::fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
            std::abort();
        }
        return h;
    }();
    return handle;
}

IPluginCreatorV3One* creator(char const* ns)
{
    library();
    return static_cast<IPluginCreatorV3One*>(fake::Registry::instance().getCreator("AllReducePlugin", "1", ns));
}

Fields& Fields::raw(char const* name, PluginFieldType type, std::vector<uint8_t> bytes, int32_t length)
{
    mNames.emplace_back(name);
    mData.push_back(std::move(bytes));
    mTypes.push_back(type);
    mLengths.push_back(length);
    return *this;
}

Fields& Fields::i32(char const* name, int32_t value)
{
    std::vector<uint8_t> b(sizeof value);
    std::memcpy(b.data(), &value, sizeof value);
    return raw(name, PluginFieldType::kINT32, b, 1);
}

Fields& Fields::f32(char const* name, float value)
{
    std::vector<uint8_t> b(sizeof value);
    std::memcpy(b.data(), &value, sizeof value);
    return raw(name, PluginFieldType::kFLOAT32, b, 1);
}

PluginFieldCollection const* Fields::get()
{
    mFields.clear();
    for (size_t i = 0; i < mNames.size(); ++i)
    {
        mFields.emplace_back(mNames[i].c_str(), mData[i].empty() ? nullptr : mData[i].data(), mTypes[i], mLengths[i]);
    }
    mCollection.nbFields = static_cast<int32_t>(mFields.size());
    mCollection.fields = mFields.data();
    return &mCollection;
}

IPluginV3* createPlugin(Fields& fields, char const* ns)
{
    IPluginCreatorV3One* c = creator(ns);
    return c == nullptr ? nullptr : c->createPlugin("layer", fields.get(), TensorRTPhase::kBUILD);
}

fake::Logger& logger()
{
    static fake::Logger instance;
    return instance;
}

PluginViews views(IPluginV3* plugin)
{
    return {static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE)),
        static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD)),
        static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME))};
}

PluginTensorDesc tensor(std::vector<int64_t> const& dims, DataType type, TensorFormat format)
{
    PluginTensorDesc d{};
    d.dims.nbDims = static_cast<int32_t>(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
    {
        d.dims.d[i] = dims[i];
    }
    d.type = type;
    d.format = format;
    d.scale = 1.F;
    return d;
}

DynamicPluginTensorDesc dynamicTensor(std::vector<int64_t> const& dims, DataType type, TensorFormat format)
{
    DynamicPluginTensorDesc d{};
    d.desc = tensor(dims, type, format);
    d.min = d.max = d.opt = d.desc.dims;
    return d;
}

std::vector<std::pair<std::string, std::vector<uint8_t>>> serialized(IPluginV3OneRuntime* runtime)
{
    std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
    PluginFieldCollection const* fc = runtime->getFieldsToSerialize();
    if (fc == nullptr)
    {
        return out;
    }
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        size_t const size = f.type == PluginFieldType::kINT32 || f.type == PluginFieldType::kFLOAT32 ? 4 : 0;
        auto const* p = static_cast<uint8_t const*>(f.data);
        out.emplace_back(f.name, std::vector<uint8_t>(p, p + size * f.length));
    }
    return out;
}

} // namespace testlib
