// The benchmark's suite layouts (tools/suite_layouts.hpp): a run of some cells measures the layouts
// that the full table measures, and the full table draws them as it always has (one stream, seed 42,
// in the table's order), so results files stay comparable across runs and versions.
#include "suite_layouts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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

std::vector<std::int64_t> column_lengths(const Layout& L) {
  std::vector<std::int64_t> in_column(L.cols(), 0);
  for (auto [r, c] : L.coords()) ++in_column[c];
  return in_column;
}

// Power-law columns: about d · rows · cols blocks, most columns short and a few tens of times longer
// (a Zipf law over the columns, clamped at the rows), every column at least one block.
TEST(SuiteLayouts, PowerLawColumnsHoldTheDensityAndAreHeavyTailed) {
  std::mt19937_64 rng(1);
  const Layout L = power_law_layout(384, 384, 0.25, rng);
  EXPECT_NEAR(static_cast<double>(L.blocks()) / (384.0 * 384.0), 0.25, 0.01);
  std::vector<std::int64_t> lengths = column_lengths(L);
  std::sort(lengths.begin(), lengths.end());
  EXPECT_GE(lengths.front(), 1);
  const double median = static_cast<double>(lengths[192]), mean = 0.25 * 384;
  EXPECT_LT(median, 0.6 * mean) << "most columns under the mean";
  EXPECT_GE(static_cast<double>(lengths.back()), 5 * median) << "a heavy tail";
  EXPECT_GE(lengths.back(), 10 * lengths.front());
  std::mt19937_64 again(1);
  EXPECT_EQ(power_law_layout(384, 384, 0.25, again), L) << "the same draw from the same stream";
}

// Small-world: every column holds round(d · rows) blocks, about 9 in 10 of them within the band
// around its place on the diagonal, the rest anywhere.
TEST(SuiteLayouts, SmallWorldColumnsAreMostlyNearTheDiagonal) {
  std::mt19937_64 rng(2);
  const std::int64_t rows = 344, cols = 128, per = std::llround(0.1 * rows);  // a 11008 × 4096 layer at b = 32
  const Layout L = small_world_layout(rows, cols, 0.1, rng);
  for (std::int64_t n : column_lengths(L)) ASSERT_EQ(n, per);
  std::int64_t near = 0;
  for (auto [r, c] : L.coords()) {
    const std::int64_t center = c * rows / cols, distance = std::abs(r - center);
    near += std::min(distance, rows - distance) <= per / 2;
  }
  const double share = static_cast<double>(near) / static_cast<double>(L.blocks());
  EXPECT_GT(share, 0.85);
  EXPECT_LT(share, 0.97) << "some long connections";
}

// A layers-suite class round-trips through its name; bad names are refused with the form expected;
// a class's layout is the same every run and differs between classes.
TEST(SuiteLayouts, LayerClassesParseAndDrawTheSameLayoutEveryRun) {
  const LayerClass layer = parse_layer_class("4096x11008/powerlaw/8192");
  EXPECT_EQ(layer, (LayerClass{4096, 11008, 8192, "powerlaw"}));
  EXPECT_EQ(to_string(layer), "4096x11008/powerlaw/8192");
  for (const LayerClass& c : default_layer_classes()) EXPECT_EQ(parse_layer_class(to_string(c)), c);
  EXPECT_EQ(default_layer_classes().front(), (LayerClass{4096, 4096, 8192, "balanced"})) << "suite W's, the reference";
  for (const char* bad : {"4096x4096", "4096x4096/balanced", "4096/balanced/8192", "4096x-4096/balanced/8192",
                          "4096x4096/balance/8192", "0x4096/balanced/8192", "4096x4096/balanced/99999999999"}) {
    try {
      parse_layer_class(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CxK/kind/N"), std::string::npos) << e.what();
    }
  }
  const Layout L = layer_layout(layer, 64, 0.25);
  EXPECT_EQ(L.rows(), 64);
  EXPECT_EQ(L.cols(), 172);
  EXPECT_EQ(layer_layout(layer, 64, 0.25), L);
  EXPECT_NE(layer_layout({4096, 11008, 8192, "balanced"}, 64, 0.25), L);
  EXPECT_THROW(layer_layout({4096, 11000, 8192, "balanced"}, 64, 0.25), Error) << "64 does not divide 11000";
}

}  // namespace
}  // namespace bsjit::bench
