// The namespace the CUDA kernels' host symbols live in. The emulated build (tests/kernels/emulator)
// compiles the kernels as host C++ into a test binary; an inline namespace of its own keeps its
// symbols apart from libtost_kernels.so's while the sources keep writing `gpu::`.
#pragma once

#ifdef TOST_CUDA_EMULATION
#define TOST_GPU_BACKEND_NAMESPACE_BEGIN inline namespace emulated {
#else
#define TOST_GPU_BACKEND_NAMESPACE_BEGIN inline namespace device {
#endif
#define TOST_GPU_BACKEND_NAMESPACE_END }
