/*
 * edgellm-allreduce: drop-in replacement for TensorRT-Edge-LLM's AllReduce plugin.
 *
 * The C++ API of Edge-LLM's `cpp/plugins/allReducePlugin/allReducePlugin.h`: the same classes,
 * the same free functions with the same mangled names. The C ABI is in <edgellm_allreduce.h>.
 * Needs TensorRT's headers (10.x or 11.x) on the include path.
 */
#pragma once

#include "edgellm_allreduce.h"

#include <NvInferRuntime.h>

#include <cstdint>
#include <memory>
#include <string>

#ifndef EDGELLM_PLUGIN_EXPORT
#define EDGELLM_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

namespace trt_edgellm
{
namespace plugins
{

//! Registers the NCCL communicator (`ncclComm_t`) and the address of `ncclAllReduce` that
//! AllReducePlugin instances running on CUDA device `deviceId` use. Call after NCCL
//! initialization and before running an engine that contains AllReducePlugin nodes. Invalid
//! arguments (negative id, null pointer) are logged and ignored.
EDGELLM_PLUGIN_EXPORT void registerNcclCommForAllReducePlugin(int deviceId, void* ncclComm, void* ncclAllReduceFunc) noexcept;

//! Snapshot of what is registered for `deviceId`; both set to null when nothing is. Either
//! out-pointer may be null.
EDGELLM_PLUGIN_EXPORT void getNcclRegistrationForDevice(int deviceId, void** ncclComm, void** ncclAllReduceFunc) noexcept;

//! The communicator registered for `deviceId`, or null.
EDGELLM_PLUGIN_EXPORT void* getNcclCommForDevice(int deviceId) noexcept;

//! The most recently registered `ncclAllReduce` address, or null when nothing is registered.
EDGELLM_PLUGIN_EXPORT void* getNcclAllReduceFunc() noexcept;

//! Tensor-parallel all-reduce (sum) of one activation tensor. A copy when tp_size is 1; the
//! library's intra-node kernels where they serve, the registered NCCL communicator otherwise.
//! Fields: tp_size (INT32, required), strategy, config, fusion_op, has_bias (INT32), eps
//! (FLOAT32). With fusion_op RESIDUAL_RMS_NORM the inputs are (x, residual, gamma[, bias]) and
//! the outputs (normed, residual_out).
class EDGELLM_PLUGIN_EXPORT AllReducePlugin : public nvinfer1::IPluginV3,
                                              public nvinfer1::IPluginV3OneCore,
                                              public nvinfer1::IPluginV3OneBuild,
                                              public nvinfer1::IPluginV3OneRuntime
{
public:
    //! Throws (a std::exception) when tpSize is not >= 1.
    AllReducePlugin(std::string const& name, int32_t tpSize);
    //! Throws (a std::exception) when a field is missing, unknown or invalid; the message says which.
    AllReducePlugin(std::string const& name, nvinfer1::PluginFieldCollection const* fc);
    AllReducePlugin() = delete;
    AllReducePlugin(AllReducePlugin const&) = delete;
    ~AllReducePlugin() override;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override;
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    bool supportsFormatCombination(
        int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes,
        int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

    void setPluginNamespace(char const* pluginNamespace) noexcept;

private:
    struct State;
    explicit AllReducePlugin(std::unique_ptr<State> state) noexcept;
    std::unique_ptr<State> mState;
};

//! Creates AllReducePlugin instances ("AllReducePlugin", version "1").
class EDGELLM_PLUGIN_EXPORT AllReducePluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    AllReducePluginCreator();
    ~AllReducePluginCreator() override;

    char const* getPluginName() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    void setPluginNamespace(char const* pluginNamespace) noexcept;
    char const* getPluginNamespace() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    //! Returns null (and logs why) when the fields are missing or invalid; `phase` is ignored.
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    struct State;
    std::unique_ptr<State> mState;
};

} // namespace plugins
} // namespace trt_edgellm
