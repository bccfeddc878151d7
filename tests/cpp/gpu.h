// Whether this machine has a GPU, for the tests that need one: they skip without (CPU ctest
// stays green; tools/gpu/ runs them on a GPU machine).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace testlib
{
inline bool haveGpu()
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
} // namespace testlib

#define REQUIRE_GPU()                                                                                                  \
    if (!testlib::haveGpu())                                                                                           \
    GTEST_SKIP() << "no CUDA device"
