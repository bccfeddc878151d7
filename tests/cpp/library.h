// The library under test, loaded as Edge-LLM and TensorRT load it: dlopen(EDGELLM_PLUGIN_PATH,
// RTLD_NOW | RTLD_GLOBAL), symbols through dlsym. Plus helpers to build plugin fields.
#pragma once

#include "fake_tensorrt.h"

#include <edgellm_allreduce.h>

#include <NvInferRuntime.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace testlib
{

//! The library's path: $EDGELLM_PLUGIN_PATH, else the build's (a compile definition, as in Edge-LLM's tests).
char const* pluginPath();

//! dlopen's the library once (static registration runs then) and returns its handle.
void* library();

//! The TensorRT logger the tests give the library (initEdgellmPlugins, setLoggerFinder).
fake::Logger& logger();

template <typename Fn>
Fn symbol(char const* name)
{
    return reinterpret_cast<Fn>(dlsym(library(), name));
}

//! The creator TensorRT's registry holds for AllReducePlugin/1 in `ns`.
nvinfer1::IPluginCreatorV3One* creator(char const* ns = "");

//! A field collection that owns its data.
class Fields
{
public:
    Fields& i32(char const* name, int32_t value);
    Fields& f32(char const* name, float value);
    Fields& raw(char const* name, nvinfer1::PluginFieldType type, std::vector<uint8_t> bytes, int32_t length);
    nvinfer1::PluginFieldCollection const* get();

private:
    std::vector<std::string> mNames;
    std::vector<std::vector<uint8_t>> mData;
    std::vector<nvinfer1::PluginFieldType> mTypes;
    std::vector<int32_t> mLengths;
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

//! A plugin from the registry's creator; null when creation failed.
nvinfer1::IPluginV3* createPlugin(Fields& fields, char const* ns = "");

struct PluginViews
{
    nvinfer1::IPluginV3OneCore* core;
    nvinfer1::IPluginV3OneBuild* build;
    nvinfer1::IPluginV3OneRuntime* runtime;
};
PluginViews views(nvinfer1::IPluginV3* plugin);

nvinfer1::PluginTensorDesc tensor(std::vector<int64_t> const& dims, nvinfer1::DataType type,
    nvinfer1::TensorFormat format = nvinfer1::TensorFormat::kLINEAR);
nvinfer1::DynamicPluginTensorDesc dynamicTensor(std::vector<int64_t> const& dims, nvinfer1::DataType type,
    nvinfer1::TensorFormat format = nvinfer1::TensorFormat::kLINEAR);

//! The serialized fields as name -> raw bytes.
std::vector<std::pair<std::string, std::vector<uint8_t>>> serialized(nvinfer1::IPluginV3OneRuntime* runtime);

} // namespace testlib
