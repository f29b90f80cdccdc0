#include "kernel_registry.hpp"

#include <fmt/format.h>

#include "bsjit/error.hpp"
#include "module.hpp"

namespace bsjit::runtime {

std::shared_ptr<const PreparedKernel> KernelRegistry::prepare(const Layout& layout, const KernelId& id,
                                                              cache::OnMiss on_miss, bool* compiled_now) {
  if (compiled_now) *compiled_now = false;
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard lock(mutex_);
    auto& s = prepared_[id];
    if (!s) s = std::make_shared<Slot>();
    slot = s;
  }
  std::lock_guard slot_lock(slot->mutex);  // one id prepares once; other ids go on in parallel
  if (slot->prepared) return slot->prepared;
  check_arch(id.arch);
  auto p = std::make_shared<PreparedKernel>();
  p->generated = generator::generate_matmul(layout, id.spec);
  p->key = cache::make_key(cache::key_inputs(p->generated.source, id.arch));
  const auto& g = p->generated;
  cache::Request request{p->key, g.label, id.arch, id.layout_hash,
                         [&] {
                           auto k = compile(g.source, g.name_expression, g.label, id.arch);
                           k.shared_bytes = g.shared_bytes;
                           return k;
                         }};
  p->compiled = cache::KernelCache::global().get(request, on_miss, compiled_now);
  slot->prepared = p;
  return p;
}

LaunchShape launch_shape(const PreparedKernel& kernel, Op op, std::int64_t n) {
  constexpr std::int64_t kMaxGridY = 65535;
  const auto& g = kernel.generated;
  LaunchShape shape;
  shape.threads = static_cast<std::uint32_t>(g.tiles.threads);
  shape.shared_bytes = static_cast<std::uint32_t>(g.shared_bytes);
  shape.grid_x = static_cast<std::uint32_t>(g.grid_x);
  if (g.rows_per_cta > 0) {
    const std::int64_t gy = (n + g.rows_per_cta - 1) / g.rows_per_cta;
    if (gy > kMaxGridY)
      throw Error(fmt::format("bsjit: {}: n = {} needs {} row tiles; at most {} are supported (n ≤ {})", to_string(op),
                              n, gy, kMaxGridY, kMaxGridY * g.rows_per_cta));
    shape.grid_y = static_cast<std::uint32_t>(gy);
  }
  return shape;
}

CUfunction KernelRegistry::function(const std::string& key, const CompiledKernel& kernel, CUcontext ctx) {
  std::lock_guard lock(mutex_);  // loading a module takes ~0.1 ms: no need for finer locks
  auto& f = functions_[{key, ctx}];
  if (!f) f = load(kernel, ctx).function;
  return f;
}

KernelRegistry& KernelRegistry::global() {
  static KernelRegistry registry;
  return registry;
}

}  // namespace bsjit::runtime
