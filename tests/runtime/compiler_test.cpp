// Every kernel template, through the generator, compiled by NVRTC for sm_80, sm_90 and sm_90a
// (there with the wgmma kernels where the generator picks them), with no include path: the
// templates need no CUDA toolkit header.
#include "runtime/compiler.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <stdexcept>

#include "bsjit/attention_layouts.hpp"
#include "bsjit/cache.hpp"
#include "bsjit/error.hpp"
#include "generator/attention_generator.hpp"
#include "generator/matmul_generator.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/parallel.hpp"

namespace bsjit {
namespace {

Layout small_random_layout(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> m(5 * 4);
  for (auto& v : m) v = rng() % 2;
  m[0] = 1;
  return Layout::from_dense(5, 4, m);
}

// runtime::compile, throwing where ptxas serialized the kernel's wgmmas (what it said of them).
runtime::CompiledKernel compile_pipelined(const std::string& source, const std::string& name, const std::string& label,
                                          const std::string& arch) {
  auto k = runtime::compile(source, name, label, arch);
  if (const std::string losses = runtime::performance_losses(k.log); !losses.empty())
    throw std::runtime_error(label + ": " + losses);
  return k;
}

struct Case {
  Op op;
  int block;
  DType dtype;
  FeatureAxis axis;
  std::string arch;
};

std::string name(const Case& c) {
  return std::string(to_string(c.op)) + " b" + std::to_string(c.block) + " " + std::string(to_string(c.dtype)) + " " +
         std::string(to_string(c.axis)) + " " + c.arch;
}

// Runs check(item) for every item, two at a time (the machines CI runs on have two cores), and
// returns the non-empty messages.
template <class Item, class Check>
std::vector<std::string> failures_of(const std::vector<Item>& items, Check check) {
  std::vector<std::string> results(items.size()), failures;
  runtime::parallel_for(items.size(), 2, [&](std::size_t i) { results[i] = check(items[i]); });
  for (auto& r : results)
    if (!r.empty()) failures.push_back(r);
  return failures;
}

TEST(Compiler, EveryTemplateForEveryArch) {
  std::vector<Case> cases;
  for (const char* arch : {"sm_80", "sm_90", "sm_90a"})
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
      for (int b : {8, 16, 32, 64, 128})
        for (DType dt : {DType::f32, DType::f16, DType::bf16})
          // both feature axes, alternating, to keep the count down; every (op, b, dtype) sees both
          // across the three archs
          cases.push_back({op, b, dt, (cases.size() % 2) ? FeatureAxis::first : FeatureAxis::last, arch});
  Layout layout = small_random_layout(7);
  auto run = [&](Case c) -> std::string {
    try {
      generator::MatMulSpec spec{c.op, c.block, c.dtype, c.axis};
      spec.wgmma = generator::has_wgmma(c.arch);
      auto g = generator::generate_matmul(layout, spec);
      auto k = runtime::compile(g.source, g.name_expression, g.label, c.arch);
      if (k.cubin.size() < 64) return name(c) + ": cubin too small";
      if (k.lowered_name.rfind("_Z", 0) != 0) return name(c) + ": lowered name '" + k.lowered_name + "'";
      if (k.arch != c.arch) return name(c) + ": arch";
      return "";
    } catch (const std::exception& e) {
      return name(c) + ": " + e.what();
    }
  };
  for (auto& f : failures_of(cases, run)) ADD_FAILURE() << f;
  EXPECT_EQ(cases.size(), 135u);
}

// Each Hopper kernel's plain form (for calls without OpOptions) compiles, and the accumulate and
// gate paths are gone from it, not merely unused: the main kernels' cubins shrink by a sixth to
// a third (10% asked here), the small batch's by up to 5% (their paths are short; no growth asked).
TEST(Compiler, PlainHopperKernelsDropTheOptionPaths) {
  Layout layout = small_random_layout(11);
  std::vector<generator::MatMulSpec> specs;
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {16, 32, 64, 128})
      for (auto spec : generator::variants({op, b, DType::bf16, FeatureAxis::last})) {
        spec.wgmma = true;
        specs.push_back(spec);
      }
  auto run = [&](generator::MatMulSpec spec) -> std::string {
    try {
      std::size_t bytes[2];
      std::string labels[2];
      for (bool plain : {false, true}) {
        spec.plain = plain;
        auto g = generator::generate_matmul(layout, spec);
        labels[plain] = g.label;
        bytes[plain] = compile_pipelined(g.source, g.name_expression, g.label, "sm_90a").cubin.size();
      }
      if (labels[1] != labels[0] + "-plain") return labels[1] + ": not the general kernel's label + -plain";
      const double most = spec.small_batch ? 1.0 : 0.9;
      if (static_cast<double>(bytes[1]) > most * static_cast<double>(bytes[0]))
        return fmt::format("{}: plain cubin {} bytes, general {}: over {}", labels[1], bytes[1], bytes[0], most);
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  for (auto& f : failures_of(specs, run)) ADD_FAILURE() << f;
  EXPECT_EQ(specs.size(), 24u);
}

// A Hopper backward-weight kernel built without split support (kSplit false: layouts whose units
// the schedule takes whole on 132 SMs, generator::sdd_kernel_planes) compiles, and the pieces'
// partials and their reduction are gone from it: each default's cubin at least 5% smaller than
// the same source with kSplit true (the small layout here splits; 8-18% measured with the planes
// thread-major, 13-29% when they held the tile).
TEST(Compiler, UnsplitBackwardWeightKernelsDropTheSplitPath) {
  Layout layout = small_random_layout(12);
  std::vector<generator::MatMulSpec> specs;
  for (int b : {16, 32, 64, 128})
    for (auto spec : generator::variants({Op::backward_weight, b, DType::bf16, FeatureAxis::last})) {
      spec.wgmma = true, spec.plain = true;
      if (!spec.small_batch) specs.push_back(spec);
    }
  auto run = [&](const generator::MatMulSpec& spec) -> std::string {
    const auto g = generator::generate_matmul(layout, spec);
    const std::string split = "kSplit = true";
    const std::size_t at = g.source.find(split);
    if (at == std::string::npos || g.workspace_bytes == 0) return g.label + ": the small layout does not split";
    std::string unsplit = g.source;
    unsplit.replace(at, split.size(), "kSplit = false");
    try {
      const std::size_t with = runtime::compile(g.source, g.name_expression, g.label, "sm_90a").cubin.size();
      const std::size_t without =
          compile_pipelined(unsplit, g.name_expression, g.label + " without split support", "sm_90a").cubin.size();
      if (static_cast<double>(without) > 0.95 * static_cast<double>(with))
        return fmt::format("{}: cubin without split support {} bytes, with {}", g.label, without, with);
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  for (auto& f : failures_of(specs, run)) ADD_FAILURE() << f;
  EXPECT_EQ(specs.size(), 4u);
}

// Why the Hopper kernels branch to their roles on warpgroup_index: a wgmma chain in a rolled loop,
// on the consumers' side of a branch on threadIdx.x / 128, has ptxas serialize it (C7520), and on
// warpgroup_index's side it stays pipelined. performance_losses finds ptxas's report.
TEST(Compiler, WarpgroupIndexKeepsRolledWgmmasPipelined) {
  const std::string source = R"(#include "bsjit/wgmma.cuh"
namespace probe {
template <bool UNIFORM>
__global__ void rolled(float* out, int steps) {
  using namespace bsjit::kernels;
  __shared__ alignas(1024) unsigned char tile[2 * 16384];
  const int role = UNIFORM ? warpgroup_index() : static_cast<int>(threadIdx.x / 128);
  if (role == 0) {
    if (threadIdx.x == 0) out[0] = 1.0f;
    return;
  }
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0.0f;
  wgmma_fence_registers(d);
  for (int s = 0; s < steps; ++s) {
    wgmma_fence();
#pragma unroll 1
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64k16<bfloat16_t, 128, 0, 0>(d, smem_descriptor(tile + s * 64 + kk * 32, 16, 1024),
                                          smem_descriptor(tile + 16384 + kk * 32, 16, 1024));
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  wgmma_fence_registers(d);
  for (int i = 0; i < 64; ++i) out[threadIdx.x * 64 + i] = d[i];
}
}  // namespace probe
)";
  const auto divergent = runtime::compile(source, "probe::rolled<false>", "rolled-divergent", "sm_90a");
  const std::string losses = runtime::performance_losses(divergent.log);
  EXPECT_NE(losses.find("C7520"), std::string::npos) << divergent.log;
  EXPECT_EQ(losses.find('\n'), std::string::npos) << "one line: " << losses;
  const auto uniform = runtime::compile(source, "probe::rolled<true>", "rolled-uniform", "sm_90a");
  EXPECT_EQ(runtime::performance_losses(uniform.log), "") << uniform.log;
  EXPECT_EQ(runtime::performance_losses("ptxas info    : (C7519) warpgroup.arrive is injected\n"), "");
}

// Every tile shape the autotuner and the sweep may pick compiles (what the templates'
// static_asserts allow and the generator offers must agree), and ptxas serializes none of their
// wgmmas (each kernel branches to its roles on warpgroup_index, and its k loops are rolled).
TEST(Compiler, EveryTileCandidateCompiles) {
  Layout layout = small_random_layout(9);
  std::vector<generator::MatMulSpec> specs;
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {16, 32, 64, 128}) {
      generator::MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
      for (const auto& t : generator::tile_candidates(spec)) {
        spec.tiles = t;
        specs.push_back(spec);
      }
      for (const auto& v : generator::variants({op, b, DType::f16, FeatureAxis::last})) specs.push_back(v);
      spec = {op, b, DType::f32, FeatureAxis::last};  // fp32 as TF32: the 4-byte mma.sync tiles
      spec.tf32 = true;
      for (const auto& v : generator::variants(spec)) specs.push_back(v);
      // the Hopper shapes, offered only for sm_90a
      spec = {op, b, DType::f16, FeatureAxis::last};
      spec.wgmma = true;
      for (const auto& t : generator::tile_candidates(spec))
        if (t.wgmma) {
          spec.tiles = t;
          specs.push_back(spec);
        }
    }
  auto run = [&](generator::MatMulSpec spec) -> std::string {
    try {
      auto g = generator::generate_matmul(layout, spec);
      compile_pipelined(g.source, g.name_expression, g.label, spec.wgmma ? "sm_90a" : "sm_90");
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  for (auto& f : failures_of(specs, run)) ADD_FAILURE() << f;
  EXPECT_GT(specs.size(), 70u);
}

TEST(Compiler, CompileErrorCarriesLogOptionsAndSourcePath) {
  try {
    runtime::compile("#include \"bsjit/matmul_fma.cuh\"\nthis is not cuda;\n", "bsjit::kernels::zero<float>", "broken",
                     "sm_90");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("NVRTC failed"), std::string::npos) << what;
    EXPECT_NE(what.find("--gpu-architecture=sm_90"), std::string::npos) << what;
    EXPECT_NE(what.find("generated source: /"), std::string::npos) << what;
    EXPECT_NE(what.find("error"), std::string::npos) << what;  // the NVRTC log itself
  }
}

TEST(Compiler, RejectsUnsupportedArch) {
  EXPECT_THROW(runtime::check_arch("sm_75"), Error);
  EXPECT_THROW(runtime::check_arch("compute_90"), Error);
  EXPECT_THROW(runtime::check_arch("sm90"), Error);
  EXPECT_NO_THROW(runtime::check_arch("sm_90a"));
  EXPECT_NO_THROW(runtime::check_arch("sm_80"));
}

TEST(Compiler, HopperDevicesGetTheArchSpecificTarget) {
  EXPECT_EQ(runtime::default_kernel_arch("sm_90"), "sm_90a");
  EXPECT_EQ(runtime::default_kernel_arch("sm_80"), "sm_80");
  EXPECT_EQ(runtime::default_kernel_arch("sm_89"), "sm_89");
  EXPECT_EQ(runtime::default_kernel_arch("sm_100"), "sm_100");
}

// A wgmma kernel compiled for plain sm_90 is refused by the template, not miscompiled.
TEST(Compiler, WgmmaKernelNeedsSm90a) {
  generator::MatMulSpec spec{Op::forward, 128, DType::bf16, FeatureAxis::last};
  spec.wgmma = true;
  auto g = generator::generate_matmul(small_random_layout(3), spec);
  ASSERT_TRUE(g.tiles.wgmma);
  EXPECT_NO_THROW(runtime::compile(g.source, g.name_expression, g.label, "sm_90a"));
  try {
    runtime::compile(g.source, g.name_expression, g.label, "sm_90");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wgmma needs the sm_90a target"), std::string::npos) << e.what();
  }
}

// The registry prepares many kernels at once (autotune, the sweep, the GPU shape tests): each
// (layout, id) gets its own kernel, a later prepare of the same id finds it, and a failing one is
// thrown after the others have been prepared.
TEST(Compiler, RegistryPreparesAllOnEveryCore) {
  set_cache_directory({});  // memory only
  const Layout a = small_random_layout(21), b = small_random_layout(22);
  ASSERT_NE(a.hash().hex(), b.hash().hex());
  std::vector<std::pair<const Layout*, runtime::KernelId>> kernels;
  for (const Layout* l : {&a, &b})
    for (auto [op, block] : {std::pair{Op::forward, 32}, {Op::backward_weight, 64}}) {
      generator::MatMulSpec spec{op, block, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      kernels.push_back({l, {l->hash().hex(), spec, "sm_90a"}});
    }
  auto& registry = runtime::KernelRegistry::global();
  const auto prepared = registry.prepare_all(kernels, cache::OnMiss::compile);
  ASSERT_EQ(prepared.size(), kernels.size());
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    ASSERT_TRUE(prepared[i]);
    EXPECT_FALSE(prepared[i]->compiled->cubin.empty());
    EXPECT_EQ(prepared[i]->generated.label,
              generator::generate_matmul(*kernels[i].first, kernels[i].second.spec).label);
    EXPECT_EQ(prepared[i]->generated.tables,
              generator::generate_matmul(*kernels[i].first, kernels[i].second.spec).tables)
        << "each kernel generated from its own layout";
    EXPECT_EQ(prepared[i]->compiled->tables, prepared[i]->generated.tables) << "the entry holds its layout's tables";
    EXPECT_EQ(registry.prepare(*kernels[i].first, kernels[i].second, cache::OnMiss::fail), prepared[i]);
  }
  EXPECT_NE(prepared[0]->key, prepared[2]->key) << "the same spec on two layouts: two kernels";
  // an unsupported target fails; the kernel beside it is still prepared
  generator::MatMulSpec spec{Op::backward_data, 32, DType::bf16, FeatureAxis::last};
  std::vector<std::pair<const Layout*, runtime::KernelId>> mixed{{&a, {a.hash().hex(), spec, "sm_75"}},
                                                                 {&a, {a.hash().hex(), spec, "sm_80"}}};
  try {
    registry.prepare_all(mixed, cache::OnMiss::compile);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sm_75"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(registry.prepare(a, mixed[1].second, cache::OnMiss::fail));
  // strict: a kernel in no cache fails, naming it; a general kernel's error says which calls need it
  const Layout fresh = small_random_layout(23);
  for (bool plain : {true, false}) {
    generator::MatMulSpec s{Op::forward, 16, DType::f16, FeatureAxis::last};
    s.plain = plain;
    try {
      registry.prepare(fresh, {fresh.hash().hex(), s, "sm_80"}, cache::OnMiss::fail);
      ADD_FAILURE() << "expected a strict-cache Error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("strict cache: kernel " + generator::kernel_label(s)), std::string::npos) << what;
      EXPECT_EQ(what.find("calls with OpOptions") != std::string::npos, !plain) << what;
    }
  }
}

// The registry keeps a prepared kernel (generated source, tables, binary) while someone holds it,
// and no longer: a process making a MatMul per new layout (dynamic sparsity) keeps neither every
// layout's kernel nor a slot per layout.
TEST(Compiler, RegistryKeepsAPreparedKernelWhileItIsHeld) {
  set_cache_directory({});  // memory only
  auto& registry = runtime::KernelRegistry::global();
  const generator::MatMulSpec spec{Op::forward, 32, DType::bf16, FeatureAxis::last};
  auto id_of = [&](const Layout& l) { return runtime::KernelId{l.hash().hex(), spec, "sm_80"}; };
  const Layout base = small_random_layout(31);
  auto held = registry.prepare(base, id_of(base), cache::OnMiss::compile);
  EXPECT_EQ(registry.prepare(base, id_of(base), cache::OnMiss::fail), held) << "held: found again";
  const std::weak_ptr<const runtime::PreparedKernel> released = held;
  held.reset();
  EXPECT_TRUE(released.expired()) << "nobody holds it: the registry does not either";
  // 300 layouts of one shape (one compile; the rest share its code), each prepared and dropped
  const std::size_t before = registry.slots();
  const auto compiles = cache_stats().compiles;
  std::mt19937_64 rng(32);
  std::vector<std::pair<std::int64_t, std::int64_t>> coords;
  for (std::int64_t r = 0; r < 16; ++r) coords.push_back({r, r}), coords.push_back({r, (r + 5) % 16});
  for (int i = 0; i < 300; ++i) {
    std::vector<std::int64_t> to(16);
    std::iota(to.begin(), to.end(), 0);
    std::shuffle(to.begin(), to.end(), rng);
    auto moved = coords;
    for (auto& [r, c] : moved) c = to[c];
    const Layout l = Layout::from_coords(16, 16, moved);
    registry.prepare(l, id_of(l), cache::OnMiss::compile);
  }
  EXPECT_LE(cache_stats().compiles, compiles + 1) << "one shape, one compile";
  EXPECT_LE(registry.slots(), std::max<std::size_t>(64, 2 * before) + 1) << "slots of released kernels are forgotten";
}

// A source compiles to the same bytes every time, so caches built twice from one manifest are
// identical. NVRTC gives names of internal linkage a random hash per compile: the templates keep
// none that reach the binary (their namespace constants are `inline constexpr`).
TEST(Compiler, OneSourceGivesTheSameCubinEveryTime) {
  const Layout layout = small_random_layout(7);
  std::vector<Case> cases = {{Op::backward_weight, 128, DType::bf16, FeatureAxis::last, "sm_90a"},
                             {Op::forward, 64, DType::bf16, FeatureAxis::last, "sm_90a"},
                             {Op::forward, 32, DType::f16, FeatureAxis::last, "sm_80"}};
  auto failures = failures_of(cases, [&](const Case& c) -> std::string {
    generator::MatMulSpec spec{c.op, c.block, c.dtype, c.axis};
    spec.wgmma = c.arch == "sm_90a";
    const auto g = generator::generate_matmul(layout, spec);
    const auto first = runtime::compile(g.source, g.name_expression, g.label, c.arch);
    const auto second = runtime::compile(g.source, g.name_expression, g.label, c.arch);
    return first.cubin == second.cubin ? "" : name(c) + ": two compiles differ";
  });
  EXPECT_TRUE(failures.empty()) << ::testing::PrintToString(failures);
  // the attention forward, its tables out of the source
  const auto a = generator::generate_attention_forward({layouts::causal(4)}, {64, 64, DType::bf16, QkvOrder::bshd, true, ""},
                                                       "sm_80");
  const auto cached = runtime::compile(a.source, a.name_expression, a.label, "sm_80");
  EXPECT_EQ(cached.cubin, runtime::compile(a.source, a.name_expression, a.label, "sm_80").cubin);
  // bypassing the driver's cache (the benchmark's cold compiles) builds the same bytes
  const auto bypassed = runtime::compile(a.source, a.name_expression, a.label, "sm_80", runtime::DriverCache::bypass);
  EXPECT_EQ(cached.cubin, bypassed.cubin);
  EXPECT_EQ(bypassed.options, [&] {
    auto o = cached.options;
    o.push_back("--no-cache");
    return o;
  }());
}

TEST(Compiler, NvrtcVersion) { EXPECT_NE(runtime::nvrtc_version().find('.'), std::string::npos); }

// NVRTC 12.4 and later compile with -minimal (runtime/compiler.cpp says why), older ones without;
// the option is part of every compiled kernel's options and so of its cache key.
TEST(Compiler, MinimalFrontEndFromNvrtc124) {
  int major = 0, minor = 0;
  ASSERT_EQ(std::sscanf(runtime::nvrtc_version().c_str(), "%d.%d", &major, &minor), 2);
  const bool expected = major > 12 || (major == 12 && minor >= 4);
  for (const std::string arch : {"sm_80", "sm_90a"}) {
    const auto o = runtime::compile_options(arch);
    EXPECT_EQ(std::count(o.begin(), o.end(), "-minimal"), expected ? 1 : 0) << arch;
  }
  const auto a = generator::generate_attention_forward({layouts::causal(2)}, {64, 64, DType::bf16, QkvOrder::bshd, true, ""},
                                                       "sm_80");
  EXPECT_EQ(runtime::compile(a.source, a.name_expression, a.label, "sm_80").options, runtime::compile_options("sm_80"));
}

}  // namespace
}  // namespace bsjit
