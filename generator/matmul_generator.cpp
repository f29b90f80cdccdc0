#include "matmul_generator.hpp"

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
#include "device_tables.hpp"
#include "templates/bsjit/sdd_schedule.cuh"

namespace bsjit::generator {
namespace {

// Per output block column, its (input block, W block index) pairs (output_columns).
using Columns = std::vector<std::vector<std::pair<int, int>>>;

std::string_view device_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f16: return "bsjit::kernels::half_t";
    case DType::bf16: return "bsjit::kernels::bfloat16_t";
  }
  return "";
}

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

// Tables of the grouped and paired kernels (templates/bsjit/matmul_grouped.cuh says what each
// holds). per_out[j] lists output block column j's (input block, W block index) pairs; order lists
// the columns as they are grouped, `columns` at a time (-1: none), the first half of a group the
// first consumer's (the first column of a pair), the rest the second one's (`consumers` halves); a
// group's steps are the chunks of `sub` input blocks (64 reduction indices) holding a block of its
// columns, in three classes (blocks of both halves, of the first only, of the second only), chunks
// ascending within a class (CTAs running together, on the same rows of X, then read X in about the
// same order). Sets grid_x to the number of groups and sub_fill to the fraction of the sub-blocks
// that a consumer computes (those of the steps of its classes) where one of its slots holds a block.
std::string grouped_tables(const Columns& per_out, const std::vector<int>& order, int columns, int sub, int consumers,
                           std::int64_t& grid_x, double& sub_fill, DeviceTables& tables) {
  const int record = 2 + sub * columns, positions = static_cast<int>(order.size());
  const int groups = (positions + columns - 1) / columns, per = columns / consumers;
  std::vector<int> group_steps, steps, group_columns;
  std::int64_t computed = 0, filled = 0;  // sub-blocks computed by a consumer, those holding its blocks
  for (int gi = 0; gi < groups; ++gi) {
    std::map<int, std::vector<int>> chunks;  // chunk → W block per slot j · columns + c (-1: none)
    for (int c = 0; c < columns; ++c) {
      const int at = gi * columns + c, col = at < positions ? order[at] : -1;
      group_columns.push_back(col);
      if (col < 0) continue;
      for (auto [in, wblock] : per_out[col]) {
        auto& slots = chunks[in / sub];
        slots.resize(sub * columns, -1);
        slots[in % sub * columns + c] = wblock;
      }
    }
    std::vector<int> by_class[3];
    for (auto& [chunk, slots] : chunks) {
      unsigned pattern = 0;
      bool held[2] = {false, false};
      for (int i = 0; i < sub * columns; ++i)
        if (slots[i] >= 0) pattern |= 1u << i, held[i % columns / per] = true;
      for (int h = 0; h < consumers; ++h) {
        if (!held[h]) continue;
        computed += sub;
        for (int j = 0; j < sub; ++j)
          filled += std::any_of(slots.begin() + j * columns + h * per, slots.begin() + j * columns + (h + 1) * per,
                                [](int w) { return w >= 0; });
      }
      auto& out = by_class[held[0] && held[1] ? 0 : held[0] ? 1 : 2];
      out.push_back(chunk), out.push_back(static_cast<int>(pattern));
      for (int i = 0; i < sub * columns; ++i) out.push_back(std::max(slots[i], 0));
    }
    for (auto& c : by_class) {
      group_steps.push_back(static_cast<int>(steps.size()) / record);
      steps.insert(steps.end(), c.begin(), c.end());
    }
  }
  group_steps.push_back(static_cast<int>(steps.size()) / record);
  grid_x = groups;
  sub_fill = computed > 0 ? static_cast<double>(filled) / static_cast<double>(computed) : 1.0;
  std::string text = fmt::format(
      "// Groups of {} output block columns. Group g's steps: kGroupSteps[3g] up to kGroupSteps[3g + 3], in\n"
      "// classes from kGroupSteps[3g + k] (blocks of both consumers, of the first only, of the second\n"
      "// only). Step s is kSteps[s·{} ...]: chunk of 64 reduction indices, pattern (bit j·{} + c: sub-block\n"
      "// j of column c holds a block), the W block of each slot. kGroupColumns: the output block column\n"
      "// of each column of each group (-1: none).\n",
      columns, record, columns);
  text += add_table(tables, "kGroupSteps", std::move(group_steps));
  text += add_table(tables, "kSteps", std::move(steps));
  text += add_table(tables, "kGroupColumns", std::move(group_columns));
  return text;
}

// Output block columns in pairs for the paired kernel: in column order, each column not yet paired
// takes the unpaired column sharing most input blocks with it (ties: the lowest index; an odd last
// column is alone, its partner -1). Returns the columns pair by pair. Counted on suite W's balanced
// layouts, such pairs share 62-64% of their blocks at d = 0.5 and 33-48% at d ≤ 0.25, so that a
// step stream of X tiles and W blocks moves 0.75 of the unpaired kernel's bytes at b = 64, d = 0.5,
// 0.83-0.88 at lower densities (docs/PERFORMANCE.md). Costs the sum over input blocks of the
// squared number of columns holding them.
std::vector<int> pair_columns(const Columns& per_out) {
  const int columns = static_cast<int>(per_out.size());
  int in_blocks = 0;
  for (const auto& entries : per_out)
    for (auto [in, w] : entries) in_blocks = std::max(in_blocks, in + 1);
  std::vector<std::vector<int>> holders(in_blocks);  // input block → the columns holding it
  for (int c = 0; c < columns; ++c)
    for (auto [in, w] : per_out[c]) holders[in].push_back(c);
  std::vector<int> order, shared(columns, 0), touched;
  std::vector<bool> paired(columns, false);
  for (int c = 0; c < columns; ++c) {
    if (paired[c]) continue;
    paired[c] = true;
    for (auto [in, w] : per_out[c])
      for (int o : holders[in])
        if (!paired[o] && shared[o]++ == 0) touched.push_back(o);
    int best = -1;
    for (int o : touched)
      if (best < 0 || shared[o] > shared[best] || (shared[o] == shared[best] && o < best)) best = o;
    for (int o : touched) shared[o] = 0;
    touched.clear();
    if (best < 0)  // nothing shared: the next unpaired column
      for (int o = c + 1; o < columns && best < 0; ++o)
        if (!paired[o]) best = o;
    if (best >= 0) paired[best] = true;
    order.push_back(c), order.push_back(best);
  }
  return order;
}

// Output block columns in groups of `columns` for the grouped kernel, so that a group's columns
// share chunks (sub input blocks, 64 reduction indices: a step copies one X tile per chunk): each
// group starts at the lowest column not yet grouped and adds, one at a time, the column that brings
// the fewest chunks the group does not hold yet (ties: the lowest index). Counted on suite W's
// balanced layouts, this takes the steps per block from 0.46 to 0.40 (b = 32, d = 0.25), 0.72 to
// 0.57 (d = 0.1), 0.30 to 0.25 (b = 16, d = 0.1) and 0.50 to 0.38 (d = 0.05) against groups of
// consecutive columns. The search scans every column per pick; past 4096 columns the groups are
// consecutive. Returns the columns group by group, -1 filling the last.
std::vector<int> group_by_chunks(const Columns& per_out, int columns, int sub) {
  const int n = static_cast<int>(per_out.size());
  std::vector<int> order;
  if (n > 4096) {
    for (int c = 0; c < n; ++c) order.push_back(c);
  } else {
    std::vector<std::vector<int>> chunks(n);  // each column's chunks, ascending
    int chunk_count = 0;
    for (int c = 0; c < n; ++c) {
      for (auto [in, w] : per_out[c])
        if (chunks[c].empty() || chunks[c].back() != in / sub) chunks[c].push_back(in / sub);
      if (!chunks[c].empty()) chunk_count = std::max(chunk_count, chunks[c].back() + 1);
    }
    std::vector<std::vector<int>> holders(chunk_count);  // chunk → the columns holding it
    for (int c = 0; c < n; ++c)
      for (int x : chunks[c]) holders[x].push_back(c);
    std::vector<int> extra(n);  // chunks of column c the group being built does not hold
    for (int c = 0; c < n; ++c) extra[c] = static_cast<int>(chunks[c].size());
    std::vector<bool> grouped(n, false), held(chunk_count, false);
    std::vector<int> group_chunks;
    auto add = [&](int c) {
      grouped[c] = true;
      order.push_back(c);
      for (int x : chunks[c])
        if (!held[x]) {
          held[x] = true, group_chunks.push_back(x);
          for (int o : holders[x]) --extra[o];
        }
    };
    for (int start = 0; start < n; ++start) {
      if (grouped[start]) continue;
      add(start);
      for (int size = 1; size < columns; ++size) {
        int best = -1;
        for (int o = start + 1; o < n; ++o)
          if (!grouped[o] && (best < 0 || extra[o] < extra[best])) best = o;
        if (best < 0) break;
        add(best);
      }
      for (int x : group_chunks) {
        held[x] = false;
        for (int o : holders[x]) ++extra[o];
      }
      group_chunks.clear();
    }
  }
  while (order.size() % columns != 0) order.push_back(-1);
  return order;
}

// The steps of the grouped kernel's tables for groups in `order`: per group, its chunks.
std::int64_t grouped_steps(const Columns& per_out, const std::vector<int>& order, int columns, int sub) {
  std::int64_t steps = 0;
  for (std::size_t g = 0; g < order.size(); g += columns) {
    std::set<int> chunks;
    for (std::size_t c = g; c < g + columns && c < order.size(); ++c)
      if (order[c] >= 0)
        for (auto [in, w] : per_out[order[c]]) chunks.insert(in / sub);
    steps += static_cast<std::int64_t>(chunks.size());
  }
  return steps;
}

}  // namespace

bool supported_block(int block) { return block == 8 || block == 16 || block == 32 || block == 64 || block == 128; }

// Tile choice per op and block size. This first version favours a simple, sound base over speed
// (speed is issue #4's work):
// - dsd (forward, backward-data): one output block column per CTA (BN = b), 128 threads, BM = 128
//   rows of N so each W block loaded feeds 128 rows; BK = min(b, 32) keeps shared memory under
//   the 48 KB static limit at b = 128 (2 × 128 × 40 × 2 bytes = 20 KB).
// - sdd (backward-weight): one b × b block per CTA, reducing over N in steps of 32 rows.
// - Tensor cores (mma.sync m16n8k16) for fp16/bf16 at b ≥ 16; fp32 stays exact on the FMA pipes,
//   and b = 8 is below the m16 tile.
//
// Pipelined kernels (16-bit, feature axis last, b ≥ 16): cp.async tiles 3 or 4 stages deep. The
// first version without them (scalar loads, one stage) measured 20-58 TFLOP/s on suite W; the
// pipeline took that to 50-282. Shapes below are the winners of `bsjit-bench --suite sweep` on the
// H200 (docs/PERFORMANCE.md, 2026-11-29), N = 8192, C = K = 4096, d = 0.5 and 0.1:
// - dsd, b ≥ 64: BM = 128, BK = 64, 2×2 warps, 3 stages: 268 TFLOP/s at b = 128 against 242 with
//   BK = 32 and 4 stages (half the barriers per FLOP); 8 warps or BM = 256 were slower (186-248).
// - dsd, b ≤ 32: BM = 256 on 8 warps (8×1), 3 stages: each W tile feeds twice the rows; 131 against
//   120 TFLOP/s at b = 32, d = 0.5, and 53 against 50 at b = 16. Grouping 2-8 whole blocks per stage
//   (group > 1) was predicted to help by cutting barriers per FLOP and measured 13-60% slower.
// - dsd on sm_90a, b ≥ 64: the warp-specialized wgmma kernel, persistent (one wave of CTAs looping
//   over output tiles, so the producer loads the next tile while the consumers store the last),
//   swapped (Yᵀ = Wᵀ·Xᵀ: 2 consumers of 64 features × 256 rows at b = 128, of 64 features × 128
//   rows at b = 64), BM = 256, 4 stages. Sweep on the H200 once the epilogue stored by TMA
//   (TFLOP/s, balanced, d = 0.5 / 0.1, forward and backward-data): b = 128: 720 / 479 and 678 / 426
//   against 714 / 460 and 666 / 413 unswapped with 2 consumers of 128 rows, 683 / 468 and
//   647 / 408 with 4 of 64 rows (the default before); b = 64: 489 / 390 and 462 / 361 against
//   490 / 366 and 442 / 358 and 479 / 350 and 445 / 336. The swapped kernel reads less shared
//   memory per FLOP (m64n256k16 or m64n128k16 against m64n128k16 or m64n64k16) but the gain is small:
//   per step the CTA takes 40-48 KB from L2 for 2.1-4.2 MFLOP, 8-9 TB/s over the GPU at these
//   rates, near the L2-to-SM ceiling the probes measured (9 TB/s).
//   Earlier, with 4 consumer warpgroups of 64 rows and stores from registers: persistent against
//   one tile per CTA (same shape otherwise; forward, ms, b = 128, d = 0.5 / 0.1 / 0.05):
//   0.227 / 0.087 / 0.075 against 0.232 / 0.098 / 0.090 (2 consumers of 128 rows, one tile per
//   CTA); 2 consumers persistent: 0.224 / 0.091 / 0.080. b = 64, d = 0.05: 0.069 against 0.092.
//   Before that, one tile per CTA, 2 consumers of 128 rows (TFLOP/s at d = 0.5 / 0.1):
//   b = 128: 590 / 265 (mma.sync best: 264 / 187; wgmma fed by cp.async with a CTA barrier per
//   stage, best shape: 345 / 220; TMA with 128 rows: 504-510 / 255);
//   b = 64: 445 / 238 (mma.sync: 190 / 152; cp.async wgmma: 270 / 203; TMA with one consumer of
//   128 rows: 398 / 257, the better choice at low density, which the autotuner finds).
//   The cp.async wgmma kernel stays a tuning candidate: there 2-3 CTAs share an SM to hide each
//   one's per-stage barrier, and its best shape (one warpgroup of 128 rows, 3 stages) beat deeper
//   pipelines and bigger tiles.
// - sdd on sm_90a, b ≥ 64: the warp-specialized kernel with one consumer warpgroup holding the
//   whole block (two m64 tiles at b = 128), 4 stages: b = 128, balanced, d = 0.5 / 0.1 / 0.05:
//   0.217 / 0.059 / 0.085 ms against 0.470 / 0.159 / 0.157 for the best mma.sync shape; two
//   consumers of 64 rows: 0.229 / 0.063 / 0.073. b = 64: 0.399 / 0.079 / 0.067 against 0.746 /
//   0.167 / 0.101.
// - sdd: 2×2 warps, BK = 64, 3 stages (313 against 284 TFLOP/s at b = 128, d = 0.5); b = 16 on one
//   warp, BK = 32, 4 stages.
namespace {

// Reduction indices per stage of the dsd wgmma / TMA kernels (DsdWgmmaPlan::kSlice): 64, one
// 128-byte row of X; b at b = 32, whose tiles have rows of 64 bytes swizzled over 64 bytes.
int dsd_slice(int b) { return std::min(b, 64); }

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
                  grouping_ok &&
                  t.stages >= 2 && t.threads <= 512 && t.shared_bytes <= 160 * 1024;
  if (!ok)
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}", tiles_tag(t), to_string(spec.op), b));
  return t;
}

// The Hopper kernel's shape from (bm, warpgroups, stages): warps_m warpgroups of 4 warps, each
// owning bm / warps_m rows (64 or 128: one or two m64 wgmma tiles), or when swapped 64 output
// features of 128 or 256 rows; 64 reduction indices per stage. DsdWgmmaPlan in
// templates/bsjit/matmul.cuh computes the same shared-memory size.
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

// Block rows of a band of sdd_rows_kernel: the shape's band_rows, else one at b ≥ 64 and 64 / b at
// b ≤ 32 (a band of 64 rows, X's box).
std::int64_t band_rows_of(const TileConfig& t, std::int64_t b) {
  return t.band_rows > 0 ? t.band_rows : std::max<std::int64_t>(b, 64) / b;
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
    throw Error(fmt::format("tile shape {} is not valid for {} at block {}", tiles_tag(t), to_string(spec.op), spec.block));
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
  const int stage_bytes = t.bm * 128 + sub * t.columns * 2 * b * b, records = t.stages * (3 + sub * t.columns) * 4;
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
         : t.tma       ? finish_tma(spec, t)
         : t.wgmma     ? finish_wgmma(spec, t)
                       : finish_pipelined(spec, t);
}

TileConfig tiled_shape(int edge, int warpgroups, int stages, int cols = 0) {
  TileConfig t;
  t.wgmma = t.tma = true, t.tile_edge = edge, t.tile_cols = cols, t.warps_m = warpgroups, t.stages = stages;
  return t;
}

TileConfig rows_shape(int row_blocks, int warpgroups, int stages, int band_rows = 0) {
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

TileConfig tma_shape(int bm, int warpgroups, int stages, bool persistent = false, bool swapped = false) {
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

}  // namespace

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
    shapes.insert(shapes.end(), {pipelined_shape(b, 32, 2, 2, 4), pipelined_shape(b, 32, b >= 64 ? 2 : 1, b >= 64 ? 4 : 2, 4),
              pipelined_shape(b, 64, b >= 64 ? 4 : 1, 2, 3), pipelined_shape(b, 32, 1, 1, 6)});
  } else {
    const int wn8 = b >= 64 ? 4 : 1, wm8 = 8 / wn8;  // 8 warps
    const int wn4 = b >= 64 ? 2 : 1, wm4 = 4 / wn4;  // 4 warps
    shapes = {pipelined_shape(128, bk, wm4, wn4, 4), pipelined_shape(128, std::min(b, 64), wm4, wn4, 3),
              pipelined_shape(128, bk, wm8, wn8, 4),
              pipelined_shape(256, bk, wm8, wn8, 3),          pipelined_shape(256, std::min(b, 64), wm8, wn8, 3),
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
      return finish_pipelined(spec, pipelined_shape(64, b >= 64 ? 64 : (b == 16 ? 16 : 32), b >= 64 ? 1 : 4,
                                                    b >= 64 ? 4 : 1, 4));
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
      return finish_pipelined(spec, b >= 64 ? pipelined_shape(128, 64, 2, 2, 3)
                                            : pipelined_shape(256, b == 16 ? 16 : 32, 8, 1, 3));
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

namespace {

// The units of sdd_rows_kernel: bands of `per` block rows (1 at b ≥ 64, 64 / b at b ≤ 32), each
// band's block columns that hold a block in it (ascending) in groups of m, the band's last group
// padded. columns: per unit, the band, then m block columns (-1: an empty slot); blocks: per unit,
// per × m block indices, row-major (-1: none).
struct RowBands {
  std::vector<int> columns, blocks;
  std::int64_t units = 0;
};

RowBands row_bands(const Layout& layout, std::int64_t per, int m) {
  RowBands out;
  const auto& coords = layout.coords();  // row-major: a band's blocks are consecutive
  for (std::size_t i = 0; i < coords.size();) {
    const std::int64_t band = coords[i].first / per;
    std::map<std::int64_t, std::vector<int>> by_column;  // column → its block in each row of the band
    for (; i < coords.size() && coords[i].first / per == band; ++i) {
      auto& slots = by_column[coords[i].second];
      slots.resize(per, -1);
      slots[coords[i].first % per] = static_cast<int>(i);
    }
    for (auto it = by_column.begin(); it != by_column.end();) {
      const std::size_t unit_columns = out.columns.size() + 1, unit_blocks = out.blocks.size();
      out.columns.push_back(static_cast<int>(band));
      out.columns.resize(unit_columns + m, -1);
      out.blocks.resize(unit_blocks + per * m, -1);
      for (int s = 0; s < m && it != by_column.end(); ++s, ++it) {
        out.columns[unit_columns + s] = static_cast<int>(it->first);
        for (std::int64_t r = 0; r < per; ++r) out.blocks[unit_blocks + r * m + s] = it->second[r];
      }
      ++out.units;
    }
  }
  return out;
}

// The units of sdd_cols_kernel: each block column's blocks (rows ascending) in groups of m, the
// column's last group padded. columns: per unit, the block column, then m block rows (-1: an empty
// slot); blocks: per unit, m block indices (-1: none).
RowBands column_groups(const Layout& layout, int m) {
  std::map<std::int64_t, std::vector<std::pair<std::int64_t, int>>> by_column;  // (row, block), rows ascending
  for (std::int64_t i = 0; i < layout.blocks(); ++i)
    by_column[layout.coords()[i].second].push_back({layout.coords()[i].first, static_cast<int>(i)});
  RowBands out;
  for (const auto& [column, blocks] : by_column)
    for (std::size_t j = 0; j < blocks.size(); j += m, ++out.units) {
      out.columns.push_back(static_cast<int>(column));
      for (std::size_t s = j; s < j + m; ++s) {
        out.columns.push_back(s < blocks.size() ? static_cast<int>(blocks[s].first) : -1);
        out.blocks.push_back(s < blocks.size() ? blocks[s].second : -1);
      }
    }
  return out;
}

// How many units column_groups(layout, m) makes, counted without its tables.
std::int64_t column_units(const Layout& layout, int m) {
  std::vector<std::int64_t> in_column(layout.cols(), 0);
  for (auto [r, c] : layout.coords()) ++in_column[c];
  std::int64_t units = 0;
  for (std::int64_t n : in_column) units += (n + m - 1) / m;
  return units;
}

// How many units row_bands(layout, per, m) makes, counted without its tables: each band's distinct
// block columns in groups of m (what the kernel choices compare).
std::int64_t band_units(const Layout& layout, std::int64_t per, int m) {
  const auto& coords = layout.coords();  // row-major: a band's blocks are consecutive
  std::int64_t units = 0;
  std::set<std::int64_t> columns;
  for (std::size_t i = 0; i < coords.size();) {
    const std::int64_t band = coords[i].first / per;
    columns.clear();
    for (; i < coords.size() && coords[i].first / per == band; ++i) columns.insert(coords[i].second);
    units += (static_cast<std::int64_t>(columns.size()) + m - 1) / m;
  }
  return units;
}

// Fraction of the dW tiles' block slots (rows × cols blocks a tile) that hold a block of the layout:
// the useful share of the tiled backward-weight kernel's tensor work.
double tile_fill(const Layout& layout, std::int64_t rows, std::int64_t cols) {
  std::set<std::pair<std::int64_t, std::int64_t>> tiles;
  for (auto [r, c] : layout.coords()) tiles.insert({r / rows, c / cols});
  return tiles.empty() ? 0.0 : static_cast<double>(layout.blocks()) / (static_cast<double>(tiles.size()) * rows * cols);
}

// The order in which the Hopper backward-weight kernels take their units, for L2. CTA p of the P
// resident ones takes units p, p + P, ... (SddSchedule), so each wave of P consecutive units walks N
// together, and what one step of a wave reads from L2 (X's rows of the units' row positions, dY's
// of their column positions) is read from DRAM once if the CTAs stay within a few steps of one
// another. Over many waves they do not: in the order the tables come in (row positions ascending,
// then columns), a wave spans a few row positions and every column, so a step's rows of dY are a
// whole row of dY (24 KB at K = 12288), and CTAs some tens of steps apart need more than L2 holds.
// Instead the units go in super-rows of S row positions, column-major within one: a wave spans S
// row positions × about P / (S · u) of each one's u units, and the rows a step reads fall to
// S · x + K · P / (S · u) features (x: a unit's own features of X at its row position, K: the
// features of all columns), least at S = sqrt(K · P / (u · x)). C = K = 12288, b = 32, 64 × 512
// bands (u = 11 units a band, x = 64): S = 48, 6144 features a step against 13056. Measured (H100,
// bf16, d = 0.25, N = 8192, 2026-12-05; docs/PERFORMANCE.md "Backward-weight in an L2 order"):
// 12288² 78.9 -> 176.6 TFLOP/s at b = 32 and 165.7 -> 396.0 at b = 64, 4096 × 11008 ×1.9, suite
// W's 4096² ×1.08-1.18 at d = 0.25; at d = 0.1 b = 32 from level to 6% slower (three rounds).
// row[i], col[i]: unit i's row and column positions (block rows or bands, first block column).
std::vector<std::int64_t> l2_unit_order(const std::vector<std::int64_t>& row, const std::vector<std::int64_t>& col,
                                        double x_features, double k_features, double ctas) {
  const std::int64_t units = static_cast<std::int64_t>(row.size());
  std::vector<std::int64_t> order(units);
  std::iota(order.begin(), order.end(), 0);
  if (units == 0) return order;
  const std::int64_t rows = *std::max_element(row.begin(), row.end()) + 1;
  const double per_row = static_cast<double>(units) / static_cast<double>(rows);
  const std::int64_t s =
      std::clamp<std::int64_t>(std::llround(std::sqrt(k_features * ctas / (per_row * x_features))), 1, rows);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return std::tuple(row[a] / s, col[a], row[a]) < std::tuple(row[b] / s, col[b], row[b]);
  });
  return order;
}

// Puts units in `order`: each unit's `per_unit` entries of `table` (a table of units) moved with it.
void permute_units(std::vector<int>& table, std::int64_t per_unit, const std::vector<std::int64_t>& order) {
  std::vector<int> out;
  out.reserve(table.size());
  for (std::int64_t u : order) out.insert(out.end(), table.begin() + u * per_unit, table.begin() + (u + 1) * per_unit);
  table = std::move(out);
}

// For each output block column j: pairs (input block, W block index), input block ascending.
// forward: columns of the layout; backward-data (trans_w): rows (the layout of Wᵀ).
Columns output_columns(const Layout& layout, bool trans_w) {
  Columns per_out(trans_w ? layout.rows() : layout.cols());
  const auto& coords = layout.coords();
  for (std::size_t i = 0; i < coords.size(); ++i) {
    auto [r, c] = coords[i];
    if (trans_w) per_out[r].emplace_back(c, static_cast<int>(i));
    else per_out[c].emplace_back(r, static_cast<int>(i));
  }
  for (auto& entries : per_out) std::sort(entries.begin(), entries.end());
  return per_out;
}

// One op's output columns of a layout, built on first use: the layout's choice of tiles and the
// kernel's tables both read them, and a layout of 65536 blocks takes milliseconds to sort.
class LazyColumns {
 public:
  LazyColumns(const Layout& layout, bool trans_w) : layout_(layout), trans_w_(trans_w) {}
  const Columns& get() {
    if (!columns_) columns_ = output_columns(layout_, trans_w_);
    return *columns_;
  }

 private:
  const Layout& layout_;
  bool trans_w_;
  std::optional<Columns> columns_;
};

// SMs of an H100 / H200 (SXM), the GPUs the Hopper kernels' schedules are planned for (a GPU with
// another count runs them correctly, with a less even schedule).
constexpr std::int64_t kSms = 132;

// The small batch's persistent order (N within one row tile: CTA p takes positions p, p + P, ...
// below units, and nothing else): the units dealt most steps first, each to the CTA with the least
// steps so far that has a position left (longest processing time first). balanced_order's classes
// are those of many row tiles, where every CTA meets every position of its class; with one row
// tile a CTA meets only its own positions: on Bernoulli(0.1) layouts of 16384 features at b = 64
// it left the busiest of one CTA per SM 58-61 blocks against a mean of 50-55 (Generator test).
// N = 64, C = K = 16384, d = 0.1 (H200, three rounds, TFLOP/s): b = 32 (its default, persistent,
// 8 stages) Bernoulli backward-data 97 -> 101-103.5, forward 101 -> 102-103, balanced within 1%;
// b = 64 with 8 stages on one CTA per SM, see layout_choice. With more row tiles (N up to
// kSmallBatchRows) the order still covers every unit. balanced_order deals its classes the same way.
// order[position] = unit.
std::vector<int> one_wave_order(const std::vector<std::int64_t>& steps, std::int64_t ctas) {
  const std::int64_t units = static_cast<std::int64_t>(steps.size());
  std::vector<int> order(units), by_steps(units);
  std::iota(by_steps.begin(), by_steps.end(), 0);
  std::stable_sort(by_steps.begin(), by_steps.end(), [&](int a, int b) { return steps[a] > steps[b]; });
  std::vector<std::int64_t> load(ctas, 0), taken(ctas, 0);
  for (int u : by_steps) {
    std::int64_t best = -1;
    for (std::int64_t p = 0; p < ctas; ++p)
      if (p + taken[p] * ctas < units && (best < 0 || load[p] < load[best])) best = p;
    order[best + ctas * taken[best]++] = u;
    load[best] += steps[u];
  }
  return order;
}

// The order of the units of a persistent dsd kernel (output block columns of dsd_tma_kernel, pairs
// or groups of them of the paired and grouped kernels): tile t is the unit at position t % units of
// row tile t / units, and CTA p of P takes tiles p, p + P, ..., so it meets the positions p + kP
// (mod units): with g = gcd(P, units), those of one class p mod g. Units of uneven steps
// (backward-data of a balanced layout, any op of a Bernoulli one, pairs sharing more or fewer
// blocks) load the classes, and so the CTAs, unevenly: simulated on suite W's b = 128 layouts, the
// busiest CTA has 1.07-1.34 times the mean work in order, 1.03 (the waves' rounding) with the
// units dealt most steps first, each to the class holding the fewest. Measured on suite W at
// b = 128 (balanced backward-data, TFLOP/s, in order → balanced): d = 0.5 682 → 719, d = 0.25
// 611 → 647, d = 0.1 348 → 472, d = 0.05 327 → 386; Bernoulli forward 667 → 715, 577 → 641,
// 447 → 542, 365 → 373.
// The CTAs of a class meet its positions in one cycle, each from its own phase (CTA p's i-th tile
// is at the class's position p / g + i · P / g, mod units / g). Dealt most steps first, the long units sit
// together, so the CTAs that start there fall behind the others, the wave spreads over more row
// tiles than L2 holds, and X (dY) is read from DRAM again: Nsight Compute, swapped kernel at b = 128,
// backward-data of the sweep's balanced layout at d = 0.05, 81.6 MB read (69 MB once), 74.1 MB with the
// cycle smoothed (89.0 MB in plain order). Suite W at b = 128, 64 and 32 on the layouts such a run
// drew then (not the full table's), two rounds (A/B in one call): b = 128 backward-data d = 0.05
// 362-365 → 383-387 TFLOP/s (+6%), Bernoulli b = 64 forward d = 0.05 276-279 → 296-297 (+7%),
// Bernoulli b = 128 backward-data d = 0.1 +1.5-1.8%, the rest within noise. On the full table's
// layouts, one run each (849d577 → 70b5640): b = 128 backward-data d = 0.05 385 → 382 (there the old
// order was not behind), Bernoulli b = 64 forward d = 0.05 308 → 322, b = 128 370 → 381.
// Only the TMA kernel's columns are smoothed: the paired kernel's backward-data at b = 64, d = 0.1
// lost 3.5% with it (both layouts), and the grouped kernel's cells moved within noise.
// order[position] = unit.
std::vector<int> balanced_order(const std::vector<std::int64_t>& steps, std::int64_t ctas, bool smooth) {
  const std::int64_t units = static_cast<std::int64_t>(steps.size());
  std::vector<int> order(units);
  if (units == 0) return order;
  const std::int64_t g = std::gcd(ctas, units), per_class = units / g;
  order = one_wave_order(steps, g);  // class c: positions c, c + g, ..., as a CTA's of one row tile
  if (!smooth) return order;
  // With `smooth`, each class's cycle (positions k, k + s, k + 2s, ... of the class, s = P / g mod
  // units / g) keeps its running steps near the straight line: at each, the unit that brings the
  // sum closest to that multiple of the class's mean.
  const std::int64_t stride = (ctas / g) % per_class;
  for (std::int64_t c = 0; c < g; ++c) {
    std::vector<int> left;
    std::int64_t total = 0, sum = 0;
    for (std::int64_t k = 0; k < per_class; ++k) left.push_back(order[c + g * k]), total += steps[order[c + g * k]];
    for (std::int64_t i = 0; i < per_class; ++i) {
      const double line = static_cast<double>(total) * static_cast<double>(i + 1) / static_cast<double>(per_class);
      const auto off = [&](int u) { return std::abs(static_cast<double>(sum + steps[u]) - line); };
      const auto it = std::min_element(left.begin(), left.end(), [&](int a, int b) { return off(a) < off(b); });
      order[c + g * (i * stride % per_class)] = *it;
      sum += steps[*it];
      left.erase(it);
    }
  }
  return order;
}

// A grouped kernel's column order (groups of `columns` consecutive positions) with its groups in
// balanced_order by their steps (chunks of sub input blocks holding a block of the group).
std::vector<int> balanced_groups(const Columns& per_out, const std::vector<int>& order, int columns, int sub,
                                 std::int64_t ctas) {
  const std::size_t groups = (order.size() + columns - 1) / columns;
  std::vector<std::int64_t> steps(groups);
  for (std::size_t gi = 0; gi < groups; ++gi) {
    std::set<int> chunks;
    for (std::size_t at = gi * columns; at < std::min(order.size(), (gi + 1) * static_cast<std::size_t>(columns)); ++at)
      if (order[at] >= 0)
        for (auto [in, w] : per_out[order[at]]) chunks.insert(in / sub);
    steps[gi] = static_cast<std::int64_t>(chunks.size());
  }
  std::vector<int> out;  // whole groups: a short last group's padding (-1) moves with it
  for (int gi : balanced_order(steps, ctas, false))
    for (std::size_t c = 0; c < static_cast<std::size_t>(columns); ++c) {
      const std::size_t at = gi * columns + c;
      out.push_back(at < order.size() ? order[at] : -1);
    }
  return out;
}

// The small batch's columns split (TileConfig::split): the layout's blocks, column j reading LUT
// entries offsets[j] .. offsets[j + 1], dealt to at most max_ctas CTAs (one wave) so that no CTA
// copies much more than the mean share. First whole columns, longest first, each to the CTA with
// the least work so far; then, while the busiest CTA holds more than the cap (the mean share times
// kSlack), the tail of its longest item (what it holds over the cap, at least a minimum piece, at
// most what the least busy CTA has room for, and leaving a minimum piece) moves to the least busy
// CTA: pieces only where a column would hold up the op, each piece's partials added by the
// column's last. Why: at N = 64 a CTA per column waits out its column's blocks at a rate a CTA
// reaches alone, so the longest column sets the time. N = 64, C = K = 16384, d = 0.1 (H200, one
// CTA per column): b = 64 forward 0.0205 ms on the balanced layout (every column 26 blocks)
// against 0.0223 on the Bernoulli one (14-39 blocks), and backward-data, whose columns are the
// balanced layout's rows (12-40), 0.0237; b = 32 0.0304 against 0.0350 and 0.0340 (24-76 blocks;
// 51 on average). Measured (sweep-small, balanced, ms, split / best unsplit): b = 64
// backward-data 0.0223 with 8 stages on one CTA per SM against 0.0234, but 0.0295 with 6 stages
// on two CTAs per SM (more pieces) and 0.0322 with 4 on three; forward (no column cut) 0.0211
// against 0.0200; b = 32 0.0341-0.0404 against 0.0303-0.0332. The pieces cost more than the
// balance gains (their epilogue's fence, arrival and reads of the other partials end the column
// late), so these shapes are tuning candidates, not the default.
struct SplitColumns {
  std::int64_t ctas = 0;
  std::vector<int> cta_items;  // CTA p takes item p, then items cta_items[p] .. cta_items[p + 1]
  // 8 ints per item, as DsdTile (templates/bsjit/matmul.cuh) reads them: position, begin, end,
  // split (-1: a whole column), first_plane, piece, pieces, 0
  std::vector<int> items;
  int splits = 0, planes = 0;  // split columns, and their pieces (the partial planes of a row tile)
};

SplitColumns split_columns(const std::vector<int>& offsets, std::int64_t max_ctas, std::int64_t block, std::int64_t bm) {
  // A piece's partial costs a write and a read of bm × block fp32 (from L2): a piece copies at least
  // twice those bytes of W (b = 32: 16 blocks, b = 64: 8, b = 128: 4), a CTA at least twice that.
  // CTAs: one per column at least (as unsplit), up to a wave.
  constexpr double kSlack = 1.15;
  const std::int64_t columns = static_cast<std::int64_t>(offsets.size()) - 1, total = offsets.back();
  const std::int64_t min_piece = std::max<std::int64_t>(1, 2 * 2 * bm * block * 4 / (2 * block * block));
  SplitColumns out;
  out.ctas = std::clamp<std::int64_t>(std::max(columns, (total + 2 * min_piece - 1) / (2 * min_piece)), 1, max_ctas);
  const auto cap = std::max<std::int64_t>(
      2 * min_piece, static_cast<std::int64_t>(std::ceil(kSlack * static_cast<double>(total) / static_cast<double>(out.ctas))));
  struct Item {
    int column, begin, end;
  };
  std::vector<std::vector<Item>> held(out.ctas);
  std::set<std::pair<std::int64_t, std::int64_t>> loads;  // (blocks, CTA)
  for (std::int64_t p = 0; p < out.ctas; ++p) loads.insert({0, p});
  auto give = [&](std::int64_t p, std::int64_t load, const Item& item) {
    loads.erase({load, p});
    held[p].push_back(item);
    loads.insert({load + item.end - item.begin, p});
  };
  std::vector<int> order(columns);
  std::iota(order.begin(), order.end(), 0);
  auto length = [&](int j) { return offsets[j + 1] - offsets[j]; };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return length(a) > length(b); });
  for (int j : order) {
    const auto [load, p] = *loads.begin();
    give(p, load, {j, offsets[j], offsets[j + 1]});
  }
  while (true) {
    const auto [most, p] = *loads.rbegin();
    const auto [least, q] = *loads.begin();
    if (most <= cap) break;
    auto& mine = held[p];
    auto longest = std::max_element(mine.begin(), mine.end(),
                                    [](const Item& a, const Item& b) { return a.end - a.begin < b.end - b.begin; });
    const std::int64_t tail = std::min(std::max(most - cap, min_piece), cap - least);
    if (tail < min_piece || longest->end - longest->begin < tail + min_piece) break;
    const Item moved{longest->column, static_cast<int>(longest->end - tail), longest->end};
    longest->end = moved.begin;
    loads.erase({most, p});
    loads.insert({most - tail, p});
    give(q, least, moved);
  }
  // CTAs without an item go (each CTA's first item sits at its own index of the table, read at the
  // kernel's start beside its offsets); each CTA's pieces before its whole columns, so that their
  // partials are written, and added by the last, while later items run
  std::erase_if(held, [](const std::vector<Item>& mine) { return mine.empty(); });
  out.ctas = static_cast<std::int64_t>(held.size());
  // each split column's pieces in order, its split and planes numbered by column
  std::map<int, std::vector<std::pair<int, std::int64_t>>> pieces;  // column → (begin, CTA)
  for (std::int64_t p = 0; p < out.ctas; ++p)
    for (const Item& it : held[p]) pieces[it.column].push_back({it.begin, p});
  std::map<std::pair<int, int>, std::array<int, 4>> numbered;  // (column, begin) → split, first plane, piece, pieces
  for (auto& [column, ps] : pieces) {
    std::sort(ps.begin(), ps.end());
    const int q = static_cast<int>(ps.size());
    for (int i = 0; i < q; ++i) numbered[{column, ps[i].first}] = {q > 1 ? out.splits : -1, out.planes, i, q};
    if (q > 1) ++out.splits, out.planes += q;
  }
  std::vector<std::vector<std::array<int, 8>>> entries(held.size());  // the table's rows, per CTA
  for (std::size_t p = 0; p < held.size(); ++p) {
    for (const Item& it : held[p]) {
      const auto& n = numbered.at({it.column, it.begin});
      entries[p].push_back({it.column, it.begin, it.end, n[0], n[1], n[2], n[3], 0});
    }
    std::stable_partition(entries[p].begin(), entries[p].end(), [](const auto& e) { return e[3] >= 0; });
  }
  // tables of one size for every layout of the shape: the items padded to columns + 2 · max_ctas
  // (a moved tail holds at least min_piece blocks, so there are at most total / min_piece ≤
  // 2 · ctas of them), CTA p's first at p, the others from max_ctas on, CTA p's from cta_items[p]
  // to cta_items[p + 1] (max_ctas + 1 offsets)
  out.items.assign(8 * (columns + 2 * max_ctas), 0);
  std::int64_t rest = max_ctas;
  out.cta_items.push_back(static_cast<int>(rest));
  for (std::size_t p = 0; p < entries.size(); ++p) {
    for (std::size_t i = 0; i < entries[p].size(); ++i) {
      const std::int64_t at = i == 0 ? static_cast<std::int64_t>(p) : rest++;
      if (at >= columns + 2 * max_ctas)
        throw Error(fmt::format("internal: more split items than the table holds ({} columns)", columns));
      std::copy(entries[p][i].begin(), entries[p][i].end(), out.items.begin() + 8 * at);
    }
    out.cta_items.push_back(static_cast<int>(rest));
  }
  out.cta_items.resize(max_ctas + 1, out.cta_items.back());
  return out;
}

// CTAs of a pipelined shape one SM holds (227 KB of shared memory, 2048 threads).
std::int64_t ctas_per_sm(const TileConfig& t) {
  return std::clamp<std::int64_t>(227 * 1024 / t.shared_bytes, 1, 2048 / t.threads);
}

// CTAs of a persistent kernel on an H100 / H200: one wave of those the SMs hold.
std::int64_t resident_ctas(const TileConfig& t) { return kSms * ctas_per_sm(t); }

// The share of the blocks that pair_columns' pairs hold both of (their steps copy one X tile for
// two W blocks).
double paired_share(const Columns& per_out) {
  const std::vector<int> order = pair_columns(per_out);
  std::int64_t blocks = 0, shared = 0;
  for (std::size_t p = 0; p + 1 < order.size(); p += 2) {
    blocks += static_cast<std::int64_t>(per_out[order[p]].size());
    if (order[p + 1] < 0) continue;
    blocks += static_cast<std::int64_t>(per_out[order[p + 1]].size());
    std::set<int> first;
    for (auto [in, w] : per_out[order[p]]) first.insert(in);
    for (auto [in, w] : per_out[order[p + 1]]) shared += 2 * static_cast<std::int64_t>(first.count(in));
  }
  return blocks == 0 ? 0.0 : static_cast<double>(shared) / static_cast<double>(blocks);
}

// Backward-weight at b ≥ 64 on Hopper: one block per CTA (sdd_tma_kernel), row groups of 2 or 4
// blocks (sdd_rows_kernel) or, at b = 128, column pairs (sdd_cols_kernel), whichever one wave of CTAs
// (SddSchedule) is predicted to finish first.
// A kernel's units run in waves of P CTAs, each wave taking the time one CTA takes for a unit; the
// units left after the full waves split along N into q pieces, which cost 1 / q of a wave and about
// 0.3 of one more (pipeline fill, partials written, the last piece adding them alone). Measured on
// the H200 (suite W sweep, N = 8192, balanced layouts; µs per wave, CTAs per wave): tma1-bm64-s4 52
// (2 per SM), rows2-tma1-s6 41.5, rows4-tma1-s4 70, tma1-bm128-s4 53, rows2-tma2-s4 (b = 128) 94.
// Row groups copy X's slice once for their blocks: b = 64, d = 0.5 / 0.25 / 0.1 / 0.05, TFLOP/s,
// tma1 / rows2 / rows4: 328 / 413 / 448, 327 / 413 / 427, 338 / 303 / 374, 243 / 254 / 211;
// b = 128, tma1 / rows2: 644 / 730, 619 / 463, 437 / 352, 323 / 264. At b = 64, bands of two block
// rows × 4 block columns holding a block in either (rows4x2-tma2-s4: 128 × 256 on two consumers,
// computed whole, the shape of b = 128's rows2 at 795 × fill) take 88 µs a wave: sweep, TFLOP/s,
// rows4x2 / rows4: d = 0.5 520 / 447 (fill 0.67), 0.25 391 / 426, 0.1 295 / 393, 0.05 196 / 221
// (half a wave). The model picks the fastest of each cell; on suite W's Bernoulli d = 0.5 layout its
// pick of the pairs (3.4 waves) ran 4% under the single rows (4.4 waves of 70 µs), within the
// model's error.
// At b = 128, pairs of a block column's blocks (sdd_cols_kernel, cols2-tma2-s4: a consumer each,
// dY's slice copied once for both) take 90 µs a wave: sweep on suite W's balanced layouts, whose
// block columns of dW hold exactly d · 32 blocks each (so pairs of a column leave no slot empty,
// where a row's pairs pad the odd rows): d = 0.5, 256 units, 2 waves, 771 TFLOP/s (tma1 678, rows2
// 630 on 266 units); d = 0.25, 128 units, one wave, 748 (tma1 641 on 2 waves, rows2 512 on 134
// units); d = 0.1 and 0.05 (64 and 32 units) 405 and 280 against tma1's 460 and 342.
double sdd_waves(std::int64_t units, std::int64_t ctas) {
  const kernels::SddSchedule s(static_cast<int>(units), static_cast<int>(ctas), INT_MAX, 8192 / 64);
  return s.waves + (s.left == 0 ? 0.0 : s.q == 1 ? 1.0 : 1.0 / s.q + 0.3);
}

MatMulSpec sdd_choice(const Layout& layout, const MatMulSpec& spec) {
  if (layout.blocks() == 0) return spec;
  struct Candidate {
    TileConfig shape;
    double wave_us;
    std::int64_t ctas;
  };
  const std::vector<Candidate> candidates = spec.block == 64
                                                ? std::vector<Candidate>{{staged(tma_shape(64, 1, 4)), 52, 264},
                                                                         {staged(rows_shape(2, 1, 6)), 41.5, 132},
                                                                         {staged(rows_shape(4, 1, 4)), 70, 132},
                                                                         {staged(rows_shape(4, 2, 4, 2)), 90, 132}}
                                                : std::vector<Candidate>{{staged(tma_shape(128, 1, 4)), 53, 132},
                                                                         {staged(rows_shape(2, 2, 4)), 94, 132},
                                                                         {staged(cols_shape(2, 2, 4)), 90, 132}};
  double best = 0;
  TileConfig chosen;
  for (const auto& c : candidates) {
    const std::int64_t m = std::max(1, c.shape.row_blocks);
    const std::int64_t units = c.shape.col_blocks > 0
                                   ? column_units(layout, c.shape.col_blocks)
                                   : band_units(layout, band_rows_of(c.shape, spec.block), static_cast<int>(m));
    const double us = c.wave_us * sdd_waves(units, c.ctas);
    if (best == 0 || us < best) best = us, chosen = c.shape;
  }
  MatMulSpec out = spec;
  out.tiles = finish_tma(spec, chosen);
  return out;
}

// Backward-weight at b ≤ 32 on Hopper: whichever is predicted to finish first, in µs at suite W's
// N = 8192 (every candidate's time grows alike with N):
// - tiles of dW computed whole (sdd_tiled_kernel), at a rate times the tiles' fill (their useful
//   share of tensor work): about 790 × fill TFLOP/s for 128 × 256 tiles on two consumers, 660 ×
//   fill for 128 × 128 on one, 335 × fill for 64 × 64 (b = 32, d = 0.1, fill 0.29: 96; b = 16,
//   d = 0.1, fill 0.12: 42). The 128 × 256 tiles copy 384 rows of X and dY a step for 2 × 64 ×
//   128 × 256 FLOP, where 128 × 128 copy 256 for half of that: 1.33 × the FLOP per byte, and
//   what a TMA box row costs bounds these kernels (docs/PERFORMANCE.md, v25). Sweep on the H200
//   (suite W's balanced layouts, 2026-11-30), TFLOP/s, 128 × 256 (s4) / 128 × 128 (s4): b = 32
//   d = 0.5 399 / 339, d = 0.25 200 / 165, d = 0.1 82 / 81; b = 16 d = 0.5 398 / 331, d = 0.25
//   199 / 166, d = 0.1 81 / 70, d = 0.05 41 / 35: 795 × fill at every cell (3 stages: 0.94 of 4);
// - row bands (sdd_rows_kernel: 64 rows × the band's columns holding a block, gathered b at a
//   time), in waves of 132 CTAs (sdd_waves), µs per wave measured on suite W's sweep (one
//   device call, 2026-11-30): b = 32, 64 × 256 (rows8-tma2-s4) 86-91, 64 × 512 (rows16-tma2-s3)
//   121-166 (150 taken); b = 16, 64 × 256 (rows16-tma2-s4, 16 dY boxes of 2 KB a step) 145-154,
//   64 × 512 (rows32-tma2-s3) 249-279 (260 taken). Their steps move 57 (64 × 512) or 51 FLOP per
//   byte from L2 at a fill of 0.35-0.65, about 480 TFLOP/s dense-equivalent at b = 32: the
//   L2-to-SM ceiling. Measured, TFLOP/s, tiled (best E) / rows8 / rows16 at b = 32: d = 0.5 322 /
//   242 / 239, d = 0.25 160 / 190 / 208, d = 0.1 101 / 162 / 196, d = 0.05 88 / 152 / 106 (69
//   units: half a wave); b = 16, tiled / rows16 / rows32: 319 / 121 / 128, 157 / 76 / 82,
//   64 / 61 / 55, 34 / 46 / 56;
// - the mma.sync kernel (one block per CTA): 75-78 TFLOP/s at b = 32, 29-31 at b = 16, whatever
//   the density.
MatMulSpec sdd_narrow_choice(const Layout& layout, const MatMulSpec& spec) {
  const int b = spec.block;
  const double flops = 2.0 * 8192 * static_cast<double>(layout.blocks()) * b * b;
  auto at = [&](double tflops) { return tflops > 0 ? flops / (tflops * 1e6) : 1e30; };  // µs
  auto waves_of = [&](int m) { return sdd_waves(band_units(layout, band_rows_of(TileConfig{}, b), m), kSms); };
  const double tiled128 = at(660.0 * tile_fill(layout, 128 / b, 128 / b)),
               tiled64 = at(335.0 * tile_fill(layout, 64 / b, 64 / b)),
               tiled_wide = at(790.0 * tile_fill(layout, 128 / b, 256 / b)), mma_sync = at(b == 32 ? 76.0 : 30.0);
  const double rows256 = (b == 32 ? 89.0 : 150.0) * waves_of(256 / b),
               rows512 = (b == 32 ? 150.0 : 260.0) * waves_of(512 / b);
  const double best = std::min({tiled128, tiled64, tiled_wide, mma_sync, rows256, rows512});
  MatMulSpec chosen = spec;
  if (best == tiled128) return spec;  // the default
  // staged where the shared memory fits: not the 64 × 512 bands (3 stages of 72 KB)
  if (best == tiled64)
    chosen.tiles = finish_tma(spec, staged(tiled_shape(64, 1, 4)));
  else if (best == tiled_wide)
    chosen.tiles = finish_tma(spec, staged(tiled_shape(128, 2, 4, 256)));
  else if (best == rows256)
    chosen.tiles = finish_tma(spec, staged(rows_shape(256 / b, 2, 4)));
  else if (best == rows512) chosen.tiles = finish_tma(spec, rows_shape(512 / b, 2, 3));
  else chosen.wgmma = false;  // the mma.sync kernel, the same on every target
  return chosen;
}

// The heuristic's tile choice for this layout (an explicit spec.tiles is taken as it is).
//
// Forward and backward-data at b = 64 on Hopper (N above the small batch) pair output block columns
// that share input blocks (dsd_paired_kernel) where that pays. Sweep on the H200 (suite W, balanced,
// TFLOP/s, the paired kernel pair2-bm256-s4 against the swapped tma2-bm256-s4-p-sw; in brackets
// paired_share, the share of the blocks in steps that hold both columns' blocks): forward d = 0.5
// 609 / 534 (0.62), d = 0.25 515 / 497 (0.44), d = 0.1 394 / 410 (0.37), d = 0.05 290 / 299 (0.36);
// backward-data 599 / 460, 509 / 442, 396 / 378, 274 / 257 (0.58, 0.39, 0.29, 0.28). So
// backward-data is always paired (the swapped kernel's backward-data ran 8-14% under its forward,
// the paired one within 6%: not from the sharing alone, and not explained), the forward where the
// share is 0.4 or more.
//
// At b = 32 the grouped kernel (default) copies an X tile of 256 rows × 64 indices per step, a step
// being a chunk of two input blocks holding a block of any of the group's 4 columns; the unswapped
// TMA kernel copies 256 rows × 32 indices per block. The grouped kernel's steps per block grow as
// the density falls (balanced, suite W, columns grouped by group_by_chunks: 0.24 at d = 0.5, 0.40 at
// 0.25, 0.57 at 0.1, 0.64 at 0.05). Sweep, TFLOP/s, grouped grp2-bm256-s4 against the TMA kernel
// tma2-bm256-s4-p, forward and backward-data: d = 0.25 277 / 200 and 275 / 201, d = 0.1 204 / 186
// and 204 / 183, d = 0.05 158 / 155 and 155 / 148 (since the grouped kernel's zeros come from a warp's
// stores and its steps convert no pointers; before, 0.1 179 / 186 and 0.05 142 / 154 forward). So the
// TMA kernel where the grouped one would take more than 0.7 steps per block (not measured past 0.64).
//
// The small batch at b = 64 (one CTA per output block column by default) runs its columns
// persistent on one CTA per SM with 8 stages where they are uneven: a lone CTA streams its column
// at the rate its own stages allow, so with a CTA per column the longest column sets the time,
// while one wave of CTAs dealt the columns longest first (one_wave_order) evens the CTAs' shares.
// N = 64, C = K = 16384, d = 0.1 (H200, three rounds, TFLOP/s, one CTA a column with 6 stages, two
// per SM, against tma1-bm64-s8-p): balanced forward (every column 26 blocks) 165-170 against
// 162-165, balanced backward-data (12-40) 147-148 against 162-163, Bernoulli forward (14-39)
// 152-155 against 160-163, Bernoulli backward-data 152-153 against 161-164; 10 and 12 stages 3-4%
// under 8, and 12 stages in balanced_order 138. So persistent where the longest column holds over
// kUnevenColumns times the mean. Between them (2026-12-03, sweep-small -k skewP, columns of two
// lengths, two runs, forward ms, s4 against s8-p): longest 1.1× the mean 0.0200-0.0203 against
// 0.0212-0.0214, 1.2× 0.0209-0.0214 against 0.0212-0.0214, 1.3× 0.0215-0.0218 against 0.0212,
// 1.45× 0.0226-0.0227 against 0.0215-0.0217: the crossing near 1.2-1.3. At b = 32 (persistent with 8
// stages by default) even columns run a CTA per column with 6 stages: 2026-12-03, sweep-small, two
// runs, ms, s6 against s8-p: balanced forward (every column 51 blocks) 0.0298-0.0301 against
// 0.0307-0.0312; where the columns are uneven s8-p wins (balanced backward-data 0.0336-0.0342 against
// 0.0332-0.0335, Bernoulli forward 0.0332-0.0334 against 0.0329-0.0330).
constexpr double kUnevenColumns = 1.25;

// columns: the layout's output columns for spec.op (LazyColumns).
MatMulSpec layout_choice(const Layout& layout, const MatMulSpec& spec, LazyColumns& columns) {
  if (spec.tiles) return spec;
  if (spec.op != Op::backward_weight) {
    const TileConfig t = choose_tiles(spec);
    if (spec.small_batch && (spec.block == 64 || spec.block == 32) && t.tma && layout.blocks() > 0) {
      const Columns& per_out = columns.get();
      std::size_t longest = 0;
      for (const auto& c : per_out) longest = std::max(longest, c.size());
      const double mean = static_cast<double>(layout.blocks()) / static_cast<double>(per_out.size());
      const bool even = static_cast<double>(longest) <= kUnevenColumns * mean;
      if (even == (spec.block == 64)) return spec;  // the default: b = 64 a CTA per column, b = 32 persistent
      MatMulSpec chosen = spec;
      chosen.tiles = finish_tma(spec, even ? tma_shape(64, 1, 6) : tma_shape(64, 1, 8, true));
      return chosen;
    }
    if (t.columns > 0 && spec.block == 32 && layout.blocks() > 0) {
      const Columns& per_out = columns.get();
      const std::int64_t steps = grouped_steps(per_out, group_by_chunks(per_out, t.columns, 2), t.columns, 2);
      if (static_cast<double>(steps) <= 0.7 * static_cast<double>(layout.blocks())) return spec;
      MatMulSpec chosen = spec;
      chosen.tiles = finish_tma(spec, tma_shape(256, 2, 4, true));
      return chosen;
    }
    if (spec.block != 64 || !t.tma || !t.swapped || spec.small_batch) return spec;
    if (spec.op == Op::forward && paired_share(columns.get()) < 0.4) return spec;
    MatMulSpec chosen = spec;
    chosen.tiles = finish_paired(spec, paired_shape(256, 2, 4));
    return chosen;
  }
  if (spec.small_batch) return spec;
  const TileConfig t = choose_tiles(spec);
  if (t.tma && t.tile_edge == 0) return sdd_choice(layout, spec);
  if (t.tile_edge == 0 || layout.blocks() == 0) return spec;
  return sdd_narrow_choice(layout, spec);
}

}  // namespace

GeneratedSource generate_matmul(const Layout& layout, const MatMulSpec& requested) {
  LazyColumns columns(layout, requested.op == Op::backward_data);
  const MatMulSpec spec = layout_choice(layout, requested, columns);
  GeneratedSource g;
  g.tiles = choose_tiles(spec);
  const TileConfig& t = g.tiles;
  const std::int64_t b = spec.block;
  const bool sdd = spec.op == Op::backward_weight;
  const bool trans_w = spec.op == Op::backward_data;
  const std::int64_t C = layout.rows() * b, K = layout.cols() * b;
  g.in_features = spec.op == Op::backward_data ? K : C;
  g.out_features = spec.op == Op::backward_data ? C : K;
  g.label = kernel_label(spec);

  std::string tables;
  // grouped kernel: see grouped_tables; under 0.9 its consumers skip the empty sub-blocks
  // (kSkipEmpty; the measurements that set 0.9 are in matmul_grouped.cuh)
  double sub_fill = 1.0;
  std::int64_t out_blocks = 0;  // dsd: output block columns
  std::int64_t planes = 0;      // sdd on Hopper: workspace planes (SddSchedule)
  if (sdd) {
    // (row, col) of every nonzero block, in block order; tiled: of every E × E tile holding a
    // block, with the block indices of each tile.
    std::vector<int> coords, tile_blocks;
    std::int64_t units = layout.blocks(), edge = b;  // units of dW (blocks, tiles or row bands); tile edge
    if (t.tile_edge > 0) {
      edge = t.tile_edge;
      const std::int64_t per = edge / b, per_col = t.bn / b;  // blocks along a tile's height and width
      std::map<std::pair<std::int64_t, std::int64_t>, std::vector<int>> tiles;
      for (std::int64_t i = 0; i < layout.blocks(); ++i) {
        auto [r, c] = layout.coords()[i];
        auto& slots = tiles[{r / per, c / per_col}];
        slots.resize(per * per_col, -1);
        slots[(r % per) * per_col + c % per_col] = static_cast<int>(i);
      }
      for (auto& [rc, slots] : tiles) {
        coords.push_back(static_cast<int>(rc.first)), coords.push_back(static_cast<int>(rc.second));
        tile_blocks.insert(tile_blocks.end(), slots.begin(), slots.end());
      }
      units = static_cast<std::int64_t>(tiles.size());
    } else if (t.row_blocks > 0 || t.col_blocks > 0) {
      RowBands bands =
          t.row_blocks > 0 ? row_bands(layout, band_rows_of(t, b), t.row_blocks) : column_groups(layout, t.col_blocks);
      coords = std::move(bands.columns), tile_blocks = std::move(bands.blocks), units = bands.units;
    } else {
      coords.reserve(2 * layout.blocks());
      for (auto& [r, c] : layout.coords()) coords.push_back(r), coords.push_back(c);
      if (t.tma)  // the block of each unit, once the units are reordered (l2_unit_order)
        for (std::int64_t i = 0; i < layout.blocks(); ++i) tile_blocks.push_back(static_cast<int>(i));
    }
    if (t.tma && units > 0) {  // units in an order that keeps a wave's reads in L2 (l2_unit_order)
      // per unit: coords' and tile_blocks' entries; its row and column positions, the features of X
      // at its row position and the features of the other operand across all positions
      const std::int64_t per_coords = static_cast<std::int64_t>(coords.size()) / units,
                         per_blocks = static_cast<std::int64_t>(tile_blocks.size()) / units;
      std::vector<std::int64_t> row(units), col(units);
      double x_features = static_cast<double>(b), k_features = static_cast<double>(K);
      for (std::int64_t u = 0; u < units; ++u) {
        row[u] = coords[u * per_coords];
        col[u] = coords[u * per_coords + 1];
      }
      if (t.tile_edge > 0) x_features = static_cast<double>(t.tile_edge);
      if (t.row_blocks > 0) x_features = static_cast<double>(band_rows_of(t, b) * b);
      if (t.col_blocks > 0) k_features = static_cast<double>(C);  // a block column's dY, its rows of X gathered
      const std::vector<std::int64_t> order =
          l2_unit_order(row, col, x_features, k_features, static_cast<double>(resident_ctas(t)));
      permute_units(coords, per_coords, order);
      permute_units(tile_blocks, per_blocks, order);
    }
    g.grid_x = units;
    g.rows_per_cta = 0;
    // Split N when the layout has too few blocks to fill the GPU, up to one wave of CTAs (the
    // SMs of an H100/H200, 132, times the CTAs one SM holds at this shared-memory size), and only
    // for shapes small enough that 4 or more share an SM: one such CTA leaves its SM idle much of
    // the time. Measured on the H200, suite W, backward-weight (TFLOP/s, unsplit → split):
    //   b = 64, d = 0.05, 205 blocks, 4 CTAs/SM, 2 splits: 107 → 137-140
    //   b = 128, d = 0.1, 102 blocks, 2 CTAs/SM: 172 → 158 (2 splits), 128 (3 splits)
    //   b = 128, d = 0.05, 51 blocks: 116 → 127 (5 splits), 89 (6); Bernoulli layouts lost 8-11%
    // so the big b = 128 tile, which nearly fills an SM alone, is not split. The last split of each
    // block adds the partials in split order: deterministic.
    // The Hopper kernels (t.tma) instead run one wave of CTAs over their units (SddSchedule in
    // templates/bsjit/sdd_schedule.cuh): whole units in waves, those left over from the last full wave
    // split along N among the CTAs that would idle. The runtime launches as many CTAs as the GPU holds;
    // the workspace holds the partials the schedule needs on an H100 / H200 (144 SMs at most).
    // Either kind's workspace: kernels::kSplitCounters arrival counters (one per leftover unit, or
    // per split block), then the partials (templates/bsjit/sdd_schedule.cuh).
    const std::int64_t per_sm = t.pipelined ? ctas_per_sm(t) : 1;
    std::int64_t counters = 0, partials = 0;  // partials: fp32 values, 0 where the kernel does not split
    if (t.tma) {
      g.persistent = true;
      planes = sdd_kernel_planes(units, per_sm);
      counters = 144 * per_sm;  // leftover units: fewer than the CTAs
      partials = planes * t.bm * t.bn;
    } else if (t.pipelined && units > 0 && per_sm >= 4) {
      g.splits = static_cast<int>(std::clamp<std::int64_t>(kSms * per_sm / units, 1, 8));
      counters = units;
      if (g.splits > 1) partials = static_cast<std::int64_t>(g.splits) * t.bm * t.bn * units;
    }
    if (partials > 0) {
      if (counters > kernels::kSplitCounters)
        throw Error(fmt::format("internal: {} split counters needed, the workspace holds {}", counters,
                                kernels::kSplitCounters));
      g.workspace_bytes = (kernels::kSplitCounters + partials) * 4;
    }
    tables = t.row_blocks > 0
                 ? fmt::format(
                       "// Units of {} block columns of a band of {} block row(s): per unit the band, then its\n"
                       "// block columns (-1: an empty slot), and the block index at each (row of the band,\n"
                       "// column) (row-major; -1: none).\n",
                       t.row_blocks, band_rows_of(t, b))
             : t.col_blocks > 0
                 ? fmt::format(
                       "// Units of {} blocks of a block column: per unit the block column, then its block\n"
                       "// rows (-1: an empty slot), and the block index of each (-1: none).\n",
                       t.col_blocks)
             : t.tile_edge > 0 ? fmt::format(
                                     "// (tile row, tile column) of each {} × {} tile of dW holding a block, and "
                                     "the\n// block index of each block of the tile (row-major; -1: none).\n",
                                     edge, t.bn)
             : t.tma ? std::string(
                           "// (block row, block column) of each unit's block of W, and the block's index,\n"
                           "// in the order the CTAs take the units.\n")
                     : std::string("// (block row, block column) of each nonzero block of W, in block order.\n");
    tables += add_table(g.tables, "kCoords", std::move(coords));
    if (t.tma) tables += add_table(g.tables, "kTileBlocks", std::move(tile_blocks));
  } else {
    // For each output block column j: pairs (input block, W block index), input block ascending.
    // forward: columns of the layout; backward-data: rows (the layout of Wᵀ).
    out_blocks = trans_w ? layout.rows() : layout.cols();
    const Columns& per_out = columns.get();
    g.rows_per_cta = t.bm;
    if (t.paired) {
      tables = grouped_tables(per_out, balanced_groups(per_out, pair_columns(per_out), 2, 1, resident_ctas(t)), 2, 1, 2,
                              g.grid_x, sub_fill, g.tables);
    } else if (t.columns > 0) {
      const int sub = static_cast<int>(64 / b);
      tables = grouped_tables(
          per_out, balanced_groups(per_out, group_by_chunks(per_out, t.columns, sub), t.columns, sub, resident_ctas(t)),
          t.columns, sub, t.warps_m, g.grid_x, sub_fill, g.tables);
    } else {
      // the persistent TMA kernel takes the columns in a balanced order (balanced_order), the
      // others in order
      std::vector<int> order(out_blocks), offsets{0}, lut;
      std::iota(order.begin(), order.end(), 0);
      if (t.tma && t.persistent && !t.split) {
        std::vector<std::int64_t> steps;
        for (const auto& entries : per_out) steps.push_back(static_cast<std::int64_t>(entries.size()));
        order =
            spec.small_batch ? one_wave_order(steps, resident_ctas(t)) : balanced_order(steps, resident_ctas(t), true);
      }
      lut.reserve(2 * layout.blocks());
      for (int c : order) {
        for (auto& [in, w] : per_out[c]) lut.push_back(in), lut.push_back(w);
        offsets.push_back(static_cast<int>(lut.size() / 2));
      }
      g.grid_x = out_blocks;
      tables =
          "// The output block column at position j, kOutColumns[j], reads entries kLutOffsets[j] ..\n"
          "// kLutOffsets[j+1] of kLut, each a pair (input block, W block index).\n";
      if (t.split) {
        // the small batch's columns split: grid x is the CTAs the blocks are dealt to (split_columns)
        const std::int64_t max_ctas = resident_ctas(t), row_tiles = (kSmallBatchRows + t.bm - 1) / t.bm;
        SplitColumns split = split_columns(offsets, max_ctas, b, t.bm);
        g.grid_x = split.ctas;
        g.split = true;
        g.max_rows = kSmallBatchRows;
        if (row_tiles * max_ctas > kernels::kSplitCounters)
          throw Error(fmt::format("internal: {} split counters needed, the workspace holds {}", row_tiles * max_ctas,
                                  kernels::kSplitCounters));
        if (split.planes > 0)
          g.workspace_bytes = (kernels::kSplitCounters + row_tiles * split.planes * t.bm * b) * 4;
        tables += "// The small batch's CTAs (one wave): CTA p takes item p of kItems, then items kCtaItems[p] ..\n"
                  "// kCtaItems[p+1]: (position, first entry, end, split column or -1, its first partial plane,\n"
                  "// piece, pieces, 0).\n";
        tables += add_table(g.tables, "kCtaItems", std::move(split.cta_items));
        tables += add_table(g.tables, "kItems", std::move(split.items));
        tables += add_table(g.tables, "kSplitPlanes", {split.planes});
      }
      tables += add_table(g.tables, "kOutColumns", std::move(order));
      // One CTA per tile (the TMA kernel not persistent: the small batch at b >= 64), whose threads all
      // read their column's two offsets first, and only then its entries and its first copies: the
      // offsets in constant memory. N = 64, C = K = 16384, d = 0.1, b = 64, three rounds, main and this
      // interleaved in one call: balanced forward 0.0207-0.0210 -> 0.0205-0.0207 ms, backward-data
      // 0.0234-0.0238 -> 0.0232-0.0233, Bernoulli forward 0.0223-0.0226 -> 0.0221-0.0225 (b = 32,
      // persistent, level). Up to 16 KB of them: constant memory holds 64 KB a module.
      const bool offsets_constant =
          t.tma && !t.persistent && capacity(DeviceTable{"", offsets}) * sizeof(int) <= 16 * 1024;
      tables += add_table(g.tables, "kLutOffsets", std::move(offsets),
                          offsets_constant ? TableStorage::constant : TableStorage::array);
      tables += add_table(g.tables, "kLut", std::move(lut));
    }
  }

  // The layout's counts the kernel loops over, as a table (not constants), so the source serves
  // every layout of the shape: dW units and workspace planes, or column groups (pairs). Except the
  // group count at b = 16, which stays a constant: read from the table, the b = 16 grouped kernel
  // lost 6% at d = 0.5 and 0.25 (suite W forward 375 -> 353 TFLOP/s, backward-data the same; b >= 32
  // within ±1%). Little sharing is lost: layouts of one shape mostly have the same group count at
  // b = 16 (64 × 64 blocks, d = 0.05-0.5: 71 of 80 layouts and their permuted columns share sources).
  const bool grouping = t.paired || t.columns > 0;
  const bool group_table = grouping && spec.block > 16;
  if (sdd && t.tma)
    tables += add_table(g.tables, "kCounts", {static_cast<int>(g.grid_x), static_cast<int>(planes)});
  else if (group_table)
    tables += add_table(g.tables, "kCounts", {static_cast<int>(g.grid_x)});
  const std::string groups =
      !grouping     ? std::string()
      : group_table ? std::string("  __device__ static int groups() { return kCounts[0]; }\n")
                    : fmt::format("  __device__ static constexpr int groups() {{ return {}; }}\n", g.grid_x);
  const bool slots = t.tma;  // sdd tables of block slots per unit (one block a unit: sdd_tma_kernel's)
  const std::string accessors =
      (sdd && t.tma ? std::string("  __device__ static const int* counts() { return kCounts; }\n") : groups) +
      (sdd        ? (slots ? "  __device__ static const int* coords() { return kCoords; }\n"
                             "  __device__ static const int* tile_blocks() { return kTileBlocks; }\n"
                           : "  __device__ static const int* coords() { return kCoords; }\n")
       : grouping ? "  __device__ static const int* group_steps() { return kGroupSteps; }\n"
                    "  __device__ static const int* steps() { return kSteps; }\n"
                    "  __device__ static const int* group_columns() { return kGroupColumns; }\n"
                  : std::string("  __device__ static const int* out_columns() { return kOutColumns; }\n"
                                "  __device__ static const int* lut_offsets() { return kLutOffsets; }\n"
                                "  __device__ static const int* lut() { return kLut; }\n") +
                        (t.split ? "  __device__ static const int* cta_items() { return kCtaItems; }\n"
                                   "  __device__ static const int* items() { return kItems; }\n"
                                   "  __device__ static const int* split_planes() { return kSplitPlanes; }\n"
                                 : ""));
  const char* kernel = t.paired           ? "dsd_paired_kernel"
                       : t.columns > 0    ? "dsd_grouped_kernel"
                       : t.tile_edge > 0  ? "sdd_tiled_kernel"
                       : t.row_blocks > 0 ? "sdd_rows_kernel"
                       : t.col_blocks > 0 ? "sdd_cols_kernel"
                       : t.tma            ? (sdd ? "sdd_tma_kernel" : "dsd_tma_kernel")
                       : t.wgmma          ? "dsd_wgmma_kernel"
                       : t.pipelined      ? (sdd ? "sdd_pipelined_kernel" : "dsd_pipelined_kernel")
                                          : (sdd ? "sdd_kernel" : "dsd_kernel");
  g.shared_bytes = t.shared_bytes;
  g.dtype = spec.dtype;
  g.persistent = g.persistent || t.persistent;
  if (t.tma && sdd) {  // X and dY: 64 rows of N × 64 features per box; row bands at b ≤ 32: dY's boxes b wide
    // staged: dW as [blocks · b, b], stored in boxes of a warp's 16 rows × min(b, 64) features
    const int dy_box = t.row_blocks > 0 ? static_cast<int>(std::min<std::int64_t>(b, 64)) : 64;
    g.tensor_maps = {{g.in_features, 0, 64, 64}, {g.out_features, 0, dy_box, 64, 2 * dy_box}};
    const int dw_box = static_cast<int>(std::min<std::int64_t>(b, 64));
    if (t.staged) g.tensor_maps.push_back({b, layout.blocks() * b, dw_box, 16, 2 * dw_box});
  } else if (t.columns > 0)  // X (or dY): 64 features × BM rows; W as [blocks · b, b]: one block, rows of 2b bytes
    g.tensor_maps = {{g.in_features, 0, 64, t.bm},
                     {b, layout.blocks() * b, static_cast<int>(b), static_cast<int>(b), static_cast<int>(2 * b)}};
  else if (t.tma) {  // X (or dY): 64 features × BM rows; W as [blocks · b, b]: 64 rows, or the whole block for Wᵀ;
                     // Y (or dX) stored in boxes of 64 outputs × 16 rows (a warp's), or 64 rows when swapped.
                     // b = 32: 32 wide, swizzled over 64 bytes.
    const int slice = dsd_slice(static_cast<int>(b)), swizzle = 2 * slice;
    g.tensor_maps = {{g.in_features, 0, slice, t.bm, swizzle},
                     {b, layout.blocks() * b, slice, trans_w ? static_cast<int>(b) : slice, swizzle},
                     {g.out_features, 0, slice, t.swapped ? 64 : 16, swizzle}};
  }
  g.name_expression = fmt::format("bsjit::kernels::{}<bsjit_generated::Config>", kernel);
  g.source = fmt::format(
      "// Generated by bsjit: {label}\n"
      "// layout [{rows}, {cols}] blocks (its blocks are in the tables: one source serves every layout of\n"
      "// this shape whose tables have the same sizes)\n"
      "#include \"bsjit/{header}\"\n"
      "\n"
      "namespace bsjit_generated {{\n"
      "\n"
      "{tables}"
      "\n"
      "struct Config {{\n"
      "  using T = {type};\n"
      "  static constexpr int kBlock = {b};\n"
      "  static constexpr int kBM = {bm}, kBN = {bn}, kBK = {bk}, kStride = {stride};\n"
      "  static constexpr int kThreads = {threads};\n"
      "  static constexpr bool kTensorCores = {tc};\n"
      "  static constexpr int kWarpsM = {wm}, kWarpsN = {wn};\n"
      "  static constexpr int kTM = {tm}, kTN = {tn};\n"
      "  static constexpr int kStages = {stages}, kSharedBytes = {smem}, kGroup = {group}, kSplits = {splits};\n"
      "  static constexpr bool kFeatureLast = {last};\n"
      "  static constexpr bool kTransW = {trans};\n"
      "  static constexpr long long kInDim = {in_dim}, kOutDim = {out_dim};\n"
      "  static constexpr int kOutBlocks = {out_blocks};  // output block columns (dsd)\n"
      "  static constexpr bool kPersistent = {persistent}, kSwapped = {swapped}, kSplit = {split};\n"
      "  static constexpr bool kPlain = {plain};  // built for calls with neither accumulate nor gate\n"
      "{grouped}"
      "{units}"
      "{accessors}"
      "}};\n"
      "{smem_check}"
      "\n"
      "}}  // namespace bsjit_generated\n",
      fmt::arg("label", g.label), fmt::arg("rows", layout.rows()), fmt::arg("cols", layout.cols()),
      fmt::arg("tables", tables), fmt::arg("type", device_type(spec.dtype)), fmt::arg("b", b), fmt::arg("bm", t.bm),
      fmt::arg("bn", t.bn), fmt::arg("bk", t.bk), fmt::arg("stride", t.stride), fmt::arg("threads", t.threads),
      fmt::arg("tc", t.tensor_cores ? "true" : "false"), fmt::arg("wm", t.warps_m), fmt::arg("wn", t.warps_n),
      fmt::arg("tm", t.tm), fmt::arg("tn", t.tn), fmt::arg("stages", t.stages), fmt::arg("smem", t.shared_bytes),
      fmt::arg("group", t.group), fmt::arg("splits", g.splits),
      fmt::arg("last", spec.feature_axis == FeatureAxis::last ? "true" : "false"),
      fmt::arg("trans", trans_w ? "true" : "false"), fmt::arg("in_dim", g.in_features),
      fmt::arg("out_dim", g.out_features), fmt::arg("out_blocks", out_blocks),
      fmt::arg("persistent", t.persistent ? "true" : "false"), fmt::arg("swapped", t.swapped ? "true" : "false"),
      fmt::arg("split", t.split || planes > 0 ? "true" : "false"), fmt::arg("plain", spec.plain ? "true" : "false"),
      fmt::arg("accessors", accessors),
      fmt::arg("header", t.paired        ? "matmul_paired.cuh"
                         : t.columns > 0 ? "matmul_grouped.cuh"
                                         : "matmul.cuh"),
      fmt::arg("units",
               sdd && t.tma ? fmt::format("  static constexpr bool kStagedStore = {};\n", t.staged) : std::string()),
      fmt::arg(
          "grouped",
          t.paired          ? std::string("  static constexpr int kColumns = 2;  // column pairs\n")
          : t.columns > 0   ? fmt::format("  static constexpr int kColumns = {};  // column groups\n"
                                            "  static constexpr bool kSkipEmpty = {};  // sub-block fill under 0.9\n",
                                          t.columns, sub_fill < 0.9)
          : t.tile_edge > 0 ? fmt::format("  static constexpr int kTileEdge = {}, kTileCols = {};  // dW tiles: rows, "
                                          "features\n",
                                          t.tile_edge, t.bn)
          : t.row_blocks > 0
              ? fmt::format("  static constexpr int kRowBlocks = {}, kBandRows = {};  // block columns per unit "
                            "and block rows of a row band\n",
                            t.row_blocks, band_rows_of(t, b))
          : t.col_blocks > 0
              ? fmt::format("  static constexpr int kColBlocks = {};  // block rows per unit (of one block column)\n",
                            t.col_blocks)
              : ""),
      fmt::arg("smem_check", t.pipelined
                                 ? ""
                                 : "\nstatic_assert(bsjit::kernels::SmemBytes<Config>::value <= 48 * 1024, "
                                   "\"static shared memory is 48 KB\");\n"));
  return g;
}

// Split support (the pieces' partials and their reduction: a third of the kernel's code and of its
// cold compile) only where the schedule splits on the H100 / H200's 132 SMs. NVRTC alone, 2-core
// machine, best of 3, plain kernels of suite W's Bernoulli d = 0.25 layouts (which do not split),
// with → without: tile128x256 at b = 16 537 → 328 ms, rows16 at b = 32 550 → 322, b = 128 363 → 168
// (2026-12-04). Elsewhere planes = 0, so that SddSchedule takes every unit whole on any GPU: on
// one of other SM counts the last wave may then run a few units alone.
std::int64_t sdd_kernel_planes(std::int64_t units, std::int64_t per_sm) {
  const bool splits =
      units > 0 &&
      kernels::SddSchedule(static_cast<int>(units), static_cast<int>(kSms * per_sm), INT_MAX, INT_MAX).q > 1;
  return splits ? sdd_planes(units, 144 * per_sm) : 0;
}

std::int64_t sdd_planes(std::int64_t units, std::int64_t max_ctas) {
  int most = 0;
  for (std::int64_t p = 1; p <= max_ctas && units > 0; ++p)
    most =
        std::max(most, kernels::SddSchedule(static_cast<int>(units), static_cast<int>(p), INT_MAX, INT_MAX).planes());
  return most;
}

}  // namespace bsjit::generator
