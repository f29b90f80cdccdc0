// Loading compiled kernels into CUDA contexts and launching them.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bsjit/error.hpp"
#include "bsjit/types.hpp"
#include "cache/kernel_cache.hpp"

namespace bsjit::runtime {

// A CUDA context as bsjit keys what it loads and allocates there: the handle, and the driver's id
// of the context (cuCtxGetId), unique for the life of the process. A context destroyed and made
// again (cudaDeviceReset or cuDevicePrimaryCtxReset, then the next use; cuCtxDestroy, then
// cuCtxCreate) may get the same handle back, never the same id: so nothing loaded into the old one
// is launched in the new one, and nothing of the old one is unloaded or freed in the new one.
struct Context {
  CUcontext handle = nullptr;
  unsigned long long id = 0;
  friend bool operator<(const Context& a, const Context& b) { return a.id < b.id; }
  friend bool operator==(const Context& a, const Context& b) { return a.id == b.id; }
};

// The calling thread's current context; when it has none, device 0's primary context is retained
// and made current (what the CUDA runtime API would do on first use).
Context current_context();
// ctx's handle with its id.
Context context_of(CUcontext handle);

// Whether ctx is still the context it was: its handle names a live context of the same id. A
// primary context's handle outlives its resets, so for those this is exact; for a context the
// application destroyed with cuCtxDestroy, the driver answers for a stale handle with an error, as
// it does for every other call bsjit would make with it.
bool alive(const Context& ctx);

// "sm_90" for a compute capability 9.0 device (kernels for it: default_kernel_arch).
std::string context_arch(const Context& ctx);
// The SM count of ctx's device.
int context_sms(const Context& ctx);
// The L2 cache size of ctx's device, in bytes.
int context_l2_bytes(const Context& ctx);

// One compiled kernel loaded into one context: module, function, and the device memory that holds
// the values of its pointer tables (0: none; generator/device_tables.hpp).
struct LoadedKernel {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  CUdeviceptr tables = 0;
};
// Throws LoadError where the driver refuses the code itself, Error for any other failure.
LoadedKernel load(const CompiledKernel& kernel, const Context& ctx);
// load()'s failure where the driver refuses the code itself: an image it cannot load, a function
// the module lacks, tables that do not match the module's symbols. A kernel from the cache that
// fails so is compiled again (load_or_rebuild); not an architecture that does not match the device
// (compiling again for it would fail the same way).
class LoadError : public Error {
 public:
  using Error::Error;
};
// Unloads k's module and frees its tables' memory in ctx. Both wait for the context's work (the
// driver synchronizes them), so no launch still queued can read what goes. Nothing where ctx is
// gone (the driver freed them with it).
void unload(const LoadedKernel& k, const Context& ctx);

// The loaded kernels of the objects that launch them (MatMul, Attention, AttentionOps), shared
// between objects of one kernel (the same layout or masks and options) in one context, so that a
// service building an object per request, or a training job making a MatMul per new layout, loads
// nothing the previous one left loaded, and its memory does not grow with them: a kernel nobody
// holds stays loaded, parked, for the next object that asks for it, up to kParked per process.
// One more, and the older half of them is unloaded at once: unloading waits for the context's
// work, so a process meeting new layouts all the time waits once per kParked / 2 releases, not at
// every one. Deploy's warm-up holds what it loads for the life of the process
// (KernelRegistry::pin).
class SharedKernels {
 public:
  using Handle = std::shared_ptr<const LoadedKernel>;
  static constexpr std::size_t kParked = 64;
  static SharedKernels& global();
  // kernel in ctx: the one loaded there already, else loaded now.
  Handle acquire(const std::shared_ptr<const CompiledKernel>& kernel, const Context& ctx);
  // Kernels loaded now: held by an object, and parked (tests, diagnostics).
  std::pair<std::size_t, std::size_t> counts();

 private:
  using Key = std::pair<const CompiledKernel*, Context>;
  struct Parked {
    Key key;
    std::shared_ptr<const CompiledKernel> kernel;  // keeps the key's address from being reused
    LoadedKernel loaded;
  };
  Handle hold(const Key& key, std::shared_ptr<const CompiledKernel> kernel, LoadedKernel loaded);  // mutex held
  std::mutex mutex_;
  std::map<Key, std::weak_ptr<const LoadedKernel>> held_;
  std::list<Parked> parked_;  // most recently released first
};

// How a kernel is loaded into a context: SharedKernels::acquire there, or a stand-in (tests).
using Loader = std::function<SharedKernels::Handle(const cache::KernelCache::Compiled&)>;

// *kernel, the request's, loaded into ctx (by `load`, default SharedKernels::global() in ctx).
// Where the driver refuses its code (LoadError: an entry that verifies yet does not load), the
// kernel is compiled again (KernelCache::rebuild, which replaces it in memory and on disk), *kernel
// becomes the new one and is loaded; a refusal of that one is thrown as such. Strict mode
// (on_miss fail) compiles nothing: the Error names the entry to precompile again.
SharedKernels::Handle load_or_rebuild(cache::KernelCache::Compiled* kernel, const cache::Request& request,
                                      const Context& ctx, cache::OnMiss on_miss, const Loader& load = {},
                                      cache::KernelCache& cache = cache::KernelCache::global());

struct LaunchShape {
  std::uint32_t grid_x = 1, grid_y = 1, threads = 1, shared_bytes = 0;
};
// The parameters every bsjit kernel takes, in order.
struct KernelArgs {
  const void* a = nullptr;  // X (forward, backward-weight) or dY (backward-data)
  const void* b = nullptr;  // W, or dY (backward-weight)
  void* out = nullptr;
  const float* gate = nullptr;
  int n = 0;
  int accumulate = 0;
  float* workspace = nullptr;  // split partials (GeneratedSource::workspace_bytes, zeroed once)
  // TMA kernels: tensor maps of a, b and out passed by value after the plain arguments (a kernel
  // that takes fewer ignores the rest).
  CUtensorMap maps[3] = {};
};

// CTAs of function (loaded in ctx, launched with shape's threads and shared memory) that ctx's GPU
// holds at once: SMs × CTAs per SM. Asked of the driver once per function and context; unload()
// forgets it, since a function loaded later may get the same handle.
std::int64_t resident_ctas(CUfunction function, const Context& ctx, const LaunchShape& shape);

// cuLaunchKernel's parameter array for args: pointers into args, in the kernels' order.
std::array<void*, 10> kernel_params(KernelArgs& args);

void launch(CUfunction function, const LaunchShape& shape, CUstream stream, KernelArgs& args);

// A TMA descriptor (cuTensorMapEncodeTiled through the loaded driver) of a 16-bit tensor at base
// with dims (innermost first) and strides in bytes of dims 1.., copied in boxes of `box` elements
// into shared memory swizzled over `swizzle` bytes (128, 64 or 32: the box's rows must be no wider);
// elements past the ends read as zeros.
CUtensorMap swizzled_tensor_map(DType dtype, const void* base, std::initializer_list<std::uint64_t> dims,
                                std::initializer_list<std::uint64_t> strides, std::initializer_list<std::uint32_t> box,
                                int swizzle = 128);
// A row-major [outer, inner] 16-bit tensor at base, copied in boxes of box_inner × box_outer
// elements into shared memory swizzled over `swizzle` bytes; rows past `outer` read as zeros.
CUtensorMap tensor_map_2d(DType dtype, const void* base, std::uint64_t inner, std::uint64_t outer,
                          std::uint32_t box_inner, std::uint32_t box_outer, int swizzle = 128);

// A TMA descriptor in im2col mode (cuTensorMapEncodeIm2col through the loaded driver) of a 16-bit
// activation stored channels last, dims (C, W, H, N) or (C, W, H, D, N) and strides in bytes of
// dims 1..: a copy brings `pixels` pixels × `channels` channels (128 bytes at most: the rows are
// swizzled over 128 bytes), the pixels in the order of the bounding box from `lower` to the dims'
// ends plus `upper` (W, H, D: innermost first), stepping by `steps` (W, H, D); elements outside the
// tensor read as zeros.
CUtensorMap im2col_tensor_map(DType dtype, const void* base, const std::vector<std::uint64_t>& dims,
                              const std::vector<std::uint64_t>& strides, const std::vector<int>& lower,
                              const std::vector<int>& upper, const std::vector<std::uint32_t>& steps,
                              std::uint32_t channels, std::uint32_t pixels);

// Median time in ms of fn over reps runs after warmup runs, each timed with CUDA events on stream.
// before_each, when given, is enqueued before each timed run's first event: work that keeps the GPU
// busy while the host enqueues fn (so that the host's time for the call is not counted) and that can
// flush the L2 cache.
double median_ms(const std::function<void()>& fn, CUstream stream, int warmup, int reps,
                 const std::function<void()>& before_each = {});

// A device allocation in the current context, freed on destruction (in that context, whichever
// is current then; not at all where that context is gone).
struct DeviceMemory {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  Context ctx;
  explicit DeviceMemory(std::size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr); }
};

// The workspace of the backward-weight kernels that split along N (templates/bsjit/sdd_schedule.cuh:
// the arrival counters, then the partials): one per context and stream, shared by every kernel and
// every MatMul launching there, since launches on a stream run in order and each kernel leaves the
// counters at 0. So a model's memory for it is its largest kernel's, not the sum over its layers
// (suite W's backward-weight kernels need up to 16.5 MB each). Holders keep theirs alive; a
// larger request replaces the stream's workspace, once the stream has finished with the old one,
// and the old one's holders move to the new one at their next request.
class SplitWorkspaces {
 public:
  static SplitWorkspaces& global();
  // At least `bytes` for launches on `stream` in ctx (the current context), its counters at 0.
  std::shared_ptr<DeviceMemory> get(const Context& ctx, CUstream stream, std::size_t bytes);
  // The size of the stream's workspace while someone holds it, else 0 (tests, diagnostics).
  std::size_t held_bytes(const Context& ctx, CUstream stream);

 private:
  std::mutex mutex_;
  std::map<std::pair<Context, CUstream>, std::weak_ptr<DeviceMemory>> live_;
};

}  // namespace bsjit::runtime
