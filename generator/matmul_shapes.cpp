// Tile shapes of every matmul kernel family (what each TileConfig member means:
// matmul_generator.hpp), the candidates per op and block, and the choice among them that needs no
// layout (choose_tiles); the choices that read the layout are in matmul_generator.cpp
// (layout_choice) and matmul_sdd_units.cpp.
#include "matmul_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <vector>

#include "bsjit/error.hpp"

namespace bsjit::generator {

namespace {

// FMA path: split BM × BN over the CTA's threads, TN adjacent columns per thread (up to 8, so a
// thread reuses each A value 8 times) and the rest along M.
void choose_thread_tile(TileConfig& t) {
  for (int tn : {8, 4, 2, 1}) {
    if (t.bn % tn != 0) continue;
    int threads_n = t.bn / tn;
    if (threads_n > t.threads || t.threads % threads_n != 0) continue;
    int threads_m = t.threads / threads_n;
    if (threads_m > t.bm || t.bm % threads_m != 0) continue;
    t.tn = tn;
    t.tm = t.bm / threads_m;
    return;
  }
  throw Error(fmt::format("internal: no thread tile for BM={} BN={} threads={}", t.bm, t.bn, t.threads));
}

}  // namespace

bool supported_block(int block) { return block == 8 || block == 16 || block == 32 || block == 64 || block == 128; }

// Tile choice per op and block size. The FMA and mma.sync base, for every target:
// - dsd (forward, backward-data): one output block column per CTA (BN = b), 128 threads, BM = 128
//   rows of N so each W block loaded feeds 128 rows; BK = min(b, 32) keeps shared memory under
//   the 48 KB static limit at b = 128 (2 × 128 × 40 × 2 bytes = 20 KB).
// - sdd (backward-weight): one b × b block per CTA, reducing over N in steps of 32 rows.
// - Tensor cores (mma.sync m16n8k16) for fp16/bf16 at b ≥ 16; fp32 stays exact on the FMA pipes,
//   and b = 8 is below the m16 tile.
//
// Pipelined kernels (16-bit, feature axis last, b ≥ 16): cp.async tiles 3 or 4 stages deep (50-282
// TFLOP/s on suite W against 20-58 with scalar loads and one stage). Shapes below are the winners
// of `bsjit-bench --suite sweep` (H200, 2026-11-29, N = 8192, C = K = 4096, d = 0.5 and 0.1):
// - dsd, b ≥ 64: BM = 128, BK = 64, 2×2 warps, 3 stages: 268 TFLOP/s at b = 128 against 242 with
//   BK = 32 and 4 stages (half the barriers per FLOP); 8 warps or BM = 256 were slower (186-248).
// - dsd, b ≤ 32: BM = 256 on 8 warps (8×1), 3 stages: each W tile feeds twice the rows; 131 against
//   120 TFLOP/s at b = 32, d = 0.5, and 53 against 50 at b = 16. Grouping 2-8 whole blocks per stage
//   (group > 1) was predicted to help by cutting barriers per FLOP and measured 13-60% slower.
// - dsd on sm_90a, b ≥ 64: the warp-specialized wgmma kernel, persistent (one wave of CTAs looping
//   over output tiles, so the producer loads the next tile while the consumers store the last),
//   swapped (Yᵀ = Wᵀ·Xᵀ: 2 consumers of 64 features × 256 rows at b = 128, of 64 features × 128
//   rows at b = 64), BM = 256, 4 stages. Sweep on the H200 (TFLOP/s, balanced, d = 0.5 / 0.1,
//   forward and backward-data): b = 128: 720 / 479 and 678 / 426 against 714 / 460 and 666 / 413
//   unswapped with 2 consumers of 128 rows, 683 / 468 and 647 / 408 with 4 of 64 rows; b = 64:
//   489 / 390 and 462 / 361 against 490 / 366 and 442 / 358 unswapped. The swapped kernel reads
//   less shared memory per FLOP, but per step the CTA takes 40-48 KB from L2 for 2.1-4.2 MFLOP,
//   8-9 TB/s over the GPU, near the L2-to-SM ceiling (9 TB/s), so the gain is small. Persistent
//   against one tile per CTA: b = 64 d = 0.05 0.069 against 0.092 ms, b = 128 2-17% faster
//   (docs/PERFORMANCE.md, versions v5, v7, v12). The cp.async-fed wgmma kernel (a CTA barrier per
//   stage, 2-3 CTAs an SM to hide it; 345 / 220 TFLOP/s at b = 128 against the TMA kernel's 590 /
//   265) stays a tuning candidate.
// - sdd on sm_90a, b ≥ 64: the warp-specialized kernel with one consumer warpgroup holding the
//   whole block (two m64 tiles at b = 128), 4 stages: b = 128, balanced, d = 0.5 / 0.1 / 0.05:
//   0.217 / 0.059 / 0.085 ms against 0.470 / 0.159 / 0.157 for the best mma.sync shape; two
//   consumers of 64 rows: 0.229 / 0.063 / 0.073. b = 64: 0.399 / 0.079 / 0.067 against 0.746 /
//   0.167 / 0.101.
// - sdd: 2×2 warps, BK = 64, 3 stages (313 against 284 TFLOP/s at b = 128, d = 0.5); b = 16 on one
//   warp, BK = 32, 4 stages.

// Completes a pipelined shape from (bm, bk, warps, stages) and checks what the templates assert.
TileConfig finish_pipelined(const MatMulSpec& spec, TileConfig t) {
  const int b = spec.block;
  const bool sdd = spec.op == Op::backward_weight;
  t.tensor_cores = t.pipelined = true;
  if (sdd) t.bm = b;
  t.bn = b;
  t.threads = 32 * t.warps_m * t.warps_n;
  // element size and row padding of K-major and MN-major tiles (pipeline.cuh: TilePad)
  const int e = spec.dtype == DType::f32 ? 4 : 2, pad_k = e == 2 ? 8 : 4, pad_mn = 8;
  t.stride = t.bk + pad_k;
  const int a_stage = sdd ? t.bk * (b + pad_mn) : t.bm * (t.bk + pad_k);
  const int b_stage = sdd                            ? t.bk * (b + pad_mn)
                      : spec.op == Op::backward_data ? b * (t.bk + pad_k)
                                                     : t.bk * (b + pad_mn);
  t.shared_bytes = t.stages * (a_stage + b_stage) * e;
  if (sdd) t.group = 1;
  const bool grouping_ok = t.group == 1 ? (sdd || b % t.bk == 0) : t.bk == t.group * b;
  const bool ok = !t.persistent && t.bm % (16 * t.warps_m) == 0 && b % (16 * t.warps_n) == 0 && t.bk % 16 == 0 &&
                  grouping_ok && t.stages >= 2 && t.threads <= 512 && t.shared_bytes <= 160 * 1024;
  if (!ok)
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}", tiles_tag(t), to_string(spec.op), b));
  return t;
}

// The Hopper kernel's shape from (bm, warpgroups, stages): warps_m warpgroups of 4 warps, each
// owning bm / warps_m rows (64 or 128: one or two m64 wgmma tiles), or when swapped 64 output
// features of 128 or 256 rows; 64 reduction indices per stage. DsdWgmmaPlan in
// templates/bsjit/matmul_pipelined.cuh computes the same shared-memory size.
TileConfig finish_wgmma(const MatMulSpec& spec, TileConfig t) {
  const int b = spec.block;
  t.tensor_cores = t.pipelined = t.wgmma = true;
  t.bn = b, t.bk = 64, t.group = 1, t.warps_n = 1, t.stride = 0;
  t.threads = t.warps_m * 128;
  // a stage: bm rows of X by `slice` reduction indices (128-byte rows; 64 bytes at b = 32) and
  // W's slice (slice × b)
  const int slice = dsd_slice(b);
  t.shared_bytes = t.stages * (t.bm * 2 * slice + slice * b * 2) + 1024;
  // A warpgroup's rows: bm / warps_m (one or two m64 tiles); swapped (TMA kernel only), the warpgroups
  // split into b / 64 feature slices of 64, each row slice bm / (warps_m / (b / 64)) rows (wgmma's N).
  const int slices = t.swapped ? b / 64 : 1, row_slices = slices > 0 ? t.warps_m / slices : 0;
  const int rows = row_slices > 0 ? t.bm / row_slices : 0;
  const bool rows_ok = row_slices * slices == t.warps_m && t.bm == rows * row_slices &&
                       (t.swapped ? t.tma && (rows == 128 || rows == 256) : rows == 64 || rows == 128);
  // b = 32: the TMA kernel unswapped (wgmma m64n32k16 on tiles swizzled over 64 bytes), for small
  // batches (choose_tiles)
  const bool block_ok = b == 64 || b == 128 || (b == 32 && t.tma && !t.swapped);
  // split columns: the small batch's unswapped TMA kernel (its workspace holds kSmallBatchRows rows)
  const bool split_ok = !t.split || (t.tma && t.persistent && !t.swapped && spec.small_batch);
  const bool ok = spec.wgmma && spec.op != Op::backward_weight && block_ok && rows_ok && t.bm <= 256 &&
                  t.stages >= (t.tma ? 2 : 3) && t.shared_bytes <= 227 * 1024 && split_ok &&
                  (t.tma || !t.persistent);  // only the TMA kernel loops over tiles
  if (!ok)
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}{}", tiles_tag(t), to_string(spec.op), b,
                            spec.wgmma ? "" : " (wgmma needs the sm_90a target)"));
  return t;
}

// The warp-specialized TMA kernel: warps_m consumer warpgroups plus one producer warpgroup; the
// shared memory of DsdTmaPlan (the stages, 2 mbarriers per stage padded to 1024 bytes, and one
// 64 × 64 staging tile of the output per consumer, two when swapped).
TileConfig finish_tma(const MatMulSpec& spec, TileConfig t) {
  if (spec.op == Op::backward_weight) {
    // a stage holds 64 rows of N of X and dY (SddTmaPlan); warps_m consumers split the tile's rows
    // (up to b / 64 of them, whole m64 tiles each), the rest its columns (wgmma's N):
    // - one b × b block per CTA (b ≥ 64, sdd_tma_kernel);
    // - b ≤ 32: E × E tiles of dW holding blocks (E = tile_edge; or 128 × 256, tile_cols), computed
    //   whole (sdd_tiled_kernel);
    // - row_blocks block columns of a band of rows (one block row at b ≥ 64, or two at b = 64
    //   (band_rows); 64 / b at b ≤ 32): rows × row_blocks·b (sdd_rows_kernel);
    // - b = 128: col_blocks block rows (gathered) of one block column: col_blocks·b × b (sdd_cols_kernel).
    const int b = spec.block, edge = t.tile_edge > 0    ? t.tile_edge
                                     : t.row_blocks > 0 ? static_cast<int>(band_rows_of(t, b)) * b
                                     : t.col_blocks > 0 ? t.col_blocks * b
                                                        : b;
    const int cols = t.row_blocks > 0 ? t.row_blocks * b : t.col_blocks > 0 ? b : t.tile_cols > 0 ? t.tile_cols : edge;
    const int along_rows = std::clamp(edge / 64, 1, std::max(t.warps_m, 1)), along_cols = t.warps_m / along_rows;
    const int width = along_cols > 0 ? cols / along_cols : 0, tiles = edge / along_rows / 64;
    t.tensor_cores = t.pipelined = t.wgmma = true;
    t.bm = edge, t.bn = cols, t.bk = 64, t.group = 1, t.warps_n = 1, t.stride = 0;
    t.threads = t.warps_m * 128 + 32;  // consumer warpgroups, then a producer warp
    // (SddTmaPlan: staged, the mbarriers padded to 1024 bytes and a warp's staging, 16 rows × 64
    // columns of 16-bit, per consumer warp after them; the kernel asserts that the two agree)
    constexpr int kWarpStaging = 16 * 64 * 2;
    t.shared_bytes =
        t.stages * 64 * (edge + cols) * 2 + 1024 + (t.staged ? 1024 + t.warps_m * 4 * kWarpStaging : 2 * t.stages * 8);
    const bool kind_ok = t.tile_edge > 0 ? b <= 32 && (edge == 64 || edge == 128) && t.row_blocks == 0 &&
                                               t.col_blocks == 0 && (cols == edge || (edge == 128 && cols == 256))
                         : t.row_blocks > 0 ? b >= 16 && t.row_blocks >= 2 && t.col_blocks == 0 &&
                                                  (t.band_rows == 0 || (b == 64 && t.band_rows == 2))
                         : t.col_blocks > 0 ? b == 128 && t.col_blocks >= 2
                                            : b == 64 || b == 128;
    // wgmma widths 64-256; accumulators: at most 128 per thread, and with more than 2 consumers
    // (≤ 128 registers per thread at 640 threads) at most 64
    const int accumulators = tiles * width / 2;
    const bool consumers_ok = t.warps_m >= 1 && along_rows * along_cols == t.warps_m && width * along_cols == cols &&
                              tiles * 64 * along_rows == edge && width % 64 == 0 && width <= 256 &&
                              accumulators <= (t.warps_m <= 2 ? 128 : 64);
    if (!spec.wgmma || !kind_ok || !consumers_ok || t.stages < 2 || t.shared_bytes > 227 * 1024 || t.persistent ||
        t.columns > 0)
      throw Error(fmt::format("tile shape {} is not valid for {} at block {}{}", tiles_tag(t), to_string(spec.op), b,
                              spec.wgmma ? "" : " (wgmma needs the sm_90a target)"));
    return t;
  }
  t = finish_wgmma(spec, t);
  t.threads += 128;
  const int staging_row = 2 * dsd_slice(spec.block);  // bytes
  t.shared_bytes += (2 * t.stages * 8 + 1023) / 1024 * 1024 + t.warps_m * (t.swapped ? 2 : 1) * 64 * staging_row;
  if (t.stages < 2 || t.shared_bytes > 227 * 1024)
    throw Error(
        fmt::format("tile shape {} is not valid for {} at block {}", tiles_tag(t), to_string(spec.op), spec.block));
  return t;
}

// The grouped Hopper dsd kernel (b = 16 and 32): warps_m consumer warpgroups (1 or 2), each owning
// 64 / b output block columns of the group, plus a producer; bm rows of X per tile (wgmma's N:
// 64, 128 or 256, bm / 2 accumulators per consumer thread). A stage holds the X tile (bm rows × 64
// reduction indices) and the group's W blocks in those indices, 64 / b per column; after the stages,
// their mbarriers and step records and one output tile of up to 128 rows × 64 per consumer
// (DsdGroupedPlan).
TileConfig finish_grouped(const MatMulSpec& spec, TileConfig t) {
  const int b = spec.block, sub = b == 16 || b == 32 ? 64 / b : 0;
  t.tensor_cores = t.pipelined = t.wgmma = t.tma = t.persistent = true;
  t.columns = sub > 0 ? t.warps_m * sub : 0;
  t.bn = t.columns * b, t.bk = 64, t.group = 1, t.warps_n = 1, t.stride = 0;
  t.threads = (t.warps_m + 1) * 128;
  const int stage_bytes = t.bm * 128 + sub * t.columns * 2 * b * b, records = t.stages * 2 * 4;
  t.shared_bytes = 1024 + (t.stages * stage_bytes + 2 * t.stages * 8 + records + 127) / 128 * 128 +
                   t.warps_m * std::min(t.bm, 128) * 128;
  const bool ok = spec.wgmma && spec.op != Op::backward_weight && t.columns > 0 && (t.warps_m == 1 || t.warps_m == 2) &&
                  (t.bm == 64 || t.bm == 128 || t.bm == 256) && t.stages >= 2 && t.stages <= 32 &&
                  t.shared_bytes <= 227 * 1024;
  if (!ok)
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}{}", tiles_tag(t), to_string(spec.op), b,
                            spec.wgmma ? "" : " (wgmma needs the sm_90a target)"));
  return t;
}

// The paired Hopper dsd kernel (b = 64): warps_m consumer warpgroups of bm / warps_m rows (64 or
// 128: two accumulator sets of that many / 2 per thread, one per column) of both columns of a pair,
// plus a producer. A stage holds the X tile (bm rows × 64) and two W blocks (8 KB each); after the
// stages, their mbarriers (padded to 1024 bytes) and two 64 × 64 staging tiles per consumer
// (DsdPairedPlan).
TileConfig finish_paired(const MatMulSpec& spec, TileConfig t) {
  const int b = spec.block, rows = t.warps_m > 0 ? t.bm / t.warps_m : 0;
  t.tensor_cores = t.pipelined = t.wgmma = t.tma = t.persistent = t.swapped = true;
  t.bn = 2 * b, t.bk = 64, t.group = 1, t.warps_n = 1, t.stride = 0, t.columns = 0;
  t.threads = (t.warps_m + 1) * 128;
  t.shared_bytes = 1024 + t.stages * (t.bm * 128 + 2 * 64 * 128) + (2 * t.stages * 8 + 1023) / 1024 * 1024 +
                   t.warps_m * 2 * 64 * 128;
  const bool ok = spec.wgmma && spec.op != Op::backward_weight && b == 64 && (rows == 64 || rows == 128) &&
                  rows * t.warps_m == t.bm && t.bm <= 256 && t.stages >= 2 && t.shared_bytes <= 227 * 1024;
  if (!ok)
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}{}", tiles_tag(t), to_string(spec.op), b,
                            spec.wgmma ? "" : " (wgmma needs the sm_90a target)"));
  return t;
}

TileConfig paired_shape(int bm, int warpgroups, int stages) {
  TileConfig t;
  t.wgmma = t.tma = t.persistent = t.swapped = t.paired = true, t.bm = bm, t.warps_m = warpgroups, t.stages = stages;
  return t;
}

TileConfig grouped_shape(int bm, int warpgroups, int stages) {
  TileConfig t;
  t.wgmma = t.tma = t.persistent = true, t.bm = bm, t.warps_m = warpgroups, t.columns = 1, t.stages = stages;
  return t;  // columns: set by finish_grouped (1 marks the kind until then)
}

// Applies the finish_* function of a shape's kind.
TileConfig finish_shape(const MatMulSpec& spec, const TileConfig& t) {
  if (t.swapped && (!t.tma || t.columns > 0 || t.tile_edge > 0 || spec.op == Op::backward_weight))
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}: only the TMA dsd kernel is swapped",
                            tiles_tag(t), to_string(spec.op), spec.block));
  if (t.staged && (!t.tma || spec.op != Op::backward_weight))
    throw Error(
        fmt::format("tile shape {} is not valid for {}: the staged epilogue is the TMA backward-weight kernels'",
                    tiles_tag(t), to_string(spec.op)));
  if ((t.row_blocks > 0 || t.col_blocks > 0) && spec.op != Op::backward_weight)
    throw Error(fmt::format("tile shape {} is not valid for {}: row and column groups are backward-weight's",
                            tiles_tag(t), to_string(spec.op)));
  if ((t.paired && (t.columns > 0 || t.tile_edge > 0)) ||
      ((t.row_blocks > 0 || t.col_blocks > 0) && (t.paired || t.columns > 0)))
    throw Error(
        fmt::format("tile shape {} is not valid: paired, grouped, tiled, row- and column-grouped are different kernels",
                    tiles_tag(t)));
  return t.paired        ? finish_paired(spec, t)
         : t.columns > 0 ? finish_grouped(spec, t)
         : t.tma         ? finish_tma(spec, t)
         : t.wgmma       ? finish_wgmma(spec, t)
                         : finish_pipelined(spec, t);
}

TileConfig tiled_shape(int edge, int warpgroups, int stages, int cols) {
  TileConfig t;
  t.wgmma = t.tma = true, t.tile_edge = edge, t.tile_cols = cols, t.warps_m = warpgroups, t.stages = stages;
  return t;
}

TileConfig rows_shape(int row_blocks, int warpgroups, int stages, int band_rows) {
  TileConfig t;
  t.wgmma = t.tma = true, t.row_blocks = row_blocks, t.band_rows = band_rows, t.warps_m = warpgroups;
  t.stages = stages;
  return t;
}

TileConfig cols_shape(int col_blocks, int warpgroups, int stages) {
  TileConfig t;
  t.wgmma = t.tma = true, t.col_blocks = col_blocks, t.warps_m = warpgroups, t.stages = stages;
  return t;
}

TileConfig tma_shape(int bm, int warpgroups, int stages, bool persistent, bool swapped) {
  TileConfig t;
  t.wgmma = t.tma = true, t.bm = bm, t.warps_m = warpgroups, t.stages = stages, t.persistent = persistent;
  t.swapped = swapped;
  return t;
}

// The small batch's TMA shape t with its columns split (TileConfig::split; persistent).
TileConfig split_shape(TileConfig t) {
  t.persistent = t.split = true;
  return t;
}

TileConfig wgmma_shape(int bm, int warpgroups, int stages) {
  TileConfig t;
  t.wgmma = true, t.bm = bm, t.warps_m = warpgroups, t.stages = stages;
  return t;
}

TileConfig pipelined_shape(int bm, int bk, int wm, int wn, int stages, int group = 1) {
  TileConfig t;
  t.bm = bm, t.bk = bk, t.warps_m = wm, t.warps_n = wn, t.stages = stages, t.group = group;
  return t;
}

TileConfig staged(TileConfig t) {
  t.staged = true;
  return t;
}

std::vector<MatMulSpec> variants(const MatMulSpec& spec) {
  std::vector<MatMulSpec> out{spec};
  if (spec.tiles || !choose_tiles(spec).pipelined) return out;
  // Small batch (inference, N ≤ 128): a short row tile (choose_tiles), more W bytes in flight per
  // row computed. At b = 32, N = 64 the forward took 0.102 ms with the default BM = 256 and 0.059
  // with BM = 64 on 4 warps and 4 stages. Backward-weight reduces over those few rows: one or two
  // reduction steps per block, so its small shape has the fewest stages (more CTAs per SM).
  MatMulSpec small = spec;
  small.small_batch = true;
  out.push_back(small);
  return out;
}

bool has_wgmma(const std::string& arch) { return arch == "sm_90a"; }

std::string kernel_label(const MatMulSpec& spec) {
  const TileConfig t = choose_tiles(spec);
  std::string label = fmt::format("{}-{}{}-b{}-{}", to_string(spec.op), to_string(spec.dtype), spec.tf32 ? "-tf32" : "",
                                  spec.block, to_string(spec.feature_axis));
  if (spec.tiles || spec.small_batch || t.wgmma) label += "-" + tiles_tag(t);
  if (spec.plain) label += "-plain";
  if (spec.sms != kDefaultSms) label += fmt::format("-sm{}", spec.sms);  // schedules for another GPU
  return label;
}

std::string tiles_tag(const TileConfig& t) {
  const char* staged = t.staged ? "-st" : "";
  if (t.paired) return fmt::format("pair{}-bm{}-s{}", t.warps_m, t.bm, t.stages);
  if (t.columns > 0) return fmt::format("grp{}-bm{}-s{}", t.warps_m, t.bm, t.stages);
  if (t.tile_edge > 0)
    return fmt::format("tile{}{}-tma{}-s{}{}", t.tile_edge,
                       t.tile_cols > 0 && t.tile_cols != t.tile_edge ? fmt::format("x{}", t.tile_cols) : "", t.warps_m,
                       t.stages, staged);
  if (t.row_blocks > 0)
    return fmt::format("rows{}{}-tma{}-s{}{}", t.row_blocks, t.band_rows > 0 ? fmt::format("x{}", t.band_rows) : "",
                       t.warps_m, t.stages, staged);
  if (t.col_blocks > 0) return fmt::format("cols{}-tma{}-s{}{}", t.col_blocks, t.warps_m, t.stages, staged);
  if (t.wgmma)
    return fmt::format("{}{}-bm{}-s{}{}{}{}{}", t.tma ? "tma" : "wg", t.warps_m, t.bm, t.stages,
                       t.persistent ? "-p" : "", t.split ? "-split" : "", t.swapped ? "-sw" : "", staged);
  return fmt::format("bm{}-bk{}-w{}x{}-s{}{}", t.bm, t.bk, t.warps_m, t.warps_n, t.stages,
                     t.group > 1 ? fmt::format("-g{}", t.group) : "");
}

std::vector<TileConfig> tile_candidates(const MatMulSpec& spec) {
  MatMulSpec heuristic = spec;
  heuristic.tiles.reset();
  std::vector<TileConfig> out{choose_tiles(heuristic)};
  if (!out[0].pipelined) return out;
  const int b = spec.block, bk = b == 16 ? 16 : 32;
  std::vector<TileConfig> shapes;
  if (spec.op == Op::backward_weight) {
    if (spec.wgmma)
      for (int wg : {1, 2})
        for (int stages : {3, 4, 5, 6}) shapes.push_back(tma_shape(b, wg, stages));
    if (spec.wgmma && b <= 32)
      for (int edge : {128, 64})
        for (int stages : {4, 6}) shapes.push_back(tiled_shape(edge, 1, stages));
    // b ≤ 32: 128 × 256 tiles on 2 consumers (64 rows × 256 each)
    if (spec.wgmma && b <= 32)
      for (int stages : {3, 4}) shapes.push_back(tiled_shape(128, 2, stages, 256));
    // blocks of a block row together: b = 64 on 1 consumer of 2 or 4 blocks or 2 consumers of 2 or
    // 4 each; b = 128 on 2 consumers of 64 rows × 2 blocks
    if (spec.wgmma && b >= 64)
      for (auto [m, wg, stages] :
           {std::tuple{2, 1, 6}, {4, 1, 4}, {4, 1, 5}, {4, 2, 4}, {8, 2, 3}, {2, 2, 4}, {2, 2, 3}})
        shapes.push_back(rows_shape(m, wg, stages));
    // b = 64: bands of two block rows × 4 block columns holding a block in either, on 2 consumers
    if (spec.wgmma && b == 64)
      for (int stages : {3, 4}) shapes.push_back(rows_shape(4, 2, stages, 2));
    // b = 128: two blocks of a block column, a consumer each
    if (spec.wgmma && b == 128)
      for (int stages : {3, 4}) shapes.push_back(cols_shape(2, 2, stages));
    // b ≤ 32: a band of 64 rows × 256 or 512 gathered columns, on 1 or 2 consumers
    if (spec.wgmma && b <= 32)
      for (auto [cols, wg, stages] : {std::tuple{256, 1, 5}, {256, 2, 5}, {256, 2, 4}, {512, 2, 3}})
        shapes.push_back(rows_shape(cols / b, wg, stages));
    // the TMA shapes with the staged epilogue where it fits (at least as fast), else with register stores
    for (auto& s : shapes) {
      try {
        finish_shape(spec, staged(s));
        s.staged = true;
      } catch (const Error&) {
        // not valid at this block size, or no room for the staging
      }
    }
    shapes.insert(shapes.end(),
                  {pipelined_shape(b, 32, 2, 2, 4), pipelined_shape(b, 32, b >= 64 ? 2 : 1, b >= 64 ? 4 : 2, 4),
                   pipelined_shape(b, 64, b >= 64 ? 4 : 1, 2, 3), pipelined_shape(b, 32, 1, 1, 6)});
  } else {
    const int wn8 = b >= 64 ? 4 : 1, wm8 = 8 / wn8;  // 8 warps
    const int wn4 = b >= 64 ? 2 : 1, wm4 = 4 / wn4;  // 4 warps
    shapes = {pipelined_shape(128, bk, wm4, wn4, 4),
              pipelined_shape(128, std::min(b, 64), wm4, wn4, 3),
              pipelined_shape(128, bk, wm8, wn8, 4),
              pipelined_shape(256, bk, wm8, wn8, 3),
              pipelined_shape(256, std::min(b, 64), wm8, wn8, 3),
              pipelined_shape(64, bk, b >= 64 ? 1 : 4, b >= 64 ? 4 : 1, 4)};
    // Whole blocks, several per stage (more mma per barrier). Measured slower on the H200
    // (b = 32, d = 0.5: 114 TFLOP/s with 2 blocks per stage, 63 with 4, against 131 for one), so
    // not the default; kept as a candidate to re-measure as the kernels change.
    if (b <= 32) shapes.push_back(pipelined_shape(128, 64, 8, 1, 3, 64 / b));
    if (spec.wgmma && b <= 32)
      for (auto [bm, wg] : {std::pair{256, 2}, {256, 1}, {128, 2}, {128, 1}, {64, 2}, {64, 1}})
        for (int stages : {3, 4, 6}) shapes.push_back(grouped_shape(bm, wg, stages));
    if (spec.wgmma)
      for (auto [bm, wg] : {std::pair{128, 2}, {128, 1}, {256, 4}, {256, 2}, {64, 1}})
        for (int stages : {3, 4, 5, 6, 8}) {
          shapes.push_back(wgmma_shape(bm, wg, stages));
          shapes.push_back(tma_shape(bm, wg, stages));
          if (stages == 4 || stages == 5 || (spec.small_batch && stages == 8))
            shapes.push_back(tma_shape(bm, wg, stages, true));
        }
    if (spec.wgmma && b == 32)  // small batch: more stages of 6 KB
      for (int stages : {6, 8, 12}) shapes.push_back(tma_shape(64, 1, stages, true));
    if (spec.wgmma && spec.small_batch)  // the small batch's columns split (only valid there)
      for (int stages : b == 32 ? std::vector<int>{6, 8, 12} : std::vector<int>{4, 6, 8})
        shapes.push_back(split_shape(tma_shape(64, 1, stages)));
    if (spec.wgmma && b == 64)  // pairs of columns: consumers of both columns' 64 features × 128 or 64 rows
      for (auto [bm, wg, stages] : {std::tuple{256, 2, 4}, {256, 2, 3}, {256, 4, 3}, {128, 2, 6}, {128, 1, 6}})
        shapes.push_back(paired_shape(bm, wg, stages));
    if (spec.wgmma)  // swapped: consumers of 64 features × 128 or 256 rows
      for (auto [bm, wg] : {std::pair{256, 2}, {256, 1}, {256, 4}, {128, 1}})
        for (int stages : {3, 4}) shapes.push_back(tma_shape(bm, wg, stages, true, true));
  }
  for (const auto& s : shapes) {
    try {
      TileConfig t = finish_shape(spec, s);
      bool seen = false;
      for (const auto& o : out) seen |= tiles_tag(o) == tiles_tag(t);
      if (!seen) out.push_back(t);
    } catch (const Error&) {
      // not valid at this block size
    }
  }
  return out;
}

TileConfig choose_tiles(const MatMulSpec& spec) {
  const int b = spec.block;
  if (!supported_block(b)) throw Error(fmt::format("block size {} is not supported; expected 8, 16, 32, 64 or 128", b));
  TileConfig t;
  if (spec.tf32 && (spec.dtype != DType::f32 || b < 16 || spec.feature_axis != FeatureAxis::last || spec.wgmma))
    throw Error(
        fmt::format("bsjit: tf32 needs fp32 inputs, block ≥ 16 and the feature axis last (got {}, block {}, "
                    "feature axis {}{})",
                    to_string(spec.dtype), b, to_string(spec.feature_axis), spec.wgmma ? ", wgmma" : ""));
  t.tensor_cores = (spec.dtype != DType::f32 || spec.tf32) && b >= 16;
  if (t.tensor_cores && spec.feature_axis == FeatureAxis::last) {
    if (spec.tiles) return finish_shape(spec, *spec.tiles);
    // fp32 as TF32: the mma.sync pipelined kernels on BK = 32 (4-byte tiles take twice the shared
    // memory of 16-bit ones); not tuned yet
    if (spec.tf32) {
      if (spec.op == Op::backward_weight)
        return finish_pipelined(spec, b == 16 ? pipelined_shape(b, 32, 1, 1, spec.small_batch ? 2 : 4)
                                              : pipelined_shape(b, 32, 2, 2, spec.small_batch ? 2 : 3));
      if (spec.small_batch)
        return finish_pipelined(spec, pipelined_shape(64, b == 16 ? 16 : 32, b >= 64 ? 1 : 4, b >= 64 ? 4 : 1, 4));
      return finish_pipelined(
          spec, b >= 64 ? pipelined_shape(128, 32, 2, 2, 3) : pipelined_shape(256, b == 16 ? 16 : 32, 8, 1, 3));
    }
    // Small-batch backward-weight (N = 64: one 64-row step per unit, so the epilogue is the kernel):
    // on sm_90a the TMA kernels with the staged epilogue, elsewhere (and at b = 16) the mma.sync kernel
    // with 2 stages. N = 64, C = K = 16384, d = 0.1, ms (sweep-small, one device call, 2026-11-30):
    // b = 64, tma1-bm64-s4-st 0.0219 (s3 0.0220, s5-s6 0.0268), the same with register stores
    // 0.063, row groups of 2-4 blocks staged 0.031-0.043, mma.sync 0.051; b = 128, tma2-bm128-s4-st
    // (a consumer per 64 rows) 0.0216, tma1 0.0302; b = 32, bands of 64 × 256 (rows8-tma2-s4-st)
    // 0.0512, 64 × 64 tiles 0.072, mma.sync 0.065.
    if (spec.small_batch && spec.op == Op::backward_weight) {
      if (spec.wgmma && b >= 64) return finish_tma(spec, staged(tma_shape(b, b / 64, 4)));
      if (spec.wgmma && b == 32) return finish_tma(spec, staged(rows_shape(8, 2, 4)));
      return finish_pipelined(spec, b == 16 ? pipelined_shape(b, 32, 1, 1, 2) : pipelined_shape(b, 64, 2, 2, 2));
    }
    // small batch on sm_90a: one consumer of 64 rows, 6 stages at first. N = 64, C = K = 16384, d = 0.1,
    // b = 64: forward 0.035 → 0.023 ms (0.36 → 0.57 of copy bandwidth on W's bytes), backward-data
    // 0.045 → 0.025 against the mma.sync shape below. At b = 64 4 stages (three CTAs per SM): the
    // balanced forward (every column 26 blocks), sweep-small, five runs in two calls: 0.0195-0.0197 ms
    // against 0.0200-0.0204 with 6 (5 stages 0.0199-0.0203). b = 128 with 8 (2026-12-03, sweep-small,
    // ms, 6 against 8 stages): balanced forward 0.0196 against 0.0199, backward-data 0.0228 against
    // 0.0221, Bernoulli forward 0.0248 against 0.0237, backward-data 0.0236 against 0.0226.
    if (spec.wgmma && spec.small_batch && b >= 64) return finish_tma(spec, tma_shape(64, 1, b == 64 ? 4 : 8));
    // b = 32: the same kernel on tiles 32 wide, persistent (512 output block columns at K = 16384 on
    // 2-4 CTAs per SM) with 8 stages. A probe of its copies alone (tools/probes/stream_once.cu: W's
    // 2 KB blocks and 4 KB of X per step) took 0.022-0.026 ms against 0.046 for the mma.sync kernel.
    // Even columns at b = 32, uneven ones at b = 64: layout_choice.
    if (spec.wgmma && spec.small_batch && b == 32) return finish_tma(spec, tma_shape(64, 1, 8, true));
    if (spec.small_batch)
      return finish_pipelined(
          spec, pipelined_shape(64, b >= 64 ? 64 : (b == 16 ? 16 : 32), b >= 64 ? 1 : 4, b >= 64 ? 4 : 1, 4));
    if (spec.wgmma && spec.op != Op::backward_weight && b >= 64)
      return finish_tma(spec, tma_shape(256, 2, 4, true, true));
    // b = 16 and 32 on sm_90a: the grouped kernel, 2 consumers (128 / b output block columns per
    // group) on X tiles of 256 rows, 4 stages. Sweep at b = 32, forward, balanced (TFLOP/s, d = 0.5 /
    // 0.1): 379 / 133 against 345 / 128 with 3 stages, 260 / 124 with one consumer, 253 / 92 with
    // tiles of 128 rows; b = 16: 209 / 51 against 203 / 49 with 3 stages (before the step classes,
    // which took d = 0.1 to 150 at b = 32 and 90 at b = 16).
    if (spec.wgmma && spec.op != Op::backward_weight) return finish_grouped(spec, grouped_shape(256, 2, 4));
    // backward-weight: the TMA kernels with the staged epilogue wherever its shared memory fits (level
    // with register stores or up to 7% faster at N = 8192: sweep of suite W at d = 0.1)
    if (spec.wgmma && b >= 64) return finish_tma(spec, staged(tma_shape(b, 1, 4)));
    // backward-weight at b ≤ 32: 128 × 128 tiles of dW; generate_matmul's layout_choice may take
    // 64 × 64 tiles or the mma.sync kernel instead, from the layout's fill
    if (spec.wgmma && b >= 16) return finish_tma(spec, staged(tiled_shape(128, 1, 4)));
    if (spec.op != Op::backward_weight)
      return finish_pipelined(
          spec, b >= 64 ? pipelined_shape(128, 64, 2, 2, 3) : pipelined_shape(256, b == 16 ? 16 : 32, 8, 1, 3));
    return finish_pipelined(spec, b == 16 ? pipelined_shape(b, 32, 1, 1, 4) : pipelined_shape(b, 64, 2, 2, 3));
  }
  if (spec.tiles) throw Error("explicit tile shapes are only for the pipelined kernels (16-bit, feature axis last)");
  if (spec.op != Op::backward_weight) {
    t.bn = b;
    t.bk = std::min(b, 32);
    t.threads = 128;
    if (t.tensor_cores) {
      t.bm = 128;
      // warp tiles: b=16 → 32×16, b=32 → 32×32, b=64 → 64×32, b=128 → 64×64
      t.warps_m = b <= 32 ? 4 : 2;
      t.warps_n = 4 / t.warps_m;
    } else {
      t.bm = b == 128 ? 64 : 128;  // 64 × 128 fp32 outputs = 64 accumulators per thread
    }
  } else {
    t.bm = t.bn = b;
    t.bk = 32;
    if (t.tensor_cores) {
      t.warps_m = t.warps_n = b == 16 ? 1 : 2;  // b=16: one warp, 16×16
      t.threads = 32 * t.warps_m * t.warps_n;
    } else {
      t.threads = std::clamp(b * b / 16, 32, 128);
    }
  }
  if (!t.tensor_cores) choose_thread_tile(t);
  // Padding: 16-bit rows of BK+8 elements put the 8 fragment rows of a warp in distinct banks;
  // fp32 rows of BK+1 do the same for the FMA path's column reads.
  t.stride = t.bk + (dtype_size(spec.dtype) == 2 ? 8 : 1);
  return t;
}

}  // namespace bsjit::generator
