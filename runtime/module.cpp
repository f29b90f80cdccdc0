#include "module.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "bsjit/error.hpp"
#include "driver.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::runtime {
namespace {

// BSJIT_SYNC_LAUNCHES=1: synchronize after every launch and report errors at the launch that
// caused them (debugging; slow).
bool sync_launches() {
  static const bool on = [] {
    const char* v = std::getenv("BSJIT_SYNC_LAUNCHES");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}

// Makes a context current for the guard's scope, and the one current before current again at its
// end (no driver call where ctx is current already). Throwing: a failure to switch is an Error;
// else it is ignored, and the guard changes nothing (destructors).
class ScopedCurrent {
 public:
  ScopedCurrent(CUcontext ctx, bool throwing) {
    const Driver& d = driver();
    CUresult r = d.cuCtxGetCurrent(&previous_);
    if (r == CUDA_SUCCESS && previous_ != ctx) {
      r = d.cuCtxSetCurrent(ctx);
      switched_ = r == CUDA_SUCCESS;
    }
    if (throwing) BSJIT_CU(r);
  }
  ~ScopedCurrent() {
    if (switched_) driver().cuCtxSetCurrent(previous_);
  }
  ScopedCurrent(const ScopedCurrent&) = delete;
  ScopedCurrent& operator=(const ScopedCurrent&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace

Context current_context() {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  BSJIT_CU(d.cuCtxGetCurrent(&ctx));
  if (!ctx) {
    CUdevice dev;
    BSJIT_CU(d.cuDeviceGet(&dev, 0));
    BSJIT_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
    BSJIT_CU(d.cuCtxSetCurrent(ctx));
    spdlog::debug("bsjit: no current CUDA context; using device 0's primary context");
  }
  return context_of(ctx);
}

Context context_of(CUcontext handle) {
  Context c{handle, 0};
  const CUresult r = driver().cuCtxGetId(handle, &c.id);
  if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT)
    throw Error(
        "bsjit: the CUDA context has been destroyed or reset (cudaDeviceReset, cuDevicePrimaryCtxReset, "
        "cuCtxDestroy); make a live context current first (with the runtime API, any call such as cudaFree(0) "
        "does)");
  BSJIT_CU(r);
  return c;
}

bool alive(const Context& ctx) {
  unsigned long long id = 0;
  return ctx.handle != nullptr && driver().cuCtxGetId(ctx.handle, &id) == CUDA_SUCCESS && id == ctx.id;
}

namespace {

CUdevice context_device(const Context& ctx) {
  CUdevice dev;
  const ScopedCurrent current(ctx.handle, true);
  BSJIT_CU(driver().cuCtxGetDevice(&dev));
  return dev;
}

}  // namespace

std::string context_arch(const Context& ctx) {
  const Driver& d = driver();
  const CUdevice dev = context_device(ctx);
  int major = 0, minor = 0;
  BSJIT_CU(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  BSJIT_CU(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  return fmt::format("sm_{}{}", major, minor);
}

int context_sms(const Context& ctx) {
  int sms = 0;
  BSJIT_CU(driver().cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, context_device(ctx)));
  return sms;
}

int context_l2_bytes(const Context& ctx) {
  int bytes = 0;
  BSJIT_CU(driver().cuDeviceGetAttribute(&bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, context_device(ctx)));
  return bytes;
}

namespace {

// Copies kernel's tables into the module's arrays, on a stream of its own that does not wait for
// (or hold up) the work queued on the context's other streams, and waits for the copies: the
// module's first launch, on any stream, then reads the values. The tables the module declares as
// pointers (8 bytes; an array holds at least 64 ints) get their values in one device allocation,
// each at a 256-byte boundary: *allocation (0 when there are none), which unload() frees with the module.
// Returns the first failure, with *what saying which step failed.
CUresult fill_tables(const Driver& d, const CompiledKernel& kernel, CUmodule module, CUdeviceptr* allocation,
                     std::string* what) {
  if (kernel.tables.empty()) return CUDA_SUCCESS;
  struct Symbol {
    CUdeviceptr ptr = 0;
    std::size_t bytes = 0, offset = 0;  // offset: a pointer table's values in the allocation
  };
  std::vector<Symbol> symbols(kernel.tables.size());
  std::size_t pointed = 0;  // bytes of the allocation
  for (std::size_t i = 0; i < kernel.tables.size(); ++i) {
    const auto& t = kernel.tables[i];
    Symbol& s = symbols[i];
    if (const CUresult r = d.cuModuleGetGlobal(&s.ptr, &s.bytes, module, t.name.c_str()); r != CUDA_SUCCESS) {
      *what = fmt::format("table {} not found in the module", t.name);
      return r;
    }
    if (s.bytes == sizeof(CUdeviceptr)) {
      s.offset = pointed;
      pointed += (t.values.size() * sizeof(int) + 255) / 256 * 256;
    } else if (s.bytes != generator::device_bytes(t)) {  // an array, in global or constant memory
      *what = fmt::format("table {} holds {} bytes in the module, not the {} its {} values take", t.name, s.bytes,
                          generator::device_bytes(t), t.values.size());
      return CUDA_ERROR_INVALID_IMAGE;
    }
  }
  CUdeviceptr& memory = *allocation;
  if (pointed > 0) {
    if (const CUresult r = d.cuMemAlloc(&memory, pointed); r != CUDA_SUCCESS) {
      *what = fmt::format("no device memory for the tables ({} bytes)", pointed);
      return r;
    }
  }
  std::vector<CUdeviceptr> addresses(kernel.tables.size());  // the copies read the pointers from here
  CUstream stream = nullptr;
  CUresult r = d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
  for (std::size_t i = 0; r == CUDA_SUCCESS && i < kernel.tables.size(); ++i) {
    const auto& t = kernel.tables[i];
    const Symbol& s = symbols[i];
    const std::size_t value_bytes = t.values.size() * sizeof(int);
    const bool pointer = s.bytes == sizeof(CUdeviceptr);
    addresses[i] = pointer ? memory + s.offset : s.ptr;
    if (value_bytes > 0) r = d.cuMemcpyHtoDAsync(addresses[i], t.values.data(), value_bytes, stream);
    if (r == CUDA_SUCCESS && pointer) r = d.cuMemcpyHtoDAsync(s.ptr, &addresses[i], sizeof(CUdeviceptr), stream);
  }
  if (stream) {
    const CUresult done = d.cuStreamSynchronize(stream);
    if (r == CUDA_SUCCESS) r = done;
    d.cuStreamDestroy(stream);
  }
  if (r != CUDA_SUCCESS && memory) d.cuMemFree(memory), memory = 0;
  return r;
}

}  // namespace

LoadedKernel load(const CompiledKernel& kernel, const Context& ctx) {
  const Driver& d = driver();
  const ScopedCurrent current(ctx.handle, true);
  LoadedKernel k;
  std::string what;
  CUresult r = d.cuModuleLoadData(&k.module, kernel.cubin.data());
  if (r == CUDA_SUCCESS) r = d.cuModuleGetFunction(&k.function, k.module, kernel.lowered_name.c_str());
  if (r == CUDA_SUCCESS && kernel.shared_bytes > 48 * 1024)  // above 48 KB needs an explicit opt-in
    r = d.cuFuncSetAttribute(k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel.shared_bytes);
  if (r == CUDA_SUCCESS) r = fill_tables(d, kernel, k.module, &k.tables, &what);
  if (r != CUDA_SUCCESS && k.module) d.cuModuleUnload(k.module);
  if (r != CUDA_SUCCESS) {
    const char* name = "unknown";
    d.cuGetErrorName(r, &name);
    const std::string message = fmt::format(
        "bsjit: cannot load kernel {} built for {} into the current context: {}{}{}", kernel.lowered_name, kernel.arch,
        what.empty() ? "" : what + ": ", name,
        r == CUDA_ERROR_NO_BINARY_FOR_GPU ? "; the kernel's target architecture does not match this device" : "");
    switch (r) {
      case CUDA_ERROR_INVALID_IMAGE:
      case CUDA_ERROR_INVALID_PTX:
      case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
      case CUDA_ERROR_INVALID_SOURCE:
      case CUDA_ERROR_NOT_FOUND:
      case CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND:
      case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED:
        throw LoadError(message);
      default:
        throw Error(message);
    }
  }
  return k;
}

namespace {

struct Occupancy {
  std::mutex mutex;
  std::map<std::pair<unsigned long long, CUfunction>, std::int64_t> resident;  // by context id and function
};
Occupancy& occupancy() {
  static auto* o = new Occupancy;  // never destroyed: unload may run in static destructors
  return *o;
}

}  // namespace

std::int64_t resident_ctas(CUfunction function, const Context& ctx, const LaunchShape& shape) {
  Occupancy& o = occupancy();
  std::lock_guard lock(o.mutex);
  auto& r = o.resident[{ctx.id, function}];
  if (r == 0) {
    const Driver& d = driver();
    int per_sm = 0, sms = 0;
    CUdevice dev;
    BSJIT_CU(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, function, static_cast<int>(shape.threads),
                                                           shape.shared_bytes));
    BSJIT_CU(d.cuCtxGetDevice(&dev));
    BSJIT_CU(d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    r = std::max<std::int64_t>(1, static_cast<std::int64_t>(per_sm) * sms);
  }
  return r;
}

void unload(const LoadedKernel& k, const Context& ctx) {
  {
    Occupancy& o = occupancy();
    std::lock_guard lock(o.mutex);
    o.resident.erase({ctx.id, k.function});
  }
  // A context reset since (same handle, new id) may hold a module or an allocation at the same
  // address as these: leave it be.
  if (!alive(ctx)) return;
  const Driver& d = driver();
  const ScopedCurrent current(ctx.handle, false);  // (errors ignored: this runs in destructors)
  if (k.module) d.cuModuleUnload(k.module);
  if (k.tables) d.cuMemFree(k.tables);
}

SharedKernels& SharedKernels::global() {
  static auto* kernels = new SharedKernels;  // never destroyed: holders may outlive static destruction
  return *kernels;
}

SharedKernels::Handle SharedKernels::acquire(const std::shared_ptr<const CompiledKernel>& kernel, const Context& ctx) {
  const Key key{kernel.get(), ctx};
  {
    std::lock_guard lock(mutex_);
    if (auto it = held_.find(key); it != held_.end())
      if (Handle h = it->second.lock()) return h;
    for (auto it = parked_.begin(); it != parked_.end(); ++it)
      if (it->key == key) {
        const LoadedKernel loaded = it->loaded;
        parked_.erase(it);
        return hold(key, kernel, loaded);
      }
  }
  const LoadedKernel loaded = load(*kernel, ctx);  // (two threads may both load: each parks its own)
  std::lock_guard lock(mutex_);
  return hold(key, kernel, loaded);
}

SharedKernels::Handle load_or_rebuild(cache::KernelCache::Compiled* kernel, const cache::Request& request,
                                      const Context& ctx, cache::OnMiss on_miss, const Loader& load,
                                      cache::KernelCache& cache) {
  const Loader acquire =
      load ? load : [&ctx](const cache::KernelCache::Compiled& k) { return SharedKernels::global().acquire(k, ctx); };
  try {
    return acquire(*kernel);
  } catch (const LoadError& refused) {
    spdlog::debug("bsjit: {}", refused.what());
    *kernel = cache.rebuild(request, *kernel, on_miss);
  }
  try {
    return acquire(*kernel);
  } catch (const LoadError& e) {
    throw LoadError(fmt::format("{} (the code was compiled again, not read from a cache)", e.what()));
  }
}

SharedKernels::Handle SharedKernels::hold(const Key& key, std::shared_ptr<const CompiledKernel> kernel,
                                          LoadedKernel loaded) {
  Handle h(new LoadedKernel(loaded), [this, key, kernel](const LoadedKernel* p) {
    const LoadedKernel released = *p;
    delete p;
    std::list<Parked> unloading;
    {
      std::lock_guard lock(mutex_);
      if (auto it = held_.find(key); it != held_.end() && it->second.expired()) held_.erase(it);
      parked_.push_front({key, kernel, released});
      if (parked_.size() > kParked)
        unloading.splice(unloading.end(), parked_, std::next(parked_.begin(), kParked / 2), parked_.end());
    }
    for (const auto& e : unloading) unload(e.loaded, e.key.second);
  });
  held_[key] = h;
  return h;
}

std::pair<std::size_t, std::size_t> SharedKernels::counts() {
  std::lock_guard lock(mutex_);
  const auto held = std::count_if(held_.begin(), held_.end(), [](const auto& e) { return !e.second.expired(); });
  return {static_cast<std::size_t>(held), parked_.size()};
}

std::array<void*, 10> kernel_params(KernelArgs& k) {
  return {&k.a, &k.b, &k.out, &k.gate, &k.n, &k.accumulate, &k.workspace, &k.maps[0], &k.maps[1], &k.maps[2]};
}

void launch(CUfunction function, const LaunchShape& s, CUstream stream, KernelArgs& k) {
  const Driver& d = driver();
  auto params = kernel_params(k);
  BSJIT_CU(d.cuLaunchKernel(function, s.grid_x, s.grid_y, 1, s.threads, 1, 1, s.shared_bytes, stream, params.data(),
                            nullptr));
  if (sync_launches()) BSJIT_CU(d.cuStreamSynchronize(stream));
}

double median_ms(const std::function<void()>& fn, CUstream stream, int warmup, int reps,
                 const std::function<void()>& before_each) {
  const Driver& d = driver();
  for (int i = 0; i < warmup; ++i) fn();
  CUevent e0, e1;
  BSJIT_CU(d.cuEventCreate(&e0, CU_EVENT_DEFAULT));
  BSJIT_CU(d.cuEventCreate(&e1, CU_EVENT_DEFAULT));
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    if (before_each) before_each();
    BSJIT_CU(d.cuEventRecord(e0, stream));
    fn();
    BSJIT_CU(d.cuEventRecord(e1, stream));
    BSJIT_CU(d.cuEventSynchronize(e1));
    float ms = 0;
    BSJIT_CU(d.cuEventElapsedTime(&ms, e0, e1));
    times.push_back(ms);
  }
  d.cuEventDestroy(e0);
  d.cuEventDestroy(e1);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

CUtensorMap swizzled_tensor_map(DType dtype, const void* base, std::initializer_list<std::uint64_t> dims,
                                std::initializer_list<std::uint64_t> strides, std::initializer_list<std::uint32_t> box,
                                int swizzle) {
  const auto rank = static_cast<cuuint32_t>(dims.size());
  if (rank < 1 || rank > 5 || strides.size() + 1 != dims.size() || box.size() != dims.size())
    throw Error(fmt::format("bsjit: tensor map of rank {} with {} strides and a box of rank {}", rank,
                            strides.size(), box.size()));
  if (swizzle != 128 && swizzle != 64 && swizzle != 32)
    throw Error(fmt::format("bsjit: tensor map swizzle of {} bytes; expected 128, 64 or 32", swizzle));
  std::vector<cuuint64_t> d(dims), st(strides);
  std::vector<cuuint32_t> b(box), element_strides(rank, 1);
  CUtensorMap map;
  BSJIT_CU(driver().cuTensorMapEncodeTiled(
      &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank,
      const_cast<void*>(base), d.data(), st.data(), b.data(), element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
      : swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                      : CU_TENSOR_MAP_SWIZZLE_32B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

CUtensorMap tensor_map_2d(DType dtype, const void* base, std::uint64_t inner, std::uint64_t outer,
                          std::uint32_t box_inner, std::uint32_t box_outer, int swizzle) {
  return swizzled_tensor_map(dtype, base, {inner, outer}, {inner * 2}, {box_inner, box_outer}, swizzle);
}

CUtensorMap im2col_tensor_map(DType dtype, const void* base, const std::vector<std::uint64_t>& dims,
                              const std::vector<std::uint64_t>& strides, const std::vector<int>& lower,
                              const std::vector<int>& upper, const std::vector<std::uint32_t>& steps,
                              std::uint32_t channels, std::uint32_t pixels) {
  const auto rank = static_cast<cuuint32_t>(dims.size());
  if ((rank != 4 && rank != 5) || strides.size() + 1 != dims.size() || lower.size() + 2 != dims.size() ||
      upper.size() != lower.size() || steps.size() != lower.size())
    throw Error(fmt::format("bsjit: im2col tensor map of rank {} with {} strides and {}/{}/{} corners and steps", rank,
                            strides.size(), lower.size(), upper.size(), steps.size()));
  std::vector<cuuint64_t> d(dims.begin(), dims.end()), st(strides.begin(), strides.end());
  std::vector<cuuint32_t> element_strides{1};  // channels: not strided
  element_strides.insert(element_strides.end(), steps.begin(), steps.end());
  element_strides.push_back(1);  // images
  CUtensorMap map;
  BSJIT_CU(driver().cuTensorMapEncodeIm2col(
      &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, rank,
      const_cast<void*>(base), d.data(), st.data(), lower.data(), upper.data(), channels, pixels,
      element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

DeviceMemory::DeviceMemory(std::size_t n) : bytes(n) {
  ctx = current_context();  // the ops' rule: the current context, else device 0's primary one
  BSJIT_CU(driver().cuMemAlloc(&ptr, bytes ? bytes : 16));
}
DeviceMemory::~DeviceMemory() {
  if (!ptr || !alive(ctx)) return;  // gone with its context (a new one may hold the same address)
  const ScopedCurrent current(ctx.handle, false);
  driver().cuMemFree(ptr);
}

SplitWorkspaces& SplitWorkspaces::global() {
  static auto* pool = new SplitWorkspaces;  // never destroyed: holders may outlive static destruction
  return *pool;
}

std::shared_ptr<DeviceMemory> SplitWorkspaces::get(const Context& ctx, CUstream stream, std::size_t bytes) {
  const Driver& d = driver();
  std::lock_guard lock(mutex_);
  const std::pair key{ctx, stream};
  std::shared_ptr<DeviceMemory> w;
  if (auto it = live_.find(key); it != live_.end()) w = it->second.lock();
  if (w && w->bytes >= bytes) return w;
  if (w) BSJIT_CU(d.cuStreamSynchronize(stream));  // launches queued there may still use the old one
  constexpr std::size_t kCounterBytes = sizeof(unsigned) * kernels::kSplitCounters;
  auto fresh = std::make_shared<DeviceMemory>(std::max(bytes, kCounterBytes));
  // on the stream itself, so that its launches find the counters at 0 also where it does not wait
  // for the legacy default stream
  BSJIT_CU(d.cuMemsetD32Async(fresh->ptr, 0, kernels::kSplitCounters, stream));
  // only when allocating, off the launch path: forget the streams whose workspace is gone (a
  // destroyed stream's handle may be reused by a new one, which then starts afresh as it should)
  std::erase_if(live_, [](const auto& entry) { return entry.second.expired(); });
  live_[key] = fresh;
  return fresh;
}

std::size_t SplitWorkspaces::held_bytes(const Context& ctx, CUstream stream) {
  std::lock_guard lock(mutex_);
  auto it = live_.find({ctx, stream});
  if (it == live_.end()) return 0;
  const std::shared_ptr<DeviceMemory> w = it->second.lock();
  return w ? w->bytes : 0;
}

}  // namespace bsjit::runtime
