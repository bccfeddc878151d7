// Loads the copy of $<TARGET_FILE:EdgeLLM::Plugin> that the build put beside this program, as
// TensorRT-Model-Connect's runtime loads Edge-LLM's plugin library: dlopen, then initEdgellmPlugins.
#include <dlfcn.h>

#include <cstdio>

int main(int argc, char** argv)
{
    if (argc != 2)
    {
        return 2;
    }
    void* handle = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == nullptr)
    {
        std::fprintf(stderr, "FAILED: dlopen: %s\n", dlerror());
        return 1;
    }
    auto init = reinterpret_cast<bool (*)(void*, char const*)>(dlsym(handle, "initEdgellmPlugins"));
    if (init == nullptr || !init(nullptr, ""))
    {
        std::fprintf(stderr, "FAILED: initEdgellmPlugins\n");
        return 1;
    }
    std::puts("consumer_dlopen: the copied plugin loads and initialises");
    return 0;
}
