// Block-sparse convolution's data kernels (fprop, bprop) on Hopper's warpgroup tensor cores
// (sm_90a), for the uniform layouts of conv_igemm.cuh at b = 64 and 128: conv_igemm_data_kernel's
// walk (ConvDataWalk: the row classes, the tiles, each stage's gather and filter tap) feeding
// dsd_wgmma_kernel's stage (matmul_wgmma.cuh). A stage holds the BM gathered rows × 64 channels
// (K-major) and the tap's 64 × b slice of the packed filter, 128-byte swizzled, filled by cp.async
// from every thread; kWarpsM warpgroups each own BM / kWarpsM rows, the whole block column wide.
//   fprop: the filter slice's rows are output channels, the reduction (input channels) contiguous:
//          K-major, the matmul's backward-data order (kTransW).
//   bprop: its rows are the reduction (output channels), input channels contiguous: MN-major, the
//          matmul's forward order.
#pragma once

#include "bsjit/conv_igemm.cuh"
#include "bsjit/matmul_wgmma.cuh"

namespace bsjit {
namespace kernels {

// The matmul stage's view of a conv config (DsdWgmmaPlan, dsd_wgmma_stage, dsd_wgmma_load_w).
template <class Cfg, bool kBackward>
struct ConvWgmmaStage {
  using T = typename Cfg::T;
  static constexpr int kBlock = Cfg::kB, kBM = Cfg::kBM, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  static constexpr bool kTransW = !kBackward;
};

// O (kBackward false) or dI (true) as conv_igemm_data_kernel computes them, with the same grid;
// Cfg::kSharedBytes of dynamic shared memory (DsdWgmmaPlan).
template <class Cfg, bool kBackward>
__global__ void __launch_bounds__(Cfg::kThreads, 2)  // two CTAs an SM: 128 registers a thread
    conv_wgmma_data_kernel(const typename Cfg::T* __restrict__ act, const typename Cfg::T* __restrict__ filter,
                           typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int accumulate,
                           ConvDims p) {
  using T = typename Cfg::T;
  using Stage = ConvWgmmaStage<Cfg, kBackward>;
  using Plan = DsdWgmmaPlan<Stage>;
  constexpr int b = Cfg::kB, kSlice = Plan::kSlice, S = Cfg::kStages;
  constexpr int kRows = Cfg::kBM / Cfg::kWarpsM, kTiles = kRows / 64;  // rows and m64 tiles per warpgroup
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(Cfg) == 0, "conv_wgmma_data_kernel needs sm_90a");
#endif
  static_assert(sizeof(T) == 2 && (b == 64 || b == 128) && kSlice == 64, "16-bit, b = 64 or 128");
  static_assert(Cfg::kWarpsM * 128 == Cfg::kThreads && kTiles * 64 * Cfg::kWarpsM == Cfg::kBM,
                "kWarpsM warpgroups, each owning whole m64 tiles");
  static_assert(S >= 3, "stages: one in the tensor cores, one landing, at least one in flight");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = swizzle_aligned(smem_raw);
  __shared__ int row_image[Cfg::kBM], row_pos[Cfg::kBM];
  using Walk = ConvDataWalk<T, kBackward, b, Cfg::kBM, kSlice, Cfg::kThreads>;
  const int warpgroup = threadIdx.x / 128;
  auto stage_a = [&](int step) { return smem + (step % S) * Plan::kStageBytes; };
  auto stage_b = [&](int step) { return smem + (step % S) * Plan::kStageBytes + Plan::kABytes; };

  Walk walk(p, Cfg::tables(), blockIdx.x);
  walk.for_each_tile(row_image, row_pos, [&] {
    auto load = [&](int step) {
      unsigned char* as = stage_a(step);
      walk.gather(act, [&](int r) { return as + swizzled_offset(r, Walk::Gather::column() / 8); });
      dsd_wgmma_load_w<Stage>(stage_b(step), walk.filter_tap(filter), walk.slice * kSlice);
      walk.next();
    };
    auto gates = walk.gates(gate);
    float d[kTiles][b / 2];
    dsd_wgmma_mainloop<Stage, kTiles>(
        d, walk.total, load, [&](int) { return gates(); },
        [&](int step) { return stage_a(step) + warpgroup * kRows * kSwizzleRowBytes; }, stage_b);

#pragma unroll
    for (int t = 0; t < kTiles; ++t)
      wgmma_epilogue<b>(d[t], warpgroup * kRows + t * 64, [&](int r, int c, float v0, float v1) {
        if (row_image[r] >= 0)
          store_pair(out + walk.output_index(row_image, row_pos, blockIdx.x, r, c), v0, v1, accumulate);
      });
    __syncthreads();  // the next tile rewrites the row tables and the stages
  });
}

}  // namespace kernels
}  // namespace bsjit
