// The Hopper backward-weight kernels (sm_90a): dW = Xᵀ·dY on units of dW's nonzero blocks, a TMA
// producer warp and wgmma consumers (below: what a unit is for each of sdd_tma_kernel,
// sdd_tiled_kernel, sdd_rows_kernel and sdd_cols_kernel), units split over N where the schedule
// (sdd_schedule.cuh) says so.
#pragma once

#include "bsjit/matmul_hopper.cuh"

namespace bsjit {
namespace kernels {

// A consumer warp's staging in store_sdd_staged: 16 rows × 64 columns of 16-bit dW.
enum : int { kSddWarpStaging = 16 * 64 * 2 };  // an enumerator: no storage in the kernel binary

// The Hopper backward-weight kernels: dW on units (Cfg::counts()[0]: R × C tiles of dW), each the
// product X[:, rows]ᵀ · dY[:, columns] over N. A stage holds 64 rows of N of both operands, copied
// by TMA as boxes of 64 rows × 64 features (MN-major, 128-byte swizzled): A = Xᵀ is M-major, B = dY
// N-major. kWarpsM consumer warpgroups, then one producer warp (one of its threads issues the
// copies). With 2 consumers the registers stay capped at 168 a thread (warps are allocated in fours).
// - sdd_tma_kernel (b = 64, 128): a unit is one b × b block.
// - sdd_tiled_kernel (b = 16, 32): an E × E tile of dW (E = 64 or 128; or 128 × 256, two consumers
//   of 64 rows each) holding at least one block, computed whole, its blocks stored. An E-wide tile
//   feeds the tensor cores where one narrow block cannot (wgmma's M is 64); the blocks a tile lacks
//   cost tensor time, so the generator keeps this for layouts whose tiles are well filled.
// - sdd_rows_kernel: up to kRowBlocks block columns of a band of dW's rows (b ≥ 64: one block row,
//   or two at b = 64, computed whole; b ≤ 32: the 64 / b block rows of 64 features) that hold a
//   block in the band. X's slice of the band is copied once per step for all of them (once per
//   block with a unit per block), so at b ≥ 64 a step moves (1 + m) / 2m of the bytes per FLOP; at
//   b ≤ 32 dY's boxes are b features wide, so a unit gathers the band's columns and computes only
//   those (the tiled kernel computes every column of its tile).
// - sdd_cols_kernel (b = 128): kColBlocks blocks of one block column of dW, their rows gathered, dY's
//   slice of the column copied once per step for all of them: the row groups' saving along the
//   other axis, for layouts whose block columns (not rows) hold even counts (suite W's balanced
//   layouts hold exactly d · C / b blocks in every block row of Wᵀ, that is, every block column of dW).
// Shared memory: the stages, their mbarriers, and with Cfg::kStagedStore (store_sdd_staged) the
// barriers padded to 1024 bytes and kSddWarpStaging (2 KB) per consumer warp.
template <class Cfg, int ROWS, int COLS>
struct SddTmaPlan {
  static constexpr int kSlice = 64;                          // rows of N per stage
  static constexpr int kOperandBytes = kSlice * ROWS * 2;   // A's stage (Xᵀ); B's (dY) follows
  static constexpr int kStageBytes = kSlice * (ROWS + COLS) * 2;
  static constexpr int kBarrierBytes = 2 * Cfg::kStages * 8, kWarpStaging = kSddWarpStaging;
  static constexpr int kStagingOffset = Cfg::kStages * kStageBytes + kSwizzleAtomBytes;  // from the aligned base
  static constexpr int kSharedBytes = Cfg::kStagedStore
                                          ? kStagingOffset + Cfg::kWarpsM * 4 * kWarpStaging + kSwizzleAtomBytes
                                          : Cfg::kStages * kStageBytes + kSwizzleAtomBytes + kBarrierBytes;
  static_assert(kBarrierBytes <= kSwizzleAtomBytes, "the stages' mbarriers fit in the padding");
};

// The blocks a warp's pieces lie in (-1: none), for store_sdd_staged: piece s of the 64 columns p of
// m64 tile t. Read from the tables when the consumer starts an item, so that their latency passes
// while the item's steps run, not in the epilogue.
template <class Cfg, int TILES, int N>
struct StagedBlocks {
  static constexpr int W = Cfg::kBlock < 64 ? Cfg::kBlock : 64;
  int at[TILES][N / 64][64 / W];
  template <class Units>
  __device__ __forceinline__ void load(const Units& units, int unit, int row0, int col0) {
    const int r = row0 + ((threadIdx.x % 128) / 32) * 16;
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int p = 0; p < N / 64; ++p)
#pragma unroll
        for (int s = 0; s < 64 / W; ++s) at[t][p][s] = units.block(unit, r + t * 64, col0 + 64 * p + s * W);
  }
};

// The staged epilogue (Cfg::kStagedStore) of one item's tile: each warp puts its 16 rows × 64 columns
// at a time (16-bit, scaled by each block's gate, dW's old values added in fp32 when accumulating)
// into its own staging (`tile`, kSddWarpStaging bytes of shared memory) with stmatrix, as
// min(b, 64)-wide pieces swizzled over their rows, and one lane stores each piece that lies in a
// block by TMA (map_dw: dW as [blocks · b, b]): whole rows of a block, where the register epilogue
// writes 4 bytes per pair, 8 rows of 16 bytes per warp instruction. At N = 64, b = 64 (one 64-row
// step per block) the register stores took 60% of the kernel: 0.064 ms, 0.026 without them.
// The 64-column pieces go through one copy of the code (a rolled loop; a piece's 32 accumulators and
// its blocks selected from the N / 64 candidates, statically indexed), and dW's old values come in
// through the staging as the new ones go out (16-byte row loads, ldmatrix), instead of a 4-byte
// load per accumulator pair. Cold compile of the general kernels (NVRTC alone, 2-core machine, 4096
// blocks; 2026-12-05, docs/PERFORMANCE.md), both together: rows4 b = 64 475 → 280-307 ms, tile128 b = 32 424 → 268;
// the rolled loop alone: rows4 352 → 280, tile128 b = 32 330 → 275, b = 128 334 → 293, b = 16 390
// → 327. The plain kernels' compile is level either way.
template <class Cfg, int TILES, int N, class Units>
__device__ __forceinline__ void store_sdd_staged(float (&d)[TILES][N / 2], int row0, int col0, const Units& units,
                                                 const StagedBlocks<Cfg, TILES, N>& blocks, const TensorMap& map_dw,
                                                 unsigned char* tile) {
  using T = typename Cfg::T;
  constexpr int b = Cfg::kBlock, W = b < 64 ? b : 64, kRowBytes = 2 * W, kPieceBytes = 16 * kRowBytes;
  constexpr int kPieces = N / 64, kSlots = 64 / W;
  static_assert(kSlots * kPieceBytes == kSddWarpStaging, "a warp's pieces fill its staging");
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
    const int r = row0 + t * 64 + warp * 16;  // the warp's first row of the unit (16 rows of one block row)
#pragma unroll 1
    for (int p = 0; p < kPieces; ++p) {
      float v[32];
      int at_block[kSlots];
#pragma unroll
      for (int e = 0; e < 32; ++e) v[e] = select_static<kPieces>(p, [&](int q) { return d[t][32 * q + e]; });
#pragma unroll
      for (int s = 0; s < kSlots; ++s)
        at_block[s] = select_static<kPieces>(p, [&](int q) { return blocks.at[t][q][s]; });
      if (units.gate != nullptr) {  // each piece's gate, read once (a piece without a block: any)
        float g[kSlots];
#pragma unroll
        for (int s = 0; s < kSlots; ++s) g[s] = at_block[s] < 0 ? 1.0f : units.gate[at_block[s]];
#pragma unroll
        for (int e = 0; e < 32; ++e) {
          const float ge = g[8 * (e / 4) / W];  // pair e / 4: columns 8 (e / 4) .. of the 64
          v[e] = ge == 0.0f ? 0.0f : v[e] * ge;  // 0 where gated to 0, whatever X and dY hold
        }
      }
      if (lane == 0) bulk_wait_group_read<0>();  // the warp's last store has read the staging
      __syncwarp();
      if (units.accumulate) {  // dW's old rows of the pieces into the staging, where stmatrix writes
#pragma unroll
        for (int k = 0; k < 4; ++k) {  // 16 rows of 8 16-byte chunks, 4 a lane
          const int e = lane + 32 * k, row = e / 8, chunk = e % 8, block = at_block[chunk / (W / 8)];
          if (block < 0) continue;
          const T* from =
              units.dw + static_cast<long long>(block) * b * b + ((r + row) % b) * b + (col0 + 64 * p + 8 * chunk) % b;
          *reinterpret_cast<Chunk16*>(tile + (chunk / (W / 8)) * kPieceBytes +
                                      swizzled_offset_in<kRowBytes>(row, chunk % (W / 8))) =
              *reinterpret_cast<const Chunk16*>(from);
        }
        __syncwarp();
      }
      // stmatrix tile q of pair i: the warp's rows 8 (q % 2) .., columns 8 (i + q / 2) .. of the piece
      const int q = lane / 8, row = 8 * (q % 2) + lane % 8;
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        float* x = v + 4 * i;
        const int chunk = i + q / 2;  // 16-byte chunk of the warp's 64 columns
        unsigned char* at =
            tile + (chunk / (W / 8)) * kPieceBytes + swizzled_offset_in<kRowBytes>(row, chunk % (W / 8));
        if (units.accumulate) add_ldmatrix<T, false>(x, at);  // in fp32: the sum rounded once
        const unsigned regs[4] = {pack_pair<T>(x[0], x[1]), pack_pair<T>(x[2], x[3]), pack_pair<T>(x[4], x[5]),
                                  pack_pair<T>(x[6], x[7])};
        stmatrix_x4(at, regs);
      }
      fence_proxy_async();
      __syncwarp();
      if (lane == 0) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int block = at_block[s];
          if (block >= 0) tma_store_2d(map_dw, tile + s * kPieceBytes, (col0 + 64 * p + s * W) % b, block * b + r % b);
        }
        bulk_commit_group();
      }
    }
  }
}

// Stores one item's R × C tile from a consumer's accumulators d (kTiles m64 tiles from row row0 of
// the tile, N columns from col0; every consumer thread calls it) into its blocks: a whole unit
// at once; a piece as its partial, the last piece of its unit to finish adding them all into d (one
// plane at a time, so that a plane's loads are in flight together) and writing.
template <class Cfg, int R, int C, int TILES, int N, class Units>
__device__ __forceinline__ void store_sdd_item(float (&d)[TILES][N / 2], int row0, int col0, const Units& units,
                                               const SddItem& item, const SddSchedule& schedule, float* workspace,
                                               const StagedBlocks<Cfg, TILES, N>& blocks, const TensorMap& map_dw,
                                               unsigned char* warp_staging) {
  constexpr int kConsumerThreads = Cfg::kWarpsM * 128;
  constexpr long long kPlane = static_cast<long long>(R) * C;
  if constexpr (Cfg::kSplit) {  // the generator gave planes: leftover units may be split (SddSchedule)
    if (item.piece >= 0) {
      const int leftover = schedule.leftover(item);
      unsigned* counter = reinterpret_cast<unsigned*>(workspace) + leftover;
      float* planes = workspace + kSplitCounters + leftover * schedule.q * kPlane;
      if (!add_piece_partials<kConsumerThreads, TILES, N>(d, planes, kPlane, item.piece, schedule.q, counter, 0))
        return;
    }
  }
  const int unit = item.unit;
  if constexpr (Cfg::kStagedStore) {
    store_sdd_staged<Cfg, TILES, N>(d, row0, col0, units, blocks, map_dw, warp_staging);
  } else {
    // A thread's pairs of an m64 tile (wgmma_for_each_pair) lie in one block row (rows r and r + 8
    // of a 16-row group, b ≥ 16) and in runs of kRun groups of 8 columns within one block: each
    // run's block and gate are read once (DwWriter::put_run). Written per pair, the lookups were
    // half of the b = 32 row bands' code and of their cold compile (rows16-tma2-s3: NVRTC 1.45-1.50 s,
    // 0.68-0.75 s with no stores at all; 2026-12-04).
    constexpr int b = Cfg::kBlock, kRun = N % b == 0 ? b / 8 : b % N == 0 ? N / 8 : 1;
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
      const int r = row0 + t * 64 + warp * 16 + lane / 4;
#pragma unroll
      for (int i = 0; i < N / 8; i += kRun) {
        const int c = col0 + 8 * i + 2 * (lane % 4);
        units.template put_run<N, kRun>(units.block(unit, r, c), r, c, d[t], i);
      }
    }
  }
}

// The main loop of the Hopper backward-weight kernels over the CTA's items (SddSchedule). Units: the
// kernel's units, with row(u, j) (X's first feature of box j, 64 features), column(u, j) (dY's first feature of box j,
// Units::kBoxCols features; with Units::kGaps, < 0 where the unit leaves the box empty: not copied,
// the product's columns there undefined and not written), block(u, r, c) (the dW block holding
// element (r, c) of the tile, -1 for none) and put (DwWriter).
// Consumers: up to ROWS / 64 split the rows (whole m64 tiles each), the rest the columns (wgmma's N =
// COLS / that). The producer runs ahead into the next item while the consumers store.
template <class Cfg, int ROWS, int COLS, class Units>
__device__ __forceinline__ void sdd_tma_body(int n, const Units& units, const TensorMap& map_x, const TensorMap& map_dy,
                                             const TensorMap& map_dw, float* workspace) {
  using T = typename Cfg::T;
  using Plan = SddTmaPlan<Cfg, ROWS, COLS>;
  constexpr int kSlice = Plan::kSlice, S = Cfg::kStages, kBoxBytes = kSlice * kSwizzleRowBytes;
  // dY's boxes: kBoxCols features (rows of 2·kBoxCols bytes, swizzled over them)
  constexpr int kBoxCols = Units::kBoxCols, kDyRow = 2 * kBoxCols, kDyBoxBytes = kSlice * kDyRow, kDyBoxes = COLS / kBoxCols;
  constexpr int kConsumers = Cfg::kWarpsM, kConsumerThreads = kConsumers * 128;
  constexpr int kAlongRows = ROWS / 64 < kConsumers ? ROWS / 64 : kConsumers, kAlongCols = kConsumers / kAlongRows;
  constexpr int kRows = ROWS / kAlongRows, kTiles = kRows / 64, N = COLS / kAlongCols;
  static_assert(sizeof(T) == 2 && Cfg::kFeatureLast && ROWS % 64 == 0 && COLS % 64 == 0 && COLS % kBoxCols == 0 &&
                    (kBoxCols == 16 || kBoxCols == 32 || kBoxCols == 64),
                "16-bit, feature axis last; dY's boxes 16, 32 or 64 features");
  static_assert(Cfg::kThreads == kConsumerThreads + 32 && kAlongRows * kAlongCols == kConsumers &&
                    kTiles * 64 * kAlongRows == ROWS && N * kAlongCols == COLS && N <= 256 && N % kBoxCols == 0,
                "kWarpsM consumer warpgroups owning whole m64 tiles, then a producer warp; wgmma widths");
  static_assert(S >= 2 && Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);
  unsigned long long *full = ring.full, *empty = ring.empty;
  auto stage_a = [&](int i) { return ring.stage(i); };
  auto stage_b = [&](int i) { return ring.stage(i) + Plan::kOperandBytes; };

  ring.init(kConsumerThreads);
  const SddSchedule schedule(Cfg::counts()[0], gridDim.x, Cfg::counts()[1], (n + 63) / 64);  // units, planes
  const int items = schedule.items(blockIdx.x);
  // b = 32 and 64: the consumers' k loop rolled (one wgmma statement per m64 tile instead of 4),
  // their role from warpgroup_index so that ptxas keeps the rolled wgmmas pipelined. Cold compile
  // (2-core machine, NVRTC alone, suite W Bernoulli d = 0.25): rows16 434 → 252 ms, rows4 420 → 228
  // (split layouts 585 → 331, 558 → 309). Run time, one A/B round with every Hopper kernel rolled:
  // b = 32 ×1.037, b = 64 ×0.992; b = 16 ×0.966 and b = 128 ×0.962 keep the unrolled loop.
  constexpr bool kRolledK = Cfg::kBlock == 32 || Cfg::kBlock == 64;
  const int warpgroup = kRolledK ? warpgroup_index() : static_cast<int>(threadIdx.x / 128);

  if (warpgroup >= kConsumers) {  // the producer warp
    if (threadIdx.x != kConsumerThreads) return;
    // An item's coordinates, read from the tables once (the copies' asm clobbers memory, so reads in
    // the step loop would be repeated every step); for units with gaps (row bands and groups: up to
    // 17 coordinates) an item ahead, so that with few steps per item (N = 64: one) the round trip to
    // L2 is not spent between one item's copies and the next's. Small batch, ms, read when the item
    // starts → an item ahead (A/B in one device call, two rounds each): b = 32 bands of 64 × 256
    // 0.0511 → 0.0481-0.0489, b = 128 row groups 0.0271 → 0.0235-0.0237, b = 64 0.0372 → 0.0353-0.0357.
    // A block per unit gained nothing (b = 64 level; b = 128 0.0214 → 0.0226, and 0.0221 with the
    // producer reading when the item starts: the loss is elsewhere, not explained), so blocks read
    // theirs when they start.
    struct Coords {
      SddItem item;
      int rows[ROWS / 64], columns[kDyBoxes];
    };
    auto coords = [&](int it) {
      Coords c;
      c.item = units.gated(schedule.item(blockIdx.x, it));
#pragma unroll
      for (int j = 0; j < ROWS / 64; ++j) c.rows[j] = units.row(c.item.unit, j);
#pragma unroll
      for (int j = 0; j < kDyBoxes; ++j) c.columns[j] = units.column(c.item.unit, j);
      return c;
    };
    constexpr bool kAhead = Units::kGaps;
    // The whole waves' units walk N paced (WaveGate): a round is kWaveGateSteps steps of a unit, so a
    // wave's CTAs stay within 2 · 512 rows of N of each other and read the rows of X and dY they
    // share from L2 (at C = K = 12288, b = 32, N = 32768 the kernel read 71.8 GB from DRAM, 45 times
    // X and dY; paced, it ran ×2.20 / 2.68 / 1.47 at b = 32 / 64 / 128 on an H100: docs/PERFORMANCE.md,
    // "The wave paced"). The leftover pieces are not paced.
    const int unit_rounds = schedule.unit_rounds();
    WaveGate wave(Cfg::kWaveGate ? workspace : nullptr, schedule.paced_rounds());
    int i = 0;  // position in the ring, over all items
    Coords next = kAhead && items > 0 ? coords(0) : Coords{};
    for (int it = 0; it < items; ++it) {
      const Coords cur = kAhead ? next : coords(it);
      if (kAhead && it + 1 < items) next = coords(it + 1);
      const SddItem& item = cur.item;
      const int* rows = cur.rows;
      const int* columns = cur.columns;
      int boxes = 0;  // dY boxes copied per step
#pragma unroll
      for (int j = 0; j < kDyBoxes; ++j) boxes += !Units::kGaps || columns[j] >= 0;
      const bool paced = it < schedule.waves;  // a whole unit (a gated-off one has no steps)
      const int round0 = it * unit_rounds;
      int arrived = 0;  // this unit's rounds counted
      for (int k = item.first; k < item.last; ++k, ++i) {
        if (paced && k % kWaveGateSteps == 0) wave.wait(round0 + k / kWaveGateSteps);
        if (i >= S) mbarrier_wait(&empty[i % S], ((i / S) - 1) & 1);
        unsigned long long* bar = &full[i % S];
        mbarrier_arrive_expect_tx(bar, Plan::kOperandBytes + boxes * kDyBoxBytes);
        const int n0 = k * kSlice;
#pragma unroll
        for (int j = 0; j < ROWS / 64 || j < kDyBoxes; ++j) {
          if (j < ROWS / 64) tma_load_2d(stage_a(i) + j * kBoxBytes, map_x, rows[j], n0, bar);
          if (j < kDyBoxes && (!Units::kGaps || columns[j] >= 0))
            tma_load_2d(stage_b(i) + j * kDyBoxBytes, map_dy, columns[j], n0, bar);
        }
        if (paced && (k + 1) % kWaveGateSteps == 0) wave.arrive(round0 + arrived++);
      }
      if (paced)
        for (; arrived < unit_rounds; ++arrived) wave.arrive(round0 + arrived);
    }
    wave.finish();
    return;
  }

  const int consumer = warpgroup;
  // (constants where the consumers split only one way: the epilogue then finds each pair's block
  // at compile time)
  const int row0 = kAlongRows == 1 ? 0 : (consumer % kAlongRows) * kRows;
  const int col0 = kAlongCols == 1 ? 0 : (consumer / kAlongRows) * N;
  float d[kTiles][N / 2];
  // The item and its staged blocks: for units with gaps (their tables read from L2) an item ahead,
  // as the producer reads its coordinates, so that with one step per item (N = 64) the round trip
  // is not spent in the epilogue.
  constexpr bool kAhead = Units::kGaps;
  StagedBlocks<Cfg, kTiles, N> blocks, next_blocks;
  SddItem next_item{};
  if (kAhead && items > 0) {
    next_item = units.gated(schedule.item(blockIdx.x, 0));
    if constexpr (Cfg::kStagedStore) next_blocks.load(units, next_item.unit, row0, col0);
  }
  int i = 0;
  for (int it = 0; it < items; ++it) {
    const SddItem item = kAhead ? next_item : units.gated(schedule.item(blockIdx.x, it));
    if constexpr (Cfg::kStagedStore) {
      if (kAhead)
        blocks = next_blocks;
      else
        blocks.load(units, item.unit, row0, col0);
    }
    if (kAhead && it + 1 < items) {
      next_item = units.gated(schedule.item(blockIdx.x, it + 1));
      if constexpr (Cfg::kStagedStore) next_blocks.load(units, next_item.unit, row0, col0);
    }
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < N / 2; ++e) d[t][e] = 0.0f;
      wgmma_fence_registers(d[t]);
    }
    for (int k = item.first; k < item.last; ++k, ++i) {
      mbarrier_wait(&full[i % S], (i / S) & 1);
      const unsigned char* as = stage_a(i) + (row0 / 64) * kBoxBytes;
      const unsigned char* bs = stage_b(i) + (col0 / kBoxCols) * kDyBoxBytes;
      wgmma_fence();
#pragma unroll(kRolledK ? 1 : kSlice / 16)
      for (int kk = 0; kk < kSlice / 16; ++kk) {
        // 16 rows of N further on; dY's boxes of kBoxCols features kSlice rows apart
        const unsigned long long db =
            smem_descriptor_swizzled<kDyRow>(bs + kk * 16 * kDyRow, kDyBoxBytes, 8 * kDyRow);
#pragma unroll
        for (int t = 0; t < kTiles; ++t)
          wgmma_m64k16<T, N, 1, 1>(
              d[t], smem_descriptor(as + t * kBoxBytes + kk * 16 * kSwizzleRowBytes, kBoxBytes, kSwizzleAtomBytes), db);
      }
      wgmma_commit();
      wgmma_wait<1>();
      if (k > item.first) mbarrier_arrive(&empty[(i - 1) % S]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int t = 0; t < kTiles; ++t) wgmma_fence_registers(d[t]);
    if (item.last > item.first) mbarrier_arrive(&empty[(i - 1) % S]);
    store_sdd_item<Cfg, ROWS, COLS, kTiles, N>(
        d, row0, col0, units, item, schedule, workspace, blocks, map_dw,
        ring.base + Plan::kStagingOffset + (threadIdx.x / 32) * Plan::kWarpStaging);  // this warp's staging
  }
  if (Cfg::kStagedStore && threadIdx.x % 32 == 0) bulk_wait_group<0>();  // shared memory outlives the stores
}

// Writes finished pairs of dW: element (r % b, c % b) of block `block` (-1: none), scaled by its gate
// (a block gated to 0 gets dW = 0, whatever X and dY hold). The units below say which block holds
// element (r, c) of unit u's tile: block(u, r, c).
template <class Cfg>
struct DwWriter {
  static constexpr int kBoxCols = 64;  // features of dY's boxes
  typename Cfg::T* dw;
  const float* gate;
  int accumulate;
  // The item without steps where every block of its unit (`count` indices at `blocks`, -1 for none)
  // is gated to 0: its product is not computed, and 0 is written.
  __device__ __forceinline__ SddItem gated(SddItem item, const int* blocks, int count) const {
    if (gate == nullptr) return item;
#pragma unroll 1
    for (int i = 0; i < count; ++i)
      if (blocks[i] >= 0 && gate[blocks[i]] != 0.0f) return item;
    item.last = item.first;
    return item;
  }
  // A run of a thread's accumulator pairs d[4 i + 2 h], d[4 i + 2 h + 1] (i from i0, RUN of them; h = 0,
  // 1), at elements (r + 8 h, c + 8 (i - i0)) of the tile, all in one block (-1: none).
  template <int N, int RUN>
  __device__ __forceinline__ void put_run(int block, int r, int c, const float (&d)[N / 2], int i0) const {
    constexpr int b = Cfg::kBlock;
    if (block < 0) return;
    const float g = gate == nullptr ? 1.0f : gate[block];
    typename Cfg::T* p = dw + static_cast<long long>(block) * b * b + (r % b) * b + c % b;
#pragma unroll
    for (int i = 0; i < RUN; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * (i0 + i) + 2 * h;
        const float v0 = g == 0.0f ? 0.0f : d[e] * g, v1 = g == 0.0f ? 0.0f : d[e + 1] * g;  // 0, not 0 · inf
        store_pair(p + 8 * h * b + 8 * i, v0, v1, accumulate);
      }
  }
};

// sdd_tma_kernel's units: one block of dW each (Cfg::coords(): its block row and column;
// Cfg::tile_blocks(): its index), in the order the generator chose for L2.
template <class Cfg>
struct BlockUnits : DwWriter<Cfg> {
  static constexpr bool kGaps = false;
  __device__ __forceinline__ int row(int u, int box) const { return Cfg::coords()[2 * u] * Cfg::kBlock + box * 64; }
  __device__ __forceinline__ int column(int u, int box) const { return Cfg::coords()[2 * u + 1] * Cfg::kBlock + box * 64; }
  __device__ __forceinline__ int block(int u, int, int) const { return Cfg::tile_blocks()[u]; }
  __device__ __forceinline__ SddItem gated(const SddItem& item) const {
    return DwWriter<Cfg>::gated(item, Cfg::tile_blocks() + item.unit, 1);
  }
};

// sdd_tiled_kernel's units: tile u of E rows × EC features of dW (Cfg::coords(): its tile row and
// column; Cfg::tile_blocks(): (E / b) × (EC / b) block indices per tile, row-major, -1 where the
// layout has none).
template <class Cfg>
struct TileUnits : DwWriter<Cfg> {
  static constexpr bool kGaps = false;
  static constexpr int E = Cfg::kTileEdge, EC = Cfg::kTileCols, kPerCol = E / Cfg::kBlock, kPerRow = EC / Cfg::kBlock;
  __device__ __forceinline__ int row(int u, int box) const { return Cfg::coords()[2 * u] * E + box * 64; }
  __device__ __forceinline__ int column(int u, int box) const { return Cfg::coords()[2 * u + 1] * EC + box * 64; }
  __device__ __forceinline__ int block(int u, int r, int c) const {
    return Cfg::tile_blocks()[(u * kPerCol + r / Cfg::kBlock) * kPerRow + c / Cfg::kBlock];
  }
  __device__ __forceinline__ SddItem gated(const SddItem& item) const {
    return DwWriter<Cfg>::gated(item, Cfg::tile_blocks() + item.unit * kPerCol * kPerRow, kPerCol * kPerRow);
  }
};

// sdd_rows_kernel's units: unit u is a band of kRows features of dW's rows (kPerBand = Cfg::kBandRows
// block rows: 64 / b at b ≤ 32, one or two at b = 64, one at b = 128) × M block columns.
// Cfg::coords(): per unit the band, then the M block columns (-1: an empty slot);
// Cfg::tile_blocks(): per unit kPerBand × M block indices, row-major (-1: none).
template <class Cfg>
struct RowUnits : DwWriter<Cfg> {
  static constexpr bool kGaps = true;
  static constexpr int b = Cfg::kBlock, M = Cfg::kRowBlocks, kPerBand = Cfg::kBandRows, kRows = kPerBand * b;
  static constexpr int kBoxCols = b < 64 ? b : 64, kBoxes = b / kBoxCols;  // dY's boxes per block column
  __device__ __forceinline__ int row(int u, int box) const { return Cfg::coords()[u * (M + 1)] * kRows + box * 64; }
  __device__ __forceinline__ int column(int u, int box) const {
    const int c = Cfg::coords()[u * (M + 1) + 1 + box / kBoxes];
    return c < 0 ? -1 : c * b + (box % kBoxes) * kBoxCols;
  }
  __device__ __forceinline__ int block(int u, int r, int c) const {
    return Cfg::tile_blocks()[(u * kPerBand + r / b) * M + c / b];
  }
  __device__ __forceinline__ SddItem gated(const SddItem& item) const {
    return DwWriter<Cfg>::gated(item, Cfg::tile_blocks() + item.unit * kPerBand * M, kPerBand * M);
  }
};

// sdd_cols_kernel's units (b = 128): unit u is M = Cfg::kColBlocks blocks of one block column of dW,
// its rows gathered (X's boxes from M block rows), dY's slice of the column copied once per step for
// all of them. Cfg::coords(): per unit the block column, then the M block rows (-1: an empty slot,
// whose boxes repeat the first block row's and whose rows are not stored); Cfg::tile_blocks(): per
// unit the M block indices (-1: none).
template <class Cfg>
struct ColUnits : DwWriter<Cfg> {
  static constexpr bool kGaps = true;  // (no dY box is left empty; the tables are read an item ahead)
  static constexpr int b = Cfg::kBlock, M = Cfg::kColBlocks, kBoxes = b / 64;  // X's boxes per block row
  __device__ __forceinline__ int row(int u, int box) const {
    const int r = Cfg::coords()[u * (M + 1) + 1 + box / kBoxes];
    return (r < 0 ? Cfg::coords()[u * (M + 1) + 1] : r) * b + (box % kBoxes) * 64;
  }
  __device__ __forceinline__ int column(int u, int box) const { return Cfg::coords()[u * (M + 1)] * b + box * 64; }
  __device__ __forceinline__ int block(int u, int r, int) const { return Cfg::tile_blocks()[u * M + r / b]; }
  __device__ __forceinline__ SddItem gated(const SddItem& item) const {
    return DwWriter<Cfg>::gated(item, Cfg::tile_blocks() + item.unit * M, M);
  }
};

#define BSJIT_SDD_TMA_KERNEL(NAME, UNITS, ROWS, COLS, CHECK)                                                \
  template <class Cfg>                                                                                      \
  __global__ void __launch_bounds__(Cfg::kThreads, 1)                                                       \
      NAME(const typename Cfg::T* __restrict__ x, const typename Cfg::T* __restrict__ dy,                   \
           typename Cfg::T* __restrict__ dw, const float* __restrict__ gate, int n, int accumulate,         \
           float* __restrict__ workspace, const __grid_constant__ TensorMap map_x,                          \
           const __grid_constant__ TensorMap map_dy, const __grid_constant__ TensorMap map_dw) {            \
    static_assert(CHECK, #CHECK);                                                                           \
    drop_call_options<Cfg>(gate, accumulate);                                                               \
    sdd_tma_body<Cfg, ROWS, COLS>(n, UNITS<Cfg>{{dw, gate, accumulate}}, map_x, map_dy, map_dw, workspace); \
  }

BSJIT_SDD_TMA_KERNEL(sdd_tma_kernel, BlockUnits, Cfg::kBlock, Cfg::kBlock, Cfg::kBlock == 64 || Cfg::kBlock == 128)
BSJIT_SDD_TMA_KERNEL(sdd_tiled_kernel, TileUnits, Cfg::kTileEdge, Cfg::kTileCols,
                     Cfg::kBlock == 16 || Cfg::kBlock == 32)
BSJIT_SDD_TMA_KERNEL(sdd_rows_kernel, RowUnits, RowUnits<Cfg>::kRows, Cfg::kRowBlocks * Cfg::kBlock,
                     Cfg::kBlock == 16 || Cfg::kBlock == 32 || Cfg::kBlock == 64 || Cfg::kBlock == 128)
BSJIT_SDD_TMA_KERNEL(sdd_cols_kernel, ColUnits, Cfg::kColBlocks* Cfg::kBlock, Cfg::kBlock, Cfg::kBlock == 128)
#undef BSJIT_SDD_TMA_KERNEL

}  // namespace kernels
}  // namespace bsjit
