// The direct convolution kernels (templates/bsjit/conv_direct.cuh) run on the CPU
// (kernel_emulation.hpp): each kernel's CTAs and threads one after another with the tables the
// generator makes for the layout and the sizes argument the runtime passes, against the
// double-precision reference. The kernels use no shared memory and no synchronization, so running
// their threads in turn computes what the GPU computes (up to the order of fp32 rounding: the GPU
// fuses multiply and add). The grids are smaller than the work, so every grid-stride loop turns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "conv_cases.hpp"
#include "conv_reference.hpp"
#include "generator/conv_generator.hpp"
#include "reference.hpp"

#include "conv_emulation.hpp"
// (after the emulation)
#include "bsjit/conv_direct.cuh"

namespace bsjit {
namespace {

using emulation::doubles;
using emulation::gate_of;
using emulation::gated_filter;
using emulation::table;
using emulation::typed;
using reference::ConvProblem;

template <class TT, bool kLast>
struct HostConfig {
  using T = TT;
  static constexpr bool kChannelsLast = kLast;
  static inline kernels::ConvTables t{};
  static kernels::ConvTables tables() { return t; }
  static inline kernels::ConvEdgeTables edge{};
  static kernels::ConvEdgeTables edge_tables() { return edge; }
};

// kernel() for every thread of a grid_x × grid_y grid of the kernels' CTAs, one after another.
template <class Kernel>
void run_grid(unsigned grid_x, unsigned grid_y, Kernel kernel) {
  emulation::run_grid(grid_x, grid_y, kernels::kConvThreads, kernel);
}

template <class T, bool kLast>
void check_case(const testing::ConvCase& c, DType dtype, std::mt19937_64& rng) {
  using Cfg = HostConfig<T, kLast>;
  const ConvProblem p{&c.layout, c.geometry, c.n, kLast};
  const std::int64_t taps = c.geometry.taps();
  const generator::GeneratedConv g = generator::generate_conv(c.layout, taps, dtype, kLast);
  Cfg::t = {table(g.tables, "kConvBlocks"),     table(g.tables, "kConvChannels"), table(g.tables, "kConvOutStart"),
            table(g.tables, "kConvOutEntries"), table(g.tables, "kConvInStart"),  table(g.tables, "kConvInEntries"),
            table(g.tables, "kConvRows")};
  const kernels::ConvDims d = generator::conv_dims(c.layout, c.geometry, c.n);
  const double tolerance = dtype == DType::f32 ? 1e-5 : 1e-2;

  const auto input = reference::random_values(dtype, reference::conv_input_elements(p), rng);
  const auto filter = reference::random_values(dtype, c.layout.filter_elements(taps), rng);
  const auto grad_out = reference::random_values(dtype, reference::conv_output_elements(p), rng);
  const auto in_t = typed<T>(dtype, input), filter_t = typed<T>(dtype, filter), grad_out_t = typed<T>(dtype, grad_out);
  const std::vector<float> gate = gate_of(c.layout.blocks().size());
  const T poison = kernels::from_float<T>(std::nanf(""));

  for (const bool gated : {false, true}) {
    SCOPED_TRACE(gated ? "gated" : "plain");
    const float* gp = gated ? gate.data() : nullptr;
    const auto& f_ref = gated ? gated_filter(c.layout, taps, filter, gate) : filter;

    std::vector<T> out(grad_out.size(), poison);
    run_grid(3, 1, [&] { kernels::conv_fprop_kernel<Cfg>(in_t.data(), filter_t.data(), out.data(), gp, 0, d); });
    EXPECT_LE(reference::relative_error(doubles(dtype, out), reference::conv_fprop(p, input, f_ref)), tolerance)
        << "fprop";

    std::vector<T> grad_in(input.size(), poison);
    run_grid(3, 1,
             [&] { kernels::conv_bprop_kernel<Cfg>(grad_out_t.data(), filter_t.data(), grad_in.data(), gp, 0, d); });
    EXPECT_LE(reference::relative_error(doubles(dtype, grad_in), reference::conv_bprop(p, grad_out, f_ref)), tolerance)
        << "bprop";

    std::vector<T> grad_f(filter.size(), poison);
    run_grid(2, static_cast<unsigned>(c.layout.blocks().size()),
             [&] { kernels::conv_updat_kernel<Cfg>(in_t.data(), grad_out_t.data(), grad_f.data(), gp, 0, d); });
    const auto want_f = reference::conv_updat(p, input, grad_out);
    EXPECT_LE(
        reference::relative_error(doubles(dtype, grad_f), gated ? gated_filter(c.layout, taps, want_f, gate) : want_f),
        tolerance)
        << "updat";

    // accumulate: the result added to what the output held
    if (!gated) {
      std::vector<T> again(out);
      run_grid(3, 1, [&] { kernels::conv_fprop_kernel<Cfg>(in_t.data(), filter_t.data(), again.data(), gp, 1, d); });
      auto twice = reference::conv_fprop(p, input, filter);
      for (auto& x : twice) x *= 2;
      EXPECT_LE(reference::relative_error(doubles(dtype, again), twice), tolerance) << "fprop accumulate";
    }
  }
}

// l2_normalize and its gradient against their definition in double precision (tools/conv_reference):
// every row (a block's output channel; a deconvolution's: a block's input channel) scaled to unit
// norm and by its gain; the gradient by the chain rule through the norm.
template <class T>
void check_l2_normalize(const ConvLayout& layout, std::int64_t taps, DType dtype, bool deconv, std::mt19937_64& rng) {
  using Cfg = HostConfig<T, true>;
  const generator::GeneratedConv g = generator::generate_conv(layout, taps, dtype, true, deconv);
  Cfg::t.rows = table(g.tables, "kConvRows");
  const auto f = reference::random_values(dtype, layout.filter_elements(taps), rng);
  const auto u = reference::random_values(dtype, f.size(), rng);
  const std::int64_t rows = g.rows;
  ASSERT_EQ(static_cast<std::int64_t>(reference::conv_filter_rows(layout, taps, deconv).size()), rows);
  std::vector<double> gain(rows);
  for (std::int64_t i = 0; i < rows; ++i) gain[i] = 0.5 + static_cast<double>(i % 5) * 0.25;
  const std::vector<float> gain_f(gain.begin(), gain.end());
  const auto want = reference::conv_l2_normalize(layout, taps, deconv, f, gain);
  const auto [want_grad, want_gain] = reference::conv_l2_normalize_grad(layout, taps, deconv, f, gain, u);
  const auto f_t = typed<T>(dtype, f), u_t = typed<T>(dtype, u);
  const double tolerance = dtype == DType::f32 ? 1e-5 : 1e-2;
  std::vector<T> out(f.size(), kernels::from_float<T>(std::nanf("")));
  std::vector<float> sums(rows, std::nanf("")), grad_gain(rows, std::nanf(""));
  const int count = static_cast<int>(rows);
  run_grid(2, 1, [&] {
    kernels::conv_l2_normalize_kernel<Cfg>(f_t.data(), gain_f.data(), out.data(), sums.data(), 1e-12f, count);
  });
  EXPECT_LE(reference::relative_error(doubles(dtype, out), want), tolerance) << "l2_normalize";
  std::vector<T> grad(f.size(), kernels::from_float<T>(std::nanf("")));
  run_grid(2, 1, [&] {
    kernels::conv_l2_normalize_grad_kernel<Cfg>(u_t.data(), f_t.data(), gain_f.data(), sums.data(), grad.data(),
                                                grad_gain.data(), 1e-12f, count);
  });
  EXPECT_LE(reference::relative_error(doubles(dtype, grad), want_grad), tolerance) << "l2_normalize gradient";
  EXPECT_LE(reference::relative_error({grad_gain.begin(), grad_gain.end()}, want_gain), tolerance) << "gain gradient";
}

TEST(ConvOnTheCpu, L2NormalizeAndItsGradientMatchTheirDefinition) {
  std::mt19937_64 rng(5699);
  for (const auto& c : testing::conv_cases())
    for (bool deconv : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (deconv ? ", deconvolution" : ""));
      check_l2_normalize<float>(c.layout, c.geometry.taps(), DType::f32, deconv, rng);
      check_l2_normalize<kernels::bfloat16_t>(c.layout, c.geometry.taps(), DType::bf16, deconv, rng);
    }
}

// A 1×1 convolution on a uniform layout, channels last, is the matmul conv_matmul_plan names: the
// matmul's reference with the filter's blocks gathered into its order (by the gather kernel, run here)
// gives the convolution's fprop, bprop and updat (scattered back), gated and accumulating too.
TEST(ConvOnTheCpu, OneByOneConvolutionsAreThePlannedMatmuls) {
  std::mt19937_64 rng(5603);
  const Layout mask = Layout::from_coords(3, 4, {{0, 1}, {2, 0}, {1, 1}, {0, 3}, {2, 2}});
  for (int b : {8, 16}) {
    const ConvLayout layout = ConvLayout::from_mask(mask, b);
    for (const auto& geometry : {ConvGeometry::valid({1, 3, 5}, {1, 1, 1}), ConvGeometry::same({2, 3, 2}, {1, 1, 1})}) {
      const auto plan = generator::conv_matmul_plan(layout, geometry, true);
      ASSERT_TRUE(plan.has_value());
      ASSERT_EQ(plan->block, b);
      const std::int64_t n = 2, rows = n * geometry.in[0] * geometry.in[1] * geometry.in[2];
      const ConvProblem cp{&layout, geometry, n, true};
      const reference::Problem mp{&plan->layout, b, FeatureAxis::last, rows};
      const auto x = reference::random_values(DType::f32, reference::conv_input_elements(cp), rng);
      const auto y = reference::random_values(DType::f32, reference::conv_output_elements(cp), rng);
      const auto f = reference::random_values(DType::f32, layout.filter_elements(1), rng);
      const std::vector<float> gate = gate_of(layout.blocks().size());
      // the filter and the gate in the matmul's order, by the gather kernel
      const std::vector<float> f32(f.begin(), f.end());
      std::vector<float> w(f.size()), g(gate.size());
      const int blocks = static_cast<int>(plan->order.size());
      run_grid(2, 1, [&] {
        kernels::conv_gather_blocks_kernel<float>(f32.data(), w.data(), plan->order.data(), blocks, b * b, 0);
      });
      run_grid(1, 1, [&] {
        kernels::conv_gather_blocks_kernel<float>(gate.data(), g.data(), plan->order.data(), blocks, 1, 0);
      });
      const std::vector<double> wd(w.begin(), w.end());
      const auto gated = gated_filter(layout, 1, f, gate);
      EXPECT_LE(reference::relative_error(reference::matmul(mp, Op::backward_data, x, wd, nullptr, g),
                                          reference::conv_fprop(cp, x, gated)),
                1e-12)
          << "fprop";
      EXPECT_LE(reference::relative_error(reference::matmul(mp, Op::forward, y, wd, &x, g),
                                          [&] {
                                            auto want = reference::conv_bprop(cp, y, gated);
                                            for (std::size_t i = 0; i < want.size(); ++i) want[i] += x[i];
                                            return want;
                                          }()),
                1e-12)
          << "bprop, accumulating";
      const auto dw = reference::matmul(mp, Op::backward_weight, y, x, nullptr, g);
      const std::vector<float> dw32(dw.begin(), dw.end());
      std::vector<float> df(f.size());
      run_grid(2, 1, [&] {
        kernels::conv_gather_blocks_kernel<float>(dw32.data(), df.data(), plan->order.data(), blocks, b * b, 1);
      });
      EXPECT_LE(reference::relative_error({df.begin(), df.end()},
                                          gated_filter(layout, 1, reference::conv_updat(cp, x, y), gate)),
                1e-6)
          << "updat";
    }
  }
  // what is not such a matmul: a wider filter, a stride, padding, channels first, uneven or
  // overlapping blocks, a block size the matmul lacks
  const ConvLayout uniform = ConvLayout::from_mask(mask, 16);
  EXPECT_FALSE(generator::conv_matmul_plan(uniform, ConvGeometry::same({1, 4, 4}, {1, 1, 3}), true));
  EXPECT_FALSE(generator::conv_matmul_plan(uniform, ConvGeometry::valid({1, 4, 4}, {1, 1, 1}, {1, 1, 2}), true));
  EXPECT_FALSE(generator::conv_matmul_plan(
      uniform, ConvGeometry{{1, 4, 4}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {0, 0, 1}, {0, 0, 1}}, true));
  EXPECT_FALSE(generator::conv_matmul_plan(uniform, ConvGeometry::valid({1, 4, 4}, {1, 1, 1}), false));
  EXPECT_FALSE(
      generator::conv_matmul_plan(testing::overlapping_conv_layout(), ConvGeometry::valid({1, 1, 4}, {1, 1, 1}), true));
  EXPECT_FALSE(
      generator::conv_matmul_plan(testing::grouped_conv_layout(), ConvGeometry::valid({1, 1, 4}, {1, 1, 1}), true));
  EXPECT_FALSE(
      generator::conv_matmul_plan(ConvLayout::from_mask(mask, 24), ConvGeometry::valid({1, 1, 4}, {1, 1, 1}), true));
}

// ConvEdgeBias's groups by hand: SAME 3-wide filters leave the border positions, one group for each
// set of taps they miss; a deconvolution's are its output's (the convolution's input) positions.
TEST(ConvOnTheCpu, EdgeBiasGroupsThePositionsPaddingReaches) {
  const auto one = generator::conv_edges(ConvGeometry::same({1, 1, 5}, {1, 1, 3}), false);
  EXPECT_EQ(one.of, (std::vector<int>{0, -1, -1, -1, 1}));
  EXPECT_EQ(one.edges, 2);
  const auto two = generator::conv_edges(ConvGeometry::same({1, 4, 4}, {1, 3, 3}), false);
  EXPECT_EQ(two.edges, 8) << "four corners and four sides";
  EXPECT_EQ(two.of, (std::vector<int>{0, 1, 1, 2, 3, -1, -1, 4, 3, -1, -1, 4, 5, 6, 6, 7}));
  EXPECT_EQ(two.start, (std::vector<int>{0, 1, 3, 4, 6, 8, 9, 11, 12}));
  EXPECT_EQ(generator::conv_edges(ConvGeometry::valid({1, 4, 4}, {1, 3, 3}), false).edges, 0) << "no padding";
  // a deconvolution of stride 2: its position x misses tap t where the convolution's output that
  // would read x through t, (x + 1 − t) / 2, is a whole number outside [0, 3) (odd numerators are the
  // stride's holes, not padding)
  const ConvGeometry strided{{1, 1, 6}, {1, 1, 3}, {1, 1, 2}, {1, 1, 1}, {0, 0, 1}, {0, 0, 0}};
  ASSERT_EQ(strided.out()[2], 3);
  const auto de = generator::conv_edges(strided, true);
  std::map<std::vector<int>, int> seen;
  std::vector<int> want_of;
  for (int x = 0; x < 6; ++x) {
    std::vector<int> missed;
    for (int t = 0; t < 3; ++t) {
      const int num = x + 1 - t;
      if (num % 2 == 0 && (num < 0 || num / 2 >= 3)) missed.push_back(t);
    }
    if (missed.empty()) {
      want_of.push_back(-1);
      continue;
    }
    want_of.push_back(seen.emplace(missed, static_cast<int>(seen.size())).first->second);
  }
  EXPECT_EQ(de.of, want_of);
  EXPECT_EQ(want_of, (std::vector<int>{-1, -1, -1, -1, -1, 0})) << "x = 5 misses tap 0 (output 3)";
}

// The edge-bias kernels against their definition on the generator's groups.
template <class T, bool kLast>
void check_edge_bias(const ConvGeometry& geometry, bool deconv, DType dtype, std::mt19937_64& rng) {
  using Cfg = HostConfig<T, kLast>;
  const auto g = generator::generate_conv_edge_bias(geometry, deconv, dtype, kLast);
  Cfg::edge = {table(g.tables, "kEdgeOf"), table(g.tables, "kEdgeStart"), table(g.tables, "kEdgePositions")};
  const int n = 3, channels = 5, positions = static_cast<int>(g.edges.of.size()), edges = g.edges.edges;
  ASSERT_GT(edges, 0);
  const auto x = reference::random_values(dtype, static_cast<std::size_t>(n) * channels * positions, rng);
  const auto dy = reference::random_values(dtype, x.size(), rng);
  std::vector<float> gain(static_cast<std::size_t>(edges) * channels), bias(gain.size());
  for (std::size_t i = 0; i < gain.size(); ++i) gain[i] = 0.5f + 0.1f * static_cast<float>(i % 9), bias[i] = 0.01f * i;
  auto param = [&](int e, int c) { return kLast ? e * channels + c : c * edges + e; };
  auto index = [&](int image, int c, int p) {
    return kLast ? (static_cast<std::int64_t>(image) * positions + p) * channels + c
                 : (static_cast<std::int64_t>(image) * channels + c) * positions + p;
  };
  std::vector<double> want_y(x.size()), want_dx(x.size()), want_gain(gain.size(), 0), want_bias(gain.size(), 0);
  for (int image = 0; image < n; ++image)
    for (int c = 0; c < channels; ++c)
      for (int p = 0; p < positions; ++p) {
        const auto i = index(image, c, p);
        const int e = g.edges.of[p];
        want_y[i] = e < 0 ? x[i] : x[i] * gain[param(e, c)] + bias[param(e, c)];
        want_dx[i] = e < 0 ? dy[i] : dy[i] * gain[param(e, c)];
        if (e >= 0) want_gain[param(e, c)] += dy[i] * x[i], want_bias[param(e, c)] += dy[i];
      }
  const double tolerance = dtype == DType::f32 ? 1e-5 : 1e-2;
  auto y = typed<T>(dtype, x);  // in place
  run_grid(2, 1, [&] {
    kernels::conv_edge_bias_kernel<Cfg>(y.data(), gain.data(), bias.data(), y.data(), n, channels, positions, edges);
  });
  EXPECT_LE(reference::relative_error(doubles(dtype, y), want_y), tolerance) << "forward";
  const auto x_t = typed<T>(dtype, x), dy_t = typed<T>(dtype, dy);
  std::vector<T> dx(x.size(), kernels::from_float<T>(std::nanf("")));
  std::vector<float> dgain(gain.size(), std::nanf("")), dbias(gain.size(), std::nanf(""));
  run_grid(2, 1, [&] {
    kernels::conv_edge_bias_grad_kernel<Cfg>(dy_t.data(), gain.data(), dx.data(), n, channels, positions, edges);
  });
  run_grid(1, 1, [&] {
    kernels::conv_edge_bias_sums_kernel<Cfg>(dy_t.data(), x_t.data(), dgain.data(), dbias.data(), n, channels,
                                             positions, edges);
  });
  EXPECT_LE(reference::relative_error(doubles(dtype, dx), want_dx), tolerance) << "dx";
  EXPECT_LE(reference::relative_error({dgain.begin(), dgain.end()}, want_gain), tolerance) << "grad gain";
  EXPECT_LE(reference::relative_error({dbias.begin(), dbias.end()}, want_bias), tolerance) << "grad bias";
}

TEST(ConvOnTheCpu, EdgeBiasAndItsGradientMatchTheirDefinition) {
  std::mt19937_64 rng(5604);
  for (const auto& [geometry, deconv] : {std::pair{ConvGeometry::same({1, 6, 7}, {1, 3, 3}, {1, 2, 2}), false},
                                         std::pair{ConvGeometry::same({3, 4, 5}, {3, 3, 3}), false},
                                         std::pair{ConvGeometry::same({1, 6, 7}, {1, 3, 3}, {1, 2, 2}), true}}) {
    SCOPED_TRACE(deconv ? "deconvolution" : "convolution");
    check_edge_bias<float, true>(geometry, deconv, DType::f32, rng);
    check_edge_bias<float, false>(geometry, deconv, DType::f32, rng);
    check_edge_bias<kernels::bfloat16_t, true>(geometry, deconv, DType::bf16, rng);
  }
}

class ConvOnTheCpu : public ::testing::TestWithParam<DType> {};

TEST_P(ConvOnTheCpu, EveryCaseMatchesTheReference) {
  std::mt19937_64 rng(5600 + static_cast<int>(GetParam()));
  for (const auto& c : testing::conv_cases())
    for (bool last : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (last ? ", channels last" : ", channels first"));
      switch (GetParam()) {
        case DType::f32:
          last ? check_case<float, true>(c, DType::f32, rng) : check_case<float, false>(c, DType::f32, rng);
          break;
        case DType::f16:
          last ? check_case<kernels::half_t, true>(c, DType::f16, rng)
               : check_case<kernels::half_t, false>(c, DType::f16, rng);
          break;
        case DType::bf16:
          last ? check_case<kernels::bfloat16_t, true>(c, DType::bf16, rng)
               : check_case<kernels::bfloat16_t, false>(c, DType::bf16, rng);
          break;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ConvOnTheCpu, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace bsjit
