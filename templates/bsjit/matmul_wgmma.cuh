// dsd_wgmma_kernel: forward and backward-data on Hopper's warpgroup tensor cores (sm_90a, b = 64
// and 128): warpgroups of 64 or 128 output rows, 64 reduction indices per pipeline stage
// (wgmma.cuh). Its shared-memory plan and stage are the base of dsd_tma_kernel's
// (matmul_dsd_tma.cuh).
#pragma once

#include "bsjit/matmul_common.cuh"

namespace bsjit {
namespace kernels {

// Shared-memory plan of dsd_wgmma_kernel. A stage holds an X tile (BM rows × 64 reduction
// indices, K-major) and a W slice: forward, 64 reduction rows × b columns (MN-major, b/64 column
// groups of 64 one after the other); backward-data, b rows × 64 (K-major). All 128-byte swizzled,
// every piece a multiple of 1024 bytes; 1024 bytes of slack align the first atom.
template <class Cfg>
struct DsdWgmmaPlan {
  // reduction indices per stage: one 128-byte row of X, 64 bytes at b = 32 (the TMA kernel only),
  // where the tiles are swizzled over 64 bytes (atoms of 8 rows × 64 bytes)
  static constexpr int kSlice = Cfg::kBlock < 64 ? Cfg::kBlock : 64;
  static constexpr int kRowBytes = 2 * kSlice, kAtomBytes = 8 * kRowBytes;
  static constexpr int kABytes = Cfg::kBM * kRowBytes;
  static constexpr int kBBytes = kSlice * Cfg::kBlock * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSharedBytes = Cfg::kStages * kStageBytes + kSwizzleAtomBytes;
};

// Multiplies every 16-bit element of `bytes` bytes of shared memory by s (a gated block), thread
// `thread` of `threads` taking every threads-th word.
template <class T>
__device__ __forceinline__ void scale_shared(unsigned char* p, int bytes, float s, int thread, int threads) {
  unsigned* words = reinterpret_cast<unsigned*>(p);
  for (int i = thread; i < bytes / 4; i += threads) words[i] = scale_pair<T>(words[i], s);
}

// Issues the wgmmas of one stage for a warpgroup owning TILES m64 tiles from `as` on, and commits
// them as one group.
template <class Cfg, int TILES>
__device__ __forceinline__ void dsd_wgmma_stage(float (&d)[TILES][Cfg::kBlock / 2], const unsigned char* as,
                                                const unsigned char* bs) {
  using T = typename Cfg::T;
  using Plan = DsdWgmmaPlan<Cfg>;
  constexpr int b = Cfg::kBlock, kSlice = Plan::kSlice, kRow = Plan::kRowBytes, kAtom = Plan::kAtomBytes;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kSlice / 16; ++kk) {
    // forward: 16 reduction rows further on, column groups kSlice rows apart; backward-data: 32
    // bytes further along each row
    const unsigned long long db =
        Cfg::kTransW ? smem_descriptor_swizzled<kRow>(bs + kk * 32, 16, kAtom)
                     : smem_descriptor_swizzled<kRow>(bs + kk * 16 * kRow, kSlice * kRow, kAtom);
#pragma unroll
    for (int t = 0; t < TILES; ++t)
      wgmma_m64k16<T, b, 0, Cfg::kTransW ? 0 : 1>(
          d[t], smem_descriptor_swizzled<kRow>(as + t * 64 * kRow + kk * 32, 16, kAtom), db);
  }
  wgmma_commit();
}

// Copies the W slice of a stage (DsdWgmmaPlan) into bs: reduction indices k0 .. k0 + 63 of the
// b × b block at wb, by cp.async over the CTA's threads.
template <class Cfg>
__device__ __forceinline__ void dsd_wgmma_load_w(unsigned char* bs, const typename Cfg::T* wb, int k0) {
  constexpr int b = Cfg::kBlock, kSlice = DsdWgmmaPlan<Cfg>::kSlice;
  if (!Cfg::kTransW) {
    constexpr int kChunksPerRow = b / 8;
#pragma unroll
    for (int i = threadIdx.x; i < kSlice * kChunksPerRow; i += Cfg::kThreads) {
      const int r = i / kChunksPerRow, c = i % kChunksPerRow;
      cp_async_16(bs + (c / 8) * (kSlice * kSwizzleRowBytes) + swizzled_offset(r, c % 8), wb + (k0 + r) * b + c * 8,
                  true);
    }
  } else {
#pragma unroll
    for (int i = threadIdx.x; i < b * 8; i += Cfg::kThreads) {
      const int r = i / 8, c = i % 8;
      cp_async_16(bs + swizzled_offset(r, c), wb + r * b + k0 + c * 8, true);
    }
  }
}

// The cp.async-fed pipeline of a warpgroup's TILES m64 tiles over `total` stages (DsdWgmmaPlan,
// Cfg::kStages of them), its accumulators d cleared first and ready to read after: load(step)
// issues stage step's copies, gate(step) is its block's gate (0 skips it, uniform across the CTA;
// otherwise it scales the W slice), a(step) this warpgroup's rows of the stage's A tile, w(step)
// its W slice, issue(d, a, w) the stage's wgmmas as one committed group (dsd_wgmma_stage unless
// given). The stage refilled at step s is the one step s − 2 read: with one wgmma group left in
// flight per step, every warpgroup has finished it once all passed this step's barrier.
template <class Cfg, int TILES, class Load, class Gate, class StageA, class StageW, class Issue>
__device__ __forceinline__ void dsd_wgmma_mainloop(float (&d)[TILES][Cfg::kBlock / 2], int total, Load load, Gate gate,
                                                   StageA a, StageW w, Issue issue) {
  constexpr int S = Cfg::kStages;
  static_assert(S >= 3, "stages: one in the tensor cores, one landing, at least one in flight");
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
#pragma unroll
    for (int i = 0; i < Cfg::kBlock / 2; ++i) d[t][i] = 0.0f;
    wgmma_fence_registers(d[t]);
  }
#pragma unroll
  for (int s = 0; s < S - 2; ++s) {
    if (s < total) load(s);
    cp_async_commit();
  }
  for (int step = 0; step < total; ++step) {
    cp_async_wait<S - 3>();
    fence_proxy_async();
    __syncthreads();
    if (step + S - 2 < total) load(step + S - 2);
    cp_async_commit();
    const float g = gate(step);
    if (g == 0.0f) {  // the stage two steps back must be free next step
      wgmma_wait<0>();
      continue;
    }
    unsigned char* bs = w(step);
    if (g != 1.0f) {
      scale_shared<typename Cfg::T>(bs, DsdWgmmaPlan<Cfg>::kBBytes, g, threadIdx.x, Cfg::kThreads);
      fence_proxy_async();
      __syncthreads();
    }
    issue(d, a(step), bs);
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int t = 0; t < TILES; ++t) wgmma_fence_registers(d[t]);
  cp_async_wait<0>();
}
template <class Cfg, int TILES, class Load, class Gate, class StageA, class StageW>
__device__ __forceinline__ void dsd_wgmma_mainloop(float (&d)[TILES][Cfg::kBlock / 2], int total, Load load, Gate gate,
                                                   StageA a, StageW w) {
  dsd_wgmma_mainloop<Cfg, TILES>(d, total, load, gate, a, w,
                                 [](float (&acc)[TILES][Cfg::kBlock / 2], const unsigned char* as,
                                    const unsigned char* bs) { dsd_wgmma_stage<Cfg, TILES>(acc, as, bs); });
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    dsd_wgmma_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
                     typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
                     float* __restrict__ workspace) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  using Plan = DsdWgmmaPlan<Cfg>;
  constexpr int b = Cfg::kBlock, kSlice = Plan::kSlice, kSlicesPerEntry = b / kSlice, S = Cfg::kStages;
  static_assert(sizeof(T) == 2 && Cfg::kFeatureLast && Cfg::kBN == b && (b == 64 || b == 128),
                "16-bit, feature axis last, b = 64 or 128");
  constexpr int kRows = Cfg::kBM / Cfg::kWarpsM, kTiles = kRows / 64;  // rows and m64 tiles per warpgroup
  static_assert(Cfg::kWarpsM * 128 == Cfg::kThreads && kRows * Cfg::kWarpsM == Cfg::kBM && kTiles * 64 == kRows,
                "kWarpsM warpgroups, each owning whole m64 tiles");
  static_assert(S >= 3, "stages: one in the tensor cores, one landing, at least one in flight");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - (smem_address(smem_raw) & (kSwizzleAtomBytes - 1))) &
                                    (kSwizzleAtomBytes - 1));

  const int col = blockIdx.x, warpgroup = threadIdx.x / 128;
  const long long m0 = static_cast<long long>(blockIdx.y) * Cfg::kBM;
  const int begin = Cfg::lut_offsets()[col], end = Cfg::lut_offsets()[col + 1];
  const int total = (end - begin) * kSlicesPerEntry;
  auto stage_a = [&](int step) { return smem + (step % S) * Plan::kStageBytes; };
  auto stage_b = [&](int step) { return smem + (step % S) * Plan::kStageBytes + Plan::kABytes; };

  auto load = [&](int step) {
    const int e = begin + step / kSlicesPerEntry, k0 = (step % kSlicesPerEntry) * kSlice;
    unsigned char* as = stage_a(step);
    const T* x = a + m0 * Cfg::kInDim + static_cast<long long>(Cfg::lut()[2 * e]) * b + k0;
#pragma unroll
    for (int i = threadIdx.x; i < Cfg::kBM * 8; i += Cfg::kThreads) {
      const int r = i / 8, c = i % 8;
      const bool ok = m0 + r < n;  // rows past N are zero-filled
      cp_async_16(as + swizzled_offset(r, c), x + (ok ? r : 0) * Cfg::kInDim + c * 8, ok);
    }
    dsd_wgmma_load_w<Cfg>(stage_b(step), w + static_cast<long long>(Cfg::lut()[2 * e + 1]) * b * b, k0);
  };

  float d[kTiles][b / 2];
  dsd_wgmma_mainloop<Cfg, kTiles>(
      d, total, load,
      [&](int step) { return gate == nullptr ? 1.0f : gate[Cfg::lut()[2 * (begin + step / kSlicesPerEntry) + 1]]; },
      [&](int step) { return stage_a(step) + warpgroup * kRows * kSwizzleRowBytes; }, stage_b);

#pragma unroll
  for (int t = 0; t < kTiles; ++t)
    wgmma_epilogue<b>(d[t], warpgroup * kRows + t * 64, [&](int r, int c, float v0, float v1) {
      const long long m = m0 + r;
      if (m >= n) return;
      store_pair(out + m * Cfg::kOutDim + static_cast<long long>(col) * b + c, v0, v1, accumulate);
    });
}

}  // namespace kernels
}  // namespace bsjit
