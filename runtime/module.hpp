// Loading compiled kernels into CUDA contexts and launching them.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cache/kernel_cache.hpp"

namespace bsjit::runtime {

// The calling thread's current context; when it has none, device 0's primary context is retained
// and made current (what the CUDA runtime API would do on first use).
CUcontext current_context();

// "sm_90" for a compute capability 9.0 device: the arch a kernel is compiled for by default.
std::string context_arch(CUcontext ctx);

// One compiled kernel loaded into one context: module and function. Modules stay loaded for the
// life of the process (contexts are not destroyed under a running library).
struct LoadedKernel {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
};
LoadedKernel load(const CompiledKernel& kernel, CUcontext ctx);

struct LaunchShape {
  std::uint32_t grid_x = 1, grid_y = 1, threads = 1, shared_bytes = 0;
};
void launch(CUfunction function, const LaunchShape& shape, CUstream stream, void** args);

}  // namespace bsjit::runtime
