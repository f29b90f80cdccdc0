// bsjit: the command-line tool.
//   bsjit inspect FILE...               layout statistics and hash
//   bsjit precompile --layout FILE...   compile kernels into the cache directory, no GPU needed
//   bsjit run --layout FILE             run ops on the GPU and check them against the CPU reference
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "bsjit/bsjit.hpp"
#include "op_check.hpp"
#include "runtime/compiler.hpp"
#include "runtime/driver.hpp"

namespace {

using namespace bsjit;

struct KernelSelection {
  std::vector<std::string> layouts;
  std::vector<std::string> ops{"forward", "backward_data", "backward_weight"};
  std::vector<int> blocks{32};
  std::vector<std::string> dtypes{"bf16"};
  std::vector<std::string> feature_axes{"last"};
};

void add_selection(CLI::App* cmd, KernelSelection& s) {
  cmd->add_option("-l,--layout", s.layouts, "layout files (.npy or .json)")->required()->check(CLI::ExistingFile);
  cmd->add_option("-o,--op", s.ops, "ops: forward, backward_data, backward_weight")->delimiter(',');
  cmd->add_option("-b,--block", s.blocks, "block sizes: 8, 16, 32, 64, 128")->delimiter(',');
  cmd->add_option("-t,--dtype", s.dtypes, "dtypes: f32, f16, bf16")->delimiter(',');
  cmd->add_option("-f,--feature-axis", s.feature_axes, "feature axis of X and Y: last ([N, C]) or first ([C, N])")
      ->delimiter(',');
}

int inspect(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    Layout l = Layout::load(f);
    LayoutStats s = l.stats();
    fmt::print("{}\n  shape        [{}, {}] blocks\n  nonzero      {} (density {:.4f})\n  hash         {}\n"
               "  per row      min {} max {} mean {:.2f}, {} empty\n"
               "  per column   min {} max {} mean {:.2f}, {} empty\n",
               f, s.rows, s.cols, s.blocks, s.density, l.hash().hex(), s.min_blocks_per_row, s.max_blocks_per_row,
               s.mean_blocks_per_row, s.empty_rows, s.min_blocks_per_col, s.max_blocks_per_col, s.mean_blocks_per_col,
               s.empty_cols);
  }
  return 0;
}

int info(bool require_gpu) {
  fmt::print("bsjit {}\nNVRTC {}\ncache directory {}\n", BSJIT_VERSION, runtime::nvrtc_version(),
             cache_directory().empty() ? "(memory only)" : cache_directory().string());
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

int precompile(const KernelSelection& s, const std::vector<std::string>& archs) {
  int compiled = 0, cached = 0, failed = 0;
  auto start = std::chrono::steady_clock::now();
  for (const auto& file : s.layouts) {
    Layout layout = Layout::load(file);
    for (int block : s.blocks)
      for (const auto& dt : s.dtypes)
        for (const auto& axis : s.feature_axes) {
          MatMulOptions mo;
          mo.block = block;
          mo.dtype = parse_dtype(dt);
          mo.feature_axis = parse_feature_axis(axis);
          MatMul mm(layout, mo);
          for (const auto& op : s.ops)
            for (const auto& arch : archs) {
              std::string what = fmt::format("{} {} b{} {} {} {}", file, op, block, dt, axis, arch);
              try {
                bool now = mm.precompile(parse_op(op), arch);
                (now ? compiled : cached)++;
                fmt::print("{} {}\n", now ? "compiled" : "cached  ", what);
              } catch (const Error& e) {
                ++failed;
                fmt::print(stderr, "FAILED   {}: {}\n", what, e.what());
              }
            }
        }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("precompile: {} compiled, {} already cached, {} failed, {:.1f} s, cache {}\n", compiled, cached, failed,
             secs, cache_directory().empty() ? "(memory only)" : cache_directory().string());
  return failed ? 1 : 0;
}

int run(const KernelSelection& s, std::int64_t n, bool gated, bool accumulate, std::uint64_t seed) {
  std::string why;
  if (!runtime::gpu_available(&why)) {
    fmt::print(stderr, "bsjit run: no GPU: {}\n", why);
    return 2;
  }
  int bad = 0;
  for (const auto& file : s.layouts) {
    Layout layout = Layout::load(file);
    for (int block : s.blocks)
      for (const auto& dt : s.dtypes)
        for (const auto& axis : s.feature_axes) {
          MatMulOptions mo;
          mo.block = block;
          mo.dtype = parse_dtype(dt);
          mo.feature_axis = parse_feature_axis(axis);
          MatMul mm(layout, mo);
          for (const auto& op : s.ops) {
            check::CheckOptions co{n, accumulate, gated, seed};
            auto r = check::run_and_check(mm, parse_op(op), co);
            bool ok = r.relative_error <= check::tolerance(mo.dtype) && r.unwritten == 0;
            bad += ok ? 0 : 1;
            fmt::print("{:4} {} {} b{} {} {} n={}: relative error {:.3g} (tolerance {:.0e}), {} outputs, {} unwritten\n",
                       ok ? "ok" : "FAIL", file, op, block, dt, axis, n, r.relative_error, check::tolerance(mo.dtype),
                       r.outputs, r.unwritten);
          }
        }
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bsjit: block-sparse matmul kernels generated and compiled per layout"};
  app.require_subcommand(1);
  std::string cache_dir;
  bool no_disk_cache = false;
  app.add_option("--cache-dir", cache_dir, "cache directory (default: $BSJIT_CACHE_DIR, $XDG_CACHE_HOME/bsjit, ~/.cache/bsjit)");
  app.add_flag("--no-disk-cache", no_disk_cache, "keep compiled kernels in memory only");

  bool require_gpu = false;
  auto* inf = app.add_subcommand("info", "versions, cache directory and visible GPUs");
  inf->add_flag("--require-gpu", require_gpu, "exit with status 2 when no GPU is usable");

  std::vector<std::string> inspect_files;
  auto* ins = app.add_subcommand("inspect", "print a layout file's statistics and hash");
  ins->add_option("files", inspect_files, "layout files (.npy or .json)")->required()->check(CLI::ExistingFile);

  KernelSelection pre_sel;
  std::vector<std::string> archs{"sm_90"};
  auto* pre = app.add_subcommand("precompile", "compile kernels into the cache directory (no GPU needed)");
  add_selection(pre, pre_sel);
  pre->add_option("-a,--arch", archs, "target architectures, e.g. sm_80,sm_90,sm_90a")->delimiter(',');

  KernelSelection run_sel;
  std::int64_t n = 1000;
  bool gated = false, accumulate = false;
  std::uint64_t seed = 1;
  auto* runc = app.add_subcommand("run", "run ops on the GPU and check them against the CPU reference");
  add_selection(runc, run_sel);
  runc->add_option("-n,--rows", n, "rows N of X and Y")->check(CLI::PositiveNumber);
  runc->add_flag("--gate", gated, "random per-block gates");
  runc->add_flag("--accumulate", accumulate, "accumulate into the output (beta = 1)");
  runc->add_option("--seed", seed, "random seed");

  CLI11_PARSE(app, argc, argv);
  try {
    if (no_disk_cache) set_cache_directory({});
    else if (!cache_dir.empty()) set_cache_directory(cache_dir);
    if (*inf) return info(require_gpu);
    if (*ins) return inspect(inspect_files);
    if (*pre) return precompile(pre_sel, archs);
    if (*runc) return run(run_sel, n, gated, accumulate, seed);
  } catch (const bsjit::Error& e) {
    fmt::print(stderr, "bsjit: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
