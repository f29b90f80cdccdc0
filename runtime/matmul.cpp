// MatMul: validates arguments, finds (or generates, compiles, caches, loads) the kernel of an op
// for the current context, and launches it.
#include "bsjit/matmul.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "bsjit/error.hpp"
#include "driver.hpp"
#include "generator/matmul_generator.hpp"
#include "kernel_registry.hpp"
#include "module.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit {
namespace {

constexpr int kOps = 3;

void check_pointer(const void* p, const char* what, Op op) {
  if (p == nullptr) throw Error(fmt::format("bsjit: {}: {} is a null pointer; expected a device pointer", to_string(op), what));
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    throw Error(fmt::format("bsjit: {}: {} ({}) is not 16-byte aligned; expected a 16-byte aligned device pointer",
                            to_string(op), what, p));
}

}  // namespace

struct MatMul::Impl {
  Impl(Layout l, MatMulOptions o) : layout(std::move(l)), options(std::move(o)), layout_hash(layout.hash().hex()) {
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
      op_specs[static_cast<int>(op)] = runtime::op_variants(op, options);
  }

  Layout layout;
  MatMulOptions options;
  std::string layout_hash;
  std::array<std::vector<generator::MatMulSpec>, kOps> op_specs;  // generator::variants of each op

  // What a launch needs, per context and op: filled on the first call in a context, held (the
  // kernel loaded there, and its generated tables and launch shape) until this object goes.
  struct Launchable {
    runtime::SharedKernels::Handle loaded;
    std::shared_ptr<const runtime::PreparedKernel> prepared;
  };
  // Kernels precompile() prepared, kept for the first call in a context (no second generation).
  std::map<runtime::KernelId, std::shared_ptr<const runtime::PreparedKernel>> precompiled;
  std::mutex mutex;  // guards launchables, precompiled and workspaces
  // The split kernels' workspace of each (context, stream) this object launched on, shared with
  // every other kernel and MatMul there (runtime::SplitWorkspaces); held here so that it lives as
  // long as this object may launch with it.
  std::map<std::pair<runtime::Context, CUstream>, std::shared_ptr<runtime::DeviceMemory>> workspaces;

  // The workspace a launch over n rows takes: its split partials and counters, its wave's counters
  // where the gate would wait, or nothing (runtime::workspace_bytes).
  static std::size_t workspace_need(const Launchable& l, const runtime::Context& ctx, Op op, std::int64_t n) {
    const std::size_t bytes = runtime::workspace_bytes(*l.prepared, l.loaded->function, ctx, op, n);
    return bytes > 0 ? std::max(bytes, MatMul::workspace_counter_bytes()) : 0;
  }

  float* workspace(const runtime::Context& ctx, CUstream stream, const runtime::PreparedKernel& kernel) {
    auto w = runtime::SplitWorkspaces::global().get(ctx, stream, kernel.generated.workspace_bytes);
    std::lock_guard lock(mutex);
    workspaces[{ctx, stream}] = w;
    return static_cast<float*>(w->get());
  }

  // per context: [op][variant][kind] (generator::variants: 0 for any N, 1 for small N; kind 1: the
  // plain kernel, 0: the general one)
  using Kinds = std::array<Launchable, 2>;
  std::map<runtime::Context, std::array<std::array<Kinds, 2>, kOps>> launchables;

  const std::vector<generator::MatMulSpec>& specs(Op op) const { return op_specs[static_cast<int>(op)]; }
  runtime::KernelId id(const generator::MatMulSpec& spec, const std::string& arch) const {
    return {layout_hash, spec, arch};
  }
  // The spec of op's variant v for arch, plain or general: the tuned tile shape where a tuning
  // record exists.
  generator::MatMulSpec spec_for(Op op, int v, bool plain, const std::string& arch, int sms = 0) const {
    return runtime::call_spec(layout_hash, specs(op), v, plain, arch, sms);
  }
  // The SMs ctx's kernels' schedules are planned for: the options' count, else its GPU's.
  int sms_for(const runtime::Context& ctx) const { return options.sms > 0 ? options.sms : runtime::context_sms(ctx); }
  std::string arch_for(const runtime::Context& ctx) const {
    return options.arch.empty() ? runtime::default_kernel_arch(runtime::context_arch(ctx)) : options.arch;
  }

  // The kernels of ops' calls for arch, each (op, variant, kind) once, in the order given.
  struct OpKernel {
    Op op;
    int variant;
    bool plain;
    runtime::KernelId id;
  };
  std::vector<OpKernel> kernels(const std::vector<Op>& ops, const std::string& arch, Calls calls, int sms = 0) const {
    std::vector<OpKernel> out;
    for (Op op : ops) {
      bool seen = false;
      for (const auto& k : out) seen |= k.op == op;
      if (seen) continue;
      for (int v = 0; v < static_cast<int>(specs(op).size()); ++v)
        for (bool plain : runtime::plain_kinds(calls))
          out.push_back({op, v, plain, id(spec_for(op, v, plain, arch, sms), arch)});
    }
    return out;
  }
  // Those kernels from the registry (compiled side by side where the cache lacks them, on_miss
  // allowing); (*now)[i]: whether NVRTC ran for kernels[i].
  std::vector<std::shared_ptr<const runtime::PreparedKernel>> prepare_all(const std::vector<OpKernel>& kernels,
                                                                         cache::OnMiss on_miss,
                                                                         std::vector<char>* now = nullptr) const {
    std::vector<std::pair<const Layout*, runtime::KernelId>> ids;
    for (const auto& k : kernels) ids.push_back({&layout, k.id});
    return runtime::KernelRegistry::global().prepare_all(ids, on_miss, now);
  }

  // Which variant runs n rows.
  int variant(Op op, std::int64_t n) const {
    return n <= generator::kSmallBatchRows && specs(op).size() > 1 ? 1 : 0;
  }

  // op's variant v, plain or general, as loaded in ctx already; empty where it is not.
  Launchable loaded(Op op, int v, bool plain, const runtime::Context& ctx) {
    std::lock_guard lock(mutex);
    auto it = launchables.find(ctx);
    return it != launchables.end() ? it->second[static_cast<int>(op)][v][plain] : Launchable{};
  }

  Launchable launchable(Op op, int v, bool plain, const runtime::Context& ctx) {
    if (Launchable l = loaded(op, v, plain, ctx); l.loaded) return l;
    const std::string arch = arch_for(ctx);
    auto on_miss = cache::KernelCache::global().run_time_on_miss();
    Launchable l;
    const runtime::KernelId kernel = id(spec_for(op, v, plain, arch, sms_for(ctx)), arch);
    l.prepared = runtime::KernelRegistry::global().prepare(layout, kernel, on_miss);  // unlocked
    l.loaded = runtime::KernelRegistry::global().load(kernel, &l.prepared, ctx, on_miss);
    std::lock_guard lock(mutex);
    launchables[ctx][static_cast<int>(op)][v][plain] = l;
    return l;
  }

  void run(Op op, const void* a, const void* b, void* out, std::int64_t n, Stream stream, const OpOptions& o) {
    static const char* const kNames[kOps][3] = {{"x", "w", "y"}, {"dy", "w", "dx"}, {"x", "dy", "dw"}};
    const auto& nm = kNames[static_cast<int>(op)];
    check_pointer(a, nm[0], op);
    check_pointer(b, nm[1], op);
    check_pointer(out, nm[2], op);
    if (n <= 0 || n > INT_MAX)
      throw Error(fmt::format("bsjit: {}: n = {} is out of range; expected 1 ≤ n ≤ {}", to_string(op), n, INT_MAX));
    if (o.gate != nullptr && reinterpret_cast<std::uintptr_t>(o.gate) % 4 != 0)
      throw Error(fmt::format("bsjit: {}: gate pointer {} is not 4-byte aligned", to_string(op),
                              static_cast<const void*>(o.gate)));
    const runtime::Context ctx = runtime::current_context();
    Launchable l = launchable(op, variant(op, n), runtime::plain_call(o), ctx);
    const CUstream s = reinterpret_cast<CUstream>(stream);
    runtime::KernelArgs args{a, b, out, o.gate, static_cast<int>(n), o.accumulate ? 1 : 0, nullptr};
    if (const std::size_t need = workspace_need(l, ctx, op, n); need > 0 && o.workspace != nullptr) {
      if (o.workspace_bytes < need || reinterpret_cast<std::uintptr_t>(o.workspace) % 16 != 0)
        throw Error(
            fmt::format("bsjit: {}: the workspace given ({} bytes at {}) must hold {} bytes and be 16-byte "
                        "aligned (MatMul::workspace_size)",
                        to_string(op), o.workspace_bytes, o.workspace, need));
      args.workspace = static_cast<float*>(o.workspace);
    } else if (need > 0) {
      args.workspace = workspace(ctx, s, *l.prepared);
    }
    runtime::launch_prepared(*l.prepared, l.loaded->function, ctx, op, n, s, args);
  }
};

MatMul::MatMul(Layout layout, MatMulOptions options) {
  if (!generator::supported_block(options.block))
    throw Error(fmt::format("bsjit: block size {} is not supported; expected 8, 16, 32, 64 or 128", options.block));
  if (!options.arch.empty()) runtime::check_arch(options.arch);
  if (options.sms < 0 || options.sms > generator::kMaxSms)
    throw Error(fmt::format("bsjit: sms {} is not an SM count of a Hopper GPU (1-{}; 0: the device's)", options.sms,
                            generator::kMaxSms));
  if (layout.rows() * options.block > INT_MAX || layout.cols() * options.block > INT_MAX)
    throw Error(fmt::format("bsjit: layout [{}, {}] at block {} gives matrix dimensions over 2^31", layout.rows(),
                            layout.cols(), options.block));
  if (layout.blocks() > INT_MAX / 2) throw Error("bsjit: layout has too many blocks (at most 2^30)");
  impl_ = std::make_unique<Impl>(std::move(layout), std::move(options));
}

MatMul::~MatMul() = default;
MatMul::MatMul(MatMul&&) noexcept = default;
MatMul& MatMul::operator=(MatMul&&) noexcept = default;

void MatMul::forward(const void* x, const void* w, void* y, std::int64_t n, Stream stream, const OpOptions& o) const {
  impl_->run(Op::forward, x, w, y, n, stream, o);
}
void MatMul::backward_data(const void* dy, const void* w, void* dx, std::int64_t n, Stream stream,
                           const OpOptions& o) const {
  impl_->run(Op::backward_data, dy, w, dx, n, stream, o);
}
void MatMul::backward_weight(const void* x, const void* dy, void* dw, std::int64_t n, Stream stream,
                             const OpOptions& o) const {
  impl_->run(Op::backward_weight, x, dy, dw, n, stream, o);
}

bool MatMul::precompile(Op op, const std::string& arch, Calls calls) const {
  return precompile(std::vector<Op>{op}, arch, calls);
}

bool MatMul::precompile(const std::vector<Op>& ops, const std::string& arch, Calls calls) const {
  runtime::check_arch(arch);
  const auto kernels = impl_->kernels(ops, arch, calls);
  std::vector<char> now;
  const auto prepared = impl_->prepare_all(kernels, cache::OnMiss::compile, &now);
  std::lock_guard lock(impl_->mutex);
  for (std::size_t i = 0; i < kernels.size(); ++i) impl_->precompiled[kernels[i].id] = prepared[i];
  return std::find(now.begin(), now.end(), 1) != now.end();
}

TuneResult MatMul::autotune(Op op, std::int64_t n, Stream stream) const {
  if (n <= 0 || n > INT_MAX)
    throw Error(fmt::format("bsjit: autotune: n = {} is out of range; expected 1 ≤ n ≤ {}", n, INT_MAX));
  const runtime::Context ctx = runtime::current_context();
  const std::string arch = impl_->arch_for(ctx);
  const int v = impl_->variant(op, n);
  generator::MatMulSpec base = impl_->specs(op)[v];
  base.wgmma = generator::has_wgmma(arch) && !base.tf32;
  base.plain = true;  // timed without options; the choice serves the general kernel too
  // candidates: this variant's own shape first, then every shape the generator offers
  std::vector<generator::MatMulSpec> candidates{base};
  if (generator::choose_tiles(base).pipelined) {
    candidates.front().tiles = generator::choose_tiles(base);
    for (const auto& t : generator::tile_candidates(base)) {
      generator::MatMulSpec c = base;
      c.tiles = t;
      bool seen = false;
      for (const auto& o : candidates) seen |= generator::tiles_tag(*o.tiles) == generator::tiles_tag(t);
      if (!seen) candidates.push_back(c);
    }
  }
  // compile them all at once, on every core
  std::vector<std::pair<const Layout*, runtime::KernelId>> kernels;
  for (const auto& c : candidates) kernels.push_back({&impl_->layout, impl_->id(c, arch)});
  std::vector<std::shared_ptr<const runtime::PreparedKernel>> prepared;
  try {
    prepared = runtime::KernelRegistry::global().prepare_all(kernels, cache::OnMiss::compile);
  } catch (const std::exception& e) {
    throw Error(std::string("bsjit: autotune: ") + e.what());
  }
  // scratch operands of the sizes the op reads and writes at n rows (values do not matter for time)
  const std::int64_t C = in_features(), K = out_features(), W = weight_elements();
  const std::size_t es = dtype_size(impl_->options.dtype);
  const std::int64_t sizes[kOps][3] = {{n * C, W, n * K}, {n * K, W, n * C}, {n * C, n * K, W}};
  const auto& sz = sizes[static_cast<int>(op)];
  runtime::DeviceMemory a(sz[0] * es), b(sz[1] * es), out(sz[2] * es);
  const auto& d = runtime::driver();
  BSJIT_CU(d.cuMemsetD8(a.ptr, 0x3c, sz[0] * es));
  BSJIT_CU(d.cuMemsetD8(b.ptr, 0x3c, sz[1] * es));
  TuneResult result;
  double best = 0;
  std::size_t best_i = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    // loaded for the timing only: released after it (parked for a while, then unloaded)
    const auto loaded =
        runtime::KernelRegistry::global().load(kernels[i].second, &prepared[i], ctx, cache::OnMiss::compile);
    CUfunction f = loaded->function;
    const CUstream s = reinterpret_cast<CUstream>(stream);
    runtime::KernelArgs args{a.get(), b.get(), out.get(), nullptr, static_cast<int>(n), 0, nullptr};
    if (prepared[i]->generated.workspace_bytes > 0)
      args.workspace = impl_->workspace(ctx, s, *prepared[i]);
    double ms = runtime::median_ms([&] { runtime::launch_prepared(*prepared[i], f, ctx, op, n, s, args); }, s, 2, 10);
    std::string tag = candidates[i].tiles ? generator::tiles_tag(*candidates[i].tiles) : "default";
    result.milliseconds.emplace_back(tag, ms);
    if (i == 0 || ms < best) best = ms, best_i = i;
  }
  result.chosen = result.milliseconds[best_i].first;
  if (candidates[best_i].tiles) {
    runtime::store_tuning(impl_->layout_hash, base, arch, v, *candidates[best_i].tiles);
    std::lock_guard lock(impl_->mutex);  // the next call resolves the tuned shape
    for (auto& [c, per_op] : impl_->launchables) per_op[static_cast<int>(op)][v] = {};  // both kinds
  }
  return result;
}

void MatMul::prepare(Op op, Calls calls) const { prepare(std::vector<Op>{op}, calls); }

void MatMul::prepare(const std::vector<Op>& ops, Calls calls) const {
  const runtime::Context ctx = runtime::current_context();
  std::vector<Impl::OpKernel> kernels;  // those not loaded in ctx yet: a repeated prepare starts no thread
  for (auto& k : impl_->kernels(ops, impl_->arch_for(ctx), calls, impl_->sms_for(ctx)))
    if (!impl_->loaded(k.op, k.variant, k.plain, ctx).loaded) kernels.push_back(std::move(k));
  // compiled (or read from the cache) on every core, held here while each is loaded in turn:
  // launchable then finds them in the registry
  const auto prepared = impl_->prepare_all(kernels, cache::KernelCache::global().run_time_on_miss());
  for (const auto& k : kernels) impl_->launchable(k.op, k.variant, k.plain, ctx);
}

std::string MatMul::generated_source(Op op, const OpOptions& call) const {
  generator::MatMulSpec spec = impl_->specs(op)[0];
  spec.plain = runtime::plain_call(call);
  return generator::generate_matmul(impl_->layout, spec).source;
}
std::string MatMul::kernel_label(Op op, std::int64_t n, const OpOptions& call) const {
  const runtime::Context ctx = runtime::current_context();
  // generated, not just chosen: the generator may pick another kernel for this layout
  const auto spec =
      impl_->spec_for(op, impl_->variant(op, n), runtime::plain_call(call), impl_->arch_for(ctx), impl_->sms_for(ctx));
  return generator::generate_matmul(impl_->layout, spec).label;
}

std::size_t MatMul::workspace_size(Op op, std::int64_t n, const OpOptions& call) const {
  if (n <= 0 || n > INT_MAX)
    throw Error(fmt::format("bsjit: {}: n = {} is out of range; expected 1 ≤ n ≤ {}", to_string(op), n, INT_MAX));
  const runtime::Context ctx = runtime::current_context();
  return Impl::workspace_need(impl_->launchable(op, impl_->variant(op, n), runtime::plain_call(call), ctx), ctx, op, n);
}

std::size_t MatMul::workspace_counter_bytes() { return sizeof(unsigned) * kernels::kSplitCounters; }

const Layout& MatMul::layout() const { return impl_->layout; }
const MatMulOptions& MatMul::options() const { return impl_->options; }
std::int64_t MatMul::in_features() const { return impl_->layout.rows() * impl_->options.block; }
std::int64_t MatMul::out_features() const { return impl_->layout.cols() * impl_->options.block; }
std::int64_t MatMul::weight_elements() const {
  return impl_->layout.blocks() * impl_->options.block * impl_->options.block;
}

}  // namespace bsjit
