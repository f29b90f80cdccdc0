#include "kernel_registry.hpp"

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
