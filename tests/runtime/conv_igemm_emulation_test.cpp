// The tensor-core convolution kernels (templates/bsjit/conv_igemm.cuh) run on the CPU
// (kernel_emulation.hpp: a thread per CUDA thread, barriers, ldmatrix and mma.sync as the PTX ISA
// defines them) with the generator's tables and tiles, against the double-precision reference:
// fprop, bprop and updat (through the filter's packing and the sums' store) on the uniform cases of
// tests/conv_cases.hpp, plain, gated and accumulating, outputs poisoned with NaN. The grids are
// smaller than the work where the kernels loop (fprop and bprop over row tiles), and updat's
// position ranges short, so that several add into one block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "conv_cases.hpp"
#include "conv_emulation.hpp"
#include "conv_reference.hpp"
#include "generator/conv_generator.hpp"
#include "reference.hpp"
// (after the emulation)
#include "bsjit/conv_igemm.cuh"

namespace bsjit {
namespace {

using emulation::doubles;
using emulation::gate_of;
using emulation::gated_filter;
using emulation::table;
using emulation::typed;
using reference::ConvProblem;

// The generated kernels' configs (generator::conv_igemm_tiles), tables set per case.
template <class TT, int B, bool kUpdat>
struct IgemmConfig {
  using T = TT;
  static constexpr generator::ConvIgemmTile kTile =
      kUpdat ? generator::conv_igemm_tiles(B).updat : generator::conv_igemm_tiles(B).data;
  static constexpr int kB = B, kBM = kTile.bm, kBN = B, kBK = kTile.bk, kStages = kTile.stages;
  static constexpr int kWarpsM = kTile.warps_m, kWarpsN = kTile.warps_n, kThreads = kTile.threads();
  static inline kernels::ConvIgemmTables t{};
  static kernels::ConvIgemmTables tables() { return t; }
};

constexpr auto kConcurrent = emulation::Threads::concurrent;

template <class T, int B>
void check_case(const testing::ConvCase& c, DType dtype, std::mt19937_64& rng) {
  using Data = IgemmConfig<T, B, false>;
  using Updat = IgemmConfig<T, B, true>;
  const auto g = generator::generate_conv_igemm(c.layout, dtype, true);
  ASSERT_TRUE(g.has_value());
  ASSERT_EQ(g->block, B);
  ASSERT_EQ(g->data_threads, Data::kThreads);
  ASSERT_EQ(g->updat_rows, Updat::kBK);
  const kernels::ConvIgemmTables tables{table(g->tables, "kIgemmFpropStart"), table(g->tables, "kIgemmFpropEntries"),
                                        table(g->tables, "kIgemmBpropStart"), table(g->tables, "kIgemmBpropEntries"),
                                        table(g->tables, "kIgemmCoords")};
  Data::t = Updat::t = tables;
  const ConvProblem p{&c.layout, c.geometry, c.n, true};
  const kernels::ConvDims d = generator::conv_dims(c.layout, c.geometry, c.n);
  const int taps = static_cast<int>(c.geometry.taps()), blocks = static_cast<int>(c.layout.blocks().size()), b = B;

  const auto input = reference::random_values(dtype, reference::conv_input_elements(p), rng);
  const auto filter = reference::random_values(dtype, c.layout.filter_elements(taps), rng);
  const auto grad_out = reference::random_values(dtype, reference::conv_output_elements(p), rng);
  const auto in_t = typed<T>(dtype, input), filter_t = typed<T>(dtype, filter), grad_out_t = typed<T>(dtype, grad_out);
  const std::vector<float> gate = gate_of(blocks);
  const T poison = kernels::from_float<T>(std::nanf(""));
  constexpr double kTolerance = 1e-2;

  // the filter packed per tap, by the packing kernel
  std::vector<T> packed(filter_t.size(), poison);
  emulation::run_grid(2, 1, 256,
                      [&] { kernels::conv_igemm_pack_kernel<T>(filter_t.data(), packed.data(), blocks, b, taps); });
  // fprop and bprop: two CTAs' worth of row tiles in y at most, so that a CTA takes several
  const std::int64_t out_rows = c.n * c.geometry.out()[0] * c.geometry.out()[1] * c.geometry.out()[2];
  const std::int64_t in_rows = c.n * c.geometry.in[0] * c.geometry.in[1] * c.geometry.in[2];
  auto tiles = [](std::int64_t rows) {
    return static_cast<unsigned>(std::min<std::int64_t>(2, (rows + Data::kBM - 1) / Data::kBM));
  };
  auto fprop = [&](std::vector<T>& out, const float* gp, int accumulate) {
    emulation::run_grid(
        static_cast<unsigned>(c.layout.K() / b), tiles(out_rows), Data::kThreads,
        [&] {
          kernels::conv_igemm_data_kernel<Data, false>(in_t.data(), packed.data(), out.data(), gp, accumulate, d);
        },
        kConcurrent);
  };

  for (const bool gated : {false, true}) {
    SCOPED_TRACE(gated ? "gated" : "plain");
    const float* gp = gated ? gate.data() : nullptr;
    const auto& f_ref = gated ? gated_filter(c.layout, taps, filter, gate) : filter;

    std::vector<T> out(grad_out.size(), poison);
    fprop(out, gp, 0);
    EXPECT_LE(reference::relative_error(doubles(dtype, out), reference::conv_fprop(p, input, f_ref)), kTolerance)
        << "fprop";
    if (!gated) {  // accumulate: the result added to what the output held
      fprop(out, nullptr, 1);
      auto twice = reference::conv_fprop(p, input, filter);
      for (auto& x : twice) x *= 2;
      EXPECT_LE(reference::relative_error(doubles(dtype, out), twice), kTolerance) << "fprop accumulate";
    }

    std::vector<T> grad_in(input.size(), poison);
    emulation::run_grid(
        static_cast<unsigned>(c.layout.C() / b), tiles(in_rows), Data::kThreads,
        [&] {
          kernels::conv_igemm_data_kernel<Data, true>(grad_out_t.data(), packed.data(), grad_in.data(), gp, 0, d);
        },
        kConcurrent);
    EXPECT_LE(reference::relative_error(doubles(dtype, grad_in), reference::conv_bprop(p, grad_out, f_ref)), kTolerance)
        << "bprop";

    // updat: ranges of two stages, the sums' store over a grid smaller than the filter
    std::vector<float> sums(filter.size(), 0.0f);
    const int chunk = 2 * Updat::kBK;
    emulation::run_grid(
        static_cast<unsigned>(blocks * taps), static_cast<unsigned>((out_rows + chunk - 1) / chunk), Updat::kThreads,
        [&] { kernels::conv_igemm_updat_kernel<Updat>(in_t.data(), grad_out_t.data(), sums.data(), gp, chunk, d); },
        kConcurrent);
    std::vector<T> grad_f(filter.size(), poison);
    emulation::run_grid(2, 1, 256, [&] {
      kernels::conv_igemm_updat_store_kernel<T>(sums.data(), grad_f.data(), gp, 0, blocks, b, taps);
    });
    const auto want_f = reference::conv_updat(p, input, grad_out);
    EXPECT_LE(
        reference::relative_error(doubles(dtype, grad_f), gated ? gated_filter(c.layout, taps, want_f, gate) : want_f),
        kTolerance)
        << "updat";
  }
}

template <class T>
void check_every_case(DType dtype, std::mt19937_64& rng) {
  for (const auto& c : testing::tensor_core_conv_cases()) {
    SCOPED_TRACE(c.name);
    switch (c.layout.blocks().front().c.size()) {
      case 16:
        check_case<T, 16>(c, dtype, rng);
        break;
      case 32:
        check_case<T, 32>(c, dtype, rng);
        break;
      case 64:
        check_case<T, 64>(c, dtype, rng);
        break;
      case 128:
        check_case<T, 128>(c, dtype, rng);
        break;
      default:
        ADD_FAILURE() << "no tensor-core kernel for this block size";
    }
  }
}

TEST(ConvTensorCoresOnTheCpu, EveryUniformCaseMatchesTheReferenceInBf16) {
  std::mt19937_64 rng(5607);
  check_every_case<kernels::bfloat16_t>(DType::bf16, rng);
}

TEST(ConvTensorCoresOnTheCpu, EveryUniformCaseMatchesTheReferenceInFp16) {
  std::mt19937_64 rng(5608);
  check_every_case<kernels::half_t>(DType::f16, rng);
}

// updat's CTAs with taps in groups (the warpgroup kernel's ConvWgmmaTile::updat_taps; x = block ·
// ⌈taps / group⌉ + tap / group): every (block, tap) taken by exactly one CTA of a range, and each tap
// of a group reading, for every position of the range, the input position that the CTA of that tap
// alone (group 1, x = block · taps + tap) reads.
TEST(ConvTensorCoresOnTheCpu, UpdatTapGroupsTakeEveryTapOnce) {
  int checked = 0;
  for (const auto& c : testing::tensor_core_conv_cases()) {
    SCOPED_TRACE(c.name);
    const kernels::ConvDims d = generator::conv_dims(c.layout, c.geometry, c.n);
    const int taps = static_cast<int>(c.geometry.taps()), blocks = static_cast<int>(c.layout.blocks().size());
    const int chunk = 128,
              rows = static_cast<int>(c.n * c.geometry.out()[0] * c.geometry.out()[1] * c.geometry.out()[2]);
    for (int group : {1, 2, 3, 4}) {
      const int groups = (taps + group - 1) / group;
      for (unsigned y = 0; y * chunk < static_cast<unsigned>(rows); ++y) {
        std::vector<int> taken(static_cast<std::size_t>(blocks) * taps, 0);
        for (unsigned x = 0; x < static_cast<unsigned>(blocks * groups); ++x) {
          blockIdx = {x, y, 0};
          const kernels::ConvUpdatRange range(d, chunk, group);
          ASSERT_EQ(range.taps, taps);
          ASSERT_EQ(range.tap % group, 0);
          for (int j = 0; j < group && range.tap + j < taps; ++j) {
            ++taken[static_cast<std::size_t>(range.block) * taps + range.tap + j];
            int reach[3];
            range.tap_reach(range.tap + j, reach);
            blockIdx = {static_cast<unsigned>(range.block * taps + range.tap + j), y, 0};
            const kernels::ConvUpdatRange alone(d, chunk);
            ASSERT_EQ(alone.block, range.block);
            ASSERT_EQ(alone.tap, range.tap + j);
            ASSERT_EQ(alone.length, range.length);
            for (int i = 0; i < chunk; ++i) {
              int image, o[3];
              range.position(i, image, o);
              ASSERT_EQ(range.source(image, o, reach, i < range.length), alone.source(i)) << "position " << i;
            }
            ++checked;
          }
        }
        for (std::size_t u = 0; u < taken.size(); ++u) ASSERT_EQ(taken[u], 1) << "block and tap " << u;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace bsjit
