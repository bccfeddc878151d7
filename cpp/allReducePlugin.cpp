// AllReducePlugin and AllReducePluginCreator: TensorRT's interfaces adapted to the Rust core.
// No decisions here: every override converts TensorRT's structs, calls src/plugin/ (mod.rs) through
// the cxx bridge (src/api/bridge.rs), and turns a Rust error (already logged there) into
// TensorRT's failure value.
// Methods follow TensorRT's interface order.

#include "trt_edgellm/plugins/allReducePlugin.h"

#include "edgellm-allreduce/src/api/bridge.rs.h"

#include <array>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace trt_edgellm
{
namespace plugins
{
namespace
{
using namespace nvinfer1;

constexpr char const* kPluginName = "AllReducePlugin";
constexpr char const* kPluginVersion = "1";

static_assert(sizeof(Dims::d) / sizeof(Dims::d[0]) == 8, "ffi::TensorDesc holds 8 dimensions");
static_assert(sizeof(PluginTensorDesc) == 88 && sizeof(DynamicPluginTensorDesc) == 304 && sizeof(PluginField) == 24,
    "TensorRT struct layouts are those of TensorRT 10/11 (NvInferRuntimePlugin.h of both)");

//! The most tensors one call passes (inputs + outputs); more is refused before reaching Rust, so
//! that descriptors live on the stack (enqueue must not allocate).
constexpr int32_t kMaxTensors = 16;
using DescArray = std::array<ffi::TensorDesc, kMaxTensors>;

ffi::TensorDesc toDesc(PluginTensorDesc const& d) noexcept
{
    ffi::TensorDesc out{};
    out.nb_dims = d.dims.nbDims;
    for (int32_t i = 0; i < d.dims.nbDims && i < 8; ++i)
    {
        out.dims[i] = d.dims.d[i];
    }
    out.dtype = static_cast<int32_t>(d.type);
    out.format = static_cast<int32_t>(d.format);
    return out;
}

ffi::TensorDesc toDesc(DynamicPluginTensorDesc const& d) noexcept
{
    return toDesc(d.desc);
}

//! Build-time shapes: constant dimensions by value, the others as -1.
ffi::TensorDesc toDesc(DimsExprs const& d) noexcept
{
    ffi::TensorDesc out{};
    out.nb_dims = d.nbDims;
    for (int32_t i = 0; i < d.nbDims && i < 8; ++i)
    {
        out.dims[i] = (d.d[i] != nullptr && d.d[i]->isConstant()) ? d.d[i]->getConstantValue() : -1;
    }
    out.dtype = -1;
    out.format = -1;
    return out;
}

//! Whether TensorRT handed `method` usable tensor arrays: counts in range, and an array for every
//! non-empty list (`arrays`: every array needed is non-null). Logs why not (every rejection says so).
bool ioValid(char const* method, int32_t nbA, int32_t nbB, bool arrays) noexcept
{
    try
    {
        // Each count against the limit before any sum: TensorRT never passes more, but counts
        // near INT32_MAX must not overflow the check and reach the copies below.
        if (nbA < 0 || nbB < 0 || nbA > kMaxTensors || nbB > kMaxTensors - nbA)
        {
            ffi::log_error(std::string("AllReducePlugin::") + method + ": invalid tensor counts from TensorRT ("
                + std::to_string(nbA) + ", " + std::to_string(nbB) + ")");
            return false;
        }
        if (!arrays)
        {
            ffi::log_error(std::string("AllReducePlugin::") + method + ": null tensor array from TensorRT");
            return false;
        }
    }
    catch (std::exception const&)
    {
        return false;  // out of memory while logging: the rejection stands
    }
    return true;
}

//! Copies `n` TensorRT descriptors into `storage` starting at `offset`; returns the slice.
template <typename T>
rust::Slice<ffi::TensorDesc const> descs(T const* items, int32_t n, DescArray& storage, int32_t offset = 0) noexcept
{
    for (int32_t i = 0; i < n; ++i)
    {
        storage[offset + i] = toDesc(items[i]);
    }
    return {storage.data() + offset, static_cast<size_t>(n)};
}

} // namespace

struct AllReducePlugin::State
{
    State(rust::Box<ffi::PluginCore> core_, std::string name_, std::string nameSpace_)
        : core(std::move(core_))
        , name(std::move(name_))
        , nameSpace(std::move(nameSpace_))
    {
    }

    rust::Box<ffi::PluginCore> core;
    std::string name;
    std::string nameSpace;
    // getFieldsToSerialize's result; valid until the next call. Names are copied into
    // std::string because rust::String is not NUL-terminated.
    rust::Vec<ffi::FieldValue> serialized;
    std::vector<std::string> names;
    std::vector<PluginField> fields;
    PluginFieldCollection collection{};
};

AllReducePlugin::AllReducePlugin(std::unique_ptr<State> state) noexcept
    : mState(std::move(state))
{
}

AllReducePlugin::AllReducePlugin(std::string const& name, int32_t tpSize)
    : mState(new State(ffi::plugin_with_tp_size(tpSize), name, ""))
{
}

AllReducePlugin::AllReducePlugin(std::string const& name, PluginFieldCollection const* fc)
    : mState(new State([fc] {
                           std::vector<ffi::RawField> raw;
                           for (int32_t i = 0; fc != nullptr && fc->fields != nullptr && i < fc->nbFields; ++i)
                           {
                               PluginField const& f = fc->fields[i];
                               raw.push_back({reinterpret_cast<size_t>(f.name), reinterpret_cast<size_t>(f.data),
                                   static_cast<int32_t>(f.type), f.length});
                           }
                           return ffi::plugin_from_fields({raw.data(), raw.size()});
                       }(),
        name, ""))
{
}

AllReducePlugin::~AllReducePlugin() = default;

void AllReducePlugin::setPluginNamespace(char const* pluginNamespace) noexcept
{
    try
    {
        mState->nameSpace = pluginNamespace != nullptr ? pluginNamespace : "";
    }
    catch (std::exception const&)
    {
        ffi::log_error("AllReducePlugin::setPluginNamespace: out of memory");
    }
}

// IPluginV3

IPluginCapability* AllReducePlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* AllReducePlugin::clone() noexcept
{
    try
    {
        return new AllReducePlugin(
            std::unique_ptr<State>(new State(mState->core->clone_box(), mState->name, mState->nameSpace)));
    }
    catch (std::exception const& e)
    {
        ffi::log_error(std::string("AllReducePlugin::clone: ") + e.what());
        return nullptr;
    }
}

// IPluginV3OneCore

char const* AllReducePlugin::getPluginName() const noexcept
{
    return kPluginName;
}

char const* AllReducePlugin::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* AllReducePlugin::getPluginNamespace() const noexcept
{
    return mState->nameSpace.c_str();
}

// IPluginV3OneBuild

int32_t AllReducePlugin::getNbOutputs() const noexcept
{
    return mState->core->nb_outputs();
}

int32_t AllReducePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (!ioValid("configurePlugin", nbInputs, nbOutputs, (nbInputs == 0 || in != nullptr) && (nbOutputs == 0 || out != nullptr)))
    {
        return -1;
    }
    try
    {
        DescArray storage;
        mState->core->configure_checked(descs(in, nbInputs, storage), descs(out, nbOutputs, storage, nbInputs));
        return 0;
    }
    catch (std::exception const&)
    {
        return -1;
    }
}

bool AllReducePlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (!ioValid("supportsFormatCombination", nbInputs, nbOutputs, inOut != nullptr))
    {
        return false;
    }
    DescArray storage;
    return mState->core->supports_format(pos, descs(inOut, nbInputs + nbOutputs, storage), nbInputs);
}

int32_t AllReducePlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (!ioValid("getOutputDataTypes", nbInputs, nbOutputs,
            (nbInputs == 0 || inputTypes != nullptr) && (nbOutputs == 0 || outputTypes != nullptr)))
    {
        return -1;
    }
    try
    {
        std::array<int32_t, kMaxTensors> in{};
        std::array<int32_t, kMaxTensors> out{};
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            in[i] = static_cast<int32_t>(inputTypes[i]);
        }
        mState->core->output_types_checked(
            {in.data(), static_cast<size_t>(nbInputs)}, {out.data(), static_cast<size_t>(nbOutputs)});
        for (int32_t i = 0; i < nbOutputs; ++i)
        {
            outputTypes[i] = static_cast<DataType>(out[i]);
        }
        return 0;
    }
    catch (std::exception const&)
    {
        return -1;
    }
}

int32_t AllReducePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /*exprBuilder*/) noexcept
{
    if (!ioValid("getOutputShapes", nbInputs, nbOutputs,
            (nbInputs == 0 || inputs != nullptr) && (nbOutputs == 0 || outputs != nullptr)))
    {
        return -1;
    }
    try
    {
        DescArray storage;
        std::array<int32_t, kMaxTensors> sources{};
        mState->core->output_shape_sources_checked(
            descs(inputs, nbInputs, storage), {sources.data(), static_cast<size_t>(nbOutputs)});
        for (int32_t i = 0; i < nbOutputs; ++i)
        {
            if (sources[i] < 0 || sources[i] >= nbInputs)
            {
                ffi::log_error("AllReducePlugin::getOutputShapes: no input for an output's shape");
                return -1;
            }
            outputs[i] = inputs[sources[i]];
        }
        return 0;
    }
    catch (std::exception const&)
    {
        return -1;
    }
}

size_t AllReducePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return mState->core->workspace_size();
}

// IPluginV3OneRuntime

int32_t AllReducePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    int32_t const nbInputs = mState->core->nb_inputs();
    int32_t const nbOutputs = mState->core->nb_outputs();
    if (!ioValid("enqueue", nbInputs, nbOutputs,
            inputDesc != nullptr && outputDesc != nullptr && inputs != nullptr && outputs != nullptr))
    {
        return -1;
    }
    try
    {
        DescArray storage;
        std::array<size_t, kMaxTensors> in{};
        std::array<size_t, kMaxTensors> out{};
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            in[i] = reinterpret_cast<size_t>(inputs[i]);
        }
        for (int32_t i = 0; i < nbOutputs; ++i)
        {
            out[i] = reinterpret_cast<size_t>(outputs[i]);
        }
        mState->core->enqueue_checked(descs(inputDesc, nbInputs, storage),
            descs(outputDesc, nbOutputs, storage, nbInputs), {in.data(), static_cast<size_t>(nbInputs)},
            {out.data(), static_cast<size_t>(nbOutputs)}, reinterpret_cast<size_t>(stream));
        return 0;
    }
    catch (std::exception const&)
    {
        return -1;
    }
}

int32_t AllReducePlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (!ioValid("onShapeChange", nbInputs, nbOutputs, (nbInputs == 0 || in != nullptr) && (nbOutputs == 0 || out != nullptr)))
    {
        return -1;
    }
    try
    {
        DescArray storage;
        mState->core->on_shape_change_checked(descs(in, nbInputs, storage), descs(out, nbOutputs, storage, nbInputs));
        return 0;
    }
    catch (std::exception const&)
    {
        return -1;
    }
}

IPluginV3* AllReducePlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* AllReducePlugin::getFieldsToSerialize() noexcept
{
    try
    {
        State& s = *mState;
        s.serialized = s.core->fields_to_serialize();
        s.names.clear();
        s.fields.clear();
        for (ffi::FieldValue const& f : s.serialized)
        {
            s.names.emplace_back(f.name);
        }
        for (size_t i = 0; i < s.serialized.size(); ++i)
        {
            ffi::FieldValue const& f = s.serialized[i];
            s.fields.emplace_back(
                s.names[i].c_str(), f.data.data(), static_cast<PluginFieldType>(f.field_type), f.length);
        }
        s.collection.nbFields = static_cast<int32_t>(s.fields.size());
        s.collection.fields = s.fields.data();
        return &s.collection;
    }
    catch (std::exception const& e)
    {
        ffi::log_error(std::string("AllReducePlugin::getFieldsToSerialize: ") + e.what());
        return nullptr;
    }
}

// AllReducePluginCreator

struct AllReducePluginCreator::State
{
    explicit State(rust::Vec<ffi::FieldValue> declared_)
        : declared(std::move(declared_))
    {
    }

    std::string nameSpace;
    rust::Vec<ffi::FieldValue> declared;
    std::vector<std::string> names; // NUL-terminated copies of the declared names
    std::vector<PluginField> fields;
    PluginFieldCollection collection{};
};

AllReducePluginCreator::AllReducePluginCreator()
    : mState(new State(ffi::creator_field_names()))
{
    for (ffi::FieldValue const& f : mState->declared)
    {
        mState->names.emplace_back(f.name);
    }
    for (size_t i = 0; i < mState->declared.size(); ++i)
    {
        ffi::FieldValue const& f = mState->declared[i];
        mState->fields.emplace_back(
            mState->names[i].c_str(), nullptr, static_cast<PluginFieldType>(f.field_type), f.length);
    }
    mState->collection.nbFields = static_cast<int32_t>(mState->fields.size());
    mState->collection.fields = mState->fields.data();
}

AllReducePluginCreator::~AllReducePluginCreator() = default;

char const* AllReducePluginCreator::getPluginName() const noexcept
{
    return kPluginName;
}

PluginFieldCollection const* AllReducePluginCreator::getFieldNames() noexcept
{
    return &mState->collection;
}

void AllReducePluginCreator::setPluginNamespace(char const* pluginNamespace) noexcept
{
    try
    {
        mState->nameSpace = pluginNamespace != nullptr ? pluginNamespace : "";
    }
    catch (std::exception const&)
    {
        ffi::log_error("AllReducePluginCreator::setPluginNamespace: out of memory");
    }
}

char const* AllReducePluginCreator::getPluginNamespace() const noexcept
{
    return mState->nameSpace.c_str();
}

char const* AllReducePluginCreator::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

IPluginV3* AllReducePluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, TensorRTPhase /*phase*/) noexcept
{
    try
    {
        auto plugin = std::make_unique<AllReducePlugin>(name != nullptr ? name : "", fc);
        plugin->setPluginNamespace(mState->nameSpace.c_str());
        return plugin.release();
    }
    catch (std::exception const&)
    {
        // The Rust core logged why (missing, unknown or invalid field).
        return nullptr;
    }
}

} // namespace plugins
} // namespace trt_edgellm
