// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1") so that bsjit never links
// libcuda: the CLI, the generator, NVRTC compiles and precompilation run on machines with no GPU
// and no driver; only a GPU op asks for the driver, and fails with a clear Error without one.
#pragma once

#include <cuda.h>

#include <string>

namespace bsjit::runtime {

// The entry points bsjit uses. cuda.h maps some names to versioned symbols (cuMemAlloc →
// cuMemAlloc_v2); the loader resolves exactly the symbol the header declares.
#define BSJIT_DRIVER_FUNCTIONS(X) \
  X(cuInit)                       \
  X(cuGetErrorName)               \
  X(cuGetErrorString)             \
  X(cuDriverGetVersion)           \
  X(cuDeviceGet)                  \
  X(cuDeviceGetCount)             \
  X(cuDeviceGetName)              \
  X(cuDeviceGetAttribute)         \
  X(cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease)    \
  X(cuDevicePrimaryCtxReset)      \
  X(cuCtxGetCurrent)              \
  X(cuCtxSetCurrent)              \
  X(cuCtxGetDevice)               \
  X(cuCtxGetId)                   \
  X(cuCtxSynchronize)             \
  X(cuModuleLoadData)             \
  X(cuModuleUnload)               \
  X(cuModuleGetFunction)          \
  X(cuModuleGetGlobal)            \
  X(cuFuncSetAttribute)           \
  X(cuLaunchKernel)               \
  X(cuMemAlloc)                   \
  X(cuMemFree)                    \
  X(cuMemcpyHtoD)                 \
  X(cuMemcpyHtoDAsync)            \
  X(cuMemcpyDtoH)                 \
  X(cuMemcpyDtoD)                 \
  X(cuMemcpyDtoDAsync)            \
  X(cuMemsetD8)                   \
  X(cuMemsetD32Async)             \
  X(cuPointerGetAttribute)        \
  X(cuStreamCreate)               \
  X(cuStreamDestroy)              \
  X(cuStreamSynchronize)          \
  X(cuEventCreate)                \
  X(cuEventDestroy)               \
  X(cuEventRecord)                \
  X(cuEventSynchronize)           \
  X(cuEventElapsedTime)           \
  X(cuTensorMapEncodeTiled)       \
  X(cuTensorMapEncodeIm2col)      \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)

struct Driver {
#define BSJIT_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  BSJIT_DRIVER_FUNCTIONS(BSJIT_DRIVER_MEMBER)
#undef BSJIT_DRIVER_MEMBER
};

// The loaded and initialised driver (cuInit done). Throws Error naming the reason when libcuda
// cannot be loaded, a symbol is missing, or cuInit fails (no device, driver too old).
const Driver& driver();

// True when driver() would succeed and at least one device is visible. Never throws.
bool gpu_available(std::string* why_not = nullptr);

// Throws Error with the call's text, the error's name and description, and file:line.
void check_cu(CUresult result, const char* call, const char* file, int line);

}  // namespace bsjit::runtime

#define BSJIT_CU(call) ::bsjit::runtime::check_cu((call), #call, __FILE__, __LINE__)
