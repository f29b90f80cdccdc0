// NVRTC: generated source → cubin for one explicit target.
#pragma once

#include <string>
#include <vector>

#include "generator/device_tables.hpp"
#include "generator/matmul_generator.hpp"

namespace bsjit::runtime {

struct CompiledKernel {
  std::vector<char> cubin;
  std::string lowered_name;  // from nvrtcGetLoweredName, never hand-mangled
  std::string arch;          // "sm_90a"
  std::vector<std::string> options;
  std::string log;
  int shared_bytes = 0;  // dynamic shared memory the kernel is launched with (set by the generator's plan)
  // The layout's tables, copied into the module by load() (generator/device_tables.hpp); the cubin
  // holds them empty.
  generator::DeviceTables tables;
};

// "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", ...: throws Error for anything NVRTC cannot target
// or below sm_80 (the tensor-core kernels need mma.sync bf16).
void check_arch(const std::string& arch);

// The target kernels are compiled for on a device of device_arch when the caller names none: the
// arch-specific "sm_90a" on compute capability 9.0 (its wgmma kernels run only there, which is where
// they are loaded), the device's own arch elsewhere.
std::string default_kernel_arch(const std::string& device_arch);

std::vector<std::string> compile_options(const std::string& arch);
std::string nvrtc_version();  // "13.0"

// NVRTC (12.9 and later) keeps the cubins it builds in the driver's compute cache (~/.nv/ComputeCache,
// CUDA_CACHE_DISABLE / CUDA_CACHE_MAXSIZE) where a driver is installed: an identical program compiled
// again, in this process or another, returns in tens of milliseconds. bsjit's own cache comes first;
// `bypass` (the benchmark's cold-compile figures) makes NVRTC compile whatever the driver holds.
enum class DriverCache { use, bypass };

// The lines of an NVRTC log where ptxas reports a "Potential Performance Loss" (C7510-C7520: it
// serialized a kernel's wgmmas, each waiting for the one before it), joined by newlines; empty
// where there are none. compile() logs them as a warning: bsjit's own tile shapes have none
// (tests/runtime/compiler_test.cpp).
std::string performance_losses(const std::string& log);

// Throws Error carrying the NVRTC log, the options and the path where the generated source was
// written, when compilation fails.
CompiledKernel compile(const std::string& source, const std::string& name_expression, const std::string& label,
                       const std::string& arch, DriverCache driver_cache = DriverCache::use);

}  // namespace bsjit::runtime
