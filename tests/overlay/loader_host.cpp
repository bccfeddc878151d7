// Stand-in hosts that load the plugin library exactly as two of its loaders do, then look for
// AllReducePlugin in the stand-in TensorRT registry (../cpp/fake_tensorrt.*), as those loaders'
// TensorRT does when a network or an engine names it. Built twice (tests/CMakeLists.txt):
//
// TRTEXEC (trtexec --staticPlugins=LIB, as NVIDIA's edgellm-bench runs it): trtexec links
//   libnvinfer, so this host links the stand-in libnvinfer.so.<major>. TensorRT's
//   samples/trtexec/trtexec.cpp (main, "Loading supplied plugin library") loads each
//   --staticPlugins library with samplesCommon::loadLibrary (samples/common/common.h,
//   DynamicLibrary: dlopen(path, RTLD_LAZY), RTLD_NODELETE only in ASAN builds), after
//   initLibNvInferPlugins(logger, "") of TensorRT's own plugin library, and calls nothing in it:
//   the library's static registrations are all it relies on. The handle is dlclose()d when
//   trtexec's main returns (its destructor asserts that dlclose returns 0).
//
// CTYPES (the Python direct builder, tensorrt-edgellm-build --plugin-path LIB, in C): its
//   core/builder.py imports tensorrt (whose bindings load libnvinfer RTLD_LOCAL), then
//   load_plugin_library() runs ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), which CPython turns
//   into dlopen(path, RTLD_NOW | RTLD_GLOBAL), and finds creators with
//   trt.get_plugin_registry().get_creator(name, "1", "") (ops/backend.py); nothing else is
//   called. So this host does not link the stand-in: it loads it RTLD_LOCAL first. (On a native
//   machine tests/overlay/direct_builder_test.py does the same from Python itself; this one also
//   runs under qemu-aarch64 in a cross build, where there is no aarch64 Python.)
//
// Usage: loader_host LIBRARY STANDIN CREATORS [BASE]
//   LIBRARY   the plugin library (the installed one)
//   STANDIN   the stand-in libnvinfer.so.<major> (CTYPES loads it; TRTEXEC checks it is linked)
//   CREATORS  how many creators the load must leave registered (24 with Edge-LLM 0.11's base, 1 alone)
//   BASE      the file whose creators serve the others (RmsNormPlugin), when there is a base
// Exit 0 when every check passes; each check prints one line.

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace
{
int failures = 0;

void check(bool ok, std::string const& what)
{
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    failures += ok ? 0 : 1;
}

std::string canonical(char const* path)
{
    char buffer[PATH_MAX];
    return path != nullptr && realpath(path, buffer) != nullptr ? std::string(buffer) : std::string(path ? path : "");
}

// The stand-in registry's C view (fake_tensorrt.h), found in the stand-in library.
struct Registry
{
    int (*count)(char const* ns);
    char const* (*owner)(char const* name, char const* ns);
    int (*refusals)();
};

bool resolve(void* standin, Registry& r)
{
    r.count = reinterpret_cast<int (*)(char const*)>(dlsym(standin, "fakeRegistryCount"));
    r.owner = reinterpret_cast<char const* (*) (char const*, char const*)>(dlsym(standin, "fakeRegistryOwner"));
    r.refusals = reinterpret_cast<int (*)()>(dlsym(standin, "fakeRegistryRefusals"));
    return r.count && r.owner && r.refusals;
}
} // namespace

int main(int argc, char** argv)
{
    if (argc < 4)
    {
        std::fprintf(stderr, "usage: %s LIBRARY STANDIN CREATORS [BASE]\n", argv[0]);
        return 2;
    }
    char const* library = argv[1];
    char const* standinPath = argv[2];
    int const creators = std::atoi(argv[3]);
    std::string const base = argc > 4 ? canonical(argv[4]) : "";

#if defined(EDGELLM_LOADER_TRTEXEC)
    std::printf("trtexec --staticPlugins=%s\n", library);
    // trtexec links libnvinfer: the stand-in is in the process, in the global scope, from the start.
    char const* slash = std::strrchr(standinPath, '/');
    void* standin = dlopen(slash != nullptr ? slash + 1 : standinPath, RTLD_LAZY | RTLD_NOLOAD); // by its soname
    check(standin != nullptr, "the stand-in libnvinfer is linked into the host, as libnvinfer into trtexec");
    if (standin == nullptr)
    {
        return 1;
    }
    void* handle = dlopen(library, RTLD_LAZY); // samplesCommon::DynamicLibrary
#elif defined(EDGELLM_LOADER_CTYPES)
    std::printf("tensorrt-edgellm-build --plugin-path %s (in C)\n", library);
    void* standin = dlopen(standinPath, RTLD_NOW | RTLD_LOCAL); // import tensorrt
    check(standin != nullptr, std::string("TensorRT (the stand-in) loaded RTLD_LOCAL, as its Python bindings load it")
            + (standin ? "" : std::string(": ") + dlerror()));
    if (standin == nullptr)
    {
        return 1;
    }
    void* handle = dlopen(library, RTLD_NOW | RTLD_GLOBAL); // ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
#else
#error "build with EDGELLM_LOADER_TRTEXEC or EDGELLM_LOADER_CTYPES"
#endif
    check(handle != nullptr, std::string("the library loads") + (handle ? "" : std::string(": ") + dlerror()));
    if (handle == nullptr)
    {
        return 1;
    }

    Registry registry{};
    check(resolve(standin, registry), "the stand-in registry answers");
    if (failures != 0)
    {
        return 1;
    }
    // Nothing of the library was called: what follows is its static registration alone.
    std::string const ours = canonical(library);
    check(canonical(registry.owner("AllReducePlugin", "")) == ours,
        "AllReducePlugin/1 in namespace \"\" is served by ours (" + ours + ")");
    check(registry.count("") == creators,
        "creators registered: " + std::to_string(registry.count("")) + " (expected " + std::to_string(creators) + ")");
    check(registry.refusals() == 0, "no duplicate registration (TensorRT would log an error for each)");
    if (!base.empty())
    {
        std::string const rms = canonical(registry.owner("RmsNormPlugin", ""));
        check(rms == base, "RmsNormPlugin is the base's (" + rms + ")");
    }
    void* exported = dlsym(RTLD_DEFAULT, "edgellmRegisterNcclCommForAllReducePlugin");
    check(exported != nullptr && exported == dlsym(handle, "edgellmRegisterNcclCommForAllReducePlugin"),
        "dlsym(RTLD_DEFAULT, edgellmRegisterNcclCommForAllReducePlugin) finds ours");

#if defined(EDGELLM_LOADER_TRTEXEC)
    // trtexec's main returns: ~DynamicLibrary asserts dlclose() == 0. The registry keeps our
    // creators, so the library must stay mapped (it made itself RTLD_NODELETE).
    check(dlclose(handle) == 0, "dlclose() returns 0, as trtexec asserts when it exits");
    check(dlopen(library, RTLD_LAZY | RTLD_NOLOAD) != nullptr, "the library stays loaded: the registry's creators stay valid");
    check(canonical(registry.owner("AllReducePlugin", "")) == ours, "AllReducePlugin is still ours after dlclose()");
#endif
    std::printf("%s\n", failures == 0 ? "PASS" : "FAILED");
    return failures == 0 ? 0 : 1;
}
