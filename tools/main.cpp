// bsjit: the command-line tool.
//   bsjit info                          versions, cache directory, visible GPUs
//   bsjit inspect FILE...               layout statistics and hash
//   bsjit make-layout PATTERN -o FILE   attention block masks (causal, window, bigbird, ...)
//   bsjit precompile (-m MANIFEST | -l FILE...)   compile kernels into the cache, no GPU needed
//   bsjit warmup (-m MANIFEST | --dir DIR)       load kernels on every GPU, with load times
//   bsjit cache list|verify|prune|clear          look after a cache directory
//   bsjit tune -l FILE -n N             time every tile shape, keep the fastest in the cache
//   bsjit run -l FILE                   run ops on the GPU and check them against the CPU reference
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string_view>
#include <vector>

#include "bsjit/bsjit.hpp"
#include "generator/matmul_generator.hpp"
#include "kernel_hashes.hpp"
#include "layout_image.hpp"
#include "op_check.hpp"
#include "runtime/compiler.hpp"
#include "runtime/driver.hpp"

namespace {

using namespace bsjit;

// Kernels named on the command line, or by a manifest file.
struct KernelSelection {
  std::string manifest;
  std::vector<std::string> layouts;
  std::vector<std::string> ops{"forward", "backward_data", "backward_weight"};
  std::vector<int> blocks{32};
  std::vector<std::string> dtypes{"bf16"};
  std::vector<std::string> feature_axes{"last"};
  std::vector<std::string> archs{"sm_90a"};
  bool tf32 = false;
  std::string calls = "all";
  int sms = 0;

  Manifest to_manifest() const {
    if (!manifest.empty()) return Manifest::load(manifest);
    if (layouts.empty()) throw Error("name the kernels with --manifest FILE or --layout FILE...");
    KernelGroup g;
    g.layouts.assign(layouts.begin(), layouts.end());
    g.ops.clear();
    for (auto& o : ops) g.ops.push_back(parse_op(o));
    g.blocks = blocks;
    g.dtypes.clear();
    for (auto& d : dtypes) g.dtypes.push_back(parse_dtype(d));
    g.feature_axes.clear();
    for (auto& a : feature_axes) g.feature_axes.push_back(parse_feature_axis(a));
    g.archs = archs;
    g.tf32 = {tf32};
    g.calls = parse_calls(calls);
    g.sms = sms;
    return Manifest{{g}};
  }
};

void add_selection(CLI::App* cmd, KernelSelection& s, bool with_arch) {
  cmd->add_option("-m,--manifest", s.manifest, "JSON manifest of kernels (see include/bsjit/deploy.hpp)")
      ->check(CLI::ExistingFile);
  cmd->add_option("-l,--layout", s.layouts, "layout files (.npy or .json)")->check(CLI::ExistingFile);
  cmd->add_option("-o,--op", s.ops, "ops: forward, backward_data, backward_weight")->delimiter(',');
  cmd->add_option("-b,--block", s.blocks, "block sizes: 8, 16, 32, 64, 128")->delimiter(',');
  cmd->add_option("-t,--dtype", s.dtypes, "dtypes: f32, f16, bf16")->delimiter(',');
  cmd->add_option("-f,--feature-axis", s.feature_axes, "feature axis of X and Y: last ([N, C]) or first ([C, N])")
      ->delimiter(',');
  cmd->add_flag("--tf32", s.tf32,
                "the f32 kernels multiply as TF32 on the tensor cores (block ≥ 16, feature axis last)");
  if (with_arch) {
    cmd->add_option("-a,--arch", s.archs,
                    "target architectures (default sm_90a: H100/H200; sm_80 for A100; plain sm_90 has no wgmma kernels)")
        ->delimiter(',');
    cmd->add_option("--calls", s.calls,
                    "kernels for which calls: all (default), plain (no accumulate or gate) or with_options")
        ->check(CLI::IsMember({"all", "plain", "with_options"}));
    cmd->add_option("--sms", s.sms,
                    "SMs the Hopper kernels' schedules are planned for (default: 132, H100/H200 SXM; 114: H100 PCIe)")
        ->check(CLI::Range(1, generator::kMaxSms));
  }
}

const char* status_name(KernelOutcome::Status s) {
  switch (s) {
    case KernelOutcome::Status::compiled: return "compiled";
    case KernelOutcome::Status::cached: return "cached";
    case KernelOutcome::Status::loaded: return "loaded";
    case KernelOutcome::Status::failed: return "FAILED";
  }
  return "?";
}

int report(const DeployReport& r, const char* what, bool verbose) {
  for (const auto& k : r.kernels) {
    if (k.status == KernelOutcome::Status::failed) fmt::print(stderr, "FAILED   {}: {}\n", k.what, k.error);
    else if (verbose) fmt::print("{:8} {} ({:.2f} ms)\n", status_name(k.status), k.what, k.milliseconds);
  }
  fmt::print("{}: {} compiled, {} already cached, {} loaded, {} failed, {:.1f} s, cache {}\n", what, r.compiled, r.cached,
             r.loaded, r.failed, r.seconds, cache_directory().empty() ? "(memory only)" : cache_directory().string());
  if (r.nvrtc_runs + r.shared_code > 0)
    fmt::print("kernels built: {} by NVRTC, {} from the code of another layout of the same shape\n", r.nvrtc_runs,
               r.shared_code);
  return r.failed ? 1 : 0;
}

int info(bool require_gpu) {
  fmt::print("bsjit {}\nNVRTC {}\ncache directory {}\n", BSJIT_VERSION, runtime::nvrtc_version(),
             cache_directory().empty() ? "(memory only)" : cache_directory().string());
  for (const auto& d : cache_config().read_only) fmt::print("read-only cache {}\n", d.string());
  std::string why;
  if (!runtime::gpu_available(&why)) {
    fmt::print("GPU: none ({})\n", why);
    return require_gpu ? 2 : 0;
  }
  const auto& d = runtime::driver();
  int count = 0, version = 0;
  BSJIT_CU(d.cuDeviceGetCount(&count));
  BSJIT_CU(d.cuDriverGetVersion(&version));
  fmt::print("driver CUDA {}.{}\n", version / 1000, version % 1000 / 10);
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    BSJIT_CU(d.cuDeviceGet(&dev, i));
    char name[256] = {};
    int major = 0, minor = 0, sms = 0;
    BSJIT_CU(d.cuDeviceGetName(name, sizeof name, dev));
    BSJIT_CU(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    BSJIT_CU(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    BSJIT_CU(d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    fmt::print("GPU {}: {}, sm_{}{}, {} SMs\n", i, name, major, minor, sms);
  }
  return 0;
}

// The library's messages start with "bsjit: "; the CLI prints its own "bsjit: error: " before them.
std::string_view without_prefix(std::string_view message) {
  constexpr std::string_view kPrefix = "bsjit: ";
  return message.starts_with(kPrefix) ? message.substr(kPrefix.size()) : message;
}

// Every file's statistics, or the reason it is not a layout; exit 1 when any is not. With an image
// path, the picture of the one file's masks (layout_svg) is written there.
int inspect(const std::vector<std::string>& files, const std::string& image) {
  if (!image.empty() && files.size() != 1) throw Error("inspect --image draws one file: give one layout file");
  int bad = 0;
  for (const auto& f : files) {
    std::vector<Layout> heads;
    try {
      heads = Layout::load_heads(f);
    } catch (const Error& e) {
      fmt::print(stderr, "bsjit: error: {}\n", without_prefix(e.what()));
      ++bad;
      continue;
    }
    for (std::size_t h = 0; h < heads.size(); ++h) {
      const Layout& l = heads[h];
      LayoutStats s = l.stats();
      fmt::print(
          "{}{}\n  shape        [{}, {}] blocks\n  nonzero      {} (density {:.4f})\n  hash         {}\n"
          "  per row      min {} max {} mean {:.2f}, {} empty\n"
          "  per column   min {} max {} mean {:.2f}, {} empty\n",
          f, heads.size() > 1 ? fmt::format(" head {} of {}", h, heads.size()) : "", s.rows, s.cols, s.blocks,
          s.density, l.hash().hex(), s.min_blocks_per_row, s.max_blocks_per_row, s.mean_blocks_per_row, s.empty_rows,
          s.min_blocks_per_col, s.max_blocks_per_col, s.mean_blocks_per_col, s.empty_cols);
    }
    if (!image.empty()) {
      std::ofstream out(image);
      out << tools::layout_svg(heads, f);
      if (!out) throw Error(fmt::format("cannot write '{}'", image));
      fmt::print("picture: {}\n", image);
    }
  }
  return bad > 0 ? 1 : 0;
}

struct PatternArgs {
  std::string pattern, output;
  std::int64_t blocks = 0, window = 1, global = 1, stride = 1, chunk = 1, summary = 1, random = 0;
  std::uint64_t seed = 1;
  bool bidirectional = false;
};

int make_layout(const PatternArgs& a) {
  const bool causal = !a.bidirectional;
  Layout l = [&] {
    if (a.pattern == "causal") return layouts::causal(a.blocks);
    if (a.pattern == "window") return layouts::sliding_window(a.blocks, a.window, causal);
    if (a.pattern == "window+global")
      return layouts::unite(layouts::sliding_window(a.blocks, a.window, causal),
                            layouts::global_tokens(a.blocks, a.global, causal, a.bidirectional));
    if (a.pattern == "strided") return layouts::strided(a.blocks, a.stride);
    if (a.pattern == "fixed") return layouts::fixed(a.blocks, a.chunk, a.summary);
    if (a.pattern == "bigbird") return layouts::bigbird(a.blocks, a.window, a.global, a.random, a.seed);
    throw Error(fmt::format("unknown pattern '{}'", a.pattern));
  }();
  const std::filesystem::path out = a.output;
  if (out.extension() == ".npy") l.save_npy(out);
  else if (out.extension() == ".json") l.save_json(out);
  else throw Error(fmt::format("output '{}': expected a .npy or .json file name", a.output));
  fmt::print("{}: [{}, {}] blocks, {} nonzero, hash {}\n", a.output, l.rows(), l.cols(), l.blocks(), l.hash().hex());
  return 0;
}

int precompile_cmd(const KernelSelection& s, int threads, bool verbose) {
  Manifest m = s.to_manifest();
  PrecompileOptions o;
  o.threads = threads;
  if (isatty(STDERR_FILENO)) {
    o.progress = [](std::size_t done, std::size_t total) {
      const int width = 40, filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
      fmt::print(stderr, "\r[{}{}] {}/{}", std::string(filled, '='), std::string(width - filled, ' '), done, total);
      if (done == total) fmt::print(stderr, "\n");
    };
  }
  const DeployReport r = precompile(m, o);
  const int status = report(r, "precompile", verbose);
  // A build step must be able to trust the exit code: what it built is in the cache directory, or
  // the run fails naming why. With --no-disk-cache (no directory, by choice) it is a compile check.
  if (r.not_on_disk > 0) {
    const bool chosen = cache_directory().empty();
    fmt::print(stderr, "precompile: {} kernels are not on disk: {}{}\n", r.not_on_disk, r.disk_problem,
               chosen ? " (a compile check only)" : "");
    if (!chosen) return 1;
  }
  return status;
}

int warmup_cmd(const KernelSelection& s, const std::string& dir, bool strict) {
  if (!dir.empty() && !std::filesystem::is_directory(dir))
    throw Error(fmt::format("warmup --dir {}: no such directory", dir));
  DeployReport r = dir.empty() ? warmup(s.to_manifest(), strict) : warmup_directory(dir);
  return report(r, "warmup", true);
}

int cache_cmd(const std::string& action, std::string dir, const std::string& max_size, double max_age_days) {
  if (dir.empty()) dir = cache_directory().string();
  if (dir.empty()) throw Error("no cache directory: give --dir or set BSJIT_CACHE_DIR");
  if (action == "list" || action == "verify") {
    auto entries = list_cache(dir);
    int bad = 0;
    std::uint64_t total = 0;
    std::size_t width = 32;  // the longest label, so that the columns after it line up
    for (const auto& e : entries) width = std::max(width, e.label.size());
    for (const auto& e : entries) {
      total += e.bytes;
      bad += e.valid ? 0 : 1;
      auto when = std::chrono::system_clock::to_time_t(e.last_used);
      if (e.valid)
        fmt::print("{:>9}  {:%Y-%m-%d %H:%M}  {:<{}} {:<7} layout {}  {}\n", e.bytes, fmt::localtime(when), e.label,
                   width, e.arch, e.layout_hash.substr(0, 16), e.path.filename().string());
      else
        fmt::print("{:>9}  {:%Y-%m-%d %H:%M}  BAD: {}  {}\n", e.bytes, fmt::localtime(when), e.problem,
                   e.path.filename().string());
    }
    fmt::print("{} entries, {} bytes, {} bad, in {}\n", entries.size(), total, bad, dir);
    return action == "verify" && bad ? 1 : 0;
  }
  if (action == "prune") {
    std::uint64_t max_bytes = 0;
    if (!max_size.empty()) max_bytes = parse_byte_size(max_size);
    if (!(max_age_days >= 0 && max_age_days <= 36500))
      throw Error(fmt::format("--max-age-days {}: expected 0 (no age bound) to 36500 days", max_age_days));
    auto age = std::chrono::seconds(static_cast<long long>(max_age_days * 86400));
    auto r = prune_cache(dir, max_bytes, age);
    fmt::print("pruned {} files ({} bytes); {} bytes left in {}\n", r.removed, r.bytes_removed, r.bytes_left, dir);
    return 0;
  }
  auto r = clear_cache(dir);
  fmt::print("cleared {} files ({} bytes) from {}\n", r.removed, r.bytes_removed, dir);
  return 0;
}

// Calls fn(file, mm, op) for every op of the manifest's matmul groups, each layout × block × dtype ×
// axis as one MatMul. Returns 2 (with a message) when there is no GPU to run on.
template <class Fn>
int for_each_gpu_op(const Manifest& m, const char* command, Fn fn) {
  std::string why;
  if (!runtime::gpu_available(&why)) {
    fmt::print(stderr, "bsjit {}: no GPU: {}\n", command, why);
    return 2;
  }
  for (const auto& g : m.groups)
    for (const auto& file : g.layouts) {
      Layout layout = Layout::load(file);
      for (int block : g.blocks)
        for (DType dt : g.dtypes)
          for (FeatureAxis axis : g.feature_axes)
            for (bool tf32 : tf32_settings(g, dt)) {
              MatMul mm(layout, {block, dt, axis, "", tf32});
              for (Op op : g.ops) fn(file, mm, op);
            }
    }
  return 0;
}

std::string describe(const std::filesystem::path& file, const MatMul& mm, Op op, std::int64_t n) {
  const auto& o = mm.options();
  return fmt::format("{} {} b{} {}{} {} n={}", file.string(), to_string(op), o.block, to_string(o.dtype),
                     o.tf32 ? " tf32" : "", to_string(o.feature_axis), n);
}

int tune(const KernelSelection& s, std::int64_t n) {
  int status =
      for_each_gpu_op(s.to_manifest(), "tune", [&](const std::filesystem::path& file, const MatMul& mm, Op op) {
        TuneResult r = mm.autotune(op, n);
        fmt::print("{}: chose {}\n", describe(file, mm, op, n), r.chosen);
        for (const auto& [tag, ms] : r.milliseconds) fmt::print("    {:24} {:9.4f} ms\n", tag, ms);
      });
  if (status == 0)
    fmt::print("tuning records kept in {}\n", cache_directory().empty() ? "(memory only)" : cache_directory().string());
  return status;
}

// The conv groups' kernels on a SAME geometry of 9 × 9 (× 5 for 3-D filters) positions at stride 1,
// 2 images, as a convolution and a deconvolution.
int run_conv(const Manifest& m, bool gated, bool accumulate, std::uint64_t seed) {
  int bad = 0;
  for (const auto& g : m.conv)
    for (const auto& file : g.layouts) {
      const ConvLayout layout = ConvLayout::load(file, g.block);
      for (const auto& f : g.filters)
        for (DType dt : g.dtypes)
          for (ActivationOrder order : g.orders)
            for (bool deconv : {false, true}) {
              const ConvGeometry geometry =
                  ConvGeometry::same({f[0] > 1 ? 5 : 1, f[1] > 1 ? 9 : 1, 9}, {f[0], f[1], f[2]});
              const Conv conv(layout, geometry, {dt, order, deconv, ""});
              for (auto op : {check::ConvOp::fprop, check::ConvOp::bprop, check::ConvOp::updat}) {
                const auto r = check::run_and_check(conv, op, {2, accumulate, gated, seed});
                const double tolerance = check::tolerance(dt);
                const bool ok = r.relative_error <= tolerance && r.unwritten == 0;
                bad += ok ? 0 : 1;
                fmt::print(
                    "{:4} {} {}{} {}x{}x{} {} {} n=2: relative error {:.3g} (tolerance {:.0e}), {} outputs, {} "
                    "unwritten\n",
                    ok ? "ok" : "FAIL", file.string(), deconv ? "deconv " : "conv ", check::to_string(op), f[0], f[1],
                    f[2], to_string(dt), to_string(order), r.relative_error, tolerance, r.outputs, r.unwritten);
              }
            }
    }
  return bad;
}

int run(const KernelSelection& s, std::int64_t n, bool gated, bool accumulate, std::uint64_t seed) {
  int bad = 0;
  const Manifest manifest = s.to_manifest();
  int status = for_each_gpu_op(manifest, "run", [&](const std::filesystem::path& file, const MatMul& mm, Op op) {
    const double tolerance = check::tolerance(mm.options());
    auto r = check::run_and_check(mm, op, {n, accumulate, gated, seed});
    // the kernel these calls ran: kernel_label looks only at whether a gate is given, not at it
    static const float some_gate = 1.0f;
    const OpOptions call{accumulate, gated ? &some_gate : nullptr};
    bool ok = r.relative_error <= tolerance && r.unwritten == 0;
    bad += ok ? 0 : 1;
    fmt::print("{:4} {}: relative error {:.3g} (tolerance {:.0e}), {} outputs, {} unwritten; kernel {}\n",
               ok ? "ok" : "FAIL", describe(file, mm, op, n), r.relative_error, tolerance, r.outputs, r.unwritten,
               mm.kernel_label(op, n, call));
  });
  if (status == 0) bad += run_conv(manifest, gated, accumulate, seed);
  return status ? status : (bad ? 1 : 0);
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug: the library's compiles, cache hits, contexts
  CLI::App app{"bsjit: block-sparse matmul kernels generated and compiled per layout"};
  app.require_subcommand(1);
  app.fallthrough();  // the global options below also after the subcommand: `bsjit precompile ... --cache-dir D`
  std::string cache_dir;
  bool no_disk_cache = false;
  app.add_option("--cache-dir", cache_dir,
                 "writable cache directory (default: $BSJIT_CACHE_DIR, $XDG_CACHE_HOME/bsjit, ~/.cache/bsjit)");
  app.add_flag("--no-disk-cache", no_disk_cache, "keep compiled kernels in memory only");

  bool require_gpu = false;
  auto* inf = app.add_subcommand("info", "versions, cache directory and visible GPUs");
  inf->add_flag("--require-gpu", require_gpu, "exit with status 2 when no GPU is usable");

  std::vector<std::string> inspect_files;
  auto* ins = app.add_subcommand("inspect", "print a layout file's statistics and hash");
  ins->add_option("files", inspect_files, "layout files (.npy or .json)")->required();
  std::string inspect_image;
  ins->add_option("--image", inspect_image,
                  "draw the layout (or a 3-D file's masks) to this SVG file, a cell per block");

  std::vector<std::string> hash_archs{"sm_80", "sm_90a"};
  std::string hash_out;
  auto* hashes = app.add_subcommand(
      "kernel-hashes",
      "compile every kernel variant the library can emit (no GPU) and print one line per variant with a hash of its "
      "binary: diff the output of two trees to check that a refactor changed no kernel");
  hashes->add_option("-a,--arch", hash_archs, "target architectures")->delimiter(',');
  int hash_threads = 0;
  hashes->add_option("-j,--threads", hash_threads, "compile threads (default: one per core)");
  hashes->add_option("-o,--output", hash_out, "write the lines to this file instead of standard output");
  std::string hash_only;
  hashes->add_option("--only", hash_only, "only the variants whose name holds this text (e.g. 'matmul split forward')");

  PatternArgs pat;
  auto* mk = app.add_subcommand("make-layout", "write an attention block mask (query blocks × key blocks) to a file");
  mk->add_option("pattern", pat.pattern, "causal, window, window+global, strided, fixed or bigbird")
      ->required()
      ->check(CLI::IsMember({"causal", "window", "window+global", "strided", "fixed", "bigbird"}));
  mk->add_option("-o,--output", pat.output, "output file (.npy or .json)")->required();
  mk->add_option("--blocks", pat.blocks, "query (and key) blocks: sequence length / block size")->required();
  mk->add_option("--window", pat.window, "window, in blocks");
  mk->add_option("--global", pat.global, "global key blocks (first ones)");
  mk->add_option("--stride", pat.stride, "strided: stride in blocks");
  mk->add_option("--chunk", pat.chunk, "fixed: chunk in blocks");
  mk->add_option("--summary", pat.summary, "fixed: summary blocks per chunk");
  mk->add_option("--random", pat.random, "bigbird: random key blocks per query row");
  mk->add_option("--seed", pat.seed, "bigbird: random seed");
  mk->add_flag("--bidirectional", pat.bidirectional, "window, window+global: not causal");

  KernelSelection pre_sel;
  int threads = 0;
  bool verbose = false;
  auto* pre = app.add_subcommand("precompile", "compile kernels into the cache directory (no GPU needed)");
  add_selection(pre, pre_sel, true);
  pre->add_option("-j,--jobs", threads, "parallel compiles (default: one per core)");
  pre->add_flag("-v,--verbose", verbose, "a line per kernel");

  KernelSelection warm_sel;
  std::string warm_dir;
  bool strict = false;
  auto* warm = app.add_subcommand("warmup", "load kernels on every visible GPU and report load times");
  add_selection(warm, warm_sel, true);
  warm->add_option("--dir", warm_dir, "load every entry of this cache directory instead of a manifest");
  warm->add_flag("--strict", strict, "a kernel missing from the cache is a failure, not a compile");

  std::string cache_action, cache_target, max_size;
  double max_age_days = 0;
  auto* cache = app.add_subcommand("cache", "list, verify, prune or clear a cache directory");
  cache->add_option("action", cache_action, "list | verify | prune | clear")
      ->required()
      ->check(CLI::IsMember({"list", "verify", "prune", "clear"}));
  cache->add_option("--dir", cache_target, "cache directory (default: the writable one)");
  cache->add_option("--max-size", max_size, "prune: keep at most this many bytes (e.g. 2G), least recently used go");
  cache->add_option("--max-age-days", max_age_days, "prune: remove entries unused for this many days");

  KernelSelection tune_sel;
  tune_sel.archs = {};
  std::int64_t tune_n = 8192;
  auto* tunec = app.add_subcommand("tune", "time every tile shape on this GPU and keep the fastest in the cache");
  add_selection(tunec, tune_sel, false);
  tunec->add_option("-n,--rows", tune_n, "rows N to tune for (choices are kept per batch class: N <= 128, or above)")
      ->check(CLI::PositiveNumber);

  KernelSelection run_sel;
  run_sel.archs = {};
  std::int64_t n = 1000;
  bool gated = false, accumulate = false;
  std::uint64_t seed = 1;
  auto* runc = app.add_subcommand("run", "run ops on the GPU and check them against the CPU reference");
  add_selection(runc, run_sel, false);
  runc->add_option("-n,--rows", n, "rows N of X and Y")->check(CLI::PositiveNumber);
  runc->add_flag("--gate", gated, "random per-block gates");
  runc->add_flag("--accumulate", accumulate, "accumulate into the output (beta = 1)");
  runc->add_option("--seed", seed, "random seed");

  // `bsjit bench ...` runs bsjit-bench beside this binary, so the CLI itself needs no cuBLAS.
  if (argc > 1 && std::string(argv[1]) == "bench") {
    std::string self = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "bsjit-bench";
    argv[1] = self.data();
    execv(self.c_str(), argv + 1);
    fmt::print(stderr, "bsjit bench: cannot run {}: {}\n", self, std::strerror(errno));
    return 1;
  }
  app.add_subcommand("bench", "benchmark suites against cuBLAS and cuSPARSE (runs bsjit-bench; see its --help)");

  CLI11_PARSE(app, argc, argv);
  try {
    if (no_disk_cache) set_cache_directory({});
    else if (!cache_dir.empty()) set_cache_directory(cache_dir);
    if (*inf) return info(require_gpu);
    if (*ins) return inspect(inspect_files, inspect_image);
    if (*mk) return make_layout(pat);
    if (*hashes) {
      const auto lines = tools::kernel_hashes(hash_archs, static_cast<unsigned>(std::max(hash_threads, 0)), hash_only);
      std::ofstream file;
      if (!hash_out.empty()) file.open(hash_out);
      std::ostream& out = hash_out.empty() ? std::cout : file;
      int errors = 0;
      for (const auto& l : lines) out << l << "\n", errors += l.find(" ERROR: ") != std::string::npos;
      out.flush();
      fmt::print(stderr, "kernel-hashes: {} variants, {} that do not compile\n", lines.size(), errors);
      return out ? 0 : 1;
    }
    if (*pre) return precompile_cmd(pre_sel, threads, verbose);
    if (*warm) return warmup_cmd(warm_sel, warm_dir, strict);
    if (*cache) return cache_cmd(cache_action, cache_target, max_size, max_age_days);
    if (*runc) return run(run_sel, n, gated, accumulate, seed);
    if (*tunec) return tune(tune_sel, tune_n);
  } catch (const bsjit::Error& e) {
    fmt::print(stderr, "bsjit: error: {}\n", without_prefix(e.what()));
    return 1;
  } catch (const std::bad_alloc&) {  // (every input is bounded before it is allocated for: a bug if reached)
    fmt::print(stderr, "bsjit: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {  // likewise: library code throws bsjit::Error
    fmt::print(stderr, "bsjit: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
