#include "bsjit/attention_layouts.hpp"

#include <gtest/gtest.h>

#include "bsjit/error.hpp"

namespace bsjit::layouts {
namespace {

std::vector<std::uint8_t> rows(std::initializer_list<std::initializer_list<int>> r) {
  std::vector<std::uint8_t> m;
  for (auto& row : r)
    for (int v : row) m.push_back(static_cast<std::uint8_t>(v));
  return m;
}

bool is_causal(const Layout& l) {
  for (auto& [i, j] : l.coords())
    if (j > i) return false;
  return true;
}

TEST(AttentionLayouts, TheHeaderExample) {
  EXPECT_EQ(causal(4).dense(), rows({{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 1, 1}}));
  EXPECT_EQ(sliding_window(4, 2).dense(), rows({{1, 0, 0, 0}, {1, 1, 0, 0}, {0, 1, 1, 0}, {0, 0, 1, 1}}));
  EXPECT_EQ(global_tokens(4, 1).dense(), rows({{1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}}));
  EXPECT_EQ(unite(sliding_window(4, 2), global_tokens(4, 1)).dense(),
            rows({{1, 0, 0, 0}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 0, 1, 1}}));
}

TEST(AttentionLayouts, CountsAndCausality) {
  EXPECT_EQ(causal(64).blocks(), 64 * 65 / 2);
  // suite A's window + global at block 128, S = 8192: 64 blocks, window 1024 = 8 blocks, 256 global keys = 2 blocks
  Layout a = unite(sliding_window(64, 8), global_tokens(64, 2));
  EXPECT_TRUE(is_causal(a));
  EXPECT_EQ(a.stats().max_blocks_per_row, 10);
  EXPECT_EQ(a.stats().min_blocks_per_row, 1);
  EXPECT_EQ(sliding_window(10, 3, false).blocks(), 10 + 2 * 9 + 2 * 8);
  EXPECT_TRUE(is_causal(strided(32, 4)));
  EXPECT_TRUE(is_causal(fixed(32, 4, 1)));
}

TEST(AttentionLayouts, SparseTransformerPatterns) {
  // strided, stride 2 over 5 blocks: the band i-j < 2 plus every second block back
  EXPECT_EQ(strided(5, 2).dense(),
            rows({{1, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {1, 1, 1, 0, 0}, {0, 1, 1, 1, 0}, {1, 0, 1, 1, 1}}));
  // fixed, chunks of 2 with 1 summary block (the last of each chunk: 1, 3, ...)
  EXPECT_EQ(fixed(5, 2, 1).dense(),
            rows({{1, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {0, 1, 1, 0, 0}, {0, 1, 1, 1, 0}, {0, 1, 0, 1, 1}}));
}

TEST(AttentionLayouts, BigBird) {
  Layout a = bigbird(16, 3, 1, 2, 7), b = bigbird(16, 3, 1, 2, 7), c = bigbird(16, 3, 1, 2, 8);
  EXPECT_EQ(a, b) << "same seed, same layout";
  EXPECT_FALSE(a == c);
  Layout base = unite(sliding_window(16, 3, false), global_tokens(16, 1, false, true));
  for (std::int64_t i = 0; i < 16; ++i)
    for (std::int64_t j = 0; j < 16; ++j)
      if (base.at(i, j)) {
        EXPECT_TRUE(a.at(i, j)) << i << "," << j;
      }
  // every non-global row gains exactly `random` blocks beyond window and global
  std::vector<std::int64_t> extra(16, 0);
  for (auto& [i, j] : a.coords()) extra[i] += base.at(i, j) ? 0 : 1;
  for (std::int64_t i = 1; i < 16; ++i) EXPECT_EQ(extra[i], 2) << "row " << i;
  // an edge column holds the window (3 rows) and the global row
  EXPECT_GE(a.stats().min_blocks_per_col, 4);
  EXPECT_EQ(a.stats().max_blocks_per_row, 16) << "the global row attends every key block";
}

TEST(AttentionLayouts, BadArguments) {
  EXPECT_THROW(causal(0), Error);
  EXPECT_THROW(sliding_window(4, 0), Error);
  EXPECT_THROW(global_tokens(4, 5), Error);
  EXPECT_THROW(fixed(8, 2, 3), Error);
  EXPECT_THROW(unite(causal(3), causal(4)), Error);
}

}  // namespace
}  // namespace bsjit::layouts
