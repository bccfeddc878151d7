#include "fake_tensorrt.h"

#include <dlfcn.h>

#include <algorithm>

using namespace nvinfer1;

// What libnvinfer exports, found by the library through dlsym(RTLD_DEFAULT, ...).
extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept
{
    return &fake::Registry::instance();
}
extern "C" __attribute__((visibility("default"))) int32_t getInferLibMajorVersion() noexcept
{
    return NV_TENSORRT_MAJOR;
}

namespace fake
{

Registry& Registry::instance()
{
    static Registry* registry = new Registry();
    return *registry;
}

std::vector<Registry::Entry> Registry::entries() const
{
    std::lock_guard<std::mutex> lock(mMutex);
    return mEntries;
}

int Registry::countIn(std::string const& ns) const
{
    std::lock_guard<std::mutex> lock(mMutex);
    return static_cast<int>(
        std::count_if(mEntries.begin(), mEntries.end(), [&](Entry const& e) { return e.nameSpace == ns; }));
}

std::vector<std::string> Registry::refused() const
{
    std::lock_guard<std::mutex> lock(mMutex);
    return mRefused;
}

int Registry::count(std::string const& name, std::string const& ns) const
{
    std::lock_guard<std::mutex> lock(mMutex);
    return static_cast<int>(std::count_if(
        mEntries.begin(), mEntries.end(), [&](Entry const& e) { return e.name == name && e.nameSpace == ns; }));
}

namespace
{
// The creator interfaces this registry understands; all plugin-creator names live at the same
// slots in both (interface info first, then the V3One creator's methods).
IPluginCreatorV3One* asV3One(IPluginCreatorInterface& c)
{
    InterfaceInfo const info = c.getInterfaceInfo();
    return std::string(info.kind) == "PLUGIN CREATOR_V3ONE" ? static_cast<IPluginCreatorV3One*>(&c) : nullptr;
}
} // namespace

bool Registry::registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const ns) noexcept
{
    IPluginCreatorV3One* c = asV3One(creator);
    if (c == nullptr)
    {
        return false;
    }
    std::string const nameSpace = ns != nullptr ? ns : "";
    std::lock_guard<std::mutex> lock(mMutex);
    for (Entry const& e : mEntries)
    {
        if (e.name == c->getPluginName() && e.version == c->getPluginVersion() && e.nameSpace == nameSpace)
        {
            // TensorRT refuses a second creator of the same name, version, namespace (and logs an error).
            mRefused.push_back(e.name + "/" + e.version + "/" + nameSpace);
            return false;
        }
    }
    mEntries.push_back({&creator, c->getPluginName(), c->getPluginVersion(), nameSpace});
    return true;
}

IPluginCreatorInterface* const* Registry::getAllCreators(int32_t* const n) const noexcept
{
    std::lock_guard<std::mutex> lock(mMutex);
    mList.clear();
    for (Entry const& e : mEntries)
    {
        mList.push_back(e.creator);
    }
    *n = static_cast<int32_t>(mList.size());
    return mList.data();
}

IPluginCreatorInterface* Registry::getCreator(
    AsciiChar const* const name, AsciiChar const* const version, AsciiChar const* const ns) noexcept
{
    std::lock_guard<std::mutex> lock(mMutex);
    for (Entry const& e : mEntries)
    {
        if (e.name == name && e.version == version && e.nameSpace == (ns != nullptr ? ns : ""))
        {
            return e.creator;
        }
    }
    return nullptr;
}

bool Registry::deregisterCreator(IPluginCreatorInterface const& creator) noexcept
{
    std::lock_guard<std::mutex> lock(mMutex);
    auto it = std::find_if(mEntries.begin(), mEntries.end(), [&](Entry const& e) { return e.creator == &creator; });
    if (it == mEntries.end())
    {
        return false;
    }
    mEntries.erase(it);
    return true;
}

Registry::PluginLibraryHandle Registry::loadLibrary(AsciiChar const* path) noexcept
{
    return simulateLoadLibrary(path) ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
}

bool Registry::simulateLoadLibrary(char const* path)
{
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr)
    {
        return false;
    }
    using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
    auto getCreators = reinterpret_cast<GetCreators>(dlsym(handle, "getCreators"));
    if (getCreators == nullptr)
    {
        return false;
    }
    int32_t n = 0;
    IPluginCreatorInterface* const* list = getCreators(n);
    for (int32_t i = 0; i < n; ++i)
    {
        if (list[i] == nullptr || !registerCreator(*list[i], ""))
        {
            return false; // loadLibrary fails if any creator is already registered
        }
    }
    return true;
}

void Logger::log(Severity severity, AsciiChar const* msg) noexcept
{
    std::lock_guard<std::mutex> lock(mMutex);
    mMessages.push_back(std::to_string(static_cast<int>(severity)) + ": " + msg);
}

std::vector<std::string> Logger::messages() const
{
    std::lock_guard<std::mutex> lock(mMutex);
    return mMessages;
}

bool Logger::saw(std::string const& needle) const
{
    std::lock_guard<std::mutex> lock(mMutex);
    return std::any_of(
        mMessages.begin(), mMessages.end(), [&](std::string const& m) { return m.find(needle) != std::string::npos; });
}

void Logger::clear()
{
    std::lock_guard<std::mutex> lock(mMutex);
    mMessages.clear();
}

namespace
{
class DimImpl final : public apiv::VDimensionExpr
{
public:
    DimImpl(bool constant, int64_t value)
        : mConstant(constant)
        , mValue(value)
    {
    }
    bool isConstant() const override { return mConstant; }
    int64_t getConstantValue() const override { return mConstant ? mValue : -1; }
    bool isSizeTensor() const override { return false; }

private:
    bool mConstant;
    int64_t mValue;
};

class Dim final : public IDimensionExpr
{
public:
    Dim(bool constant, int64_t value)
        : mOwned(constant, value)
    {
        mImpl = &mOwned;
    }

private:
    DimImpl mOwned;
};
} // namespace

struct ExprBuilder::Impl final : public apiv::VExprBuilder
{
    std::vector<std::unique_ptr<Dim>> dims;
    IDimensionExpr const* make(bool constant, int64_t value)
    {
        dims.push_back(std::make_unique<Dim>(constant, value));
        return dims.back().get();
    }
    IDimensionExpr const* constant(int64_t value) override { return make(true, value); }
    IDimensionExpr const* operation(DimensionOperation, IDimensionExpr const&, IDimensionExpr const&) override
    {
        return make(false, 0);
    }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override
    {
        return make(false, 0);
    }
};

ExprBuilder::ExprBuilder()
    : mOwned(new Impl())
{
    mImpl = mOwned.get();
}

ExprBuilder::~ExprBuilder() noexcept = default;

IDimensionExpr const* ExprBuilder::symbol()
{
    return mOwned->make(false, 0);
}

DimsExprs ExprBuilder::dims(std::vector<int64_t> const& values)
{
    DimsExprs d{};
    d.nbDims = static_cast<int32_t>(values.size());
    for (size_t i = 0; i < values.size(); ++i)
    {
        d.d[i] = values[i] < 0 ? symbol() : constant(values[i]);
    }
    return d;
}

std::string ownerOf(void const* creator)
{
    Dl_info info{};
    if (creator == nullptr || dladdr(*static_cast<void* const*>(creator), &info) == 0 || info.dli_fname == nullptr)
    {
        return "";
    }
    return info.dli_fname;
}

} // namespace fake

extern "C"
{
    int fakeRegistryCount(char const* ns)
    {
        return fake::Registry::instance().countIn(ns);
    }

    char const* fakeRegistryOwner(char const* name, char const* ns)
    {
        static std::string owner;
        owner = fake::ownerOf(fake::Registry::instance().getCreator(name, "1", ns));
        return owner.c_str();
    }

    int fakeRegistryRefusals()
    {
        return static_cast<int>(fake::Registry::instance().refused().size());
    }
}
