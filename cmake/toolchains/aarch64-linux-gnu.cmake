# Cross build for 64-bit Arm Linux (Jetson/DRIVE Thor, DGX Spark, Grace) from x86-64 with Debian's
# g++-aarch64-linux-gnu; tools/install.sh uses it when EDGELLM_TARGET=aarch64-unknown-linux-gnu.
# The kernels' fatbin does not depend on the host: nvcc runs here, as in a native build.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# The Rust core is built by cargo for this target (CMakeLists.txt passes the compilers to it).
set(EDGELLM_RUST_TARGET aarch64-unknown-linux-gnu CACHE STRING "Rust target triple of the cross build")
# Only libraries and headers of the target; programs (cargo, nvcc, qemu) are the host's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Tests of target executables run under user-mode emulation (qemu-user-static), libraries from
# the cross toolchain's sysroot.
find_program(EDGELLM_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(EDGELLM_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${EDGELLM_QEMU_AARCH64};-L;/usr/aarch64-linux-gnu")
endif()
