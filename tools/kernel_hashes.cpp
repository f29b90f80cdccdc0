#include "kernel_hashes.hpp"

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>

#include "bsjit/attention.hpp"
#include "bsjit/conv_layout.hpp"
#include "bsjit/layout.hpp"
#include "conv_reference.hpp"
#include "generator/attention_generator.hpp"
#include "generator/conv_generator.hpp"
#include "generator/matmul_generator.hpp"
#include "runtime/compiler.hpp"
#include "runtime/parallel.hpp"

namespace bsjit::tools {
namespace {

struct Variant {
  std::string what, arch, source, name_expression;
};

// A fixed random layout (seeded): rows × cols blocks, each present with probability 1 / 3.
Layout fixed_layout(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> m(rows * cols);
  for (auto& v : m) v = rng() % 3 == 0;
  return Layout::from_dense(rows, cols, m);
}

void add_matmul(std::vector<Variant>& out, const std::string& layout_name, const Layout& layout,
                const std::string& arch) {
  const bool hopper = generator::has_wgmma(arch);
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {8, 16, 32, 64, 128})
      for (DType dtype : {DType::f32, DType::f16, DType::bf16})
        for (FeatureAxis axis : {FeatureAxis::last, FeatureAxis::first})
          for (bool tf32 : {false, true}) {
            if (tf32 && (dtype != DType::f32 || b < 16 || axis != FeatureAxis::last)) continue;
            generator::MatMulSpec base{op, b, dtype, axis};
            base.tf32 = tf32;
            base.wgmma = hopper && !tf32;
            std::vector<generator::MatMulSpec> specs;
            try {
              for (const auto& v : generator::variants(base)) specs.push_back(v);  // the defaults, small batch
              if (dtype != DType::f32 && axis == FeatureAxis::last && b >= 16)     // (the tensor-core shapes)
                for (const auto& t : generator::tile_candidates(base)) {
                  generator::MatMulSpec s = base;
                  s.tiles = t;
                  specs.push_back(s);
                }
            } catch (const std::exception&) {
              continue;  // not a combination the library takes
            }
            for (auto s : specs)
              for (bool plain : {false, true}) {
                s.plain = plain;
                try {
                  const auto g = generator::generate_matmul(layout, s);
                  out.push_back({fmt::format("matmul {} {}{}", layout_name, g.label, s.small_batch ? " small" : ""),
                                 arch, g.source, g.name_expression});
                } catch (const std::exception& e) {
                  out.push_back(
                      {fmt::format("matmul {} {}-{}-b{}-{}{}{}{}", layout_name, to_string(op), to_string(dtype), b,
                                   to_string(axis), s.tiles ? "-" + generator::tiles_tag(*s.tiles) : std::string(),
                                   s.small_batch ? " small" : "", plain ? " plain" : ""),
                       arch, "", std::string("ERROR: ") + e.what()});
                }
              }
          }
}

// Every block, head dim, dtype, order and causal with one key/value head per query head; grouped
// queries (2 per key/value head, whose backward has a fourth kernel) at bf16 without causal.
void add_attention(std::vector<Variant>& out, const std::string& arch) {
  for (int block : {16, 32, 64, 128})
    for (int d : {32, 64, 128})
      for (DType dtype : {DType::f16, DType::bf16})
        for (QkvOrder order : {QkvOrder::bshd, QkvOrder::bhsd})
          for (bool causal : {false, true})
            for (int group : {1, 2}) {
              if (group > 1 && (dtype != DType::bf16 || causal)) continue;
              const AttentionOptions o{block, d, dtype, order, causal, arch, group};
              const std::vector<Layout> masks{fixed_layout(6, 6, 7)};
              const std::string what =
                  fmt::format("attention b{} d{} {} {} {}{}", block, d, to_string(dtype), to_string(order),
                              causal ? "causal" : "full", group > 1 ? fmt::format(" group{}", group) : "");
              try {
                const auto f = generator::generate_attention_forward(masks, o, arch);
                out.push_back({what + " forward", arch, f.source, f.name_expression});
                const auto b = generator::generate_attention_backward(masks, o, arch);
                for (const auto& [kind, name] :
                     {std::pair{"prep", b.prep}, {"main", b.main}, {"dq", b.dq}, {"dkv", b.dkv}})
                  if (!name.empty()) out.push_back({what + " backward " + kind, arch, b.source, name});
                if (arch != "sm_90a") {  // the decomposed ops: one source whatever the target
                  const auto p = generator::generate_attention_ops(masks, o);
                  for (const auto& [kind, name] : {std::pair{"scores", p.scores},
                                                   {"softmax", p.softmax},
                                                   {"softmax_grad", p.softmax_grad},
                                                   {"probs_v", p.probs_v},
                                                   {"probs_t", p.probs_t}})
                    out.push_back({what + " ops " + kind, arch, p.source, name});
                }
              } catch (const std::exception& e) {
                out.push_back({what, arch, "", std::string("ERROR: ") + e.what()});
              }
            }
}

// The convolution's kernels: one source per dtype and activation order serves every layout and
// geometry, so one layout (blocksparse's overlapping one) and one geometry each; the 1×1 matmul
// path's gathers; the edge bias; the tensor-core kernels, one source per dtype and block size.
void add_conv(std::vector<Variant>& out, const std::string& arch) {
  const ConvLayout layout = reference::blocksparse_overlapping_layout();
  const ConvGeometry geometry = ConvGeometry::same({2, 5, 6}, {3, 3, 3}, {1, 2, 1});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (bool last : {false, true}) {
      const std::string what = fmt::format("conv {} {}", to_string(dtype), last ? "ndhwc" : "ncdhw");
      const auto g = generator::generate_conv(layout, geometry.taps(), dtype, last);
      for (const auto& [kind, name] : {std::pair{"fprop", g.fprop},
                                       {"bprop", g.bprop},
                                       {"updat", g.updat},
                                       {"l2_normalize", g.l2_normalize},
                                       {"l2_normalize_grad", g.l2_normalize_grad},
                                       {"gather", g.gather},
                                       {"gather_gate", g.gather_gate}})
        out.push_back({what + " " + kind, arch, g.source, name});
      const auto e = generator::generate_conv_edge_bias(geometry, false, dtype, last);
      for (const auto& [kind, name] : {std::pair{"forward", e.forward}, {"grad", e.grad}, {"sums", e.sums}})
        out.push_back({what + " edge_bias " + kind, arch, e.source, name});
    }
  // the tensor-core kernels: one source per dtype and block size
  const Layout mask = Layout::from_coords(2, 3, {{0, 0}, {1, 1}, {0, 2}});
  for (DType dtype : {DType::f16, DType::bf16})
    for (int b : {16, 32, 64, 128}) {
      const auto g = generator::generate_conv_igemm(ConvLayout::from_mask(mask, b), dtype, true);
      const std::string what = fmt::format("conv {} ndhwc igemm b{}", to_string(dtype), b);
      for (const auto& [kind, name] : {std::pair{"fprop", g->fprop},
                                       {"bprop", g->bprop},
                                       {"updat", g->updat},
                                       {"updat_store", g->updat_store},
                                       {"pack", g->pack}})
        out.push_back({what + " " + kind, arch, g->source, name});
      if (g->hopper && arch == "sm_90a")
        for (const auto& [kind, name] :
             {std::pair{"fprop", g->hopper->fprop}, {"bprop", g->hopper->bprop}, {"updat", g->hopper->updat}})
          out.push_back({what + " wgmma " + kind, arch, g->source, name});
    }
}

}  // namespace

std::vector<std::string> kernel_hashes(const std::vector<std::string>& archs, unsigned threads,
                                       const std::string& only) {
  // one layout whose backward-weight units leave a short last wave (split), one that fills whole
  // waves of one-block units at b = 64 (264 blocks: two per SM on 132)
  const Layout splits = fixed_layout(12, 12, 1);
  std::vector<std::uint8_t> full(24 * 11, 1);
  const Layout whole = Layout::from_dense(24, 11, full);
  std::vector<Variant> variants;
  for (const auto& arch : archs) {
    runtime::check_arch(arch);
    add_matmul(variants, "split", splits, arch);
    add_matmul(variants, "whole", whole, arch);
    add_attention(variants, arch);
    add_conv(variants, arch);
  }
  if (!only.empty()) std::erase_if(variants, [&](const Variant& v) { return v.what.find(only) == std::string::npos; });
  // one compile per distinct (source, entry point, arch)
  std::map<std::tuple<std::string, std::string, std::string>, std::string> hashes;
  for (const auto& v : variants)
    if (!v.source.empty()) hashes.emplace(std::tuple{v.source, v.name_expression, v.arch}, "");
  std::vector<decltype(hashes)::iterator> todo;
  for (auto it = hashes.begin(); it != hashes.end(); ++it) todo.push_back(it);
  runtime::parallel_for(todo.size(), threads, [&](std::size_t i) {
    const auto& [source, name, arch] = todo[i]->first;
    std::string result;
    try {
      const auto k = runtime::compile(source, name, "kernel-hashes", arch);
      result = fmt::format("{:016x}", XXH3_64bits(k.cubin.data(), k.cubin.size()));
    } catch (const std::exception& e) {
      result = std::string("ERROR: ") + e.what();
      std::replace(result.begin(), result.end(), '\n', ' ');
    }
    todo[i]->second = result;  // (each element written by one thread)
  });
  std::vector<std::string> lines;
  for (const auto& v : variants)
    lines.push_back(
        fmt::format("{} {} {}", v.what, v.arch,
                    v.source.empty() ? v.name_expression : hashes.at({v.source, v.name_expression, v.arch})));
  std::sort(lines.begin(), lines.end());
  lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
  return lines;
}

}  // namespace bsjit::tools
