// bsjit::Conv without a GPU: every kernel variant (dtype × activation order × fprop, bprop, updat,
// l2_normalize and its gradient) compiled by NVRTC for sm_80 and sm_90a into a cache directory, one
// compile serving every layout and geometry; shapes of a convolution and a deconvolution; the errors
// a call reports before it touches a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "bsjit/bsjit.hpp"
#include "conv_cases.hpp"
#include "generator/conv_generator.hpp"
#include "runtime/driver.hpp"

namespace bsjit {
namespace {

namespace fs = std::filesystem;

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ConvApi, EveryKernelCompilesForSm80AndSm90aOnceForEveryLayout) {
  const fs::path dir = fs::temp_directory_path() / ("bsjit-conv-api-" + std::to_string(std::random_device{}()));
  set_cache_directory(dir);
  const auto grouped = testing::grouped_conv_layout(), overlapping = testing::overlapping_conv_layout();
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (ActivationOrder order : {ActivationOrder::ncdhw, ActivationOrder::ndhwc}) {
        SCOPED_TRACE(fmt::format("{} {} {}", arch, to_string(dtype), to_string(order)));
        const Conv conv(grouped, ConvGeometry::same({1, 8, 8}, {1, 3, 3}, {1, 2, 2}), {dtype, order, false, ""});
        const auto before = cache_stats();
        EXPECT_EQ(conv.precompile(arch), 5);  // fprop, bprop, updat, l2_normalize and its gradient
        EXPECT_EQ(cache_stats().compiles, before.compiles + 5);
        EXPECT_EQ(conv.precompile(arch), 0);  // in the cache now
        // another layout, geometry and direction: entries of their own, built from the same code
        const Conv other(overlapping, ConvGeometry::valid({3, 5, 11}, {3, 1, 5}, {1, 1, 1}, {1, 1, 2}),
                         {dtype, order, true, ""});
        EXPECT_EQ(other.generated_source(), conv.generated_source());
        other.precompile(arch);
        EXPECT_EQ(cache_stats().compiles, before.compiles + 5) << "no NVRTC run for another layout";
        EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 5);
      }
  std::vector<std::string> labels;
  for (const auto& e : list_cache(dir)) {
    EXPECT_TRUE(e.valid) << e.path << ": " << e.problem;
    labels.push_back(e.label + " " + e.arch);
  }
  std::sort(labels.begin(), labels.end());
  labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
  EXPECT_EQ(labels.size(), 2u * 3u * 2u * 5u);
  EXPECT_EQ(labels.front(), "conv-direct-bf16-ncdhw-bprop sm_80");
  set_cache_directory({});
  fs::remove_all(dir);
}

// The tensor-core kernels: fp16 and bf16 at every block size, for sm_80 and sm_90a, one compile per
// dtype and block size for every uniform layout and geometry; fp32, channels first, layouts not
// uniform and ConvOptions::direct_kernels keep the direct kernels.
TEST(ConvApi, TensorCoreKernelsCompileForEveryBlockSize) {
  const fs::path dir = fs::temp_directory_path() / ("bsjit-conv-tc-" + std::to_string(std::random_device{}()));
  set_cache_directory(dir);
  const Layout mask = Layout::from_coords(2, 3, {{0, 0}, {1, 1}, {0, 2}});
  const auto geometry = ConvGeometry::same({1, 8, 8}, {1, 3, 3});
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (DType dtype : {DType::f16, DType::bf16})
      for (int b : {16, 32, 64, 128}) {
        SCOPED_TRACE(fmt::format("{} {} b{}", arch, to_string(dtype), b));
        const Conv conv(ConvLayout::from_mask(mask, b), geometry, {dtype, ActivationOrder::ndhwc, false, ""});
        EXPECT_NE(conv.generated_source().find("kIgemmFpropStart"), std::string::npos);
        const auto before = cache_stats();
        // fprop, bprop, updat, its store, the packing; l2_normalize's two; on sm_90a at b ≥ 64 the
        // warpgroup fprop, bprop and updat as well, and the three fed by TMA with bprop's filter
        // packing (autotune chooses)
        const bool hopper = arch == "sm_90a" && b >= 64;
        const int kernels = hopper ? 14 : 7;
        EXPECT_EQ(conv.precompile(arch), kernels);
        // (l2_normalize's code is the direct kernels', compiled once per dtype and order)
        const auto compiled = cache_stats().compiles;
        EXPECT_GE(compiled, before.compiles + 5);
        const Conv other(ConvLayout::from_mask(Layout::from_coords(3, 1, {{2, 0}}), b),
                         ConvGeometry::valid({3, 5, 11}, {3, 1, 5}, {1, 1, 1}, {1, 1, 2}),
                         {dtype, ActivationOrder::ndhwc, true, ""});
        EXPECT_EQ(other.precompile(arch), kernels);
        // a 3-D geometry: the TMA kernels' 5-D maps are kernels of their own, compiled once for them all
        EXPECT_EQ(cache_stats().compiles, compiled + (hopper ? 3 : 0))
            << "one compile serves every uniform layout of a block size";
      }
  std::vector<std::string> labels;
  for (const auto& e : list_cache(dir)) {
    EXPECT_TRUE(e.valid) << e.path << ": " << e.problem;
    labels.push_back(e.label + " " + e.arch);
  }
  for (const std::string arch : {"sm_80", "sm_90a"})
    for (const char* dtype : {"f16", "bf16"})
      for (int b : {16, 32, 64, 128})
        for (const std::string kind : {"fprop", "bprop", "updat", "updat_store", "pack"}) {
          const auto label = fmt::format("conv-igemm-{}-b{}-{} {}", dtype, b, kind, arch);
          EXPECT_NE(std::find(labels.begin(), labels.end(), label), labels.end()) << label;
          // sm_90a's data kernels at b = 64 and 128 on the warpgroup tensor cores too (conv_wgmma.cuh)
          if (arch == "sm_90a" && b >= 64 && (kind == "fprop" || kind == "bprop" || kind == "updat")) {
            const auto wgmma = fmt::format("conv-igemm-{}-b{}-wgmma-{} {}", dtype, b, kind, arch);
            EXPECT_NE(std::find(labels.begin(), labels.end(), wgmma), labels.end()) << wgmma;
          }
          // and fprop fed by TMA, with 4-D and 5-D input maps (conv_tma.cuh)
          if (arch == "sm_90a" && b >= 64 && kind == "fprop")
            for (const char* rank : {"fprop4", "fprop5", "bprop4", "bprop5", "updat4", "updat5", "pack_backward"}) {
              const auto tma = fmt::format("conv-tma-{}-b{}-{} {}", dtype, b, rank, arch);
              EXPECT_NE(std::find(labels.begin(), labels.end(), tma), labels.end()) << tma;
            }
        }
  for (const auto& options : {ConvOptions{DType::f32, ActivationOrder::ndhwc, false, ""},
                              ConvOptions{DType::bf16, ActivationOrder::ncdhw, false, ""},
                              ConvOptions{DType::bf16, ActivationOrder::ndhwc, false, "", true}}) {
    const Conv conv(ConvLayout::from_mask(mask, 32), geometry, options);
    EXPECT_EQ(conv.generated_source().find("kIgemmFpropStart"), std::string::npos);
  }
  for (int b : {8, 48}) {  // block sizes the tensor-core kernels do not take
    const Conv conv(ConvLayout::from_mask(mask, b), geometry, {DType::f16, ActivationOrder::ndhwc, false, ""});
    EXPECT_EQ(conv.generated_source().find("kIgemmFpropStart"), std::string::npos) << b;
  }
  set_cache_directory({});
  fs::remove_all(dir);
}

// The warpgroup kernels' tiles: every kernel has the three stages its pipeline needs at least
// (dsd_wgmma_mainloop: one in the tensor cores, one landing, one in flight) and fits two CTAs an
// SM (227 KiB of shared memory each SM, 1 KiB of it the runtime's per CTA).
TEST(ConvApi, WarpgroupTilesHoldThreeStagesAndFitTwoCtasAnSm) {
  for (int b : {64, 128}) {
    const auto t = generator::conv_wgmma_tile(b);
    ASSERT_TRUE(t.has_value()) << b;
    EXPECT_GE(t->stages, 3) << b;
    EXPECT_GE(t->updat_stages, 3) << b;
    EXPECT_LE(2 * (t->shared_bytes(b) + 1024), 228 * 1024) << b;
    EXPECT_LE(2 * (t->updat_shared_bytes(b) + 1024), 228 * 1024) << b;
  }
  EXPECT_FALSE(generator::conv_wgmma_tile(32).has_value());
}

// The geometries TMA's im2col mode takes (conv_tma_rank): a 4-D map without depth, a 5-D one with
// it, within the bounding box's corner ranges ([-128, 127] at rank 4, [-16, 15] at rank 5), tap
// reach and strides up to 8; the other kernels run the rest.
TEST(ConvApi, TmaRankFollowsTheIm2colLimits) {
  using generator::conv_tma_rank;
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({1, 56, 56}, {1, 3, 3})), 4);
  EXPECT_EQ(conv_tma_rank(ConvGeometry::valid({1, 1, 301}, {1, 1, 5}, {1, 1, 2})), 4);  // 1-D
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({1, 56, 56}, {1, 3, 3}, {1, 8, 8})), 4);
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({1, 512, 512}, {1, 7, 7}, {1, 1, 1}, {1, 20, 20})), 4);  // reach 120
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({8, 8, 8}, {3, 3, 3})), 5);
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({8, 8, 8}, {1, 3, 3})), 5);                // depth without depth taps
  EXPECT_EQ(conv_tma_rank(ConvGeometry::valid({1, 40, 40}, {1, 3, 3}, {1, 9, 9})), 0);  // stride 9
  EXPECT_EQ(conv_tma_rank(ConvGeometry::valid({1, 512, 512}, {1, 4, 4}, {1, 1, 1}, {1, 50, 50})), 0);  // reach 150
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({8, 8, 8}, {3, 3, 3}, {1, 1, 1}, {1, 9, 9})), 0);         // reach 18, 3-D
  EXPECT_EQ(conv_tma_rank(ConvGeometry::same({1, 512, 512}, {1, 5, 1}, {1, 1, 1}, {1, 64, 1})), 0);    // reach 256
}

// conv_tma_grid: the persistent grid whose busiest CTA has the least work, each CTA's work counted
// item by item here (CTA p: items p, p + P, ..., item i of column i % columns).
TEST(ConvApi, TmaGridEvensTheColumnClasses) {
  using generator::conv_tma_grid;
  auto busiest = [](const std::vector<std::int64_t>& steps, std::int64_t items, std::int64_t ctas) {
    std::vector<std::int64_t> work(ctas, 0);
    for (std::int64_t i = 0; i < items; ++i) work[i % ctas] += steps[i % static_cast<std::int64_t>(steps.size())] + 1;
    return *std::max_element(work.begin(), work.end());
  };
  // even columns: the whole wave
  EXPECT_EQ(conv_tma_grid({18, 18, 18, 18}, 1568, 132), 132);
  EXPECT_EQ(conv_tma_grid({18, 18, 18, 18}, 100, 132), 100);  // fewer items than CTAs: one each
  EXPECT_EQ(conv_tma_grid({}, 100, 132), 100);
  // bprop of 4 blocks in 4 block rows at random: input block columns of 2, 1, 1 and 0 blocks (9 taps).
  // At 132 CTAs (gcd 4) a quarter of the CTAs take every item of the 2-block column.
  const std::vector<std::int64_t> uneven{18, 9, 9, 0};
  const std::int64_t items = 392 * 4, grid = conv_tma_grid(uneven, items, 132);
  EXPECT_GT(132 - grid, 0);
  EXPECT_LE(132 - grid, 3);
  EXPECT_LT(busiest(uneven, items, grid), 0.6 * static_cast<double>(busiest(uneven, items, 132)));
  // on other shapes: the least busiest CTA of every candidate grid
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const std::int64_t columns = 1 + static_cast<std::int64_t>(rng() % (trial % 3 == 0 ? 100 : 16)),
                       max_ctas = 60 + rng() % 90, total = columns * (1 + static_cast<std::int64_t>(rng() % 400));
    std::vector<std::int64_t> steps(columns);
    for (auto& s : steps) s = static_cast<std::int64_t>(rng() % 40);
    const std::int64_t chosen = conv_tma_grid(steps, total, max_ctas);
    ASSERT_GE(chosen, 1);
    ASSERT_LE(chosen, max_ctas);
    std::int64_t best = busiest(steps, total, max_ctas);
    for (std::int64_t p = std::max<std::int64_t>(1, max_ctas - std::min<std::int64_t>(columns, 64) + 1); p <= max_ctas;
         ++p)
      best = std::min(best, busiest(steps, total, p));
    EXPECT_EQ(busiest(steps, total, chosen), best)
        << columns << " columns, " << total << " items, " << max_ctas << " CTAs";
  }
}

// conv_updat_range: two waves' worth of ranges, more where that shortens the last round: 14 × 14
// layers at b = 64, d = 0.25 (192 units of 98 stages, 264 CTAs resident) go from 3 ranges (576
// CTAs, 3 rounds of 33 stages) to 4 (768, 3 rounds of 25); 56 × 56 d = 0.5 (24 units of 1568)
// keeps its two full waves. Elsewhere: never more rounds × (stages + epilogue) than two waves'
// ranges, whole stages, at most 65535 ranges.
TEST(ConvApi, UpdatRangesShortenTheLastRound) {
  using generator::conv_updat_range;
  auto rounds_work = [](std::int64_t rows, std::int64_t units, std::int64_t resident, std::int64_t per,
                        std::int64_t stage) {
    const std::int64_t ctas = units * ((rows + per - 1) / per);
    return (ctas + resident - 1) / resident * (per / stage + generator::kUpdatEpilogueSteps);
  };
  EXPECT_EQ(conv_updat_range(6272, 192, 264, 64), 25 * 64);
  EXPECT_EQ(conv_updat_range(100352, 24, 264, 64), 72 * 64);
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 500; ++trial) {
    const std::int64_t stage = trial % 2 ? 64 : 32, rows = 1 + static_cast<std::int64_t>(rng() % 300000),
                       units = 1 + static_cast<std::int64_t>(rng() % 2000), resident = 1 + rng() % 300;
    const std::int64_t per = conv_updat_range(rows, units, resident, stage);
    ASSERT_GT(per, 0);
    ASSERT_EQ(per % stage, 0);
    ASSERT_LE((rows + per - 1) / per, 65535);
    // two waves' worth (the rule before): ranges ⌈2 · resident / units⌉, within 1 .. stages
    const std::int64_t stages = (rows + stage - 1) / stage;
    const std::int64_t two = std::clamp<std::int64_t>((2 * resident + units - 1) / units, 1, stages);
    const std::int64_t before = (stages + two - 1) / two * stage;
    EXPECT_LE(rounds_work(rows, units, resident, per, stage), rounds_work(rows, units, resident, before, stage))
        << rows << " rows, " << units << " units, " << resident << " resident";
    EXPECT_LE(per, before);
  }
}

// bprop at stride 1 as a forward convolution of dO: dO's positions the input, the padding the
// filter's reach less the padding; its output the input's positions; no geometry with a stride or a
// padding past the reach.
TEST(ConvApi, TransposedGeometryRunsBpropForward) {
  using generator::conv_transposed_geometry;
  const ConvGeometry geometries[] = {ConvGeometry::same({1, 13, 15}, {1, 3, 3}),
                                     ConvGeometry::valid({1, 12, 14}, {1, 5, 5}, {1, 1, 1}, {1, 2, 2}),
                                     ConvGeometry::same({4, 7, 5}, {3, 3, 3}, {1, 1, 1}, {1, 2, 1}),
                                     ConvGeometry::same({1, 1, 37}, {1, 1, 4})};  // even filter: uneven padding
  for (const auto& g : geometries) {
    const auto t = conv_transposed_geometry(g);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->in, g.out());
    EXPECT_EQ(t->out(), g.in);
    for (int d = 0; d < 3; ++d) {
      const std::int64_t reach = (g.filter[d] - 1) * g.dilation[d];
      EXPECT_EQ(t->pad_before[d], reach - g.pad_before[d]);
      EXPECT_EQ(t->pad_after[d], reach - g.pad_after[d]);
    }
  }
  EXPECT_FALSE(conv_transposed_geometry(ConvGeometry::same({1, 8, 8}, {1, 3, 3}, {1, 2, 2})).has_value());
  ConvGeometry wide = ConvGeometry::valid({1, 8, 8}, {1, 3, 3});
  wide.pad_before = {0, 3, 0}, wide.pad_after = {0, 3, 0};  // more padding than the reach
  EXPECT_FALSE(conv_transposed_geometry(wide).has_value());
}

// The TMA fprop's tile: a producer and two consumer warpgroups, at least two stages (one in the
// tensor cores, one landing), in one CTA's 227 KiB of shared memory.
TEST(ConvApi, TmaTileHoldsItsStagesInOneSm) {
  for (int b : {64, 128}) {
    const auto t = generator::conv_tma_tile(b);
    ASSERT_TRUE(t.has_value()) << b;
    EXPECT_GE(t->stages, 2) << b;
    EXPECT_EQ(t->bm(b), b == 64 ? 256 : 128) << b;  // consumers of 64 channels × 128 rows
    EXPECT_EQ(t->threads(), 384) << b;
    EXPECT_LE(t->shared_bytes(b), 227 * 1024) << b;
    EXPECT_GE(t->updat_stages, 2) << b;
    EXPECT_LE(t->updat_shared_bytes(b), 227 * 1024) << b;
    // the input map's copies are 128 pixels (a consumer's rows); a tile takes whole copies
    const auto g = generator::generate_conv_igemm(ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 1}}), b),
                                                  DType::bf16, true);
    ASSERT_TRUE(g && g->tma) << b;
    EXPECT_EQ(g->tma->copy_rows, 128u) << b;
    EXPECT_EQ(g->tma->rows, t->bm(b)) << b;
    EXPECT_EQ(g->tma->rows % 128, 0) << b;
  }
  EXPECT_FALSE(generator::conv_tma_tile(32).has_value());
}

TEST(ConvApi, ShapesOfAConvolutionAndADeconvolution) {
  const auto layout = testing::grouped_conv_layout();                          // C = 128, K = 192
  const auto geometry = ConvGeometry::same({2, 9, 10}, {3, 3, 3}, {1, 2, 2});  // out 2 × 5 × 5
  const Conv conv(layout, geometry, {DType::bf16, ActivationOrder::ndhwc, false, ""});
  EXPECT_EQ(conv.input_elements(3), 3 * 128 * 2 * 9 * 10);
  EXPECT_EQ(conv.output_elements(3), 3 * 192 * 2 * 5 * 5);
  EXPECT_EQ(conv.filter_elements(), 4 * 48 * 32 * 27);
  const Conv deconv(layout, geometry, {DType::bf16, ActivationOrder::ndhwc, true, ""});
  EXPECT_EQ(deconv.input_elements(3), conv.output_elements(3));
  EXPECT_EQ(deconv.output_elements(3), conv.input_elements(3));
  EXPECT_EQ(deconv.filter_elements(), conv.filter_elements());
  EXPECT_EQ(parse_activation_order("channels_last"), ActivationOrder::ndhwc);
  EXPECT_EQ(parse_activation_order("ncdhw"), ActivationOrder::ncdhw);
  EXPECT_THROW(parse_activation_order("nhwc"), Error);
}

TEST(ConvApi, EdgeBiasShapesAndCompiles) {
  set_cache_directory({});
  const ConvEdgeBias eb(ConvGeometry::same({1, 4, 4}, {1, 3, 3}), 8, {DType::bf16, ActivationOrder::ndhwc, false, ""});
  EXPECT_EQ(eb.edges(), 8);
  EXPECT_EQ(eb.positions(), 16);
  EXPECT_EQ(eb.precompile("sm_90a"), 3);
  EXPECT_EQ(eb.precompile("sm_90a"), 0);
  const ConvEdgeBias none(ConvGeometry::valid({1, 4, 4}, {1, 3, 3}), 8);
  EXPECT_EQ(none.edges(), 0);
  alignas(16) static char buffer[64];
  EXPECT_NE(error_of([&] { eb.forward(nullptr, nullptr, nullptr, buffer, 1); }).find("x is a null pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { eb.forward(buffer, nullptr, nullptr, buffer, 1); }).find("gain is a null pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ConvEdgeBias(ConvGeometry::same({1, 4, 4}, {1, 3, 3}), 0);
            }).find("0 channels"),
            std::string::npos);
}

TEST(ConvApi, RefusesWhatTheKernelsCannotTake) {
  const auto layout = testing::overlapping_conv_layout();
  EXPECT_NE(error_of([&] {
              Conv(layout, ConvGeometry::valid({1, 1, 2}, {1, 1, 3}));
            }).find("wider than"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Conv(layout, ConvGeometry::same({1, 4, 4}, {1, 3, 3}), {DType::f16, {}, false, "sm_70"});
            }).find("sm_70"),
            std::string::npos);
  // 70000 blocks of one channel: past updat's grid
  std::vector<ConvBlock> many;
  for (int i = 0; i < 70000; ++i) many.push_back({{i % 64}, {i % 64}});
  EXPECT_NE(error_of([&] {
              Conv(ConvLayout::from_blocks(64, 64, many), ConvGeometry::same({1, 4, 4}, {1, 3, 3}));
            }).find("65535"),
            std::string::npos);
  // a filter of more than 2^31 elements: 2 blocks of 4096 × 4096 channels at 81 taps
  ConvBlock wide;
  for (int i = 0; i < 4096; ++i) wide.c.push_back(i), wide.k.push_back(i);
  EXPECT_NE(error_of([&] {
              Conv(ConvLayout::from_blocks(4096, 4096, {wide, wide}), ConvGeometry::same({1, 16, 16}, {1, 9, 9}));
            }).find("2147483647"),
            std::string::npos);

  // the call's checks come before any GPU work
  const Conv conv(layout, ConvGeometry::same({1, 4, 4}, {1, 3, 3}), {DType::bf16, ActivationOrder::ndhwc, false, ""});
  alignas(16) static char buffer[64];
  void* p = buffer;
  EXPECT_NE(error_of([&] { conv.fprop(nullptr, p, p, 1); }).find("the first input is a null pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { conv.updat(p, p, buffer + 2, 1); }).find("not 16-byte aligned"), std::string::npos);
  EXPECT_NE(error_of([&] { conv.bprop(p, p, p, 0); }).find("n = 0 out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { conv.fprop(p, p, p, std::int64_t(1) << 40); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { conv.autotune(ConvOp::fprop, 0); }).find("n = 0 is out of range"), std::string::npos);
}

// A caller's workspace (OpOptions::workspace): the tensor-core kernels stage the filter packed per
// tap (fprop, bprop) or fp32 filter-gradient sums (updat) in it, a 1×1 tensor-core case (stride 2)
// and the direct kernels need none; one too small or misaligned is refused before any GPU work.
TEST(ConvApi, WorkspaceSizeIsWhatTheCallStages) {
  const ConvLayout layout = ConvLayout::from_mask(Layout::from_coords(2, 3, {{0, 0}, {1, 1}, {0, 2}}), 32);
  const ConvOptions bf16{DType::bf16, ActivationOrder::ndhwc, false, ""};
  const Conv conv(layout, ConvGeometry::same({1, 8, 8}, {1, 3, 3}), bf16);
  const std::int64_t elements = conv.filter_elements();
  ASSERT_EQ(elements, 3 * 9 * 32 * 32);
  EXPECT_EQ(conv.workspace_size(ConvOp::fprop, 4), static_cast<std::size_t>(elements) * 2);
  EXPECT_EQ(conv.workspace_size(ConvOp::bprop, 4), static_cast<std::size_t>(elements) * 2);
  EXPECT_EQ(conv.workspace_size(ConvOp::updat, 4), static_cast<std::size_t>(elements) * 4);
  const Conv strided(layout, ConvGeometry::valid({1, 6, 5}, {1, 1, 1}, {1, 2, 2}), bf16);
  EXPECT_EQ(strided.workspace_size(ConvOp::fprop, 2), 0u) << "one tap: the filter as it is";
  EXPECT_EQ(strided.workspace_size(ConvOp::updat, 2), static_cast<std::size_t>(strided.filter_elements()) * 4);
  const Conv direct(layout, conv.geometry(), {DType::f32, ActivationOrder::ndhwc, false, ""});
  for (const auto op : {ConvOp::fprop, ConvOp::bprop, ConvOp::updat}) EXPECT_EQ(direct.workspace_size(op, 4), 0u);
  EXPECT_NE(error_of([&] { conv.workspace_size(ConvOp::fprop, 0); }).find("n = 0 out of range"), std::string::npos);

  alignas(16) static char buffer[64];
  void* p = buffer;
  OpOptions small;
  small.workspace = p, small.workspace_bytes = static_cast<std::size_t>(elements) * 2 - 16;
  EXPECT_NE(error_of([&] { conv.fprop(p, p, p, 4, nullptr, small); }).find("must hold"), std::string::npos);
  OpOptions misaligned;
  misaligned.workspace = buffer + 8, misaligned.workspace_bytes = std::size_t{1} << 30;
  EXPECT_NE(
      error_of([&] { conv.updat(p, p, p, 4, nullptr, misaligned); }).find("16-byte aligned (Conv::workspace_size)"),
      std::string::npos);
}

// Without a GPU, autotune says why it cannot run, and so does kernel_name where the kernel depends
// on the GPU (the tensor-core path: the warpgroup kernels on sm_90a).
TEST(ConvApi, AutotuneWithoutAGpuSaysWhy) {
  std::string why;
  if (runtime::gpu_available(&why)) GTEST_SKIP() << "a GPU is here: conv_gpu_test tunes";
  const Conv conv(ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 1}}), 64),
                  ConvGeometry::same({1, 8, 8}, {1, 3, 3}), {DType::bf16, ActivationOrder::ndhwc, false, ""});
  for (const auto op : {ConvOp::fprop, ConvOp::bprop, ConvOp::updat}) EXPECT_THROW(conv.autotune(op, 4), Error);
  for (const auto op : {ConvOp::fprop, ConvOp::bprop, ConvOp::updat}) EXPECT_THROW(conv.kernel_name(op), Error);
  EXPECT_EQ(
      Conv(conv.layout(), conv.geometry(), {DType::f32, ActivationOrder::ndhwc, false, ""}).kernel_name(ConvOp::fprop),
      "direct");
}

}  // namespace
}  // namespace bsjit
