#include "attention_generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "bsjit/error.hpp"
#include "device_tables.hpp"

namespace bsjit::generator {
namespace {

void check(const std::vector<Layout>& masks, const AttentionOptions& o) {
  if (masks.empty()) throw Error("bsjit: attention: no block mask given");
  for (const auto& m : masks)
    if (m.rows() != masks[0].rows() || m.cols() != masks[0].cols())
      throw Error(fmt::format("bsjit: attention: block masks of different shapes ([{}, {}] and [{}, {}])", m.rows(),
                              m.cols(), masks[0].rows(), masks[0].cols()));
  if (o.block != 16 && o.block != 32 && o.block != 64 && o.block != 128)
    throw Error(fmt::format("bsjit: attention: block {} is not supported; expected 16, 32, 64 or 128", o.block));
  if (o.head_dim != 32 && o.head_dim != 64 && o.head_dim != 128)
    throw Error(fmt::format("bsjit: attention: head_dim {} is not supported; expected 32, 64 or 128", o.head_dim));
  if (o.dtype == DType::f32) throw Error("bsjit: attention: dtype f32 is not supported; expected f16 or bf16");
  if (o.kv_group < 1 || o.kv_group > 65535)
    throw Error(
        fmt::format("bsjit: attention: kv_group = {} out of 1..65535 (query heads per key/value head)", o.kv_group));
  if (masks.size() > 1 && static_cast<std::int64_t>(masks.size()) % o.kv_group != 0)
    throw Error(fmt::format("bsjit: attention: {} per-head masks are not whole groups of kv_group = {} query heads",
                            masks.size(), o.kv_group));
}

// The label's tail for the options past block and head dim: order, causal, the key/value group.
// (The Configs hold the group as an enumerator: NVRTC emits every static constexpr member of a
// Config as a device global, so a new one would change every kernel's binary, none of its code.)
std::string label_tail(const AttentionOptions& o) {
  return fmt::format("{}{}{}", to_string(o.order), o.causal ? "-causal" : "",
                     o.kv_group > 1 ? fmt::format("-g{}", o.kv_group) : "");
}

// Per mask and block row (transposed: per block column), the column (row) indices, ascending:
// starts has masks · lines + 1 entries, line i of mask m is indices[starts[m · lines + i] ..
// starts[m · lines + i + 1]).
// tags: per mask a value per coords() entry, carried beside its index (Lists::tags).
struct Lists {
  std::vector<int> starts{0}, indices, tags;
};
Lists block_lists(const std::vector<Layout>& masks, bool transposed,
                  const std::vector<std::vector<int>>* tags = nullptr) {
  Lists out;
  for (std::size_t i = 0; i < masks.size(); ++i) {
    const Layout& m = masks[i];
    const std::int64_t lines = transposed ? m.cols() : m.rows();
    std::vector<std::vector<std::pair<int, int>>> per(lines);  // (index, tag)
    for (std::size_t e = 0; e < m.coords().size(); ++e) {
      const auto [r, c] = m.coords()[e];
      per[transposed ? c : r].push_back({static_cast<int>(transposed ? r : c), tags ? (*tags)[i][e] : 0});
    }
    for (auto& line : per) {
      std::sort(line.begin(), line.end());
      for (const auto& [index, tag] : line) {
        out.indices.push_back(index);
        if (tags) out.tags.push_back(tag);
      }
      out.starts.push_back(static_cast<int>(out.indices.size()));
    }
  }
  return out;
}

// The lines (block rows or columns) that tile t of `tile` positions covers: [first, end).
std::pair<std::int64_t, std::int64_t> tile_lines(std::int64_t t, int tile, int block, std::int64_t lines) {
  return {t * tile / block, std::min(lines, ((t + 1) * tile + block - 1) / block)};
}

// Tiles of `tile` positions in launch order, the most blocks (summed over the masks and the lines
// a tile covers) first: with causal or uneven masks the long rows start in the first wave instead
// of trailing the last one.
std::vector<int> launch_order(const Lists& lists, std::int64_t lines, std::size_t masks, std::int64_t tiles, int tile,
                              int block) {
  std::vector<int> order(tiles), work(tiles, 0);
  for (std::int64_t t = 0; t < tiles; ++t) {
    order[t] = static_cast<int>(t);
    const auto [first, end] = tile_lines(t, tile, block, lines);
    for (std::int64_t line = first; line < end; ++line)
      for (std::size_t i = 0; i < masks; ++i)
        work[t] += lists.starts[i * lines + line + 1] - lists.starts[i * lines + line];
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return work[a] > work[b]; });
  return order;
}

// The footprint of `order`: per mask, a window of 2^i tiles slid along it, counting the distinct
// blocks its lines' lists hold at each place; the count that 9 places in 10 stay within (a few
// heavy tiles, a window mask's global columns, touch every block, but the wave passes them once),
// the most over the masks. Up to windows of every tile, of 7/8 of the blocks (a causal mask's from
// the first: one pass over its lists), or of kMaxRun tiles (more than a GPU runs of one head at
// once); TileFootprint::of counts longer runs as all lines.
TileFootprint tile_footprint(const Lists& lists, std::int64_t lines, std::size_t masks, std::int64_t other,
                             const std::vector<int>& order, int tile, int block) {
  constexpr std::int64_t kMaxRun = 4096;
  TileFootprint f;
  f.tiles = static_cast<std::int64_t>(order.size()), f.lines = other;
  std::vector<int> count(other);
  std::vector<std::int64_t> places;
  for (std::int64_t w = 1;; w *= 2) {
    std::int64_t most = 0;
    for (std::size_t m = 0; m < masks; ++m) {
      std::fill(count.begin(), count.end(), 0);
      places.clear();
      std::int64_t distinct = 0;
      const auto touch = [&](std::int64_t t, int delta) {
        const auto [first, end] = tile_lines(t, tile, block, lines);
        for (std::int64_t line = first; line < end; ++line)
          for (int j = lists.starts[m * lines + line]; j < lists.starts[m * lines + line + 1]; ++j) {
            int& c = count[lists.indices[j]];
            if (delta > 0 ? c++ == 0 : --c == 0) distinct += delta;
          }
      };
      for (std::int64_t i = 0; i < f.tiles; ++i) {
        touch(order[i], 1);
        if (i >= w) touch(order[i - w], -1);
        if (i + 1 >= std::min(w, f.tiles)) places.push_back(distinct);
      }
      if (places.empty()) continue;
      auto nth = places.begin() + static_cast<std::ptrdiff_t>((places.size() - 1) * 9 / 10);
      std::nth_element(places.begin(), nth, places.end());
      most = std::max(most, *nth);
    }
    f.blocks.push_back(most);
    if (w >= f.tiles || 8 * most >= 7 * other || w >= kMaxRun) break;
  }
  return f;
}

// The kernels' sources hold no sequence length: the masks' block lists are pointer tables,
// and the number of query and key blocks a constant table (kDims), which the Config reads through
// q_blocks() and k_blocks() (the decomposed ops add the masks' blocks, `more`). One compile serves
// every sequence length of a configuration (block, head dim, dtype, order, causal, number of
// masks): cache::code_key finds it.
std::string add_dims(DeviceTables& tables, const std::vector<Layout>& masks, std::vector<int> more = {}) {
  std::vector<int> dims = {static_cast<int>(masks[0].rows()), static_cast<int>(masks[0].cols())};
  dims.insert(dims.end(), more.begin(), more.end());
  return add_table(tables, "kDims", std::move(dims), TableStorage::constant);
}
constexpr const char* kDimsAccessors =
    "  __device__ static int q_blocks() { return kDims[0]; }\n"
    "  __device__ static int k_blocks() { return kDims[1]; }\n";

// The fused forward's tables (by_column: the backward's): per block row (column) of each mask the
// start of its list of key (query) blocks, the lists, the tiles of `tile` positions in launch
// order; then the dims. The launch order's footprint into `footprint`.
// With quadrants (CoarseMasks), each list entry's quadrant bits beside it: kKeyQuadrants
// (kQueryQuadrants).
std::string fused_tables(DeviceTables& tables, const std::vector<Layout>& masks, bool by_column, std::int64_t tiles,
                         int tile, int block, TileFootprint& footprint,
                         const std::vector<std::vector<int>>* quadrants = nullptr) {
  const Lists lists = block_lists(masks, by_column, quadrants);
  const std::int64_t lines = by_column ? masks[0].cols() : masks[0].rows();
  const std::int64_t other = by_column ? masks[0].rows() : masks[0].cols();
  constexpr TableStorage kPointer = TableStorage::pointer;
  std::vector<int> order = launch_order(lists, lines, masks.size(), tiles, tile, block);
  footprint = tile_footprint(lists, lines, masks.size(), other, order, tile, block);
  std::string text = add_table(tables, by_column ? "kColStart" : "kRowStart", lists.starts, kPointer);
  text += add_table(tables, by_column ? "kQueryBlocks" : "kKeys", lists.indices, kPointer);
  text += add_table(tables, by_column ? "kKeyTileOrder" : "kTileOrder", std::move(order), kPointer);
  if (quadrants) text += add_table(tables, by_column ? "kQueryQuadrants" : "kKeyQuadrants", lists.tags, kPointer);
  return text + add_dims(tables, masks);
}

const char* type_name(DType dt) { return dt == DType::bf16 ? "bsjit::kernels::bfloat16_t" : "bsjit::kernels::half_t"; }

}  // namespace

std::int64_t TileFootprint::of(std::int64_t t) const {
  t = std::min(t, tiles);  // a run of every tile: the last window
  std::size_t i = 0;
  while (i < blocks.size() && (std::int64_t{1} << i) < t) ++i;
  return i < blocks.size() ? blocks[i] : lines;
}

CoarseMasks coarse_masks(const std::vector<Layout>& masks) {
  CoarseMasks out;
  std::int64_t fine = 0, tiles = 0;
  for (const Layout& m : masks) {
    if (m.rows() % 2 != 0 || m.cols() % 2 != 0)
      throw Error(fmt::format("bsjit: attention: a [{}, {}] block mask has no tiles of 2 × 2 blocks", m.rows(), m.cols()));
    std::map<std::pair<std::int32_t, std::int32_t>, int> bits;  // ordered: the tiles row-major
    for (const auto& [r, c] : m.coords()) bits[{r / 2, c / 2}] |= 1 << (2 * (r % 2) + c % 2);
    std::vector<std::pair<std::int64_t, std::int64_t>> coords;
    for (const auto& [at, b] : bits) coords.push_back(at);
    out.masks.push_back(Layout::from_coords(m.rows() / 2, m.cols() / 2, coords));
    std::vector<int>& q = out.quadrants.emplace_back();
    for (const auto& [r, c] : out.masks.back().coords()) q.push_back(bits.at({r, c}));
    fine += m.blocks(), tiles += out.masks.back().blocks();
  }
  out.live = tiles > 0 ? static_cast<double>(fine) / (4.0 * static_cast<double>(tiles)) : 0.0;
  return out;
}

std::optional<CoarseMasks> coarse_attention(const std::vector<Layout>& masks, const AttentionOptions& o,
                                            const std::string& arch, bool backward) {
  if (arch != "sm_90a" || o.block != 64 || o.head_dim < 64) return std::nullopt;
  for (const Layout& m : masks)
    if (m.rows() % 2 != 0 || m.cols() % 2 != 0) return std::nullopt;
  const double gain = backward ? (o.head_dim == 128 ? 1.6 : 1.29) : (o.head_dim == 128 ? 1.2 : 1.1);
  CoarseMasks c = coarse_masks(masks);
  if (c.live * gain <= 1.05) return std::nullopt;
  return c;
}

namespace {

GeneratedAttention forward_source(const std::vector<Layout>& masks, const AttentionOptions& o, const std::string& arch,
                                  const std::vector<std::vector<int>>* quadrants) {
  GeneratedAttention g;
  g.block = o.block;
  g.tma = arch == "sm_90a" && o.block >= 64 && o.head_dim >= 64;
  int qt, kt, consumers = 0, stages = 0;
  if (g.tma) {
    // One query block per CTA, 64 rows per consumer warpgroup, one key block per stage. Block 128:
    // 2 consumers taking turns at the tensor cores, one CTA per SM, as many stages as fit up to 4
    // (d = 128: Q 32 KiB + 3 × (K + V) 192 KiB). Block 64: one consumer, two CTAs per SM, 2 stages
    // (Q 16 KiB + 2 × 32 KiB each).
    qt = kt = o.block, consumers = o.block / 64;
    const int stage_bytes = 2 * kt * o.head_dim * 2, fixed = qt * o.head_dim * 2 + 1024;
    stages = o.block == 64 ? 2 : std::min(4, (227 * 1024 - fixed - 17 * 8) / stage_bytes);
    g.threads = (consumers + 1) * 128;
    g.shared_bytes = (qt + 2 * stages * kt) * o.head_dim * 2 + (1 + 4 * stages) * 8 + 1024;
    g.q_rows = qt, g.kv_rows = kt;
  } else {
    // Query and key tiles of 64 rows (the block's own size below that): a CTA of 4 warps holds 64
    // query rows and their output accumulators in registers.
    qt = std::min(o.block, 64), kt = std::min(o.block, 64);
    g.threads = qt * 2;
    g.shared_bytes = (qt + 4 * kt) * (o.head_dim + 8) * 2;
  }
  g.seq_q = masks[0].rows() * o.block;
  g.seq_k = masks[0].cols() * o.block;
  g.query_tiles = g.seq_q / qt;
  if (g.query_tiles > 65535)
    throw Error(fmt::format("bsjit: attention: {} query tiles of {} rows; at most 65535 are supported", g.query_tiles,
                            qt));
  g.label = fmt::format("attention_forward-{}-b{}-d{}-{}{}{}", to_string(o.dtype), o.block, o.head_dim,
                        label_tail(o), quadrants ? "-quadrants" : "", g.tma ? "-tma" : "");

  const std::string tables =
      fused_tables(g.tables, masks, false, g.query_tiles, qt, o.block, g.footprint, quadrants);
  g.name_expression = g.tma ? "bsjit::kernels::attention_forward_tma_kernel<bsjit_generated::Config>"
                            : "bsjit::kernels::attention_forward_kernel<bsjit_generated::Config>";
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// {masks} block mask(s); any sequence lengths (kDims)\n"
      "#include \"bsjit/{header}\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "// Mask i, query block row r: key blocks kKeys[kRowStart[i * rows + r] .. kRowStart[i * rows + r + 1]].\n"
      "// Query tiles in launch order (grid y): kTileOrder. kDims: query and key blocks.\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr int kBlock = {block}, kHeadDim = {d}, kQTile = {qt}, kKTile = {kt}, kLayouts = {masks};\n"
      "  static constexpr bool kCausal = {causal}, kHeadsFirst = {heads_first};\n"
      "  static constexpr int kSharedBytes = {smem}, kConsumers = {consumers}, kStages = {stages};\n"
      "  enum : int {{ kKvGroup = {kv_group} }};  // query heads per key/value head\n"
      "{dims}"
      "  __device__ static const int* row_start() {{ return kRowStart; }}\n"
      "  __device__ static const int* keys() {{ return kKeys; }}\n"
      "  __device__ static const int* tile_order() {{ return kTileOrder; }}\n"
      "{quadrants}"
      "}};\n"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("masks", masks.size()), fmt::arg("dims", kDimsAccessors),
      fmt::arg("tables", tables), fmt::arg("type", type_name(o.dtype)), fmt::arg("block", o.block),
      fmt::arg("d", o.head_dim), fmt::arg("qt", qt), fmt::arg("kt", kt),
      fmt::arg("causal", o.causal ? "true" : "false"),
      fmt::arg("heads_first", o.order == QkvOrder::bhsd ? "true" : "false"), fmt::arg("smem", g.shared_bytes),
      fmt::arg("consumers", consumers), fmt::arg("stages", stages), fmt::arg("kv_group", o.kv_group),
      fmt::arg("header", g.tma ? "attention_hopper.cuh" : "attention.cuh"),
      fmt::arg("quadrants", quadrants ? "  enum : int { kQuadrants = 1 };  // kKeyQuadrants: each entry's live 64-blocks\n"
                                        "  __device__ static const int* key_quadrants() { return kKeyQuadrants; }\n"
                                      : ""));
  return g;
}

GeneratedAttentionBackward backward_source(const std::vector<Layout>& masks, const AttentionOptions& o,
                                           const std::string& arch, const std::vector<std::vector<int>>* quadrants) {
  const int d = o.head_dim;
  GeneratedAttentionBackward g;
  g.block = o.block;
  g.tma = arch == "sm_90a" && o.block >= 64 && d >= 64;
  int tile, stages = 0;
  if (g.tma) {
    // 128 keys per CTA, two consumer warpgroups of 64, query tiles of 64 rows through rings of
    // stages (Q, dO, lse, Delta), one CTA per SM. Block 128: one key block, one ring, dSᵀ shared
    // by the consumers with head dim 128 (double-buffered). Block 64: two key blocks (a pair of
    // block columns), a ring and a producer thread each, a consumer each. With one ring each
    // consumer's 64 × 64 dQ product goes through shared memory to a bulk reduction.
    tile = 128;
    const int streams = o.block == 64 ? 2 : 1, q = 64 * d * 2, rows = 64 * 4;
    const int ds = 128 * 64 * 2 * (o.block == 128 && d == 128 ? 2 : 1), dq = streams == 1 ? 2 * 64 * 64 * 4 : 0;
    auto bytes = [&](int s) {
      return 2 * 128 * d * 2 + streams * s * (2 * q + 2 * rows) + ds + dq + streams * (1 + 2 * s) * 8 + 1024;
    };
    stages = 2;
    while (stages < 3 && bytes(stages + 1) <= 227 * 1024) ++stages;
    g.threads = 3 * 128;
    g.shared_bytes = bytes(stages);
    g.q_rows = 64, g.kv_rows = o.block == 64 ? 64 : 128;
  } else {
    // Key and query tiles of 64 positions (the block's own size below that): KT / 16 warps of 16
    // keys; shared memory K, V, 2 stages of Q and dO, and dSᵀ.
    tile = std::min(o.block, 64);
    g.threads = tile * 2;
    g.shared_bytes = (2 * tile + 4 * tile) * (d + 8) * 2 + tile * (tile + 8) * 2;
  }
  const int q_tile = g.tma ? 64 : tile;
  g.key_tiles = (masks[0].cols() * o.block + tile - 1) / tile;  // an odd block count: a last half tile
  g.query_rows16 = masks[0].rows() * o.block / 16;
  if (g.key_tiles > 65535 || g.query_rows16 > 65535)
    throw Error(fmt::format("bsjit: attention: sequences of {} and {} positions are too long for the backward",
                            masks[0].rows() * o.block, masks[0].cols() * o.block));
  g.label = fmt::format("attention_backward-{}-b{}-d{}-{}{}{}", to_string(o.dtype), o.block, d, label_tail(o),
                        quadrants ? "-quadrants" : "", g.tma ? "-tma" : "");
  const std::string tables = fused_tables(g.tables, masks, true, g.key_tiles, tile, o.block, g.footprint, quadrants);
  g.prep = "bsjit::kernels::attention_backward_prep_kernel<bsjit_generated::Config>";
  g.main = g.tma ? "bsjit::kernels::attention_backward_tma_kernel<bsjit_generated::Config>"
                 : "bsjit::kernels::attention_backward_kernel<bsjit_generated::Config>";
  // the accumulator's layout: tiles in the fragments' order where the bulk reduction adds them
  g.dq = g.tma && o.block == 128 ? "bsjit::kernels::attention_backward_dq_tiles_kernel<bsjit_generated::Config>"
                                 : "bsjit::kernels::attention_backward_dq_kernel<bsjit_generated::Config>";
  if (o.kv_group > 1) g.dkv = "bsjit::kernels::attention_backward_dkv_kernel<bsjit_generated::Config>";
  g.key_rows16 = masks[0].cols() * o.block / 16;
  if (g.key_rows16 > 65535)
    throw Error(fmt::format("bsjit: attention: sequences of {} and {} positions are too long for the backward",
                            masks[0].rows() * o.block, masks[0].cols() * o.block));
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// {masks} block mask(s); any sequence lengths (kDims)\n"
      "#include \"bsjit/{header}\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "// Mask i, key block column c: query blocks kQueryBlocks[kColStart[i * cols + c] .. kColStart[i * cols + c + "
      "1]].\n"
      "// Key tiles in launch order (grid y): kKeyTileOrder. kDims: query and key blocks.\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr int kBlock = {block}, kHeadDim = {d}, kQTile = {q_tile}, kKTile = {tile}, kLayouts = "
      "{masks};\n"
      "  static constexpr bool kCausal = {causal}, kHeadsFirst = {heads_first};\n"
      "  static constexpr int kBackwardSharedBytes = {smem}, kStages = {stages};\n"
      "  enum : int {{ kKvGroup = {kv_group} }};  // query heads per key/value head\n"
      "{dims}"
      "  __device__ static bsjit::kernels::MaskTable col_start() {{ return {{kColStart}}; }}\n"
      "  __device__ static bsjit::kernels::MaskTable query_blocks() {{ return {{kQueryBlocks}}; }}\n"
      "  __device__ static bsjit::kernels::MaskTable key_tile_order() {{ return {{kKeyTileOrder}}; }}\n"
      "{quadrants}"
      "}};\n"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("masks", masks.size()), fmt::arg("dims", kDimsAccessors),
      fmt::arg("tables", tables), fmt::arg("type", type_name(o.dtype)), fmt::arg("block", o.block), fmt::arg("d", d),
      fmt::arg("tile", tile), fmt::arg("causal", o.causal ? "true" : "false"),
      fmt::arg("heads_first", o.order == QkvOrder::bhsd ? "true" : "false"), fmt::arg("smem", g.shared_bytes),
      fmt::arg("q_tile", q_tile), fmt::arg("stages", stages), fmt::arg("kv_group", o.kv_group),
      fmt::arg("header", g.tma ? "attention_backward_hopper.cuh" : "attention_backward.cuh"),
      fmt::arg("quadrants", quadrants ? "  enum : int { kQuadrants = 1 };  // kQueryQuadrants: each entry's live 64-blocks\n"
                                        "  __device__ static const int* query_quadrants() { return kQueryQuadrants; }\n"
                                      : ""));
  return g;
}

AttentionOptions coarse_options(AttentionOptions o) {
  o.block = 128;
  return o;
}

}  // namespace

GeneratedAttention generate_attention_forward(const std::vector<Layout>& masks, const AttentionOptions& o,
                                              const std::string& arch) {
  check(masks, o);
  if (const auto c = coarse_attention(masks, o, arch, false))
    return forward_source(c->masks, coarse_options(o), arch, &c->quadrants);
  return forward_source(masks, o, arch, nullptr);
}

GeneratedAttentionBackward generate_attention_backward(const std::vector<Layout>& masks, const AttentionOptions& o,
                                                       const std::string& arch) {
  check(masks, o);
  if (const auto c = coarse_attention(masks, o, arch, true))
    return backward_source(c->masks, coarse_options(o), arch, &c->quadrants);
  return backward_source(masks, o, arch, nullptr);
}

GeneratedAttentionOps generate_attention_ops(const std::vector<Layout>& masks, const AttentionOptions& o) {
  check(masks, o);
  const std::int64_t rows = masks[0].rows(), cols = masks[0].cols();
  GeneratedAttentionOps g;
  g.tile = std::min(o.block, 64);
  g.threads = 2 * g.tile;
  const int s = o.head_dim + 8, sp = g.tile + 8;
  g.scores_shared = 2 * g.tile * s * 2;
  g.product_shared = 2 * (g.tile * sp + g.tile * s) * 2;
  const std::int64_t sub = o.block / g.tile;
  std::int64_t most = 0;
  for (const auto& m : masks) {
    g.blocks_per_mask.push_back(m.blocks());
    g.mask_blocks += m.blocks();
    most = std::max(most, m.blocks());
  }
  g.score_tiles = std::max<std::int64_t>(1, most * sub * sub);
  g.query_tiles = rows * sub;
  g.key_tiles = cols * sub;
  g.softmax_rows4 = rows * o.block / 4;
  if (std::max({g.score_tiles, g.query_tiles, g.key_tiles, g.softmax_rows4}) > 65535)
    throw Error(fmt::format("bsjit: attention ops: masks of [{}, {}] blocks with {} nonzero are too large at block {}",
                            rows, cols, most, o.block));
  g.label = fmt::format("attention_ops-{}-b{}-d{}-{}", to_string(o.dtype), o.block, o.head_dim, label_tail(o));

  // Row-major tables over every mask, one after the other (a block's table position is its index in
  // its mask's order plus the blocks of the masks before it), and per block column the positions
  // of its blocks.
  const Lists row_lists = block_lists(masks, false), col_lists = block_lists(masks, true);
  std::vector<int> block_rows, col_positions;
  int first = 0;
  for (const auto& m : masks) {
    for (const auto& [r, c] : m.coords()) block_rows.push_back(r);
    std::vector<std::vector<int>> per_col(cols);
    for (std::int64_t i = 0; i < m.blocks(); ++i) per_col[m.coords()[i].second].push_back(first + static_cast<int>(i));
    for (const auto& line : per_col) col_positions.insert(col_positions.end(), line.begin(), line.end());
    first += static_cast<int>(m.blocks());
  }
  constexpr TableStorage kPointer = TableStorage::pointer;
  std::string tables = add_table(g.tables, "kRowStart", row_lists.starts, kPointer);
  tables += add_table(g.tables, "kKeys", row_lists.indices, kPointer);
  tables += add_table(g.tables, "kBlockRows", std::move(block_rows), kPointer);
  tables += add_table(g.tables, "kColStart", col_lists.starts, kPointer);
  tables += add_table(g.tables, "kQueryBlocks", col_lists.indices, kPointer);
  tables += add_table(g.tables, "kColPositions", std::move(col_positions), kPointer);
  tables += add_table(g.tables, "kTileOrder",
                      launch_order(row_lists, rows, masks.size(), g.query_tiles, g.tile, o.block), kPointer);
  tables += add_table(g.tables, "kKeyTileOrder",
                      launch_order(col_lists, cols, masks.size(), g.key_tiles, g.tile, o.block), kPointer);
  tables += add_dims(g.tables, masks, {static_cast<int>(g.mask_blocks)});
  const std::string kernel = "bsjit::kernels::attention_{}_kernel<bsjit_generated::Config>";
  g.scores = fmt::format(fmt::runtime(kernel), "scores");
  g.softmax = fmt::format(fmt::runtime(kernel), "softmax");
  g.softmax_grad = fmt::format(fmt::runtime(kernel), "softmax_grad");
  g.probs_v = fmt::format(fmt::runtime(kernel), "probs_v");
  g.probs_t = fmt::format(fmt::runtime(kernel), "probs_t");
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// {masks} block mask(s); any sequence lengths (kDims)\n"
      "#include \"bsjit/attention_ops.cuh\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "// Every mask's nonzero blocks, row-major, one mask after the other (table positions). Mask i's\n"
      "// block row r: positions kRowStart[i * rows + r] .. kRowStart[i * rows + r + 1], at key blocks\n"
      "// kKeys[position], in block rows kBlockRows[position].\n"
      "// Mask i's block column c: entries kColStart[i * cols + c] .. kColStart[i * cols + c + 1], at\n"
      "// query blocks kQueryBlocks[entry], table positions kColPositions[entry].\n"
      "// Query and key tiles in launch order (grid y of probs_v and probs_t), the most blocks first:\n"
      "// kTileOrder, kKeyTileOrder. kDims: query blocks, key blocks, the masks' blocks.\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr int kBlock = {block}, kHeadDim = {d}, kTile = {tile}, kLayouts = {masks};\n"
      "  static constexpr bool kCausal = {causal}, kHeadsFirst = {heads_first};\n"
      "  enum : int {{ kKvGroup = {kv_group} }};  // query heads per key/value head\n"
      "{dims}"
      "  __device__ static int mask_blocks() {{ return kDims[2]; }}\n"
      "  __device__ static const int* row_start() {{ return kRowStart; }}\n"
      "  __device__ static const int* keys() {{ return kKeys; }}\n"
      "  __device__ static const int* block_rows() {{ return kBlockRows; }}\n"
      "  __device__ static const int* col_start() {{ return kColStart; }}\n"
      "  __device__ static const int* query_blocks() {{ return kQueryBlocks; }}\n"
      "  __device__ static const int* col_positions() {{ return kColPositions; }}\n"
      "  __device__ static const int* tile_order() {{ return kTileOrder; }}\n"
      "  __device__ static const int* key_tile_order() {{ return kKeyTileOrder; }}\n"
      "}};\n"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("masks", masks.size()), fmt::arg("dims", kDimsAccessors),
      fmt::arg("tables", tables), fmt::arg("type", type_name(o.dtype)), fmt::arg("block", o.block),
      fmt::arg("d", o.head_dim), fmt::arg("tile", g.tile), fmt::arg("causal", o.causal ? "true" : "false"),
      fmt::arg("heads_first", o.order == QkvOrder::bhsd ? "true" : "false"), fmt::arg("kv_group", o.kv_group));
  return g;
}

}  // namespace bsjit::generator
