// The C++ functions the Rust core calls (declared in the cxx bridge of src/api/bridge.rs). They live in
// cpp/registration.cpp, next to the TensorRT 10/11 registry and logger layouts they depend on.
#pragma once

#include "rust/cxx.h"

#include <cstddef>
#include <cstdint>

namespace trt_edgellm
{
namespace ffi
{
bool trt_log(int32_t severity, rust::Str message) noexcept;
void set_logger(size_t logger) noexcept;
bool register_creator_in_namespace(rust::Str plugin_namespace) noexcept;
} // namespace ffi
} // namespace trt_edgellm
