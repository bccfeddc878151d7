#!/usr/bin/env bash
# Checks the installed library: Edge-LLM's file names (.so -> .so.1 -> .so.1.0), exactly the
# public exports (docs/ABI.md), SONAME, RUNPATH, and no NEEDED entry for TensorRT, NCCL or the CUDA
# runtime; and the base beside it when the package has one. Usage: abi_check.sh PREFIX
set -euo pipefail
prefix=$1
lib="$prefix/lib/libNvInfer_edgellm_plugin.so"
[ "$(readlink "$lib")" = "libNvInfer_edgellm_plugin.so.1" ] || { echo "FAIL: $lib -> $(readlink "$lib")"; exit 1; }
[ "$(readlink "$lib.1")" = "libNvInfer_edgellm_plugin.so.1.0" ] || { echo "FAIL: $lib.1 -> $(readlink "$lib.1")"; exit 1; }
[ -f "$lib.1.0" ] && [ ! -L "$lib.1.0" ] || { echo "FAIL: $lib.1.0 is not the library file"; exit 1; }
base="$prefix/lib/libNvInfer_edgellm_plugin_base.so"
if [ -e "$base" ]; then
  "${NM:-nm}" -D --defined-only "$base" | grep -qw initEdgellmPlugins || { echo "FAIL: $base is not Edge-LLM's plugin library"; exit 1; }
  ! "${NM:-nm}" -D --defined-only "$base" | grep -qw edgellmAllReduceCustomRanks || { echo "FAIL: $base is ours, not Edge-LLM's"; exit 1; }
fi
dyn=$("${READELF:-readelf}" -d "$lib.1.0")
grep -q 'SONAME.*\[libNvInfer_edgellm_plugin.so.1\]' <<<"$dyn" || { echo "FAIL: SONAME"; exit 1; }
grep -q 'RUNPATH.*\[\$ORIGIN\]' <<<"$dyn" || { echo "FAIL: RUNPATH is not \$ORIGIN"; exit 1; }
if grep -E 'NEEDED.*(nvinfer|nccl|cudart|libcuda)' <<<"$dyn"; then echo "FAIL: forbidden NEEDED entry"; exit 1; fi
expected=$(cat <<'LIST'
edgellmAllReduceCustomRanks
edgellmAllReduceLastError
edgellmAllReduceReleaseWorkspaces
edgellmAllReduceSetupWorkspaces
edgellmRegisterFusedNvfp4WeightResource
edgellmRegisterNcclCommForAllReducePlugin
edgellmUnregisterFusedNvfp4WeightResource
edgellmUnregisterNcclCommForAllReducePlugin
edgellm_dflash_configure_pages_per_slot
getCreators
getPluginCreators
initEdgellmPlugins
setLoggerFinder
trt_edgellm::plugins::AllReducePlugin::AllReducePlugin(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, int)
trt_edgellm::plugins::AllReducePlugin::AllReducePlugin(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > const&, nvinfer1::PluginFieldCollection const*)
trt_edgellm::plugins::AllReducePlugin::attachToContext(nvinfer1::IPluginResourceContext*)
trt_edgellm::plugins::AllReducePlugin::clone()
trt_edgellm::plugins::AllReducePlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const*, int, nvinfer1::DynamicPluginTensorDesc const*, int)
trt_edgellm::plugins::AllReducePlugin::enqueue(nvinfer1::PluginTensorDesc const*, nvinfer1::PluginTensorDesc const*, void const* const*, void* const*, void*, CUstream_st*)
trt_edgellm::plugins::AllReducePlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType)
trt_edgellm::plugins::AllReducePlugin::getFieldsToSerialize()
trt_edgellm::plugins::AllReducePlugin::getNbOutputs() const
trt_edgellm::plugins::AllReducePlugin::getOutputDataTypes(nvinfer1::DataType*, int, nvinfer1::DataType const*, int) const
trt_edgellm::plugins::AllReducePlugin::getOutputShapes(nvinfer1::DimsExprs const*, int, nvinfer1::DimsExprs const*, int, nvinfer1::DimsExprs*, int, nvinfer1::IExprBuilder&)
trt_edgellm::plugins::AllReducePlugin::getPluginName() const
trt_edgellm::plugins::AllReducePlugin::getPluginNamespace() const
trt_edgellm::plugins::AllReducePlugin::getPluginVersion() const
trt_edgellm::plugins::AllReducePlugin::getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const*, int, nvinfer1::DynamicPluginTensorDesc const*, int) const
trt_edgellm::plugins::AllReducePlugin::onShapeChange(nvinfer1::PluginTensorDesc const*, int, nvinfer1::PluginTensorDesc const*, int)
trt_edgellm::plugins::AllReducePlugin::setPluginNamespace(char const*)
trt_edgellm::plugins::AllReducePlugin::supportsFormatCombination(int, nvinfer1::DynamicPluginTensorDesc const*, int, int)
trt_edgellm::plugins::AllReducePlugin::~AllReducePlugin()
trt_edgellm::plugins::AllReducePluginCreator::AllReducePluginCreator()
trt_edgellm::plugins::AllReducePluginCreator::createPlugin(char const*, nvinfer1::PluginFieldCollection const*, nvinfer1::TensorRTPhase)
trt_edgellm::plugins::AllReducePluginCreator::getFieldNames()
trt_edgellm::plugins::AllReducePluginCreator::getPluginName() const
trt_edgellm::plugins::AllReducePluginCreator::getPluginNamespace() const
trt_edgellm::plugins::AllReducePluginCreator::getPluginVersion() const
trt_edgellm::plugins::AllReducePluginCreator::setPluginNamespace(char const*)
trt_edgellm::plugins::AllReducePluginCreator::~AllReducePluginCreator()
trt_edgellm::plugins::getNcclAllReduceFunc()
trt_edgellm::plugins::getNcclCommForDevice(int)
trt_edgellm::plugins::getNcclRegistrationForDevice(int, void**, void**)
trt_edgellm::plugins::registerNcclCommForAllReducePlugin(int, void*, void*)
typeinfo for trt_edgellm::plugins::AllReducePlugin
typeinfo for trt_edgellm::plugins::AllReducePluginCreator
typeinfo name for trt_edgellm::plugins::AllReducePlugin
typeinfo name for trt_edgellm::plugins::AllReducePluginCreator
vtable for trt_edgellm::plugins::AllReducePlugin
vtable for trt_edgellm::plugins::AllReducePluginCreator
LIST
)
actual=$("${NM:-nm}" -D --defined-only "$lib.1.0" | awk '{print $3}' | c++filt | sort -u)
if [ "$actual" != "$(sort -u <<<"$expected")" ]; then
  echo "FAIL: exports differ from the public API"
  diff <(sort -u <<<"$expected") <(echo "$actual") || true
  exit 1
fi
echo "abi: $(wc -l <<<"$actual") exports, .so -> .so.1 -> .so.1.0, SONAME .so.1, RUNPATH \$ORIGIN, no NEEDED libnvinfer/libnccl/libcudart/libcuda; base: $([ -e "$base" ] && echo "$base" || echo none)"
