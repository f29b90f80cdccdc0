// Block-sparse convolution on Hopper's warpgroup tensor cores (sm_90a), for the uniform layouts of
// conv_igemm.cuh at b = 64 and 128. The data kernels (fprop, bprop) run conv_igemm_data_kernel's
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

// updat on the warpgroup tensor cores: as conv_igemm_updat_kernel, CTA (x, y) adds to
// workspace[block][tap][k][c] the product over its range of output positions (ConvUpdatRange, in
// stages of 64 positions, the range a multiple of them) of dO[pos, k]ᵀ · I[in(pos, tap), c], for
// Cfg::kTaps consecutive taps (the last group may hold fewer). A stage holds 64 rows of dO's block
// (k contiguous) and, for each tap, 64 gathered rows of I's (c contiguous), each in 128-byte-swizzled
// groups of 64 channels (the layout of dsd_wgmma_load_w's MN-major W slice): both operands
// MN-major. b / 64 warpgroups each own 64 rows (k) of the b × b block, all its c, for every tap.
// The taps share the stage's dO: a CTA reads (1 + kTaps) / (2 · kTaps) of the bytes a CTA per tap
// reads, which bound updat (docs/PERFORMANCE.md, "What bounds updat").
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    conv_wgmma_updat_kernel(const typename Cfg::T* __restrict__ in, const typename Cfg::T* __restrict__ grad_out,
                            float* __restrict__ workspace, const float* __restrict__ gate, int chunk, ConvDims p) {
  using T = typename Cfg::T;
  using Stage = ConvWgmmaStage<Cfg, true>;  // W slices MN-major: the operands' layout
  using Plan = DsdWgmmaPlan<Stage>;
  constexpr int b = Cfg::kB, kSlice = Plan::kSlice, S = Cfg::kStages, kGroupBytes = kSlice * kSwizzleRowBytes;
  constexpr int kTaps = Cfg::kTaps;
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(Cfg) == 0, "conv_wgmma_updat_kernel needs sm_90a");
#endif
  static_assert(sizeof(T) == 2 && (b == 64 || b == 128) && kSlice == 64, "16-bit, b = 64 or 128");
  static_assert(Cfg::kThreads == 128 * (b / 64), "a warpgroup per 64 rows of the block");
  static_assert(S >= 3, "stages: one in the tensor cores, one landing, at least one in flight");
  static_assert(kTaps >= 1 && (1 + kTaps) * Plan::kBBytes * S + kSwizzleAtomBytes == Cfg::kSharedBytes,
                "host and device disagree");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = swizzle_aligned(smem_raw);
  using Gather = ConvGatherRows<T, kSlice, b, Cfg::kThreads>;
  auto stage_a = [&](int step) { return smem + (step % S) * (1 + kTaps) * Plan::kBBytes; };  // dO
  auto stage_b = [&](int step) { return stage_a(step) + Plan::kBBytes; };  // I at each tap, kBBytes apart

  const ConvIgemmTables t = Cfg::tables();
  const ConvUpdatRange range(p, chunk, kTaps);
  if ((gate != nullptr && gate[range.block] == 0.0f) || range.length <= 0) return;
  const int taps = range.taps - range.tap < kTaps ? range.taps - range.tap : kTaps;  // this CTA's
  int reach[kTaps][3];
#pragma unroll
  for (int j = 0; j < kTaps; ++j) range.tap_reach(range.tap + (j < taps ? j : 0), reach[j]);
  const T* dy = grad_out + range.begin * p.k + static_cast<long long>(t.coords[2 * range.block]) * b;
  const T* x = in + static_cast<long long>(t.coords[2 * range.block + 1]) * b + Gather::column();
  const int warpgroup = threadIdx.x / 128;

  auto load = [&](int step) {
    const int i0 = step * kSlice;
    unsigned char* as = stage_a(step);
    unsigned char* bs = stage_b(step);
    const int c = Gather::column() / 8;  // this thread's chunk of each row: group c / 8, chunk c % 8
#pragma unroll
    for (int j = 0; j < Gather::kCount; ++j) {
      const int r = Gather::row(j), offset = (c / 8) * kGroupBytes + swizzled_offset(r, c % 8);
      const bool ok = i0 + r < range.length;
      cp_async_16(as + offset, dy + static_cast<long long>(ok ? i0 + r : 0) * p.k + Gather::column(), ok);
      int image, o[3];
      range.position(i0 + r, image, o);
#pragma unroll
      for (int k = 0; k < kTaps; ++k) {  // a tap past the CTA's last: zeros
        const long long s = range.source(image, o, reach[k], ok && k < taps);
        cp_async_16(bs + k * Plan::kBBytes + offset, x + (s < 0 ? 0 : s) * p.c, s >= 0);
      }
    }
  };
  float d[kTaps][b / 2];
  dsd_wgmma_mainloop<Stage, kTaps>(
      d, (range.length + kSlice - 1) / kSlice, load, [](int) { return 1.0f; },
      [&](int step) { return stage_a(step) + warpgroup * kGroupBytes; }, stage_b,
      [](float (&acc)[kTaps][b / 2], const unsigned char* as, const unsigned char* bs) {
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kTaps; ++k)
#pragma unroll
          for (int kk = 0; kk < kSlice / 16; ++kk)  // 16 positions further on per k16
            wgmma_m64k16<T, b, 1, 1>(
                acc[k], smem_descriptor(as + kk * 16 * kSwizzleRowBytes, kGroupBytes, kSwizzleAtomBytes),
                smem_descriptor(bs + k * Plan::kBBytes + kk * 16 * kSwizzleRowBytes, kGroupBytes, kSwizzleAtomBytes));
        wgmma_commit();
      });

#pragma unroll
  for (int k = 0; k < kTaps; ++k) {
    if (k >= taps) break;
    float* w = workspace + (static_cast<long long>(range.block) * range.taps + range.tap + k) * b * b;
    wgmma_epilogue<b>(d[k], warpgroup * 64, [&](int r, int c, float v0, float v1) {
      red_add_pair(w + r * b + c, v0, v1);  // c even: 8-byte aligned
    });
  }
}

}  // namespace kernels
}  // namespace bsjit
