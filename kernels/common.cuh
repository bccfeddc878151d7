// common.cuh: what every kernel file includes: the host contract (allreduce_params.h) and the
// shared device code, by subject: memory.cuh (memory ordering), vectors.cuh (vectors, the
// reduction, batched loops), sync.cuh (state, flags, barriers), lamport.cuh (self-flagging
// data), rows.cuh (the fused kernels' rows); and the macro that names a family's kernels.
#pragma once

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "allreduce_params.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "the all-reduce kernels need sm_80 or newer"
#endif

namespace ear {

constexpr int kThreads = EAR_BLOCK_THREADS;

}  // namespace ear

#include "memory.cuh"
#include "vectors.cuh"
#include "sync.cuh"
#include "lamport.cuh"
#include "rows.cuh"

// Each kernel file lists its 15 extern "C" kernels with this macro, in one place at its end:
// ear_<FAMILY>_<TNAME>_n<N>(EarAllReduceParams) running BODY<T, N> on every CTA.
#define EAR_DEFINE_KERNEL(FAMILY, BODY, TNAME, T, N)                                       \
  extern "C" __global__ void __launch_bounds__(EAR_BLOCK_THREADS, 1)                        \
      ear_##FAMILY##_##TNAME##_n##N(const __grid_constant__ EarAllReduceParams params) {    \
    BODY<T, N>(params);                                                                     \
  }
