// The seed's C++ API (C++ linkage, so the compiler writes the mangled names callers expect),
// forwarding to the Rust core.

#include "trt_edgellm/plugins/allReducePlugin.h"

#include "edgellm-allreduce/src/api/bridge.rs.h"

namespace trt_edgellm
{
namespace plugins
{

void registerNcclCommForAllReducePlugin(int deviceId, void* ncclComm, void* ncclAllReduceFunc) noexcept
{
    edgellmRegisterNcclCommForAllReducePlugin(deviceId, ncclComm, ncclAllReduceFunc);
}

void getNcclRegistrationForDevice(int deviceId, void** ncclComm, void** ncclAllReduceFunc) noexcept
{
    ffi::NcclRegistration const r = ffi::nccl_registration(deviceId);
    if (ncclComm != nullptr)
    {
        *ncclComm = reinterpret_cast<void*>(r.comm);
    }
    if (ncclAllReduceFunc != nullptr)
    {
        *ncclAllReduceFunc = reinterpret_cast<void*>(r.all_reduce);
    }
}

void* getNcclCommForDevice(int deviceId) noexcept
{
    return reinterpret_cast<void*>(ffi::nccl_registration(deviceId).comm);
}

void* getNcclAllReduceFunc() noexcept
{
    return reinterpret_cast<void*>(ffi::last_nccl_all_reduce());
}

} // namespace plugins
} // namespace trt_edgellm
