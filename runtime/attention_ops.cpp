// bsjit::AttentionOps: the five kernels of the masks' generated source, each compiled through the
// kernel cache on its first use (or by precompile) and loaded once per context; the element masks
// compacted to the blocks that mask something and copied to each context once.
#include "bsjit/attention_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <future>
#include <map>
#include <mutex>

#include "attention_common.hpp"
#include "bsjit/error.hpp"
#include "driver.hpp"
#include "generator/attention_generator.hpp"
#include "module.hpp"

namespace bsjit {
namespace {

enum Kernel { kScores, kSoftmax, kSoftmaxGrad, kProbsV, kProbsT, kKernels };

}  // namespace

struct AttentionOps::Impl {
  std::vector<Layout> masks;
  AttentionOptions options;
  std::string masks_hash;
  generator::GeneratedAttentionOps g;
  // Per table position (every mask's blocks, one mask after the other) the block's slot in bits,
  // -1 where it keeps every pair; empty without element masks.
  std::vector<int> slots;
  std::vector<std::uint32_t> bits;

  struct PerContext {
    std::array<runtime::SharedKernels::Handle, kKernels> kernels;
    std::unique_ptr<runtime::DeviceMemory> masks;  // slots, then bits
  };
  std::mutex mutex;
  std::map<runtime::Context, PerContext> contexts;

  std::pair<const std::string*, int> kernel(Kernel k) const {
    switch (k) {
      case kScores:
        return {&g.scores, g.scores_shared};
      case kSoftmax:
        return {&g.softmax, 0};
      case kSoftmaxGrad:
        return {&g.softmax_grad, 0};
      case kProbsV:
        return {&g.probs_v, g.product_shared};
      default:
        return {&g.probs_t, g.product_shared};
    }
  }
  static const char* suffix(Kernel k) {
    static const char* names[] = {"-scores", "-softmax", "-softmax_grad", "-probs_v", "-probs_t"};
    return names[k];
  }
  cache::Request request(Kernel k, const std::string& arch) const {
    const auto [name, shared] = kernel(k);
    return runtime::named_kernel_request(g.source, g.tables, *name, g.label + suffix(k), shared, arch, masks_hash);
  }

  PerContext& context(const runtime::Context& ctx, Kernel k,
                      cache::OnMiss on_miss = cache::KernelCache::global().run_time_on_miss()) {
    std::lock_guard lock(mutex);
    auto& c = contexts[ctx];
    if (!c.kernels[k]) {
      c.kernels[k] = runtime::load_cached(request(k, runtime::kernel_arch(options.arch, ctx)), ctx, on_miss);
    }
    if (k == kSoftmax && !slots.empty() && !c.masks) {
      const std::size_t slot_bytes = slots.size() * sizeof(int), bit_bytes = bits.size() * sizeof(std::uint32_t);
      c.masks = std::make_unique<runtime::DeviceMemory>(slot_bytes + bit_bytes);
      const auto& d = runtime::driver();
      BSJIT_CU(d.cuMemcpyHtoD(c.masks->ptr, slots.data(), slot_bytes));
      if (bit_bytes > 0) BSJIT_CU(d.cuMemcpyHtoD(c.masks->ptr + slot_bytes, bits.data(), bit_bytes));
    }
    return c;
  }

  void launch(Kernel k, std::int64_t batch, std::int64_t heads, Stream stream, std::initializer_list<void*> args) {
    PerContext& c = context(runtime::current_context(), k);
    const std::int64_t ys[] = {g.score_tiles, g.softmax_rows4, g.softmax_rows4, g.query_tiles, g.key_tiles};
    const bool product = k == kScores || k == kProbsV || k == kProbsT;
    std::vector<void*> a(args);
    // probs_t's CTAs take a key/value head each, summing over its query heads
    const std::int64_t x = batch * (k == kProbsT ? heads / options.kv_group : heads);
    BSJIT_CU(runtime::driver().cuLaunchKernel(
        c.kernels[k]->function, static_cast<unsigned>(x), static_cast<unsigned>(ys[k]), 1,
        product ? static_cast<unsigned>(g.threads) : 128u, 1, 1, static_cast<unsigned>(kernel(k).second),
        reinterpret_cast<CUstream>(stream), a.data(), nullptr));
  }

  // Compacts the element masks: the blocks that mask some pair get a slot of block² bits.
  void set_element_masks(ElementMasks em) {
    if (em.callback && !em.bits.empty())
      throw Error("bsjit: attention ops: element masks given both as a callback and as bits; give one");
    const std::int64_t bb = static_cast<std::int64_t>(options.block) * options.block, words = bb / 32;
    if (!em.bits.empty() && static_cast<std::int64_t>(em.bits.size()) != g.mask_blocks * words)
      throw Error(fmt::format("bsjit: attention ops: element mask bits hold {} words; {} blocks of {}² pairs need {}",
                              em.bits.size(), g.mask_blocks, options.block, g.mask_blocks * words));
    if (!em.callback && em.bits.empty()) return;
    slots.assign(g.mask_blocks, -1);
    std::vector<std::uint8_t> keep(bb);
    std::vector<std::uint32_t> block_bits(words);
    std::int64_t pos = 0;
    for (std::size_t m = 0; m < masks.size(); ++m)
      for (const auto& [r, c] : masks[m].coords()) {
        if (em.callback) {
          std::fill(keep.begin(), keep.end(), std::uint8_t{1});
          em.callback(static_cast<std::int64_t>(m), r, c, keep.data());
          std::fill(block_bits.begin(), block_bits.end(), 0u);
          for (std::int64_t i = 0; i < bb; ++i)
            if (keep[i]) block_bits[i / 32] |= 1u << (i % 32);
        } else {
          std::copy_n(em.bits.begin() + pos * words, words, block_bits.begin());
        }
        if (std::any_of(block_bits.begin(), block_bits.end(), [](std::uint32_t w) { return w != ~0u; })) {
          slots[pos] = static_cast<int>(bits.size() / words);
          bits.insert(bits.end(), block_bits.begin(), block_bits.end());
        }
        ++pos;
      }
  }
};

AttentionOps::AttentionOps(std::vector<Layout> masks, AttentionOptions options, ElementMasks element_masks)
    : impl_(std::make_unique<Impl>()) {
  impl_->g = generator::generate_attention_ops(masks, options);  // checks masks and options
  if (!options.arch.empty()) runtime::check_arch(options.arch);
  impl_->masks_hash = runtime::masks_hash(masks);
  impl_->masks = std::move(masks);
  impl_->options = std::move(options);
  impl_->set_element_masks(std::move(element_masks));
}

AttentionOps::~AttentionOps() = default;
AttentionOps::AttentionOps(AttentionOps&&) noexcept = default;
AttentionOps& AttentionOps::operator=(AttentionOps&&) noexcept = default;

void AttentionOps::scores(const void* a, const void* b, void* s, std::int64_t batch, std::int64_t heads,
                          Stream stream) const {
  runtime::check_attention_call("attention ops scores", {{"a", a}, {"b", b}, {"s", s}}, batch, heads, impl_->masks,
                                impl_->options, 0);
  int h = static_cast<int>(heads);
  impl_->launch(kScores, batch, heads, stream, {&a, &b, &s, &h});
}

void AttentionOps::softmax(const void* s, void* p, std::int64_t batch, std::int64_t heads, Stream stream, float scale,
                           const std::uint8_t* key_padding) const {
  const float sc = runtime::check_attention_call("attention ops softmax", {{"s", s}, {"p", p}}, batch, heads,
                                                 impl_->masks, impl_->options, scale);
  float scale_log2 = sc * 1.4426950408889634f;
  int h = static_cast<int>(heads);
  const unsigned char* padding = key_padding;
  // the element masks' device copy, set by launch's context() before the arguments are read
  const int* slot = nullptr;
  const std::uint32_t* bits = nullptr;
  if (!impl_->slots.empty()) {
    auto& c = impl_->context(runtime::current_context(), kSoftmax);
    slot = static_cast<const int*>(c.masks->get());
    bits = reinterpret_cast<const std::uint32_t*>(slot + impl_->slots.size());
  }
  impl_->launch(kSoftmax, batch, heads, stream, {&s, &p, &padding, &slot, &bits, &h, &scale_log2});
}

void AttentionOps::softmax_grad(const void* p, const void* dp, void* ds, std::int64_t batch, std::int64_t heads,
                                Stream stream, float scale) const {
  float sc = runtime::check_attention_call("attention ops softmax_grad", {{"p", p}, {"dp", dp}, {"ds", ds}}, batch,
                                           heads, impl_->masks, impl_->options, scale);
  int h = static_cast<int>(heads);
  impl_->launch(kSoftmaxGrad, batch, heads, stream, {&p, &dp, &ds, &h, &sc});
}

void AttentionOps::probs_v(const void* p, const void* v, void* out, std::int64_t batch, std::int64_t heads,
                           Stream stream) const {
  runtime::check_attention_call("attention ops probs_v", {{"p", p}, {"v", v}, {"out", out}}, batch, heads, impl_->masks,
                                impl_->options, 0);
  int h = static_cast<int>(heads);
  impl_->launch(kProbsV, batch, heads, stream, {&p, &v, &out, &h});
}

void AttentionOps::probs_t(const void* p, const void* x, void* out, std::int64_t batch, std::int64_t heads,
                           Stream stream) const {
  runtime::check_attention_call("attention ops probs_t", {{"p", p}, {"x", x}, {"out", out}}, batch, heads, impl_->masks,
                                impl_->options, 0);
  int h = static_cast<int>(heads);
  impl_->launch(kProbsT, batch, heads, stream, {&p, &x, &out, &h});
}

std::int64_t AttentionOps::sparse_elements(std::int64_t heads) const {
  const std::int64_t bb = static_cast<std::int64_t>(impl_->options.block) * impl_->options.block;
  return (impl_->masks.size() == 1 ? heads * impl_->g.mask_blocks : impl_->g.mask_blocks) * bb;
}

int AttentionOps::precompile(const std::string& arch) const {
  runtime::check_arch(arch);
  // the five compiles side by side (NVRTC runs in the calling thread)
  std::vector<std::future<bool>> pending;
  for (int k = 0; k < kKernels; ++k)
    pending.push_back(std::async(std::launch::async, [this, k, &arch] {
      bool now = false;
      cache::KernelCache::global().get(impl_->request(static_cast<Kernel>(k), arch), cache::OnMiss::compile, &now);
      return now;
    }));
  int compiled = 0;
  for (auto& p : pending) p.wait();  // every thread done before the first error propagates
  for (auto& p : pending) compiled += p.get();
  return compiled;
}

void AttentionOps::load(bool strict) const {
  const runtime::Context ctx = runtime::current_context();
  for (int k = 0; k < kKernels; ++k)
    impl_->context(ctx, static_cast<Kernel>(k),
                   strict ? cache::OnMiss::fail : cache::KernelCache::global().run_time_on_miss());
}

std::int64_t AttentionOps::seq_q() const { return impl_->masks[0].rows() * impl_->options.block; }
std::int64_t AttentionOps::seq_k() const { return impl_->masks[0].cols() * impl_->options.block; }
const AttentionOptions& AttentionOps::options() const { return impl_->options; }

}  // namespace bsjit
