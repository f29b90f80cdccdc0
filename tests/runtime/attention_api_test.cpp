// Attention and AttentionOps without a GPU: precompilation into a cache directory (what a build
// machine does before a service ships), each kernel an entry of its own, a second pass finding
// them all.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "bsjit/bsjit.hpp"
#include "runtime/attention_common.hpp"

namespace bsjit {
namespace {

// A launch order whose runs read every line (a causal mask's, near enough): a band then holds the
// pairs whose whole streamed tensors fit.
generator::TileFootprint every_line(std::int64_t lines) { return {{lines}, lines, lines}; }

// The fused kernels' grid runs in bands of (batch, head) pairs whose streamed tensors fit half the
// L2 (kernels::BandedTile): the H100's 50 MiB at S = 8192, d = 128 (K and V 4 MiB a head, 64 lines
// of 128 positions), 132 CTAs a wave.
TEST(AttentionBands, BandsOfHeadsFitHalfTheL2) {
  const std::int64_t l2 = 50 << 20, line = 2 * 128 * 128 * 2, wave = 132;
  const auto all = every_line(64);
  EXPECT_EQ(runtime::head_band(64, line, all, wave, l2, 1), 6);
  EXPECT_EQ(runtime::head_band(64, line / 8, all, wave, l2, 8), 48)
      << "8 query heads a key/value head: 50 pairs, whole groups";
  EXPECT_EQ(runtime::head_band(64, line / 16, all, wave, l2, 16), 64) << "never past the pairs there are";
  EXPECT_EQ(runtime::head_band(64, line, all, wave, l2, 16), 6) << "a group wider than the band: the band as it is";
  EXPECT_EQ(runtime::head_band(3, 16, all, wave, l2, 1), 3);
  EXPECT_EQ(runtime::head_band(64, std::int64_t{1} << 34, all, wave, l2, 1), 1) << "at least one pair";
  EXPECT_EQ(runtime::head_band(64, 0, all, wave, l2, 1), 64);
  EXPECT_EQ(runtime::head_band(64, line, all, wave, 0, 4), 1) << "no L2 reported";
  for (int group : {1, 2, 4, 8})
    for (std::int64_t bytes = 1 << 16; bytes <= (std::int64_t{1} << 26); bytes *= 2) {
      const int band = runtime::head_band(256, bytes / 64, all, wave, l2, group);
      ASSERT_GE(band, 1);
      ASSERT_LE(band, 256);
      if (band >= group) {
        EXPECT_EQ(band % group, 0) << bytes << " bytes, group " << group;
      }
      if (band > 1) {
        EXPECT_LE(band * bytes, l2 / 2) << bytes << " bytes, group " << group;
      }
    }
}

// With a window mask a wave's run of t tiles a pair reads about t + 20 lines (S = 8192 in blocks
// of 64: 128 lines), so the band widens until the wave's runs fill the L2's half: the widest band
// that does, found by trying every width.
TEST(AttentionBands, AWindowMasksBandWidensToWhatAWavesRunsRead) {
  generator::TileFootprint window{{}, 128, 128};
  for (std::int64_t w = 1;; w *= 2) {
    window.blocks.push_back(std::min<std::int64_t>(128, w + 20));
    if (w >= 128) break;
  }
  const std::int64_t l2 = 50 << 20, line = 2 * 64 * 64 * 2;  // Q and dO at d = 64: 16 KiB a block
  for (std::int64_t wave : {1, 132, 264, 1000})
    for (std::int64_t pairs : {1, 7, 64, 512})
      for (int group : {1, 4}) {
        std::int64_t want = 1;
        for (std::int64_t w = pairs; w >= 1; --w)
          if (w * line * window.of((wave + w - 1) / w) <= l2 / 2) {
            want = w;
            break;
          }
        if (want >= group) want -= want % group;
        EXPECT_EQ(runtime::head_band(pairs, line, window, wave, l2, group), want)
            << pairs << " pairs, " << wave << " CTAs a wave, group " << group;
      }
  // the backward at d = 64, 2 CTAs an SM on 132 SMs: 12 pairs a band with every line, 57 with the window's
  EXPECT_EQ(runtime::head_band(64, line, every_line(128), 264, l2, 1), 12);
  EXPECT_GT(runtime::head_band(64, line, window, 264, l2, 1), 40);
}

TEST(AttentionApi, PrecompilesForwardBackwardAndOpsWithoutAGpu) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("bsjit-attention-api-" + std::to_string(std::random_device{}()));
  set_cache_directory(dir);
  const std::vector<Layout> masks{layouts::causal(4), layouts::sliding_window(4, 2)};
  const Attention attn(masks, {128, 128, DType::bf16, QkvOrder::bshd, true, ""});
  EXPECT_TRUE(attn.precompile("sm_90a"));
  EXPECT_FALSE(attn.precompile("sm_90a"));  // every kernel is in the cache now
  auto labels = [&] {
    std::vector<std::string> v;
    for (const auto& e : list_cache(dir)) {
      EXPECT_TRUE(e.valid) << e.path << ": " << e.problem;
      EXPECT_EQ(e.arch, e.label.find("ops") != std::string::npos ? "sm_80" : "sm_90a");
      v.push_back(e.label);
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  // the Hopper forward and backward (block and head dim ≥ 64 on sm_90a), the backward's prep and dq
  EXPECT_EQ(labels(), (std::vector<std::string>{"attention_backward-bf16-b128-d128-bshd-causal-tma",
                                                "attention_backward-bf16-b128-d128-bshd-causal-tma-dq",
                                                "attention_backward-bf16-b128-d128-bshd-causal-tma-prep",
                                                "attention_forward-bf16-b128-d128-bshd-causal-tma"}));
  const AttentionOps ops(masks, {32, 64, DType::f16, QkvOrder::bhsd, false, ""});
  EXPECT_EQ(ops.precompile("sm_80"), 5);
  EXPECT_EQ(ops.precompile("sm_80"), 0);
  EXPECT_EQ(labels().size(), 9u);
  EXPECT_THROW(ops.precompile("sm_70"), Error);
  set_cache_directory({});
  fs::remove_all(dir);
}

// Masks of one shape whose blocks sit elsewhere share the compiles: the second object's kernels
// are entries of their own, built from the first one's code with their own tables.
TEST(AttentionApi, MasksOfOneShapeCompileOnce) {
  set_cache_directory({});
  const Layout a = Layout::from_coords(4, 4, {{0, 0}, {1, 1}, {2, 0}, {3, 3}});
  const Layout b = Layout::from_coords(4, 4, {{0, 1}, {1, 0}, {2, 2}, {3, 1}});
  const AttentionOptions o{64, 64, DType::bf16, QkvOrder::bshd, false, ""};
  const Attention first({a}, o), second({b}, o);
  auto before = cache_stats();
  EXPECT_TRUE(first.precompile("sm_90a"));
  EXPECT_EQ(cache_stats().compiles, before.compiles + 4);  // forward, backward main, prep, dq
  EXPECT_TRUE(second.precompile("sm_90a"));               // new entries ...
  EXPECT_EQ(cache_stats().compiles, before.compiles + 4);  // ... with no NVRTC run
  EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 4);
  const AttentionOps ops_a({a}, o), ops_b({b}, o);
  EXPECT_EQ(ops_a.precompile("sm_80"), 5);
  EXPECT_EQ(ops_b.precompile("sm_80"), 5);
  EXPECT_EQ(cache_stats().compiles, before.compiles + 9);
  EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 9);
}

// Grouped-query attention: the backward's fourth kernel (dK and dV from their fp32 accumulators)
// compiles with the others, and a group is a configuration of its own (its own compiles); the
// workspace holds the accumulators of heads / kv_group key/value heads.
TEST(AttentionApi, GroupedQueriesPrecompileFiveKernels) {
  set_cache_directory({});
  const std::vector<Layout> masks{layouts::causal(4)};
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    const Attention multi(masks, {64, 64, DType::bf16, QkvOrder::bshd, true, ""});
    const Attention grouped(masks, {64, 64, DType::bf16, QkvOrder::bshd, true, "", 4});
    auto before = cache_stats();
    EXPECT_TRUE(multi.precompile(arch));
    EXPECT_EQ(cache_stats().compiles, before.compiles + 4) << arch;
    EXPECT_TRUE(grouped.precompile(arch));
    EXPECT_EQ(cache_stats().compiles, before.compiles + 9) << arch << ": forward, prep, main, dq and dkv";
    EXPECT_FALSE(grouped.precompile(arch));
    EXPECT_EQ(grouped.backward_workspace_size(2, 8) - multi.backward_workspace_size(2, 8),
              2 * 2 * 2 * 256 * 64 * sizeof(float));
  }
}

// A fused forward and backward compiled for one sequence length serve every other: a model served
// at many lengths compiles its attention kernels once.
TEST(AttentionApi, SequenceLengthsShareOneCompile) {
  set_cache_directory({});
  const AttentionOptions o{128, 64, DType::f16, QkvOrder::bhsd, true, ""};
  const Attention short_one({layouts::causal(8)}, o), long_one({layouts::causal(96)}, o);
  auto before = cache_stats();
  EXPECT_TRUE(short_one.precompile("sm_90a"));
  EXPECT_EQ(cache_stats().compiles, before.compiles + 4);
  EXPECT_TRUE(long_one.precompile("sm_90a"));
  EXPECT_EQ(cache_stats().compiles, before.compiles + 4);
  EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 4);
  EXPECT_FALSE(long_one.precompile("sm_90a"));  // its own entries now exist
  const AttentionOps short_ops({layouts::causal(8)}, o), long_ops({layouts::causal(96)}, o);
  EXPECT_EQ(short_ops.precompile("sm_80"), 5);
  EXPECT_EQ(long_ops.precompile("sm_80"), 5);  // new entries, shared code
  EXPECT_EQ(cache_stats().compiles, before.compiles + 9);
  EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 9);
}

}  // namespace
}  // namespace bsjit
