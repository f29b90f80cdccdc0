// Block-sparse convolution fprop on Hopper (sm_90a) fed by TMA in im2col mode, warp-specialized and
// persistent, for the uniform layouts of conv_igemm.cuh at b = 64 and 128, 16-bit, channels last.
//
// conv_wgmma_data_kernel (conv_wgmma.cuh) gathers each stage's rows with cp.async from every
// thread, works out the rows' coordinates per tile and synchronises the CTA per stage; its short
// reductions (a 3×3 tile over two blocks is 18 stages) paid the pipeline's fill and drain per tile:
// 150-213 TFLOP/s at b = 64 on an H100 against the matmul's 600+ (docs/PERFORMANCE.md, suite C).
// Here the copy engine does the gathering. The input's tensor map is in im2col mode: its bounding
// box is the grid of filter-window corners (lower corner −pad, the traversal stepping by the
// stride), so that one copy of kBM pixels from the tile's first output position (n, m, p, q), at
// (q · stride − pad, ...), with the tap's offsets (s · dilation, ...), brings the tile's rows in
// output order across rows and images, zeros where the tap reaches padding or past the last image.
// A tiled map brings the tap's slice of the packed filter ([block][tap][k][c], conv_igemm.cuh).
//
// Warpgroup 0 is the producer (one thread issues both copies of a stage, completing on the stage's
// "full" mbarrier); warpgroups 1 .. kConsumers each own 64 rows of the tile, the whole block column
// wide, wait on "full", run the stage's wgmmas (dsd_wgmma_stage: the fprop slice is K-major, the
// matmul's backward-data order) and free the stage on its "empty" mbarrier. The CTAs walk the
// (tile, block column) items with the column fastest (CTAs running together read the same input
// rows), and the producer runs into the next item while the consumers store the last one.
// Gates: a block gated 0 is skipped by both sides, any other gate scales the filter slice in
// shared memory (as dsd_tma_stages does).
#pragma once

#include "bsjit/conv_wgmma.cuh"

namespace bsjit {
namespace kernels {

// Copies kBM pixels × the map's channels of an im2col map (RANK 4: N, H, W, C; 5: N, D, H, W, C)
// into dst: c the first channel, at[] the first pixel's window corner (W, H, D: innermost first), n
// its image, off[] the tap's offsets (W, H, D), counted on bar.
template <int RANK>
__device__ __forceinline__ void tma_load_im2col(void* dst, const TensorMap& map, int c, const int (&at)[3], int n,
                                                const unsigned short (&off)[3], unsigned long long* bar) {
  static_assert(RANK == 4 || RANK == 5, "2-D or 3-D convolutions");
  if constexpr (RANK == 4)
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6], {%7, %8};\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(at[0]), "r"(at[1]), "r"(n),
        "r"(smem_address(bar)), "h"(off[0]), "h"(off[1])
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5, %6}], [%7], {%8, %9, %10};\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(at[0]), "r"(at[1]), "r"(at[2]), "r"(n),
        "r"(smem_address(bar)), "h"(off[0]), "h"(off[1]), "h"(off[2])
        : "memory");
}

// Cfg: T, kB, kBM (64 · kConsumers), kStages, kConsumers, kThreads (128 · (1 + kConsumers)),
// kSharedBytes (the stages, then 2 · kStages mbarriers), tables(). RANK: the input map's rank.
// Grid: at most one CTA per item; `items` = tiles · block columns.
template <class Cfg, int RANK>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    conv_tma_fprop_kernel(typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int accumulate,
                          ConvDims p, const __grid_constant__ TensorMap map_in,
                          const __grid_constant__ TensorMap map_filter) {
  using T = typename Cfg::T;
  using Stage = ConvWgmmaStage<Cfg, false>;
  using Plan = DsdWgmmaPlan<Stage>;
  constexpr int b = Cfg::kB, kSlice = Plan::kSlice, S = Cfg::kStages, kSlices = b / kSlice;
  constexpr int kConsumerThreads = 128 * Cfg::kConsumers;
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(Cfg) == 0, "conv_tma_fprop_kernel needs sm_90a");
#endif
  static_assert(sizeof(T) == 2 && (b == 64 || b == 128) && kSlice == 64, "16-bit, b = 64 or 128");
  static_assert(Cfg::kBM == 64 * Cfg::kConsumers && Cfg::kThreads == 128 + kConsumerThreads,
                "one producer warpgroup, a consumer warpgroup per 64 rows");
  static_assert(S >= 2 && Cfg::kSharedBytes == S * Plan::kStageBytes + kSwizzleAtomBytes + 2 * S * 8,
                "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);

  const ConvIgemmTables t = Cfg::tables();
  const int columns = p.k / b;
  const long long out_positions = static_cast<long long>(p.out[0]) * p.out[1] * p.out[2];
  const long long rows = p.n * out_positions, tiles = (rows + Cfg::kBM - 1) / Cfg::kBM;
  const long long items = tiles * columns;
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  auto gated_off = [&](int block) { return gate != nullptr && gate[block] == 0.0f; };
  ring.init(kConsumerThreads);

  if (threadIdx.x < 128) {  // producer: warp 0 waits for free stages, lane 0 issues the copies
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) prefetch_tensormap(map_in), prefetch_tensormap(map_filter);
    int step = 0;  // this CTA's stages so far, over all its items
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
      const int col = static_cast<int>(item % columns);
      const long long row0 = item / columns * Cfg::kBM;
      // the tile's first output position and its window's corner in the input (W, H, D)
      const int n = static_cast<int>(row0 / out_positions);
      long long pos = row0 - n * out_positions;
      int at[3];
      for (int d = 2; d >= 0; --d) {
        const int o = static_cast<int>(pos % p.out[d]);
        pos /= p.out[d];
        at[2 - d] = o * p.stride[d] - p.pad[d];
      }
      const int first = t.fprop_start[col], count = t.fprop_start[col + 1] - first;
      for (int e = 0; e < count; ++e) {
        const int in_block = t.fprop_entries[2 * (first + e)], block = t.fprop_entries[2 * (first + e) + 1];
        if (gated_off(block)) continue;
        for (int tap = 0; tap < taps; ++tap) {
          const int f[3] = {tap % p.filter[2], tap / p.filter[2] % p.filter[1], tap / (p.filter[1] * p.filter[2])};
          const unsigned short off[3] = {static_cast<unsigned short>(f[0] * p.dilation[2]),
                                         static_cast<unsigned short>(f[1] * p.dilation[1]),
                                         static_cast<unsigned short>(f[2] * p.dilation[0])};
          const int filter_row = (block * taps + tap) * b;  // the tap's slice in the [blocks · taps · b, b] view
          for (int slice = 0; slice < kSlices; ++slice, ++step) {
            const int round = step / S;
            if (round > 0) mbarrier_wait(&ring.empty[step % S], (round - 1) & 1);  // the whole warp
            if (lane == 0) {
              unsigned long long* bar = &ring.full[step % S];
              unsigned char* stage = ring.stage(step);
              mbarrier_arrive_expect_tx(bar, Plan::kStageBytes);
              tma_load_im2col<RANK>(stage, map_in, in_block * b + slice * kSlice, at, n, off, bar);
              tma_load_2d(stage + Plan::kABytes, map_filter, slice * kSlice, filter_row, bar);
            }
            __syncwarp();
          }
        }
      }
    }
    return;
  }

  const int consumer = threadIdx.x / 128 - 1;
  int step = 0;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int col = static_cast<int>(item % columns);
    const long long row0 = item / columns * Cfg::kBM;
    const int first = t.fprop_start[col], count = t.fprop_start[col + 1] - first;
    float d[1][b / 2];
#pragma unroll
    for (int i = 0; i < b / 2; ++i) d[0][i] = 0.0f;
    wgmma_fence_registers(d[0]);
    int done = 0;  // stages of this item issued
    for (int e = 0; e < count; ++e) {
      const int block = t.fprop_entries[2 * (first + e) + 1];
      if (gated_off(block)) continue;
      const float g = gate == nullptr ? 1.0f : gate[block];
      for (int j = 0; j < taps * kSlices; ++j, ++step, ++done) {
        mbarrier_wait(&ring.full[step % S], (step / S) & 1);
        unsigned char* stage = ring.stage(step);
        if (g != 1.0f) {  // uniform across the consumers
          scale_shared<T>(stage + Plan::kABytes, Plan::kBBytes, g, threadIdx.x - 128, kConsumerThreads);
          fence_proxy_async();
          named_barrier_sync(1, kConsumerThreads);
        }
        dsd_wgmma_stage<Stage, 1>(d, stage + consumer * 64 * kSwizzleRowBytes, stage + Plan::kABytes);
        wgmma_wait<1>();  // the previous stage's wgmmas have finished
        if (done > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);
      }
    }
    wgmma_wait<0>();
    if (done > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);  // the item's last stage
    wgmma_fence_registers(d[0]);
    wgmma_epilogue<b>(d[0], consumer * 64, [&](int r, int c, float v0, float v1) {
      const long long row = row0 + r;
      if (row < rows) store_pair(out + row * p.k + static_cast<long long>(col) * b + c, v0, v1, accumulate);
    });
  }
}

}  // namespace kernels
}  // namespace bsjit
