// GPU tests (ctest label "gpu"): every op × block size × dtype × feature axis against the
// double-precision reference of the dense product with the block mask expanded. Random layouts with
// empty block rows and columns, and density 1.0; N = 1 and N not a multiple of any tile; gate and
// accumulate variants; fresh random inputs and NaN-poisoned outputs for every run. Kernels are
// compiled for the device's default target (sm_90a on Hopper: the wgmma kernels at b ≥ 64); the
// 16-bit b ≥ 64 combinations run again for plain sm_90 there, so the mma.sync kernels that other
// GPUs use stay tested.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>

#include "bsjit/bsjit.hpp"
#include "generator/matmul_plan.hpp"
#include "op_check.hpp"
#include "runtime/compiler.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_registry.hpp"
#include "runtime/module.hpp"
#include "runtime/parallel.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit {
namespace {

struct Combo {
  Op op;
  int block;
  DType dtype;
  FeatureAxis axis;
  std::string arch;  // "": the device's default target
};

std::vector<Combo> all_combos() {
  std::vector<Combo> v;
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {8, 16, 32, 64, 128})
      for (DType dt : {DType::f32, DType::f16, DType::bf16})
        for (FeatureAxis ax : {FeatureAxis::last, FeatureAxis::first}) v.push_back({op, b, dt, ax, ""});
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {64, 128})
      for (DType dt : {DType::f16, DType::bf16}) v.push_back({op, b, dt, FeatureAxis::last, "sm_90"});
  return v;
}

std::string combo_name(const Combo& c) {
  return fmt::format("{}_b{}_{}_{}{}", to_string(c.op), c.block, to_string(c.dtype), to_string(c.axis),
                     c.arch.empty() ? "" : "_" + c.arch);
}

void PrintTo(const Combo& c, std::ostream* os) { *os << combo_name(c); }

// Layouts sized so C and K are a few hundred: rows × (rows + 1) blocks.
std::int64_t layout_rows(int block) { return std::max<std::int64_t>(2, 320 / block); }

// Bernoulli(0.4) with block row 0 and block column 1 forced empty.
Layout random_layout(int block, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::int64_t r = layout_rows(block), c = r + 1;
  std::vector<std::uint8_t> m(r * c);
  for (auto& v : m) v = rng() % 10 < 4;
  for (std::int64_t j = 0; j < c; ++j) m[j] = 0;
  for (std::int64_t i = 0; i < r; ++i) m[i * c + 1] = 0;
  m[1 * c + 0] = 1;  // never entirely empty
  return Layout::from_dense(r, c, m);
}

// Bernoulli(0.06) over a grid twice as wide and tall, block (0, 0) present.
Layout sparse_layout(int block, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::int64_t r = 2 * layout_rows(block), c = r + 2;
  std::vector<std::uint8_t> m(r * c);
  for (auto& v : m) v = rng() % 100 < 6;
  m[0] = 1;
  return Layout::from_dense(r, c, m);
}

Layout full_layout(int block) {
  const std::int64_t r = layout_rows(block);
  return Layout::from_dense(r, r + 1, std::vector<std::uint8_t>(r * (r + 1), 1));
}

// Every block present, square: the reduction's 64-wide chunks are whole in both directions (for b ≤ 32
// the side is a multiple of 64 / b), so the grouped kernel's sub-blocks are all full, forward and
// backward-data (full_layout's r + 1 block columns leave backward-data a partial last chunk).
Layout full_square_layout(int block) {
  const std::int64_t r = layout_rows(block);
  return Layout::from_dense(r, r, std::vector<std::uint8_t>(r * r, 1));
}

struct Variant {
  std::int64_t n;
  bool gated, accumulate;
};
const Variant kVariants[] = {{1, false, false}, {131, false, false}, {257, true, false}, {200, false, true},
                             {77, true, true}};

// Worst error per dtype over the whole run, printed at the end for the record.
struct Tally {
  std::mutex mutex;
  std::map<std::string, std::pair<double, int>> worst;  // dtype → (worst error, runs)
  void add(DType dt, double err) {
    std::lock_guard lock(mutex);
    auto& w = worst[std::string(to_string(dt))];
    w.first = std::max(w.first, err);
    ++w.second;
  }
};
Tally& tally() {
  static Tally t;
  return t;
}

class GpuEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!runtime::gpu_available(&why_)) return;
    set_cache_directory({});  // memory only: the tests must not fill the user's cache
    // Compile every kernel up front on all cores; the tests then find them in memory.
    const std::string device_arch = runtime::context_arch(runtime::current_context());
    // Only the combinations whose test will run (ctest runs one test per process).
    std::vector<Combo> combos;
    auto* unit = ::testing::UnitTest::GetInstance();
    for (const Combo& c : all_combos())
      for (int i = 0; i < unit->total_test_suite_count(); ++i) {
        const auto* suite = unit->GetTestSuite(i);
        for (int j = 0; j < suite->total_test_count(); ++j)
          if (suite->GetTestInfo(j)->should_run() &&
              std::string(suite->GetTestInfo(j)->name()) == "MatchesDenseReference/" + combo_name(c))
            if (c.arch.empty() || c.arch == device_arch) combos.push_back(c);
      }
    runtime::parallel_for(combos.size(), 0, [&](std::size_t i) {
      const Combo& c = combos[i];
      const std::string arch = c.arch.empty() ? runtime::default_kernel_arch(device_arch) : c.arch;
      MatMulOptions o{c.block, c.dtype, c.axis, c.arch};
      try {
        MatMul(random_layout(c.block, c.block), o).precompile(c.op, arch);
        MatMul(full_layout(c.block), o).precompile(c.op, arch);
      } catch (const std::exception&) {  // the combination's test compiles again and reports it
      }
    });
  }
  void TearDown() override {
    for (auto& [dt, w] : tally().worst) std::printf("GPU matmul: dtype %s: %d runs, worst relative error %.3g\n", dt.c_str(), w.second, w.first);
  }
  std::string why_;
};

class MatMulGpu : public ::testing::TestWithParam<Combo> {
 protected:
  void SetUp() override {
    std::string why;
    if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    const std::string& arch = GetParam().arch;
    if (!arch.empty() && arch != runtime::context_arch(runtime::current_context()))
      GTEST_SKIP() << "kernels for " << arch << " do not run on this GPU";
  }
};

TEST_P(MatMulGpu, MatchesDenseReference) {
  const Combo c = GetParam();
  MatMulOptions o{c.block, c.dtype, c.axis, c.arch};
  std::uint64_t seed = 1000 + c.block * 7 + static_cast<int>(c.dtype) * 3 + static_cast<int>(c.op);
  for (int which = 0; which < 2; ++which) {
    MatMul mm(which == 0 ? random_layout(c.block, c.block) : full_layout(c.block), o);
    for (const Variant& v : kVariants) {
      check::CheckOptions co{v.n, v.accumulate, v.gated, seed++};
      auto r = check::run_and_check(mm, c.op, co);
      tally().add(c.dtype, r.relative_error);
      SCOPED_TRACE(fmt::format("{} b{} {} {} layout {} n={} gate={} accumulate={}", to_string(c.op), c.block,
                               to_string(c.dtype), to_string(c.axis), which == 0 ? "random" : "full", v.n, v.gated,
                               v.accumulate));
      EXPECT_EQ(r.unwritten, 0);
      EXPECT_LE(r.relative_error, check::tolerance(c.dtype));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, MatMulGpu, ::testing::ValuesIn(all_combos()),
                         [](const auto& info) { return combo_name(info.param); });

// A Hopper tile shape forced on a layout through a tuning record (what the tests below run).
struct Shape {
  Layout layout;
  generator::MatMulSpec spec;  // wgmma, tiles set
  std::uint64_t seed;          // of its first run
};

// Compiles the shapes' kernels on all cores into the registry, where the MatMul objects that run
// them (tuning records naming the same shapes) find them: the shape loops compiled one at a time,
// most of their device time. A failure here is left for the run, which reports it with its shape.
// The kernels compiled are those the variants' calls run: plain ones for calls without options.
void compile_shapes(const std::vector<Shape>& shapes, const std::vector<Variant>& variants) {
  std::set<bool> kinds;
  for (const Variant& v : variants) kinds.insert(!v.gated && !v.accumulate);
  std::vector<std::pair<const Layout*, runtime::KernelId>> kernels;
  for (const auto& s : shapes)
    for (bool plain : kinds) {
      generator::MatMulSpec spec = s.spec;
      spec.plain = plain;
      kernels.push_back({&s.layout, {s.layout.hash().hex(), spec, "sm_90a"}});
    }
  try {
    runtime::KernelRegistry::global().prepare_all(kernels, cache::OnMiss::compile);
  } catch (const std::exception&) {
  }
}

// Runs a forced shape's op on every variant against the reference.
void check_shape(const Shape& s, const std::vector<Variant>& variants) {
  const auto& spec = s.spec;
  std::uint64_t seed = s.seed;
  runtime::store_tuning(s.layout.hash().hex(), spec, "sm_90a", 0, *spec.tiles);
  MatMul mm(s.layout, {spec.block, spec.dtype, FeatureAxis::last, "sm_90a"});
  for (const Variant& v : variants) {
    auto r = check::run_and_check(mm, spec.op, {v.n, v.accumulate, v.gated, seed++});
    tally().add(spec.dtype, r.relative_error);
    SCOPED_TRACE(fmt::format("{} b{} {} {} ({} blocks) n={} gate={} accumulate={}", to_string(spec.op), spec.block,
                             to_string(spec.dtype), generator::tiles_tag(*spec.tiles), s.layout.blocks(), v.n, v.gated,
                             v.accumulate));
    EXPECT_EQ(r.unwritten, 0);
    EXPECT_LE(r.relative_error, check::tolerance(spec.dtype));
  }
}

// Every Hopper tile shape the autotuner may pick (wgmma with cp.async, wgmma with a TMA producer, the
// grouped, paired, tiled and row-grouped kernels), forced through a tuning record, on partial row
// tiles, gates (some exactly 0) and accumulation; one test per op. Calls with options only: their
// general kernels hold every path, and a plain kernel is its general one with both options
// constant (checked for the default shapes in MatchesDenseReference and the tests below, for every
// candidate by the benchmark's sweep, which checks each result before timing it); the shapes'
// plain kernels would double this test's compiles, most of its time.
class MatMulGpuHopper : public ::testing::TestWithParam<Op> {};

TEST_P(MatMulGpuHopper, EveryWgmmaShapeMatchesReference) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  if (runtime::context_arch(runtime::current_context()) != "sm_90") GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  const std::vector<Variant> variants = {{131, true, false}, {257, false, true}, {200, false, true}, {300, true, true}};
  const Op op = GetParam();
  std::vector<Shape> shapes;
  for (int b : {16, 32, 64, 128})
    for (DType dt : {DType::bf16, DType::f16}) {
      const Layout layout = random_layout(b, 99 + b);  // not the layouts of the tests above
      generator::MatMulSpec spec{op, b, dt, FeatureAxis::last};
      spec.wgmma = true;
      std::uint64_t seed = 5000 + b;
      for (const auto& t : generator::tile_candidates(spec)) {
        // f16: one stage count suffices (the grouped kernels of b ≤ 32: one shape per block size)
        if (!t.wgmma || (dt == DType::f16 && t.stages != (t.columns > 0 ? 4 : 3)) ||
            (dt == DType::f16 && t.columns > 0 && (t.bm != 128 || t.warps_m != 2)))
          continue;
        spec.tiles = t;
        shapes.push_back({layout, spec, seed});
        seed += variants.size();
        // the grouped kernel again on a sparse layout and on a full one: the layout above (fill
        // 0.61-0.77) and the sparse one compute only the sub-blocks holding a consumer's blocks
        // (kSkipEmpty), the full one every sub-block
        if (t.columns > 0 && dt == DType::bf16 && b <= 32) {
          for (const bool skip : {true, false}) {
            const Layout other = skip ? sparse_layout(b, 7 + b) : full_square_layout(b);
            EXPECT_NE(
                generator::generate_matmul(other, spec).source.find(skip ? "kSkipEmpty = true" : "kSkipEmpty = false"),
                std::string::npos)
                << generator::tiles_tag(t);
            shapes.push_back({other, spec, seed});
            seed += variants.size();
          }
        }
      }
    }
  compile_shapes(shapes, variants);
  for (const auto& s : shapes) check_shape(s, variants);
  EXPECT_GT(shapes.size(), 15u);
  std::printf("GPU matmul: %zu Hopper tile shapes checked for %s\n", shapes.size(), std::string(to_string(op)).c_str());
}

INSTANTIATE_TEST_SUITE_P(Ops, MatMulGpuHopper,
                         ::testing::Values(Op::forward, Op::backward_data, Op::backward_weight),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// The swapped TMA kernel (b = 128, the Hopper default for forward and backward-data) over several
// tiles per CTA, where a consumer stores each tile while it computes its next (v27): 9 × 9 blocks at
// N = 8300 make 33 row tiles × 9 output block columns = 297 tiles for the GPU's CTAs. Columns (and
// rows, for backward-data) of 0, 1, 2 and 9 blocks give tiles of no stage, fewer stages than a
// tile's 4 pieces, as many and more; the last row tile's last two pieces lie past N. Plain, and
// gated (some gates 0) with accumulation.
TEST(MatMulGpuHopperPersistent, SwappedTilesOverSeveralWavesMatchReference) {
  std::mt19937_64 rng(4242);
  const std::int64_t rows = 9, cols = 9;
  std::vector<std::uint8_t> m(rows * cols);
  for (auto& v : m) v = rng() % 10 < 4;
  for (std::int64_t i = 0; i < rows; ++i)  // columns of 0, 1, 2 and 9 blocks
    m[i * cols + 0] = 0, m[i * cols + 1] = i == 0, m[i * cols + 2] = i < 2, m[i * cols + 3] = 1;
  for (std::int64_t j = 0; j < cols; ++j)  // rows of 1 and 2 blocks
    m[8 * cols + j] = j == 3, m[7 * cols + j] = j == 3 || j == 4;
  const Layout layout = Layout::from_dense(rows, cols, m);
  std::vector<Shape> shapes;
  std::uint64_t seed = 11000;
  for (Op op : {Op::forward, Op::backward_data}) {
    generator::MatMulSpec spec{op, 128, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    const generator::TileConfig t = generator::generate_matmul(layout, spec).tiles;
    EXPECT_TRUE(t.tma && t.swapped && t.persistent && t.warps_m == 2 && t.bm == 256)
        << "not the kernel this test is for: " << generator::tiles_tag(t);
    spec.tiles = t;
    shapes.push_back({layout, spec, seed});
    seed += 2;
  }
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  if (runtime::context_arch(runtime::current_context()) != "sm_90")
    GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  const std::vector<Variant> variants = {{8300, false, false}, {8300, true, true}};
  compile_shapes(shapes, variants);
  for (const auto& s : shapes) check_shape(s, variants);
}

// Backward-weight's schedule on Hopper (SddSchedule) on layouts of 40-560 units of dW, larger than
// the other tests': whole units in waves of the CTAs the GPU holds, the units left after the full
// waves split along N into pieces whose partials the last piece adds (b = 128: 1 wave and a few
// units left, each in 8 pieces; 100 blocks: halves on an H200's 132 CTAs where pairs of blocks
// make units). Every backward-weight TMA shape (a block, a tile or a row band per unit), N = 4099
// and 1000 (partial steps), gated and accumulating.
TEST(MatMulGpuHopperSchedule, BackwardWeightPiecesMatchReference) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  if (runtime::context_arch(runtime::current_context()) != "sm_90") GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  std::vector<Shape> shapes;
  int split = 0;
  for (int b : {32, 64, 128})
    for (int fixed : {0, b == 128 ? 100 : 200}) {  // blocks: Bernoulli (0) or exactly that many
      std::mt19937_64 rng(700 + b + fixed);
      const std::int64_t rows = 2048 / b, cols = rows + 3;
      std::vector<std::uint8_t> m(rows * cols);
      if (fixed == 0) {
        for (auto& v : m) v = rng() % 100 < (b == 128 ? 45 : 12);
      } else {
        for (int placed = 0; placed < fixed;) {
          auto& v = m[rng() % m.size()];
          if (v == 0) v = 1, ++placed;
        }
      }
      const Layout layout = Layout::from_dense(rows, cols, m);
      generator::MatMulSpec spec{Op::backward_weight, b, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      std::uint64_t seed = 9000 + b + fixed;
      for (const auto& t : generator::tile_candidates(spec)) {
        const int stages = fixed > 0 || t.row_blocks > 0 || t.tile_edge > 0 ? 4 : 3;  // fixed: the defaults' s4
        if (!t.tma || t.stages != stages) continue;
        spec.tiles = t;
        shapes.push_back({layout, spec, seed});
        seed += 2;
        // split on an H200 (132 SMs, as many CTAs as fit in 227 KB of shared memory each)
        const auto g = generator::generate_matmul(layout, spec);
        const int ctas = 132 * std::clamp(227 * 1024 / static_cast<int>(g.shared_bytes), 1, 2048 / g.tiles.threads);
        int planes = 0;  // the kernel's (0: built without split support, generator::sdd_kernel_planes)
        for (const auto& table : g.tables)
          if (table.name == "kCounts") planes = table.values.at(1);
        split += kernels::SddSchedule(static_cast<int>(g.grid_x), ctas, planes, 1000 / 64 + 1).q > 1;
      }
    }
  const std::vector<Variant> variants = {{4099, false, false}, {1000, true, true}};
  compile_shapes(shapes, variants);
  for (const auto& s : shapes) check_shape(s, variants);
  EXPECT_GT(shapes.size(), 8u);
  EXPECT_GE(split, 8) << "shapes whose units split (on 132 SMs)";
  std::printf("GPU matmul: %zu backward-weight shapes checked on larger layouts, %d split\n", shapes.size(), split);
}

// The backward-weight kernels that split along N share one workspace per context and stream
// (runtime::SplitWorkspaces), each finding its arrival counters at 0 where the kernel before it left
// them: three layouts of few blocks (so that each splits) at b = 32, 64 and 128, run in turn on the
// default stream three times, every run against the reference; the stream's workspace is then the
// largest kernel's, and it is freed with the last MatMul holding it.
TEST(MatMulGpuWorkspace, SplitKernelsShareOneWorkspacePerStream) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const runtime::Context ctx = runtime::current_context();
  const std::string arch = runtime::default_kernel_arch(runtime::context_arch(ctx));
  struct Case {
    int block;
    Layout layout;
  };
  const std::vector<Case> cases = {
      {64, Layout::from_coords(8, 8, {{0, 0}, {3, 5}, {7, 7}})},
      {128, Layout::from_coords(6, 6, {{0, 1}, {2, 2}, {4, 0}, {5, 5}, {1, 4}})},
      {32, Layout::from_coords(16, 16, {{0, 0}, {1, 9}, {5, 5}, {9, 2}, {15, 15}, {12, 3}})}};
  const std::int64_t n = 1000;
  std::int64_t largest = 0;
  int split = 0;
  {
    std::vector<std::unique_ptr<MatMul>> mms;
    for (const auto& c : cases) {
      generator::MatMulSpec spec{Op::backward_weight, c.block, DType::bf16, FeatureAxis::last};
      spec.wgmma = generator::has_wgmma(arch);
      const auto g = generator::generate_matmul(c.layout, generator::variants(spec)[0]);
      largest = std::max(largest, g.workspace_bytes);
      split += g.workspace_bytes > 0;
      mms.push_back(std::make_unique<MatMul>(c.layout, MatMulOptions{c.block, DType::bf16, FeatureAxis::last}));
    }
    ASSERT_GE(split, 2) << "kernels that split on this GPU's target (" << arch << ")";
    std::uint64_t seed = 13000;
    for (int round = 0; round < 3; ++round)
      for (std::size_t i = 0; i < mms.size(); ++i) {
        auto r = check::run_and_check(*mms[i], Op::backward_weight, {n, round == 2, round == 1, seed++});
        SCOPED_TRACE(fmt::format("b{} round {}", cases[i].block, round));
        EXPECT_EQ(r.unwritten, 0);
        EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
      }
    EXPECT_EQ(runtime::SplitWorkspaces::global().held_bytes(ctx, nullptr), static_cast<std::size_t>(largest));
  }
  EXPECT_EQ(runtime::SplitWorkspaces::global().held_bytes(ctx, nullptr), 0u) << "freed with the last holder";
}

// A workspace the caller gives (OpOptions::workspace) serves the split kernels, and bsjit allocates
// none; one too small is refused before launch.
TEST(MatMulGpuWorkspace, CallerWorkspaceServesTheSplitKernels) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const runtime::Context ctx = runtime::current_context();
  const Layout layout = Layout::from_coords(8, 8, {{0, 0}, {3, 5}, {7, 7}});  // 3 blocks: split along N
  const MatMul mm(layout, MatMulOptions{64, DType::bf16, FeatureAxis::last});
  const std::int64_t n = 1000;
  const std::size_t bytes = mm.workspace_size(Op::backward_weight, n);
  ASSERT_GT(bytes, MatMul::workspace_counter_bytes()) << "this layout's backward-weight splits";
  EXPECT_LE(mm.workspace_size(Op::forward, n), MatMul::workspace_counter_bytes()) << "at most the wave's counters";
  runtime::DeviceMemory memory(bytes);
  BSJIT_CU(runtime::driver().cuMemsetD8(memory.ptr, 0, MatMul::workspace_counter_bytes()));
  std::uint64_t seed = 16000;
  for (int round = 0; round < 3; ++round) {
    auto r = check::run_and_check(mm, Op::backward_weight, {n, round == 2, round == 1, seed++, memory.get(), bytes});
    SCOPED_TRACE(round);
    EXPECT_EQ(r.unwritten, 0);
    EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
  }
  EXPECT_EQ(runtime::SplitWorkspaces::global().held_bytes(ctx, nullptr), 0u) << "bsjit allocated none";
  try {
    check::run_and_check(mm, Op::backward_weight, {n, false, false, seed, memory.get(), bytes - 16});
    ADD_FAILURE() << "expected an Error for a workspace too small";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace_size"), std::string::npos) << e.what();
  }
}

// The persistent Hopper kernels pace their wave through counters in the workspace
// (kernels::WaveGate), which the last CTA sets back to 0: the grouped (b = 32), paired (b = 64) and
// swapped (b = 128) dsd kernels and two backward-weight kernels, on layouts where every CTA of
// an H100 (132 SMs) has more rounds than the gate's lead of 2, each three times (plain, gated,
// accumulating) on a workspace the caller gives, each against the reference, the counters read
// back as zeros after each; at one row tile the dsd kernels take no workspace (the gate would not
// wait). The layouts are long and thin: the reference is dense (N · C · K).
TEST(MatMulGpuWorkspace, PacedKernelsLeaveTheirCountersAtZero) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const std::string arch = runtime::default_kernel_arch(runtime::context_arch(runtime::current_context()));
  if (!generator::has_wgmma(arch)) GTEST_SKIP() << "the paced kernels are Hopper's (" << arch << ")";
  struct Case {
    Op op;
    int block;
    std::int64_t rows, cols, n;  // blocks of a Bernoulli(1/2) layout; rows of N
  };
  const std::vector<Case> cases = {{Op::forward, 32, 4, 512, 2048},         {Op::backward_data, 32, 512, 4, 2048},
                                   {Op::forward, 64, 4, 256, 2048},         {Op::backward_data, 64, 256, 4, 2048},
                                   {Op::forward, 128, 4, 64, 2048},         {Op::backward_data, 128, 64, 4, 2048},
                                   {Op::backward_weight, 32, 96, 96, 1024}, {Op::backward_weight, 64, 64, 32, 2048}};
  std::uint64_t seed = 17000;
  for (const Case& c : cases) {
    std::mt19937_64 rng(seed);
    std::vector<std::uint8_t> m(c.rows * c.cols);
    for (auto& v : m) v = rng() % 2;
    m[0] = 1;
    const Layout layout = Layout::from_dense(c.rows, c.cols, m);
    const MatMul mm(layout, MatMulOptions{c.block, DType::bf16, FeatureAxis::last});
    generator::MatMulSpec spec{c.op, c.block, DType::bf16, FeatureAxis::last};
    spec.wgmma = true;
    const auto g = generator::generate_matmul(layout, generator::variants(spec)[0]);
    SCOPED_TRACE(fmt::format("{} {} x {} blocks, n = {}", g.label, c.rows, c.cols, c.n));
    const std::int64_t ctas = generator::resident_ctas(g.tiles, generator::kDefaultSms);
    ASSERT_NE(g.source.find("kWaveGate = true"), std::string::npos) << "a paced kernel";
    ASSERT_GT(generator::paced_rounds(g, ctas, c.n), kernels::kWaveGateLead) << "the gate must wait";
    const std::size_t bytes = mm.workspace_size(c.op, c.n);
    ASSERT_GE(bytes, MatMul::workspace_counter_bytes()) << "the paced kernel takes the workspace";
    if (c.op != Op::backward_weight) {  // one row tile: fewer tiles than CTAs, no round to wait for
      EXPECT_EQ(generator::paced_rounds(g, ctas, g.rows_per_cta), 0);
      EXPECT_EQ(mm.workspace_size(c.op, g.rows_per_cta), 0u) << "no workspace where the gate would not wait";
    }
    runtime::DeviceMemory memory(bytes);
    BSJIT_CU(runtime::driver().cuMemsetD8(memory.ptr, 0, MatMul::workspace_counter_bytes()));
    for (int round = 0; round < 3; ++round) {
      auto r = check::run_and_check(mm, c.op, {c.n, round == 2, round == 1, seed++, memory.get(), bytes});
      EXPECT_EQ(r.unwritten, 0) << "round " << round;
      EXPECT_LE(r.relative_error, check::tolerance(DType::bf16)) << "round " << round;
      std::vector<unsigned> counters(kernels::kSplitCounters, 1u);
      BSJIT_CU(runtime::driver().cuMemcpyDtoH(counters.data(), memory.ptr, counters.size() * sizeof(unsigned)));
      EXPECT_EQ(std::count(counters.begin(), counters.end(), 0u), kernels::kSplitCounters) << "round " << round;
    }
  }
}

// Layouts of one shape whose kernels have one source (columns permuted) share one compile, and each
// loads its own module with its own tables: run interleaved, each matches its own reference.
TEST(MatMulGpuSharedCode, LayoutsOfOneShapeRunWithTheirOwnTables) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const std::string arch = runtime::default_kernel_arch(runtime::context_arch(runtime::current_context()));
  int shared = 0;
  std::uint64_t seed = 15000;
  for (int b : {64, 128}) {
    const Layout a = random_layout(b, 40 + b);
    std::vector<std::pair<std::int64_t, std::int64_t>> moved;
    for (const auto& [r, c] : a.coords()) moved.push_back({r, (c + 1) % a.cols()});
    const Layout moved_layout = Layout::from_coords(a.rows(), a.cols(), moved);
    ASSERT_NE(a.hash().hex(), moved_layout.hash().hex());
    const MatMulOptions o{b, DType::bf16, FeatureAxis::last, ""};
    MatMul ma(a, o), mb(moved_layout, o);
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight}) {
      const auto before = cache_stats();
      const bool one_source = ma.generated_source(op) == mb.generated_source(op);
      ma.precompile(op, arch), mb.precompile(op, arch);
      if (one_source) {
        EXPECT_GT(cache_stats().shared_compiles, before.shared_compiles) << to_string(op) << " b" << b;
        ++shared;
      }
      for (MatMul* mm : {&ma, &mb, &ma}) {
        auto r = check::run_and_check(*mm, op, {333, false, false, seed++});
        SCOPED_TRACE(fmt::format("{} b{} layout {}", to_string(op), b, mm == &ma ? "a" : "b"));
        EXPECT_EQ(r.unwritten, 0);
        EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
      }
    }
  }
  EXPECT_GE(shared, 2) << "kernels of one source among the 6";
}

// The small batch's split columns (TileConfig::split, a Hopper tuning candidate at N ≤ 128, forced
// here through a tuning record of the small-batch variant): a column and
// a row holding every block (48) beside sparse ones, so that forward and backward-data each cut a
// column into pieces on several CTAs, whose partials the column's last piece adds; b = 32, 64 and
// 128, one and two row tiles, gated and accumulating, the last case twice (each launch leaves its
// counters at 0 for the next). A split kernel refuses more rows than its workspace holds.
TEST(MatMulGpuSplit, SmallBatchPiecesMatchReference) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const runtime::Context ctx = runtime::current_context();
  if (runtime::context_arch(ctx) != "sm_90") GTEST_SKIP() << "needs a compute capability 9.0 GPU";
  std::uint64_t seed = 19000;
  int cut = 0;
  for (int b : {32, 64, 128}) {
    const std::int64_t r = 48;
    std::mt19937_64 rng(600 + b);
    std::vector<std::uint8_t> m(r * r);
    for (auto& v : m) v = rng() % 100 < 5;
    for (std::int64_t i = 0; i < r; ++i) m[i * r + 3] = 1, m[5 * r + i] = 1;
    const Layout layout = Layout::from_dense(r, r, m);
    for (Op op : {Op::forward, Op::backward_data}) {
      generator::MatMulSpec spec{op, b, DType::bf16, FeatureAxis::last};
      spec.wgmma = true;
      generator::MatMulSpec small = generator::variants(spec).at(1);
      for (const auto& t : generator::tile_candidates(small))
        if (t.split && !small.tiles) small.tiles = t;
      ASSERT_TRUE(small.tiles);
      runtime::store_tuning(layout.hash().hex(), small, "sm_90a", 1, *small.tiles);
      const MatMul mm(layout, {b, DType::bf16, FeatureAxis::last, "sm_90a"});
      EXPECT_EQ(mm.kernel_label(op, 64, {.accumulate = true}), generator::kernel_label(small))
          << "the tuned split shape runs";
      EXPECT_EQ(mm.kernel_label(op, 64), generator::kernel_label(small) + "-plain") << "plain calls: its plain form";
      const auto g = generator::generate_matmul(layout, small);
      EXPECT_TRUE(g.split) << g.label;
      cut += g.workspace_bytes > 0;
      for (const Variant& v : {Variant{1, false, false}, Variant{64, false, false}, Variant{77, true, false},
                               Variant{128, false, true}, Variant{100, true, true}, Variant{100, true, true}}) {
        auto res = check::run_and_check(mm, op, {v.n, v.accumulate, v.gated, seed++});
        tally().add(DType::bf16, res.relative_error);
        SCOPED_TRACE(fmt::format("{} b{} n={} gate={} accumulate={}", to_string(op), b, v.n, v.gated, v.accumulate));
        EXPECT_EQ(res.unwritten, 0);
        EXPECT_LE(res.relative_error, check::tolerance(DType::bf16));
      }
      if (b == 64 && op == Op::forward) {
        auto p = runtime::KernelRegistry::global().prepare(layout, {layout.hash().hex(), small, "sm_90a"},
                                                           cache::OnMiss::compile);
        const auto loaded = runtime::SharedKernels::global().acquire(p->compiled, ctx);
        runtime::KernelArgs args;
        EXPECT_THROW(runtime::launch_prepared(*p, loaded->function, ctx, op, generator::kSmallBatchRows + 1, nullptr,
                                              args),
                     Error);
      }
    }
  }
  EXPECT_EQ(cut, 6) << "every kernel cut its full column";
}

// A process making a MatMul per new layout (dynamic sparsity): objects of one layout share their
// loaded kernels, a dropped object's kernels stay loaded (parked) for a later object up to
// SharedKernels::kParked, beyond which the older half is unloaded, so loaded modules and their
// tables' memory stay bounded however many layouts come; a kernel parked and taken back, or
// unloaded and loaded again, computes right.
TEST(MatMulGpuLifetime, KernelsGoWithTheirObjects) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  auto& shared = runtime::SharedKernels::global();
  const MatMulOptions o{64, DType::bf16, FeatureAxis::last, ""};
  const std::size_t per_object = generator::variants({Op::forward, 64, DType::bf16, FeatureAxis::last}).size();
  // distinct layouts of one shape: column permutations of one random layout (they share one compile)
  const Layout base = random_layout(64, 77);
  std::vector<Layout> layouts;
  std::set<std::string> hashes;
  std::mt19937_64 rng(78);
  const std::size_t count = runtime::SharedKernels::kParked + 8;
  for (int tries = 0; layouts.size() < count && tries < 100000; ++tries) {
    std::vector<std::int64_t> to(base.cols());
    std::iota(to.begin(), to.end(), 0);
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<std::pair<std::int64_t, std::int64_t>> coords;
    for (const auto& [r, c] : base.coords()) coords.push_back({r, to[c]});
    Layout l = Layout::from_coords(base.rows(), base.cols(), coords);
    if (hashes.insert(l.hash().hex()).second) layouts.push_back(std::move(l));
  }
  ASSERT_EQ(layouts.size(), count);
  std::uint64_t seed = 17000;
  auto expect_right = [&](const MatMul& mm, Op op, std::int64_t n, const std::string& what) {
    auto r = check::run_and_check(mm, op, {n, false, false, seed++});
    SCOPED_TRACE(fmt::format("{} {} n={}", what, to_string(op), n));
    EXPECT_EQ(r.unwritten, 0);
    EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
  };
  const auto [held0, parked0] = shared.counts();
  {
    const MatMul a(layouts[0], o), b(layouts[0], o);
    a.prepare(Op::forward, Calls::plain), b.prepare(Op::forward, Calls::plain);
    EXPECT_EQ(shared.counts().first, held0 + per_object) << "two objects of one layout share its kernels";
    expect_right(a, Op::forward, 333, "first object");
    expect_right(b, Op::forward, 333, "second object");
  }
  EXPECT_EQ(shared.counts().first, held0) << "released with their objects";
  for (std::size_t i = 1; i < layouts.size(); ++i) {
    const MatMul mm(layouts[i], o);
    mm.prepare(Op::forward, Calls::plain);
    EXPECT_EQ(shared.counts().first, held0 + per_object);
    if (i % 16 == 0) expect_right(mm, Op::forward, 333, fmt::format("layout {}", i));
  }
  const auto [held, parked] = shared.counts();
  EXPECT_EQ(held, held0);
  EXPECT_LE(parked, runtime::SharedKernels::kParked) << "released kernels beyond the bound are unloaded";
  EXPECT_GE(parked, runtime::SharedKernels::kParked / 2) << "the most recently released stay loaded";
  {
    const MatMul last(layouts.back(), o);
    last.prepare(Op::forward, Calls::plain);
    EXPECT_EQ(shared.counts(), std::make_pair(held0 + per_object, parked - per_object))
        << "the last layout's kernels were parked: taken back, not loaded again";
    expect_right(last, Op::forward, 333, "taken back");
  }
  const auto parked_before_first = shared.counts().second;
  {
    const MatMul first(layouts[0], o);
    first.prepare(Op::forward, Calls::plain);
    EXPECT_EQ(shared.counts().second, parked_before_first) << "the first layout's kernels were unloaded: loaded anew";
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
      for (std::int64_t n : {333, 40}) expect_right(first, op, n, "loaded again");
  }
}

// prepare of several ops: every kernel a layer's calls need is compiled (side by side) and loaded
// before the first call, so that, with the cache strict from then on, all three ops at both batch
// variants, with and without OpOptions, run without a compile, and right. prepare of the plain
// calls only leaves a call with options to compile: strict, it fails.
TEST(MatMulGpuPrepare, SeveralOpsAtOnceLeaveNothingToCompile) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  struct StrictAfter {  // strict until the end of the test, whatever happens
    ~StrictAfter() { set_strict_cache(false); }
  } restore;
  for (int block : {32, 128}) {
    const MatMul mm(random_layout(block, 18000 + block), {block, DType::bf16, FeatureAxis::last, ""});
    const auto before = cache_stats();
    mm.prepare({Op::forward, Op::backward_data, Op::backward_weight});
    const auto made = [](const CacheStats& c) { return c.compiles + c.shared_compiles + c.disk_hits; };
    EXPECT_GT(made(cache_stats()), made(before)) << "a new layout's entries were made (compiled, from shared code or read)";
    set_strict_cache(true);
    const auto prepared = cache_stats();
    std::uint64_t seed = 18100;
    for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
      for (std::int64_t n : {333, 40})
        for (bool options : {false, true}) {
          SCOPED_TRACE(fmt::format("b={} {} n={} accumulate and gate: {}", block, to_string(op), n, options));
          check::CheckResult r;
          ASSERT_NO_THROW(r = check::run_and_check(mm, op, {n, options, options, seed++}));
          EXPECT_EQ(r.unwritten, 0);
          EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
        }
    EXPECT_EQ(made(cache_stats()), made(prepared)) << "the calls found every kernel in memory";
    const auto loaded = cache_stats();
    mm.prepare({Op::forward, Op::backward_data, Op::backward_weight});
    EXPECT_EQ(cache_stats().memory_hits, loaded.memory_hits) << "a repeated prepare looks up no kernel: all are loaded";
    EXPECT_EQ(made(cache_stats()), made(loaded));
    set_strict_cache(false);
    // the plain calls only
    // a shape no other test uses: no layout compiled before shares its kernels' code
    const MatMul plain(Layout::from_coords(3, 7, {{0, 1}, {1, 4}, {2, 2}, {2, 6}}),
                       {block, DType::bf16, FeatureAxis::last, ""});
    plain.prepare(Op::forward, Calls::plain);
    set_strict_cache(true);
    for (std::int64_t n : {333, 40}) {
      check::CheckResult r;
      ASSERT_NO_THROW(r = check::run_and_check(plain, Op::forward, {n, false, false, seed++})) << "n = " << n;
      EXPECT_LE(r.relative_error, check::tolerance(DType::bf16));
    }
    try {
      check::run_and_check(plain, Op::forward, {333, true, false, seed++});
      ADD_FAILURE() << "b = " << block << ": an accumulating call found a kernel prepare(plain) did not make";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("strict cache"), std::string::npos) << e.what();
    }
    set_strict_cache(false);
  }
}

// fp32 as TF32 (opt-in): every op at b = 16-128 on the mma.sync kernels for 4-byte tiles (both batch
// variants: n = 77 runs the small-batch one), against the double-precision reference, within the
// 16-bit tolerance (TF32 keeps 10 mantissa bits, as fp16 does); above exact fp32's errors, so the
// tensor-core path is what ran.
TEST(MatMulGpuTf32, MatchesDenseReference) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  double worst = 0;
  for (Op op : {Op::forward, Op::backward_data, Op::backward_weight})
    for (int b : {16, 32, 64, 128}) {
      MatMul mm(random_layout(b, 300 + b), {b, DType::f32, FeatureAxis::last, "", true});
      std::uint64_t seed = 7000 + 10 * b + static_cast<int>(op);
      double largest = 0;  // of this op and block
      for (const Variant& v : kVariants) {
        auto r = check::run_and_check(mm, op, {v.n, v.accumulate, v.gated, seed++});
        largest = std::max(largest, r.relative_error);
        SCOPED_TRACE(
            fmt::format("tf32 {} b{} n={} gate={} accumulate={}", to_string(op), b, v.n, v.gated, v.accumulate));
        EXPECT_EQ(r.unwritten, 0);
        EXPECT_LE(r.relative_error, check::tolerance(mm.options()));
      }
      // Over the variants (one of them may happen to be exact: every block it reads gated to 0, say)
      EXPECT_GT(largest, 1e-6) << "exact fp32's error: not the TF32 kernel (" << to_string(op) << " b" << b << ")";
      worst = std::max(worst, largest);
    }
  std::printf("GPU matmul: tf32, worst relative error %.3g\n", worst);
}

TEST(MatMulGpuErrors, WrongArchKernelIsAClearError) {
  std::string why;
  if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  std::string arch = runtime::context_arch(runtime::current_context());
  // a cubin for another major architecture cannot load here
  MatMulOptions o{32, DType::bf16, FeatureAxis::last, arch == "sm_80" ? "sm_90" : "sm_80"};
  MatMul mm(full_layout(32), o);
  check::CheckOptions co{64, false, false, 1};
  try {
    check::run_and_check(mm, Op::forward, co);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not match this device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bsjit

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new bsjit::GpuEnvironment);
  return RUN_ALL_TESTS();
}
