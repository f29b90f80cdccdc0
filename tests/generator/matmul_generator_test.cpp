#include "generator/matmul_generator.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "bsjit/error.hpp"
#include "generator/matmul_plan.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::generator {
namespace {

// The values of g's table `name`, which its source must declare, sized to hold them.
std::vector<int> table(const GeneratedSource& g, const std::string& name) {
  for (const auto& t : g.tables) {
    if (t.name != name) continue;
    EXPECT_GE(capacity(t), t.values.size());
    const std::string declaration = fmt::format("extern \"C\" {{ __device__ int {}[{}]; }}", name, capacity(t));
    EXPECT_NE(g.source.find(declaration), std::string::npos) << "no " << declaration << " in\n" << g.source;
    return t.values;
  }
  ADD_FAILURE() << "no table " << name << " in " << g.label;
  return {};
}

Layout random_layout(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> m(rows * cols);
  for (auto& v : m) v = rng() % 3 == 0;
  return Layout::from_dense(rows, cols, m);
}

// Snapshot ("process replay"): a change to generated code shows up as a diff of these files.
// BSJIT_UPDATE_SNAPSHOTS=1 rewrites them.
TEST(Generator, Snapshots) {
  Layout layout = Layout::from_dense(3, 4, {1, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1});
  MatMulSpec plain{Op::backward_weight, 8, DType::f32, FeatureAxis::last};
  plain.plain = true;  // kPlain = true, "-plain"
  const MatMulSpec specs[] = {{Op::forward, 32, DType::bf16, FeatureAxis::last},
                              {Op::backward_data, 16, DType::f16, FeatureAxis::first},
                              plain};
  const bool update = std::getenv("BSJIT_UPDATE_SNAPSHOTS") != nullptr;
  for (const auto& spec : specs) {
    auto g = generate_matmul(layout, spec);
    // the source, then the tables' values that the loader copies in
    std::string snapshot = g.source + "\n// Tables:\n";
    for (const auto& t : g.tables) snapshot += fmt::format("// {}: {}\n", t.name, fmt::join(t.values, ", "));
    auto path = std::filesystem::path(BSJIT_SNAPSHOTS) / (g.label + ".cu");
    if (update) {
      std::ofstream(path) << snapshot;
      continue;
    }
    std::ifstream in(path);
    ASSERT_TRUE(in) << "missing snapshot " << path << "; run with BSJIT_UPDATE_SNAPSHOTS=1 to create it";
    std::stringstream want;
    want << in.rdbuf();
    EXPECT_EQ(snapshot, want.str()) << "generated source or tables for " << g.label << " changed; if intended, "
                                    << "rerun with BSJIT_UPDATE_SNAPSHOTS=1 and review the diff";
  }
}

// The small batch's default kernel at b = 64 (one CTA per column, not persistent) reads its column's
// LUT offsets from constant memory; the persistent kernels, and offsets past 16 KB, from global memory.
TEST(Generator, LutOffsetsInConstantMemoryOnlyForOneTilePerCta) {
  std::mt19937_64 rng(17);
  const auto storage = [](const GeneratedSource& g) {
    for (const auto& t : g.tables)
      if (t.name == "kLutOffsets") return t.storage;
    ADD_FAILURE() << "no kLutOffsets in " << g.label;
    return TableStorage::pointer;
  };
  for (std::int64_t features : {16384, 8 * 65536}) {
    const std::int64_t r = features / 64;
    // r block rows, 4 block columns, or r columns, one block in each of the r (even columns: the
    // one-CTA-per-column kernel; uneven ones run persistent, SmallBatchUnevenColumnsRunPersistent)
    std::vector<std::uint8_t> narrow_m(r * 4), wide_m(r * 4);
    for (std::int64_t i = 0; i < r; ++i) {
      const std::int64_t c = static_cast<std::int64_t>(rng() % 4);
      narrow_m[i * 4 + c] = 1, wide_m[c * r + i] = 1;
    }
    const Layout narrow = Layout::from_dense(r, 4, narrow_m), wide = Layout::from_dense(4, r, wide_m);
    for (Op op : {Op::forward, Op::backward_data}) {
      MatMulSpec spec{op, 64, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      const MatMulSpec small = variants(spec).at(1);
      MatMulSpec large = variants(spec).at(0);  // the persistent swapped TMA kernel (b = 128's default)
      for (const auto& t : tile_candidates(large))
        if (t.tma && t.persistent && t.swapped && !large.tiles) large.tiles = t;
      ASSERT_TRUE(large.tiles);
      const Layout& many = op == Op::forward ? wide : narrow;  // many output block columns
      const GeneratedSource s = generate_matmul(many, small), l = generate_matmul(many, large);
      SCOPED_TRACE(fmt::format("{} {} features: {}, {}", to_string(op), features, s.label, l.label));
      ASSERT_TRUE(s.tiles.tma && !s.persistent);
      ASSERT_TRUE(l.persistent);
      EXPECT_EQ(storage(s), features == 16384 ? TableStorage::constant : TableStorage::array);
      EXPECT_EQ(storage(l), TableStorage::array);
      if (features == 16384) {
        EXPECT_NE(s.source.find("__constant__ int kLutOffsets["), std::string::npos);
      }
    }
  }
}

// The small batch at b = 64 and 32 runs a CTA per output block column where the columns are even (4
// and 6 stages), and persistent (one wave, 8 stages) where the longest holds over 1.25 times the mean;
// the persistent small-batch kernels deal the columns longest first: CTA p, taking positions
// p, p + P, ..., gets no more than the mean share plus one column, and every column has one position.
TEST(Generator, SmallBatchUnevenColumnsRunPersistent) {
  std::mt19937_64 rng(23);
  for (int b : {32, 64})
    for (Op op : {Op::forward, Op::backward_data})
      for (int uneven = 0; uneven < 2; ++uneven) {
        SCOPED_TRACE(fmt::format("{} b{} uneven {}", to_string(op), b, uneven));
        // 16384 features at d = 0.1: every output column (a column of W forward, a row backward-data)
        // holds the same count of blocks at random places, or a Bernoulli layout
        const std::int64_t r = 16384 / b, per = r / 10;
        std::vector<std::uint8_t> m(r * r);
        std::vector<std::int64_t> idx(r);
        std::iota(idx.begin(), idx.end(), 0);
        for (std::int64_t o = 0; o < r; ++o) {
          if (uneven) {
            for (std::int64_t i = 0; i < r; ++i) m[o * r + i] = rng() % 10 == 0;
            continue;
          }
          std::shuffle(idx.begin(), idx.end(), rng);
          for (std::int64_t k = 0; k < per; ++k) (op == Op::forward ? m[idx[k] * r + o] : m[o * r + idx[k]]) = 1;
        }
        const Layout layout = Layout::from_dense(r, r, m);
        MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
        spec.wgmma = true;
        const GeneratedSource g = generate_matmul(layout, variants(spec).at(1));
        ASSERT_TRUE(g.tiles.tma && !g.tiles.split) << g.label;
        const bool persistent = uneven;
        EXPECT_EQ(g.persistent, persistent) << g.label;
        EXPECT_EQ(g.tiles.stages, uneven ? 8 : b == 64 ? 4 : 6) << g.label;
        if (!persistent) continue;
        const auto offsets = table(g, "kLutOffsets"), columns = table(g, "kOutColumns");
        const std::int64_t units = static_cast<std::int64_t>(columns.size());
        ASSERT_EQ(units, r);
        std::vector<int> seen(units, 0);
        for (int c : columns) ++seen.at(c);
        EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), units) << "every column at one position";
        const std::int64_t ctas = 132 * (227 * 1024 / g.shared_bytes);
        std::int64_t most = 0, longest = 0;
        for (std::int64_t p = 0; p < ctas; ++p) {
          std::int64_t load = 0;
          for (std::int64_t at = p; at < units; at += ctas) load += offsets[at + 1] - offsets[at];
          most = std::max(most, load);
        }
        for (std::int64_t at = 0; at < units; ++at)
          longest = std::max<std::int64_t>(longest, offsets[at + 1] - offsets[at]);
        const double mean = static_cast<double>(layout.blocks()) / static_cast<double>(std::min(ctas, units));
        EXPECT_LE(static_cast<double>(most), mean + static_cast<double>(longest)) << g.label;
        if (ctas < units) {  // two columns a CTA or more: the shares even out to within a column's
          EXPECT_LE(static_cast<double>(most), 1.1 * mean) << g.label;
        }
      }
}

// The small batch's split columns (TileConfig::split, a tuning candidate on Hopper): the CTAs' items cover
// every column's LUT entries once, whole or in pieces that follow each other in piece order (the
// pieces of a column agree on its split, planes and count); no CTA takes much more than the mean
// share, as a CTA per column did; layouts of one shape share one source.
TEST(Generator, SmallBatchSplitsLongColumns) {
  std::mt19937_64 rng(91);
  for (int b : {32, 64, 128})
    for (Op op : {Op::forward, Op::backward_data}) {
      SCOPED_TRACE(fmt::format("{} b{}", to_string(op), b));
      // 16384 features: a suite-small layout at d = 0.1 (Bernoulli), then the same with one column and
      // one row holding every block
      const std::int64_t r = 16384 / b;
      std::vector<std::uint8_t> m(r * r);
      for (auto& v : m) v = rng() % 10 == 0;
      for (int full = 0; full < 2; ++full) {
        if (full)
          for (std::int64_t i = 0; i < r; ++i) m[i * r + 3] = 1, m[5 * r + i] = 1;
        const Layout layout = Layout::from_dense(r, r, m);
        MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
        spec.wgmma = true;
        const auto v = variants(spec);
        ASSERT_EQ(v.size(), 2u);
        MatMulSpec small = v[1];  // a split shape (a tuning candidate of the small batch)
        for (const auto& t : tile_candidates(small))
          if (t.split && !small.tiles) small.tiles = t;
        ASSERT_TRUE(small.tiles);
        const GeneratedSource g = generate_matmul(layout, small);
        ASSERT_TRUE(g.tiles.split && g.split && g.persistent) << g.label;
        EXPECT_NE(g.source.find("kSplit = true"), std::string::npos);
        EXPECT_EQ(g.max_rows, kSmallBatchRows);
        const auto offsets = table(g, "kLutOffsets"), cta_items = table(g, "kCtaItems"), items = table(g, "kItems");
        const int planes = table(g, "kSplitPlanes").at(0);
        const std::int64_t columns = static_cast<std::int64_t>(offsets.size()) - 1, total = offsets.back();
        ASSERT_GE(g.grid_x, std::min<std::int64_t>(columns, static_cast<std::int64_t>(cta_items.size()) - 1));
        ASSERT_LT(g.grid_x, static_cast<std::int64_t>(cta_items.size()));
        std::vector<int> covered(total, 0);
        std::map<int, std::vector<std::array<int, 5>>> pieces;  // column → (piece, begin, end, split, first plane)
        std::int64_t most = 0;
        const int max_ctas = static_cast<int>(cta_items.size()) - 1;
        std::vector<int> real;  // the items' indices: CTA p's first at p, its others from cta_items[p]
        for (std::int64_t p = 0; p < g.grid_x; ++p) {
          std::int64_t load = 0;
          std::vector<int> mine{static_cast<int>(p)};
          for (int i = cta_items[p]; i < cta_items[p + 1]; ++i) mine.push_back(i);
          if (p == 0) {
            EXPECT_EQ(cta_items[0], max_ctas) << "the CTAs' other items after every CTA's first";
          }
          bool whole_seen = false;
          for (int i : mine) {
            real.push_back(i);
            const int* e = items.data() + 8 * i;
            const int pos = e[0], begin = e[1], end = e[2], split = e[3];
            ASSERT_TRUE(pos >= 0 && pos < columns && begin >= offsets[pos] && end <= offsets[pos + 1] && begin <= end);
            for (int k = begin; k < end; ++k) ++covered[k];
            load += end - begin;
            if (split < 0) {
              EXPECT_TRUE(begin == offsets[pos] && end == offsets[pos + 1]) << "a whole column";
              whole_seen = true;
            } else {
              EXPECT_FALSE(whole_seen) << "a CTA's pieces before its whole columns";
              pieces[pos].push_back({e[5], begin, end, split, e[4]});
            }
          }
          most = std::max(most, load);
        }
        for (int k = 0; k < total; ++k) ASSERT_EQ(covered[k], 1) << "entry " << k;
        // a split column's pieces: 0 .. q - 1, each starting where the one before ends, one split
        // and one first plane for all; the splits numbered 0, 1, ..., their planes one after another
        int next_plane = 0;
        std::set<int> splits;
        std::vector<std::pair<int, std::vector<std::array<int, 5>>>> by_plane;
        for (auto& [pos, ps] : pieces) by_plane.push_back({ps[0][4], ps});
        std::sort(by_plane.begin(), by_plane.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
        for (auto& [first_plane, ps] : by_plane) {
          std::sort(ps.begin(), ps.end());
          EXPECT_GE(ps.size(), 2u);
          EXPECT_EQ(first_plane, next_plane);
          next_plane += static_cast<int>(ps.size());
          int at = -1;
          for (std::size_t i = 0; i < ps.size(); ++i) {
            EXPECT_EQ(ps[i][0], static_cast<int>(i));
            if (i > 0) {
              EXPECT_EQ(ps[i][1], at) << "pieces in order";
            }
            at = ps[i][2];
            EXPECT_EQ(ps[i][3], ps[0][3]);
            EXPECT_EQ(ps[i][4], first_plane);
          }
          splits.insert(ps[0][3]);
        }
        for (int i : real)
          if (items[8 * i + 3] >= 0) {
            EXPECT_EQ(items[8 * i + 6], static_cast<int>(pieces[items[8 * i]].size())) << "each piece knows the count";
          }
        EXPECT_EQ(next_plane, planes);
        EXPECT_EQ(static_cast<int>(splits.size()), splits.empty() ? 0 : *splits.rbegin() + 1);
        EXPECT_EQ(g.workspace_bytes > 0, planes > 0);
        // the busiest CTA against the mean share and against one CTA per column
        std::int64_t widest = 0;
        for (std::int64_t j = 0; j < columns; ++j) widest = std::max<std::int64_t>(widest, offsets[j + 1] - offsets[j]);
        const double mean = static_cast<double>(total) / static_cast<double>(g.grid_x);
        EXPECT_LE(static_cast<double>(most), 1.3 * mean + 1) << "balanced";
        if (full) {
          EXPECT_GT(planes, 0) << "the full column is cut";
          EXPECT_LT(most, widest) << "no CTA waits out the full column";
        }
        // a permutation of the columns: the same source
        std::vector<std::pair<std::int64_t, std::int64_t>> moved;
        for (const auto& [rr, c] : layout.coords()) moved.push_back({rr, (c + 7) % r});
        EXPECT_EQ(generate_matmul(Layout::from_coords(r, r, moved), small).source, g.source);
      }
    }
}

// The lookup tables, which the generated source declares, describe exactly the layout.
TEST(Generator, TablesRebuildTheLayout) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    Layout layout = random_layout(1 + seed % 7, 1 + seed % 5 + seed % 3, seed);
    // the mma.sync kernel (columns in order) and the persistent TMA kernel (a balanced order)
    for (auto [op, hopper] : {std::pair{Op::forward, false}, {Op::backward_data, false}, {Op::forward, true},
                              {Op::backward_data, true}}) {
      MatMulSpec spec{op, hopper ? 128 : 16, DType::bf16, FeatureAxis::last};
      spec.wgmma = hopper;
      auto g = generate_matmul(layout, spec);
      ASSERT_EQ(g.tiles.persistent, hopper);
      auto offsets = table(g, "kLutOffsets"), lut = table(g, "kLut");
      auto columns = table(g, "kOutColumns");
      const std::int64_t out_blocks = op == Op::forward ? layout.cols() : layout.rows();
      ASSERT_EQ(static_cast<std::int64_t>(offsets.size()), out_blocks + 1);
      ASSERT_EQ(static_cast<std::int64_t>(columns.size()), out_blocks);
      ASSERT_EQ(g.grid_x, out_blocks);
      std::vector<int> sorted = columns, identity(out_blocks);
      std::sort(sorted.begin(), sorted.end());
      std::iota(identity.begin(), identity.end(), 0);
      EXPECT_EQ(sorted, identity) << "every output column at one position";
      if (!hopper) {
        EXPECT_EQ(columns, identity) << "in order";
      }
      std::vector<std::pair<std::int64_t, std::int64_t>> coords;
      for (std::int64_t j = 0; j < out_blocks; ++j)
        for (int e = offsets[j]; e < offsets[j + 1]; ++e) {
          int in = lut[2 * e], w = lut[2 * e + 1];
          const std::int64_t out = columns[j];
          auto rc = op == Op::forward ? std::pair<std::int64_t, std::int64_t>{in, out}
                                      : std::pair<std::int64_t, std::int64_t>{out, in};
          EXPECT_EQ(layout.block_index(rc.first, rc.second), w) << "seed " << seed;
          if (e > offsets[j]) {
            EXPECT_LT(lut[2 * (e - 1)], in) << "input blocks ascending";
          }
          coords.push_back(rc);
        }
      EXPECT_EQ(Layout::from_coords(layout.rows(), layout.cols(), coords), layout) << "seed " << seed;
    }
    auto g = generate_matmul(layout, {Op::backward_weight, 16, DType::bf16, FeatureAxis::last});
    auto coords = table(g, "kCoords");
    ASSERT_EQ(static_cast<std::int64_t>(coords.size()), 2 * std::max<std::int64_t>(layout.blocks(), 0) +
                                                             (layout.blocks() == 0 ? 1 : 0));
    for (std::int64_t b = 0; b < layout.blocks(); ++b)
      EXPECT_EQ(layout.block_coord(b), (std::pair<std::int64_t, std::int64_t>{coords[2 * b], coords[2 * b + 1]}));
  }
}

// Backward-weight's schedule on Hopper (SddSchedule, shared by the kernels and the generator): over
// every CTA's items, each step of each unit runs exactly once; a split unit's pieces have distinct
// indices below q, their planes and counters inside the workspace sdd_planes sizes; and the last
// wave takes 1 / q of a unit.
TEST(SddSchedule, EveryStepOnceInTheWorkspace) {
  int pieced = 0;
  for (int ctas : {7, 100, 132, 264})
    for (int units = 1; units <= 3 * ctas + 5; units += units < 40 ? 1 : 7)
      for (int steps : {1, 2, 5, 16, 65, 128}) {
        SCOPED_TRACE(fmt::format("{} units on {} CTAs, {} steps", units, ctas, steps));
        const int planes = static_cast<int>(sdd_planes(units, ctas));
        const kernels::SddSchedule s(units, ctas, planes, steps);
        std::vector<std::vector<int>> runs(units, std::vector<int>(steps, 0));
        std::vector<std::set<int>> pieces(units);
        int makespan = 0;
        for (int p = 0; p < ctas; ++p) {
          int work = 0;
          for (int i = 0; i < s.items(p); ++i) {
            const kernels::SddItem item = s.item(p, i);
            ASSERT_GE(item.unit, 0);
            ASSERT_LT(item.unit, units);
            ASSERT_LE(0, item.first);
            ASSERT_LE(item.first, item.last);
            ASSERT_LE(item.last, steps);
            for (int k = item.first; k < item.last; ++k) ++runs[item.unit][k];
            work += item.last - item.first;
            if (item.piece < 0) {
              EXPECT_EQ(item.last - item.first, steps) << "a whole unit";
              continue;
            }
            EXPECT_LT(item.piece, s.q);
            EXPECT_TRUE(pieces[item.unit].insert(item.piece).second) << "a piece index once per unit";
            const int leftover = s.leftover(item);
            EXPECT_GE(leftover, 0);
            EXPECT_LT(leftover, s.left);
            EXPECT_LT(leftover * s.q + item.piece, planes) << "its plane in the workspace";
            EXPECT_LT(leftover, planes) << "its counter in the workspace";
          }
          makespan = std::max(makespan, work);
        }
        for (int u = 0; u < units; ++u)
          for (int k = 0; k < steps; ++k) ASSERT_EQ(runs[u][k], 1) << "unit " << u << " step " << k;
        for (int u = 0; u < units; ++u) {
          if (!pieces[u].empty()) {
            EXPECT_EQ(static_cast<int>(pieces[u].size()), s.q) << "every piece of a split unit";
          }
        }
        const int left = units % ctas;
        if (left == 0) {
          EXPECT_EQ(makespan, s.waves * steps);
        } else if (s.q > 1) {
          ++pieced;
          EXPECT_EQ(s.q, std::min({kernels::SddSchedule::kMaxPieces, ctas / left, steps}));
          EXPECT_EQ(makespan, s.waves * steps + (steps + s.q - 1) / s.q);
        } else {
          EXPECT_TRUE(2 * left > ctas || steps == 1);
          EXPECT_EQ(makespan, (s.waves + 1) * steps);
        }
      }
  EXPECT_GT(pieced, 100);
  // Suite W's balanced b = 128 layouts at d = 0.1 and 0.05, N = 8192: 96 blocks on 132 CTAs whole
  // (no workspace); 64 in halves
  EXPECT_EQ(kernels::SddSchedule(96, 132, static_cast<int>(sdd_planes(96, 132)), 128).q, 1);
  const kernels::SddSchedule halves(64, 132, static_cast<int>(sdd_planes(64, 132)), 128);
  EXPECT_EQ(halves.q, 2);
  EXPECT_EQ(halves.item(100, 0).first, 64);
  // a workspace too small for the pieces: fewer
  EXPECT_EQ(kernels::SddSchedule(64, 132, 64, 128).q, 1);
  EXPECT_EQ(kernels::SddSchedule(20, 132, 100, 128).q, 5);
}

// The workspace is what the schedule needs on the largest grid that needs the most: every grid up
// to max_ctas fits in it and one fills it.
TEST(SddSchedule, WorkspaceIsTheMostAnyGridNeeds) {
  for (int units : {1, 5, 64, 96, 100, 131, 133, 200, 1000}) {
    const int planes = static_cast<int>(sdd_planes(units, 144));
    int most = 0;
    for (int p = 1; p <= 144; ++p) {
      const kernels::SddSchedule s(units, p, planes, 8192 / 64);
      const kernels::SddSchedule unlimited(units, p, 1 << 30, 1 << 30);
      EXPECT_EQ(s.q, unlimited.q) << units << " units on " << p;
      most = std::max(most, s.planes());
    }
    EXPECT_EQ(most, planes) << units << " units";
  }
  EXPECT_EQ(sdd_planes(64, 132), 128);  // P = 128 .. 132: halves of 64
  EXPECT_EQ(sdd_planes(0, 132), 0);
}

// A Hopper backward-weight kernel is built with split support (planes, kSplit) only where the
// schedule splits on 132 SMs: b = 128's one CTA an SM takes 100 or 132 blocks whole (one wave, no
// workspace, kSplit false) and splits the last wave of 60, 140 or 300 (kSplit true, planes for up
// to 144 SMs). On any grid a kernel without planes takes every unit whole.
TEST(SddSchedule, SplitSupportOnlyWhereTheH200Splits) {
  EXPECT_EQ(sdd_kernel_planes(100, 1), 0);
  EXPECT_EQ(sdd_kernel_planes(132, 1), 0);
  EXPECT_EQ(sdd_kernel_planes(0, 1), 0);
  EXPECT_EQ(sdd_kernel_planes(60, 1), sdd_planes(60, 144));
  EXPECT_EQ(sdd_kernel_planes(140, 1), sdd_planes(140, 144));
  EXPECT_GT(sdd_kernel_planes(140, 1), 0);
  EXPECT_EQ(sdd_kernel_planes(200, 2), 0);  // 264 CTAs: 200 whole
  EXPECT_GT(sdd_kernel_planes(100, 2), 0);  // 264 CTAs: pieces of 2
  for (int p = 1; p <= 144; ++p) EXPECT_EQ(kernels::SddSchedule(100, p, 0, 128).q, 1) << p << " CTAs";
  for (int blocks : {60, 100, 132, 140, 300}) {
    std::vector<std::pair<std::int64_t, std::int64_t>> coords;
    for (int i = 0; i < blocks; ++i) coords.push_back({i / 20, i % 20});
    const Layout layout = Layout::from_coords(20, 20, coords);
    MatMulSpec spec{Op::backward_weight, 128, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    const auto g = generate_matmul(layout, spec);
    SCOPED_TRACE(fmt::format("{} blocks, {}", blocks, g.label));
    ASSERT_TRUE(g.tiles.tma);
    const int per_sm = std::max(1, 227 * 1024 / g.shared_bytes);
    const auto counts = table(g, "kCounts");
    ASSERT_EQ(counts.size(), 2u);
    const bool split = counts[1] > 0;
    EXPECT_EQ(split, kernels::SddSchedule(counts[0], 132 * per_sm, 1 << 30, 1 << 30).q > 1);
    EXPECT_EQ(counts[1], sdd_kernel_planes(counts[0], per_sm));
    EXPECT_NE(g.source.find(split ? "kSplit = true" : "kSplit = false"), std::string::npos);
    // the counters alone where nothing splits (WaveGate's), partial planes after them where it does
    EXPECT_EQ(g.workspace_bytes > kernels::kSplitCounters * 4, split);
    if (blocks == 100 || blocks == 132) {
      EXPECT_FALSE(split);
    }
    if (blocks == 60 || blocks == 140) {
      EXPECT_TRUE(split);
    }
  }
}

// The persistent TMA kernel's column order: CTA p of the 132 an H200 holds takes tiles p, p + 132,
// ..., so with 32 output block columns it meets the positions of one class p mod 4 (96 columns: 12
// classes of 8). Columns 0, 3 and 5 of every 8 holding 8 blocks and the others 1 would load the
// classes unevenly in order; the balanced order gives every class the same steps (three long
// columns of its 8).
TEST(Generator, PersistentColumnsBalancedOverTheCtas) {
  const auto is_long = [](std::int64_t c) { return c % 8 == 0 || c % 8 == 3 || c % 8 == 5; };
  for (int units : {32, 96}) {
    std::vector<std::pair<std::int64_t, std::int64_t>> blocks;
    for (std::int64_t c = 0; c < units; ++c)
      for (std::int64_t r = 0; r < (is_long(c) ? 8 : 1); ++r) blocks.push_back({(c + 3 * r) % 32, c});
    MatMulSpec spec{Op::forward, 128, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    const auto g = generate_matmul(Layout::from_coords(32, units, blocks), spec);
    ASSERT_TRUE(g.tiles.persistent);
    const auto offsets = table(g, "kLutOffsets"), columns = table(g, "kOutColumns");
    const int classes = std::gcd(132, units);
    ASSERT_EQ(units / classes, 8);
    std::vector<int> per_class(classes, 0), long_columns(classes, 0);
    for (int j = 0; j < units; ++j) {
      const int entries = offsets[j + 1] - offsets[j];
      EXPECT_EQ(entries, is_long(columns[j]) ? 8 : 1) << "position " << j << " holds column " << columns[j];
      per_class[j % classes] += entries;
      long_columns[j % classes] += entries == 8;
    }
    EXPECT_EQ(per_class, (std::vector<int>(classes, 3 * 8 + 5)));
    EXPECT_EQ(long_columns, (std::vector<int>(classes, 3)));
    // Each CTA goes round its class's 8 positions from its own phase (with 96 columns, 3 positions
    // on at each tile), so the cycle keeps its running work near the line: after i tiles no CTA is
    // off i / 8 of the class's 29 steps by more than one long column (6.1 at most for 1, 8, 1, 8, 1,
    // 1, 8, 1). Most steps first, a CTA meeting the three long columns first is off by 24 - 3 · 29 / 8.
    for (int p = 0; p < 132; ++p) {
      int sum = 0;
      for (int i = 1; i < 8; ++i) {
        const int j = (p + 132 * (i - 1)) % units;
        sum += offsets[j + 1] - offsets[j];
        EXPECT_LE(std::abs(sum - 29.0 * i / 8), 8.0) << units << " columns, CTA " << p << " after " << i << " tiles";
      }
    }
  }
}

// The schedules follow the SM count they are planned for (MatMulSpec::sms): on 114 SMs the
// persistent order balances the classes CTA p mod gcd(114, columns) meets, the label says the
// count, and backward-weight splits where 114 SMs leave a last wave (130 blocks of 128: one wave on
// 132, 1 and 16 on 114). A kernel planned for any count covers every step once on any grid.
TEST(Generator, SchedulesFollowTheSmCount) {
  const auto is_long = [](std::int64_t c) { return c % 8 == 0 || c % 8 == 3 || c % 8 == 5; };
  std::vector<std::pair<std::int64_t, std::int64_t>> blocks;
  const int units = 96;
  for (std::int64_t c = 0; c < units; ++c)
    for (std::int64_t r = 0; r < (is_long(c) ? 8 : 1); ++r) blocks.push_back({(c + 3 * r) % 32, c});
  const Layout layout = Layout::from_coords(32, units, blocks);
  MatMulSpec spec{Op::forward, 128, DType::bf16, FeatureAxis::last};
  spec.wgmma = true;
  const auto h200 = generate_matmul(layout, spec);
  spec.sms = 114;
  const auto pcie = generate_matmul(layout, spec);
  ASSERT_TRUE(pcie.tiles.persistent);
  EXPECT_NE(pcie.source, h200.source);
  EXPECT_EQ(pcie.label, h200.label + "-sm114");
  const auto offsets = table(pcie, "kLutOffsets");
  const int classes = std::gcd(114, units);
  std::vector<int> per_class(classes, 0);
  for (int j = 0; j < units; ++j) per_class[j % classes] += offsets[j + 1] - offsets[j];
  EXPECT_EQ(per_class, (std::vector<int>(classes, (36 * 8 + 60) / classes)));

  EXPECT_EQ(sdd_kernel_planes(130, 1), 0);
  const auto planes = sdd_kernel_planes(130, 1, 114);
  EXPECT_GT(planes, 0);
  for (int ctas : {78, 114, 132, 144}) {
    const kernels::SddSchedule s(130, ctas, static_cast<int>(planes), 128);
    std::vector<int> runs(130 * 128, 0);
    for (int p = 0; p < ctas; ++p)
      for (int i = 0; i < s.items(p); ++i) {
        const kernels::SddItem item = s.item(p, i);
        for (int k = item.first; k < item.last; ++k) ++runs[item.unit * 128 + k];
        if (item.piece >= 0) {
          EXPECT_LT(s.leftover(item) * s.q + item.piece, planes) << ctas << " CTAs";
        }
      }
    EXPECT_EQ(std::count(runs.begin(), runs.end(), 1), 130 * 128) << ctas << " CTAs";
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;
  for (int i = 0; i < 130; ++i) coords.push_back({i / 20, i % 20});
  MatMulSpec dw{Op::backward_weight, 128, DType::bf16, FeatureAxis::last};
  dw.wgmma = true;
  EXPECT_NE(generate_matmul(Layout::from_coords(20, 20, coords), dw).source.find("kSplit = false"), std::string::npos);
  dw.sms = 114;
  EXPECT_NE(generate_matmul(Layout::from_coords(20, 20, coords), dw).source.find("kSplit = true"), std::string::npos);
}

// The grouped kernel's tables (templates/bsjit/matmul_grouped.cuh): each group's steps are the
// chunks of 64 reduction indices holding a block of its columns, in three classes (blocks of both
// consumers' columns, of the first consumer's only, of the second's only), chunks ascending within
// a class; a step's pattern and slots name exactly the W blocks of the chunk in the group's columns,
// and together the steps rebuild the layout.
TEST(Generator, GroupedTablesRebuildTheLayout) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    Layout layout = random_layout(1 + seed % 7 + seed % 4, 1 + seed % 9 + seed % 3, seed);
    for (Op op : {Op::forward, Op::backward_data})
      for (int b : {16, 32})
        for (int warpgroups : {1, 2}) {
          MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
          spec.wgmma = true;
          TileConfig t;
          t.wgmma = t.tma = t.persistent = true, t.bm = 128, t.warps_m = warpgroups, t.columns = 1, t.stages = 4;
          spec.tiles = t;
          auto g = generate_matmul(layout, spec);
          const int sub = 64 / b, columns = warpgroups * sub, per = sub, record = 2 + sub * columns;
          SCOPED_TRACE(fmt::format("seed {} {} b{} columns {}", seed, to_string(op), b, columns));
          ASSERT_EQ(g.tiles.columns, columns);
          auto bounds = table(g, "kGroupSteps"), steps = table(g, "kSteps");
          auto group_columns = table(g, "kGroupColumns");
          const std::int64_t out_blocks = op == Op::forward ? layout.cols() : layout.rows();
          const int groups = static_cast<int>((out_blocks + columns - 1) / columns);
          ASSERT_EQ(g.grid_x, groups);
          ASSERT_EQ(static_cast<int>(bounds.size()), 3 * groups + 1);
          ASSERT_EQ(static_cast<int>(group_columns.size()), groups * columns);
          std::vector<std::pair<std::int64_t, std::int64_t>> coords;
          // every column in one group; -1 only at the end of one short group (the groups in
          // balanced_order, so not necessarily the last)
          std::vector<int> seen(out_blocks, 0);
          int padding = 0, computed = 0, filled = 0;  // sub-blocks a consumer computes, those with its blocks
          for (int i = 0; i < groups * columns; ++i) {
            if (group_columns[i] < 0) {
              ++padding;
              if (i % columns + 1 < columns) {
                EXPECT_LT(group_columns[i + 1], 0) << "padding at a group's end";
              }
              continue;
            }
            ASSERT_LT(group_columns[i], out_blocks);
            ++seen[group_columns[i]];
          }
          EXPECT_EQ(padding, groups * columns - out_blocks);
          for (int c = 0; c < out_blocks; ++c) EXPECT_EQ(seen[c], 1) << "column " << c;
          for (int gi = 0; gi < groups; ++gi) {
            EXPECT_EQ(group_columns[gi * columns], *std::min_element(group_columns.begin() + gi * columns,
                                                                     group_columns.begin() + (gi + 1) * columns,
                                                                     [](int x, int y) { return x >= 0 && (y < 0 || x < y); }))
                << "a group starts at its lowest column";
            for (int cls = 0; cls < 3; ++cls)
              for (int s = bounds[3 * gi + cls]; s < bounds[3 * gi + cls + 1]; ++s) {
                const int chunk = steps[record * s];
                const unsigned pattern = static_cast<unsigned>(steps[record * s + 1]);
                if (s > bounds[3 * gi + cls]) {
                  EXPECT_LT(steps[record * (s - 1)], chunk) << "chunks ascending within a class";
                }
                bool held[2] = {false, false};
                for (int j = 0; j < sub; ++j)
                  for (int c = 0; c < columns; ++c) {
                    const std::int64_t col = group_columns[gi * columns + c], in = chunk * sub + j;
                    const auto rc = op == Op::forward ? std::pair<std::int64_t, std::int64_t>{in, col}
                                                      : std::pair<std::int64_t, std::int64_t>{col, in};
                    const bool inside = col >= 0 && in < (op == Op::forward ? layout.rows() : layout.cols());
                    if ((pattern >> (j * columns + c)) & 1) {
                      ASSERT_TRUE(inside);
                      EXPECT_EQ(layout.block_index(rc.first, rc.second), steps[record * s + 2 + j * columns + c]);
                      coords.push_back(rc);
                      held[c / per] = true;
                    } else if (inside) {
                      EXPECT_EQ(layout.block_index(rc.first, rc.second), -1) << "a pattern names every block of its chunk";
                    }
                  }
                EXPECT_EQ(cls, held[0] && held[1] ? 0 : held[0] ? 1 : 2) << "the class says whose blocks the step holds";
                for (int h = 0; h < warpgroups; ++h) {
                  if (cls != 0 && cls != 1 + h) continue;  // consumer h computes classes 0 and 1 + h
                  for (int j = 0; j < sub; ++j, ++computed)
                    filled += ((pattern >> (j * columns + h * per)) & ((1u << per) - 1)) != 0;
                }
              }
          }
          // the consumers skip the sub-blocks without their blocks where under 0.9 hold them
          const bool skip = computed > 0 && filled < 0.9 * computed;
          EXPECT_NE(g.source.find(skip ? "kSkipEmpty = true" : "kSkipEmpty = false"), std::string::npos)
              << filled << " of " << computed;
          EXPECT_EQ(bounds.back() * record, layout.blocks() == 0 ? 0 : static_cast<int>(steps.size()));
          EXPECT_EQ(Layout::from_coords(layout.rows(), layout.cols(), coords), layout);
        }
  }
}

// The paired kernel's tables (templates/bsjit/matmul_paired.cuh): every output block column in
// exactly one pair, a pair's steps the input blocks of its two columns in three classes (both, the
// first's only, the second's only), ascending within a class, naming the W blocks exactly; the steps
// rebuild the layout; column 0's partner shares the most input blocks with it (the pairs in
// balanced_order).
TEST(Generator, PairedTablesRebuildTheLayout) {
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    Layout layout = random_layout(1 + seed % 7 + seed % 4, 1 + seed % 9 + seed % 3, seed);
    for (Op op : {Op::forward, Op::backward_data}) {
      MatMulSpec spec{op, 64, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      TileConfig t;
      t.paired = true, t.bm = 256, t.warps_m = 2, t.stages = 4;
      spec.tiles = t;
      auto g = generate_matmul(layout, spec);
      SCOPED_TRACE(fmt::format("seed {} {}", seed, to_string(op)));
      EXPECT_NE(g.name_expression.find("dsd_paired_kernel"), std::string::npos);
      EXPECT_EQ(tiles_tag(g.tiles), "pair2-bm256-s4");
      auto bounds = table(g, "kGroupSteps"), steps = table(g, "kSteps");
      auto pair_columns = table(g, "kGroupColumns");
      const bool fwd = op == Op::forward;
      const std::int64_t out_blocks = fwd ? layout.cols() : layout.rows();
      const int pairs = static_cast<int>((out_blocks + 1) / 2);
      ASSERT_EQ(g.grid_x, pairs);
      ASSERT_EQ(static_cast<int>(bounds.size()), 3 * pairs + 1);
      ASSERT_EQ(static_cast<int>(pair_columns.size()), 2 * pairs);
      std::vector<int> seen(out_blocks, 0);
      for (int i = 0; i < 2 * pairs; ++i) {
        if (pair_columns[i] < 0) {  // the pairs in balanced_order: the short one anywhere
          EXPECT_TRUE(i % 2 == 1 && out_blocks % 2 == 1) << "only an odd column count leaves a column alone";
          continue;
        }
        ASSERT_LT(pair_columns[i], out_blocks);
        ++seen[pair_columns[i]];
      }
      for (int c = 0; c < out_blocks; ++c) EXPECT_EQ(seen[c], 1) << "column " << c;
      auto inputs_of = [&](std::int64_t col) {
        std::set<std::int64_t> in;
        for (std::int64_t i = 0; i < (fwd ? layout.rows() : layout.cols()); ++i)
          if (layout.block_index(fwd ? i : col, fwd ? col : i) >= 0) in.insert(i);
        return in;
      };
      auto shared = [&](std::int64_t x, std::int64_t y) {
        int count = 0;
        for (auto i : inputs_of(x)) count += inputs_of(y).count(i) > 0;
        return count;
      };
      if (out_blocks > 1) {
        const int at = static_cast<int>(std::find(pair_columns.begin(), pair_columns.end(), 0) - pair_columns.begin());
        ASSERT_EQ(at % 2, 0) << "column 0 first in its pair";
        for (int c = 1; c < out_blocks; ++c) EXPECT_LE(shared(0, c), shared(0, pair_columns[at + 1])) << "column " << c;
      }
      std::vector<std::pair<std::int64_t, std::int64_t>> coords;
      for (int p = 0; p < pairs; ++p)
        for (int cls = 0; cls < 3; ++cls)
          for (int s = bounds[3 * p + cls]; s < bounds[3 * p + cls + 1]; ++s) {
            const int in = steps[4 * s], pattern = steps[4 * s + 1];
            if (s > bounds[3 * p + cls]) {
              EXPECT_LT(steps[4 * (s - 1)], in) << "input blocks ascending within a class";
            }
            EXPECT_EQ(cls, pattern == 3 ? 0 : pattern == 1 ? 1 : 2) << "the class says whose blocks the step holds";
            for (int c = 0; c < 2; ++c) {
              const std::int64_t col = pair_columns[2 * p + c];
              const bool held = (pattern >> c) & 1;
              if (col < 0) {
                EXPECT_FALSE(held);
                continue;
              }
              const auto rc = fwd ? std::pair<std::int64_t, std::int64_t>{in, col}
                                  : std::pair<std::int64_t, std::int64_t>{col, in};
              EXPECT_EQ(layout.block_index(rc.first, rc.second), held ? steps[4 * s + 2 + c] : -1);
              if (held) coords.push_back(rc);
            }
          }
      EXPECT_EQ(Layout::from_coords(layout.rows(), layout.cols(), coords), layout);
    }
  }
}

// Columns with the same input blocks end up paired, and their steps all hold both blocks.
TEST(Generator, PairsColumnsThatShareInputBlocks) {
  // columns 0 and 3, 1 and 5, 2 and 4 hold the same block rows
  const Layout layout = Layout::from_dense(4, 6, {1, 0, 1, 1, 1, 0,  //
                                                  0, 1, 0, 0, 0, 1,  //
                                                  1, 1, 0, 1, 0, 1,  //
                                                  0, 0, 1, 0, 1, 0});
  MatMulSpec spec{Op::forward, 64, DType::bf16, FeatureAxis::last};
  spec.wgmma = true;
  TileConfig t;
  t.paired = true, t.bm = 128, t.warps_m = 1, t.stages = 6;
  spec.tiles = t;
  auto g = generate_matmul(layout, spec);
  EXPECT_EQ(table(g, "kGroupColumns"), (std::vector<int>{0, 3, 1, 5, 2, 4}));
  EXPECT_EQ(table(g, "kGroupSteps"), (std::vector<int>{0, 2, 2, 2, 4, 4, 4, 6, 6, 6}));
  EXPECT_EQ(table(g, "kCounts"), (std::vector<int>{3}));  // pairs
  const auto steps = table(g, "kSteps");
  for (std::size_t s = 0; s < steps.size() / 4; ++s) EXPECT_EQ(steps[4 * s + 1], 3);
}

// The layout decides whether b = 64's forward pairs output block columns (at least 0.4 of the
// blocks in steps holding both columns' blocks); backward-data always pairs; not at b = 128 nor for
// small batches.
TEST(Generator, PairsColumnsWhereTheyShareEnough) {
  std::vector<std::uint8_t> ones(16, 1), diagonal(16, 0);
  for (int i = 0; i < 4; ++i) diagonal[5 * i] = 1;
  const Layout full = Layout::from_dense(4, 4, ones), diag = Layout::from_dense(4, 4, diagonal);
  for (int b : {64, 128})
    for (Op op : {Op::forward, Op::backward_data})
      for (bool small : {false, true}) {
        MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
        spec.wgmma = true, spec.small_batch = small;
        SCOPED_TRACE(fmt::format("{} b{} small {}", to_string(op), b, small));
        const bool pairs = b == 64 && !small;
        EXPECT_EQ(generate_matmul(full, spec).tiles.paired, pairs);
        EXPECT_EQ(generate_matmul(diag, spec).tiles.paired, pairs && op == Op::backward_data);
        spec.wgmma = false;
        EXPECT_FALSE(generate_matmul(full, spec).tiles.paired) << "sm_80 and plain sm_90 have no wgmma";
      }
  // an explicit shape (a tuning record) is taken as it is
  MatMulSpec spec{Op::forward, 64, DType::bf16, FeatureAxis::last};
  spec.wgmma = true;
  spec.tiles = tile_candidates(spec).front();
  EXPECT_FALSE(generate_matmul(full, spec).tiles.paired);
}

// At b = 32 the layout decides between the grouped kernel and the unswapped TMA kernel: the grouped
// one where its steps (chunks of two input blocks holding a block of any of a group's 4 columns)
// number at most 0.7 per block; b = 16 keeps the grouped kernel.
TEST(Generator, GroupedOrTmaByStepsPerBlock) {
  // one block per output block column, each in a chunk of its own (forward: blocks (2c, c) of a 32 × 16
  // layout; backward-data: the transpose), so that no grouping shares a chunk: one step per block
  std::vector<std::pair<std::int64_t, std::int64_t>> fwd, bwd;
  for (int c = 0; c < 16; ++c) fwd.emplace_back(2 * c, c), bwd.emplace_back(c, 2 * c);
  // the same with the chunk's second block in columns 0-7: 16 steps for 24 blocks (0.67 per block)
  std::vector<std::pair<std::int64_t, std::int64_t>> fwd_two = fwd, bwd_two = bwd;
  for (int c = 0; c < 8; ++c) fwd_two.emplace_back(2 * c + 1, c), bwd_two.emplace_back(c, 2 * c + 1);
  std::vector<std::uint8_t> ones(256, 1);
  const Layout full = Layout::from_dense(16, 16, ones);
  for (int b : {16, 32})
    for (Op op : {Op::forward, Op::backward_data}) {
      MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      SCOPED_TRACE(fmt::format("{} b{}", to_string(op), b));
      EXPECT_GT(generate_matmul(full, spec).tiles.columns, 0) << "a full layout: one step per 4 columns × 2 blocks";
      const Layout thin = op == Op::forward ? Layout::from_coords(32, 16, fwd) : Layout::from_coords(16, 32, bwd);
      const Layout two =
          op == Op::forward ? Layout::from_coords(32, 16, fwd_two) : Layout::from_coords(16, 32, bwd_two);
      EXPECT_GT(generate_matmul(two, spec).tiles.columns, 0) << "0.67 steps per block: the grouped kernel";
      const auto g = generate_matmul(thin, spec);
      if (b == 16) {
        EXPECT_GT(g.tiles.columns, 0) << "the TMA kernel has no b = 16";
        continue;
      }
      EXPECT_EQ(g.tiles.columns, 0) << "one step per block: the TMA kernel";
      EXPECT_NE(g.name_expression.find("dsd_tma_kernel"), std::string::npos);
      EXPECT_EQ(tiles_tag(g.tiles), "tma2-bm256-s4-p");
      spec.small_batch = true;  // the small-batch variant keeps its own kernel: even columns, a CTA each
      EXPECT_EQ(tiles_tag(generate_matmul(thin, spec).tiles), "tma1-bm64-s6");
    }
}


// The grouped forward at block b on 8 × 8 blocks whose columns 0, 2, 4, 6 hold blocks in input
// blocks 0-3 and columns 1, 3, 5, 7 in input blocks 4-7.
GeneratedSource grouped_forward(int block) {
  std::vector<std::uint8_t> m(8 * 8, 0);
  for (int c = 0; c < 8; ++c)
    for (int r = 0; r < 4; ++r) m[(c % 2 * 4 + r) * 8 + c] = 1;
  MatMulSpec spec{Op::forward, block, DType::bf16, FeatureAxis::last};
  spec.wgmma = true;
  auto g = generate_matmul(Layout::from_dense(8, 8, m), spec);
  EXPECT_GT(g.tiles.columns, 0) << "not the grouped kernel: " << g.label;
  return g;
}

// The grouped kernel groups columns that share chunks: groups of 4 (b = 32: 2 consumers × 2
// columns) take one set each, 2 steps per group instead of 4.
TEST(Generator, GroupsColumnsThatShareChunks) {
  const auto g = grouped_forward(32);
  EXPECT_EQ(table(g, "kGroupColumns"), (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(table(g, "kGroupSteps"), (std::vector<int>{0, 2, 2, 2, 4, 4, 4}));
  EXPECT_EQ(table(g, "kCounts"), (std::vector<int>{2}));  // groups
}

// The group count is a table from b = 32 and a constant of the source at b = 16, whose grouped
// kernel is 6% slower reading it (generate_matmul says where that was measured).
TEST(Generator, GroupCountIsAConstantAtBlock16) {
  const auto g = grouped_forward(16);
  EXPECT_EQ(std::count_if(g.tables.begin(), g.tables.end(), [](const auto& t) { return t.name == "kCounts"; }), 0);
  EXPECT_NE(g.source.find(fmt::format("static constexpr int groups() {{ return {}; }}", g.grid_x)), std::string::npos);
}

// The tiled backward-weight kernel's tables: the tiles holding a block (64 × 64, 128 × 128, and 128
// rows × 256 features on two consumers), each with the block index of every slot (row-major, -1
// where the layout has none), together rebuild the layout.
TEST(Generator, TiledTablesRebuildTheLayout) {
  struct TileShape {
    int edge, cols, warpgroups;
  };
  for (std::uint64_t seed = 1; seed <= 10; ++seed)
    for (int b : {16, 32})
      for (const TileShape shape : {TileShape{64, 0, 1}, TileShape{128, 0, 1}, TileShape{128, 256, 2}}) {
        Layout layout = random_layout(1 + seed % 13 + seed % 5, 2 + seed % 11, seed);
        MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
        spec.wgmma = true;
        TileConfig t;
        t.wgmma = t.tma = true, t.tile_edge = shape.edge, t.tile_cols = shape.cols, t.warps_m = shape.warpgroups;
        t.stages = 4;
        spec.tiles = t;
        const auto g = generate_matmul(layout, spec);
        SCOPED_TRACE(fmt::format("seed {} b{} {} x {}", seed, b, shape.edge, shape.cols));
        ASSERT_NE(g.name_expression.find("sdd_tiled_kernel"), std::string::npos);
        const auto coords = table(g, "kCoords"), blocks = table(g, "kTileBlocks");
        const int per = shape.edge / b, per_col = (shape.cols > 0 ? shape.cols : shape.edge) / b;
        const int slots = per * per_col, tiles = static_cast<int>(g.grid_x);
        ASSERT_EQ(static_cast<int>(blocks.size()), std::max(1, tiles * slots));
        std::vector<std::pair<std::int64_t, std::int64_t>> rebuilt;
        for (int i = 0; i < tiles; ++i) {
          int held = 0;
          for (int s = 0; s < slots; ++s) {
            const std::int64_t r = coords[2 * i] * per + s / per_col, c = coords[2 * i + 1] * per_col + s % per_col;
            const bool inside = r < layout.rows() && c < layout.cols();
            EXPECT_EQ(blocks[i * slots + s], inside ? layout.block_index(r, c) : -1);
            if (blocks[i * slots + s] >= 0) rebuilt.push_back({r, c}), ++held;
          }
          EXPECT_GT(held, 0) << "only tiles that hold a block";
        }
        EXPECT_EQ(Layout::from_coords(layout.rows(), layout.cols(), rebuilt), layout);
      }
}

// The row-grouped backward-weight kernel's tables: a unit is a band of block rows (one at b ≥ 64,
// 64 / b at b ≤ 32) with up to m block columns holding a block in the band, ascending over the band's
// units (in whatever order the bands' units interleave: l2_unit_order), padded with -1 only in the
// band's last unit; the block index of each (row, column) of a unit is the layout's, and
// together the units hold every block once.
TEST(Generator, RowBandTablesRebuildTheLayout) {
  for (std::uint64_t seed = 1; seed <= 10; ++seed)
    for (int b : {16, 32, 64, 128})
      for (int m : {2, 4, 8, 16, 32})
        for (int pairs : {0, 2}) {  // b = 64: bands of one block row or of two
          if ((b == 128 && m != 2) || (b == 64 && m > 8) || (b <= 32 && m * b < 128) || m * b > 512) continue;
          if (pairs > 0 && (b != 64 || m != 4)) continue;
          Layout layout = random_layout(1 + seed % 13 + seed % 5, 2 + seed % 11, seed);
          MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
          spec.wgmma = true;
          TileConfig t;
          t.wgmma = t.tma = true, t.row_blocks = m, t.band_rows = pairs;
          t.warps_m = m * b > 256 || b == 128 || pairs > 0 ? 2 : 1, t.stages = 3;
          spec.tiles = t;
          const auto g = generate_matmul(layout, spec);
          SCOPED_TRACE(fmt::format("seed {} b{} m {} band rows {}", seed, b, m, pairs));
          ASSERT_NE(g.name_expression.find("sdd_rows_kernel"), std::string::npos);
          const int units = static_cast<int>(g.grid_x), per = pairs > 0 ? pairs : std::max(b, 64) / b;
          EXPECT_NE(g.source.find(fmt::format("kRowBlocks = {}, kBandRows = {};", m, per)), std::string::npos);
          const auto coords = table(g, "kCoords"), blocks = table(g, "kTileBlocks");
          ASSERT_EQ(static_cast<int>(coords.size()), std::max(1, units * (m + 1)));
          ASSERT_EQ(static_cast<int>(blocks.size()), std::max(1, units * per * m));
          std::vector<std::pair<std::int64_t, std::int64_t>> rebuilt;
          std::map<int, int> last_column, short_units;  // per band: its last column so far, its short units
          int padded_units = 0;
          for (int u = 0; u < units; ++u) {
            const int band = coords[u * (m + 1)];
            const int* columns = coords.data() + u * (m + 1) + 1;
            EXPECT_EQ(short_units[band], 0) << "only a band's last unit is short";
            int& previous_column = last_column.try_emplace(band, -1).first->second;
            ASSERT_GE(columns[0], 0) << "a unit's first slot holds a column";
            bool padded = false;
            for (int s = 0; s < m; ++s) {
              const int* slot = blocks.data() + u * per * m + s;
              if (columns[s] < 0) {
                padded = true;
                for (int r = 0; r < per; ++r) EXPECT_EQ(slot[r * m], -1);
                continue;
              }
              EXPECT_FALSE(padded) << "padding only after the unit's columns";
              EXPECT_GT(columns[s], previous_column) << "a band's columns ascending, each once";
              previous_column = columns[s];
              int held = 0;
              for (int r = 0; r < per; ++r) {
                const std::int64_t row = static_cast<std::int64_t>(band) * per + r;
                EXPECT_EQ(slot[r * m], row < layout.rows() ? layout.block_index(row, columns[s]) : -1);
                if (slot[r * m] >= 0) rebuilt.push_back({row, columns[s]}), ++held;
              }
              EXPECT_GT(held, 0) << "only columns holding a block in the band";
            }
            if (padded) ++padded_units, ++short_units[band];
          }
          EXPECT_LE(padded_units, (layout.rows() + per - 1) / per);
          EXPECT_EQ(static_cast<std::int64_t>(rebuilt.size()), layout.blocks()) << "every block once";
          EXPECT_EQ(Layout::from_coords(layout.rows(), layout.cols(), rebuilt), layout);
          // one wave of CTAs over the units (SddSchedule): the split counters, then a partial plane
          // per CTA an H100 / H200 holds at most
          EXPECT_TRUE(g.persistent);
          EXPECT_EQ(g.splits, 1);
          const std::int64_t planes = sdd_kernel_planes(units, std::max(1, 227 * 1024 / g.shared_bytes));
          EXPECT_EQ(table(g, "kCounts"), (std::vector<int>{static_cast<int>(units), static_cast<int>(planes)}));
          EXPECT_EQ(g.workspace_bytes, planes > 0 ? (kernels::kSplitCounters + planes * per * b * m * b) * 4 : 0);
          // dY's boxes: 64 features, or one block column at b ≤ 32 (swizzled over its 2b bytes)
          ASSERT_EQ(g.tensor_maps.size(), 2u);
          EXPECT_EQ(g.tensor_maps[1].box_inner, std::min(b, 64));
          EXPECT_EQ(g.tensor_maps[1].swizzle, 2 * std::min(b, 64));
        }
}

// The column-grouped backward-weight kernel's tables (b = 128): a unit is a block column with up to
// 2 of its blocks' rows, ascending over the column's units, padded with -1 only in the column's last
// unit; the block index of
// each slot is the layout's, and together the units hold every block once.
TEST(Generator, ColumnGroupTablesRebuildTheLayout) {
  for (std::uint64_t seed = 1; seed <= 10; ++seed) {
    Layout layout = random_layout(1 + seed % 13 + seed % 5, 2 + seed % 11, seed);
    MatMulSpec spec{Op::backward_weight, 128, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    TileConfig t;
    t.wgmma = t.tma = true, t.col_blocks = 2, t.warps_m = 2, t.stages = 3;
    spec.tiles = t;
    const auto g = generate_matmul(layout, spec);
    SCOPED_TRACE(fmt::format("seed {}", seed));
    ASSERT_NE(g.name_expression.find("sdd_cols_kernel"), std::string::npos);
    EXPECT_NE(g.source.find("kColBlocks = 2;"), std::string::npos);
    const int units = static_cast<int>(g.grid_x);
    const auto coords = table(g, "kCoords"), blocks = table(g, "kTileBlocks");
    ASSERT_EQ(static_cast<int>(coords.size()), std::max(1, units * 3));
    ASSERT_EQ(static_cast<int>(blocks.size()), std::max(1, units * 2));
    std::vector<std::pair<std::int64_t, std::int64_t>> rebuilt;
    std::map<int, int> last_row, short_units;  // per block column: its last row so far, its short units
    for (int u = 0; u < units; ++u) {
      const int column = coords[u * 3];
      EXPECT_EQ(short_units[column], 0) << "only a column's last unit is short";
      int& previous_row = last_row.try_emplace(column, -1).first->second;
      ASSERT_GE(coords[u * 3 + 1], 0) << "a unit's first slot holds a block";
      for (int s = 0; s < 2; ++s) {
        const int row = coords[u * 3 + 1 + s], block = blocks[u * 2 + s];
        if (row < 0) {
          EXPECT_EQ(s, 1);
          EXPECT_EQ(block, -1);
          ++short_units[column];
          continue;
        }
        EXPECT_GT(row, previous_row) << "a column's rows ascending, each once";
        previous_row = row;
        EXPECT_EQ(block, layout.block_index(row, column));
        rebuilt.push_back({row, column});
      }
    }
    EXPECT_EQ(static_cast<std::int64_t>(rebuilt.size()), layout.blocks()) << "every block once";
    EXPECT_EQ(Layout::from_coords(layout.rows(), layout.cols(), rebuilt), layout);
    EXPECT_TRUE(g.persistent);
    EXPECT_EQ(g.tiles.bm, 256);
    EXPECT_EQ(g.tiles.bn, 128);
    const std::int64_t planes = sdd_kernel_planes(units, 1);
    EXPECT_EQ(g.workspace_bytes, planes > 0 ? (kernels::kSplitCounters + planes * 256 * 128) * 4 : 0);
  }
  // valid only as two consumers of a block each (128 accumulators a thread), at b = 128, for
  // backward-weight
  auto shape = [](Op op, int b, int wg) {
    MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    TileConfig t;
    t.wgmma = t.tma = true, t.col_blocks = 2, t.warps_m = wg, t.stages = 4, t.staged = true;
    spec.tiles = t;
    return spec;
  };
  const TileConfig t = choose_tiles(shape(Op::backward_weight, 128, 2));
  EXPECT_EQ(tiles_tag(t), "cols2-tma2-s4-st");
  EXPECT_EQ(t.threads, 288);
  EXPECT_EQ(t.shared_bytes, 4 * 64 * (256 + 128) * 2 + 1024 + 1024 + 2 * 4 * 16 * 64 * 2);
  EXPECT_THROW(choose_tiles(shape(Op::backward_weight, 128, 1)), Error) << "256 accumulators a thread";
  EXPECT_THROW(choose_tiles(shape(Op::backward_weight, 64, 2)), Error) << "b = 128 only";
  EXPECT_THROW(choose_tiles(shape(Op::forward, 128, 2)), Error) << "backward-weight only";
}

// Backward-weight at b ≥ 64 on Hopper: the kernel predicted to finish first in waves (sdd_choice):
// row groups of 4 for many blocks per row, of 2 for a few, a block per CTA where even pairs would
// leave most of a wave idle.
TEST(Generator, BackwardWeightKernelByWaves) {
  auto regular = [](std::int64_t n, std::int64_t per_row) {
    std::vector<std::uint8_t> m(n * n, 0);
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t j = 0; j < per_row; ++j) m[r * n + (r * 7 + j * 3) % n] = 1;
    return Layout::from_dense(n, n, m);
  };
  auto chosen = [](const Layout& layout, int b) {
    MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    return generate_matmul(layout, spec);
  };
  const auto many = chosen(regular(64, 32), 64), few = chosen(regular(64, 3), 64), sparse = chosen(regular(32, 2), 128);
  EXPECT_EQ(tiles_tag(many.tiles), "rows4-tma1-s4-st");
  EXPECT_EQ(many.grid_x, 64 * 32 / 4);
  EXPECT_NE(many.label.find("rows4"), std::string::npos) << "the label names what was generated";
  EXPECT_EQ(tiles_tag(few.tiles), "rows2-tma1-s6-st");
  EXPECT_EQ(few.grid_x, 64 * 2);
  EXPECT_EQ(tiles_tag(sparse.tiles), "tma1-bm128-s4-st");
  EXPECT_NE(sparse.name_expression.find("sdd_tma_kernel"), std::string::npos);
  // b = 128, 8 blocks in every block column at random rows (suite W's balanced layout at d = 0.25):
  // pairs of a column's blocks make exactly 128 units, one wave; pairs of a row's, with odd rows
  // padded, more than 132, and single blocks 2 waves
  std::mt19937_64 rng(8);
  std::vector<std::uint8_t> even_columns(32 * 32, 0);
  for (std::int64_t c = 0; c < 32; ++c) {
    std::vector<std::int64_t> rows(32);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int j = 0; j < 8; ++j) even_columns[rows[j] * 32 + c] = 1;
  }
  const auto by_columns = chosen(Layout::from_dense(32, 32, even_columns), 128);
  EXPECT_EQ(tiles_tag(by_columns.tiles), "cols2-tma2-s4-st");
  EXPECT_EQ(by_columns.grid_x, 128);
  EXPECT_NE(by_columns.name_expression.find("sdd_cols_kernel"), std::string::npos);
  // b = 64, rows 2i and 2i + 1 holding the same 32 columns: bands of two block rows, units of 4
  // columns with a block in every slot (fewer waves than single rows)
  std::vector<std::uint8_t> twins(64 * 64, 0);
  for (std::int64_t r = 0; r < 64; ++r)
    for (std::int64_t j = 0; j < 32; ++j) twins[r * 64 + ((r / 2) * 7 + j * 3) % 64] = 1;
  const auto pairs = chosen(Layout::from_dense(64, 64, twins), 64);
  EXPECT_EQ(tiles_tag(pairs.tiles), "rows4x2-tma2-s4-st");
  EXPECT_EQ(pairs.grid_x, 32 * 32 / 4);
  EXPECT_NE(pairs.source.find("kRowBlocks = 4, kBandRows = 2;"), std::string::npos);
  EXPECT_EQ(pairs.tiles.bm, 128) << "two block rows of 64";
  // the staged epilogue stores by TMA through a third map: dW as [blocks · b, b], a warp's 16 rows ×
  // min(b, 64) features
  ASSERT_EQ(sparse.tensor_maps.size(), 3u);
  EXPECT_EQ(sparse.tensor_maps[2].inner, 128);
  EXPECT_EQ(sparse.tensor_maps[2].outer, 32 * 2 * 128);
  EXPECT_EQ(sparse.tensor_maps[2].box_inner, 64);
  EXPECT_EQ(sparse.tensor_maps[2].box_outer, 16);
  EXPECT_NE(sparse.source.find("kStagedStore = true"), std::string::npos);
  // small batches: one block per unit whatever the layout (no row groups), staged
  MatMulSpec small{Op::backward_weight, 64, DType::bf16, FeatureAxis::last};
  small.wgmma = small.small_batch = true;
  EXPECT_EQ(tiles_tag(generate_matmul(regular(64, 32), small).tiles), "tma1-bm64-s4-st");
  small.block = 128;
  EXPECT_EQ(tiles_tag(generate_matmul(regular(64, 32), small).tiles), "tma2-bm128-s4-st");
  small.block = 32;
  EXPECT_EQ(tiles_tag(generate_matmul(regular(64, 32), small).tiles), "rows8-tma2-s4-st");
  small.block = 16;
  EXPECT_FALSE(generate_matmul(regular(64, 32), small).tiles.tma) << "b = 16 keeps the mma.sync kernel";
  small.wgmma = false, small.block = 64;
  EXPECT_FALSE(generate_matmul(regular(64, 32), small).tiles.tma) << "no TMA kernels without sm_90a";
}

// Backward-weight at b ≤ 32 on Hopper: the kernel predicted to finish first (sdd_narrow_choice) on
// suite W's balanced random layouts (C = K = 4096): 128 × 256 tiles on two consumers where they are
// well filled, bands of 64 rows × 512 or 256 gathered columns where they are not (what the sweep
// measured).
TEST(Generator, NarrowBackwardWeightByPrediction) {
  auto balanced = [](std::int64_t n, double d, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::uint8_t> m(n * n, 0);
    std::vector<std::int64_t> columns(n);
    for (std::int64_t r = 0; r < n; ++r) {
      std::iota(columns.begin(), columns.end(), 0);
      std::shuffle(columns.begin(), columns.end(), rng);
      for (std::int64_t j = 0; j < std::llround(d * n); ++j) m[r * n + columns[j]] = 1;
    }
    return Layout::from_dense(n, n, m);
  };
  auto chosen = [&](int b, double d) {
    MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    const auto g = generate_matmul(balanced(4096 / b, d, 5), spec);
    return tiles_tag(g.tiles);
  };
  // staged where the staging fits: not beside the 3 stages of 72 KB of the 64 × 512 bands
  EXPECT_EQ(chosen(32, 0.5), "tile128x256-tma2-s4-st");
  EXPECT_EQ(chosen(32, 0.25), "rows16-tma2-s3");
  EXPECT_EQ(chosen(32, 0.1), "rows16-tma2-s3");
  EXPECT_EQ(chosen(32, 0.05), "rows8-tma2-s4-st");
  EXPECT_EQ(chosen(16, 0.5), "tile128x256-tma2-s4-st");
  EXPECT_EQ(chosen(16, 0.25), "tile128x256-tma2-s4-st");
  EXPECT_EQ(chosen(16, 0.1), "tile128x256-tma2-s4-st");
  EXPECT_EQ(chosen(16, 0.05), "rows32-tma2-s3");
  MatMulSpec spec{Op::backward_weight, 32, DType::bf16, FeatureAxis::last};
  spec.wgmma = true;
  const auto g = generate_matmul(balanced(128, 0.1, 5), spec);
  EXPECT_NE(g.name_expression.find("sdd_rows_kernel"), std::string::npos);
  EXPECT_NE(g.label.find("rows16"), std::string::npos) << "the label names what was generated";
}

// Which row-grouped shapes are valid: wgmma widths of 64-256 per consumer, at most 128 accumulators
// a thread; the shared memory the template computes.
TEST(Generator, RowGroupShapes) {
  auto shape = [](int b, int m, int wg, int stages) {
    MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    TileConfig t;
    t.wgmma = t.tma = true, t.row_blocks = m, t.warps_m = wg, t.stages = stages;
    spec.tiles = t;
    return spec;
  };
  auto rows_tiles_of = [&](int b, int m, int wg, int stages, int band_rows) {
    MatMulSpec spec = shape(b, m, wg, stages);
    spec.tiles->band_rows = band_rows;
    return choose_tiles(spec);
  };
  const TileConfig t = choose_tiles(shape(64, 8, 2, 3));
  EXPECT_EQ(tiles_tag(t), "rows8-tma2-s3");
  EXPECT_EQ(t.bm, 64);
  EXPECT_EQ(t.bn, 512);
  EXPECT_EQ(t.threads, 288) << "2 consumer warpgroups and a producer warp";
  EXPECT_EQ(t.shared_bytes, 3 * 64 * (64 + 512) * 2 + 1024 + 2 * 3 * 8);
  EXPECT_EQ(choose_tiles(shape(128, 2, 2, 4)).bn, 256);
  EXPECT_THROW(choose_tiles(shape(64, 8, 1, 3)), Error) << "N = 512 on one consumer";
  EXPECT_THROW(choose_tiles(shape(128, 2, 1, 3)), Error) << "256 accumulators a thread";
  EXPECT_THROW(choose_tiles(shape(64, 8, 2, 4)), Error) << "shared memory";
  EXPECT_THROW(choose_tiles(shape(16, 2, 1, 4)), Error) << "wgmma widths in multiples of 64";
  TileConfig pair = rows_tiles_of(64, 4, 2, 4, 2);
  EXPECT_EQ(tiles_tag(pair), "rows4x2-tma2-s4");
  EXPECT_EQ(pair.bm, 128) << "b = 64: a band of two block rows";
  EXPECT_EQ(pair.bn, 256);
  EXPECT_THROW(rows_tiles_of(64, 4, 1, 4, 2), Error) << "256 accumulators a thread";
  EXPECT_THROW(rows_tiles_of(32, 8, 2, 4, 2), Error) << "bands of two block rows only at b = 64";
  EXPECT_THROW(rows_tiles_of(128, 2, 2, 4, 2), Error) << "bands of two block rows only at b = 64";
  const TileConfig band = choose_tiles(shape(32, 8, 1, 5));
  EXPECT_EQ(band.bm, 64) << "b ≤ 32: a band of 64 rows";
  EXPECT_EQ(band.bn, 256);
  EXPECT_EQ(band.shared_bytes, 5 * 64 * (64 + 256) * 2 + 1024 + 2 * 5 * 8);
  EXPECT_THROW(choose_tiles(shape(16, 32, 1, 3)), Error) << "N = 512 on one consumer";
  EXPECT_THROW(choose_tiles(shape(64, 1, 1, 4)), Error) << "one block per group is sdd_tma_kernel";
  MatMulSpec forward = shape(64, 4, 1, 4);
  forward.op = Op::forward;
  EXPECT_THROW(choose_tiles(forward), Error) << "backward-weight only";
}

// Which tiled shapes are valid: 64 × 64 and 128 × 128 on a consumer, 128 rows × 256 features on two
// (64 rows × 256 each, 128 accumulators a thread); the tag names the width where it differs.
TEST(Generator, TiledShapes) {
  auto shape = [](int b, int edge, int cols, int wg, int stages) {
    MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    TileConfig t;
    t.wgmma = t.tma = true, t.tile_edge = edge, t.tile_cols = cols, t.warps_m = wg, t.stages = stages;
    spec.tiles = t;
    return spec;
  };
  const TileConfig wide = choose_tiles(shape(32, 128, 256, 2, 4));
  EXPECT_EQ(tiles_tag(wide), "tile128x256-tma2-s4");
  EXPECT_EQ(wide.bm, 128);
  EXPECT_EQ(wide.bn, 256);
  EXPECT_EQ(wide.threads, 288);
  EXPECT_EQ(wide.shared_bytes, 4 * 64 * (128 + 256) * 2 + 1024 + 2 * 4 * 8);
  EXPECT_EQ(tiles_tag(choose_tiles(shape(16, 128, 128, 1, 4))), "tile128-tma1-s4") << "square: no width in the tag";
  EXPECT_THROW(choose_tiles(shape(16, 128, 256, 1, 4)), Error) << "256 accumulators a thread";
  EXPECT_THROW(choose_tiles(shape(16, 64, 256, 1, 4)), Error) << "only 128 × 256";
  EXPECT_THROW(choose_tiles(shape(16, 128, 512, 2, 3)), Error) << "wgmma's N is at most 256";
  EXPECT_THROW(choose_tiles(shape(32, 128, 256, 2, 5)), Error) << "shared memory";
  MatMulSpec staged = shape(32, 128, 256, 2, 4);
  staged.tiles->staged = true;
  EXPECT_EQ(tiles_tag(choose_tiles(staged)), "tile128x256-tma2-s4-st") << "the staged epilogue fits beside 4 stages";
}

// What the templates' static_asserts demand, checked on the host for every combination.
TEST(Generator, TileConfigsAreConsistent) {
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {8, 16, 32, 64, 128})
      for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
        TileConfig t = choose_tiles({op, b, dt, FeatureAxis::last});
        SCOPED_TRACE(std::string(to_string(op)) + " b" + std::to_string(b) + " " + std::string(to_string(dt)));
        EXPECT_EQ(t.tensor_cores, dt != DType::f32 && b >= 16);
        EXPECT_EQ(t.bn, b);
        EXPECT_EQ(b % std::min(b, t.bk), 0);
        EXPECT_GE(t.stride, t.bk);
        EXPECT_LE((t.bm + t.bn) * t.stride * static_cast<int>(dtype_size(dt)), 48 * 1024);
        EXPECT_TRUE(t.threads >= 32 && t.threads <= 1024 && t.threads % 32 == 0);
        if (t.pipelined) {
          EXPECT_EQ((t.bn / t.warps_n) % 16, 0) << "B fragments are loaded in pairs of n8 tiles";
          EXPECT_GE(t.stages, 2);
          EXPECT_GT(t.shared_bytes, 0);
          EXPECT_LE(t.shared_bytes, 160 * 1024) << "must fit sm_80's opt-in limit";
        }
        for (FeatureAxis ax : {FeatureAxis::last, FeatureAxis::first})
          EXPECT_EQ(choose_tiles({op, b, dt, ax}).pipelined, t.tensor_cores && ax == FeatureAxis::last);
        if (t.tensor_cores) {
          EXPECT_EQ(t.warps_m * t.warps_n * 32, t.threads);
          EXPECT_EQ((t.bm / t.warps_m) % 16, 0);
          EXPECT_EQ((t.bn / t.warps_n) % 16, 0) << "warp tiles load B fragments in pairs of n8 tiles";
          EXPECT_EQ(t.bk % 16, 0);
        } else {
          const int threads_n = t.bn / t.tn;
          EXPECT_EQ(t.threads % threads_n, 0);
          EXPECT_EQ(t.threads / threads_n * t.tm, t.bm);
        }
      }
  EXPECT_THROW(choose_tiles({Op::forward, 24, DType::f32, FeatureAxis::last}), Error);
}

// The Hopper kernels: chosen on sm_90a for all three ops at b ≥ 64 (16-bit, feature axis last),
// never elsewhere; their shapes fit the H100/H200's shared memory.
// fp32 as TF32 (opt-in): the mma.sync pipelined kernels on 4-byte tiles, their shared memory
// counted in 4-byte elements (K-major rows padded by 4, MN-major by 8); refused where no TF32 kernel
// exists.
TEST(Generator, Tf32OnThePipelinedKernels) {
  const Layout layout = Layout::from_dense(4, 3, std::vector<std::uint8_t>(12, 1));
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {16, 32, 64, 128}) {
      MatMulSpec spec{op, b, DType::f32, FeatureAxis::last};
      SCOPED_TRACE(std::string(to_string(op)) + " b" + std::to_string(b));
      const TileConfig exact = choose_tiles(spec);
      EXPECT_FALSE(exact.tensor_cores) << "exact fp32 stays the default";
      spec.tf32 = true;
      for (const auto& v : variants(spec)) {
        const TileConfig t = choose_tiles(v);
        EXPECT_TRUE(t.tensor_cores && t.pipelined && !t.wgmma);
        const bool sdd = op == Op::backward_weight;
        const int a = sdd ? t.bk * (b + 8) : t.bm * (t.bk + 4);
        const int w = sdd ? t.bk * (b + 8) : op == Op::backward_data ? b * (t.bk + 4) : t.bk * (b + 8);
        EXPECT_EQ(t.shared_bytes, t.stages * (a + w) * 4);
        EXPECT_LE(t.shared_bytes, 160 * 1024);
      }
      const auto g = generate_matmul(layout, spec);
      EXPECT_NE(g.label.find("f32-tf32"), std::string::npos) << g.label;
      EXPECT_NE(g.source.find("using T = float"), std::string::npos);
      EXPECT_NE(g.name_expression.find(op == Op::backward_weight ? "sdd_pipelined_kernel" : "dsd_pipelined_kernel"),
                std::string::npos);
      for (const auto& t : tile_candidates(spec)) EXPECT_LE(t.shared_bytes, 160 * 1024) << tiles_tag(t);
    }
  for (MatMulSpec spec : {MatMulSpec{Op::forward, 32, DType::bf16, FeatureAxis::last},
                          MatMulSpec{Op::forward, 8, DType::f32, FeatureAxis::last},
                          MatMulSpec{Op::forward, 32, DType::f32, FeatureAxis::first}}) {
    spec.tf32 = true;
    SCOPED_TRACE(std::string(to_string(spec.dtype)) + " b" + std::to_string(spec.block) + " " +
                 std::string(to_string(spec.feature_axis)));
    try {
      choose_tiles(spec);
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tf32 needs fp32 inputs, block ≥ 16 and the feature axis last"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Generator, WgmmaWhereTheTargetHasIt) {
  EXPECT_TRUE(has_wgmma("sm_90a"));
  EXPECT_FALSE(has_wgmma("sm_90"));
  EXPECT_FALSE(has_wgmma("sm_80"));
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {8, 16, 32, 64, 128})
      for (DType dt : {DType::f32, DType::f16, DType::bf16})
        for (FeatureAxis ax : {FeatureAxis::last, FeatureAxis::first}) {
          MatMulSpec spec{op, b, dt, ax};
          EXPECT_FALSE(choose_tiles(spec).wgmma);
          spec.wgmma = true;
          const TileConfig t = choose_tiles(spec);
          SCOPED_TRACE(std::string(to_string(op)) + " b" + std::to_string(b) + " " + std::string(to_string(dt)));
          // b ≤ 32: the grouped kernel for forward and backward-data, 128 × 128 tiles of dW for
          // backward-weight
          const bool expected = dt != DType::f32 && ax == FeatureAxis::last && b >= 16;
          EXPECT_EQ(t.wgmma, expected);
          if (!t.wgmma) continue;
          EXPECT_TRUE(t.tma) << "the default is the warp-specialized TMA kernel";
          // warps_m consumer warpgroups and a producer: a warpgroup, a warp for backward-weight
          EXPECT_EQ(t.threads, t.warps_m * 128 + (op == Op::backward_weight ? 32 : 128));
          if (t.columns == 0) {
            EXPECT_TRUE(t.bm / t.warps_m == 64 || t.bm / t.warps_m == 128) << "one or two m64 tiles per warpgroup";
          }
          EXPECT_EQ(t.bk, 64) << "64 reduction indices per stage";
          for (const auto& c : tile_candidates(spec)) EXPECT_LE(c.shared_bytes, 227 * 1024) << tiles_tag(c);
          if (op == Op::backward_weight && b <= 32) {
            EXPECT_EQ(t.tile_edge, 128);
            EXPECT_EQ(t.bm, 128);
            EXPECT_TRUE(t.staged);
            EXPECT_EQ(t.shared_bytes, t.stages * 2 * 64 * 128 * 2 + 1024 + 1024 + t.warps_m * 4 * 2048);
            // the layout decides (layout_choice): a full layout, 128 × 128 tiles of dW; a lone
            // block, 64 × 64 tiles at b = 32 (a quarter filled) and the mma.sync kernel at b = 16
            std::vector<std::uint8_t> ones(64, 1);
            const auto full = generate_matmul(Layout::from_dense(8, 8, ones), spec);
            EXPECT_NE(full.name_expression.find("sdd_tiled_kernel"), std::string::npos);
            EXPECT_EQ(full.tensor_maps.size(), 3u);
            EXPECT_EQ(full.tiles.tile_edge, 128);
            const auto sparse = generate_matmul(Layout::from_coords(2 * 128 / b, 2, {{0, 0}}), spec);
            if (b == 32) {
              EXPECT_EQ(sparse.tiles.tile_edge, 64);
              EXPECT_NE(sparse.label.find("tile64"), std::string::npos) << "the label names what was generated";
            } else {
              EXPECT_NE(sparse.name_expression.find("sdd_pipelined_kernel"), std::string::npos) << sparse.label;
              EXPECT_TRUE(sparse.tensor_maps.empty());
              EXPECT_EQ(sparse.label.find("tile"), std::string::npos) << "the label names what was generated";
            }
            continue;
          }
          // at b ≤ 32 a full layout, where the grouped kernel's steps each hold several blocks
          const auto g = generate_matmul(b <= 32 ? Layout::from_dense(2, 2, {1, 1, 1, 1}) : Layout::from_coords(2, 2, {{0, 0}}),
                                         spec);
          // dsd_tma_kernel stores Y by TMA, the staged backward-weight kernels dW
          const bool tma_store =
              (b >= 64 && op != Op::backward_weight) || (op == Op::backward_weight && g.tiles.staged);
          ASSERT_EQ(g.tensor_maps.size(), tma_store ? 3u : 2u);
          // the small-batch variant: one consumer of 64 rows; for backward-weight, which reduces
          // over those rows, the mma.sync kernel with 2 stages
          if (b <= 32) {
            EXPECT_EQ(t.columns, t.warps_m * 64 / b) << "each consumer stacks 64 / b columns into wgmma's M";
            EXPECT_NE(g.name_expression.find("dsd_grouped_kernel"), std::string::npos);
            // the stages (X: bm rows × 64 indices; the group's W blocks in them), their barriers and
            // step records (pattern and sub-blocks; 128-byte aligned), one output tile of up to 128
            // rows × 64 per consumer
            const int sub = 64 / b;
            const int ring = t.stages * (t.bm * 128 + sub * t.columns * 2 * b * b + 16 + 4 * 2);
            EXPECT_EQ(t.shared_bytes, 1024 + (ring + 127) / 128 * 128 + t.warps_m * std::min(t.bm, 128) * 128);
            EXPECT_TRUE(g.persistent);
            EXPECT_EQ(g.tensor_maps[0].box_inner, 64) << "64 reduction indices of X per step: 128-byte rows";
            EXPECT_EQ(g.tensor_maps[0].box_outer, t.bm);
            EXPECT_EQ(g.tensor_maps[0].swizzle, 128);
            EXPECT_EQ(g.tensor_maps[1].box_outer, b) << "one W block per copy";
            EXPECT_EQ(g.tensor_maps[1].swizzle, 2 * b) << "W: rows of one block, swizzled";
            // small batch at b = 32: dsd_tma_kernel on tiles 32 wide swizzled over 64 bytes, one
            // consumer of 64 rows, persistent; at b = 16 the mma.sync kernel
            const auto v = variants(spec);
            ASSERT_EQ(v.size(), 2u);
            const TileConfig small = choose_tiles(v[1]);
            if (b == 16) {
              EXPECT_FALSE(small.wgmma) << tiles_tag(small);
              continue;
            }
            EXPECT_TRUE(small.tma && small.persistent && !small.swapped) << tiles_tag(small);
            EXPECT_EQ(small.bm, 64);
            EXPECT_EQ(small.threads, 256);
            // stages of 64 rows × 64 bytes of X and one 32 × 32 W block, barriers padded to 1024
            // bytes, one 64 × 32 staging tile
            EXPECT_EQ(small.shared_bytes, small.stages * (64 * 64 + 32 * 32 * 2) + 1024 + 1024 + 64 * 64);
            // uneven columns (and rows) for the persistent default: 3, 1, 1 and 0 blocks
            const auto gs = generate_matmul(Layout::from_coords(4, 4, {{0, 0}, {1, 0}, {2, 0}, {0, 1}, {0, 2}}), v[1]);
            EXPECT_NE(gs.name_expression.find("dsd_tma_kernel"), std::string::npos);
            EXPECT_TRUE(gs.persistent);
            ASSERT_EQ(gs.tensor_maps.size(), 3u);
            for (const auto& m : gs.tensor_maps) {
              EXPECT_EQ(m.swizzle, 64) << "rows of 32 elements";
              EXPECT_EQ(m.box_inner, 32);
            }
            EXPECT_EQ(gs.tensor_maps[0].box_outer, 64) << "X: the tile's 64 rows";
            EXPECT_EQ(gs.tensor_maps[1].box_outer, 32) << "one W block";
            EXPECT_EQ(gs.tensor_maps[2].box_outer, 16) << "a warp's 16 rows of Y";
            // swapped shapes and the cp.async wgmma kernel stay b ≥ 64
            MatMulSpec bad = spec;
            TileConfig swapped;
            swapped.wgmma = swapped.tma = swapped.persistent = swapped.swapped = true;
            swapped.bm = 128, swapped.warps_m = 1, swapped.stages = 4;
            bad.tiles = swapped;
            EXPECT_THROW(choose_tiles(bad), Error);
            TileConfig cp_async;
            cp_async.wgmma = true, cp_async.bm = 64, cp_async.warps_m = 1, cp_async.stages = 4;
            bad.tiles = cp_async;
            EXPECT_THROW(choose_tiles(bad), Error);
            continue;
          }
          EXPECT_EQ(t.columns, 0);
          for (const auto& m : g.tensor_maps) EXPECT_EQ(m.swizzle, 128);
          const auto v = variants(spec);
          ASSERT_EQ(v.size(), 2u);
          EXPECT_TRUE(v[1].small_batch);
          const TileConfig small = choose_tiles(v[1]);
          EXPECT_TRUE(small.tma) << tiles_tag(small);
          EXPECT_EQ(small.bm, op == Op::backward_weight ? b : 64) << tiles_tag(small);
          if (op == Op::backward_weight) {
            // one block per CTA, staged (a consumer warp's 2 KB after the barriers, padded to 1024 bytes)
            EXPECT_TRUE(small.staged && t.staged);
            EXPECT_EQ(small.shared_bytes, small.stages * 2 * 64 * b * 2 + 1024 + 1024 + small.warps_m * 4 * 2048);
            EXPECT_EQ(t.bm, b);
            EXPECT_EQ(t.shared_bytes, t.stages * 2 * 64 * b * 2 + 1024 + 1024 + t.warps_m * 4 * 2048);
            // the layout picks a block per CTA or row groups (sdd_choice)
            EXPECT_TRUE(g.name_expression.find("sdd_tma_kernel") != std::string::npos ||
                        g.name_expression.find("sdd_rows_kernel") != std::string::npos)
                << g.name_expression;
            EXPECT_EQ(g.tensor_maps[0].inner, 2 * b) << "X: [n, C]";
            EXPECT_EQ(g.tensor_maps[1].box_outer, 64);
            continue;
          }
          // the stages, their barriers (padded to 1024 bytes), 64 × 64 staging tiles of Y: two per
          // consumer of the swapped kernel (the default: Yᵀ = Wᵀ·Xᵀ, consumers of 64 features)
          EXPECT_TRUE(t.swapped);
          EXPECT_EQ(t.shared_bytes, t.stages * (t.bm * 128 + 64 * b * 2) + 1024 + 1024 + t.warps_m * 2 * 64 * 128);
          // on this layout (one block) backward-data at b = 64 pairs output block columns (layout_choice)
          const bool paired = b == 64 && op == Op::backward_data;
          EXPECT_EQ(g.tiles.paired, paired);
          EXPECT_NE(g.name_expression.find(paired ? "dsd_paired_kernel" : "dsd_tma_kernel"), std::string::npos);
          EXPECT_TRUE(t.persistent && g.persistent) << "one wave of CTAs looping over output tiles";
          EXPECT_NE(g.source.find("kPersistent = true"), std::string::npos);
          EXPECT_EQ(g.tensor_maps[0].box_outer, t.bm);
          EXPECT_EQ(g.tensor_maps[1].outer, b) << "one W block";
          EXPECT_EQ(g.tensor_maps[1].box_outer, op == Op::backward_data ? b : 64);
          EXPECT_EQ(g.tensor_maps[2].inner, g.out_features) << "Y (or dX): [n, outputs]";
          EXPECT_EQ(g.tensor_maps[2].outer, 0) << "n rows, known at launch";
          EXPECT_EQ(g.tensor_maps[2].box_inner, 64);
          EXPECT_EQ(g.tensor_maps[2].box_outer, 64) << "a consumer stores 64 rows at a time";
        }
  // only the dsd TMA kernel loops over tiles: a persistent flag elsewhere (a hand-edited tuning
  // record) is refused, not launched on a grid the kernel does not expect
  for (Op op : {Op::forward, Op::backward_weight}) {
    MatMulSpec s{op, 64, DType::bf16, FeatureAxis::last};
    s.wgmma = true;
    for (TileConfig t : tile_candidates(s)) {
      t.persistent = true;
      s.tiles = t;
      if (t.tma && op == Op::forward) EXPECT_NO_THROW(choose_tiles(s)) << tiles_tag(t);
      else EXPECT_THROW(choose_tiles(s), Error) << tiles_tag(t);
    }
  }
  // the swapped TMA kernel (Yᵀ = Wᵀ·Xᵀ): consumers of 64 features × 128 or 256 rows; only for dsd
  for (int b : {64, 128})
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight}) {
      MatMulSpec s{op, b, DType::bf16, FeatureAxis::last};
      s.wgmma = true;
      int swapped = 0, paired = 0;
      for (const TileConfig& c : tile_candidates(s)) {
        SCOPED_TRACE(tiles_tag(c));
        MatMulSpec tuned = s;
        tuned.tiles = c;
        if (!c.swapped) {
          if (c.tma && op != Op::backward_weight) {  // unswapped: each warp stores its 16 rows
            const auto g = generate_matmul(Layout::from_coords(2, 2, {{0, 0}}), tuned);
            ASSERT_EQ(g.tensor_maps.size(), 3u);
            EXPECT_EQ(g.tensor_maps[2].box_outer, 16);
            EXPECT_EQ(c.shared_bytes, c.stages * (c.bm * 128 + 64 * b * 2) + 1024 + 1024 + c.warps_m * 64 * 128);
          }
          continue;
        }
        if (c.paired) {  // pairs of columns: a stage holds two W blocks, each consumer stores both columns
          ++paired;
          EXPECT_EQ(tiles_tag(c).rfind("pair", 0), 0u);
          EXPECT_EQ(c.shared_bytes, c.stages * (c.bm * 128 + 2 * 64 * 128) + 1024 + 1024 + c.warps_m * 2 * 64 * 128);
          const auto g = generate_matmul(Layout::from_coords(2, 3, {{0, 0}, {1, 1}, {0, 2}}), tuned);
          EXPECT_NE(g.name_expression.find("dsd_paired_kernel"), std::string::npos);
          ASSERT_EQ(g.tensor_maps.size(), 3u);
          EXPECT_EQ(g.tensor_maps[2].box_outer, 64);
          EXPECT_EQ(g.grid_x, op == Op::forward ? 2 : 1) << "output block columns in pairs";
          continue;
        }
        ++swapped;
        EXPECT_NE(tiles_tag(c).find("-sw"), std::string::npos) << "the tag tells the swapped kernel apart";
        const int row_slices = c.warps_m / (b / 64), rows = c.bm / row_slices;
        EXPECT_EQ(row_slices * (b / 64), c.warps_m) << "whole feature slices of 64 per row slice";
        EXPECT_TRUE(rows == 128 || rows == 256) << "wgmma's N: the rows of a consumer";
        EXPECT_EQ(c.shared_bytes, c.stages * (c.bm * 128 + 64 * b * 2) + 1024 + 1024 + c.warps_m * 2 * 64 * 128)
            << "two 64 × 64 staging tiles per consumer";
        const auto g = generate_matmul(Layout::from_coords(2, 2, {{0, 0}, {1, 1}}), tuned);
        EXPECT_NE(g.source.find("kSwapped = true"), std::string::npos);
        EXPECT_NE(g.name_expression.find("dsd_tma_kernel"), std::string::npos);
        ASSERT_EQ(g.tensor_maps.size(), 3u);
        EXPECT_EQ(g.tensor_maps[2].box_outer, 64) << "a consumer stores 64 rows × 64 features at a time";
      }
      EXPECT_EQ(swapped > 0, op != Op::backward_weight) << to_string(op) << " b" << b;
      EXPECT_EQ(paired > 0, op != Op::backward_weight && b == 64) << to_string(op) << " b" << b;
      TileConfig bad = generator::TileConfig{};
      bad.wgmma = bad.tma = bad.persistent = bad.swapped = true, bad.bm = 128, bad.warps_m = 4, bad.stages = 4;
      s.tiles = bad;  // 32 rows per consumer at b = 64, 64 at b = 128: too narrow for the swapped kernel
      EXPECT_THROW(choose_tiles(s), Error);
    }
  // a wgmma shape for a target without it is refused with the reason
  MatMulSpec spec{Op::forward, 128, DType::bf16, FeatureAxis::last};
  TileConfig t;
  t.wgmma = true, t.bm = 128, t.stages = 4;
  spec.tiles = t;
  try {
    choose_tiles(spec);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_90a"), std::string::npos) << e.what();
  }
}

// The persistent Hopper kernels (dsd: TMA, grouped, paired; backward-weight's with two waves of
// units or more) pace their wave (kernels::WaveGate) and so ask for the workspace's counters; the
// small batch, the kernels of a tile per CTA, backward-weight's of one wave and the sm_80 kernels
// do not. Every kernel's split counters stay below the gate's.
TEST(Generator, PersistentHopperKernelsPaceTheirWave) {
  int paced = 0, one_wave = 0, waves = 0, checked = 0;
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {16, 32, 64, 128})
      for (std::int64_t features : {2048, 8192})
        for (bool wgmma : {false, true}) {
          MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
          spec.wgmma = wgmma;
          const Layout layout = random_layout(features / b, features / b, 7 + b);
          for (const MatMulSpec& v : variants(spec)) {
            const GeneratedSource g = generate_matmul(layout, v);
            SCOPED_TRACE(g.label + (wgmma ? " sm_90a " : " sm_80 ") + std::to_string(features));
            const bool hopper = wgmma && !v.small_batch && g.tiles.tma;
            const bool two_waves = g.grid_x >= 2 * resident_ctas(g.tiles, kDefaultSms);
            const bool expect =
                hopper && (op == Op::backward_weight ? two_waves : g.tiles.persistent && !g.tiles.split);
            EXPECT_NE(g.source.find(expect ? "kWaveGate = true" : "kWaveGate = false"), std::string::npos);
            // random columns are even enough for the gate (UnevenColumnsLeaveTheGateOpen for others)
            EXPECT_EQ(g.paced, expect) << "slowdown " << g.pace_slowdown;
            if (expect) {
              EXPECT_GE(g.workspace_bytes, kernels::kSplitCounters * 4);
            }
            paced += expect;
            if (hopper && op == Op::backward_weight) (two_waves ? waves : one_wave) += 1;
            // paced_rounds (the runtime's: no workspace where the gate would not wait) against the
            // rounds the kernels count: the fewest tiles of any CTA (dsd), SddSchedule's whole waves
            // times kWaveGateSteps-step rounds (backward-weight); 0 where the kernel does not pace
            for (std::int64_t ctas : {78, 132})
              for (std::int64_t n : {129, 1000, 8192}) {
                std::int64_t rounds = 0;
                if (expect && g.rows_per_cta > 0) {
                  const std::int64_t tiles = g.grid_x * ((n + g.rows_per_cta - 1) / g.rows_per_cta);
                  rounds = tiles;
                  for (std::int64_t p = 0; p < ctas; ++p) {
                    std::int64_t mine = 0;
                    for (std::int64_t t = p; t < tiles; t += ctas) ++mine;
                    rounds = std::min(rounds, mine);
                  }
                } else if (expect) {
                  const kernels::SddSchedule schedule(static_cast<int>(g.grid_x), static_cast<int>(ctas), 0,
                                                      static_cast<int>((n + 63) / 64));
                  rounds = static_cast<std::int64_t>(schedule.waves) *
                           ((schedule.steps + kernels::kWaveGateSteps - 1) / kernels::kWaveGateSteps);
                }
                EXPECT_EQ(paced_rounds(g, ctas, n), rounds) << ctas << " CTAs, n = " << n;
                ++checked;
              }
          }
        }
  EXPECT_GE(paced, 20) << "forward and backward-data at every block size, backward-weight of two waves";
  EXPECT_GT(checked, 0);
  EXPECT_GE(one_wave, 1) << "a backward-weight kernel of one wave, not paced";
  EXPECT_GE(waves, 4) << "backward-weight kernels of two waves or more, paced";
  static_assert(kernels::kPieceCounters + kernels::kWaveGateCounters == kernels::kSplitCounters);
}

// paced_slowdown, the model of a paced wave: even units cost nothing paced; a long unit that one
// CTA always meets holds the free run as much as the paced one; a long unit that moves from CTA to
// CTA holds every round paced, where running free each CTA meets it once a cycle.
TEST(Generator, PacedSlowdownModel) {
  using generator::paced_slowdown;
  const int lead = kernels::kWaveGateLead;
  EXPECT_DOUBLE_EQ(paced_slowdown(std::vector<std::int64_t>(96, 24), 132, lead, 4), 1.0);
  EXPECT_DOUBLE_EQ(paced_slowdown({}, 132, lead, 4), 1.0);
  // 100 units, P = 10: CTA p meets units p, p + 10, ... (mod 100), so CTA 0 alone meets unit 0
  std::vector<std::int64_t> steps(100, 1);
  steps[0] = 40;
  EXPECT_NEAR(paced_slowdown(steps, 10, lead, 1), 1.0, 0.05);
  // 11 units, P = 10: CTA p meets unit (p + 10k) mod 11 in round k, so the long unit is in 10 rounds
  // of 11, each time another CTA's: free, every CTA takes 41 + 10 · 2 steps a cycle; paced, the
  // rounds after each long one wait for it (within the lead)
  std::vector<std::int64_t> moving(11, 1);
  moving[3] = 40;
  const double held = paced_slowdown(moving, 10, lead, 1);
  EXPECT_GT(held, 2.0) << "the rounds wait for the long unit";
  // more lead leaves more room: the same units paced within more rounds of each other cost less
  EXPECT_LT(paced_slowdown(moving, 10, lead + 4, 1), held);
}

// A dsd kernel's launches pace its wave only where the layout's units are even enough
// (GeneratedSource::pace_slowdown within kPacedSlowdownMax): output columns of a power law (a few
// dense, most sparse) would hold the CTAs at the gate, so the kernel keeps its gate in its source
// (one compile for the shape) and its launches take no workspace, which leaves the gate open.
TEST(Generator, UnevenColumnsLeaveTheGateOpen) {
  for (int b : {64, 128}) {
    const std::int64_t blocks = 8192 / b;
    std::vector<std::pair<std::int64_t, std::int64_t>> even, uneven;
    std::mt19937_64 rng(5 + b);
    for (std::int64_t c = 0; c < blocks; ++c) {
      std::vector<std::int64_t> rows(blocks);
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      // Zipf-like: column c at rank r holds about blocks / (r + 1) · 4 blocks (at least 1)
      const std::int64_t zipf = std::clamp<std::int64_t>(4 * blocks / (1 + (c * 7919) % blocks), 1, blocks);
      for (std::int64_t i = 0; i < zipf; ++i) uneven.emplace_back(rows[i], c);
      for (std::int64_t i = 0; i < blocks / 4; ++i) even.emplace_back(rows[i], c);
    }
    for (Op op : {Op::forward, Op::backward_data}) {
      MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
      spec.wgmma = true, spec.plain = true;
      const GeneratedSource paced = generate_matmul(Layout::from_coords(blocks, blocks, even), spec);
      SCOPED_TRACE(paced.label);
      ASSERT_NE(paced.source.find("kWaveGate = true"), std::string::npos);
      EXPECT_TRUE(paced.paced);
      EXPECT_LE(paced.pace_slowdown, 1.01);
      const Layout layout = op == Op::forward ? Layout::from_coords(blocks, blocks, uneven)
                                              : Layout::from_coords(blocks, blocks, uneven).transposed();
      const GeneratedSource open = generate_matmul(layout, spec);
      EXPECT_NE(open.source.find("kWaveGate = true"), std::string::npos) << "the shape's source keeps its gate";
      EXPECT_FALSE(open.paced) << "slowdown " << open.pace_slowdown;
      EXPECT_GT(open.pace_slowdown, generator::kPacedSlowdownMax);
      EXPECT_EQ(open.workspace_bytes, 0) << "nothing else takes the workspace";
      EXPECT_EQ(paced_rounds(open, 132, 32768), 0);
    }
  }
}

// Backward-weight splits N across CTAs when the layout has too few blocks to fill the GPU, and
// asks for the workspace its partials and arrival counters need.
TEST(Generator, BackwardWeightSplitsFewBlocks) {
  const MatMulSpec dw{Op::backward_weight, 64, DType::bf16, FeatureAxis::last};
  auto few = generate_matmul(Layout::from_coords(8, 8, {{0, 0}, {3, 5}, {7, 7}}), dw);
  EXPECT_EQ(few.splits, 8);
  EXPECT_EQ(few.workspace_bytes, (kernels::kSplitCounters + 8LL * 64 * 64 * 3) * 4);
  EXPECT_NE(few.source.find("kSplits = 8"), std::string::npos);
  // never more CTAs than one wave holds: 132 SMs × CTAs per SM at this shared memory
  const std::int64_t per_sm = std::min<std::int64_t>(227 * 1024 / few.tiles.shared_bytes, 2048 / few.tiles.threads);
  ASSERT_GE(per_sm, 4);
  std::vector<std::uint8_t> twentieth(64 * 64, 0);
  for (int i = 0; i < 205; ++i) twentieth[i * 19] = 1;  // suite W's b=64, d=0.05 count
  auto suite = generate_matmul(Layout::from_dense(64, 64, twentieth), dw);
  EXPECT_EQ(suite.splits, 132 * per_sm / 205);
  EXPECT_LE(suite.splits * 205, 132 * per_sm);
  std::vector<std::uint8_t> full(32 * 32, 1);
  auto many = generate_matmul(Layout::from_dense(32, 32, full), dw);  // 1024 blocks
  EXPECT_EQ(many.splits, 1);
  EXPECT_EQ(many.workspace_bytes, 0);
  // b = 128's tile nearly fills an SM alone: splitting it measured slower, so it never splits
  auto big = generate_matmul(Layout::from_coords(8, 8, {{0, 0}}), {Op::backward_weight, 128, DType::bf16, FeatureAxis::last});
  EXPECT_EQ(big.splits, 1);
  auto generic = generate_matmul(Layout::from_coords(8, 8, {{0, 0}}), {Op::backward_weight, 16, DType::f32, FeatureAxis::last});
  EXPECT_EQ(generic.splits, 1) << "only the pipelined kernel splits";
  auto fwd = generate_matmul(Layout::from_coords(8, 8, {{0, 0}}), {Op::forward, 64, DType::bf16, FeatureAxis::last});
  EXPECT_EQ(fwd.workspace_bytes, 0);
}

TEST(Generator, SourceNamesWhatItIs) {
  Layout layout = Layout::from_dense(2, 2, {1, 0, 0, 1});
  auto g = generate_matmul(layout, {Op::backward_data, 64, DType::f16, FeatureAxis::first});
  EXPECT_EQ(g.label, "backward_data-f16-b64-first");
  EXPECT_EQ(g.name_expression, "bsjit::kernels::dsd_kernel<bsjit_generated::Config>");
  EXPECT_EQ(g.source.find(layout.hash().hex()), std::string::npos) << "the layout is in the tables only";
  EXPECT_NE(g.source.find("kTransW = true"), std::string::npos);
  EXPECT_NE(g.source.find("kFeatureLast = false"), std::string::npos);
  EXPECT_NE(g.source.find("using T = bsjit::kernels::half_t"), std::string::npos);
  EXPECT_EQ(g.in_features, 128);
  EXPECT_EQ(g.out_features, 128);
  // Another layout of the shape: the same source (one compile), other tables (another cache key).
  auto h = generate_matmul(Layout::from_dense(2, 2, {1, 1, 0, 1}), {Op::backward_data, 64, DType::f16, FeatureAxis::first});
  EXPECT_EQ(g.source, h.source);
  EXPECT_NE(tables_digest(g.tables), tables_digest(h.tables));
  // Another shape: another source.
  auto wide = generate_matmul(Layout::from_dense(2, 3, {1, 0, 0, 0, 1, 1}),
                              {Op::backward_data, 64, DType::f16, FeatureAxis::first});
  EXPECT_NE(g.source, wide.source);
}

TEST(DeviceTables, CapacityIsAPowerOfTwoOfAtLeast64AndSevenQuartersOfTheLength) {
  const std::pair<std::size_t, std::size_t> cases[] = {
      {0, 64},      {1, 64},      {37, 64},     {38, 128},    {2341, 4096},  {2342, 8192},  {3072, 8192},
      {4000, 8192}, {4096, 8192}, {4200, 8192}, {4681, 8192}, {4682, 16384}, {6144, 16384}, {11008, 32768}};
  for (auto [n, want] : cases) {
    const DeviceTable t{"kLut", std::vector<int>(n, 1)};
    EXPECT_EQ(capacity(t), want) << n;
    EXPECT_EQ(device_bytes(t), 4 * want) << n;
  }
}

// The three storages: an array in global memory, one in constant memory (both of the capacity),
// and a pointer, whose symbol is 8 bytes whatever the number of values, so that its declaration
// does not change with them.
TEST(DeviceTables, EachStorageHasItsDeclaration) {
  DeviceTables tables;
  EXPECT_EQ(add_table(tables, "kLut", std::vector<int>(65, 1)),
            "extern \"C\" { __device__ int kLut[128]; }  // filled when loaded\n");
  EXPECT_EQ(add_table(tables, "kDims", {4, 4}, TableStorage::constant),
            "extern \"C\" { __constant__ int kDims[64]; }  // filled when loaded\n");
  const std::string small = add_table(tables, "kKeys", std::vector<int>(3, 1), TableStorage::pointer);
  EXPECT_EQ(small, "extern \"C\" { __constant__ int* kKeys; }  // pointed at the values when loaded\n");
  EXPECT_EQ(add_table(tables, "kKeys", std::vector<int>(100000, 1), TableStorage::pointer), small);
  ASSERT_EQ(tables.size(), 4u);
  EXPECT_EQ(device_bytes(tables[0]), 512u);
  EXPECT_EQ(device_bytes(tables[1]), 256u);
  EXPECT_EQ(device_bytes(tables[2]), 8u);
  EXPECT_EQ(device_bytes(tables[3]), 8u);
  EXPECT_EQ(tables[3].values.size(), 100000u);
}

// Layouts of one shape and block count whose blocks sit elsewhere (columns permuted): every
// Hopper kernel at b = 32, 64 and 128 has one source for them all (the counts they loop over are
// tables too), so one compile serves them.
TEST(Generator, LayoutsOfOneShapeShareTheSource) {
  Layout a = random_layout(32, 32, 3);
  std::vector<int> perm(32);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(4));
  std::vector<std::pair<std::int64_t, std::int64_t>> moved;
  for (const auto& [r, c] : a.coords()) moved.push_back({r, perm[c]});
  Layout b = Layout::from_coords(32, 32, moved);
  ASSERT_NE(a.hash().hex(), b.hash().hex());
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int block : {32, 64, 128}) {
      MatMulSpec spec{op, block, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      spec.tiles = choose_tiles(spec);
      const auto ga = generate_matmul(a, spec), gb = generate_matmul(b, spec);
      EXPECT_EQ(ga.source, gb.source) << ga.label;
      EXPECT_NE(tables_digest(ga.tables), tables_digest(gb.tables)) << ga.label;
    }
}

// The Hopper backward-weight kernels take their units in an order that keeps a wave's reads in L2
// (l2_unit_order): on a 12288 × 12288 layer (d = 0.25), the rows that one step of a wave of 132
// units reads (X at its units' row positions, dY at their columns) span under 0.65 of what the
// tables' band order spans (0.8 for column groups, whose rows of X are scattered), for each kernel
// kind; the one-block units carry their block's index.
TEST(Generator, BackwardWeightUnitsGoInAnL2Order) {
  struct Case {
    int b;
    TileConfig t;
    const char* kernel;
  };
  TileConfig rows16, tiled, rows4, cols2, single;
  rows16.wgmma = rows16.tma = true, rows16.row_blocks = 16, rows16.warps_m = 2, rows16.stages = 3;
  tiled.wgmma = tiled.tma = true, tiled.tile_edge = 128, tiled.tile_cols = 256, tiled.warps_m = 2, tiled.stages = 4;
  rows4.wgmma = rows4.tma = true, rows4.row_blocks = 4, rows4.warps_m = 1, rows4.stages = 4;
  cols2.wgmma = cols2.tma = true, cols2.col_blocks = 2, cols2.warps_m = 2, cols2.stages = 4;
  single.wgmma = single.tma = true, single.bm = 64, single.warps_m = 1, single.stages = 4;
  for (const Case& c :
       {Case{32, rows16, "sdd_rows_kernel"}, Case{16, tiled, "sdd_tiled_kernel"}, Case{64, rows4, "sdd_rows_kernel"},
        Case{128, cols2, "sdd_cols_kernel"}, Case{64, single, "sdd_tma_kernel"}}) {
    SCOPED_TRACE(fmt::format("b{} {}", c.b, c.kernel));
    const std::int64_t blocks = 12288 / c.b;
    std::mt19937_64 rng(5);
    std::vector<std::uint8_t> m(blocks * blocks);
    for (auto& v : m) v = rng() % 4 == 0;
    const Layout layout = Layout::from_dense(blocks, blocks, m);
    MatMulSpec spec{Op::backward_weight, c.b, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    spec.tiles = c.t;
    const auto g = generate_matmul(layout, spec);
    ASSERT_NE(g.name_expression.find(c.kernel), std::string::npos);
    const auto coords = table(g, "kCoords"), unit_blocks = table(g, "kTileBlocks");
    const std::int64_t units = g.grid_x, per = static_cast<std::int64_t>(coords.size()) / units;
    // per unit: its row positions' features of one operand, and its column positions' of the other
    const bool by_column = c.t.col_blocks > 0;
    const std::int64_t row_features = c.t.tile_edge > 0 ? 128 : std::max(64, c.b);
    const std::int64_t col_features = c.t.tile_edge > 0 ? 256 : c.b;
    std::vector<std::pair<std::set<std::int64_t>, std::set<std::int64_t>>> reads(units);
    for (std::int64_t u = 0; u < units; ++u) {
      const int* e = coords.data() + u * per;
      if (per == 2 || by_column) reads[u].first.insert(e[0]);
      if (per == 2) reads[u].second.insert(e[1]);
      for (std::int64_t j = 1; per > 2 && j < per; ++j)
        if (e[j] >= 0) reads[u].second.insert(e[j]);
      if (!by_column && per > 2) reads[u].first.insert(e[0]);
    }
    // the footprint of a wave's step, mean over the full waves, in features
    const auto footprint = [&](const std::vector<std::int64_t>& order) {
      double total = 0;
      const std::int64_t waves = units / 132;
      for (std::int64_t w = 0; w < waves; ++w) {
        std::set<std::int64_t> rows, cols;
        for (std::int64_t i = w * 132; i < (w + 1) * 132; ++i) {
          rows.insert(reads[order[i]].first.begin(), reads[order[i]].first.end());
          cols.insert(reads[order[i]].second.begin(), reads[order[i]].second.end());
        }
        total += static_cast<double>(rows.size() * (by_column ? c.b : row_features) +
                                     cols.size() * (by_column ? c.b : col_features));
      }
      return total / static_cast<double>(waves);
    };
    std::vector<std::int64_t> as_generated(units), band_order(units);
    std::iota(as_generated.begin(), as_generated.end(), 0);
    std::iota(band_order.begin(), band_order.end(), 0);
    std::stable_sort(band_order.begin(), band_order.end(), [&](std::int64_t a, std::int64_t b) {
      return std::pair(coords[a * per], coords[a * per + 1]) < std::pair(coords[b * per], coords[b * per + 1]);
    });
    ASSERT_GE(units, 132 * 4);
    // (a column's blocks gather rows of X from anywhere: its units' order narrows only dY)
    const double ratio = footprint(as_generated) / footprint(band_order);
    EXPECT_LT(ratio, by_column ? 0.8 : 0.65);
    RecordProperty(fmt::format("b{}_{}", c.b, c.kernel), fmt::format("{:.2f}", ratio));
    if (c.t.tile_edge == 0 && per == 2) {  // one block a unit: the block's index, each block once
      ASSERT_EQ(static_cast<std::int64_t>(unit_blocks.size()), units);
      std::vector<int> seen(unit_blocks);
      std::sort(seen.begin(), seen.end());
      for (std::int64_t i = 0; i < units; ++i) ASSERT_EQ(seen[i], i);
      for (std::int64_t u = 0; u < units; ++u)
        EXPECT_EQ(layout.block_coord(unit_blocks[u]),
                  (std::pair<std::int64_t, std::int64_t>{coords[2 * u], coords[2 * u + 1]}));
    }
  }
}

}  // namespace
}  // namespace bsjit::generator
