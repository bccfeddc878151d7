// rmsnorm.cu: residual (+ bias) + RMSNorm alone, after an NCCL all-reduce or on one rank
// (ear_residual_rmsnorm_<t>): no ranks, no workspace, no state, no wait, so any grid is
// correct. ar.input = x (already summed and rounded to T), ar.count = tokens * hidden; the rest
// of ar is ignored. Numerics: fused.cuh's, with N = 1.
#include "fused.cuh"

namespace ear {

// No ranks, no workspace, no state: x (already all-reduced, in T) + bias + residual, norm.
template <typename T>
__device__ __forceinline__ void residual_rmsnorm_body(const EarFusedParams& p) {
  check_fused<T, 0>(p, 0, 0);
  pdl_wait();
  peers_done();  // no peers: the dependent's launch overlaps the whole kernel
  const uint32_t hv = row_vecs<T>(p.hidden);
  const bool vec_ok = (p.hidden * sizeof(T)) % EAR_VEC_BYTES == 0;
  for (uint64_t row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    rmsnorm_row<T>(
        p, row, hv, vec_ok, false,
        [&](uint32_t k) {
          RowIn<1> in;
          in.x.v[0] = load_row_chunk<T>(p.ar.input, row, p.hidden, k, vec_ok);
          fetch_extras<T, 1>(p, row, k, vec_ok, in);
          return in;
        },
        Arrived{}, [&](uint32_t k, const RowIn<1>& in) { return sum_add_residual<T, 1>(p, in, row, k, vec_ok); });
  }
}

}  // namespace ear

#define EAR_DEFINE_RMSNORM_KERNEL(TNAME, T)                                                 \
  extern "C" __global__ void __launch_bounds__(EAR_FUSED_MAX_THREADS, 1)                    \
      ear_residual_rmsnorm_##TNAME(const EarFusedParams params) {                          \
    ear::residual_rmsnorm_body<T>(params);                                                  \
  }

EAR_DEFINE_RMSNORM_KERNEL(f32, float)
EAR_DEFINE_RMSNORM_KERNEL(f16, __half)
EAR_DEFINE_RMSNORM_KERNEL(bf16, __nv_bfloat16)
