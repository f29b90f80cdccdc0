// What the block-sparse matmul kernel families share. The generator (generator/matmul_generator.cpp)
// instantiates one kernel of one family with a Config struct that holds the layout's tables and the
// tile choice (the generator says what each member means); the logic lives in the templates only,
// one family per header:
//   matmul_fma.cuh        dsd_kernel, sdd_kernel: FMA, any block and dtype (fp32 exact)
//   matmul_pipelined.cuh  dsd_pipelined_kernel, sdd_pipelined_kernel: mma.sync, cp.async (sm_80+)
//   matmul_wgmma.cuh      dsd_wgmma_kernel: Hopper warpgroup tensor cores, b = 64, 128
//   matmul_dsd_tma.cuh    dsd_tma_kernel: Hopper, TMA producer, persistent (forward, backward-data)
//   matmul_grouped.cuh    dsd_grouped_kernel: Hopper, b = 16, 32, output block columns in groups
//   matmul_paired.cuh     dsd_paired_kernel: Hopper, b = 64, output block columns in pairs
//   matmul_sdd_tma.cuh    sdd_tma / tiled / rows / cols kernels: Hopper backward-weight on units
//   matmul_hopper.cuh     what the Hopper kernels share (barriers, swapped wgmmas, TMA epilogue,
//                         split partials)
// dsd (dense = dense · sparse): forward Y = X·W and backward-data dX = dY·Wᵀ. sdd (sparse = dense ·
// dense): backward-weight dW = Xᵀ·dY on the nonzero blocks only.
#pragma once

#include "bsjit/common.cuh"
#include "bsjit/pipeline.cuh"
#include "bsjit/sdd_schedule.cuh"
#include "bsjit/tile.cuh"
#include "bsjit/wgmma.cuh"

namespace bsjit {
namespace kernels {

template <class Cfg>
struct SmemBytes {
  static constexpr int value = (Cfg::kBM + Cfg::kBN) * Cfg::kStride * static_cast<int>(sizeof(typename Cfg::T));
};

// Writes one output element: out = v, or out += v when accumulating (beta = 1). With beta = 0 the
// old value is never read, so an output full of NaN is overwritten cleanly.
template <class T>
__device__ __forceinline__ void store_output(T* p, float v, int accumulate) {
  if (accumulate) v += to_float(*p);
  *p = from_float<T>(v);
}

}  // namespace kernels
}  // namespace bsjit
