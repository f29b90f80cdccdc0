// The public MatMul API's argument checks and its behaviour without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <random>

#include "bsjit/bsjit.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_registry.hpp"

namespace bsjit {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const Layout kLayout = Layout::from_dense(2, 3, {1, 0, 1, 0, 1, 0});

TEST(MatMulApi, RejectsBadOptions) {
  EXPECT_NE(error_of([] { MatMul(kLayout, {12, DType::f32, FeatureAxis::last, ""}); }).find("block size 12"),
            std::string::npos);
  EXPECT_NE(error_of([] { MatMul(kLayout, {32, DType::f32, FeatureAxis::last, "sm_70"}); }).find("sm_70"),
            std::string::npos);
  // TF32 is for fp32 inputs, on the feature-last tensor-core kernels (b ≥ 16)
  for (MatMulOptions o : {MatMulOptions{32, DType::bf16, FeatureAxis::last, "", true},
                          MatMulOptions{8, DType::f32, FeatureAxis::last, "", true},
                          MatMulOptions{32, DType::f32, FeatureAxis::first, "", true}})
    EXPECT_NE(error_of([&] { MatMul(kLayout, o); }).find("tf32 needs fp32 inputs"), std::string::npos);
}

// fp32 with tf32 set: its own kernels (the tensor cores' mma.sync on 4-byte tiles), beside the exact
// ones of the same layout, in the registry and the cache.
TEST(MatMulApi, Tf32KernelsBesideTheExactOnes) {
  set_cache_directory({});
  MatMul exact(kLayout, {32, DType::f32, FeatureAxis::last, ""}),
      tf32(kLayout, {32, DType::f32, FeatureAxis::last, "", true});
  EXPECT_EQ(exact.generated_source(Op::forward).find("-tf32-"), std::string::npos);
  EXPECT_NE(tf32.generated_source(Op::forward).find("forward-f32-tf32-b32-last"), std::string::npos);
  EXPECT_NE(tf32.generated_source(Op::forward).find("kTensorCores = true"), std::string::npos);
  EXPECT_NE(exact.generated_source(Op::forward).find("kTensorCores = false"), std::string::npos);
  auto before = cache_stats();
  EXPECT_TRUE(exact.precompile(Op::forward, "sm_90a"));
  EXPECT_TRUE(tf32.precompile(Op::forward, "sm_90a"));  // not the exact kernel
  EXPECT_FALSE(tf32.precompile(Op::forward, "sm_90a"));
  EXPECT_TRUE(tf32.precompile(Op::backward_weight, "sm_80"));
  EXPECT_GE(cache_stats().compiles, before.compiles + 3);
}

TEST(MatMulApi, ValidatesPointersAndSizesBeforeTouchingTheGpu) {
  MatMul mm(kLayout, {16, DType::bf16, FeatureAxis::last, ""});
  alignas(16) static char buf[64];
  void* p = buf;
  EXPECT_NE(error_of([&] { mm.forward(nullptr, p, p, 4); }).find("x is a null pointer"), std::string::npos);
  EXPECT_NE(error_of([&] { mm.backward_data(p, p, nullptr, 4); }).find("dx is a null pointer"), std::string::npos);
  EXPECT_NE(error_of([&] { mm.backward_weight(p, buf + 2, p, 4); }).find("dy"), std::string::npos);
  EXPECT_NE(error_of([&] { mm.backward_weight(p, buf + 2, p, 4); }).find("16-byte aligned"), std::string::npos);
  EXPECT_NE(error_of([&] { mm.forward(p, p, p, 0); }).find("n = 0"), std::string::npos);
  EXPECT_NE(error_of([&] { mm.forward(p, p, p, -5); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { mm.forward(p, p, p, 1LL << 40); }).find("out of range"), std::string::npos);
}

TEST(MatMulApi, GpuOpWithoutDriverIsAClearError) {
  std::string why;
  if (runtime::gpu_available(&why)) GTEST_SKIP() << "a GPU is present";
  MatMul mm(kLayout, {16, DType::bf16, FeatureAxis::last, ""});
  alignas(16) static char buf[64];
  std::string e = error_of([&] { mm.forward(buf, buf, buf, 4); });
  EXPECT_NE(e.find("CUDA driver"), std::string::npos) << e;
}

TEST(MatMulApi, ShapesAndPrecompileWithoutGpu) {
  set_cache_directory({});
  MatMul mm(kLayout, {64, DType::f16, FeatureAxis::first, ""});
  EXPECT_EQ(mm.in_features(), 128);
  EXPECT_EQ(mm.out_features(), 192);
  EXPECT_EQ(mm.weight_elements(), 3 * 64 * 64);
  EXPECT_NE(mm.generated_source(Op::forward).find("kLut"), std::string::npos);
  auto before = cache_stats();
  EXPECT_TRUE(mm.precompile(Op::backward_weight, "sm_90a"));   // compiled now: plain and general
  EXPECT_FALSE(mm.precompile(Op::backward_weight, "sm_90a"));  // already in memory
  MatMul same(kLayout, {64, DType::f16, FeatureAxis::first, ""});
  EXPECT_FALSE(same.precompile(Op::backward_weight, "sm_90a"));  // another object, same kernels
  EXPECT_TRUE(same.precompile(Op::backward_weight, "sm_90"));    // another arch: other kernels
  EXPECT_EQ(cache_stats().compiles, before.compiles + 4);
  EXPECT_THROW(mm.precompile(Op::forward, "sm_61"), Error);
}

// precompile of several ops at once: every op's kernels (both batch variants) compiled side by side,
// each once, the same entries that one op at a time finds.
TEST(MatMulApi, PrecompileOfSeveralOpsCompilesEachKernelOnce) {
  set_cache_directory({});
  const Layout layout = Layout::from_coords(3, 5, {{0, 1}, {1, 4}, {2, 0}, {2, 3}});
  const MatMulOptions o{32, DType::bf16, FeatureAxis::last, ""};
  const MatMul mm(layout, o);
  const std::vector<Op> all{Op::forward, Op::backward_data, Op::backward_weight};
  std::int64_t kernels = 0;
  for (Op op : all) kernels += static_cast<std::int64_t>(generator::variants({op, 32, DType::bf16, FeatureAxis::last}).size());
  ASSERT_GT(kernels, 3) << "the small-batch variants are part of it";
  auto before = cache_stats();
  EXPECT_TRUE(
      mm.precompile({Op::forward, Op::backward_data, Op::backward_weight, Op::forward}, "sm_90a", Calls::plain));
  EXPECT_EQ(cache_stats().compiles - before.compiles, kernels) << "each plain kernel once, a repeated op adds none";
  EXPECT_FALSE(mm.precompile(all, "sm_90a", Calls::plain));
  EXPECT_TRUE(mm.precompile(all, "sm_90a")) << "all calls: the general kernels are still missing";
  EXPECT_EQ(cache_stats().compiles - before.compiles, 2 * kernels);
  EXPECT_FALSE(mm.precompile(all, "sm_90a"));
  const MatMul same(layout, o);
  for (Op op : all) EXPECT_FALSE(same.precompile(op, "sm_90a")) << to_string(op) << ": found, not compiled again";
  EXPECT_FALSE(same.precompile(all, "sm_90a", Calls::with_options));
  EXPECT_EQ(cache_stats().compiles - before.compiles, 2 * kernels);
  EXPECT_FALSE(mm.precompile(std::vector<Op>{}, "sm_90a"));
  EXPECT_THROW(mm.precompile(all, "sm_61"), Error);
}

TEST(MatMulApi, LayoutsOfOneShapeCompileOnce) {
  set_cache_directory({});
  MatMul a(Layout::from_coords(4, 4, {{0, 0}, {1, 2}, {3, 3}}), {64, DType::bf16, FeatureAxis::last, ""}),
      b(Layout::from_coords(4, 4, {{0, 1}, {2, 2}, {3, 0}}), {64, DType::bf16, FeatureAxis::last, ""});
  EXPECT_EQ(a.generated_source(Op::forward), b.generated_source(Op::forward));
  auto before = cache_stats();
  EXPECT_TRUE(a.precompile(Op::forward, "sm_90a", Calls::plain));
  EXPECT_TRUE(b.precompile(Op::forward, "sm_90a", Calls::plain));  // its own entry, from a's code
  EXPECT_EQ(cache_stats().compiles, before.compiles + 2);  // the kernel and its small-batch variant
  EXPECT_EQ(cache_stats().shared_compiles, before.shared_compiles + 2);
}

// A tuning record (what MatMul::autotune stores on a GPU machine) changes the kernel that
// precompile builds and that later calls use; a record that does not fit is ignored.
// MatMulOptions::sms plans the Hopper kernels for another SM count: precompiled beside the 132-SM
// ones; without wgmma (sm_80) the count plays no part; a count no Hopper GPU has is refused.
TEST(MatMulApi, SmCountOfTheSchedules) {
  auto dir = std::filesystem::temp_directory_path() / ("bsjit-sms-test-" + std::to_string(std::random_device{}()));
  set_cache_directory(dir);
  const Layout layout = Layout::from_coords(4, 4, {{0, 0}, {1, 1}, {2, 3}, {3, 3}});
  MatMulOptions pcie{64, DType::bf16, FeatureAxis::last, ""};
  pcie.sms = 114;
  EXPECT_TRUE(MatMul(layout, pcie).precompile(Op::forward, "sm_90a", Calls::plain));
  EXPECT_TRUE(MatMul(layout, {64, DType::bf16, FeatureAxis::last, ""}).precompile(Op::forward, "sm_90a", Calls::plain));
  EXPECT_FALSE(MatMul(layout, pcie).precompile(Op::forward, "sm_90a", Calls::plain));
  int labelled = 0, entries = 0;
  for (const auto& e : list_cache(dir)) labelled += e.label.find("-sm114") != std::string::npos, ++entries;
  EXPECT_GT(labelled, 0);
  EXPECT_EQ(2 * labelled, entries) << "each variant twice: planned for 114 and for 132 SMs";
  const auto specs = runtime::op_variants(Op::forward, pcie);
  EXPECT_EQ(runtime::call_spec(layout.hash().hex(), specs, 0, true, "sm_90a").sms, 114);
  EXPECT_EQ(runtime::call_spec(layout.hash().hex(), specs, 0, true, "sm_90a", 78).sms, 78);
  EXPECT_EQ(runtime::call_spec(layout.hash().hex(), specs, 0, true, "sm_80").sms, generator::kDefaultSms);
  pcie.sms = 200;
  EXPECT_THROW(MatMul(layout, pcie), Error);
  set_cache_directory({});
  std::filesystem::remove_all(dir);
}

TEST(MatMulApi, TuningRecordsChooseTheTileShape) {
  auto dir = std::filesystem::temp_directory_path() / ("bsjit-tune-test-" + std::to_string(std::random_device{}()));
  set_cache_directory(dir);
  const Layout layout = Layout::from_coords(4, 4, {{0, 0}, {1, 1}, {2, 3}});
  const generator::MatMulSpec spec{Op::forward, 64, DType::bf16, FeatureAxis::last};
  const std::string hash = layout.hash().hex();
  EXPECT_FALSE(runtime::resolve_spec(hash, spec, "sm_90", 0).tiles);
  auto candidates = generator::tile_candidates(spec);
  ASSERT_GE(candidates.size(), 2u);
  runtime::store_tuning(hash, spec, "sm_90", 0, candidates[1]);
  auto tuned = runtime::resolve_spec(hash, spec, "sm_90", 0);
  ASSERT_TRUE(tuned.tiles);
  EXPECT_EQ(generator::tiles_tag(*tuned.tiles), generator::tiles_tag(candidates[1]));
  EXPECT_FALSE(runtime::resolve_spec(hash, spec, "sm_80", 0).tiles) << "records are per arch";
  EXPECT_FALSE(runtime::resolve_spec(hash, spec, "sm_90", 1).tiles) << "records are per batch class";
  MatMul(layout, {64, DType::bf16, FeatureAxis::last, ""}).precompile(Op::forward, "sm_90");
  bool tuned_entry = false;
  for (const auto& e : list_cache(dir))
    tuned_entry |= e.label == "forward-bf16-b64-last-" + generator::tiles_tag(candidates[1]);
  EXPECT_TRUE(tuned_entry) << "precompile builds the tuned shape";
  // a shape that cannot serve this spec (block 32's record applied to block 64) is ignored
  const generator::MatMulSpec other{Op::forward, 16, DType::bf16, FeatureAxis::last};
  runtime::store_tuning(hash, other, "sm_90", 0, candidates[1]);
  EXPECT_FALSE(runtime::resolve_spec(hash, other, "sm_90", 0).tiles);
  // every Hopper shape comes back from its record as it was stored (swapped, grouped, tiled, ...)
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {16, 64}) {
      generator::MatMulSpec hopper{op, b, DType::bf16, FeatureAxis::last};
      hopper.wgmma = true;
      for (const auto& c : generator::tile_candidates(hopper)) {
        runtime::store_tuning(hash, hopper, "sm_90a", 0, c);
        const auto back = runtime::resolve_spec(hash, hopper, "sm_90a", 0);
        ASSERT_TRUE(back.tiles) << generator::tiles_tag(c);
        EXPECT_EQ(generator::tiles_tag(*back.tiles), generator::tiles_tag(c));
        EXPECT_EQ(back.tiles->swapped, c.swapped);
        EXPECT_EQ(generator::choose_tiles(back).shared_bytes, c.shared_bytes) << generator::tiles_tag(c);
      }
    }
  set_cache_directory({});
  std::filesystem::remove_all(dir);
}

TEST(MatMulApi, DefaultCacheDirectoryFollowsEnvironment) {
  setenv("BSJIT_CACHE_DIR", "/tmp/explicit", 1);
  EXPECT_EQ(default_cache_directory(), "/tmp/explicit");
  unsetenv("BSJIT_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
  EXPECT_EQ(default_cache_directory(), "/tmp/xdg/bsjit");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(default_cache_directory(), "/home/someone/.cache/bsjit");
}

TEST(Types, ParseAndPrint) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_op("dw"), Op::backward_weight);
  EXPECT_EQ(parse_feature_axis("first"), FeatureAxis::first);
  EXPECT_EQ(to_string(Op::backward_data), "backward_data");
  EXPECT_THROW(parse_dtype("int8"), Error);
  EXPECT_THROW(parse_op("sideways"), Error);
  EXPECT_THROW(parse_feature_axis("middle"), Error);
}

}  // namespace
}  // namespace bsjit
