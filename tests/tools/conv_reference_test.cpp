// The block-sparse convolution's layout and its CPU reference: the layout's readers and checks, the
// geometry's SAME and VALID padding, a hand-computed 1-D case, the block computation against the
// dense convolution with the layout expanded (openai/blocksparse's test layouts: disjoint blocks,
// overlapping ones), and bprop and updat as fprop's adjoints.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "bsjit/conv_layout.hpp"
#include "bsjit/error.hpp"
#include "conv_cases.hpp"
#include "conv_reference.hpp"

namespace bsjit {
namespace {

namespace fs = std::filesystem;
using reference::ConvProblem;

std::vector<double> random_values(std::int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0, scale = 1e-300;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / scale);
  return worst;
}

TEST(ConvLayout, ChecksItsBlocks) {
  EXPECT_THROW(ConvLayout::from_blocks(4, 4, {}), Error);
  EXPECT_THROW(ConvLayout::from_blocks(4, 4, {{{0, 1}, {}}}), Error);
  EXPECT_THROW(ConvLayout::from_blocks(4, 4, {{{0, 4}, {1}}}), Error);
  EXPECT_THROW(ConvLayout::from_blocks(4, 4, {{{0, -1}, {1}}}), Error);
  try {
    ConvLayout::from_blocks(4, 4, {{{2, 0, 2}, {1}}});
    ADD_FAILURE() << "a channel twice in a block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input channel 2 twice"), std::string::npos) << e.what();
  }
  const ConvLayout g = testing::grouped_conv_layout();
  EXPECT_EQ(g.filter_elements(9), 4 * 48 * 32 * 9);
  EXPECT_EQ(g.filter_offset(2, 9), 2 * 48 * 32 * 9);
  const ConvLayout u = ConvLayout::from_mask(Layout::from_coords(2, 3, {{0, 0}, {1, 2}}), 8);
  ASSERT_EQ(u.blocks().size(), 2u);
  EXPECT_EQ(u.C(), 16);
  EXPECT_EQ(u.K(), 24);
  EXPECT_EQ(u.blocks()[1].c.front(), 8);
  EXPECT_EQ(u.blocks()[1].k.front(), 16);
}

TEST(ConvLayout, ReadsJsonAndRefusesMalformedFiles) {
  const fs::path dir = fs::temp_directory_path() / ("bsjit-conv-" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  };
  const ConvLayout l = ConvLayout::from_json(write("a.json", R"({"C": 6, "K": 4, "blocks": [{"c": [0, 5], "k": [3]},
                                                                                {"c": [1], "k": [0, 1, 2]}]})"));
  EXPECT_EQ(l.C(), 6);
  ASSERT_EQ(l.blocks().size(), 2u);
  EXPECT_EQ(l.blocks()[0].c, (std::vector<std::int32_t>{0, 5}));
  EXPECT_EQ(l.blocks()[1].k, (std::vector<std::int32_t>{0, 1, 2}));
  const ConvLayout m = ConvLayout::from_json(write("m.json", R"({"block": 16, "mask": [[1, 0], [1, 1]]})"));
  EXPECT_EQ(m.C(), 32);
  EXPECT_EQ(m.blocks().size(), 3u);
  for (const char* bad :
       {R"({"C": 6, "K": 4, "blocks": [{"c": [6], "k": [0]}]})",
        R"({"C": 6, "K": 4, "blocks": [{"c": [0.5], "k": [0]}]})",
        R"({"C": 6, "K": 4, "blocks": [{"c": [], "k": [0]}]})", R"({"C": 6, "K": 4, "blocks": [[0, 1]]})",
        R"({"C": -1, "K": 4, "blocks": []})", R"({"C": 6, "K": 4})", R"({"block": 0, "mask": [[1]]})",
        R"({"block": 8, "mask": [[1], [1, 0]]})", R"({"block": 8, "mask": [["x"]]})", "[1, 2]", "not json"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(ConvLayout::from_json(write("bad.json", bad)), Error);
  }
  EXPECT_THROW(ConvLayout::from_json(dir / "missing.json"), Error);
  fs::remove_all(dir);
}

TEST(ConvGeometry, SameValidAndErrors) {
  const auto same = ConvGeometry::same({1, 9, 10}, {1, 3, 3}, {1, 2, 2});
  EXPECT_EQ(same.out(), (std::array<std::int64_t, 3>{1, 5, 5}));  // ceil(in / stride)
  EXPECT_EQ(same.pad_before[1] + same.pad_after[1], 2);
  EXPECT_EQ(same.pad_before[2] + same.pad_after[2], 1);
  EXPECT_EQ(same.pad_after[2], 1) << "the odd pad after, as TensorFlow's SAME";
  EXPECT_EQ(ConvGeometry::valid({1, 9, 10}, {1, 3, 3}, {1, 2, 2}).out(), (std::array<std::int64_t, 3>{1, 4, 4}));
  EXPECT_EQ(ConvGeometry::valid({1, 1, 11}, {1, 1, 3}, {1, 1, 1}, {1, 1, 2}).out()[2], 7) << "dilation 2";
  EXPECT_THROW(ConvGeometry::valid({1, 1, 2}, {1, 1, 3}), Error);
  EXPECT_THROW(ConvGeometry::valid({1, 1, 8}, {1, 1, 0}), Error);
  EXPECT_THROW(ConvGeometry::valid({1, 1, 8}, {1, 1, 1}, {1, 1, 0}), Error);
}

// 1-D, one channel in and out, by hand: input 1..5, filter [1, 10], stride 2, pad 1 before and
// after, dilation 2: out[o] = in[2o − 1] + 10 · in[2o + 1] (zero outside).
TEST(ConvReference, HandComputedOneDimensionalCase) {
  const ConvLayout one = ConvLayout::from_blocks(1, 1, {{{0}, {0}}});
  ConvProblem p{&one, ConvGeometry{{1, 1, 5}, {1, 1, 2}, {1, 1, 2}, {1, 1, 2}, {0, 0, 1}, {0, 0, 1}}, 1, false};
  ASSERT_EQ(p.geometry.out()[2], 3);
  const auto out = reference::conv_fprop(p, {1, 2, 3, 4, 5}, {1, 10});
  EXPECT_EQ(out, (std::vector<double>{0 + 10 * 2, 2 + 10 * 4, 4 + 10 * 0}));  // in[i] = i + 1
}

// The block computation equals the dense convolution of the layout's filter scattered into [K, C,
// T, R, S], in both activation orders; bprop and updat are fprop's adjoints:
// ⟨fprop(I, F), G⟩ = ⟨I, bprop(G, F)⟩ = ⟨F, updat(I, G)⟩.
TEST(ConvReference, BlocksMatchTheDenseConvolutionAndTheGradientsAreAdjoints) {
  std::mt19937_64 rng(56);
  for (const auto& c : testing::conv_cases())
    for (bool last : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (last ? " channels last" : " channels first"));
      const ConvProblem p{&c.layout, c.geometry, c.n, last};
      const auto input = random_values(reference::conv_input_elements(p), rng);
      const auto filter = random_values(c.layout.filter_elements(c.geometry.taps()), rng);
      const auto grad_out = random_values(reference::conv_output_elements(p), rng);
      const auto out = reference::conv_fprop(p, input, filter);
      EXPECT_LE(max_relative(out, reference::dense_conv_fprop(p, input, reference::dense_filter(p, filter))), 1e-12);
      const double forward = dot(out, grad_out);
      EXPECT_NEAR(dot(input, reference::conv_bprop(p, grad_out, filter)), forward, 1e-9 * std::abs(forward) + 1e-9);
      EXPECT_NEAR(dot(filter, reference::conv_updat(p, input, grad_out)), forward, 1e-9 * std::abs(forward) + 1e-9);
    }
}

// Channels last and channels first hold the same convolution, transposed.
TEST(ConvReference, ActivationOrdersAgree) {
  const ConvLayout l = testing::overlapping_conv_layout();
  const ConvGeometry g = ConvGeometry::same({1, 3, 4}, {1, 3, 3});
  const ConvProblem first{&l, g, 2, false}, last{&l, g, 2, true};
  std::mt19937_64 rng(57);
  const auto in_first = random_values(reference::conv_input_elements(first), rng);
  const auto filter = random_values(l.filter_elements(g.taps()), rng);
  const std::int64_t C = l.C(), K = l.K(), HW = 3 * 4;
  std::vector<double> in_last(in_first.size());
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t s = 0; s < HW; ++s) in_last[(n * HW + s) * C + c] = in_first[(n * C + c) * HW + s];
  const auto out_first = reference::conv_fprop(first, in_first, filter),
             out_last = reference::conv_fprop(last, in_last, filter);
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t s = 0; s < HW; ++s)
        ASSERT_DOUBLE_EQ(out_last[(n * HW + s) * K + k], out_first[(n * K + k) * HW + s]);
}

}  // namespace
}  // namespace bsjit
