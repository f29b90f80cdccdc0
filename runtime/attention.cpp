// bsjit::Attention: the fused forward kernel generated for the masks, compiled through the kernel
// cache (key over the source and arch, like every kernel), loaded once per context.
#include "bsjit/attention.hpp"

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>

#include "bsjit/error.hpp"
#include "cache/kernel_cache.hpp"
#include "compiler.hpp"
#include "driver.hpp"
#include "generator/attention_generator.hpp"
#include "module.hpp"

namespace bsjit {

struct Attention::Impl {
  std::vector<Layout> masks;
  AttentionOptions options;
  generator::GeneratedAttention generated;
  std::string masks_hash;
  std::mutex mutex;
  std::map<CUcontext, CUfunction> functions;

  std::string arch_for(CUcontext ctx) const {
    return options.arch.empty() ? runtime::default_kernel_arch(runtime::context_arch(ctx)) : options.arch;
  }

  cache::KernelCache::Compiled compiled(const std::string& arch, cache::OnMiss on_miss, bool* now = nullptr) {
    runtime::check_arch(arch);
    const std::string key = cache::make_key(cache::key_inputs(generated.source, arch));
    cache::Request request{key, generated.label, arch, masks_hash, [this, arch] {
                             auto k = runtime::compile(generated.source, generated.name_expression, generated.label,
                                                       arch);
                             k.shared_bytes = generated.shared_bytes;
                             return k;
                           }};
    return cache::KernelCache::global().get(request, on_miss, now);
  }

  CUfunction function(CUcontext ctx) {
    std::lock_guard lock(mutex);
    auto& f = functions[ctx];
    if (!f) {
      auto on_miss = cache::KernelCache::global().config().strict ? cache::OnMiss::fail : cache::OnMiss::compile;
      f = runtime::load(*compiled(arch_for(ctx), on_miss), ctx).function;
    }
    return f;
  }
};

Attention::Attention(std::vector<Layout> masks, AttentionOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->generated = generator::generate_attention_forward(masks, options);
  std::string material;
  for (const auto& m : masks) material += m.hash().hex();
  XXH128_hash_t h = XXH3_128bits(material.data(), material.size());
  impl_->masks_hash = fmt::format("{:016x}{:016x}", h.high64, h.low64);
  impl_->masks = std::move(masks);
  impl_->options = std::move(options);
  if (!impl_->options.arch.empty()) runtime::check_arch(impl_->options.arch);
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

void Attention::forward(const void* q, const void* k, const void* v, void* out, float* lse, std::int64_t batch,
                        std::int64_t heads, Stream stream, float scale, const std::uint8_t* key_padding) const {
  const char* names[] = {"q", "k", "v", "out"};
  const void* ptrs[] = {q, k, v, out};
  for (int i = 0; i < 4; ++i) {
    if (ptrs[i] == nullptr) throw Error(fmt::format("bsjit: attention: {} is a null pointer", names[i]));
    if (reinterpret_cast<std::uintptr_t>(ptrs[i]) % 16 != 0)
      throw Error(fmt::format("bsjit: attention: {} ({}) is not 16-byte aligned", names[i], ptrs[i]));
  }
  if (lse == nullptr) throw Error("bsjit: attention: lse is a null pointer");
  const auto masks = static_cast<std::int64_t>(impl_->masks.size());
  if (heads <= 0 || heads > 65535 || (masks > 1 && heads != masks))
    throw Error(fmt::format("bsjit: attention: heads = {} does not fit {} block mask(s) (1 ≤ heads ≤ 65535)", heads,
                            masks));
  if (batch <= 0 || batch > 65535) throw Error(fmt::format("bsjit: attention: batch = {} out of 1..65535", batch));
  const auto& g = impl_->generated;
  if (batch * heads * std::max(g.seq_q, g.seq_k) * impl_->options.head_dim > INT64_MAX / 4)
    throw Error("bsjit: attention: tensors too large");
  const float s = scale != 0 ? scale : 1.0f / std::sqrt(static_cast<float>(impl_->options.head_dim));
  float scale_log2 = s * 1.4426950408889634f;  // scores in the log2 domain: exp2 in the kernel
  int heads_arg = static_cast<int>(heads);
  CUcontext ctx = runtime::current_context();
  CUfunction f = impl_->function(ctx);
  const unsigned char* padding = key_padding;
  void* args[] = {&q, &k, &v, &out, &lse, &padding, &heads_arg, &scale_log2};
  BSJIT_CU(runtime::driver().cuLaunchKernel(f, static_cast<unsigned>(g.query_tiles), static_cast<unsigned>(heads),
                                            static_cast<unsigned>(batch), static_cast<unsigned>(g.threads), 1, 1,
                                            static_cast<unsigned>(g.shared_bytes), reinterpret_cast<CUstream>(stream),
                                            args, nullptr));
}

bool Attention::precompile(const std::string& arch) const {
  bool now = false;
  impl_->compiled(arch, cache::OnMiss::compile, &now);
  return now;
}

std::int64_t Attention::seq_q() const { return impl_->generated.seq_q; }
std::int64_t Attention::seq_k() const { return impl_->generated.seq_k; }
const AttentionOptions& Attention::options() const { return impl_->options; }

}  // namespace bsjit
