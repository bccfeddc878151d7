// How TensorRT finds this library's creators, how Edge-LLM's own plugin library (the overlay's
// base, src/overlay/) shares the registry with it, and how this library logs through TensorRT.
// This file does the registry's mechanics; what to replace, which creators are the base's and
// where they are registered is decided in Rust (src/overlay/policy.rs, asked through ffi::overlay_*).
//
// Three ways in, all supported at once:
//  1. Static registration when the library is loaded: it makes its exports global, has the base
//     loaded (whose own static registrations fill the registry), then registers AllReducePlugin
//     in namespace "", replacing the base's (Edge-LLM's REGISTER_TENSORRT_PLUGIN, plus the overlay).
//  2. initEdgellmPlugins(logger, ns) (src/api/abi.rs) registers ours in `ns`, replacing any other
//     AllReducePlugin there, and for ns != "" the base's other creators too.
//  3. IPluginRegistry::loadLibrary / trtexec --dynamicPlugins call getCreators and register what it
//     returns, failing on a duplicate: getCreators returns ours and the base's, and withdraws
//     them from the registry first so that loadLibrary registers them without a conflict.
//
// TensorRT's registry may be in the process without being global (the Python path loads
// libnvinfer through its bindings, RTLD_LOCAL): it is found by name then (trtSymbol).
// IPluginRegistry, ILogger and ILoggerFinder changed layout in TensorRT 11: the methods are
// called through their vtable slot for the TensorRT major version found in the process, so one
// binary serves TensorRT 10 and 11.

#include "trt_edgellm/plugins/allReducePlugin.h"

#include "edgellm-allreduce/cpp/bridge.h"
#include "edgellm-allreduce/src/api/bridge.rs.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace trt_edgellm
{
namespace
{
using namespace nvinfer1;
using plugins::AllReducePluginCreator;

char const* const kName = "AllReducePlugin";
char const* const kVersion = "1";

//! Vtable slots of the methods this library calls, per TensorRT major version.
struct TrtLayout
{
    int registerCreator;   //!< IPluginRegistry::registerCreator(IPluginCreatorInterface&, char const*)
    int getAllCreators;    //!< IPluginRegistry::getAllCreators(int32_t*)
    int getCreator;        //!< IPluginRegistry::getCreator(char const* name, char const* version, char const* ns)
    int deregisterCreator; //!< IPluginRegistry::deregisterCreator(IPluginCreatorInterface const&)
    int log;               //!< ILogger::log(Severity, char const*)
    int findLogger;        //!< ILoggerFinder::findLogger()
};
constexpr TrtLayout kTrt10{12, 13, 14, 15, 0, 0};
constexpr TrtLayout kTrt11{8, 9, 10, 11, 4, 4};

//! A symbol of TensorRT's runtime: from the global scope, else from a libnvinfer that is loaded
//! locally (RTLD_NOLOAD never loads one).
void* trtSymbol(char const* name) noexcept
{
    if (void* global = dlsym(RTLD_DEFAULT, name))
    {
        return global;
    }
    for (char const* soname : {"libnvinfer.so.11", "libnvinfer.so.10"})
    {
        if (void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD))
        {
            void* symbol = dlsym(handle, name);
            dlclose(handle); // only drops the reference RTLD_NOLOAD took
            if (symbol != nullptr)
            {
                return symbol;
            }
        }
    }
    return nullptr;
}

//! The TensorRT major version of the process: libnvinfer's getInferLibMajorVersion, else its
//! getInferLibVersion (M*10000+m*100+p since 10.0), else the headers this library was built with.
int trtMajor() noexcept
{
    if (auto f = reinterpret_cast<int32_t (*)()>(trtSymbol("getInferLibMajorVersion")))
    {
        return f();
    }
    if (auto f = reinterpret_cast<int32_t (*)()>(trtSymbol("getInferLibVersion")))
    {
        int32_t const v = f();
        return v >= 100000 ? v / 10000 : v / 1000;
    }
    return NV_TENSORRT_MAJOR;
}

TrtLayout const& layout() noexcept
{
    return trtMajor() >= 11 ? kTrt11 : kTrt10;
}

template <typename Fn>
Fn vtableSlot(void const* object, int slot) noexcept
{
    return reinterpret_cast<Fn>((*reinterpret_cast<void* const* const*>(object))[slot]);
}

//! TensorRT's plugin registry when libnvinfer (or a stand-in) is in the process, else null.
void* pluginRegistry() noexcept
{
    auto get = reinterpret_cast<void* (*) ()>(trtSymbol("getPluginRegistry"));
    return get != nullptr ? get() : nullptr;
}

bool registryRegister(void* registry, IPluginCreatorInterface& creator, char const* ns) noexcept
{
    using Fn = bool (*)(void*, IPluginCreatorInterface&, char const*);
    return vtableSlot<Fn>(registry, layout().registerCreator)(registry, creator, ns);
}

std::vector<IPluginCreatorInterface*> registryAll(void* registry) noexcept
{
    using Fn = IPluginCreatorInterface* const* (*) (void*, int32_t*);
    int32_t n = 0;
    IPluginCreatorInterface* const* list = vtableSlot<Fn>(registry, layout().getAllCreators)(registry, &n);
    return list != nullptr && n > 0 ? std::vector<IPluginCreatorInterface*>(list, list + n)
                                    : std::vector<IPluginCreatorInterface*>{};
}

IPluginCreatorInterface* registryGet(void* registry, char const* name, char const* version, char const* ns) noexcept
{
    using Fn = IPluginCreatorInterface* (*) (void*, char const*, char const*, char const*);
    return vtableSlot<Fn>(registry, layout().getCreator)(registry, name, version, ns);
}

bool registryDeregister(void* registry, IPluginCreatorInterface const& creator) noexcept
{
    using Fn = bool (*)(void*, IPluginCreatorInterface const&);
    return vtableSlot<Fn>(registry, layout().deregisterCreator)(registry, creator);
}

//! Text from the registry as bytes for the Rust side (it need not be UTF-8: a rust::Str would throw).
rust::Slice<uint8_t const> bytes(char const* text) noexcept
{
    return text == nullptr ? rust::Slice<uint8_t const>()
                           : rust::Slice<uint8_t const>(reinterpret_cast<uint8_t const*>(text), std::strlen(text));
}

//! The name and version of a V3 creator (the kind every Edge-LLM plugin has); null for others.
IPluginCreatorV3One* asV3One(IPluginCreatorInterface* creator) noexcept
{
    return creator != nullptr && std::strcmp(creator->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0
        ? static_cast<IPluginCreatorV3One*>(creator)
        : nullptr;
}

//! The library a creator's code lives in (its vtable's object): file and load address.
struct Owner
{
    std::string file;
    uintptr_t address = 0;
};
Owner ownerOf(void const* object) noexcept
{
    Dl_info info{};
    if (object == nullptr || dladdr(*static_cast<void* const*>(object), &info) == 0 || info.dli_fname == nullptr)
    {
        return {};
    }
    return {info.dli_fname, reinterpret_cast<uintptr_t>(info.dli_fbase)};
}

//! A creator of the base, as registered in a namespace other than "": its own object stays the
//! one registered in "" (by the base itself), so that every registration has an object of its
//! own and withdrawing one (getCreators, deregisterCreator) can never take another namespace's.
class NamespacedCreator final : public IPluginCreatorV3One
{
public:
    NamespacedCreator(IPluginCreatorV3One& base, std::string ns)
        : mBase(base)
        , mNamespace(std::move(ns))
    {
    }
    char const* getPluginName() const noexcept override { return mBase.getPluginName(); }
    char const* getPluginVersion() const noexcept override { return mBase.getPluginVersion(); }
    char const* getPluginNamespace() const noexcept override { return mNamespace.c_str(); }
    PluginFieldCollection const* getFieldNames() noexcept override { return mBase.getFieldNames(); }
    IPluginV3* createPlugin(char const* name, PluginFieldCollection const* fc, TensorRTPhase phase) noexcept override
    {
        return mBase.createPlugin(name, fc, phase);
    }

private:
    IPluginCreatorV3One& mBase;
    std::string mNamespace;
};

//! One creator per plugin namespace. Whether one is registered is asked of the registry itself
//! (getCreator), so every way in sees what the others did. Function-local so that it exists
//! before the static registrar below runs, whatever the initialization order.
struct Creators
{
    std::mutex mutex;
    std::map<std::string, std::unique_ptr<AllReducePluginCreator>> byNamespace;
    std::vector<IPluginCreatorInterface*> base; //!< the base's creators but its AllReducePlugin
    std::vector<std::unique_ptr<NamespacedCreator>> namespaced; //!< the base's, in namespaces other than ""

    AllReducePluginCreator& get(std::string const& ns)
    {
        auto& slot = byNamespace[ns];
        if (!slot)
        {
            slot = std::make_unique<AllReducePluginCreator>();
            slot->setPluginNamespace(ns.c_str());
        }
        return *slot;
    }

    //! The base's creators as the registry holds them (found by where their code lives), kept
    //! once found so that getCreators can return them again after loadLibrary took them over.
    std::vector<IPluginCreatorInterface*> const& baseCreators(void* registry)
    {
        uintptr_t const baseAddress = ffi::overlay_base_address();
        if (base.empty() && baseAddress != 0)
        {
            for (IPluginCreatorInterface* c : registryAll(registry))
            {
                IPluginCreatorV3One* v3 = asV3One(c);
                bool const seen = std::find(base.begin(), base.end(), c) != base.end();
                if (v3 != nullptr && !seen
                    && ffi::overlay_is_base_creator(
                        bytes(c->getInterfaceInfo().kind), bytes(v3->getPluginName()), ownerOf(c).address))
                {
                    base.push_back(c);
                }
            }
        }
        return base;
    }
};

Creators& creators()
{
    static Creators* instance = new Creators(); // never destroyed: TensorRT may hold the creators until exit
    return *instance;
}

//! Registers ours as AllReducePlugin in `ns`, withdrawing a creator of another library there
//! first, and the base's other creators in `ns` where the policy mirrors them. Caller holds the lock.
bool registerLocked(Creators& c, void* registry, std::string const& ns)
{
    AllReducePluginCreator& ours = c.get(ns);
    IPluginCreatorInterface* present = registryGet(registry, kName, kVersion, ns.c_str());
    if (present != static_cast<IPluginCreatorInterface*>(&ours))
    {
        if (present != nullptr)
        {
            Owner const owner = ownerOf(present);
            if (!ffi::overlay_replaces_all_reduce(ns, bytes(owner.file.c_str()), owner.address))
            {
                return true;
            }
            registryDeregister(registry, *present);
        }
        if (!registryRegister(registry, ours, ns.c_str()))
        {
            ffi::log_error("TensorRT refused to register AllReducePlugin (version 1, namespace \"" + ns + "\")");
            return false;
        }
    }
    if (ffi::overlay_mirrors_base_in(ns))
    {
        for (IPluginCreatorInterface* b : c.baseCreators(registry))
        {
            IPluginCreatorV3One* v3 = asV3One(b);
            if (registryGet(registry, v3->getPluginName(), v3->getPluginVersion(), ns.c_str()) != nullptr)
            {
                continue;
            }
            c.namespaced.push_back(std::make_unique<NamespacedCreator>(*v3, ns));
            if (!registryRegister(registry, *c.namespaced.back(), ns.c_str()))
            {
                ffi::log_warning(std::string("TensorRT refused to register Edge-LLM's ") + v3->getPluginName()
                    + " in namespace \"" + ns + "\"");
            }
        }
    }
    return true;
}

bool registerIn(std::string const& ns) noexcept
{
    try
    {
        void* registry = pluginRegistry();
        if (registry == nullptr)
        {
            return true; // no TensorRT in the process (yet): nothing to register with
        }
        Creators& c = creators();
        std::lock_guard<std::mutex> lock(c.mutex);
        return registerLocked(c, registry, ns);
    }
    catch (std::exception const& e)
    {
        ffi::log_error(std::string("registering the AllReducePlugin creator: ") + e.what());
        return false;
    }
}

//! What happens when the library is loaded: exports made global, the base loaded (an Edge-LLM
//! library that registered AllReducePlugin first is adopted as the base), then ours registered.
struct StaticRegistrar
{
    StaticRegistrar()
    {
        ffi::overlay_promote_to_global_scope();
        std::string preloaded;
        if (void* registry = pluginRegistry())
        {
            preloaded = ownerOf(registryGet(registry, kName, kVersion, "")).file;
        }
        ffi::overlay_load(preloaded);
        registerIn(""); // a refusal is logged there
    }
} const gStaticRegistrar;

std::atomic<void*> gLogger{nullptr};
std::atomic<void*> gLoggerFinder{nullptr};

} // namespace

namespace ffi
{
bool trt_log(int32_t severity, rust::Str message) noexcept
{
    try
    {
        TrtLayout const& l = layout();
        void* logger = gLogger.load();
        if (logger == nullptr)
        {
            if (void* finder = gLoggerFinder.load())
            {
                logger = vtableSlot<void* (*) (void*)>(finder, l.findLogger)(finder);
            }
        }
        if (logger == nullptr)
        {
            return false;
        }
        std::string const text(message);
        vtableSlot<void (*)(void*, int32_t, char const*)>(logger, l.log)(logger, severity, text.c_str());
        return true;
    }
    catch (...)
    {
        return false;
    }
}

void set_logger(size_t logger) noexcept
{
    gLogger.store(reinterpret_cast<void*>(logger));
}

bool register_creator_in_namespace(rust::Str pluginNamespace) noexcept
{
    try
    {
        return registerIn(std::string(pluginNamespace));
    }
    catch (...)
    {
        return false;
    }
}
} // namespace ffi
} // namespace trt_edgellm

// TensorRT's entry points for dynamically loaded plugin libraries (vfcCommon.h).
extern "C"
{
    EDGELLM_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) noexcept
    {
        using namespace trt_edgellm;
        nbCreators = 0;
        try
        {
            Creators& c = creators();
            std::lock_guard<std::mutex> lock(c.mutex);
            static std::vector<nvinfer1::IPluginCreatorInterface*> list;
            list.assign(1, &c.get(""));
            void* registry = pluginRegistry();
            if (registry != nullptr)
            {
                auto const& base = c.baseCreators(registry);
                list.insert(list.end(), base.begin(), base.end());
                // loadLibrary registers what we return and fails on a duplicate: withdraw them first.
                for (nvinfer1::IPluginCreatorInterface* creator : list)
                {
                    nvinfer1::IPluginCreatorV3One* v3 = asV3One(creator);
                    if (registryGet(registry, v3->getPluginName(), v3->getPluginVersion(), "") == creator)
                    {
                        registryDeregister(registry, *creator);
                    }
                }
            }
            nbCreators = static_cast<int32_t>(list.size());
            return list.data();
        }
        catch (std::exception const& e)
        {
            ffi::log_error(std::string("getCreators: ") + e.what());
            return nullptr;
        }
    }

    //! TensorRT 10.0-10.2 asked for this V2-era entry point; this library has no V2 creators.
    EDGELLM_PLUGIN_EXPORT nvinfer1::IPluginCreator* const* getPluginCreators(int32_t& nbCreators) noexcept
    {
        static nvinfer1::IPluginCreator* none[1] = {nullptr};
        nbCreators = 0;
        return none;
    }

    EDGELLM_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
    {
        trt_edgellm::gLoggerFinder.store(finder);
    }
}
