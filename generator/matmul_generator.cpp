#include "matmul_generator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <vector>

#include "bsjit/error.hpp"
#include "device_tables.hpp"
#include "matmul_plan.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::generator {
namespace {

// The template header of a kernel family (templates/bsjit/matmul_common.cuh lists them).
std::string_view kernel_header(std::string_view kernel) {
  if (kernel == "dsd_kernel" || kernel == "sdd_kernel") return "matmul_fma.cuh";
  if (kernel == "dsd_pipelined_kernel" || kernel == "sdd_pipelined_kernel") return "matmul_pipelined.cuh";
  if (kernel == "dsd_wgmma_kernel") return "matmul_wgmma.cuh";
  if (kernel == "dsd_tma_kernel") return "matmul_dsd_tma.cuh";
  if (kernel == "dsd_grouped_kernel") return "matmul_grouped.cuh";
  if (kernel == "dsd_paired_kernel") return "matmul_paired.cuh";
  return "matmul_sdd_tma.cuh";  // sdd_tma, sdd_tiled, sdd_rows, sdd_cols
}

// The steps of each unit of a persistent dsd kernel in position order, from its tables: the TMA
// kernel's columns (LUT entries, each b / dsd_slice(b) stages), the grouped and paired kernels'
// groups (kGroupSteps: three offsets a group).
std::vector<std::int64_t> dsd_unit_steps(const DeviceTables& tables, std::int64_t b) {
  std::vector<std::int64_t> steps;
  for (const DeviceTable& table : tables) {
    const std::vector<int>& v = table.values;
    if (table.name == "kLutOffsets")
      for (std::size_t j = 0; j + 1 < v.size(); ++j) steps.push_back((v[j + 1] - v[j]) * (b / dsd_slice(b)));
    else if (table.name == "kGroupSteps")
      for (std::size_t g = 0; g + 3 < v.size(); g += 3) steps.push_back(v[g + 3] - v[g]);
  }
  return steps;
}

std::string_view device_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f16: return "bsjit::kernels::half_t";
    case DType::bf16: return "bsjit::kernels::bfloat16_t";
  }
  return "";
}

// For each output block column j: pairs (input block, W block index), input block ascending.
// forward: columns of the layout; backward-data (trans_w): rows (the layout of Wᵀ).
Columns output_columns(const Layout& layout, bool trans_w) {
  Columns per_out(trans_w ? layout.rows() : layout.cols());
  const auto& coords = layout.coords();
  for (std::size_t i = 0; i < coords.size(); ++i) {
    auto [r, c] = coords[i];
    if (trans_w) per_out[r].emplace_back(c, static_cast<int>(i));
    else per_out[c].emplace_back(r, static_cast<int>(i));
  }
  for (auto& entries : per_out) std::sort(entries.begin(), entries.end());
  return per_out;
}

// One op's output columns of a layout, built on first use: the layout's choice of tiles and the
// kernel's tables both read them, and a layout of 65536 blocks takes milliseconds to sort. So does
// their grouping for the grouped kernel (group_by_chunks), which the choice at b = 32 counts the
// steps of and the tables then lay out: about half a b = 32 forward's generation.
class LazyColumns {
 public:
  LazyColumns(const Layout& layout, bool trans_w) : layout_(layout), trans_w_(trans_w) {}
  const Columns& get() {
    if (!columns_) columns_ = output_columns(layout_, trans_w_);
    return *columns_;
  }
  // group_by_chunks(get(), columns, sub)
  const std::vector<int>& grouped(int columns, int sub) {
    if (!grouped_ || grouped_by_ != std::pair{columns, sub})
      grouped_ = group_by_chunks(get(), columns, sub), grouped_by_ = {columns, sub};
    return *grouped_;
  }

 private:
  const Layout& layout_;
  bool trans_w_;
  std::optional<Columns> columns_;
  std::optional<std::vector<int>> grouped_;
  std::pair<int, int> grouped_by_;
};

// The heuristic's tile choice for this layout (an explicit spec.tiles is taken as it is).
//
// Forward and backward-data at b = 64 on Hopper (N above the small batch) pair output block columns
// that share input blocks (dsd_paired_kernel) where that pays. Sweep on the H200 (suite W, balanced,
// TFLOP/s, the paired kernel pair2-bm256-s4 against the swapped tma2-bm256-s4-p-sw; in brackets
// paired_share, the share of the blocks in steps that hold both columns' blocks): forward d = 0.5
// 609 / 534 (0.62), d = 0.25 515 / 497 (0.44), d = 0.1 394 / 410 (0.37), d = 0.05 290 / 299 (0.36);
// backward-data 599 / 460, 509 / 442, 396 / 378, 274 / 257 (0.58, 0.39, 0.29, 0.28). So
// backward-data is always paired (the swapped kernel's backward-data ran 8-14% under its forward,
// the paired one within 6%: not from the sharing alone, and not explained), the forward where the
// share is 0.4 or more.
//
// At b = 32 the grouped kernel (default) copies an X tile of 256 rows × 64 indices per step, a step
// being a chunk of two input blocks holding a block of any of the group's 4 columns; the unswapped
// TMA kernel copies 256 rows × 32 indices per block. The grouped kernel's steps per block grow as
// the density falls (balanced, suite W, columns grouped by group_by_chunks: 0.24 at d = 0.5, 0.40 at
// 0.25, 0.57 at 0.1, 0.64 at 0.05). Sweep, TFLOP/s, grouped grp2-bm256-s4 against the TMA kernel
// tma2-bm256-s4-p, forward and backward-data: d = 0.25 277 / 200 and 275 / 201, d = 0.1 204 / 186
// and 204 / 183, d = 0.05 158 / 155 and 155 / 148 (since the grouped kernel's zeros come from a warp's
// stores and its steps convert no pointers; before, 0.1 179 / 186 and 0.05 142 / 154 forward). So the
// TMA kernel where the grouped one would take more than 0.7 steps per block (not measured past 0.64).
//
// The small batch at b = 64 (one CTA per output block column by default) runs its columns
// persistent on one CTA per SM with 8 stages where they are uneven: a lone CTA streams its column
// at the rate its own stages allow, so with a CTA per column the longest column sets the time,
// while one wave of CTAs dealt the columns longest first (one_wave_order) evens the CTAs' shares.
// N = 64, C = K = 16384, d = 0.1 (H200, three rounds, TFLOP/s, one CTA a column with 6 stages, two
// per SM, against tma1-bm64-s8-p): balanced forward (every column 26 blocks) 165-170 against
// 162-165, balanced backward-data (12-40) 147-148 against 162-163, Bernoulli forward (14-39)
// 152-155 against 160-163, Bernoulli backward-data 152-153 against 161-164; 10 and 12 stages 3-4%
// under 8, and 12 stages in balanced_order 138. So persistent where the longest column holds over
// kUnevenColumns times the mean. Between them (2026-12-03, sweep-small -k skewP, columns of two
// lengths, two runs, forward ms, s4 against s8-p): longest 1.1× the mean 0.0200-0.0203 against
// 0.0212-0.0214, 1.2× 0.0209-0.0214 against 0.0212-0.0214, 1.3× 0.0215-0.0218 against 0.0212,
// 1.45× 0.0226-0.0227 against 0.0215-0.0217: the crossing near 1.2-1.3. At b = 32 (persistent with 8
// stages by default) even columns run a CTA per column with 6 stages: 2026-12-03, sweep-small, two
// runs, ms, s6 against s8-p: balanced forward (every column 51 blocks) 0.0298-0.0301 against
// 0.0307-0.0312; where the columns are uneven s8-p wins (balanced backward-data 0.0336-0.0342 against
// 0.0332-0.0335, Bernoulli forward 0.0332-0.0334 against 0.0329-0.0330).
constexpr double kUnevenColumns = 1.25;

// columns: the layout's output columns for spec.op (LazyColumns).
MatMulSpec layout_choice(const Layout& layout, const MatMulSpec& spec, LazyColumns& columns) {
  if (spec.tiles) return spec;
  if (spec.op != Op::backward_weight) {
    const TileConfig t = choose_tiles(spec);
    if (spec.small_batch && (spec.block == 64 || spec.block == 32) && t.tma && layout.blocks() > 0) {
      const Columns& per_out = columns.get();
      std::size_t longest = 0;
      for (const auto& c : per_out) longest = std::max(longest, c.size());
      const double mean = static_cast<double>(layout.blocks()) / static_cast<double>(per_out.size());
      const bool even = static_cast<double>(longest) <= kUnevenColumns * mean;
      if (even == (spec.block == 64)) return spec;  // the default: b = 64 a CTA per column, b = 32 persistent
      MatMulSpec chosen = spec;
      chosen.tiles = finish_tma(spec, even ? tma_shape(64, 1, 6) : tma_shape(64, 1, 8, true));
      return chosen;
    }
    if (t.columns > 0 && spec.block == 32 && layout.blocks() > 0) {
      const Columns& per_out = columns.get();
      const std::int64_t steps = grouped_steps(per_out, columns.grouped(t.columns, 2), t.columns, 2);
      if (static_cast<double>(steps) <= 0.7 * static_cast<double>(layout.blocks())) return spec;
      MatMulSpec chosen = spec;
      chosen.tiles = finish_tma(spec, tma_shape(256, 2, 4, true));
      return chosen;
    }
    if (spec.block != 64 || !t.tma || !t.swapped || spec.small_batch) return spec;
    if (spec.op == Op::forward && paired_share(columns.get()) < 0.4) return spec;
    MatMulSpec chosen = spec;
    chosen.tiles = finish_paired(spec, paired_shape(256, 2, 4));
    return chosen;
  }
  if (spec.small_batch) return spec;
  const TileConfig t = choose_tiles(spec);
  if (t.tma && t.tile_edge == 0) return sdd_choice(layout, spec);
  if (t.tile_edge == 0 || layout.blocks() == 0) return spec;
  return sdd_narrow_choice(layout, spec);
}

}  // namespace

GeneratedSource generate_matmul(const Layout& layout, const MatMulSpec& requested) {
  LazyColumns columns(layout, requested.op == Op::backward_data);
  const MatMulSpec spec = layout_choice(layout, requested, columns);
  GeneratedSource g;
  g.tiles = choose_tiles(spec);
  const TileConfig& t = g.tiles;
  const std::int64_t b = spec.block;
  const bool sdd = spec.op == Op::backward_weight;
  const bool trans_w = spec.op == Op::backward_data;
  const std::int64_t C = layout.rows() * b, K = layout.cols() * b;
  g.in_features = spec.op == Op::backward_data ? K : C;
  g.out_features = spec.op == Op::backward_data ? C : K;
  g.label = kernel_label(spec);

  std::string tables;
  // grouped kernel: see grouped_tables; under 0.9 its consumers skip the empty sub-blocks
  // (kSkipEmpty; the measurements that set 0.9 are in matmul_grouped.cuh)
  double sub_fill = 1.0;
  std::int64_t out_blocks = 0;  // dsd: output block columns
  std::int64_t planes = 0;      // sdd on Hopper: workspace planes (SddSchedule)
  if (sdd) {
    // (row, col) of every nonzero block, in block order; tiled: of every E × E tile holding a
    // block, with the block indices of each tile.
    std::vector<int> coords, tile_blocks;
    std::int64_t units = layout.blocks(), edge = b;  // units of dW (blocks, tiles or row bands); tile edge
    if (t.tile_edge > 0) {
      edge = t.tile_edge;
      const std::int64_t per = edge / b, per_col = t.bn / b;  // blocks along a tile's height and width
      std::map<std::pair<std::int64_t, std::int64_t>, std::vector<int>> tiles;
      for (std::int64_t i = 0; i < layout.blocks(); ++i) {
        auto [r, c] = layout.coords()[i];
        auto& slots = tiles[{r / per, c / per_col}];
        slots.resize(per * per_col, -1);
        slots[(r % per) * per_col + c % per_col] = static_cast<int>(i);
      }
      for (auto& [rc, slots] : tiles) {
        coords.push_back(static_cast<int>(rc.first)), coords.push_back(static_cast<int>(rc.second));
        tile_blocks.insert(tile_blocks.end(), slots.begin(), slots.end());
      }
      units = static_cast<std::int64_t>(tiles.size());
    } else if (t.row_blocks > 0 || t.col_blocks > 0) {
      RowBands bands =
          t.row_blocks > 0 ? row_bands(layout, band_rows_of(t, b), t.row_blocks) : column_groups(layout, t.col_blocks);
      coords = std::move(bands.columns), tile_blocks = std::move(bands.blocks), units = bands.units;
    } else {
      coords.reserve(2 * layout.blocks());
      for (auto& [r, c] : layout.coords()) coords.push_back(r), coords.push_back(c);
      if (t.tma)  // the block of each unit, once the units are reordered (l2_unit_order)
        for (std::int64_t i = 0; i < layout.blocks(); ++i) tile_blocks.push_back(static_cast<int>(i));
    }
    if (t.tma && units > 0) {  // units in an order that keeps a wave's reads in L2 (l2_unit_order)
      // per unit: coords' and tile_blocks' entries; its row and column positions, the features of X
      // at its row position and the features of the other operand across all positions
      const std::int64_t per_coords = static_cast<std::int64_t>(coords.size()) / units,
                         per_blocks = static_cast<std::int64_t>(tile_blocks.size()) / units;
      std::vector<std::int64_t> row(units), col(units);
      double x_features = static_cast<double>(b), k_features = static_cast<double>(K);
      for (std::int64_t u = 0; u < units; ++u) {
        row[u] = coords[u * per_coords];
        col[u] = coords[u * per_coords + 1];
      }
      if (t.tile_edge > 0) x_features = static_cast<double>(t.tile_edge);
      if (t.row_blocks > 0) x_features = static_cast<double>(band_rows_of(t, b) * b);
      if (t.col_blocks > 0) k_features = static_cast<double>(C);  // a block column's dY, its rows of X gathered
      const std::vector<std::int64_t> order =
          l2_unit_order(row, col, x_features, k_features, static_cast<double>(resident_ctas(t, spec.sms)));
      permute_units(coords, per_coords, order);
      permute_units(tile_blocks, per_blocks, order);
    }
    g.grid_x = units;
    g.rows_per_cta = 0;
    // Split N when the layout has too few blocks to fill the GPU, up to one wave of CTAs (the
    // SMs of an H100/H200, 132, times the CTAs one SM holds at this shared-memory size), and only
    // for shapes small enough that 4 or more share an SM: one such CTA leaves its SM idle much of
    // the time. Measured on the H200, suite W, backward-weight (TFLOP/s, unsplit → split):
    //   b = 64, d = 0.05, 205 blocks, 4 CTAs/SM, 2 splits: 107 → 137-140
    //   b = 128, d = 0.1, 102 blocks, 2 CTAs/SM: 172 → 158 (2 splits), 128 (3 splits)
    //   b = 128, d = 0.05, 51 blocks: 116 → 127 (5 splits), 89 (6); Bernoulli layouts lost 8-11%
    // so the big b = 128 tile, which nearly fills an SM alone, is not split. The last split of each
    // block adds the partials in split order: deterministic.
    // The Hopper kernels (t.tma) instead run one wave of CTAs over their units (SddSchedule in
    // templates/bsjit/sdd_schedule.cuh): whole units in waves, those left over from the last full wave
    // split along N among the CTAs that would idle. The runtime launches as many CTAs as the GPU holds;
    // the workspace holds the partials the schedule needs on any Hopper GPU (kMaxSms SMs at most).
    // Either kind's workspace: kernels::kSplitCounters arrival counters (one per leftover unit, or
    // per split block), then the partials (templates/bsjit/sdd_schedule.cuh).
    const std::int64_t per_sm = t.pipelined ? ctas_per_sm(t) : 1;
    std::int64_t counters = 0, partials = 0;  // partials: fp32 values, 0 where the kernel does not split
    if (t.tma) {
      g.persistent = true;
      planes = sdd_kernel_planes(units, per_sm, spec.sms);
      counters = kMaxSms * per_sm;  // leftover units: fewer than the CTAs
      partials = planes * t.bm * t.bn;
    } else if (t.pipelined && units > 0 && per_sm >= 4) {
      g.splits = static_cast<int>(std::clamp<std::int64_t>(spec.sms * per_sm / units, 1, 8));
      counters = units;
      if (g.splits > 1) partials = static_cast<std::int64_t>(g.splits) * t.bm * t.bn * units;
    }
    if (partials > 0) {
      if (counters > kernels::kPieceCounters)
        throw Error(fmt::format("internal: {} split counters needed, the workspace holds {}", counters,
                                kernels::kPieceCounters));
      g.workspace_bytes = (kernels::kSplitCounters + partials) * 4;
    }
    tables = t.row_blocks > 0
                 ? fmt::format(
                       "// Units of {} block columns of a band of {} block row(s): per unit the band, then its\n"
                       "// block columns (-1: an empty slot), and the block index at each (row of the band,\n"
                       "// column) (row-major; -1: none).\n",
                       t.row_blocks, band_rows_of(t, b))
             : t.col_blocks > 0
                 ? fmt::format(
                       "// Units of {} blocks of a block column: per unit the block column, then its block\n"
                       "// rows (-1: an empty slot), and the block index of each (-1: none).\n",
                       t.col_blocks)
             : t.tile_edge > 0 ? fmt::format(
                                     "// (tile row, tile column) of each {} × {} tile of dW holding a block, and "
                                     "the\n// block index of each block of the tile (row-major; -1: none).\n",
                                     edge, t.bn)
             : t.tma ? std::string(
                           "// (block row, block column) of each unit's block of W, and the block's index,\n"
                           "// in the order the CTAs take the units.\n")
                     : std::string("// (block row, block column) of each nonzero block of W, in block order.\n");
    tables += add_table(g.tables, "kCoords", std::move(coords));
    if (t.tma) tables += add_table(g.tables, "kTileBlocks", std::move(tile_blocks));
  } else {
    // For each output block column j: pairs (input block, W block index), input block ascending.
    // forward: columns of the layout; backward-data: rows (the layout of Wᵀ).
    out_blocks = trans_w ? layout.rows() : layout.cols();
    const Columns& per_out = columns.get();
    g.rows_per_cta = t.bm;
    if (t.paired) {
      tables =
          grouped_tables(per_out, balanced_groups(per_out, pair_columns(per_out), 2, 1, resident_ctas(t, spec.sms)), 2,
                         1, 2, g.grid_x, sub_fill, g.tables);
    } else if (t.columns > 0) {
      const int sub = static_cast<int>(64 / b);
      tables = grouped_tables(per_out,
                              balanced_groups(per_out, columns.grouped(t.columns, sub), t.columns, sub,
                                              resident_ctas(t, spec.sms)),
                              t.columns, sub, t.warps_m, g.grid_x, sub_fill, g.tables);
    } else {
      // the persistent TMA kernel takes the columns in a balanced order (balanced_order), the
      // others in order
      std::vector<int> order(out_blocks), offsets{0}, lut;
      std::iota(order.begin(), order.end(), 0);
      if (t.tma && t.persistent && !t.split) {
        std::vector<std::int64_t> steps;
        for (const auto& entries : per_out) steps.push_back(static_cast<std::int64_t>(entries.size()));
        order = spec.small_batch ? one_wave_order(steps, resident_ctas(t, spec.sms))
                                 : balanced_order(steps, resident_ctas(t, spec.sms), true);
      }
      lut.reserve(2 * layout.blocks());
      for (int c : order) {
        for (auto& [in, w] : per_out[c]) lut.push_back(in), lut.push_back(w);
        offsets.push_back(static_cast<int>(lut.size() / 2));
      }
      g.grid_x = out_blocks;
      tables =
          "// The output block column at position j, kOutColumns[j], reads entries kLutOffsets[j] ..\n"
          "// kLutOffsets[j+1] of kLut, each a pair (input block, W block index).\n";
      if (t.split) {
        // the small batch's columns split: grid x is the CTAs the blocks are dealt to (split_columns)
        const std::int64_t max_ctas = resident_ctas(t, spec.sms), row_tiles = (kSmallBatchRows + t.bm - 1) / t.bm;
        SplitColumns split = split_columns(offsets, max_ctas, b, t.bm);
        g.grid_x = split.ctas;
        g.split = true;
        g.max_rows = kSmallBatchRows;
        if (row_tiles * max_ctas > kernels::kPieceCounters)
          throw Error(fmt::format("internal: {} split counters needed, the workspace holds {}", row_tiles * max_ctas,
                                  kernels::kPieceCounters));
        if (split.planes > 0)
          g.workspace_bytes = (kernels::kSplitCounters + row_tiles * split.planes * t.bm * b) * 4;
        tables += "// The small batch's CTAs (one wave): CTA p takes item p of kItems, then items kCtaItems[p] ..\n"
                  "// kCtaItems[p+1]: (position, first entry, end, split column or -1, its first partial plane,\n"
                  "// piece, pieces, 0).\n";
        tables += add_table(g.tables, "kCtaItems", std::move(split.cta_items));
        tables += add_table(g.tables, "kItems", std::move(split.items));
        tables += add_table(g.tables, "kSplitPlanes", {split.planes});
      }
      tables += add_table(g.tables, "kOutColumns", std::move(order));
      // One CTA per tile (the TMA kernel not persistent: the small batch at b >= 64), whose threads all
      // read their column's two offsets first, and only then its entries and its first copies: the
      // offsets in constant memory. N = 64, C = K = 16384, d = 0.1, b = 64, three rounds, main and this
      // interleaved in one call: balanced forward 0.0207-0.0210 -> 0.0205-0.0207 ms, backward-data
      // 0.0234-0.0238 -> 0.0232-0.0233, Bernoulli forward 0.0223-0.0226 -> 0.0221-0.0225 (b = 32,
      // persistent, level). Up to 16 KB of them: constant memory holds 64 KB a module.
      const bool offsets_constant =
          t.tma && !t.persistent && capacity(DeviceTable{"", offsets}) * sizeof(int) <= 16 * 1024;
      tables += add_table(g.tables, "kLutOffsets", std::move(offsets),
                          offsets_constant ? TableStorage::constant : TableStorage::array);
      tables += add_table(g.tables, "kLut", std::move(lut));
    }
  }

  // The layout's counts the kernel loops over, as a table (not constants), so the source serves
  // every layout of the shape: dW units and workspace planes, or column groups (pairs). Except the
  // group count at b = 16, which stays a constant: read from the table, the b = 16 grouped kernel
  // lost 6% at d = 0.5 and 0.25 (suite W forward 375 -> 353 TFLOP/s, backward-data the same; b >= 32
  // within ±1%). Little sharing is lost: layouts of one shape mostly have the same group count at
  // b = 16 (64 × 64 blocks, d = 0.05-0.5: 71 of 80 layouts and their permuted columns share sources).
  const bool grouping = t.paired || t.columns > 0;
  const bool group_table = grouping && spec.block > 16;
  if (sdd && t.tma)
    tables += add_table(g.tables, "kCounts", {static_cast<int>(g.grid_x), static_cast<int>(planes)});
  else if (group_table)
    tables += add_table(g.tables, "kCounts", {static_cast<int>(g.grid_x)});
  const std::string groups =
      !grouping     ? std::string()
      : group_table ? std::string("  __device__ static int groups() { return kCounts[0]; }\n")
                    : fmt::format("  __device__ static constexpr int groups() {{ return {}; }}\n", g.grid_x);
  const bool slots = t.tma;  // sdd tables of block slots per unit (one block a unit: sdd_tma_kernel's)
  const std::string accessors =
      (sdd && t.tma ? std::string("  __device__ static const int* counts() { return kCounts; }\n") : groups) +
      (sdd        ? (slots ? "  __device__ static const int* coords() { return kCoords; }\n"
                             "  __device__ static const int* tile_blocks() { return kTileBlocks; }\n"
                           : "  __device__ static const int* coords() { return kCoords; }\n")
       : grouping ? "  __device__ static const int* group_steps() { return kGroupSteps; }\n"
                    "  __device__ static const int* steps() { return kSteps; }\n"
                    "  __device__ static const int* group_columns() { return kGroupColumns; }\n"
                  : std::string("  __device__ static const int* out_columns() { return kOutColumns; }\n"
                                "  __device__ static const int* lut_offsets() { return kLutOffsets; }\n"
                                "  __device__ static const int* lut() { return kLut; }\n") +
                        (t.split ? "  __device__ static const int* cta_items() { return kCtaItems; }\n"
                                   "  __device__ static const int* items() { return kItems; }\n"
                                   "  __device__ static const int* split_planes() { return kSplitPlanes; }\n"
                                 : ""));
  const char* kernel = t.paired           ? "dsd_paired_kernel"
                       : t.columns > 0    ? "dsd_grouped_kernel"
                       : t.tile_edge > 0  ? "sdd_tiled_kernel"
                       : t.row_blocks > 0 ? "sdd_rows_kernel"
                       : t.col_blocks > 0 ? "sdd_cols_kernel"
                       : t.tma            ? (sdd ? "sdd_tma_kernel" : "dsd_tma_kernel")
                       : t.wgmma          ? "dsd_wgmma_kernel"
                       : t.pipelined      ? (sdd ? "sdd_pipelined_kernel" : "dsd_pipelined_kernel")
                                          : (sdd ? "sdd_kernel" : "dsd_kernel");
  g.shared_bytes = t.shared_bytes;
  g.dtype = spec.dtype;
  g.persistent = g.persistent || t.persistent;
  // The persistent Hopper kernels (dsd: TMA, grouped, paired; backward-weight's) pace their wave
  // (kernels::WaveGate), whose counters lie in the workspace's: such a kernel takes the workspace
  // even where nothing splits. Not the small batch's: one row tile, one round a unit. Backward-weight
  // only with two waves of whole units or more: one wave starts together and walks N once, and on
  // suite W (b = 64, 256 units: one wave) paced it ran ×0.96, where 12288² layers of 8 to 18 waves
  // gained ×1.18 at N = 8192 and ×1.47-2.68 at 32768 (H100, 91aff75; docs/PERFORMANCE.md, "The wave
  // paced").
  const bool wave_gate =
      t.tma && !spec.small_batch && (sdd ? g.grid_x >= 2 * resident_ctas(t, spec.sms) : t.persistent && !t.split);
  // A dsd kernel's gate only where this layout's units leave the paced CTAs little to wait for
  // (paced_slowdown): the source keeps its gate, which a launch without the workspace leaves open, so
  // every layout of the shape still shares one compile.
  g.pace_slowdown = wave_gate && !sdd ? paced_slowdown(dsd_unit_steps(g.tables, b), resident_ctas(t, spec.sms),
                                                       kernels::kWaveGateLead, t.stages)
                                      : 1.0;
  g.paced = wave_gate && g.pace_slowdown <= kPacedSlowdownMax;
  if (g.paced && g.workspace_bytes == 0) g.workspace_bytes = kernels::kSplitCounters * 4;
  if (t.tma && sdd) {  // X and dY: 64 rows of N × 64 features per box; row bands at b ≤ 32: dY's boxes b wide
    // staged: dW as [blocks · b, b], stored in boxes of a warp's 16 rows × min(b, 64) features
    const int dy_box = t.row_blocks > 0 ? static_cast<int>(std::min<std::int64_t>(b, 64)) : 64;
    g.tensor_maps = {{g.in_features, 0, 64, 64}, {g.out_features, 0, dy_box, 64, 2 * dy_box}};
    const int dw_box = static_cast<int>(std::min<std::int64_t>(b, 64));
    if (t.staged) g.tensor_maps.push_back({b, layout.blocks() * b, dw_box, 16, 2 * dw_box});
  } else if (t.columns > 0)  // X (or dY): 64 features × BM rows; W as [blocks · b, b]: one block, rows of 2b bytes
    g.tensor_maps = {{g.in_features, 0, 64, t.bm},
                     {b, layout.blocks() * b, static_cast<int>(b), static_cast<int>(b), static_cast<int>(2 * b)}};
  else if (t.tma) {  // X (or dY): 64 features × BM rows; W as [blocks · b, b]: 64 rows, or the whole block for Wᵀ;
                     // Y (or dX) stored in boxes of 64 outputs × 16 rows (a warp's), or 64 rows when swapped.
                     // b = 32: 32 wide, swizzled over 64 bytes.
    const int slice = dsd_slice(static_cast<int>(b)), swizzle = 2 * slice;
    g.tensor_maps = {{g.in_features, 0, slice, t.bm, swizzle},
                     {b, layout.blocks() * b, slice, trans_w ? static_cast<int>(b) : slice, swizzle},
                     {g.out_features, 0, slice, t.swapped ? 64 : 16, swizzle}};
  }
  g.name_expression = fmt::format("bsjit::kernels::{}<bsjit_generated::Config>", kernel);
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// layout [{rows}, {cols}] blocks (its blocks are in the tables: one source serves every layout of\n"
      "// this shape whose tables have the same sizes)\n"
      "#include \"bsjit/{header}\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr int kBlock = {b};\n"
      "  static constexpr int kBM = {bm}, kBN = {bn}, kBK = {bk}, kStride = {stride};\n"
      "  static constexpr int kThreads = {threads};\n"
      "  static constexpr bool kTensorCores = {tc};\n"
      "  static constexpr int kWarpsM = {wm}, kWarpsN = {wn};\n"
      "  static constexpr int kTM = {tm}, kTN = {tn};\n"
      "  static constexpr int kStages = {stages}, kSharedBytes = {smem}, kGroup = {group}, kSplits = {splits};\n"
      "  static constexpr bool kFeatureLast = {last};\n"
      "  static constexpr bool kTransW = {trans};\n"
      "  static constexpr long long kInDim = {in_dim}, kOutDim = {out_dim};\n"
      "  static constexpr int kOutBlocks = {out_blocks};  // output block columns (dsd)\n"
      "  static constexpr bool kPersistent = {persistent}, kSwapped = {swapped}, kSplit = {split};\n"
      "  static constexpr bool kWaveGate = {wave_gate};  // CTAs paced to within WaveGate::kLead rounds\n"
      "  static constexpr bool kPlain = {plain};  // built for calls with neither accumulate nor gate\n"
      "{grouped}"
      "{units}"
      "{accessors}"
      "}};\n"
      "{smem_check}"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("rows", layout.rows()), fmt::arg("cols", layout.cols()),
      fmt::arg("tables", tables), fmt::arg("type", device_type(spec.dtype)), fmt::arg("b", b), fmt::arg("bm", t.bm),
      fmt::arg("bn", t.bn), fmt::arg("bk", t.bk), fmt::arg("stride", t.stride), fmt::arg("threads", t.threads),
      fmt::arg("tc", t.tensor_cores ? "true" : "false"), fmt::arg("wm", t.warps_m), fmt::arg("wn", t.warps_n),
      fmt::arg("tm", t.tm), fmt::arg("tn", t.tn), fmt::arg("stages", t.stages), fmt::arg("smem", t.shared_bytes),
      fmt::arg("group", t.group), fmt::arg("splits", g.splits),
      fmt::arg("last", spec.feature_axis == FeatureAxis::last ? "true" : "false"),
      fmt::arg("trans", trans_w ? "true" : "false"), fmt::arg("in_dim", g.in_features),
      fmt::arg("out_dim", g.out_features), fmt::arg("out_blocks", out_blocks),
      fmt::arg("persistent", t.persistent ? "true" : "false"), fmt::arg("swapped", t.swapped ? "true" : "false"),
      fmt::arg("split", t.split || planes > 0 ? "true" : "false"), fmt::arg("plain", spec.plain ? "true" : "false"),
      fmt::arg("wave_gate", wave_gate ? "true" : "false"), fmt::arg("accessors", accessors),
      fmt::arg("header", kernel_header(kernel)),
      fmt::arg("units",
               sdd && t.tma ? fmt::format("  static constexpr bool kStagedStore = {};\n", t.staged) : std::string()),
      fmt::arg(
          "grouped",
          t.paired          ? std::string("  static constexpr int kColumns = 2;  // column pairs\n")
          : t.columns > 0   ? fmt::format("  static constexpr int kColumns = {};  // column groups\n"
                                            "  static constexpr bool kSkipEmpty = {};  // sub-block fill under 0.9\n",
                                          t.columns, sub_fill < 0.9)
          : t.tile_edge > 0 ? fmt::format("  static constexpr int kTileEdge = {}, kTileCols = {};  // dW tiles: rows, "
                                          "features\n",
                                          t.tile_edge, t.bn)
          : t.row_blocks > 0
              ? fmt::format("  static constexpr int kRowBlocks = {}, kBandRows = {};  // block columns per unit "
                            "and block rows of a row band\n",
                            t.row_blocks, band_rows_of(t, b))
          : t.col_blocks > 0
              ? fmt::format("  static constexpr int kColBlocks = {};  // block rows per unit (of one block column)\n",
                            t.col_blocks)
              : ""),
      fmt::arg("smem_check", t.pipelined
                                 ? ""
                                 : "\nstatic_assert(bsjit::kernels::SmemBytes<Config>::value <= 48 * 1024, "
                                   "\"static shared memory is 48 KB\");\n"));
  return g;
}

std::int64_t paced_rounds(const GeneratedSource& g, std::int64_t ctas, std::int64_t n) {
  if (!g.paced || ctas <= 0 || n <= 0) return 0;
  if (g.rows_per_cta > 0) return g.grid_x * ((n + g.rows_per_cta - 1) / g.rows_per_cta) / ctas;
  // the kernel's own schedule (its partial planes play no part in the whole waves)
  return kernels::SddSchedule(static_cast<int>(g.grid_x), static_cast<int>(ctas), 0, static_cast<int>((n + 63) / 64))
      .paced_rounds();
}

}  // namespace bsjit::generator
