#include "driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "bsjit/error.hpp"

namespace bsjit::runtime {
namespace {

// cuda.h defines e.g. `#define cuMemAlloc cuMemAlloc_v2`: expanding the argument before
// stringizing gives the symbol the declaration refers to.
#define BSJIT_STRINGIZE_EXPANDED(x) BSJIT_STRINGIZE(x)
#define BSJIT_STRINGIZE(x) #x

struct Loaded {
  Driver driver;
  std::string error;  // empty when usable
};

Loaded load() {
  Loaded l;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    l.error = fmt::format(
        "cannot load the CUDA driver library libcuda.so.1 ({}). GPU ops need an NVIDIA driver; layouts, "
        "code generation and precompilation (bsjit precompile) work without one",
        e ? e : "unknown reason");
    return l;
  }
#define BSJIT_DRIVER_RESOLVE(name)                                                                       \
  l.driver.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, BSJIT_STRINGIZE_EXPANDED(name)));       \
  if (l.driver.name == nullptr) {                                                                        \
    l.error = fmt::format("the CUDA driver libcuda.so.1 lacks the symbol {}; the driver is too old",     \
                          BSJIT_STRINGIZE_EXPANDED(name));                                               \
    return l;                                                                                            \
  }
  BSJIT_DRIVER_FUNCTIONS(BSJIT_DRIVER_RESOLVE)
#undef BSJIT_DRIVER_RESOLVE
  CUresult r = l.driver.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    l.driver.cuGetErrorName(r, &name);
    l.error = fmt::format("cuInit failed with {}: no usable GPU or driver", name ? name : "an unknown error");
  }
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw Error("bsjit: " + l.error);
  return l.driver;
}

bool gpu_available(std::string* why_not) {
  const Loaded& l = loaded();
  if (!l.error.empty()) {
    if (why_not) *why_not = l.error;
    return false;
  }
  int count = 0;
  if (l.driver.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    if (why_not) *why_not = "the CUDA driver reports no device";
    return false;
  }
  return true;
}

void check_cu(CUresult result, const char* call, const char* file, int line) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "unknown";
  const char* text = "unknown";
  const Driver& d = driver();
  d.cuGetErrorName(result, &name);
  d.cuGetErrorString(result, &text);
  throw Error(fmt::format("bsjit: {} failed: {} ({}) at {}:{}", call, name, text, file, line));
}

}  // namespace bsjit::runtime
