/* A stand-in CUDA driver (libcuda.so.1) whose every function but cuInit returns a status that
 * no CUDA release lists (987654), as a newer driver's new code would look to this build. The
 * library must turn it into an error carrying its number, never undefined behaviour (a Rust
 * enum holding an unlisted value killed the process with SIGILL). Loaded by the
 * StandInDriver.* tests through LD_LIBRARY_PATH (tests/CMakeLists.txt). Arguments are not
 * declared: nothing is read or written through them. */
#define UNLISTED 987654u
extern "C" {
unsigned cuInit() { return 0u; }
unsigned cuDriverGetVersion() { return UNLISTED; }
unsigned cuGetErrorName() { return UNLISTED; }
unsigned cuCtxGetDevice() { return UNLISTED; }
unsigned cuDeviceGet() { return UNLISTED; }
unsigned cuDeviceGetCount() { return UNLISTED; }
unsigned cuDeviceGetAttribute() { return UNLISTED; }
unsigned cuDevicePrimaryCtxRetain() { return UNLISTED; }
unsigned cuCtxPushCurrent_v2() { return UNLISTED; }
unsigned cuCtxPopCurrent_v2() { return UNLISTED; }
unsigned cuCtxSynchronize() { return UNLISTED; }
unsigned cuMemcpyDtoDAsync_v2() { return UNLISTED; }
unsigned cuStreamIsCapturing() { return UNLISTED; }
unsigned cuPointerGetAttributes() { return UNLISTED; }
unsigned cuModuleLoadData() { return UNLISTED; }
unsigned cuLaunchKernelEx() { return UNLISTED; }
}
