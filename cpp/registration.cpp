// How TensorRT finds the AllReducePlugin creator, and how this library logs through TensorRT.
//
// Three ways in, all supported at once:
//  1. Static registration: when the library is loaded into a process that has TensorRT's plugin
//     registry (`getPluginRegistry`, resolved at run time, so there is no link-time dependency on
//     libnvinfer), the creator registers itself in namespace "" (Edge-LLM's REGISTER_TENSORRT_PLUGIN).
//  2. initEdgellmPlugins(logger, ns) (src/abi.rs) registers it in `ns` unless it is there already.
//  3. IPluginRegistry::loadLibrary / trtexec --dynamicPlugins call getCreators and register what it
//     returns, failing if a creator of the same name is registered: so getCreators first withdraws
//     the statically registered creator, and loadLibrary then registers it without a conflict.
//
// IPluginRegistry, ILogger and ILoggerFinder changed layout in TensorRT 11 (trt-abi.md): the
// methods are called through their vtable slot for the TensorRT major version found in the
// process, so one binary serves TensorRT 10 and 11.

#include "trt_edgellm/plugins/allReducePlugin.h"

#include "edgellm-allreduce/cpp/bridge.h"
#include "edgellm-allreduce/src/lib.rs.h"

#include <dlfcn.h>

#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace trt_edgellm
{
namespace
{
using namespace nvinfer1;
using plugins::AllReducePluginCreator;

//! Vtable slots of the methods this library calls, per TensorRT major version.
struct TrtLayout
{
    int registerCreator;   //!< IPluginRegistry::registerCreator(IPluginCreatorInterface&, char const*)
    int getCreator;        //!< IPluginRegistry::getCreator(char const* name, char const* version, char const* ns)
    int deregisterCreator; //!< IPluginRegistry::deregisterCreator(IPluginCreatorInterface const&)
    int log;               //!< ILogger::log(Severity, char const*)
    int findLogger;        //!< ILoggerFinder::findLogger()
};
constexpr TrtLayout kTrt10{12, 14, 15, 0, 0};
constexpr TrtLayout kTrt11{8, 10, 11, 4, 4};

//! The TensorRT major version of the process: libnvinfer's getInferLibMajorVersion, else its
//! getInferLibVersion (M*10000+m*100+p since 10.0), else the headers this library was built with.
int trtMajor() noexcept
{
    if (auto f = reinterpret_cast<int32_t (*)()>(dlsym(RTLD_DEFAULT, "getInferLibMajorVersion")))
    {
        return f();
    }
    if (auto f = reinterpret_cast<int32_t (*)()>(dlsym(RTLD_DEFAULT, "getInferLibVersion")))
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
    auto get = reinterpret_cast<void* (*) ()>(dlsym(RTLD_DEFAULT, "getPluginRegistry"));
    return get != nullptr ? get() : nullptr;
}

bool registryRegister(void* registry, IPluginCreatorInterface& creator, char const* ns) noexcept
{
    using Fn = bool (*)(void*, IPluginCreatorInterface&, char const*);
    return vtableSlot<Fn>(registry, layout().registerCreator)(registry, creator, ns);
}

IPluginCreatorInterface* registryGet(void* registry, char const* ns) noexcept
{
    using Fn = IPluginCreatorInterface* (*) (void*, char const*, char const*, char const*);
    return vtableSlot<Fn>(registry, layout().getCreator)(registry, "AllReducePlugin", "1", ns);
}

bool registryDeregister(void* registry, IPluginCreatorInterface const& creator) noexcept
{
    using Fn = bool (*)(void*, IPluginCreatorInterface const&);
    return vtableSlot<Fn>(registry, layout().deregisterCreator)(registry, creator);
}

//! One creator per plugin namespace. Whether one is registered is asked of the registry itself
//! (getCreator), so every way in sees what the others did. Function-local so that it exists
//! before the static registrar below runs, whatever the initialization order.
struct Creators
{
    std::mutex mutex;
    std::map<std::string, std::unique_ptr<AllReducePluginCreator>> byNamespace;

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
};

Creators& creators()
{
    static Creators* instance = new Creators(); // never destroyed: TensorRT may hold the creators until exit
    return *instance;
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
        AllReducePluginCreator& creator = c.get(ns);
        if (IPluginCreatorInterface* present = registryGet(registry, ns.c_str()))
        {
            if (present != static_cast<IPluginCreatorInterface*>(&creator))
            {
                ffi::log_error("AllReducePlugin (version 1, namespace \"" + ns
                    + "\") is already registered by another library (is Edge-LLM's own plugin library loaded too?)");
                return false;
            }
            return true;
        }
        if (!registryRegister(registry, creator, ns.c_str()))
        {
            ffi::log_error("TensorRT refused to register AllReducePlugin (version 1, namespace \"" + ns + "\")");
            return false;
        }
        return true;
    }
    catch (std::exception const& e)
    {
        ffi::log_error(std::string("registering the AllReducePlugin creator: ") + e.what());
        return false;
    }
}

//! Static registration at load time, as Edge-LLM's REGISTER_TENSORRT_PLUGIN does.
struct StaticRegistrar
{
    StaticRegistrar()
    {
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
            AllReducePluginCreator& creator = c.get("");
            // loadLibrary registers what we return and fails on a duplicate: withdraw ours first.
            void* registry = pluginRegistry();
            if (registry != nullptr && registryGet(registry, "") == static_cast<IPluginCreatorInterface*>(&creator))
            {
                registryDeregister(registry, creator);
            }
            static nvinfer1::IPluginCreatorInterface* list[1];
            list[0] = &creator;
            nbCreators = 1;
            return list;
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
