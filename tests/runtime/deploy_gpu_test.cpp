// GPU tests (label "gpu") of deployment: precompile → warm-up (manifest and directory) in fresh
// processes, strict mode at op time, and one MatMul used on several GPUs from several threads.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "bsjit/bsjit.hpp"
#include "cache/kernel_cache.hpp"
#include "command.hpp"
#include "op_check.hpp"
#include "runtime/compiler.hpp"
#include "runtime/driver.hpp"
#include "runtime/module.hpp"

namespace bsjit {
namespace {

namespace fs = std::filesystem;

// The build tree may have been copied to the GPU machine: find the CLI beside this binary and the
// examples from the working directory when the configured paths are gone.
fs::path cli() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "tools" / "bsjit"; }
fs::path examples() { return fs::exists(BSJIT_EXAMPLES) ? fs::path(BSJIT_EXAMPLES) : fs::path("examples"); }

using Result = bsjit::testing::CommandResult;
Result sh(const std::string& args, const std::string& env = "") {
  return bsjit::testing::run_command(cli().string() + " " + args, env);
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("bsjit-deploy-test-" + std::to_string(std::random_device{}()));
  TempDir() {
    fs::create_directories(path);
    fs::permissions(path, fs::perms::owner_all);
  }
  ~TempDir() { fs::remove_all(path); }
};

class DeployGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!runtime::gpu_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    arch_ = runtime::default_kernel_arch(runtime::context_arch(runtime::current_context()));
  }
  std::string arch_;
};

// In fresh processes: strict warm-up of the manifest fails on an empty cache; precompile; strict
// warm-up loads its `items` on every GPU, and warm-up of the directory its `entries` on every GPU.
void precompile_then_strict_warmup(const std::string& manifest_json, int items, int entries) {
  TempDir dir;
  auto manifest = dir.path / "m.json";
  std::ofstream(manifest) << manifest_json;
  const std::string cache = "--cache-dir " + (dir.path / "c").string();
  auto r = sh(cache + " warmup --strict -m " + manifest.string());
  EXPECT_EQ(r.status, 1) << "strict warm-up of an empty cache must fail:\n" << r.output;
  EXPECT_NE(r.output.find("strict cache"), std::string::npos) << r.output;
  r = sh(cache + " precompile -m " + manifest.string());
  ASSERT_EQ(r.status, 0) << r.output;
  int gpus = 0;
  BSJIT_CU(runtime::driver().cuDeviceGetCount(&gpus));
  r = sh(cache + " warmup --strict -m " + manifest.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("{} loaded, 0 failed", items * gpus)), std::string::npos) << r.output;
  r = sh(cache + " warmup --dir " + (dir.path / "c").string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("{} loaded, 0 failed", entries * gpus)), std::string::npos) << r.output;
  std::printf("%s", r.output.c_str());  // per-kernel load times, for the record
}

// 4 matmul items; 16 entries (each has a small-batch variant too, each of those a plain and a
// general kernel)
TEST_F(DeployGpu, PrecompileThenStrictWarmupInFreshProcesses) {
  precompile_then_strict_warmup(
      fmt::format(R"({{"layouts": ["{}"], "ops": ["forward", "backward_weight"], "blocks": [32, 64],
                      "dtypes": ["bf16"], "archs": ["{}"]}})",
                  (fs::absolute(examples()) / "layouts" / "banded.json").string(), arch_),
      4, 16);
}

// A manifest of plain calls, TF32: precompile builds the plain TF32 kernels only (2 entries), strict
// warm-up of that manifest loads them (the TF32 ones, not exact fp32's), a strict warm-up that
// also wants the general kernels fails, and in strict mode a plain call runs while an accumulating
// one fails.
TEST_F(DeployGpu, PlainCallsAndTf32FromTheManifest) {
  TempDir dir;
  const std::string layout = (fs::absolute(examples()) / "layouts" / "banded.json").string();
  const auto manifest = [&](const char* name, const char* calls) {
    auto path = dir.path / name;
    std::ofstream(path) << fmt::format(R"({{"layouts": ["{}"], "ops": ["forward"], "blocks": [32], "dtypes": ["f32"],
                                          "tf32": [true], "archs": ["{}"], "calls": "{}"}})",
                                       layout, arch_, calls);
    return path.string();
  };
  const std::string plain = manifest("plain.json", "plain"), all = manifest("all.json", "all");
  const std::string cache = "--cache-dir " + (dir.path / "c").string();
  auto r = sh(cache + " precompile -m " + plain);
  ASSERT_EQ(r.status, 0) << r.output;
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir.path / "c")) {
    if (e.path().extension() != ".bsjit") continue;
    ++entries;
    const std::string name = e.path().filename().string();
    EXPECT_NE(name.find("-tf32-"), std::string::npos) << name;
    EXPECT_NE(name.find("-plain-"), std::string::npos) << name;
  }
  EXPECT_EQ(entries, 2);
  int gpus = 0;
  BSJIT_CU(runtime::driver().cuDeviceGetCount(&gpus));
  r = sh(cache + " warmup --strict -m " + plain);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("{} loaded, 0 failed", gpus)), std::string::npos) << r.output;
  r = sh(cache + " warmup --strict -m " + all);
  EXPECT_EQ(r.status, 1) << "the general kernels are not in the cache:\n" << r.output;
  const std::string run = cache + " run -n 300 -l " + layout + " -o forward -b 32 -t f32 --tf32";
  r = sh(run, "BSJIT_STRICT_CACHE=1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ok "), std::string::npos) << r.output;
  r = sh(run + " --accumulate", "BSJIT_STRICT_CACHE=1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("strict cache"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"with_options\""), std::string::npos) << "says which calls need it: " << r.output;
  r = sh(run + " --accumulate");  // not strict: compiles the general kernel, and names it
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("kernel forward-f32-tf32-b32-last"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("-plain\n"), std::string::npos) << "ran the general kernel: " << r.output;
}

// Attention: a fused and a decomposed item; 4 + 5 entries
TEST_F(DeployGpu, AttentionPrecompileThenStrictWarmup) {
  precompile_then_strict_warmup(
      fmt::format(R"({{"attention": [{{"masks": ["{}"], "blocks": [64], "head_dims": [128], "causal": [true],
                      "ops": ["fused", "decomposed"], "archs": ["{}"]}}]}})",
                  (fs::absolute(examples()) / "layouts" / "attention_window_global.json").string(), arch_),
      2, 9);
}

// bsjit tune in one process; a later process in strict mode, whose cache holds only the kernels
// the tuner chose, runs and checks the ops with exactly those kernels: it found the tuning records.
TEST_F(DeployGpu, AutotuneChoiceReachesTheNextProcess) {
  TempDir dir;
  const std::string cache = "--cache-dir " + (dir.path / "c").string();
  const std::string kernel = "-l " + (fs::absolute(examples()) / "layouts" / "random_d25.npy").string() +
                             " -o forward,backward_weight -b 64 -t bf16";
  auto r = sh(cache + " tune -n 2048 " + kernel);
  ASSERT_EQ(r.status, 0) << r.output;
  std::printf("%s", r.output.c_str());
  // the chosen shape per op ("...forward b64 bf16 last n=2048: chose tma2-bm256-s4")
  std::vector<std::string> chosen;
  for (std::size_t at = 0; (at = r.output.find(": chose ", at)) != std::string::npos;) {
    at += 8;
    chosen.push_back(r.output.substr(at, r.output.find('\n', at) - at));
  }
  ASSERT_EQ(chosen.size(), 2u) << r.output;
  // keep only the chosen kernels: a process that ignored the records and wanted another kernel
  // would fail in strict mode
  int records = 0, kept = 0;
  for (auto& e : fs::directory_iterator(dir.path / "c")) {
    records += e.path().extension() == ".tune";
    if (e.path().extension() != ".bsjit") continue;
    const std::string name = e.path().filename().string();
    // the tag, then the arch: "-tma1-bm128-s4-" alone would also match "-tma1-bm128-s4-p-sm_90a-";
    // `bsjit run` makes plain calls
    const auto tagged = [&](const std::string& tag) {
      return name.find("-" + tag + "-plain-sm_") != std::string::npos;
    };
    const bool keep = (name.rfind("forward-", 0) == 0 && tagged(chosen[0])) ||
                      (name.rfind("backward_weight-", 0) == 0 && tagged(chosen[1]));
    if (keep) ++kept;
    else fs::remove(e.path());
  }
  EXPECT_EQ(records, 2);
  EXPECT_EQ(kept, 2);
  r = sh(cache + " run -n 2048 " + kernel, "BSJIT_STRICT_CACHE=1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  for (const auto& c : chosen)
    EXPECT_NE(r.output.find("-" + c + "-plain\n"), std::string::npos) << c << "\n" << r.output;
}

// Rewrites every entry in dir with a function name its code lacks, checksum and all: entries that
// verify, and that the driver refuses (cuModuleGetFunction: CUDA_ERROR_NOT_FOUND). Returns how many.
int plant_refused_entries(const fs::path& dir) {
  int planted = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".bsjit") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why;
    cache::EntryHeader h;
    auto k = cache::KernelCache::deserialize(bytes, "", &why, &h);
    EXPECT_TRUE(k) << e.path() << ": " << why;
    if (!k) continue;
    k->lowered_name = "_Z22bsjit_no_such_function";
    cache::Request r{h.key, h.label, h.arch, h.layout_hash, {}, k->tables, h.code_key};
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << cache::KernelCache::serialize(r, *k);
    ++planted;
  }
  return planted;
}

// An entry that verifies but does not load is compiled again and replaced, like one that fails to
// verify; strict mode, which compiles nothing, fails naming it; warm-up of the directory reports it.
TEST_F(DeployGpu, AnEntryTheDriverRefusesIsRebuilt) {
  TempDir dir;
  const std::string cache = "--cache-dir " + (dir.path / "c").string();
  const std::string run = cache + " run -n 300 -l " + (fs::absolute(examples()) / "layouts" / "banded.json").string() +
                          " -o forward,backward_weight -b 32 -t bf16";
  auto r = sh(run);
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_GT(plant_refused_entries(dir.path / "c"), 0);
  r = sh(cache + " cache verify");
  EXPECT_EQ(r.status, 0) << "the planted entries verify:\n" << r.output;
  r = sh(cache + " warmup --dir " + (dir.path / "c").string());
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("CUDA_ERROR_NOT_FOUND"), std::string::npos) << r.output;
  r = sh(run, "BSJIT_STRICT_CACHE=1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("precompile it again"), std::string::npos) << r.output;
  r = sh(run);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("refuses cached kernel"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  for (auto& e : fs::directory_iterator(dir.path / "c")) {
    if (e.path().extension() != ".bsjit") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::string why;
    auto k = cache::KernelCache::deserialize(bytes, "", &why);
    ASSERT_TRUE(k) << e.path() << ": " << why;
    EXPECT_NE(k->lowered_name, "_Z22bsjit_no_such_function") << e.path() << " was not replaced";
  }
  r = sh(run, "BSJIT_STRICT_CACHE=1");
  EXPECT_EQ(r.status, 0) << "the replaced entries serve a strict run:\n" << r.output;
}

TEST_F(DeployGpu, StrictModeAtOpTime) {
  set_cache_directory({});
  set_strict_cache(true);
  // a layout no other test uses, so no process-wide memory holds its kernel
  Layout fresh = Layout::from_coords(3, 5, {{0, 4}, {1, 1}, {2, 0}, {2, 3}});
  MatMul mm(fresh, {16, DType::f16, FeatureAxis::last, ""});
  try {
    check::run_and_check(mm, Op::forward, {40, false, false, 3});
    ADD_FAILURE() << "expected a strict-cache Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strict cache"), std::string::npos) << e.what();
  }
  set_strict_cache(false);
  mm.precompile(Op::forward, arch_);
  set_strict_cache(true);
  auto r = check::run_and_check(mm, Op::forward, {40, false, false, 3});
  EXPECT_LE(r.relative_error, check::tolerance(DType::f16));
  set_strict_cache(false);
}

TEST_F(DeployGpu, OneMatMulOnEveryGpuFromItsOwnThread) {
  const auto& d = runtime::driver();
  int count = 0;
  BSJIT_CU(d.cuDeviceGetCount(&count));
  if (count < 2) GTEST_SKIP() << "one GPU: the multi-GPU test needs two (device kind nvidia-h200-x2)";
  Layout layout = Layout::load(examples() / "layouts" / "random_d25.npy");
  MatMul mm(layout, {32, DType::bf16, FeatureAxis::last, ""});
  std::vector<check::CheckResult> results(count);
  std::vector<std::string> errors(count);
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i)
    threads.emplace_back([&, i] {
      try {
        CUdevice dev;
        CUcontext ctx;
        BSJIT_CU(d.cuDeviceGet(&dev, i));
        BSJIT_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
        BSJIT_CU(d.cuCtxSetCurrent(ctx));
        for (Op op : {Op::forward, Op::backward_data, Op::backward_weight}) {
          auto r = check::run_and_check(mm, op, {1000 + i, false, false, static_cast<std::uint64_t>(i)});
          results[i].relative_error = std::max(results[i].relative_error, r.relative_error);
          results[i].unwritten += r.unwritten;
        }
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < count; ++i) {
    EXPECT_EQ(errors[i], "") << "GPU " << i;
    EXPECT_EQ(results[i].unwritten, 0) << "GPU " << i;
    EXPECT_LE(results[i].relative_error, check::tolerance(DType::bf16)) << "GPU " << i;
    std::printf("GPU %d: worst relative error %.3g over the three ops\n", i, results[i].relative_error);
  }
}

}  // namespace
}  // namespace bsjit
