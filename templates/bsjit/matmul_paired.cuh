// dsd_paired_kernel: forward Y = X·W and backward-data dX = dY·Wᵀ on Hopper (sm_90a) at b = 64,
// two output block columns per tile.
//
// dsd_tma_kernel at b = 64 copies an X tile (BM rows × 64 reduction indices, 32 KB at BM = 256) for
// every 8 KB W block: 40 KB from L2 per 2.1 MFLOP, twice the bytes per FLOP of b = 128, and its
// steps run at the L2-to-SM ceiling (docs/PERFORMANCE.md). The generator pairs output block columns
// that share input blocks (each column with the unpaired one sharing most), and a tile here is BM
// rows of both columns of a pair: a step copies the X tile of one input block once and the W block
// of each column holding that input block, so a shared block costs 48 KB per 4.2 MFLOP, b = 128's
// ratio.
//
// The product is swapped as in dsd_tma_kernel (Yᵀ = Wᵀ·Xᵀ): consumer warpgroup c owns rows
// R·c .. R·c + R - 1 of the tile (R = BM / kWarpsM, 64 or 128) of both columns, two accumulator
// sets of 64 features × R rows; a W block is wgmma's A (64 features × 16 indices), the consumer's
// rows of the X tile its B (m64 nR k16).
//
// A pair's steps come in three classes (the grouped kernel's tables, matmul_grouped.cuh, with two
// columns of one block per step): input blocks both columns hold, then those of the first column
// only, then of the second only. Each class is a loop issuing a fixed set of wgmmas (both chains,
// the first's, the second's): a branch around wgmmas makes ptxas serialize them (C7520).
//
// Tables (generated): pair p's steps are kGroupSteps[3p] .. kGroupSteps[3p + 3] - 1, classes from
// kGroupSteps[3p + k]; step s is kSteps[4s ...]: input block, pattern (bit c: column c holds a
// block), the W block of each column (0 where absent). kGroupColumns[2p + c]: the output block
// column of column c of pair p (-1: none, after an odd last column).
#pragma once

#include "bsjit/matmul_hopper.cuh"

namespace bsjit {
namespace kernels {

// Shared memory: the stages (an X tile of BM rows × 64 indices and two W slots of 64 × 64, all
// 128-byte swizzled), their mbarriers padded to 1024 bytes, two 64 × 64 staging tiles per consumer.
template <class Cfg>
struct DsdPairedPlan {
  static constexpr int kXBytes = Cfg::kBM * kSwizzleRowBytes;
  static constexpr int kSlotBytes = 64 * kSwizzleRowBytes;
  static constexpr int kStageBytes = kXBytes + 2 * kSlotBytes;
  static constexpr int kRecord = 4;  // ints per step in kSteps
  static constexpr int kBarrierBytes =
      (2 * Cfg::kStages * 8 + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
  static constexpr int kOutTileBytes = 2 * 64 * kSwizzleRowBytes;  // per consumer
  static constexpr int kSharedBytes =
      kSwizzleAtomBytes + Cfg::kStages * kStageBytes + kBarrierBytes + Cfg::kWarpsM * kOutTileBytes;
};

// A consumer's walk over steps begin .. end - 1 of one class, whose W slots are the set bits of
// SLOTS: waits for each stage, scales gated W blocks in place (all consumers together; a block
// gated to 0 is zeroed), issue(step) issues and commits the stage's wgmmas, and the stage before it
// (`pending`, kept across the classes) is freed once its wgmmas have finished.
template <class Cfg, int SLOTS, class Ring, class Issue>
__device__ __forceinline__ void dsd_paired_steps(const Ring& ring, const float* __restrict__ gate, int begin, int end,
                                                 int& step, int& pending, Issue issue) {
  using Plan = DsdPairedPlan<Cfg>;
  constexpr int S = Cfg::kStages, kConsumerThreads = Cfg::kWarpsM * 128;
  for (int s = begin; s < end; ++s, ++step) {
    mbarrier_wait(&ring.full[step % S], (step / S) & 1);
    if (gate != nullptr) {
      bool scaled = false;  // uniform across the consumers
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (((SLOTS >> c) & 1) == 0) continue;
        const float g = gate[Cfg::steps()[Plan::kRecord * s + 2 + c]];
        if (g == 1.0f) continue;
        unsigned* words = reinterpret_cast<unsigned*>(ring.stage(step) + Plan::kXBytes + c * Plan::kSlotBytes);
        for (int k = threadIdx.x - 128; k < Plan::kSlotBytes / 4; k += kConsumerThreads)
          words[k] = g == 0.0f ? 0u : scale_pair<typename Cfg::T>(words[k], g);
        scaled = true;
      }
      if (scaled) {
        fence_proxy_async();  // the writes, for the wgmmas that read them
        named_barrier_sync(1, kConsumerThreads);
      }
    }
    issue(step);
    wgmma_wait<1>();  // the previous step's wgmmas have finished: release its stage
    if (pending >= 0) mbarrier_arrive(&ring.empty[pending % S]);
    pending = step;
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dsd_paired_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
                      typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
                      float* __restrict__ workspace, const __grid_constant__ TensorMap map_a,
                      const __grid_constant__ TensorMap map_w, const __grid_constant__ TensorMap map_out) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  using Plan = DsdPairedPlan<Cfg>;
  constexpr int S = Cfg::kStages, BM = Cfg::kBM, kConsumers = Cfg::kWarpsM, R = BM / kConsumers;
  constexpr int kRecord = Plan::kRecord, kClasses = 3;
  static_assert(sizeof(T) == 2 && Cfg::kFeatureLast && Cfg::kBlock == 64 && Cfg::kSwapped && Cfg::kPersistent,
                "16-bit, feature axis last, b = 64, swapped, persistent");
  static_assert(Cfg::kColumns == 2 && (R == 64 || R == 128) && R * kConsumers == BM,
                "pairs of columns; consumers of 64 or 128 rows (two accumulator sets of R / 2 per thread)");
  static_assert(Cfg::kThreads == (kConsumers + 1) * 128 && S >= 2, "one producer warpgroup and the consumers");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);
  const int warpgroup = warpgroup_index();
  const int groups = Cfg::groups();                // of the layout: a table (b > 16), so one source serves its shape
  const int tiles = groups * ((n + BM - 1) / BM);  // (pair, row tile), pair fastest
  ring.init(kConsumers * 128);

  if (warpgroup == 0) {  // producer: warp 0 reads the tables 32 steps at a time, lane 0 issues the copies
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) prefetch_tensormap(map_a), prefetch_tensormap(map_w);
    int step = 0;  // this CTA's stages so far, over all its tiles
    WaveGate wave(Cfg::kWaveGate ? workspace : nullptr, tiles / static_cast<int>(gridDim.x));
    int round = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++round) {
      const int pair = tile % groups, m0 = tile / groups * BM;  // n ≤ 2^31 - 1
      const int begin = Cfg::group_steps()[kClasses * pair], end = Cfg::group_steps()[kClasses * (pair + 1)];
      wave.wait(round);
      int record[kRecord] = {0, 0, 0, 0};  // lane l: step begin + 32·⌊i / 32⌋ + l
      for (int s = begin; s < end; ++s, ++step) {
        const int j = (s - begin) % 32;
        if (j == 0 && s + lane < end)
#pragma unroll
          for (int f = 0; f < kRecord; ++f) record[f] = Cfg::steps()[kRecord * (s + lane) + f];
        int r[kRecord];
#pragma unroll
        for (int f = 0; f < kRecord; ++f) r[f] = __shfl_sync(0xffffffffu, record[f], j);
        if (step >= S) mbarrier_wait(&ring.empty[step % S], (step / S - 1) & 1);  // the whole warp
        if (lane == 0) {
          unsigned long long* bar = &ring.full[step % S];
          unsigned char* stage = ring.stage(step);
          mbarrier_arrive_expect_tx(bar, Plan::kXBytes + __popc(r[1] & 3) * Plan::kSlotBytes);
          tma_load_2d(stage, map_a, r[0] * 64, m0, bar);
          // the W block's 64 rows in the [blocks · 64, 64] view, whichever way the op reads them
          if (r[1] & 1) tma_load_2d(stage + Plan::kXBytes, map_w, 0, r[2] * 64, bar);
          if (r[1] & 2) tma_load_2d(stage + Plan::kXBytes + Plan::kSlotBytes, map_w, 0, r[3] * 64, bar);
        }
        __syncwarp();
      }
      if (lane == 0) wave.arrive(round);
    }
    if (lane == 0) wave.finish();
    return;
  }

  const int consumer = warpgroup - 1, rows = consumer * R;
  unsigned char* out_tile = reinterpret_cast<unsigned char*>(ring.full) + Plan::kBarrierBytes +
                            consumer * Plan::kOutTileBytes;
  if (threadIdx.x == 128) prefetch_tensormap(map_out);
  // d (64 features × R rows) += the W block of column c · the consumer's rows of the X tile. Rolled:
  // 4 wgmma statements instead of 16, and half the cold compile (NVRTC alone, 2-core machine,
  // suite W's Bernoulli d = 0.25 layout, plain: 352-409 → 199-201 ms); suite W at b = 64 in one
  // A/B round, unrolled → rolled: forward ×1.000, backward-data ×0.989 (0.968-1.015; 2026-12-04).
  auto chain = [&](float(&d)[R / 2], int step, int c) {
    swapped_wgmmas<Cfg, R, true>(d, ring.stage(step) + Plan::kXBytes + c * Plan::kSlotBytes,
                                 ring.stage(step) + rows * kSwizzleRowBytes);
  };
  int step = 0, piece = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int pair = tile % groups, m0 = tile / groups * BM;
    const int* bounds = Cfg::group_steps() + kClasses * pair;
    float d0[R / 2], d1[R / 2];
#pragma unroll
    for (int i = 0; i < R / 2; ++i) d0[i] = d1[i] = 0.0f;
    wgmma_fence_registers(d0);
    wgmma_fence_registers(d1);
    int pending = -1;  // the last step whose wgmmas may still read its stage (-1: none)
    dsd_paired_steps<Cfg, 3>(ring, gate, bounds[0], bounds[1], step, pending, [&](int s) {
      wgmma_fence();
      chain(d0, s, 0);
      chain(d1, s, 1);
      wgmma_commit();
    });
    dsd_paired_steps<Cfg, 1>(ring, gate, bounds[1], bounds[2], step, pending, [&](int s) {
      wgmma_fence();
      chain(d0, s, 0);
      wgmma_commit();
    });
    dsd_paired_steps<Cfg, 2>(ring, gate, bounds[2], bounds[3], step, pending, [&](int s) {
      wgmma_fence();
      chain(d1, s, 1);
      wgmma_commit();
    });
    wgmma_wait<0>();
    if (pending >= 0) mbarrier_arrive(&ring.empty[pending % S]);
    wgmma_fence_registers(d0);
    wgmma_fence_registers(d1);
    // The pair's columns through one copy of the store (a pair's first column always exists): d1
    // moves into d0 for the second. Two copies (one per column, with the accumulate path each) cost
    // the general kernel 70 ms of cold compile and the plain one 14 (NVRTC alone, 2-core machine,
    // 4096 blocks: 444 → 374 ms, 246 → 232; 2026-12-05).
    const int* columns = Cfg::group_columns() + 2 * pair;
#pragma unroll 1
    for (int c = 0; c < 2 && columns[c] >= 0; ++c) {
      store_features<Cfg, R>(d0, out, map_out, out_tile, piece, static_cast<long long>(columns[c]) * 64, m0 + rows, n,
                             accumulate, consumer);
#pragma unroll
      for (int i = 0; i < R / 2; ++i) d0[i] = d1[i];
    }
  }
  if (threadIdx.x % 32 == 0) bulk_wait_group<0>();  // shared memory outlives the stores
}

}  // namespace kernels
}  // namespace bsjit
