// bsjit::Conv: the three kernels of the layout's generated source, each compiled through the
// kernel cache on its first use (or by precompile) and loaded once per context with the layout's
// tables; a deconvolution runs the convolution's kernels with the roles of its tensors swapped.
#include "bsjit/conv.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "attention_common.hpp"
#include "bsjit/error.hpp"
#include "cache/kernel_cache.hpp"
#include "compiler.hpp"
#include "driver.hpp"
#include "generator/conv_generator.hpp"
#include "generator/templates.hpp"
#include "module.hpp"

namespace bsjit {
namespace {

enum Kernel {
  kFprop,
  kBprop,
  kUpdat,
  kNormalize,
  kNormalizeGrad,
  kGather,
  kGatherGate,
  kIgemmFprop,
  kIgemmBprop,
  kIgemmUpdat,
  kIgemmStore,
  kIgemmPack,
  kTmaPack,  // the filter as the TMA bprop reads it (conv_tma_pack_backward_kernel)
  kKernels
};

// The scratch of the convolutions' staging (the filter, gate and filter gradient of a 1×1
// convolution in the matmul's block order; the tensor-core kernels' packed filter or filter
// gradient's fp32 sums): one per context and stream, shared by every Conv launching there.
runtime::SplitWorkspaces& conv_scratch() {
  static runtime::SplitWorkspaces scratch;
  return scratch;
}

std::int64_t product(const std::array<std::int64_t, 3>& a) { return a[0] * a[1] * a[2]; }

// fn(first image, images) over n images in runs of fewer than 2^31 rows of rows_per_image each: the
// TMA kernels' launches (TMA's coordinates are 32-bit).
template <class Fn>
void in_image_runs(std::int64_t n, std::int64_t rows_per_image, Fn fn) {
  const std::int64_t run = std::min<std::int64_t>(n, INT_MAX / rows_per_image);
  for (std::int64_t i = 0; i < n; i += run) fn(i, std::min(run, n - i));
}

}  // namespace

struct Conv::Impl {
  ConvLayout layout;
  ConvGeometry geometry;
  ConvOptions options;
  generator::GeneratedConv g;
  std::string layout_hash;

  // A 1×1 convolution that is a matmul runs the matmul's kernels (generator::conv_matmul_plan).
  std::optional<generator::ConvMatmulPlan> plan;
  std::optional<MatMul> matmul;
  // 16-bit channels-last convolutions on uniform layouts run implicit GEMM on the tensor cores.
  std::optional<generator::GeneratedConvIgemm> igemm;
  std::string igemm_hash;

  struct PerContext {
    std::array<runtime::SharedKernels::Handle, kKernels> kernels;
    std::unique_ptr<runtime::DeviceMemory> order;  // plan->order
    std::map<CUstream, std::shared_ptr<runtime::DeviceMemory>> scratch;
  };
  std::mutex mutex;
  std::map<runtime::Context, PerContext> contexts;

  Impl(ConvLayout l, ConvGeometry geo, ConvOptions o) : layout(std::move(l)), geometry(geo), options(std::move(o)) {}

  // The kernels of this convolution: its own three, or the gathers of the matmul path; l2_normalize.
  std::vector<Kernel> kernels() const {
    if (plan) return {kNormalize, kNormalizeGrad, kGather, kGatherGate};
    if (igemm) return {kIgemmFprop, kIgemmBprop, kIgemmUpdat, kIgemmStore, kIgemmPack, kNormalize, kNormalizeGrad};
    return {kFprop, kBprop, kUpdat, kNormalize, kNormalizeGrad};
  }
  // Conv::autotune's (or Conv::use_kernel's) choice of engine per tensor-core kernel (0:
  // kIgemmFprop, 1: kIgemmBprop, 2: kIgemmUpdat) and target, one of engines(): read from the
  // cache's tuning record on first use, default_engine() without one.
  mutable std::mutex tuning_mutex;
  mutable std::map<std::pair<std::string, int>, std::string> chosen;
  // The input tensor map's rank for conv_tma.cuh's fprop (4: no depth, 5), 0 where TMA's im2col
  // mode cannot take the geometry (generator::conv_tma_rank); for its bprop, that of the transposed
  // geometry (stride 1; generator::conv_transposed_geometry).
  int tma_rank = 0, tma_rank_bprop = 0;
  std::optional<ConvGeometry> transposed;

  std::string tuning_key(const std::string& arch, int direction) const {
    // templates and format version in the key: a record from another bsjit is never applied
    const auto& g = geometry;
    const std::string material =
        fmt::format("bsjit-conv-tuning {} {} {} {} {} {} {} {} {} {} {} {} {} {}", cache::kFormatVersion,
                    generator::templates_hash(), layout_hash, to_string(options.dtype),
                    options.order == ActivationOrder::ndhwc ? "ndhwc" : "ncdhw", fmt::join(g.in, "x"),
                    fmt::join(g.filter, "x"), fmt::join(g.stride, "x"), fmt::join(g.dilation, "x"),
                    fmt::join(g.pad_before, "x"), fmt::join(g.pad_after, "x"), options.deconv, arch, direction);
    const XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
  }
  std::string tuning_stem(const std::string& arch, int direction) const {
    return fmt::format("conv-{}-b{}-{}-{}", to_string(options.dtype), igemm->block,
                       direction == 0   ? "fprop"
                       : direction == 1 ? "bprop"
                                        : "updat",
                       arch);
  }
  // The engines tensor-core kernel k (kIgemmFprop, kIgemmBprop, kIgemmUpdat) has on arch, in the
  // order of preference without a tuning record (default_engine: the first): on sm_90a at b = 64 and
  // 128 the kernels fed by TMA (conv_tma.cuh) where the geometry suits them and the warpgroup kernels
  // (conv_wgmma.cuh); the mma.sync ones everywhere. updat prefers the warpgroup kernel at b = 64 and
  // the one fed by TMA at b = 128. Suite C on an H100, TMA over warpgroup (docs/PERFORMANCE.md, "Fed
  // by TMA, swapped" and "updat's ranges"): fprop and bprop 1.3-2.4× at b = 64 and 128; updat
  // 0.53-0.72× at b = 64, and at b = 128 0.97-1.05× (358ea85), 1.07-1.22× on every d = 0.25 layer
  // since generator::conv_updat_range (2026-12-08).
  std::vector<std::string> engines(const std::string& arch, Kernel k) const {
    std::vector<std::string> e;
    if (igemm && igemm->hopper && arch == "sm_90a" && (k == kIgemmFprop || k == kIgemmBprop || k == kIgemmUpdat)) {
      const bool tma =
          igemm->tma && (((k == kIgemmFprop || k == kIgemmUpdat) && tma_rank) || (k == kIgemmBprop && tma_rank_bprop));
      const bool tma_first = tma && (k != kIgemmUpdat || igemm->block == 128);
      if (tma_first) e.push_back("tma");
      e.push_back("wgmma");
      if (tma && !tma_first) e.push_back("tma");
    }
    e.push_back("mma.sync");
    return e;
  }
  // Without a tuning record: the first of engines().
  std::string default_engine(const std::string& arch, Kernel k) const { return engines(arch, k).front(); }
  // The engine tensor-core kernel k runs on for arch (kIgemmStore and kIgemmPack: "mma.sync", their
  // only one).
  std::string engine(const std::string& arch, Kernel k) const {
    if (k != kIgemmFprop && k != kIgemmBprop && k != kIgemmUpdat) return "mma.sync";
    const int direction = k - kIgemmFprop;
    std::lock_guard lock(tuning_mutex);
    const auto at = std::pair{arch, direction};
    if (const auto it = chosen.find(at); it != chosen.end()) return it->second;
    std::string e = default_engine(arch, k);
    if (const std::string record =
            cache::KernelCache::global().find_tuning(tuning_key(arch, direction), tuning_stem(arch, direction));
        !record.empty()) {
      try {
        const auto kernel = nlohmann::json::parse(record).at("kernel").get<std::string>();
        const auto all = engines(arch, k);
        if (std::find(all.begin(), all.end(), kernel) == all.end())
          throw Error(fmt::format("kernel \"{}\" is not one of this convolution's", kernel));
        e = kernel;
      } catch (const std::exception& ex) {
        spdlog::warn("bsjit: conv tuning record {} is unusable ({}); using {}", tuning_stem(arch, direction), ex.what(),
                     e);
      }
    }
    return chosen[at] = e;
  }
  // The kernel op runs (a deconvolution's fprop is the convolution's bprop and the reverse).
  Kernel kernel_of(ConvOp op) const {
    if (op == ConvOp::updat) return kUpdat;
    return (op == ConvOp::fprop) != options.deconv ? kFprop : kBprop;
  }
  // The tensor-core kernel of kFprop, kBprop or kUpdat.
  static Kernel igemm_kernel(Kernel k) { return k == kFprop ? kIgemmFprop : k == kBprop ? kIgemmBprop : kIgemmUpdat; }
  // Sets the engine of one tensor-core kernel and target (one of engines()); it loads anew where it
  // ran.
  void choose(const std::string& arch, Kernel k, const std::string& e) {
    {
      std::lock_guard lock(tuning_mutex);
      chosen[{arch, k - kIgemmFprop}] = e;
    }
    std::lock_guard lock(mutex);
    for (auto& [ctx, c] : contexts) c.kernels[k] = {};
  }

  // The tensor-core path's warpgroup kernels where kernel k runs on them for arch.
  const generator::GeneratedConvIgemm::Hopper* hopper(const std::string& arch, Kernel k) const {
    return igemm && engine(arch, k) == "wgmma" ? &*igemm->hopper : nullptr;
  }
  // The request of kernel k for arch on engine `e` (default: the chosen one).
  cache::Request request(Kernel k, const std::string& arch, std::optional<std::string> e = std::nullopt) const {
    static const char* suffix[] = {"-fprop",       "-bprop", "-updat", "-l2_normalize", "-l2_normalize_grad", "-gather",
                                   "-gather_gate", "-fprop", "-bprop", "-updat",        "-updat_store",       "-pack"};
    if (k == kTmaPack) {
      const auto& t = *igemm->tma;
      return runtime::named_kernel_request(t.source, igemm->tables, t.pack_backward, t.label + "-pack_backward", 0,
                                           arch, igemm_hash);
    }
    if (k >= kIgemmFprop) {
      const auto& i = *igemm;
      if (!e) e = engine(arch, k);
      if (*e == "tma" && k == kIgemmUpdat) {
        const auto& t = *i.tma;
        return runtime::named_kernel_request(t.source, i.tables, tma_rank == 4 ? t.updat4 : t.updat5,
                                             t.label + "-updat" + std::to_string(tma_rank), t.updat_shared_bytes, arch,
                                             igemm_hash);
      }
      if (*e == "tma") {
        const auto& t = *i.tma;
        const bool back = k == kIgemmBprop;
        const int rank = back ? tma_rank_bprop : tma_rank;
        return runtime::named_kernel_request(
            t.source, i.tables, back ? (rank == 4 ? t.bprop4 : t.bprop5) : (rank == 4 ? t.fprop4 : t.fprop5),
            t.label + (back ? "-bprop" : "-fprop") + std::to_string(rank), t.shared_bytes, arch, igemm_hash);
      }
      if (*e == "wgmma") {
        const auto* h = &*i.hopper;
        return runtime::named_kernel_request(i.source, i.tables,
                                             k == kIgemmFprop   ? h->fprop
                                             : k == kIgemmBprop ? h->bprop
                                                                : h->updat,
                                             i.label + "-wgmma" + suffix[k],
                                             k == kIgemmUpdat ? h->updat_shared_bytes : h->shared_bytes, arch,
                                             igemm_hash);
      }
      const std::string* name[] = {&i.fprop, &i.bprop, &i.updat, &i.updat_store, &i.pack};
      return runtime::named_kernel_request(i.source, i.tables, *name[k - kIgemmFprop], i.label + suffix[k], 0, arch,
                                           igemm_hash);
    }
    const std::string* name[] = {&g.fprop,  &g.bprop,      &g.updat, &g.l2_normalize, &g.l2_normalize_grad,
                                 &g.gather, &g.gather_gate};
    return runtime::named_kernel_request(g.source, g.tables, *name[k], g.label + suffix[k], 0, arch, layout_hash);
  }
  CUfunction function(const runtime::Context& ctx, Kernel k,
                      cache::OnMiss on_miss = cache::KernelCache::global().run_time_on_miss()) {
    std::lock_guard lock(mutex);
    auto& loaded = contexts[ctx].kernels;
    if (!loaded[k]) loaded[k] = runtime::load_cached(request(k, runtime::kernel_arch(options.arch, ctx)), ctx, on_miss);
    return loaded[k]->function;
  }

  // The matmul path's block order in ctx (null on the other paths), uploaded at the first call or
  // load().
  const int* order_of(const runtime::Context& ctx) {
    std::lock_guard lock(mutex);
    auto& c = contexts[ctx];
    if (plan && !c.order) {
      c.order = std::make_unique<runtime::DeviceMemory>(plan->order.size() * sizeof(int));
      BSJIT_CU(runtime::driver().cuMemcpyHtoD(c.order->ptr, plan->order.data(), c.order->bytes));
    }
    return c.order ? static_cast<const int*>(c.order->get()) : nullptr;
  }

  // A call's scratch of `bytes`: in the caller's workspace after the 1×1 path's matmul workspace
  // (OpOptions::workspace, laid out by workspace_size), else the stream's own.
  CUdeviceptr scratch(const runtime::Context& ctx, CUstream stream, std::size_t bytes, const OpOptions& call,
                      std::size_t matmul_bytes) {
    if (call.workspace) return reinterpret_cast<CUdeviceptr>(call.workspace) + (matmul_bytes + 15) / 16 * 16;
    std::lock_guard lock(mutex);
    auto& s = contexts[ctx].scratch[stream];
    if (!s || s->bytes < bytes) s = conv_scratch().get(ctx, stream, bytes);
    return s->ptr;
  }

  // The 1×1 path's matmul op for kernel k, and the rows it runs at n images.
  static Op matmul_op(Kernel k) {
    return k == kUpdat ? Op::backward_weight : k == kFprop ? Op::backward_data : Op::forward;
  }
  std::int64_t matmul_rows(std::int64_t n) const { return n * product(geometry.in); }
  // The 1×1 path's scratch: the filter (16-byte aligned) and the gate in the matmul's block order.
  std::size_t matmul_filter_bytes() const {
    return (plan->order.size() * plan->block * plan->block * dtype_size(options.dtype) + 15) / 16 * 16;
  }
  std::size_t matmul_scratch_bytes() const { return matmul_filter_bytes() + plan->order.size() * sizeof(float); }
  // Whether kernel k (kFprop, kBprop) runs on the TMA bprop on the current GPU.
  bool tma_bprop(Kernel k) const {
    return k == kBprop && tma_rank_bprop &&
           engine(runtime::kernel_arch(options.arch, runtime::current_context()), kIgemmBprop) == "tma";
  }
  // The tensor-core kernels' scratch: updat's fp32 filter-gradient sums, the data kernels' filter
  // packed per tap (none for one tap, except for the TMA bprop, which exchanges k and c).
  std::size_t igemm_scratch_bytes(Kernel k) const {
    const std::int64_t taps = geometry.taps(), elements = layout.filter_elements(taps);
    if (k == kUpdat) return static_cast<std::size_t>(elements) * sizeof(float);
    return taps > 1 || tma_bprop(k) ? static_cast<std::size_t>(elements) * dtype_size(options.dtype) : 0;
  }

  // Bytes of a caller's workspace for kernel k at n images: the 1×1 path's matmul workspace (first,
  // so that its counters lead), then the scratch (Conv::workspace_size).
  std::size_t workspace_size(Kernel k, std::int64_t n, const OpOptions& call) {
    if (plan) {
      OpOptions inner;
      inner.accumulate = call.accumulate, inner.gate = call.gate;
      const std::size_t mm = matmul->workspace_size(matmul_op(k), matmul_rows(n), inner);
      return (mm + 15) / 16 * 16 + matmul_scratch_bytes();
    }
    return igemm ? igemm_scratch_bytes(k) : 0;
  }

  // Blocks of `elements` elements between the convolution's order and the matmul's.
  void gather(const runtime::Context& ctx, Kernel k, const void* in, void* out, const int* order, int elements,
              bool scatter, CUstream stream) {
    int blocks = static_cast<int>(plan->order.size()), sc = scatter ? 1 : 0;
    void* args[] = {&in, &out, &order, &blocks, &elements, &sc};
    const std::int64_t total = static_cast<std::int64_t>(blocks) * elements;
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>((total + g.threads - 1) / g.threads, 1 << 20));
    BSJIT_CU(runtime::driver().cuLaunchKernel(function(ctx, k), grid, 1, 1, static_cast<unsigned>(g.threads), 1, 1, 0,
                                              stream, args, nullptr));
  }

  // Kernel k of the convolution as the matmul (a, b, out as launch() takes them).
  void launch_matmul(Kernel k, const void* a, const void* b, void* out, std::int64_t n, CUstream stream,
                     const OpOptions& call, std::size_t matmul_bytes) {
    const runtime::Context ctx = runtime::current_context();
    const std::int64_t rows = matmul_rows(n);
    const int bb = plan->block * plan->block;
    const std::size_t filter_bytes = matmul_filter_bytes();
    const int* order = order_of(ctx);
    const CUdeviceptr scratch = this->scratch(ctx, stream, matmul_scratch_bytes(), call, matmul_bytes);
    void* w = reinterpret_cast<void*>(scratch);
    OpOptions o;
    o.accumulate = call.accumulate;
    if (call.workspace && matmul_bytes > 0) o.workspace = call.workspace, o.workspace_bytes = matmul_bytes;
    if (call.gate) {
      float* gate = reinterpret_cast<float*>(scratch + filter_bytes);
      gather(ctx, kGatherGate, call.gate, gate, order, 1, false, stream);
      o.gate = gate;
    }
    const Stream s = reinterpret_cast<Stream>(stream);
    if (k == kUpdat) {  // a = x, b = dy, out = dF
      if (call.accumulate) gather(ctx, kGather, out, w, order, bb, false, stream);
      matmul->backward_weight(b, a, w, rows, s, o);
      gather(ctx, kGather, w, out, order, bb, true, stream);
      return;
    }
    gather(ctx, kGather, b, w, order, bb, false, stream);  // the filter in the matmul's order
    if (k == kFprop)
      matmul->backward_data(a, w, out, rows, s, o);
    else
      matmul->forward(a, w, out, rows, s, o);
  }

  // Kernel k of the convolution on the tensor cores (a, b, out as launch() takes them).
  void launch_igemm(Kernel k, const void* a, const void* b, void* out, std::int64_t n, CUstream stream,
                    const OpOptions& call) {
    // The kernels split positions with 32-bit arithmetic (ConvFastDiv in conv_igemm.cuh).
    if (std::max(product(geometry.in), product(geometry.out())) >= (std::int64_t{1} << 30))
      throw Error(
          fmt::format("bsjit: conv: {} input or {} output positions per image exceed the tensor-core "
                      "kernels' 2^30; ConvOptions::direct_kernels runs the direct ones",
                      product(geometry.in), product(geometry.out())));
    const runtime::Context ctx = runtime::current_context();
    const std::string arch = runtime::kernel_arch(options.arch, ctx);
    const auto& i = *igemm;
    const runtime::Driver& d = runtime::driver();
    kernels::ConvDims dims = generator::conv_dims(layout, geometry, n);
    int blocks = static_cast<int>(layout.blocks().size()), block = i.block, taps = static_cast<int>(geometry.taps());
    const std::int64_t filter_elements = static_cast<std::int64_t>(blocks) * taps * block * block;
    const float* gate = call.gate;
    int accumulate = call.accumulate ? 1 : 0;
    auto elementwise = [&](Kernel kernel, void** args) {  // the pack and store kernels: a thread an element
      const auto grid = static_cast<unsigned>(std::min<std::int64_t>((filter_elements + 255) / 256, 1 << 20));
      BSJIT_CU(d.cuLaunchKernel(function(ctx, kernel), grid, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
    };
    if (k == kUpdat) {  // fp32 sums of the filter gradient per block and tap, then the store
      float* sums = reinterpret_cast<float*>(scratch(ctx, stream, igemm_scratch_bytes(k), call, 0));
      BSJIT_CU(d.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(sums), 0, filter_elements, stream));
      if (engine(arch, kIgemmUpdat) == "tma") {
        launch_tma_updat(ctx, a, b, sums, n, stream, gate);
      } else {
        CUfunction f = function(ctx, kIgemmUpdat);
        const auto* h = hopper(arch, kIgemmUpdat);
        const runtime::LaunchShape shape{1, 1, static_cast<std::uint32_t>(h ? h->updat_threads : i.updat_threads),
                                         static_cast<std::uint32_t>(h ? h->updat_shared_bytes : 0)};
        // a CTA per block and tap, or on the warpgroup kernel per block and group of updat_taps taps
        const std::int64_t rows = n * product(geometry.out()),
                           units = static_cast<std::int64_t>(blocks) *
                                   kernels::conv_tap_groups(taps, h ? h->updat_taps : 1);
        const std::int64_t per =
            updat_range(rows, units, runtime::resident_ctas(f, ctx, shape), h ? h->updat_rows : i.updat_rows);
        int chunk = static_cast<int>(per);
        void* args[] = {&a, &b, &sums, &gate, &chunk, &dims};
        BSJIT_CU(d.cuLaunchKernel(f, static_cast<unsigned>(units), static_cast<unsigned>((rows + per - 1) / per), 1,
                                  shape.threads, 1, 1, shape.shared_bytes, stream, args, nullptr));
      }
      void* store[] = {&sums, &out, &gate, &accumulate, &blocks, &block, &taps};
      elementwise(kIgemmStore, store);
      return;
    }
    const bool forward = k == kFprop;
    const bool tma = engine(arch, forward ? kIgemmFprop : kIgemmBprop) == "tma";
    const void* filter = b;
    if (taps > 1 || (tma && !forward)) {  // packed per tap (the TMA bprop: k and c exchanged, taps reversed)
      void* packed = reinterpret_cast<void*>(scratch(ctx, stream, igemm_scratch_bytes(k), call, 0));
      void* pack[] = {&filter, &packed, &blocks, &block, &taps};
      elementwise(tma && !forward ? kTmaPack : kIgemmPack, pack);
      filter = packed;
    }
    if (tma) {
      // as a forward convolution (bprop: of dO, generator::conv_transposed_geometry), in launches of
      // fewer than 2^31 output rows (TMA's coordinates are 32-bit)
      const ConvGeometry& geo = forward ? geometry : *transposed;
      const std::int64_t c_in = forward ? layout.C() : layout.K(), c_out = forward ? layout.K() : layout.C();
      kernels::ConvDims td = generator::conv_dims(layout, geo, n);
      td.c = static_cast<int>(c_in), td.k = static_cast<int>(c_out);
      const std::size_t es = dtype_size(options.dtype);
      in_image_runs(n, product(geo.out()), [&](std::int64_t i, std::int64_t m) {
        td.n = static_cast<int>(m);
        launch_tma(ctx, !forward, geo, static_cast<const char*>(a) + i * c_in * product(geo.in) * es, filter,
                   static_cast<char*>(out) + i * c_out * product(geo.out()) * es, m, stream, td, gate, accumulate);
      });
      return;
    }
    const auto* h = hopper(arch, forward ? kIgemmFprop : kIgemmBprop);
    const std::int64_t rows = n * product(forward ? geometry.out() : geometry.in);
    const std::int64_t columns = (forward ? layout.K() : layout.C()) / block;
    // bprop's rows come in stride[0] · stride[1] · stride[2] classes (conv_igemm.cuh), each with a last tile
    const std::int64_t classes = forward ? 1 : geometry.stride[0] * geometry.stride[1] * geometry.stride[2];
    const int tile_rows = h ? h->rows : i.data_rows, threads = h ? h->threads : i.data_threads;
    const std::int64_t tiles = (rows + tile_rows - 1) / tile_rows + classes - 1;
    void* args[] = {&a, &filter, &out, &gate, &accumulate, &dims};
    BSJIT_CU(d.cuLaunchKernel(function(ctx, forward ? kIgemmFprop : kIgemmBprop), static_cast<unsigned>(columns),
                              static_cast<unsigned>(std::min<std::int64_t>(tiles, 65535)), 1,
                              static_cast<unsigned>(threads), 1, 1, h ? static_cast<unsigned>(h->shared_bytes) : 0,
                              stream, args, nullptr));
  }

  // conv_tma_data_kernel on the forward convolution `geometry` (bprop: the transposed one) with dims
  // of n images: the input's im2col map, the packed filter's tiled map as [blocks · taps · b rows,
  // b], the output's as [rows, channels], a persistent grid of at most one CTA per (tile, block
  // column).
  void launch_tma(const runtime::Context& ctx, bool backward, const ConvGeometry& geometry, const void* in,
                  const void* filter, void* out, std::int64_t n, CUstream stream, kernels::ConvDims dims,
                  const float* gate, int accumulate) {
    const auto& t = *igemm->tma;
    const int b = igemm->block, rank = backward ? tma_rank_bprop : tma_rank;
    const std::uint64_t c = static_cast<std::uint64_t>(dims.c);
    // a copy: 128 pixels (a consumer's rows; a tile of t.rows takes t.rows / 128 copies) × 64 channels
    CUtensorMap map_in = im2col_map(geometry, rank, c, in, n, t.copy_rows);
    const std::uint64_t filter_rows = static_cast<std::uint64_t>(layout.blocks().size()) *
                                      static_cast<std::uint64_t>(geometry.taps()) * static_cast<std::uint64_t>(b);
    CUtensorMap map_filter = runtime::tensor_map_2d(options.dtype, filter, static_cast<std::uint64_t>(b), filter_rows,
                                                    64, static_cast<std::uint32_t>(b));
    const std::int64_t rows = n * product(geometry.out()), tiles = (rows + t.rows - 1) / t.rows;
    CUtensorMap map_out = runtime::tensor_map_2d(options.dtype, out, static_cast<std::uint64_t>(dims.k),
                                                 static_cast<std::uint64_t>(rows), 64, 64);
    CUfunction f = function(ctx, backward ? kIgemmBprop : kIgemmFprop);
    const runtime::LaunchShape shape{1, 1, static_cast<std::uint32_t>(t.threads),
                                     static_cast<std::uint32_t>(t.shared_bytes)};
    const std::int64_t items = tiles * (dims.k / b);
    const auto grid =
        static_cast<unsigned>(tma_grid(backward, geometry.taps(), items, runtime::resident_ctas(f, ctx, shape)));
    void* args[] = {&out, &gate, &accumulate, &dims, &map_in, &map_filter, &map_out};
    BSJIT_CU(runtime::driver().cuLaunchKernel(f, grid, 1, 1, shape.threads, 1, 1, shape.shared_bytes, stream, args,
                                              nullptr));
  }

  // conv_tma_data_kernel's grid over `items` items on at most max_ctas CTAs (generator::conv_tma_grid,
  // a search of up to 64 · (columns + max_ctas) steps): worked out on a launch shape's first use,
  // then looked up, so that a call's host time does not grow with the layout's columns.
  mutable std::mutex tma_grid_mutex;
  mutable std::map<std::tuple<bool, std::int64_t, std::int64_t>, std::int64_t> tma_grids;
  std::int64_t tma_grid(bool backward, std::int64_t taps, std::int64_t items, std::int64_t max_ctas) const {
    std::lock_guard lock(tma_grid_mutex);
    const auto [it, added] = tma_grids.try_emplace({backward, items, max_ctas}, 0);
    if (added) it->second = generator::conv_tma_grid(column_steps(backward, taps), items, max_ctas);
    return it->second;
  }

  // The stages of each output block column of conv_tma_data_kernel (bprop: of the transposed
  // convolution, the input's block columns): its blocks × taps × b / 64, from the tables it walks.
  std::vector<std::int64_t> column_steps(bool backward, std::int64_t taps) const {
    const std::string name = backward ? "kIgemmBpropStart" : "kIgemmFpropStart";
    std::vector<std::int64_t> steps;
    for (const auto& table : igemm->tables)
      if (table.name == name)
        for (std::size_t c = 0; c + 1 < table.values.size(); ++c)
          steps.push_back((table.values[c + 1] - table.values[c]) * taps * (igemm->block / 64));
    return steps;
  }

  // The input's im2col map (the forward geometry) of n images at `in`: copies of `pixels` pixels × 64
  // channels.
  CUtensorMap im2col_map(const ConvGeometry& geometry, int rank, std::uint64_t channels, const void* in, std::int64_t n,
                         std::uint32_t pixels) const {
    const std::uint64_t es = dtype_size(options.dtype);
    const auto& in_dims = geometry.in;  // D, H, W
    std::vector<std::uint64_t> sizes{channels, static_cast<std::uint64_t>(in_dims[2]),
                                     static_cast<std::uint64_t>(in_dims[1])};
    const auto [lw, uw] = generator::conv_tma_box(geometry, 2);
    const auto [lh, uh] = generator::conv_tma_box(geometry, 1);
    std::vector<int> lower{lw, lh}, upper{uw, uh};
    std::vector<std::uint32_t> steps{static_cast<std::uint32_t>(geometry.stride[2]),
                                     static_cast<std::uint32_t>(geometry.stride[1])};
    if (rank == 5) {
      sizes.push_back(static_cast<std::uint64_t>(in_dims[0]));
      const auto [ld, ud] = generator::conv_tma_box(geometry, 0);
      lower.push_back(ld), upper.push_back(ud);
      steps.push_back(static_cast<std::uint32_t>(geometry.stride[0]));
    }
    sizes.push_back(static_cast<std::uint64_t>(n));
    std::vector<std::uint64_t> strides{channels * es};
    for (std::size_t i = 1; i + 1 < sizes.size(); ++i) strides.push_back(strides.back() * sizes[i]);
    return runtime::im2col_tensor_map(options.dtype, in, sizes, strides, lower, upper, steps, 64, pixels);
  }

  // The updat kernels' positions per CTA (generator::conv_updat_range, a search of up to 4096 steps of
  // its model: 9 µs of host time at 56 × 56 × 32 positions, 24 at a million): worked out on a launch
  // shape's first use, then looked up, as tma_grid is.
  mutable std::mutex updat_range_mutex;
  mutable std::map<std::array<std::int64_t, 4>, std::int64_t> updat_ranges;
  std::int64_t updat_range(std::int64_t rows, std::int64_t units, std::int64_t resident,
                           std::int64_t stage_rows) const {
    std::lock_guard lock(updat_range_mutex);
    const auto [it, added] = updat_ranges.try_emplace({rows, units, resident, stage_rows}, 0);
    if (added) it->second = generator::conv_updat_range(rows, units, resident, stage_rows);
    return it->second;
  }

  // updat on conv_tma_updat_kernel into the fp32 sums (zeroed): the grid of conv_wgmma_updat_kernel
  // (blocks · taps, ranges of whole 64-position stages, updat_range), in launches of fewer than 2^31
  // output rows (TMA's coordinates are 32-bit), each adding to the sums.
  void launch_tma_updat(const runtime::Context& ctx, const void* in, const void* grad_out, float* sums, std::int64_t n,
                        CUstream stream, const float* gate) {
    const auto& t = *igemm->tma;
    const std::uint64_t es = dtype_size(options.dtype);
    CUfunction f = function(ctx, kIgemmUpdat);
    const runtime::LaunchShape shape{1, 1, static_cast<std::uint32_t>(t.updat_threads),
                                     static_cast<std::uint32_t>(t.updat_shared_bytes)};
    const std::int64_t positions = product(geometry.out()),
                       units = static_cast<std::int64_t>(layout.blocks().size()) * geometry.taps();
    const std::int64_t resident = runtime::resident_ctas(f, ctx, shape);
    in_image_runs(n, positions, [&](std::int64_t i0, std::int64_t m) {
      const std::int64_t rows = m * positions;
      kernels::ConvDims dims = generator::conv_dims(layout, geometry, m);
      const void* x = static_cast<const char*>(in) + i0 * layout.C() * product(geometry.in) * es;
      const void* dy = static_cast<const char*>(grad_out) + i0 * layout.K() * positions * es;
      CUtensorMap map_in =
          im2col_map(geometry, tma_rank, static_cast<std::uint64_t>(layout.C()), x, m, t.updat_copy_rows);
      CUtensorMap map_dy = runtime::tensor_map_2d(options.dtype, dy, static_cast<std::uint64_t>(layout.K()),
                                                  static_cast<std::uint64_t>(rows), 64, 64);
      const std::int64_t per = updat_range(rows, units, resident, t.updat_copy_rows);
      int chunk = static_cast<int>(per);
      void* args[] = {&sums, &gate, &chunk, &dims, &map_in, &map_dy};
      BSJIT_CU(runtime::driver().cuLaunchKernel(f, static_cast<unsigned>(units),
                                                static_cast<unsigned>((rows + per - 1) / per), 1, shape.threads, 1, 1,
                                                shape.shared_bytes, stream, args, nullptr));
    });
  }

  // Kernel k (l2_normalize or its gradient) over the filter's rows.
  void launch_rows(const char* op, Kernel k, std::initializer_list<std::pair<const char*, const void*>> needed,
                   void** args, Stream stream) {
    for (const auto& [name, ptr] : needed) {
      if (ptr == nullptr) throw Error(fmt::format("bsjit: conv {}: {} is a null pointer", op, name));
      if (reinterpret_cast<std::uintptr_t>(ptr) % 4 != 0)
        throw Error(fmt::format("bsjit: conv {}: {} ({}) is not 4-byte aligned", op, name, ptr));
    }
    CUfunction f = function(runtime::current_context(), k);
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>((g.rows + g.threads - 1) / g.threads, 65535));
    BSJIT_CU(runtime::driver().cuLaunchKernel(f, grid, 1, 1, static_cast<unsigned>(g.threads), 1, 1, 0,
                                              reinterpret_cast<CUstream>(stream), args, nullptr));
  }

  // The convolution's kernel k over n: a, b the kernel's two inputs, out its output.
  void launch(const char* op, Kernel k, const void* a, const void* b, void* out, std::int64_t n, Stream stream,
              const OpOptions& call) {
    for (const auto& [name, ptr] : {std::pair{"the first input", a}, {"the second input", b}, {"the output", out}}) {
      if (ptr == nullptr) throw Error(fmt::format("bsjit: conv {}: {} is a null pointer", op, name));
      if (reinterpret_cast<std::uintptr_t>(ptr) % 16 != 0)
        throw Error(fmt::format("bsjit: conv {}: {} ({}) is not 16-byte aligned", op, name, ptr));
    }
    const std::int64_t per_image = std::max(layout.C() * product(geometry.in), layout.K() * product(geometry.out()));
    if (n <= 0 || n > INT_MAX || per_image > INT64_MAX / 4 / n)
      throw Error(fmt::format("bsjit: conv {}: n = {} out of range (1 .. {} for this geometry)", op, n,
                              std::min<std::int64_t>(INT_MAX, INT64_MAX / 4 / per_image)));
    std::size_t matmul_bytes = 0;  // of a caller's workspace: the 1×1 path's matmul's, then the scratch
    if (call.workspace) {
      const std::size_t need = workspace_size(k, n, call);
      if (call.workspace_bytes < need || reinterpret_cast<std::uintptr_t>(call.workspace) % 16 != 0)
        throw Error(
            fmt::format("bsjit: conv {}: the workspace given ({} bytes at {}) must hold {} bytes and be "
                        "16-byte aligned (Conv::workspace_size)",
                        op, call.workspace_bytes, call.workspace, need));
      if (plan) matmul_bytes = need - matmul_scratch_bytes();
    }
    if (plan) return launch_matmul(k, a, b, out, n, reinterpret_cast<CUstream>(stream), call, matmul_bytes);
    if (igemm) return launch_igemm(k, a, b, out, n, reinterpret_cast<CUstream>(stream), call);
    const runtime::Context ctx = runtime::current_context();
    CUfunction f = function(ctx, k);
    kernels::ConvDims d = generator::conv_dims(layout, geometry, n);
    const float* gate = call.gate;
    int accumulate = call.accumulate ? 1 : 0;
    void* args[] = {&a, &b, &out, &gate, &accumulate, &d};
    unsigned grid_x = 0, grid_y = 1;
    if (k == kUpdat) {
      grid_x = static_cast<unsigned>(std::min<std::int64_t>((g.largest_block + g.threads - 1) / g.threads, 65535));
      grid_y = static_cast<unsigned>(layout.blocks().size());
    } else {
      const std::int64_t total =
          n * (k == kFprop ? layout.K() * product(geometry.out()) : layout.C() * product(geometry.in));
      grid_x =
          static_cast<unsigned>(std::min<std::int64_t>((total + g.threads - 1) / g.threads, std::int64_t(1) << 20));
    }
    BSJIT_CU(runtime::driver().cuLaunchKernel(f, grid_x, grid_y, 1, static_cast<unsigned>(g.threads), 1, 1, 0,
                                              reinterpret_cast<CUstream>(stream), args, nullptr));
  }
};

Conv::Conv(ConvLayout layout, ConvGeometry geometry, ConvOptions options)
    : impl_(std::make_unique<Impl>(std::move(layout), geometry, std::move(options))) {
  auto& m = *impl_;
  m.geometry.check();
  const auto out = m.geometry.out();
  for (int i = 0; i < 3; ++i)
    if (m.geometry.in[i] > INT_MAX || out[i] > INT_MAX || m.geometry.pad_before[i] > INT_MAX ||
        m.geometry.filter[i] * m.geometry.dilation[i] > INT_MAX || m.geometry.stride[i] > INT_MAX)
      throw Error(fmt::format("bsjit: conv: dimension {} of the geometry is past the kernels' 32-bit sizes", i));
  if (product(m.geometry.in) > INT_MAX || product(out) > INT_MAX)
    throw Error("bsjit: conv: an image of more than 2^31 positions is past the kernels' 32-bit sizes");
  if (!m.options.arch.empty()) runtime::check_arch(m.options.arch);
  m.g = generator::generate_conv(m.layout, m.geometry.taps(), m.options.dtype,
                                 m.options.order == ActivationOrder::ndhwc, m.options.deconv);  // checks its size
  m.layout_hash = generator::tables_digest(m.g.tables);
  m.plan = generator::conv_matmul_plan(m.layout, m.geometry, m.options.order == ActivationOrder::ndhwc);
  if (m.plan) {
    MatMulOptions o;
    o.block = m.plan->block;
    o.dtype = m.options.dtype;
    o.arch = m.options.arch;
    m.matmul.emplace(m.plan->layout, o);
  } else if (!m.options.direct_kernels) {
    m.igemm = generator::generate_conv_igemm(m.layout, m.options.dtype, m.options.order == ActivationOrder::ndhwc);
    if (m.igemm) m.igemm_hash = generator::tables_digest(m.igemm->tables);
    if (m.igemm && m.igemm->tma) {
      m.tma_rank = generator::conv_tma_rank(m.geometry);
      m.transposed = generator::conv_transposed_geometry(m.geometry);
      if (m.transposed) m.tma_rank_bprop = generator::conv_tma_rank(*m.transposed);
    }
  }
}

Conv::~Conv() = default;
Conv::Conv(Conv&&) noexcept = default;
Conv& Conv::operator=(Conv&&) noexcept = default;

// A deconvolution's fprop is the convolution's bprop, its bprop the convolution's fprop, its
// updat the convolution's with the input and the output gradient swapped.
void Conv::fprop(const void* input, const void* filter, void* output, std::int64_t n, Stream stream,
                 const OpOptions& op) const {
  impl_->launch("fprop", impl_->options.deconv ? kBprop : kFprop, input, filter, output, n, stream, op);
}

void Conv::bprop(const void* grad_output, const void* filter, void* grad_input, std::int64_t n, Stream stream,
                 const OpOptions& op) const {
  impl_->launch("bprop", impl_->options.deconv ? kFprop : kBprop, grad_output, filter, grad_input, n, stream, op);
}

void Conv::updat(const void* input, const void* grad_output, void* grad_filter, std::int64_t n, Stream stream,
                 const OpOptions& op) const {
  if (impl_->options.deconv)
    impl_->launch("updat", kUpdat, grad_output, input, grad_filter, n, stream, op);
  else
    impl_->launch("updat", kUpdat, input, grad_output, grad_filter, n, stream, op);
}

void Conv::l2_normalize(const void* filter, const float* gain, void* out, float* sum_squares, float epsilon,
                        Stream stream) const {
  int rows = static_cast<int>(impl_->g.rows);
  void* args[] = {&filter, &gain, &out, &sum_squares, &epsilon, &rows};
  impl_->launch_rows("l2_normalize", kNormalize, {{"filter", filter}, {"out", out}, {"sum_squares", sum_squares}}, args,
                     stream);
}

void Conv::l2_normalize_backward(const void* grad_out, const void* filter, const float* gain, const float* sum_squares,
                                 void* grad_filter, float* grad_gain, float epsilon, Stream stream) const {
  if ((gain == nullptr) != (grad_gain == nullptr))
    throw Error("bsjit: conv l2_normalize_backward: give grad_gain exactly when a gain is given");
  int rows = static_cast<int>(impl_->g.rows);
  void* args[] = {&grad_out, &filter, &gain, &sum_squares, &grad_filter, &grad_gain, &epsilon, &rows};
  impl_->launch_rows(
      "l2_normalize_backward", kNormalizeGrad,
      {{"grad_out", grad_out}, {"filter", filter}, {"sum_squares", sum_squares}, {"grad_filter", grad_filter}}, args,
      stream);
}

std::int64_t Conv::normalized_rows() const { return impl_->g.rows; }

int Conv::precompile(const std::string& arch) const {
  runtime::check_arch(arch);
  std::vector<std::future<bool>> pending;  // the compiles side by side
  std::vector<cache::Request> requests;
  for (Kernel k : impl_->kernels()) {
    if (k >= kIgemmFprop && k <= kIgemmUpdat) {  // every engine autotune may choose
      for (const auto& e : impl_->engines(arch, k)) {
        requests.push_back(impl_->request(k, arch, e));
        if (k == kIgemmBprop && e == "tma") requests.push_back(impl_->request(kTmaPack, arch));
      }
    } else {
      requests.push_back(impl_->request(k, arch));
    }
  }
  for (const auto& r : requests)
    pending.push_back(std::async(std::launch::async, [&r] {
      bool now = false;
      cache::KernelCache::global().get(r, cache::OnMiss::compile, &now);
      return now;
    }));
  int compiled = 0;
  if (impl_->matmul)
    compiled += impl_->matmul->precompile({Op::forward, Op::backward_data, Op::backward_weight}, arch) ? 1 : 0;
  for (auto& p : pending) p.wait();  // every thread done before the first error propagates
  for (auto& p : pending) compiled += p.get();
  return compiled;
}

std::string Conv::kernel_name(ConvOp op) const {
  const auto& m = *impl_;
  if (m.plan) return "matmul";
  if (!m.igemm) return "direct";
  const Kernel k = m.kernel_of(op);
  const std::string arch = runtime::kernel_arch(m.options.arch, runtime::current_context());
  return m.engine(arch, m.igemm_kernel(k));
}

std::vector<std::string> Conv::kernel_names(ConvOp op) const {
  const auto& m = *impl_;
  if (m.plan) return {"matmul"};
  if (!m.igemm) return {"direct"};
  const std::string arch = runtime::kernel_arch(m.options.arch, runtime::current_context());
  return m.engines(arch, m.igemm_kernel(m.kernel_of(op)));
}

void Conv::use_kernel(ConvOp op, const std::string& name) const {
  auto& m = *impl_;
  const auto names = kernel_names(op);
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw Error(fmt::format("bsjit: conv use_kernel: \"{}\" is not a kernel of this convolution's {} here; it has {}",
                            name,
                            op == ConvOp::fprop   ? "fprop"
                            : op == ConvOp::bprop ? "bprop"
                                                  : "updat",
                            fmt::join(names, ", ")));
  if (!m.igemm) return;  // one kernel, the one named
  m.choose(runtime::kernel_arch(m.options.arch, runtime::current_context()), m.igemm_kernel(m.kernel_of(op)), name);
}

TuneResult Conv::autotune(ConvOp op, std::int64_t n, Stream stream) const {
  auto& m = *impl_;
  if (n <= 0 || n > INT_MAX)
    throw Error(fmt::format("bsjit: conv autotune: n = {} is out of range; expected 1 ≤ n ≤ {}", n, INT_MAX));
  const runtime::Context ctx = runtime::current_context();
  const std::string arch = runtime::kernel_arch(m.options.arch, ctx);
  // scratch operands of the sizes op reads and writes at n images (values do not matter for time)
  const std::size_t es = dtype_size(m.options.dtype);
  const std::int64_t in = input_elements(n), out = output_elements(n), filter = filter_elements();
  const std::int64_t sizes[3][3] = {{in, filter, out}, {out, filter, in}, {in, out, filter}};
  const auto& sz = sizes[static_cast<int>(op)];
  runtime::DeviceMemory a(sz[0] * es), b(sz[1] * es), o(sz[2] * es);
  const auto& d = runtime::driver();
  BSJIT_CU(d.cuMemsetD8(a.ptr, 0x3c, a.bytes));
  BSJIT_CU(d.cuMemsetD8(b.ptr, 0x3c, b.bytes));
  const auto run = [&] {
    if (op == ConvOp::fprop)
      fprop(a.get(), b.get(), o.get(), n, stream);
    else if (op == ConvOp::bprop)
      bprop(a.get(), b.get(), o.get(), n, stream);
    else
      updat(a.get(), b.get(), o.get(), n, stream);
  };
  const CUstream s = reinterpret_cast<CUstream>(stream);
  TuneResult result;
  const Kernel k = m.igemm_kernel(m.kernel_of(op));
  const auto engines = kernel_names(op);
  if (engines.size() == 1) {  // one kernel: timed, reported
    result.chosen = kernel_name(op);
    result.milliseconds.emplace_back(result.chosen, runtime::median_ms(run, s, 2, 10));
    return result;
  }
  for (const auto& e : engines) {
    m.choose(arch, k, e);
    result.milliseconds.emplace_back(e, runtime::median_ms(run, s, 2, 10));
  }
  const auto best = std::min_element(result.milliseconds.begin(), result.milliseconds.end(),
                                     [](const auto& x, const auto& y) { return x.second < y.second; });
  result.chosen = best->first;
  m.choose(arch, k, result.chosen);
  nlohmann::json j;
  j["key"] = m.tuning_key(arch, k - kIgemmFprop);
  j["kernel"] = result.chosen;
  j["milliseconds"] = nlohmann::json::object();
  for (const auto& [e, ms] : result.milliseconds) j["milliseconds"][e] = ms;
  j["n"] = n;
  cache::KernelCache::global().store_tuning(j["key"], m.tuning_stem(arch, k - kIgemmFprop), j.dump());
  return result;
}

void Conv::load(bool strict) const {
  const runtime::Context ctx = runtime::current_context();
  const cache::OnMiss on_miss = strict ? cache::OnMiss::fail : cache::KernelCache::global().run_time_on_miss();
  for (Kernel k : impl_->kernels()) impl_->function(ctx, k, on_miss);
  if (impl_->tma_bprop(kBprop)) impl_->function(ctx, kTmaPack, on_miss);  // its filter's packing
  if (impl_->matmul) impl_->matmul->prepare({Op::forward, Op::backward_data, Op::backward_weight});
  impl_->order_of(ctx);
}

std::size_t Conv::workspace_size(ConvOp op, std::int64_t n, const OpOptions& call) const {
  if (n <= 0 || n > INT_MAX) throw Error(fmt::format("bsjit: conv: n = {} out of range (1 .. {})", n, INT_MAX));
  return impl_->workspace_size(impl_->kernel_of(op), n, call);
}

std::string Conv::generated_source() const {
  return impl_->igemm ? impl_->igemm->source + "\n" + impl_->g.source : impl_->g.source;
}

std::int64_t Conv::input_elements(std::int64_t n) const {
  const auto& m = *impl_;
  return m.options.deconv ? n * m.layout.K() * product(m.geometry.out()) : n * m.layout.C() * product(m.geometry.in);
}

std::int64_t Conv::output_elements(std::int64_t n) const {
  const auto& m = *impl_;
  return m.options.deconv ? n * m.layout.C() * product(m.geometry.in) : n * m.layout.K() * product(m.geometry.out());
}

std::int64_t Conv::filter_elements() const { return impl_->layout.filter_elements(impl_->geometry.taps()); }
const ConvLayout& Conv::layout() const { return impl_->layout; }
const ConvGeometry& Conv::geometry() const { return impl_->geometry; }
const ConvOptions& Conv::options() const { return impl_->options; }

struct ConvEdgeBias::Impl {
  ConvGeometry geometry;
  std::int64_t channels;
  ConvOptions options;
  generator::GeneratedConvEdgeBias g;
  std::string hash;
  std::mutex mutex;
  std::map<runtime::Context, std::array<runtime::SharedKernels::Handle, 3>> contexts;

  cache::Request request(int k, const std::string& arch) const {
    static const char* suffix[] = {"-forward", "-grad", "-sums"};
    const std::string* name[] = {&g.forward, &g.grad, &g.sums};
    return runtime::named_kernel_request(g.source, g.tables, *name[k], g.label + suffix[k], 0, arch, hash);
  }
  CUfunction function(int k) {
    const runtime::Context ctx = runtime::current_context();
    std::lock_guard lock(mutex);
    auto& loaded = contexts[ctx];
    if (!loaded[k])
      loaded[k] = runtime::load_cached(request(k, runtime::kernel_arch(options.arch, ctx)), ctx,
                                       cache::KernelCache::global().run_time_on_miss());
    return loaded[k]->function;
  }
  void launch(const char* op, int k, std::int64_t work, std::int64_t n,
              std::initializer_list<std::pair<const char*, const void*>> pointers, void** args, Stream stream) {
    for (const auto& [name, ptr] : pointers)
      if (ptr == nullptr) throw Error(fmt::format("bsjit: conv edge bias {}: {} is a null pointer", op, name));
    if (n <= 0 || n > INT_MAX || static_cast<std::int64_t>(g.edges.of.size()) * channels > INT64_MAX / 4 / n)
      throw Error(fmt::format("bsjit: conv edge bias {}: n = {} out of range", op, n));
    if (work == 0) return;
    const auto grid = static_cast<unsigned>(std::min<std::int64_t>((work + g.threads - 1) / g.threads, 1 << 20));
    BSJIT_CU(runtime::driver().cuLaunchKernel(function(k), grid, 1, 1, static_cast<unsigned>(g.threads), 1, 1, 0,
                                              reinterpret_cast<CUstream>(stream), args, nullptr));
  }
};

ConvEdgeBias::ConvEdgeBias(const ConvGeometry& geometry, std::int64_t channels, ConvOptions options)
    : impl_(std::make_unique<Impl>()) {
  geometry.check();
  const auto positions = options.deconv ? geometry.in : geometry.out();
  if (channels <= 0 || channels > INT_MAX || product(positions) > INT_MAX)
    throw Error(fmt::format("bsjit: conv edge bias: {} channels over {} positions is past the kernels' 32-bit sizes",
                            channels, product(positions)));
  if (!options.arch.empty()) runtime::check_arch(options.arch);
  impl_->geometry = geometry;
  impl_->channels = channels;
  impl_->g = generator::generate_conv_edge_bias(geometry, options.deconv, options.dtype,
                                                options.order == ActivationOrder::ndhwc);
  impl_->options = std::move(options);
  impl_->hash = generator::tables_digest(impl_->g.tables);
}

ConvEdgeBias::~ConvEdgeBias() = default;
ConvEdgeBias::ConvEdgeBias(ConvEdgeBias&&) noexcept = default;
ConvEdgeBias& ConvEdgeBias::operator=(ConvEdgeBias&&) noexcept = default;

void ConvEdgeBias::forward(const void* x, const float* gain, const float* bias, void* y, std::int64_t n,
                           Stream stream) const {
  int n_ = static_cast<int>(n), c = static_cast<int>(impl_->channels), p = static_cast<int>(positions()),
      e = static_cast<int>(edges());
  void* args[] = {&x, &gain, &bias, &y, &n_, &c, &p, &e};
  impl_->launch("forward", 0, n * impl_->channels * positions(), n,
                {{"x", x}, {"y", y}, {"gain", edges() ? gain : x}, {"bias", edges() ? bias : x}}, args, stream);
}

void ConvEdgeBias::backward(const void* dy, const void* x, const float* gain, void* dx, float* grad_gain,
                            float* grad_bias, std::int64_t n, Stream stream) const {
  int n_ = static_cast<int>(n), c = static_cast<int>(impl_->channels), p = static_cast<int>(positions()),
      e = static_cast<int>(edges());
  const void* some = dy;  // stands in for the parameters where there is no edge
  void* grad_args[] = {&dy, &gain, &dx, &n_, &c, &p, &e};
  impl_->launch("backward", 1, n * impl_->channels * positions(), n,
                {{"dy", dy}, {"dx", dx}, {"gain", edges() ? gain : some}}, grad_args, stream);
  void* sum_args[] = {&dy, &x, &grad_gain, &grad_bias, &n_, &c, &p, &e};
  impl_->launch("backward", 2, edges() * impl_->channels, n,
                {{"x", x}, {"grad_gain", edges() ? grad_gain : some}, {"grad_bias", edges() ? grad_bias : some}},
                sum_args, stream);
}

std::int64_t ConvEdgeBias::edges() const { return impl_->g.edges.edges; }
std::int64_t ConvEdgeBias::positions() const { return static_cast<std::int64_t>(impl_->g.edges.of.size()); }
const std::vector<int>& ConvEdgeBias::position_edges() const { return impl_->g.edges.of; }

int ConvEdgeBias::precompile(const std::string& arch) const {
  runtime::check_arch(arch);
  int compiled = 0;
  for (int k = 0; k < 3; ++k) {
    bool now = false;
    cache::KernelCache::global().get(impl_->request(k, arch), cache::OnMiss::compile, &now);
    compiled += now;
  }
  return compiled;
}

}  // namespace bsjit
