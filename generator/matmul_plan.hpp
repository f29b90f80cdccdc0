// What the matmul generator's files share (internal: not installed). The generator is split by what
// it decides: tile shapes (matmul_shapes.cpp), the grouped and paired kernels' tables
// (matmul_grouped_tables.cpp), the backward-weight units (matmul_sdd_units.cpp), the persistent
// schedules (matmul_schedules.cpp), and the layout's choice of kernel with the source emission
// (matmul_generator.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bsjit/layout.hpp"
#include "device_tables.hpp"
#include "matmul_generator.hpp"

namespace bsjit::generator {

// Per output block column, its (input block, W block index) pairs (output_columns).
using Columns = std::vector<std::vector<std::pair<int, int>>>;

// Reduction indices per stage of the dsd wgmma / TMA kernels (DsdWgmmaPlan::kSlice): 64, one
// 128-byte row of X; b at b = 32, whose tiles have rows of 64 bytes swizzled over 64 bytes.
inline int dsd_slice(int b) { return std::min(b, 64); }

// Block rows of a band of sdd_rows_kernel: the shape's band_rows, else one at b ≥ 64 and 64 / b at
// b ≤ 32 (a band of 64 rows, X's box).
inline std::int64_t band_rows_of(const TileConfig& t, std::int64_t b) {
  return t.band_rows > 0 ? t.band_rows : std::max<std::int64_t>(b, 64) / b;
}

// Each function below is documented where it is defined.

// --- tile shapes (matmul_shapes.cpp): the Hopper shapes the layout's choices pick from ---

TileConfig tma_shape(int bm, int warpgroups, int stages, bool persistent = false, bool swapped = false);
TileConfig finish_tma(const MatMulSpec& spec, TileConfig t);
TileConfig paired_shape(int bm, int warpgroups, int stages);
TileConfig finish_paired(const MatMulSpec& spec, TileConfig t);
TileConfig tiled_shape(int edge, int warpgroups, int stages, int cols = 0);
TileConfig rows_shape(int row_blocks, int warpgroups, int stages, int band_rows = 0);
TileConfig cols_shape(int col_blocks, int warpgroups, int stages);
TileConfig staged(TileConfig t);

// --- the grouped and paired kernels' tables (matmul_grouped_tables.cpp) ---

std::string grouped_tables(const Columns& per_out, const std::vector<int>& order, int columns, int sub, int consumers,
                           std::int64_t& grid_x, double& sub_fill, DeviceTables& tables);
std::vector<int> pair_columns(const Columns& per_out);
std::vector<int> group_by_chunks(const Columns& per_out, int columns, int sub);
std::int64_t grouped_steps(const Columns& per_out, const std::vector<int>& order, int columns, int sub);
std::vector<int> balanced_groups(const Columns& per_out, const std::vector<int>& order, int columns, int sub,
                                 std::int64_t ctas);
double paired_share(const Columns& per_out);

// --- the Hopper backward-weight kernels' units (matmul_sdd_units.cpp) ---

// The units of sdd_rows_kernel: bands of `per` block rows (1 at b ≥ 64, 64 / b at b ≤ 32), each
// band's block columns that hold a block in it (ascending) in groups of m, the band's last group
// padded. columns: per unit, the band, then m block columns (-1: an empty slot); blocks: per unit,
// per × m block indices, row-major (-1: none).
struct RowBands {
  std::vector<int> columns, blocks;
  std::int64_t units = 0;
};

RowBands row_bands(const Layout& layout, std::int64_t per, int m);
RowBands column_groups(const Layout& layout, int m);
MatMulSpec sdd_choice(const Layout& layout, const MatMulSpec& spec);
MatMulSpec sdd_narrow_choice(const Layout& layout, const MatMulSpec& spec);

// --- persistent schedules (matmul_schedules.cpp) ---

struct SplitColumns {
  std::int64_t ctas = 0;
  std::vector<int> cta_items;  // CTA p takes item p, then items cta_items[p] .. cta_items[p + 1]
  // 8 ints per item, as DsdTile (templates/bsjit/matmul_dsd_tma.cuh) reads them: position, begin, end,
  // split (-1: a whole column), first_plane, piece, pieces, 0
  std::vector<int> items;
  int splits = 0, planes = 0;  // split columns, and their pieces (the partial planes of a row tile)
};

std::vector<std::int64_t> l2_unit_order(const std::vector<std::int64_t>& row, const std::vector<std::int64_t>& col,
                                        double x_features, double k_features, double ctas);
void permute_units(std::vector<int>& table, std::int64_t per_unit, const std::vector<std::int64_t>& order);
std::vector<int> one_wave_order(const std::vector<std::int64_t>& steps, std::int64_t ctas);
std::vector<int> balanced_order(const std::vector<std::int64_t>& steps, std::int64_t ctas, bool smooth);
double paced_slowdown(const std::vector<std::int64_t>& unit_steps, std::int64_t ctas, int lead, int stages);
SplitColumns split_columns(const std::vector<int>& offsets, std::int64_t max_ctas, std::int64_t block, std::int64_t bm);
std::int64_t ctas_per_sm(const TileConfig& t);
std::int64_t resident_ctas(const TileConfig& t, std::int64_t sms);

}  // namespace bsjit::generator
