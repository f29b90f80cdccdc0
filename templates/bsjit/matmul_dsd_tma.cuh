// dsd_tma_kernel: forward Y = X·W and backward-data dX = dY·Wᵀ on Hopper (sm_90a) with a TMA
// producer warpgroup and mbarriers (warp specialization), persistent, its epilogue stored by TMA;
// swapped (Cfg::kSwapped, the default), each consumer computes Yᵀ = Wᵀ·Xᵀ for 64 output features.
// Columns too narrow for it (b = 16, 32) run the grouped kernel (matmul_grouped.cuh), b = 64
// columns that share input blocks the paired one (matmul_paired.cuh).
#pragma once

#include "bsjit/matmul_hopper.cuh"
#include "bsjit/matmul_wgmma.cuh"

namespace bsjit {
namespace kernels {

// dsd_tma_kernel: the Hopper kernel with warp specialization. Warpgroup 0 is the producer: one of
// its threads issues TMA copies of each stage (the X box at (input block · b + k0, m0), the W
// slice as b/64 or one box), which complete on the stage's "full" mbarrier; the other warpgroups
// are consumers, waiting on "full", running the stage's wgmmas and, once a stage's wgmmas have
// finished, arriving on its "empty" mbarrier so the producer may refill it. No CTA-wide barrier
// in the main loop: loads run up to kStages ahead of the tensor cores.
// The epilogue goes through shared memory and TMA stores (whole 128-byte lines), which run on
// while the consumers start their next tile. Unswapped, each warp writes its 16 rows × 64 outputs
// with stmatrix into its part of the consumer's staging tile and one lane stores them, ordered by
// __syncwarp alone; swapped, the consumer writes 64 rows × 64 features into one of its two staging
// tiles and one thread stores it after a barrier of the consumer. (From registers, 4-byte stores of
// 8 rows per warp instruction, the epilogue of a 256 × 128 tile took some 4000 LSU cycles against
// 6500 for the main loop at d = 0.1: TMA stores took b = 128, d = 0.1 from 290 to 446 TFLOP/s.)
// Shared memory: the stages, their mbarriers (padded to 1024 bytes), the consumers' staging tiles
// (8 KB each, two per consumer when swapped).
template <class Cfg>
struct DsdTmaPlan {
  using Base = DsdWgmmaPlan<Cfg>;
  static constexpr int kBarrierBytes =
      (2 * Cfg::kStages * 8 + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr int kOutTileBytes = (Cfg::kSwapped ? 2 : 1) * 64 * Base::kRowBytes;  // per consumer
  static constexpr int kSharedBytes = Base::kSharedBytes + kBarrierBytes + Cfg::kWarpsM * kOutTileBytes;
};

// A consumer's walk over the `total` stages of one output tile of dsd_tma_kernel (LUT entries from
// `begin`; `step` counts the CTA's stages over all its tiles): waits for each stage, scales a gated
// W slice in place (all consumers together), issue(step) issues and commits the stage's wgmmas, and
// the previous stage is freed once its wgmmas have finished. between(i) runs after that, while stage
// i's wgmmas are in flight (the swapped kernel stores the previous tile then): run before the wait,
// the stores held back the freeing of the previous stage, and with it the producer's next copy
// (b = 128 forward at d = 0.1: 507 -> 524-530 TFLOP/s with them after it). Returns with every wgmma
// finished.
template <class Cfg, class Ring, class Issue, class Between>
__device__ __forceinline__ void dsd_tma_stages(const Ring& ring, const float* __restrict__ gate, int begin, int total,
                                               int& step, Issue issue, Between between) {
  using Plan = DsdWgmmaPlan<Cfg>;
  constexpr int kSlicesPerEntry = Cfg::kBlock / Plan::kSlice, S = Cfg::kStages, kConsumerThreads = Cfg::kWarpsM * 128;
  for (int i = 0; i < total; ++i, ++step) {
    mbarrier_wait(&ring.full[step % S], (step / S) & 1);
    const float g = gate == nullptr ? 1.0f : gate[Cfg::lut()[2 * (begin + i / kSlicesPerEntry) + 1]];
    if (g != 0.0f) {  // uniform across the CTA
      if (g != 1.0f) {
        scale_shared<typename Cfg::T>(ring.stage(step) + Plan::kABytes, Plan::kBBytes, g, threadIdx.x - 128,
                                      kConsumerThreads);
        fence_proxy_async();
        named_barrier_sync(1, kConsumerThreads);
      }
      issue(step);
      wgmma_wait<1>();  // the previous stage's wgmmas have finished
    } else {
      wgmma_wait<0>();
    }
    if (i > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);
    between(i);
  }
  wgmma_wait<0>();
  if (total > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);  // the tile's last stage
}

// One output tile of dsd_tma_kernel: the output column at `position` (Cfg::out_columns()), rows
// m0 .. m0 + BM, LUT entries begin .. end. split ≥ 0 (Cfg::kSplit): the entries are piece `piece`
// of the column's `pieces`, whose partials lie at planes first_plane .. and whose arrivals the
// counter `split` counts (dsd_add_pieces).
struct DsdTile {
  int position, m0, begin, end, split, first_plane, piece, pieces;
};

// The tiles one CTA of dsd_tma_kernel computes, in order. Unsplit, tile t is the column at position
// t % kOutBlocks of row tile t / kOutBlocks: persistent, CTA p takes tiles p, p + P, ...; otherwise
// one tile per CTA (grid x = columns, y = row tiles). Split (the small batch): the CTA's items
// (whole columns and pieces of long ones, dealt by the generator so that every CTA copies about
// as many blocks), in each row tile: item blockIdx.x of Cfg::items(), then those from
// Cfg::cta_items()[blockIdx.x] to the next CTA's (the first read beside its offsets).
template <class Cfg>
struct DsdTiles {
  int count, first, stride, items, tiles;  // tiles: of the whole launch (persistent, unsplit)
  __device__ __forceinline__ explicit DsdTiles(int n) {
    const int row_tiles = (n + Cfg::kBM - 1) / Cfg::kBM;
    if constexpr (Cfg::kSplit) {
      first = Cfg::cta_items()[blockIdx.x];
      items = 1 + Cfg::cta_items()[blockIdx.x + 1] - first;
      stride = 0;
      count = items * row_tiles;
      tiles = 0;
    } else {
      tiles = Cfg::kOutBlocks * row_tiles;
      first = Cfg::kPersistent ? blockIdx.x : blockIdx.y * Cfg::kOutBlocks + blockIdx.x;
      stride = Cfg::kPersistent ? gridDim.x : tiles;
      items = 0;
      count = first < tiles ? (tiles - first + stride - 1) / stride : 0;
    }
  }
  __device__ __forceinline__ DsdTile at(int i) const {
    if constexpr (Cfg::kSplit) {
      const int k = i % items;
      const int* e = Cfg::items() + 8 * (k == 0 ? static_cast<int>(blockIdx.x) : first + k - 1);
      return {e[0], i / items * Cfg::kBM, e[1], e[2], e[3], e[4], e[5], e[6]};
    } else {
      const int tile = first + i * stride, position = tile % Cfg::kOutBlocks;  // n ≤ 2^31 - 1
      return {position, tile / Cfg::kOutBlocks * Cfg::kBM, Cfg::lut_offsets()[position],
              Cfg::lut_offsets()[position + 1], -1, 0, 0, 1};
    }
  }
};

// A piece of a split column (Cfg::kSplit), its product in the consumers' accumulators d: written
// as fp32 to its plane of the workspace; the column's last piece to arrive adds all the pieces'
// partials, in piece order (deterministic), into d and returns true, to store them; the others
// return false. Workspace: the arrival counters (one per split column and row tile; the last piece
// sets its own back to 0 for the next launch), then Cfg::split_planes()[0] planes of BM × b
// partials per row tile. Every consumer thread calls it.
template <class Cfg, int TILES>
__device__ __forceinline__ bool dsd_add_pieces(float (&d)[TILES][Cfg::kBlock / 2], const DsdTile& tile,
                                               float* workspace) {
  constexpr int b = Cfg::kBlock;
  constexpr long long kPlane = static_cast<long long>(Cfg::kBM) * b;
  const int row_tile = tile.m0 / Cfg::kBM;
  unsigned* counter = reinterpret_cast<unsigned*>(workspace) + row_tile * gridDim.x + tile.split;
  float* planes = workspace + kSplitCounters +
                  (static_cast<long long>(row_tile) * Cfg::split_planes()[0] + tile.first_plane) * kPlane;
  return add_piece_partials<Cfg::kWarpsM * 128, TILES, b>(d, planes, kPlane, tile.piece, tile.pieces, counter, 128);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dsd_tma_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
                   typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
                   float* __restrict__ workspace, const __grid_constant__ TensorMap map_a,
                   const __grid_constant__ TensorMap map_w, const __grid_constant__ TensorMap map_out) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  using Plan = DsdWgmmaPlan<Cfg>;
  constexpr int b = Cfg::kBlock, kSlice = Plan::kSlice, kSlicesPerEntry = b / kSlice, S = Cfg::kStages;
  constexpr int kRow = Plan::kRowBytes;  // bytes of a row of the X tile and of the staging tiles
  constexpr int kConsumers = Cfg::kWarpsM, kConsumerThreads = kConsumers * 128;
  constexpr int kRows = Cfg::kBM / kConsumers, kTiles = kRows / 64;
  static_assert(sizeof(T) == 2 && Cfg::kFeatureLast && Cfg::kBN == b &&
                    (b == 64 || b == 128 || (b == 32 && !Cfg::kSwapped)),
                "16-bit, feature axis last, b = 64 or 128 (or 32, unswapped)");
  static_assert(!Cfg::kSplit || !Cfg::kSwapped, "split columns: the unswapped kernel");
  static_assert(Cfg::kThreads == kConsumerThreads + 128 && kRows * kConsumers == Cfg::kBM && kTiles * 64 == kRows,
                "one producer warpgroup, kWarpsM consumer warpgroups owning whole m64 tiles");
  static_assert(S >= 2 && DsdTmaPlan<Cfg>::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);
  unsigned long long *full = ring.full, *empty = ring.empty;
  auto stage_a = [&](int step) { return ring.stage(step); };
  auto stage_b = [&](int step) { return ring.stage(step) + Plan::kABytes; };

  const int warpgroup = threadIdx.x / 128;
  // Output tiles (BM rows × one block column), column fastest so that CTAs running together
  // share rows of X in L2 (DsdTiles). Persistent or split, the producer runs on into the next tile
  // while the consumers store the last one.
  const DsdTiles<Cfg> work(n);
  ring.init(kConsumerThreads);
  // Swapped at b = 128 (one or two consumers): a consumer stores a tile while it computes the next,
  // a piece of 64 rows in each of the next tile's first stages, its accumulators rounded to 16 bits
  // and held meanwhile (R / 4 registers more, so with two consumers they take 232 registers and the
  // producer 40). Without any store (results wrong) b = 128 ran 8 / 11 / 18 / 25% faster at d = 0.5 /
  // 0.25 / 0.1 / 0.05 (sweep, forward), so the epilogue was predicted to cost that much idle tensor
  // time; deferred, it gained 1-3.6% (suite W and the sweep, A/B in one call, two rounds), and at
  // b = 64 it lost 2-8% (tma2: -4 to -8% at d <= 0.25), so b = 64 stores at once. The deferred
  // epilogue's parts, each removed in turn (d = 0.25 / 0.05, TFLOP/s): all 660 / 427, without the TMA
  // stores 703 / 483, without the wait and barrier too 715 / 502, without the proxy fence too (only
  // the stmatrix left) 725 / 537, nothing 769 / 600: the shared-memory writes and the global stores
  // cost the tensor cores, not the consumer's waits (docs/PERFORMANCE.md, v27).
  constexpr bool kDeferStore = Cfg::kSwapped && b == 128 && kConsumers <= 2;

  if (warpgroup == 0) {  // producer: warp 0 reads the LUT, lane 0 issues the copies
    if constexpr (kDeferStore && kConsumers == 2) warpgroup_release_registers<40>();
    // The LUT is read 32 entries at a time, one per lane, and handed out by shuffles, and the next
    // tile's offsets are read a tile ahead. Read at each step (the compiler's choice, two entries
    // ahead), an entry cost the producer a load from L2, whose latency grows while the copies keep
    // DRAM busy: at N = 64 (small batch, b = 64, d = 0.1) Nsight Compute found the producer stalled
    // on those loads for more of its samples (100) than on free stages (65), and the consumers
    // waiting for data in 44% of theirs.
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) prefetch_tensormap(map_a), prefetch_tensormap(map_w);
    int step = 0;  // this CTA's stages so far, over all its tiles
    DsdTile next = work.count > 0 ? work.at(0) : DsdTile{};
    WaveGate wave(Cfg::kWaveGate ? workspace : nullptr, work.tiles / static_cast<int>(gridDim.x));
    for (int i = 0; i < work.count; ++i) {
      const DsdTile tile = next;
      const int m0 = tile.m0, begin = tile.begin, entries = tile.end - begin, total = entries * kSlicesPerEntry;
      if (i + 1 < work.count) next = work.at(i + 1);
      wave.wait(i);
      int in_block = 0, w_block = 0;  // lane l: entry 32·⌊j / 32⌋ + l
      for (int s = 0; s < total; ++s, ++step) {
        const int j = s / kSlicesPerEntry, k0 = (s % kSlicesPerEntry) * kSlice;
        if (j % 32 == 0 && k0 == 0 && j + lane < entries)
          in_block = Cfg::lut()[2 * (begin + j + lane)], w_block = Cfg::lut()[2 * (begin + j + lane) + 1];
        const int x_col = __shfl_sync(0xffffffffu, in_block, j % 32) * b + k0;
        // the W block's first row in the [blocks · b, b] view
        const int w_row = __shfl_sync(0xffffffffu, w_block, j % 32) * b;
        const int round = step / S;
        if (round > 0) mbarrier_wait(&empty[step % S], (round - 1) & 1);  // the whole warp: no divergent spin
        if (lane == 0) {
          unsigned long long* bar = &full[step % S];
          mbarrier_arrive_expect_tx(bar, Plan::kStageBytes);
          tma_load_2d(stage_a(step), map_a, x_col, m0, bar);
          if (Cfg::kTransW) {
            tma_load_2d(stage_b(step), map_w, k0, w_row, bar);
          } else {
#pragma unroll
            for (int p = 0; p < b / kSlice; ++p)
              tma_load_2d(stage_b(step) + p * kSlice * kRow, map_w, p * kSlice, w_row + k0, bar);
          }
        }
        __syncwarp();
      }
      if (lane == 0) wave.arrive(i);
    }
    if (lane == 0) wave.finish();
    return;
  }

  if constexpr (kDeferStore && kConsumers == 2) warpgroup_claim_registers<232>();
  const int consumer = warpgroup - 1;
  unsigned char* out_tile = reinterpret_cast<unsigned char*>(full) + DsdTmaPlan<Cfg>::kBarrierBytes +
                            consumer * DsdTmaPlan<Cfg>::kOutTileBytes;
  // swapped: a consumer's rows (wgmma's N) and the tile it has yet to store (kDeferStore)
  constexpr int kR = Cfg::kSwapped ? Cfg::kBM / (kConsumers / (b >= 64 ? b / 64 : 1)) : 64;
  PackedFeatures<kR> pending;
  bool has_pending = false;
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 128) prefetch_tensormap(map_out);
  int step = 0, piece = 0;
  for (int item = 0; item < work.count; ++item) {
    const DsdTile tile = work.at(item);
    const int m0 = tile.m0, col = Cfg::out_columns()[tile.position];
    const int begin = tile.begin, total = (tile.end - begin) * kSlicesPerEntry;
    if constexpr (!Cfg::kSwapped) {
      float d[kTiles][b / 2];
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int i = 0; i < b / 2; ++i) d[t][i] = 0.0f;
        wgmma_fence_registers(d[t]);
      }
      dsd_tma_stages<Cfg>(
          ring, gate, begin, total, step,
          [&](int s) { dsd_wgmma_stage<Cfg, kTiles>(d, stage_a(s) + consumer * kRows * kRow, stage_b(s)); },
          [](int) {});
#pragma unroll
      for (int t = 0; t < kTiles; ++t) wgmma_fence_registers(d[t]);
      if constexpr (Cfg::kSplit)
        if (tile.split >= 0 && !dsd_add_pieces<Cfg, kTiles>(d, tile, workspace)) continue;
      // Accumulator d[t][4i + 2h + e]: row 16·warp + lane / 4 + 8h of m64 tile t, column 8i + 2·(lane % 4) + e.
      // Each warp stores its 16 rows, kSlice columns at a time, through its part of the staging tile.
      unsigned char* warp_tile = out_tile + warp * 16 * kRow;  // two whole swizzle atoms
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const int row0 = m0 + consumer * kRows + t * 64 + warp * 16;  // the warp's first row; n ≤ 2^31 - 1
        if (accumulate) {  // Y's old values, added in fp32 (rounded once)
#pragma unroll
          for (int i = 0; i < b / 8; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const long long m = static_cast<long long>(row0) + lane / 4 + 8 * h;
              if (m >= n) continue;
              float lo, hi;
              const T* old = out + m * Cfg::kOutDim + static_cast<long long>(col) * b + 8 * i + 2 * (lane % 4);
              unpack_pair<T>(*reinterpret_cast<const unsigned*>(old), lo, hi);
              d[t][4 * i + 2 * h] += lo, d[t][4 * i + 2 * h + 1] += hi;
            }
        }
        constexpr int kChunks = kSlice / 8;  // 16-byte chunks of a staging row
#pragma unroll
        for (int p = 0; p < b / kSlice; ++p) {
          if (lane == 0) bulk_wait_group_read<0>();  // the warp's last store has read its part
          __syncwarp();
          // stmatrix tile q of pair i: the warp's rows 8 (q % 2) .., columns 8 (i + q / 2) ..
          const int q = lane / 8, row = 8 * (q % 2) + lane % 8;
#pragma unroll
          for (int i = kChunks * p; i < kChunks * (p + 1); i += 2) {
            const float* v = d[t] + 4 * i;
            const unsigned r[4] = {pack_pair<T>(v[0], v[1]), pack_pair<T>(v[2], v[3]), pack_pair<T>(v[4], v[5]),
                                   pack_pair<T>(v[6], v[7])};
            stmatrix_x4(warp_tile + swizzled_offset_in<kRow>(row, i - kChunks * p + q / 2), r);
          }
          fence_proxy_async();
          __syncwarp();
          if (lane == 0 && row0 < n) {
            tma_store_2d(map_out, warp_tile, col * b + kSlice * p, row0);
            bulk_commit_group();
          }
        }
      }
    } else {
      // Swapped: Yᵀ = Wᵀ·Xᵀ. Consumer c computes output features 64·(c % F) .. of rows R·(c / F) ..
      // of the tile (F = b / 64 feature slices): A = that slice of the stage's W (MN-major forward,
      // K-major backward-data), B = those R rows of X (K-major), so each wgmma is m64 nR k16 with
      // R = 128 or 256 instead of m64 nb k16 per 64 rows. Per FLOP that reads 96 (R = 128) or 80
      // (R = 256) bytes of shared memory per cycle of the tensor cores against 128 (b = 64) or 96
      // (b = 128), which bounds the unswapped kernel.
      constexpr int F = b / 64, R = kR;
      const int fslice = consumer % F, rows = consumer / F * R;
      float d[R / 2];
#pragma unroll
      for (int i = 0; i < R / 2; ++i) d[i] = 0.0f;
      wgmma_fence_registers(d);
      dsd_tma_stages<Cfg>(
          ring, gate, begin, total, step,
          [&](int s) {
            // features fslice·64 .. of W's slice: 64 rows further on, whether those are features (backward-data:
            // b rows of 64 reduction indices) or a group's reduction rows (forward: b / 64 groups of 64 × 64)
            wgmma_fence();
            swapped_wgmmas<Cfg, R>(d, stage_b(s) + fslice * 64 * kSwizzleRowBytes,
                                   stage_a(s) + rows * kSwizzleRowBytes);
            wgmma_commit();
          },
          [&](int i) {  // the previous tile's pieces, one per stage while its wgmmas run
            if (kDeferStore && has_pending && i < R / 64)
              store_feature_piece(i, pending, map_out, out_tile, piece, n, consumer);
          });
      wgmma_fence_registers(d);
      const long long feature0 = static_cast<long long>(col) * b + fslice * 64;
      if constexpr (kDeferStore) {
        if (has_pending)  // the pieces this tile had no stage for
          store_feature_pieces(total, pending, map_out, out_tile, piece, n, consumer);
        pack_features<Cfg, R>(d, pending, out, out_tile, feature0, m0 + rows, n, accumulate, consumer);
        has_pending = true;
      } else {
        store_features<Cfg, R>(d, out, map_out, out_tile, piece, feature0, m0 + rows, n, accumulate, consumer);
      }
    }
  }
  if constexpr (kDeferStore) {
    if (has_pending) store_feature_pieces(0, pending, map_out, out_tile, piece, n, consumer);
  }
  if (lane == 0) bulk_wait_group<0>();  // shared memory outlives the stores
}

}  // namespace kernels
}  // namespace bsjit
