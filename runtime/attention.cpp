// bsjit::Attention: the fused forward kernel generated for the masks, compiled through the kernel
// cache (key over the source and arch, like every kernel), loaded once per context.
#include "bsjit/attention.hpp"

#include <fmt/format.h>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <future>
#include <initializer_list>
#include <map>
#include <mutex>

#include "attention_common.hpp"
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
  std::string masks_hash;
  std::mutex mutex;
  std::map<std::string, generator::GeneratedAttention> generated;  // per arch
  // the forward kernel per context, and the source it came from
  std::map<runtime::Context, std::pair<runtime::SharedKernels::Handle, const generator::GeneratedAttention*>> functions;

  const generator::GeneratedAttention& generated_for(const std::string& arch) {
    std::lock_guard lock(mutex);
    auto it = generated.find(arch);
    if (it == generated.end()) it = generated.emplace(arch, generator::generate_attention_forward(masks, options, arch)).first;
    return it->second;  // std::map: stays where it is
  }

  cache::Request forward_request(const std::string& arch) {
    runtime::check_arch(arch);
    const generator::GeneratedAttention& g = generated_for(arch);
    return runtime::named_kernel_request(g.source, g.tables, g.name_expression, g.label, g.shared_bytes, arch,
                                         masks_hash);
  }
  cache::KernelCache::Compiled compiled(const std::string& arch, cache::OnMiss on_miss, bool* now = nullptr) {
    return cache::KernelCache::global().get(forward_request(arch), on_miss, now);
  }

  // The backward: one source, three kernels (four with a key/value group;
  // generator::GeneratedAttentionBackward), compiled and cached apart; a workspace per context (dQ
  // accumulator and Delta, and the dK and dV accumulators of a group, in floats).
  std::map<std::string, generator::GeneratedAttentionBackward> backward_sources;  // per arch
  struct Backward {
    const generator::GeneratedAttentionBackward* g = nullptr;
    std::array<runtime::SharedKernels::Handle, 4> kernels;  // prep, dq, main, dkv (kv_group > 1)
    CUfunction prep() const { return kernels[0]->function; }
    CUfunction dq() const { return kernels[1]->function; }
    CUfunction main() const { return kernels[2]->function; }
    CUfunction dkv() const { return kernels[3]->function; }
    std::unique_ptr<runtime::DeviceMemory> workspace;
  };
  std::map<runtime::Context, Backward> backwards;
  std::map<runtime::Context, int> l2_bytes;  // each context's device's L2 size, read once

  // (batch, head) pairs per band of the fused kernels' one-dimensional grid of pairs · tiles CTAs
  // (kernels::BandedTile): the forward streams K and V (shared by a key/value group), the backward
  // Q and dO; the lines that a wave of kernel f's CTAs reads of them from the launch order's
  // footprint.
  int band(const runtime::Context& ctx, std::int64_t pairs, std::int64_t tiles, bool backward, int block,
           const generator::TileFootprint& footprint, CUfunction f, int threads, int shared_bytes) {
    if (pairs * tiles > INT_MAX)
      throw Error(fmt::format("bsjit: attention: batch · heads = {} with {} tiles a head is past the grid's {} CTAs",
                              pairs, tiles, INT_MAX));
    int l2 = 0;
    {
      std::lock_guard lock(mutex);
      auto it = l2_bytes.find(ctx);
      if (it == l2_bytes.end()) it = l2_bytes.emplace(ctx, runtime::context_l2_bytes(ctx)).first;
      l2 = it->second;
    }
    const std::int64_t row_bytes = 2 * options.head_dim * 2;  // K and V, or Q and dO: 16-bit
    const std::int64_t line_bytes = row_bytes * block / (backward ? 1 : options.kv_group);  // the kernel's block
    const std::int64_t wave = runtime::resident_ctas(
        f, ctx, {1, 1, static_cast<std::uint32_t>(threads), static_cast<std::uint32_t>(shared_bytes)});
    return runtime::head_band(pairs, line_bytes, footprint, wave, l2, options.kv_group);
  }
  std::int64_t seq_q() const { return masks[0].rows() * options.block; }
  std::int64_t seq_k() const { return masks[0].cols() * options.block; }

  const generator::GeneratedAttentionBackward& backward_source(const std::string& arch) {  // mutex held
    auto it = backward_sources.find(arch);
    if (it == backward_sources.end())
      it = backward_sources.emplace(arch, generator::generate_attention_backward(masks, options, arch)).first;
    return it->second;
  }

  // The backward's kernels: prep, dq, main, and dkv with a key/value group.
  static int backward_count(const generator::GeneratedAttentionBackward& g) { return g.dkv.empty() ? 3 : 4; }

  // The cache request of the backward's kernel i: prep, dq, main, dkv.
  cache::Request backward_request(const generator::GeneratedAttentionBackward& g, const std::string& arch,
                                  int i) const {
    if (i == 0)
      return runtime::named_kernel_request(g.source, g.tables, g.prep, g.label + "-prep", 0, arch, masks_hash);
    if (i == 1) return runtime::named_kernel_request(g.source, g.tables, g.dq, g.label + "-dq", 0, arch, masks_hash);
    if (i == 3) return runtime::named_kernel_request(g.source, g.tables, g.dkv, g.label + "-dkv", 0, arch, masks_hash);
    return runtime::named_kernel_request(g.source, g.tables, g.main, g.label, g.shared_bytes, arch, masks_hash);
  }

  // The backward's kernels for arch in the cache; *now: any compiled in this call.
  void backward_kernels(const generator::GeneratedAttentionBackward& g, const std::string& arch, cache::OnMiss on_miss,
                        bool* now = nullptr) {
    // the main kernel (most of the compile time) on another thread while the others compile here
    bool compiled[4] = {};
    auto get = [&](int i) { cache::KernelCache::global().get(backward_request(g, arch, i), on_miss, &compiled[i]); };
    auto main = std::async(std::launch::async, get, 2);
    try {
      for (int i : {0, 1, 3})
        if (i < backward_count(g)) get(i);
    } catch (...) {
      main.wait();  // it writes compiled[2], on this frame
      throw;
    }
    main.get();
    if (now) *now = compiled[0] || compiled[1] || compiled[2] || compiled[3];
  }

  Backward& backward(const runtime::Context& ctx, std::size_t workspace_bytes, cache::OnMiss on_miss) {
    std::lock_guard lock(mutex);
    auto& bw = backwards[ctx];
    if (!bw.kernels[2]) {
      const std::string arch = runtime::kernel_arch(options.arch, ctx);
      bw.g = &backward_source(arch);
      backward_kernels(*bw.g, arch, on_miss);  // compiled side by side; each loaded from memory below
      for (int i = 0; i < backward_count(*bw.g); ++i)
        bw.kernels[i] = runtime::load_cached(backward_request(*bw.g, arch, i), ctx, on_miss);
    }
    if (workspace_bytes > 0 && (!bw.workspace || bw.workspace->bytes < workspace_bytes))
      bw.workspace = std::make_unique<runtime::DeviceMemory>(workspace_bytes);
    return bw;
  }

  // Floats of the dK and dV accumulators a key/value group adds to (after the dQ accumulator and
  // Delta in the backward's workspace; kernels::KeyGradientRows): none without a group.
  std::size_t key_accumulator_floats(std::int64_t batch, std::int64_t heads, std::int64_t seq_k) const {
    if (options.kv_group == 1) return 0;
    return static_cast<std::size_t>(2 * batch * (heads / options.kv_group) * seq_k * options.head_dim);
  }

  // A 3-D TMA map of a Q- or K-shaped tensor (`heads` of its own: K's are heads / kv_group),
  // innermost first: (d, heads, batch · seq) for [batch, seq, heads, d]; (d, seq, batch · heads) for
  // [batch, heads, seq, d]; boxes of 64 head-dim columns × `rows` positions.
  CUtensorMap tensor_map(const void* base, std::int64_t batch, std::int64_t heads, std::int64_t seq, int rows) const {
    const auto U = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
    const std::int64_t d = options.head_dim;
    const auto r = static_cast<std::uint32_t>(rows);
    if (options.order == QkvOrder::bhsd)
      return runtime::swizzled_tensor_map(options.dtype, base, {U(d), U(seq), U(batch * heads)},
                                          {U(d * 2), U(seq * d * 2)}, {64, r, 1});
    return runtime::swizzled_tensor_map(options.dtype, base, {U(d), U(heads), U(batch * seq)},
                                        {U(d * 2), U(heads * d * 2)}, {64, 1, r});
  }

  std::pair<CUfunction, const generator::GeneratedAttention*> function(const runtime::Context& ctx,
                                                                       cache::OnMiss on_miss) {
    {
      std::lock_guard lock(mutex);
      auto it = functions.find(ctx);
      if (it != functions.end()) return {it->second.first->function, it->second.second};
    }
    const std::string arch = runtime::kernel_arch(options.arch, ctx);
    auto kernel = runtime::load_cached(forward_request(arch), ctx, on_miss);
    const generator::GeneratedAttention* g = &generated_for(arch);
    std::lock_guard lock(mutex);
    const auto& f = functions[ctx] = {std::move(kernel), g};
    return {f.first->function, g};
  }
};

Attention::Attention(std::vector<Layout> masks, AttentionOptions options) : impl_(std::make_unique<Impl>()) {
  // generated once here for the options' checks and the sequence lengths; per arch when used
  const auto g = generator::generate_attention_forward(masks, options, options.arch);
  impl_->generated.emplace(options.arch, g);
  impl_->masks_hash = runtime::masks_hash(masks);
  impl_->masks = std::move(masks);
  impl_->options = std::move(options);
  if (!impl_->options.arch.empty()) runtime::check_arch(impl_->options.arch);
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

void Attention::forward(const void* q, const void* k, const void* v, void* out, float* lse, std::int64_t batch,
                        std::int64_t heads, Stream stream, float scale, const std::uint8_t* key_padding) const {
  if (lse == nullptr) throw Error("bsjit: attention: lse is a null pointer");
  const float s = runtime::check_attention_call("attention", {{"q", q}, {"k", k}, {"v", v}, {"out", out}}, batch,
                                                heads, impl_->masks, impl_->options, scale);
  float scale_log2 = s * 1.4426950408889634f;  // scores in the log2 domain: exp2 in the kernel
  int heads_arg = static_cast<int>(heads);
  const std::int64_t kv_heads = heads / impl_->options.kv_group;  // K's and V's
  const runtime::Context ctx = runtime::current_context();
  const auto [f, g] = impl_->function(ctx, cache::KernelCache::global().run_time_on_miss());
  const unsigned char* padding = key_padding;
  // one-dimensional: batch · heads · query tiles CTAs in bands of heads (kernels::BandedTile)
  const auto grid = static_cast<unsigned>(batch * heads * g->query_tiles);
  int band = impl_->band(ctx, batch * heads, g->query_tiles, false, g->block, g->footprint, f, g->threads, g->shared_bytes);
  const CUstream cu_stream = reinterpret_cast<CUstream>(stream);
  if (!g->tma) {
    void* args[] = {&q, &k, &v, &out, &lse, &padding, &heads_arg, &band, &scale_log2};
    BSJIT_CU(runtime::driver().cuLaunchKernel(f, grid, 1, 1, static_cast<unsigned>(g->threads), 1, 1,
                                              static_cast<unsigned>(g->shared_bytes), cu_stream, args, nullptr));
    return;
  }
  CUtensorMap mq = impl_->tensor_map(q, batch, heads, seq_q(), g->q_rows),
              mk = impl_->tensor_map(k, batch, kv_heads, seq_k(), g->kv_rows),
              mv = impl_->tensor_map(v, batch, kv_heads, seq_k(), g->kv_rows);
  void* args[] = {&out, &lse, &padding, &heads_arg, &band, &scale_log2, &mq, &mk, &mv};
  BSJIT_CU(runtime::driver().cuLaunchKernel(f, grid, 1, 1, static_cast<unsigned>(g->threads), 1, 1,
                                            static_cast<unsigned>(g->shared_bytes), cu_stream, args, nullptr));
}

void Attention::backward(const void* q, const void* k, const void* v, const void* out, const float* lse,
                         const void* dout, void* dq, void* dk, void* dv, std::int64_t batch, std::int64_t heads,
                         Stream stream, float scale, const std::uint8_t* key_padding, void* workspace,
                         std::size_t workspace_bytes) const {
  float s = runtime::check_attention_call("attention backward",
                                          {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"dout", dout},
                                           {"dq", dq}, {"dk", dk}, {"dv", dv}},
                                          batch, heads, impl_->masks, impl_->options, scale);
  const std::int64_t d = impl_->options.head_dim;
  float scale_log2 = s * 1.4426950408889634f;
  int heads_arg = static_cast<int>(heads);
  const std::int64_t kv_heads = heads / impl_->options.kv_group;  // K's and V's
  const runtime::Context ctx = runtime::current_context();
  const std::size_t rows = static_cast<std::size_t>(batch * heads * seq_q());
  const std::size_t need = backward_workspace_size(batch, heads);
  if (workspace != nullptr && (workspace_bytes < need || reinterpret_cast<std::uintptr_t>(workspace) % 16 != 0))
    throw Error(
        fmt::format("bsjit: attention backward: the workspace given ({} bytes at {}) must hold {} bytes and be "
                    "16-byte aligned (Attention::backward_workspace_size)",
                    workspace_bytes, workspace, need));
  auto& bw = impl_->backward(ctx, workspace ? 0 : need, cache::KernelCache::global().run_time_on_miss());
  const auto& g = *bw.g;
  float* dq_acc = static_cast<float*>(workspace ? workspace : bw.workspace->get());
  float* delta = dq_acc + rows * d;
  const unsigned char* padding = key_padding;
  const auto bh = static_cast<unsigned>(batch * heads);
  const CUstream cu = reinterpret_cast<CUstream>(stream);
  const runtime::Driver& drv = runtime::driver();
  void* prep_args[] = {&out, &dout, &delta, &dq_acc, &heads_arg};
  BSJIT_CU(drv.cuLaunchKernel(bw.prep(), bh, static_cast<unsigned>(g.query_rows16), 1, 128, 1, 1, 0, cu, prep_args,
                              nullptr));
  // a key/value group: the dK and dV accumulators after Delta (kernels::KeyGradientRows)
  float* key_acc = delta + rows;
  if (!g.dkv.empty())
    BSJIT_CU(drv.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(key_acc), 0,
                                  impl_->key_accumulator_floats(batch, heads, seq_k()), cu));
  // the main kernel: batch · heads · key tiles CTAs in bands of heads (kernels::BandedTile)
  const auto main_grid = static_cast<unsigned>(batch * heads * g.key_tiles), threads = static_cast<unsigned>(g.threads),
             shared = static_cast<unsigned>(g.shared_bytes);
  int band = impl_->band(ctx, batch * heads, g.key_tiles, true, g.block, g.footprint, bw.main(), g.threads, g.shared_bytes);
  if (g.tma) {
    CUtensorMap mq = impl_->tensor_map(q, batch, heads, seq_q(), g.q_rows),
                mk = impl_->tensor_map(k, batch, kv_heads, seq_k(), g.kv_rows),
                mv = impl_->tensor_map(v, batch, kv_heads, seq_k(), g.kv_rows),
                mo = impl_->tensor_map(dout, batch, heads, seq_q(), g.q_rows);
    void* main_args[] = {&lse,  &delta,      &padding, &dq_acc, &dk, &dv, &heads_arg,
                         &band, &scale_log2, &s,       &mq,     &mk, &mv, &mo};
    BSJIT_CU(drv.cuLaunchKernel(bw.main(), main_grid, 1, 1, threads, 1, 1, shared, cu, main_args, nullptr));
  } else {
    void* main_args[] = {&q,      &k,  &v,  &dout,      &lse,  &delta,      &padding,
                         &dq_acc, &dk, &dv, &heads_arg, &band, &scale_log2, &s};
    BSJIT_CU(drv.cuLaunchKernel(bw.main(), main_grid, 1, 1, threads, 1, 1, shared, cu, main_args, nullptr));
  }
  void* dq_args[] = {&dq_acc, &dq, &heads_arg, &s};
  BSJIT_CU(drv.cuLaunchKernel(bw.dq(), bh, static_cast<unsigned>(g.query_rows16), 1, 128, 1, 1, 0, cu, dq_args, nullptr));
  if (!g.dkv.empty()) {
    int kv_heads_arg = static_cast<int>(kv_heads);
    void* dkv_args[] = {&key_acc, &dk, &dv, &kv_heads_arg};
    BSJIT_CU(drv.cuLaunchKernel(bw.dkv(), static_cast<unsigned>(batch * kv_heads), static_cast<unsigned>(g.key_rows16),
                                1, 128, 1, 1, 0, cu, dkv_args, nullptr));
  }
}

std::size_t Attention::backward_workspace_size(std::int64_t batch, std::int64_t heads) const {
  const auto dq_and_delta = static_cast<std::size_t>(batch * heads * seq_q() * (impl_->options.head_dim + 1));
  return (dq_and_delta + impl_->key_accumulator_floats(batch, heads, seq_k())) * sizeof(float);
}

bool Attention::precompile(const std::string& arch) const {
  bool forward_now = false, backward_now = false;
  runtime::check_arch(arch);
  const generator::GeneratedAttentionBackward* g;
  {
    std::lock_guard lock(impl_->mutex);
    g = &impl_->backward_source(arch);  // std::map: stays where it is
  }
  // the forward on another thread while the backward's kernels compile
  auto forward = std::async(std::launch::async, [&] { impl_->compiled(arch, cache::OnMiss::compile, &forward_now); });
  try {
    impl_->backward_kernels(*g, arch, cache::OnMiss::compile, &backward_now);
  } catch (...) {
    forward.wait();
    throw;
  }
  forward.get();
  return forward_now || backward_now;
}

void Attention::load(bool strict) const {
  const runtime::Context ctx = runtime::current_context();
  const auto on_miss = strict ? cache::OnMiss::fail : cache::KernelCache::global().run_time_on_miss();
  impl_->function(ctx, on_miss);
  impl_->backward(ctx, 0, on_miss);
}

std::int64_t Attention::seq_q() const { return impl_->seq_q(); }
std::int64_t Attention::seq_k() const { return impl_->seq_k(); }
const AttentionOptions& Attention::options() const { return impl_->options; }

}  // namespace bsjit
