// The benchmark's suite layouts (tools/suite_layouts.hpp): a run of some cells measures the layouts
// that the full table measures, and the full table draws them as it always has (one stream, seed 42,
// in the table's order), so results files stay comparable across runs and versions.
#include "suite_layouts.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "bsjit/error.hpp"

namespace bsjit::bench {
namespace {

const Grid kTable{{"balanced", "bernoulli"}, {16, 32, 64, 128}, {0.5, 0.25, 0.1, 0.05}};

TEST(SuiteLayouts, SomeCellsGetTheFullTablesLayouts) {
  const std::vector<Layout> all = table_layouts(4096, kTable, kTable);
  ASSERT_EQ(all.size(), 32u);
  const std::vector<Layout> some = table_layouts(4096, kTable, {{"bernoulli", "balanced"}, {128, 64}, {0.25, 0.05}});
  ASSERT_EQ(some.size(), 8u);
  auto at = [&](int kind, int block, int density) { return all[(kind * 4 + block) * 4 + density]; };
  EXPECT_EQ(some[0], at(1, 3, 1));  // bernoulli, 128, 0.25
  EXPECT_EQ(some[1], at(1, 3, 3));
  EXPECT_EQ(some[2], at(1, 2, 1));  // bernoulli, 64
  EXPECT_EQ(some[3], at(1, 2, 3));
  EXPECT_EQ(some[4], at(0, 3, 1));  // balanced, 128
  EXPECT_EQ(some[7], at(0, 2, 3));
  EXPECT_NE(some[0], some[4]) << "a Bernoulli and a balanced draw differ";
}

TEST(SuiteLayouts, TheFullTableIsOneStreamInOrder) {
  const std::vector<Layout> all = table_layouts(4096, kTable, kTable);
  std::mt19937_64 rng(42);
  std::size_t i = 0;
  for (const auto& kind : kTable.kinds)
    for (int b : kTable.blocks)
      for (double d : kTable.densities) {
        const Layout expected = kind == "balanced" ? balanced_layout(4096 / b, 4096 / b, d, rng)
                                                   : bernoulli_layout(4096 / b, 4096 / b, d, rng);
        EXPECT_EQ(all[i++], expected) << kind << " b" << b << " d" << d;
      }
}

TEST(SuiteLayouts, BalancedColumnsHoldEqualCountsAndOutsideCellsAreDrawnToo) {
  const std::vector<Layout> cells = table_layouts(4096, kTable, {{"balanced"}, {128}, {0.25, 0.3}});
  ASSERT_EQ(cells.size(), 2u);
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::int64_t per = std::llround((i == 0 ? 0.25 : 0.3) * 32);
    std::vector<std::int64_t> in_column(32, 0);
    for (auto [r, c] : cells[i].coords()) ++in_column[c];
    for (std::int64_t c = 0; c < 32; ++c) EXPECT_EQ(in_column[c], per) << "cell " << i << ", column " << c;
  }
  EXPECT_EQ(table_layouts(4096, kTable, {{"balanced"}, {128}, {0.3}})[0], cells[1]) << "the same draw every run";
  EXPECT_EQ(table_layouts(4096, kTable, {{"balanced"}, {128}, {0.2, 0.3}})[1], cells[1])
      << "whichever other cells the run has";
}

// skewP: columns of two lengths in turn, the longer about 1 + P/100 times the mean, drawn the same
// every run; a misspelt kind is refused, not drawn as some other kind.
TEST(SuiteLayouts, SkewedColumnsAlternateTwoLengthsAndUnknownKindsThrow) {
  const std::vector<Layout> cells = table_layouts(16384, kTable, {{"skew20", "skew40"}, {64}, {0.1}});
  ASSERT_EQ(cells.size(), 2u);
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const double spread = i == 0 ? 0.2 : 0.4;
    const std::int64_t longer = std::llround(25.6 * (1 + spread)), shorter = std::llround(25.6 * (1 - spread));
    std::vector<std::int64_t> in_column(256, 0);
    for (auto [r, c] : cells[i].coords()) ++in_column[c];
    for (std::int64_t c = 0; c < 256; ++c)
      EXPECT_EQ(in_column[c], c % 2 == 0 ? longer : shorter) << "cell " << i << ", column " << c;
    const double mean = static_cast<double>(cells[i].blocks()) / 256.0;
    EXPECT_NEAR(static_cast<double>(longer) / mean, 1 + spread, 0.03);
  }
  EXPECT_NE(cells[0], table_layouts(16384, kTable, {{"balanced"}, {64}, {0.1}})[0]);
  EXPECT_EQ(table_layouts(16384, kTable, {{"skew40"}, {64}, {0.1}})[0], cells[1]) << "the same draw every run";
  for (const char* kind : {"balance", "skew", "skew0", "skew100", "skewx", "Bernoulli"})
    EXPECT_THROW(table_layouts(4096, kTable, {{kind}, {128}, {0.1}}), Error) << kind;
}

}  // namespace
}  // namespace bsjit::bench
