// The Hopper backward-weight kernels' units (templates/bsjit/matmul_sdd_tma.cuh): row bands,
// column groups and tiles of dW, counted and built from the layout, and the choice among the
// kernels by the predicted time of their waves.
#include "matmul_plan.hpp"

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
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::generator {

RowBands row_bands(const Layout& layout, std::int64_t per, int m) {
  RowBands out;
  const auto& coords = layout.coords();  // row-major: a band's blocks are consecutive
  for (std::size_t i = 0; i < coords.size();) {
    const std::int64_t band = coords[i].first / per;
    std::map<std::int64_t, std::vector<int>> by_column;  // column → its block in each row of the band
    for (; i < coords.size() && coords[i].first / per == band; ++i) {
      auto& slots = by_column[coords[i].second];
      slots.resize(per, -1);
      slots[coords[i].first % per] = static_cast<int>(i);
    }
    for (auto it = by_column.begin(); it != by_column.end();) {
      const std::size_t unit_columns = out.columns.size() + 1, unit_blocks = out.blocks.size();
      out.columns.push_back(static_cast<int>(band));
      out.columns.resize(unit_columns + m, -1);
      out.blocks.resize(unit_blocks + per * m, -1);
      for (int s = 0; s < m && it != by_column.end(); ++s, ++it) {
        out.columns[unit_columns + s] = static_cast<int>(it->first);
        for (std::int64_t r = 0; r < per; ++r) out.blocks[unit_blocks + r * m + s] = it->second[r];
      }
      ++out.units;
    }
  }
  return out;
}

// The units of sdd_cols_kernel: each block column's blocks (rows ascending) in groups of m, the
// column's last group padded. columns: per unit, the block column, then m block rows (-1: an empty
// slot); blocks: per unit, m block indices (-1: none).
RowBands column_groups(const Layout& layout, int m) {
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, int>>> by_column;  // (row, block), rows ascending
  for (std::int64_t i = 0; i < layout.blocks(); ++i)
    by_column[layout.coords()[i].second].push_back({layout.coords()[i].first, static_cast<int>(i)});
  RowBands out;
  for (const auto& [column, blocks] : by_column)
    for (std::size_t j = 0; j < blocks.size(); j += m, ++out.units) {
      out.columns.push_back(static_cast<int>(column));
      for (std::size_t s = j; s < j + m; ++s) {
        out.columns.push_back(s < blocks.size() ? static_cast<int>(blocks[s].first) : -1);
        out.blocks.push_back(s < blocks.size() ? blocks[s].second : -1);
      }
    }
  return out;
}

// How many units column_groups(layout, m) makes, counted without its tables.
std::int64_t column_units(const Layout& layout, int m) {
  std::vector<std::int64_t> in_column(layout.cols(), 0);
  for (auto [r, c] : layout.coords()) ++in_column[c];
  std::int64_t units = 0;
  for (std::int64_t n : in_column) units += (n + m - 1) / m;
  return units;
}

// How many units row_bands(layout, per, m) makes, counted without its tables: each band's distinct
// block columns in groups of m (what the kernel choices compare).
std::int64_t band_units(const Layout& layout, std::int64_t per, int m) {
  const auto& coords = layout.coords();  // row-major: a band's blocks are consecutive
  std::int64_t units = 0;
  std::vector<std::int64_t> seen(layout.cols(), -1);  // the last band that counted the column
  for (std::size_t i = 0; i < coords.size();) {
    const std::int64_t band = coords[i].first / per;
    std::int64_t columns = 0;
    for (; i < coords.size() && coords[i].first / per == band; ++i)
      if (std::int64_t& s = seen[coords[i].second]; s != band) s = band, ++columns;
    units += (columns + m - 1) / m;
  }
  return units;
}

// Fraction of the dW tiles' block slots (rows × cols blocks a tile) that hold a block of the layout:
// the useful share of the tiled backward-weight kernel's tensor work.
double tile_fill(const Layout& layout, std::int64_t rows, std::int64_t cols) {
  const std::int64_t tile_cols = (layout.cols() + cols - 1) / cols;
  std::vector<std::int64_t> tiles;
  tiles.reserve(layout.coords().size());
  for (auto [r, c] : layout.coords()) tiles.push_back(r / rows * tile_cols + c / cols);
  std::sort(tiles.begin(), tiles.end());
  const auto count = static_cast<double>(std::unique(tiles.begin(), tiles.end()) - tiles.begin());
  return count == 0 ? 0.0 : static_cast<double>(layout.blocks()) / (count * rows * cols);
}

// Backward-weight at b ≥ 64 on Hopper: one block per CTA (sdd_tma_kernel), row groups of 2 or 4
// blocks (sdd_rows_kernel) or, at b = 128, column pairs (sdd_cols_kernel), whichever one wave of CTAs
// (SddSchedule) is predicted to finish first.
// A kernel's units run in waves of P CTAs, each wave taking the time one CTA takes for a unit; the
// units left after the full waves split along N into q pieces, which cost 1 / q of a wave and about
// 0.3 of one more (pipeline fill, partials written, the last piece adding them alone). Measured on
// the H200 (suite W sweep, N = 8192, balanced layouts; µs per wave, CTAs per wave): tma1-bm64-s4 52
// (2 per SM), rows2-tma1-s6 41.5, rows4-tma1-s4 70, tma1-bm128-s4 53, rows2-tma2-s4 (b = 128) 94.
// Row groups copy X's slice once for their blocks: b = 64, d = 0.5 / 0.25 / 0.1 / 0.05, TFLOP/s,
// tma1 / rows2 / rows4: 328 / 413 / 448, 327 / 413 / 427, 338 / 303 / 374, 243 / 254 / 211;
// b = 128, tma1 / rows2: 644 / 730, 619 / 463, 437 / 352, 323 / 264. At b = 64, bands of two block
// rows × 4 block columns holding a block in either (rows4x2-tma2-s4: 128 × 256 on two consumers,
// computed whole, the shape of b = 128's rows2 at 795 × fill) take 88 µs a wave: sweep, TFLOP/s,
// rows4x2 / rows4: d = 0.5 520 / 447 (fill 0.67), 0.25 391 / 426, 0.1 295 / 393, 0.05 196 / 221
// (half a wave). The model picks the fastest of each cell; on suite W's Bernoulli d = 0.5 layout its
// pick of the pairs (3.4 waves) ran 4% under the single rows (4.4 waves of 70 µs), within the
// model's error.
// At b = 128, pairs of a block column's blocks (sdd_cols_kernel, cols2-tma2-s4: a consumer each,
// dY's slice copied once for both) take 90 µs a wave: sweep on suite W's balanced layouts, whose
// block columns of dW hold exactly d · 32 blocks each (so pairs of a column leave no slot empty,
// where a row's pairs pad the odd rows): d = 0.5, 256 units, 2 waves, 771 TFLOP/s (tma1 678, rows2
// 630 on 266 units); d = 0.25, 128 units, one wave, 748 (tma1 641 on 2 waves, rows2 512 on 134
// units); d = 0.1 and 0.05 (64 and 32 units) 405 and 280 against tma1's 460 and 342.
double sdd_waves(std::int64_t units, std::int64_t ctas) {
  const kernels::SddSchedule s(static_cast<int>(units), static_cast<int>(ctas), INT_MAX, 8192 / 64);
  return s.waves + (s.left == 0 ? 0.0 : s.q == 1 ? 1.0 : 1.0 / s.q + 0.3);
}

MatMulSpec sdd_choice(const Layout& layout, const MatMulSpec& spec) {
  if (layout.blocks() == 0) return spec;
  struct Candidate {
    TileConfig shape;
    double wave_us;
    std::int64_t ctas;
  };
  const std::int64_t p = spec.sms;  // CTAs a wave: one an SM, two for the b = 64 blocks
  const std::vector<Candidate> candidates = spec.block == 64
                                                ? std::vector<Candidate>{{staged(tma_shape(64, 1, 4)), 52, 2 * p},
                                                                         {staged(rows_shape(2, 1, 6)), 41.5, p},
                                                                         {staged(rows_shape(4, 1, 4)), 70, p},
                                                                         {staged(rows_shape(4, 2, 4, 2)), 90, p}}
                                                : std::vector<Candidate>{{staged(tma_shape(128, 1, 4)), 53, p},
                                                                         {staged(rows_shape(2, 2, 4)), 94, p},
                                                                         {staged(cols_shape(2, 2, 4)), 90, p}};
  double best = 0;
  TileConfig chosen;
  for (const auto& c : candidates) {
    const std::int64_t m = std::max(1, c.shape.row_blocks);
    const std::int64_t units = c.shape.col_blocks > 0
                                   ? column_units(layout, c.shape.col_blocks)
                                   : band_units(layout, band_rows_of(c.shape, spec.block), static_cast<int>(m));
    const double us = c.wave_us * sdd_waves(units, c.ctas);
    if (best == 0 || us < best) best = us, chosen = c.shape;
  }
  MatMulSpec out = spec;
  out.tiles = finish_tma(spec, chosen);
  return out;
}

// Backward-weight at b ≤ 32 on Hopper: whichever is predicted to finish first, in µs at suite W's
// N = 8192 (every candidate's time grows alike with N):
// - tiles of dW computed whole (sdd_tiled_kernel), at a rate times the tiles' fill (their useful
//   share of tensor work): about 790 × fill TFLOP/s for 128 × 256 tiles on two consumers, 660 ×
//   fill for 128 × 128 on one, 335 × fill for 64 × 64 (b = 32, d = 0.1, fill 0.29: 96; b = 16,
//   d = 0.1, fill 0.12: 42). The 128 × 256 tiles copy 384 rows of X and dY a step for 2 × 64 ×
//   128 × 256 FLOP, where 128 × 128 copy 256 for half of that: 1.33 × the FLOP per byte, and
//   what a TMA box row costs bounds these kernels (docs/PERFORMANCE.md, v25). Sweep on the H200
//   (suite W's balanced layouts, 2026-11-30), TFLOP/s, 128 × 256 (s4) / 128 × 128 (s4): b = 32
//   d = 0.5 399 / 339, d = 0.25 200 / 165, d = 0.1 82 / 81; b = 16 d = 0.5 398 / 331, d = 0.25
//   199 / 166, d = 0.1 81 / 70, d = 0.05 41 / 35: 795 × fill at every cell (3 stages: 0.94 of 4);
// - row bands (sdd_rows_kernel: 64 rows × the band's columns holding a block, gathered b at a
//   time), in waves of one CTA an SM (sdd_waves), µs per wave measured on suite W's sweep (one
//   device call, 2026-11-30): b = 32, 64 × 256 (rows8-tma2-s4) 86-91, 64 × 512 (rows16-tma2-s3)
//   121-166 (150 taken); b = 16, 64 × 256 (rows16-tma2-s4, 16 dY boxes of 2 KB a step) 145-154,
//   64 × 512 (rows32-tma2-s3) 249-279 (260 taken). Their steps move 57 (64 × 512) or 51 FLOP per
//   byte from L2 at a fill of 0.35-0.65, about 480 TFLOP/s dense-equivalent at b = 32: the
//   L2-to-SM ceiling. Measured, TFLOP/s, tiled (best E) / rows8 / rows16 at b = 32: d = 0.5 322 /
//   242 / 239, d = 0.25 160 / 190 / 208, d = 0.1 101 / 162 / 196, d = 0.05 88 / 152 / 106 (69
//   units: half a wave); b = 16, tiled / rows16 / rows32: 319 / 121 / 128, 157 / 76 / 82,
//   64 / 61 / 55, 34 / 46 / 56;
// - the mma.sync kernel (one block per CTA): 75-78 TFLOP/s at b = 32, 29-31 at b = 16, whatever
//   the density.
MatMulSpec sdd_narrow_choice(const Layout& layout, const MatMulSpec& spec) {
  const int b = spec.block;
  const double flops = 2.0 * 8192 * static_cast<double>(layout.blocks()) * b * b;
  auto at = [&](double tflops) { return tflops > 0 ? flops / (tflops * 1e6) : 1e30; };  // µs
  auto waves_of = [&](int m) { return sdd_waves(band_units(layout, band_rows_of(TileConfig{}, b), m), spec.sms); };
  const double tiled128 = at(660.0 * tile_fill(layout, 128 / b, 128 / b)),
               tiled64 = at(335.0 * tile_fill(layout, 64 / b, 64 / b)),
               tiled_wide = at(790.0 * tile_fill(layout, 128 / b, 256 / b)), mma_sync = at(b == 32 ? 76.0 : 30.0);
  const double rows256 = (b == 32 ? 89.0 : 150.0) * waves_of(256 / b),
               rows512 = (b == 32 ? 150.0 : 260.0) * waves_of(512 / b);
  const double best = std::min({tiled128, tiled64, tiled_wide, mma_sync, rows256, rows512});
  MatMulSpec chosen = spec;
  if (best == tiled128) return spec;  // the default
  // staged where the shared memory fits: not the 64 × 512 bands (3 stages of 72 KB)
  if (best == tiled64)
    chosen.tiles = finish_tma(spec, staged(tiled_shape(64, 1, 4)));
  else if (best == tiled_wide)
    chosen.tiles = finish_tma(spec, staged(tiled_shape(128, 2, 4, 256)));
  else if (best == rows256)
    chosen.tiles = finish_tma(spec, staged(rows_shape(256 / b, 2, 4)));
  else if (best == rows512)
    chosen.tiles = finish_tma(spec, rows_shape(512 / b, 2, 3));
  else
    chosen.wgmma = false;  // the mma.sync kernel, the same on every target
  return chosen;
}

}  // namespace bsjit::generator
