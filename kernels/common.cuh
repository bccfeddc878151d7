// common.cuh: what every kernel file includes: the host contract (allreduce_params.h) and the
// shared device code, by subject: memory.cuh (memory ordering), vectors.cuh (vectors, the
// reduction, batched loops), sync.cuh (state, flags, barriers), lamport.cuh (self-flagging
// data), push.cuh (the staged push's passes), rows.cuh (the fused kernels' rows); and the macro
// that names a family's kernels.
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
#include "push.cuh"
#include "rows.cuh"

// The element types the kernels are instantiated for, written once: M(..., TNAME, T) for each
// (Rust: TYPES).
#define EAR_FOR_EACH_TYPE(M, ...) \
  M(__VA_ARGS__, f32, float) M(__VA_ARGS__, f16, __half) M(__VA_ARGS__, bf16, __nv_bfloat16)

// Every instance of a family's kernel, one line at the end of its file: DEFINE(FAMILY, BODY,
// TNAME, T, N) for each type and rank count.
#define EAR_DEFINE_INSTANCES(DEFINE, FAMILY, BODY) EAR_FOR_EACH_TYPE(EAR_INSTANCES_OF_TYPE_, DEFINE, FAMILY, BODY)
#define EAR_INSTANCES_OF_TYPE_(DEFINE, FAMILY, BODY, TNAME, T) EAR_FOR_EACH_RANK_COUNT(DEFINE, FAMILY, BODY, TNAME, T)

// ear_<FAMILY>_<TNAME>_n<N>(EarAllReduceParams) running BODY<T, N> on every CTA.
#define EAR_DEFINE_KERNEL(FAMILY, BODY, TNAME, T, N)                                       \
  extern "C" __global__ void __launch_bounds__(EAR_BLOCK_THREADS, 1)                        \
      ear_##FAMILY##_##TNAME##_n##N(const __grid_constant__ EarAllReduceParams params) {    \
    BODY<T, N>(params);                                                                     \
  }
