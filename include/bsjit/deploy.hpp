// Putting kernels in place before a service needs them: precompilation on build machines (no GPU
// needed) and warm-up at service start (load every kernel on every visible GPU, so the first
// request pays nothing).
//
// A manifest names the kernels, as JSON: one group, or {"kernels": [group, ...]}, where a group is
//   {"layouts": ["w1.npy", "w2.json"],          paths relative to the manifest's directory
//    "ops": ["forward", "backward_data", "backward_weight"],
//    "blocks": [32], "dtypes": ["bf16"], "feature_axes": ["last"], "archs": ["sm_90a"], "tf32": [false],
//    "calls": "all"}
// and names every combination of its lists. Missing lists take the defaults below. "tf32" applies to
// the fp32 kernels (MatMulOptions::tf32: [true], or [false, true] for both); other dtypes ignore it.
// "calls" (Calls: "all", "plain" or "with_options") says which of each op's two kernels its calls
// need: "plain" when the service never passes OpOptions halves the build. "sms" (an integer,
// MatMulOptions::sms) plans the Hopper kernels' schedules for GPUs of that many SMs (114: H100 PCIe)
// instead of 132: a fleet of such GPUs loads them from the cache as they are.
//
// Attention kernels (bsjit::Attention, bsjit::AttentionOps) go in a list "attention" of groups
//   {"masks": ["causal.npy", ["head0.npy", "head1.npy"]],  one file shared by every head, or one per head
//                                                          (or a 3-D .npy [heads, q blocks, k blocks])
//    "blocks": [128], "head_dims": [128], "dtypes": ["bf16"], "orders": ["bshd"], "causal": [true],
//    "ops": ["fused", "decomposed"], "archs": ["sm_90a"]}
// beside the matmul groups ({"kernels": [...], "attention": [...]}, or "attention" alone). "fused":
// the fused forward and backward; "decomposed": the five AttentionOps kernels. The masks' element
// masks (AttentionOps) are data, not part of the kernels.
//
// Convolution kernels (bsjit::Conv: fprop, bprop and updat, for a convolution and its
// deconvolution alike) go in a list "conv" of groups
//   {"layouts": ["conv1.json", "mask.npy"],  a ConvLayout JSON (its blocks, or {"block", "mask"}), or a
//                                             matmul layout file read as a mask [C / b, K / b] of "block"
//    "block": 32, "filters": [[1, 3, 3]], "dtypes": ["bf16"], "orders": ["ndhwc"], "archs": ["sm_90a"]}
// A convolution's kernels depend on its layout, filter taps, dtype and activation order only; the
// rest of the geometry (sizes, strides, dilations, padding) is an argument of each call.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bsjit/types.hpp"

namespace bsjit {

struct KernelGroup {
  std::vector<std::filesystem::path> layouts;
  std::vector<Op> ops{Op::forward, Op::backward_data, Op::backward_weight};
  std::vector<int> blocks{32};
  std::vector<DType> dtypes{DType::bf16};
  std::vector<FeatureAxis> feature_axes{FeatureAxis::last};
  std::vector<std::string> archs{"sm_90a"};
  std::vector<bool> tf32{false};  // fp32 only (see above)
  Calls calls = Calls::all;
  int sms = 0;  // SMs the Hopper kernels' schedules are planned for (MatMulOptions::sms); 0: 132
};

// The tf32 settings a group's kernels of dtype dt take: its list for fp32, {false} for the others.
std::vector<bool> tf32_settings(const KernelGroup& group, DType dt);

struct AttentionGroup {
  std::vector<std::vector<std::filesystem::path>> masks;  // each: one shared mask, or one per head
  std::vector<int> blocks{64};
  std::vector<int> head_dims{64};
  std::vector<DType> dtypes{DType::bf16};
  std::vector<QkvOrder> orders{QkvOrder::bshd};
  std::vector<bool> causal{false};
  std::vector<int> kv_groups{1};          // query heads per key/value head (AttentionOptions::kv_group)
  std::vector<std::string> ops{"fused"};  // "fused", "decomposed"
  std::vector<std::string> archs{"sm_90a"};
};

struct ConvGroup {
  std::vector<std::filesystem::path> layouts;
  int block = 0;                                       // for layout files read as a block mask (not a ConvLayout JSON)
  std::vector<std::array<int, 3>> filters{{1, 3, 3}};  // T, R, S
  std::vector<DType> dtypes{DType::bf16};
  std::vector<ActivationOrder> orders{ActivationOrder::ndhwc};
  std::vector<std::string> archs{"sm_90a"};
};

struct Manifest {
  std::vector<KernelGroup> groups;
  std::vector<AttentionGroup> attention;
  std::vector<ConvGroup> conv;
  static Manifest load(const std::filesystem::path& json_file);
  std::size_t kernel_count() const;  // report lines: a matmul op, or a combination of an attention or conv group
};

struct KernelOutcome {
  std::string what;  // "w1.npy forward bf16 b32 last sm_90" (+ " on GPU 1" for warm-up)
  enum class Status { compiled, cached, loaded, failed } status = Status::failed;
  std::string error;
  double milliseconds = 0;
};

struct DeployReport {
  std::vector<KernelOutcome> kernels;
  std::int64_t compiled = 0, cached = 0, loaded = 0, failed = 0;
  // Kernels this process built during the call (an item has one or two): compiled by NVRTC, and
  // made from the code of another layout of the same shape, with no NVRTC run (docs/CACHE.md).
  std::int64_t nvrtc_runs = 0, shared_code = 0;
  // precompile: kernels built by the call that are not in the cache directory at its end (none
  // configured, read-only, full or refused; or evicted by the size bound), and why
  std::int64_t not_on_disk = 0;
  std::string disk_problem;
  double seconds = 0;
};

struct PrecompileOptions {
  int threads = 0;  // 0: one per core
  std::function<void(std::size_t done, std::size_t total)> progress;
};

// Compiles every kernel of the manifest into the cache (cache_config()). Needs no GPU. Failures
// are reported per kernel, not thrown.
DeployReport precompile(const Manifest& manifest, const PrecompileOptions& options = {});

// Loads every kernel of the manifest whose arch is a visible GPU's own (sm_XY, or sm_XYa when only
// that is listed) into that GPU's primary context and resolves its function. With strict (or strict
// mode in cache_config()) a kernel that is not in the cache fails instead of being compiled.
DeployReport warmup(const Manifest& manifest, bool strict = false);

// Loads every valid entry of a cache directory whose arch a visible GPU runs, on that GPU.
DeployReport warmup_directory(const std::filesystem::path& directory);

}  // namespace bsjit
