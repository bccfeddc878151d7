// The suite's main. `--no-gpu` runs every test but the GPU ones; `--gpu` runs the GPU ones alone,
// and without a CUDA device exits with 77, which ctest reports as skipped (SKIP_RETURN_CODE)
// instead of counting tests that never ran as passed. No flag: everything (the GPU machine).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

namespace
{
char const* const kGpuTests = "Gpu.*:GpuFusedChain.*:NoKernelImage.*:MultiProcess.*:MultiProcessOneGpu.*";

//! Removes `flag` from argv; whether it was there.
bool takeFlag(int& argc, char** argv, char const* flag)
{
    for (int i = 1; i < argc; ++i)
    {
        if (std::strcmp(argv[i], flag) == 0)
        {
            for (int j = i; j < argc; ++j)
            {
                argv[j] = argv[j + 1];
            }
            --argc;
            return true;
        }
    }
    return false;
}
} // namespace

int main(int argc, char** argv)
{
    bool const gpuOnly = takeFlag(argc, argv, "--gpu");
    bool const noGpu = takeFlag(argc, argv, "--no-gpu");
    testing::InitGoogleTest(&argc, argv);
    if (gpuOnly)
    {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
        {
            std::printf("no CUDA device: the GPU tests (%s) are skipped\n", kGpuTests);
            return 77;
        }
        GTEST_FLAG_SET(filter, kGpuTests);
    }
    else if (noGpu)
    {
        GTEST_FLAG_SET(filter, std::string("-") + kGpuTests);
    }
    return RUN_ALL_TESTS();
}
