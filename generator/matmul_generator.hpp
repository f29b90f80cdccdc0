// Turns (layout, op, block size, dtype, feature axis) into CUDA source: the tile configuration as
// constants, instantiating a kernel template from templates/, and the layout's lookup tables,
// declared in the source and filled when the module is loaded (device_tables.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"
#include "device_tables.hpp"

namespace bsjit::generator {

// How one CTA is organised. The host launches with exactly these numbers and the template checks
// them with static_asserts, so host and device cannot disagree.
struct TileConfig {
  int bm = 0, bn = 0, bk = 0;  // CTA tile: BM output rows × BN output columns, BK reduction step
  int stride = 0;              // shared-memory row stride in elements (BK + padding)
  int threads = 0;
  bool tensor_cores = false;
  int warps_m = 1, warps_n = 1;  // tensor cores: warp grid
  int tm = 1, tn = 1;            // FMA path: elements per thread along M and N
  bool pipelined = false;        // cp.async multi-stage pipeline with ldmatrix (16-bit, feature axis last)
  int stages = 1;
  int group = 1;                 // dsd: LUT entries per pipeline stage (then bk = group · block)
  int shared_bytes = 0;          // dynamic shared memory per CTA (pipelined kernels)
  bool wgmma = false;            // Hopper warpgroup kernel (sm_90a): bm rows on warps_m warpgroups, bk = 64
  bool tma = false;              // wgmma with a TMA producer warpgroup and mbarriers (warp-specialized)
  bool persistent = false;       // TMA dsd: one wave of CTAs looping over output tiles
  // Small-batch TMA dsd (unswapped; also persistent): the layout's blocks dealt to one wave of CTAs
  // in about equal shares, output block columns longer than a share split into pieces on several
  // CTAs (fp32 partials in the workspace, added by the column's last piece): a long column no
  // longer holds up the whole op.
  bool split = false;
  // TMA dsd (b ≥ 64): the swapped product Yᵀ = Wᵀ·Xᵀ, each consumer warpgroup computing 64 output
  // features of bm / (warps_m / (b / 64)) rows with W's slice as wgmma's A (m64 n128/n256 k16).
  bool swapped = false;
  // Grouped Hopper dsd (b ≤ 32; also tma, wgmma and persistent): output block columns per CTA
  // tile, walked together over the union of their input blocks; 0 for every other kernel.
  int columns = 0;
  // Paired Hopper dsd (b = 64; also tma, wgmma, persistent and swapped): tiles of two output block
  // columns paired by the input blocks they share (dsd_paired_kernel).
  bool paired = false;
  // Tiled Hopper backward-weight (b ≤ 32; also tma and wgmma): the edge (64 or 128) of the dW tiles
  // computed whole, each storing the blocks it holds; 0 for every other kernel. tile_cols: the
  // tiles' width in features where it differs from their height (128 × 256 on two consumers); 0:
  // square.
  int tile_edge = 0;
  int tile_cols = 0;
  // Row-grouped Hopper backward-weight (also tma and wgmma; sdd_rows_kernel): a unit is a band of
  // dW's rows (one block row at b ≥ 64, 64 / b block rows at b ≤ 32) × row_blocks block columns
  // holding a block in the band, computed together, X's slice of the band copied once for all of
  // them; 0 for every other kernel.
  int row_blocks = 0;
  // Row-grouped at b = 64: block rows per band (2: a band of 128 rows on two consumers, the columns
  // holding a block in either row); 0: the default (one at b ≥ 64, 64 / b at b ≤ 32).
  int band_rows = 0;
  // Column-grouped Hopper backward-weight at b = 128 (also tma and wgmma; sdd_cols_kernel): a unit
  // is col_blocks blocks of one block column of dW, their rows gathered, computed together, dY's
  // slice of the column copied once for all of them; 0 for every other kernel.
  int col_blocks = 0;
  // Hopper backward-weight (tma): the epilogue stages each warp's rows in shared memory (2 KB per
  // consumer warp) and stores whole rows of dW's blocks by TMA (store_sdd_staged) instead of 4-byte
  // stores from registers.
  bool staged = false;
};

// SMs of an H100 / H200 (SXM), the schedules' count where the target's is not known.
constexpr int kDefaultSms = 132;
// The most SMs a Hopper GPU has: the backward-weight workspace holds the partials any grid up to
// this many SMs needs, and MatMulOptions::sms is at most this.
constexpr int kMaxSms = 144;

struct MatMulSpec {
  Op op = Op::forward;
  int block = 32;
  DType dtype = DType::f32;
  FeatureAxis feature_axis = FeatureAxis::last;
  // The target has Hopper's warpgroup instructions (sm_90a): the wgmma kernels may be chosen.
  bool wgmma = false;
  // The small-batch variant (N ≤ kSmallBatchRows): shapes that stream W with few rows of N.
  bool small_batch = false;
  // fp32 inputs multiplied on the tensor cores as TF32 (MatMulOptions::tf32; the mma.sync
  // pipelined kernels, feature axis last, b ≥ 16); never with wgmma.
  bool tf32 = false;
  // For calls without per-call options (bsjit::OpOptions: neither accumulate nor gate): the kernel
  // is built without those paths, a tenth to a third faster to compile on Hopper
  // (docs/PERFORMANCE.md). The runtime picks it for such calls, the general kernel for the others;
  // both take the same arguments and tile shape.
  bool plain = false;
  // A pipelined tile shape to use instead of the heuristic (tuning): bm, bk, warps_m, warps_n and
  // stages are taken, the rest derived. Only for specs whose heuristic choice is pipelined.
  std::optional<TileConfig> tiles;
  // SMs the persistent Hopper kernels' schedules are planned for: the target GPU's (H100 and H200
  // SXM 132, H100 PCIe 114, H20 78). A kernel runs correctly on any count, its last wave less even
  // where the count differs. Without wgmma it plays no part and stays kDefaultSms.
  int sms = kDefaultSms;
};

TileConfig choose_tiles(const MatMulSpec& spec);

// Rows of N at or below which every op runs its small-batch variant.
constexpr std::int64_t kSmallBatchRows = 128;

// The most a layout's tiles may slow a persistent dsd kernel's paced wave in the model
// (GeneratedSource::pace_slowdown) for its launches to pace it.
constexpr double kPacedSlowdownMax = 1.10;

// The kernels an op needs: [0] for any N; [1], where it exists, for N ≤ kSmallBatchRows (a shorter
// row tile, so a small batch does not load and multiply rows of zeros).
std::vector<MatMulSpec> variants(const MatMulSpec& spec);

// The pipelined tile shapes worth trying for spec (the heuristic's first), for autotuning.
std::vector<TileConfig> tile_candidates(const MatMulSpec& spec);

// "bm128-bk32-w2x2-s4" (mma.sync), "wg1-bm128-s3" (wgmma, cp.async) or "tma2-bm128-s4" (wgmma,
// TMA producer): names a pipelined tile shape in kernel labels and ids.
std::string tiles_tag(const TileConfig& t);

struct GeneratedSource {
  std::string source;           // complete translation unit
  std::string name_expression;  // for nvrtcAddNameExpression
  std::string label;            // readable, for file names and logs: "forward-bf16-b32-last"
  TileConfig tiles;
  std::int64_t grid_x = 0;      // CTAs along x: output block columns (dsd) or blocks (sdd)
  std::int64_t rows_per_cta = 0;  // grid y = ceil(N / rows_per_cta); 0: grid y is `splits`
  int splits = 1;                 // backward-weight: CTAs per block, each reducing a part of N
  std::int64_t workspace_bytes = 0;  // device scratch the launch needs (split partials); 0: none
  // Its launches pace the wave (kernels::WaveGate, whose counters lie in the workspace): the kernel
  // is built with the gate and, a dsd kernel, this layout's tiles are even enough (pace_slowdown). A
  // launch whose CTAs have kernels::kWaveGateLead rounds or fewer may pass no workspace where nothing
  // else needs one (runtime::workspace_bytes).
  bool paced = false;
  // Persistent dsd kernels built with the gate: the modelled time of this layout's tiles paced over
  // running free (paced_slowdown); over kPacedSlowdownMax the launch leaves the gate open (paced false).
  double pace_slowdown = 1.0;
  std::int64_t in_features = 0, out_features = 0;
  int shared_bytes = 0;  // dynamic shared memory to launch with
  // TMA kernels take one tensor map per operand (a, then b, then out where the kernel stores by
  // TMA) after the plain arguments, which the host builds per call: a row-major [outer, inner]
  // 16-bit tensor (outer 0: the op's n rows) copied in boxes of box_inner × box_outer elements.
  struct TensorMapShape {
    std::int64_t inner = 0, outer = 0;
    int box_inner = 0, box_outer = 0;
    int swizzle = 128;  // bytes of the shared-memory swizzle span (128, 64 or 32)
  };
  std::vector<TensorMapShape> tensor_maps;  // empty, {a, b} or {a, b, out}
  // Persistent kernels: grid x = min(output tiles, CTAs the GPU holds at once), grid y = 1; the
  // tiles are grid_x output block columns × ceil(n / rows_per_cta) row tiles. Backward-weight
  // (rows_per_cta = 0): grid x = the CTAs the GPU holds, over grid_x units of dW (SddSchedule).
  bool persistent = false;
  // Split kernels (TileConfig::split): grid x is exactly grid_x CTAs, each taking its share of the
  // layout's blocks, for n ≤ max_rows (the workspace holds their partials for that many rows).
  bool split = false;
  std::int64_t max_rows = 0;
  DType dtype = DType::f32;
  // The layout's tables, which the source declares and runtime::load fills (device_tables.hpp).
  DeviceTables tables;
};

// Whether kernels for arch may use wgmma: "sm_90a" (the arch-specific Hopper target).
bool has_wgmma(const std::string& arch);

// "forward-bf16-b32-last", with the tile shape appended where the spec names one or the kernel is
// a Hopper one ("-tma2-bm256-s4"), and "-plain" for a plain kernel: names kernels in logs, cache
// entries and tuning reports.
std::string kernel_label(const MatMulSpec& spec);

// Block sizes with a kernel.
bool supported_block(int block);

// The kernel for spec on this layout. Without spec.tiles the tile choice is choose_tiles(spec),
// except where the layout decides (backward-weight at b ≤ 32 on sm_90a: the tiled kernel only for
// well-filled tiles); g.tiles and g.label say what was generated.
GeneratedSource generate_matmul(const Layout& layout, const MatMulSpec& spec);

// The rounds every CTA of a launch of g on `ctas` CTAs over n rows has, as its wave's gate counts
// them (kernels::WaveGate): a persistent dsd kernel's tiles / ctas; a backward-weight kernel's
// whole waves of units times kernels::kWaveGateSteps-step rounds of N. 0 where g does not pace.
std::int64_t paced_rounds(const GeneratedSource& g, std::int64_t ctas, std::int64_t n);

// Partial planes the Hopper backward-weight kernels' schedule (templates/bsjit/sdd_schedule.cuh)
// needs for `units` units on any grid of up to max_ctas CTAs: its workspace.
std::int64_t sdd_planes(std::int64_t units, std::int64_t max_ctas);

// The partial planes a Hopper backward-weight kernel over `units` units, per_sm CTAs to an SM, is
// built with: sdd_planes(units, kMaxSms · per_sm) (any Hopper GPU's grid) where SddSchedule splits the
// last wave's units on `sms` SMs, else 0. Its Config's kSplit says which: without planes the kernel
// has no split path, and takes every unit whole on any GPU.
std::int64_t sdd_kernel_planes(std::int64_t units, std::int64_t per_sm, std::int64_t sms = kDefaultSms);

}  // namespace bsjit::generator
