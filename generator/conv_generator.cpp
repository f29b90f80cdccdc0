#include "conv_generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <utility>
#include <vector>

#include "bsjit/error.hpp"

namespace bsjit::generator {
namespace {

const char* type_name(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "bsjit::kernels::half_t";
    case DType::bf16:
      return "bsjit::kernels::bfloat16_t";
    case DType::f32:
      break;
  }
  return "float";
}

// Per channel of one side (input or output), the (block, index in the block's list) pairs of the
// blocks that hold it: starts[ch] .. starts[ch + 1] into entries, two ints an entry.
std::pair<std::vector<int>, std::vector<int>> channel_entries(const ConvLayout& layout, bool output) {
  const std::int64_t channels = output ? layout.K() : layout.C();
  std::vector<std::vector<std::pair<int, int>>> per(channels);
  const auto& blocks = layout.blocks();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& list = output ? blocks[i].k : blocks[i].c;
    for (std::size_t j = 0; j < list.size(); ++j) per[list[j]].push_back({static_cast<int>(i), static_cast<int>(j)});
  }
  std::vector<int> starts{0}, entries;
  for (const auto& line : per) {
    for (auto [block, index] : line) {
      entries.push_back(block);
      entries.push_back(index);
    }
    starts.push_back(static_cast<int>(entries.size() / 2));
  }
  return {std::move(starts), std::move(entries)};
}

}  // namespace

GeneratedConv generate_conv(const ConvLayout& layout, std::int64_t taps, DType dtype, bool channels_last, bool deconv) {
  const auto& blocks = layout.blocks();
  if (blocks.size() > 65535)
    throw Error(fmt::format("bsjit: conv: {} blocks; the kernels take at most 65535", blocks.size()));
  if (taps <= 0 || layout.filter_elements(taps) > INT_MAX)
    throw Error(fmt::format("bsjit: conv: the layout's filter holds {} elements at {} taps; at most {}",
                            layout.filter_elements(taps), taps, INT_MAX));
  GeneratedConv g;
  g.threads = 256;  // kConvThreads
  std::vector<int> block_table, channels;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    block_table.push_back(static_cast<int>(channels.size()));
    block_table.push_back(static_cast<int>(b.c.size()));
    channels.insert(channels.end(), b.c.begin(), b.c.end());
    block_table.push_back(static_cast<int>(channels.size()));
    block_table.push_back(static_cast<int>(b.k.size()));
    channels.insert(channels.end(), b.k.begin(), b.k.end());
    block_table.push_back(static_cast<int>(layout.filter_offset(i, taps)));
    g.largest_block = std::max<std::int64_t>(
        g.largest_block, static_cast<std::int64_t>(b.c.size()) * static_cast<std::int64_t>(b.k.size()) * taps);
  }
  // l2_normalize's rows: a block's output channels (a deconvolution's: its input channels)
  std::vector<int> rows;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const int cb = static_cast<int>(blocks[i].c.size()), kb = static_cast<int>(blocks[i].k.size()),
              t = static_cast<int>(taps), offset = static_cast<int>(layout.filter_offset(i, taps));
    for (int r = 0; r < (deconv ? cb : kb); ++r) {
      const std::array<int, 4> row = deconv ? std::array<int, 4>{offset + r * t, cb * t, kb, t}
                                            : std::array<int, 4>{offset + r * cb * t, 0, 1, cb * t};
      rows.insert(rows.end(), row.begin(), row.end());
    }
  }
  g.rows = static_cast<std::int64_t>(rows.size() / 4);
  auto [out_start, out_entries] = channel_entries(layout, true);
  auto [in_start, in_entries] = channel_entries(layout, false);
  constexpr TableStorage kPointer = TableStorage::pointer;
  std::string tables = add_table(g.tables, "kConvBlocks", std::move(block_table), kPointer);
  tables += add_table(g.tables, "kConvChannels", std::move(channels), kPointer);
  tables += add_table(g.tables, "kConvOutStart", std::move(out_start), kPointer);
  tables += add_table(g.tables, "kConvOutEntries", std::move(out_entries), kPointer);
  tables += add_table(g.tables, "kConvInStart", std::move(in_start), kPointer);
  tables += add_table(g.tables, "kConvInEntries", std::move(in_entries), kPointer);
  tables += add_table(g.tables, "kConvRows", std::move(rows), kPointer);

  const char* order = channels_last ? "ndhwc" : "ncdhw";
  g.label = fmt::format("conv-direct-{}-{}", to_string(dtype), order);
  const std::string kernel = "bsjit::kernels::conv_{}_kernel<bsjit_generated::Config>";
  g.fprop = fmt::format(fmt::runtime(kernel), "fprop");
  g.bprop = fmt::format(fmt::runtime(kernel), "bprop");
  g.updat = fmt::format(fmt::runtime(kernel), "updat");
  g.l2_normalize = fmt::format(fmt::runtime(kernel), "l2_normalize");
  g.l2_normalize_grad = fmt::format(fmt::runtime(kernel), "l2_normalize_grad");
  g.gather = "bsjit::kernels::conv_gather_blocks_kernel<bsjit_generated::Config::T>";
  g.gather_gate = "bsjit::kernels::conv_gather_blocks_kernel<float>";
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// any channel layout and geometry (tables and ConvDims)\n"
      "#include \"bsjit/conv_direct.cuh\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr bool kChannelsLast = {last};\n"
      "  __device__ static bsjit::kernels::ConvTables tables() {{\n"
      "    return {{kConvBlocks,  kConvChannels,  kConvOutStart, kConvOutEntries,\n"
      "            kConvInStart, kConvInEntries, kConvRows}};\n"
      "  }}\n"
      "}};\n"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("tables", tables), fmt::arg("type", type_name(dtype)),
      fmt::arg("last", channels_last ? "true" : "false"));
  return g;
}

std::optional<ConvMatmulPlan> conv_matmul_plan(const ConvLayout& layout, const ConvGeometry& geometry,
                                               bool channels_last) {
  if (!channels_last || geometry.taps() != 1) return std::nullopt;
  for (int d = 0; d < 3; ++d)
    if (geometry.stride[d] != 1 || geometry.pad_before[d] != 0 || geometry.pad_after[d] != 0) return std::nullopt;
  const auto& blocks = layout.blocks();
  const int b = static_cast<int>(blocks.front().c.size());
  if ((b != 8 && b != 16 && b != 32 && b != 64 && b != 128) || layout.C() % b || layout.K() % b) return std::nullopt;
  // every block b aligned, consecutive input channels → b aligned, consecutive output channels
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;  // (output block, input block): W' [K/b, C/b]
  std::map<std::pair<std::int64_t, std::int64_t>, int> index;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& c = blocks[i].c;
    const auto& k = blocks[i].k;
    if (static_cast<int>(c.size()) != b || static_cast<int>(k.size()) != b || c[0] % b || k[0] % b) return std::nullopt;
    for (int j = 1; j < b; ++j)
      if (c[j] != c[0] + j || k[j] != k[0] + j) return std::nullopt;
    const std::pair at{k[0] / b, c[0] / b};
    if (!index.emplace(at, static_cast<int>(i)).second) return std::nullopt;  // two blocks at one place: they add
    coords.push_back(at);
  }
  ConvMatmulPlan plan{b, Layout::from_coords(layout.K() / b, layout.C() / b, coords), {}};
  for (const auto& at : plan.layout.coords()) plan.order.push_back(index.at(at));
  return plan;
}

ConvEdges conv_edges(const ConvGeometry& geometry, bool deconv) {
  const auto out = geometry.out();
  const auto& positions = deconv ? geometry.in : out;  // the op's output positions
  // off[d][coordinate · taps_d + t]: tap t of dimension d falls outside the image there
  std::array<std::vector<char>, 3> off;
  for (int d = 0; d < 3; ++d) {
    const std::int64_t taps = geometry.filter[d];
    off[d].assign(positions[d] * taps, 0);
    for (std::int64_t x = 0; x < positions[d]; ++x)
      for (std::int64_t t = 0; t < taps; ++t) {
        bool outside;
        if (deconv) {  // the convolution's output position that reads x through tap t, if any
          const std::int64_t num = x + geometry.pad_before[d] - t * geometry.dilation[d];
          outside = num % geometry.stride[d] == 0 && (num < 0 || num / geometry.stride[d] >= out[d]);
        } else {
          const std::int64_t at = x * geometry.stride[d] - geometry.pad_before[d] + t * geometry.dilation[d];
          outside = at < 0 || at >= geometry.in[d];
        }
        off[d][x * taps + t] = outside;
      }
  }
  ConvEdges e;
  std::map<std::vector<int>, int> groups;
  std::vector<std::vector<int>> members;
  std::vector<int> pattern;
  const auto& f = geometry.filter;
  for (std::int64_t z = 0; z < positions[0]; ++z)
    for (std::int64_t y = 0; y < positions[1]; ++y)
      for (std::int64_t x = 0; x < positions[2]; ++x) {
        pattern.clear();
        for (std::int64_t t = 0; t < f[0]; ++t)
          for (std::int64_t r = 0; r < f[1]; ++r)
            for (std::int64_t s = 0; s < f[2]; ++s)
              if (off[0][z * f[0] + t] || off[1][y * f[1] + r] || off[2][x * f[2] + s])
                pattern.push_back(static_cast<int>((t * f[1] + r) * f[2] + s));
        if (pattern.empty()) {
          e.of.push_back(-1);
          continue;
        }
        const auto [it, fresh] = groups.emplace(pattern, static_cast<int>(members.size()));
        if (fresh) members.emplace_back();
        const int position = static_cast<int>((z * positions[1] + y) * positions[2] + x);
        members[it->second].push_back(position);
        e.of.push_back(it->second);
      }
  e.edges = static_cast<int>(members.size());
  e.start.push_back(0);
  for (const auto& m : members) {
    e.positions.insert(e.positions.end(), m.begin(), m.end());
    e.start.push_back(static_cast<int>(e.positions.size()));
  }
  return e;
}

GeneratedConvEdgeBias generate_conv_edge_bias(const ConvGeometry& geometry, bool deconv, DType dtype,
                                              bool channels_last) {
  GeneratedConvEdgeBias g;
  g.threads = 256;  // kConvThreads
  g.edges = conv_edges(geometry, deconv);
  constexpr TableStorage kPointer = TableStorage::pointer;
  std::string tables = add_table(g.tables, "kEdgeOf", g.edges.of, kPointer);
  tables += add_table(g.tables, "kEdgeStart", g.edges.start, kPointer);
  tables += add_table(g.tables, "kEdgePositions", g.edges.positions.empty() ? std::vector<int>{0} : g.edges.positions,
                      kPointer);
  g.label = fmt::format("conv_edge_bias-{}-{}", to_string(dtype), channels_last ? "ndhwc" : "ncdhw");
  const std::string kernel = "bsjit::kernels::conv_edge_bias{}_kernel<bsjit_generated::Config>";
  g.forward = fmt::format(fmt::runtime(kernel), "");
  g.grad = fmt::format(fmt::runtime(kernel), "_grad");
  g.sums = fmt::format(fmt::runtime(kernel), "_sums");
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// any geometry (tables)\n"
      "#include \"bsjit/conv_direct.cuh\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr bool kChannelsLast = {last};\n"
      "  __device__ static bsjit::kernels::ConvEdgeTables edge_tables() {{\n"
      "    return {{kEdgeOf, kEdgeStart, kEdgePositions}};\n"
      "  }}\n"
      "}};\n"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("tables", tables), fmt::arg("type", type_name(dtype)),
      fmt::arg("last", channels_last ? "true" : "false"));
  return g;
}

kernels::ConvDims conv_dims(const ConvLayout& layout, const ConvGeometry& geometry, std::int64_t n) {
  kernels::ConvDims d{};
  d.n = static_cast<int>(n);
  d.c = static_cast<int>(layout.C());
  d.k = static_cast<int>(layout.K());
  const auto out = geometry.out();
  for (int i = 0; i < 3; ++i) {
    d.in[i] = static_cast<int>(geometry.in[i]);
    d.out[i] = static_cast<int>(out[i]);
    d.filter[i] = static_cast<int>(geometry.filter[i]);
    d.stride[i] = static_cast<int>(geometry.stride[i]);
    d.dilation[i] = static_cast<int>(geometry.dilation[i]);
    d.pad[i] = static_cast<int>(geometry.pad_before[i]);
  }
  return d;
}

}  // namespace bsjit::generator
