// Block-sparse matmul kernels. The generator instantiates one of them with a Config struct that
// holds the layout's tables and the tile choice (generator/matmul_generator.cpp says what each
// member means); the logic lives here only.
//
// dsd_kernel (dense = dense · sparse): forward Y = X·W and backward-data dX = dY·Wᵀ.
//   One CTA computes a BM × b tile of the output: rows m0 .. m0+BM of N, output block column
//   blockIdx.x. It walks that column's lookup table, (input block, W block) pairs, and for each
//   pair accumulates A[m0.., input block] · W_block (or W_blockᵀ), BK reduction indices at a time.
//
// dsd_pipelined_kernel, sdd_pipelined_kernel: the same products for 16-bit inputs with the feature
//   axis last, through a multi-stage cp.async pipeline and ldmatrix (pipeline.cuh). The tile walk is
//   flattened into steps (LUT entry, BK slice), so the pipeline runs across block boundaries. Also
//   fp32 inputs as TF32 (opt-in), on the same tiles of 4-byte elements.
//
// dsd_wgmma_kernel: the same products on Hopper's warpgroup tensor cores (sm_90a, b = 64 and 128):
//   warpgroups of 64 or 128 output rows, 64 reduction indices per pipeline stage (wgmma.cuh).
//
// dsd_tma_kernel: the same with a TMA producer warpgroup and mbarriers (warp specialization),
//   persistent, its epilogue stored by TMA; swapped (Cfg::kSwapped, the default), each consumer
//   computes Yᵀ = Wᵀ·Xᵀ for 64 output features. The grouped kernel of b = 16 and 32 is in
//   matmul_grouped.cuh.
//
// sdd_kernel (sparse = dense · dense): backward-weight dW = Xᵀ·dY on the nonzero blocks only.
//   One CTA computes one b × b block (row c, column k): Xᵀ[c block, :] · dY[:, k block], reducing
//   over N, BK rows of N at a time. sdd_tma_kernel and sdd_tiled_kernel are its Hopper versions.
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

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    dsd_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
               typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
               float* __restrict__ workspace) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  constexpr int b = Cfg::kBlock;
  static_assert(Cfg::kBN == b, "one CTA covers one output block column");
  static_assert(b % Cfg::kBK == 0 && Cfg::kStride >= Cfg::kBK, "BK must divide the block");
  __shared__ __align__(16) T As[Cfg::kBM * Cfg::kStride];
  __shared__ __align__(16) T Bs[Cfg::kBN * Cfg::kStride];

  const int col = blockIdx.x;
  const long long m0 = static_cast<long long>(blockIdx.y) * Cfg::kBM;
  TileAccumulator<Cfg> tile;
  tile.clear();

  const int begin = Cfg::lut_offsets()[col], end = Cfg::lut_offsets()[col + 1];
  for (int e = begin; e < end; ++e) {
    const int in_block = Cfg::lut()[2 * e], w_block = Cfg::lut()[2 * e + 1];
    float g = 1.0f;
    if (gate != nullptr) {
      g = gate[w_block];  // same value in every thread: the branch is uniform
      if (g == 0.0f) continue;
    }
    const T* wb = w + static_cast<long long>(w_block) * b * b;
    for (int k0 = 0; k0 < b; k0 += Cfg::kBK) {
      __syncthreads();  // the previous step's tiles are no longer read
      load_tile<Cfg::kBM, Cfg::kBK, Cfg::kStride, Cfg::kThreads, Cfg::kFeatureLast>(As, [&](int r, int c) {
        const long long m = m0 + r;
        if (m >= n) return zero<T>();
        const long long f = static_cast<long long>(in_block) * b + k0 + c;
        return Cfg::kFeatureLast ? a[m * Cfg::kInDim + f] : a[f * n + m];
      });
      // Bs[r][c]: r = output column inside the block, c = reduction index.
      load_tile<Cfg::kBN, Cfg::kBK, Cfg::kStride, Cfg::kThreads, Cfg::kTransW>(Bs, [&](int r, int c) {
        return Cfg::kTransW ? wb[r * b + k0 + c] : wb[(k0 + c) * b + r];
      });
      if (g != 1.0f) {
        __syncthreads();
        scale_tile<Cfg::kBN, Cfg::kBK, Cfg::kStride, Cfg::kThreads>(Bs, g);
      }
      __syncthreads();
      tile.accumulate(As, Bs);
    }
  }

  tile.epilogue([&](int r, int c, float v) {
    const long long m = m0 + r;
    if (m >= n) return;
    const long long f = static_cast<long long>(col) * b + c;
    store_output(Cfg::kFeatureLast ? out + m * Cfg::kOutDim + f : out + f * n + m, v, accumulate);
  });
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    sdd_kernel(const typename Cfg::T* __restrict__ x, const typename Cfg::T* __restrict__ dy,
               typename Cfg::T* __restrict__ dw, const float* __restrict__ gate, int n, int accumulate,
               float* __restrict__ workspace) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  constexpr int b = Cfg::kBlock;
  static_assert(Cfg::kBM == b && Cfg::kBN == b, "one CTA covers one b × b block");
  __shared__ __align__(16) T As[Cfg::kBM * Cfg::kStride];
  __shared__ __align__(16) T Bs[Cfg::kBN * Cfg::kStride];

  const int block = blockIdx.x;
  const long long c_base = static_cast<long long>(Cfg::coords()[2 * block]) * b;
  const long long k_base = static_cast<long long>(Cfg::coords()[2 * block + 1]) * b;
  const float g = gate != nullptr ? gate[block] : 1.0f;
  TileAccumulator<Cfg> tile;
  tile.clear();

  if (g != 0.0f) {
    for (long long n0 = 0; n0 < n; n0 += Cfg::kBK) {
      __syncthreads();
      // As[r][c] = X[n0 + c][c_base + r], Bs[r][c] = dY[n0 + c][k_base + r]
      load_tile<Cfg::kBM, Cfg::kBK, Cfg::kStride, Cfg::kThreads, !Cfg::kFeatureLast>(As, [&](int r, int c) {
        const long long row = n0 + c;
        if (row >= n) return zero<T>();
        return Cfg::kFeatureLast ? x[row * Cfg::kInDim + c_base + r] : x[(c_base + r) * n + row];
      });
      load_tile<Cfg::kBN, Cfg::kBK, Cfg::kStride, Cfg::kThreads, !Cfg::kFeatureLast>(Bs, [&](int r, int c) {
        const long long row = n0 + c;
        if (row >= n) return zero<T>();
        return Cfg::kFeatureLast ? dy[row * Cfg::kOutDim + k_base + r] : dy[(k_base + r) * n + row];
      });
      __syncthreads();
      tile.accumulate(As, Bs);
    }
  }

  T* out = dw + static_cast<long long>(block) * b * b;
  tile.epilogue([&](int r, int c, float v) { store_output(out + r * b + c, v * g, accumulate); });
}

// Shared-memory plan of the pipelined kernels. The generator computes the same numbers (and the
// kernels static_assert that they agree), because the host launches with that much dynamic memory.
template <class Cfg>
struct DsdPipelinedPlan {
  using T = typename Cfg::T;
  static constexpr int kSA = Cfg::kBK + TilePad<T, true>::value;  // As[BM][BK]: X rows, K-major
  // forward: Bs[BK][b] (W rows, MN-major); backward-data: Bs[b][BK] (W rows are Wᵀ's columns, K-major)
  static constexpr bool kBKMajor = Cfg::kTransW;
  static constexpr int kSB = kBKMajor ? Cfg::kBK + TilePad<T, true>::value : Cfg::kBlock + TilePad<T, false>::value;
  static constexpr int kAStage = Cfg::kBM * kSA;
  static constexpr int kBStage = kBKMajor ? Cfg::kBlock * kSB : Cfg::kBK * kSB;
  static constexpr int kSharedBytes = Cfg::kStages * (kAStage + kBStage) * static_cast<int>(sizeof(T));
};

// A float written by another CTA of this launch: read from L2, past this SM's L1.
__device__ __forceinline__ float load_global_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

// for_each of store_dw_block for an accumulator object with an epilogue(store) member. (NVRTC
// takes no generic lambdas in device code.)
template <class Acc>
struct EpilogueOf {
  const Acc& acc;
  template <class Store>
  __device__ __forceinline__ void operator()(Store store) const {
    acc.epilogue(store);
  }
};

// Writes one E × E tile of dW (tile `tile` of gridDim.x) from the accumulators this CTA's threads
// hold: for_each(store) calls store(r, c, v0, v1) for every pair of adjacent values (r, c),
// (r, c + 1) a thread holds, and write(r, c, v0, v1) puts a pair of the finished tile in place.
// Every thread of the CTA must call the same instantiation (it has a __shared__ flag and CTA
// barriers).
// Split over N (Cfg::kSplits CTAs per tile, blockIdx.y = split): each split writes its fp32
// partial; the last split of the tile to finish adds them in split order (deterministic) and
// writes. workspace: one arrival counter per tile (of the kSplitCounters), which the last split sets
// back to 0 for the next launch, then [kSplits][tiles][E][E] partials.
template <class Cfg, int E, class ForEach, class Write>
__device__ __forceinline__ void store_dw_tile(ForEach for_each, Write write, int tile, float* workspace) {
  if (Cfg::kSplits == 1) {
    for_each(write);
    return;
  }
  const long long plane = static_cast<long long>(gridDim.x) * E * E;
  unsigned* counters = reinterpret_cast<unsigned*>(workspace);
  float* partials = workspace + kSplitCounters;
  float* mine = partials + blockIdx.y * plane + static_cast<long long>(tile) * E * E;
  for_each([&](int r, int c, float v0, float v1) {
    mine[r * E + c] = v0;
    mine[r * E + c + 1] = v1;
  });
  __threadfence();
  __syncthreads();
  __shared__ int last;
  if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1u) == Cfg::kSplits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* base = partials + static_cast<long long>(tile) * E * E;
  for_each([&](int r, int c, float, float) {
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll 1
    for (int s = 0; s < Cfg::kSplits; ++s) {
      v0 += load_global_cg(base + s * plane + r * E + c);
      v1 += load_global_cg(base + s * plane + r * E + c + 1);
    }
    write(r, c, v0, v1);
  });
  if (threadIdx.x == 0) counters[tile] = 0;
}

// store_dw_tile for one b × b block of dW (block `block`, scaled by its gate g).
template <class Cfg, class ForEach>
__device__ __forceinline__ void store_dw_block(ForEach for_each, typename Cfg::T* dw, int block, float g,
                                               int accumulate, float* workspace) {
  constexpr int b = Cfg::kBlock;
  typename Cfg::T* out = dw + static_cast<long long>(block) * b * b;
  store_dw_tile<Cfg, b>(
      for_each,
      [&](int r, int c, float v0, float v1) { store_pair(out + r * b + c, v0 * g, v1 * g, accumulate); }, block,
      workspace);
}

// The rows of N a backward-weight CTA reduces: split blockIdx.y of Cfg::kSplits, each a chunk of
// whole steps of `step` rows; empty when the block's gate is 0.
template <class Cfg>
struct SddRange {
  long long begin, end;
  int steps;
  __device__ __forceinline__ SddRange(int n, int step, float g) {
    const long long chunk = (n + static_cast<long long>(Cfg::kSplits) * step - 1) /
                            (static_cast<long long>(Cfg::kSplits) * step) * step;
    begin = blockIdx.y * chunk;
    end = begin + chunk < n ? begin + chunk : n;
    steps = (g != 0.0f && end > begin) ? static_cast<int>((end - begin + step - 1) / step) : 0;
  }
};

template <class Cfg>
struct SddPipelinedPlan {
  using T = typename Cfg::T;
  // As[BK][b] = X rows, Bs[BK][b] = dY rows: both MN-major
  static constexpr int kS = Cfg::kBlock + TilePad<T, false>::value;
  static constexpr int kStage = Cfg::kBK * kS;
  static constexpr int kSharedBytes = Cfg::kStages * 2 * kStage * static_cast<int>(sizeof(T));
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    dsd_pipelined_kernel(const typename Cfg::T* __restrict__ a, const typename Cfg::T* __restrict__ w,
                         typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int n, int accumulate,
               float* __restrict__ workspace) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  using Plan = DsdPipelinedPlan<Cfg>;
  // A stage holds kGroup slices of kSlice reduction indices each: one LUT entry's whole block per
  // slice when kGroup > 1 (small blocks: more work per barrier), else kSlice = BK ≤ b.
  constexpr int b = Cfg::kBlock, kSlice = Cfg::kBK / Cfg::kGroup, kSlicesPerEntry = b / kSlice;
  static_assert((sizeof(T) == 2 || sizeof(T) == 4) && Cfg::kFeatureLast && Cfg::kBN == b,
                "16-bit (or fp32 as TF32), feature axis last, BN = b");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  static_assert(Cfg::kStages >= 2 && b % kSlice == 0 && kSlice % 16 == 0, "pipeline shape");
  static_assert(Cfg::kGroup == 1 || kSlice == b, "grouped stages take whole blocks");
  extern __shared__ __align__(128) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + Cfg::kStages * Plan::kAStage;

  const int col = blockIdx.x;
  const long long m0 = static_cast<long long>(blockIdx.y) * Cfg::kBM;
  const int begin = Cfg::lut_offsets()[col], end = Cfg::lut_offsets()[col + 1];
  const int slices = (end - begin) * kSlicesPerEntry;
  const int total = (slices + Cfg::kGroup - 1) / Cfg::kGroup;

  auto load = [&](int step) {
    const int stage = step % Cfg::kStages;
#pragma unroll
    for (int g = 0; g < Cfg::kGroup; ++g) {
      const int t = step * Cfg::kGroup + g;
      const bool live = t < slices;  // a group past the column's last block loads zeros
      const int e = begin + (live ? t / kSlicesPerEntry : 0), k0 = (t % kSlicesPerEntry) * kSlice;
      const T* x = a + m0 * Cfg::kInDim + static_cast<long long>(Cfg::lut()[2 * e]) * b + k0;
      copy_tile_async<Cfg::kBM, kSlice, Plan::kSA, Cfg::kThreads>(
          As + stage * Plan::kAStage + g * kSlice, [&](int r) { return x + r * Cfg::kInDim; },
          [&](int r) { return live && m0 + r < n; });
      const T* wb = w + static_cast<long long>(Cfg::lut()[2 * e + 1]) * b * b;
      if (Plan::kBKMajor)
        copy_tile_async<b, kSlice, Plan::kSB, Cfg::kThreads>(
            Bs + stage * Plan::kBStage + g * kSlice, [&](int r) { return wb + r * b + k0; }, [&](int) { return live; });
      else
        copy_tile_async<kSlice, b, Plan::kSB, Cfg::kThreads>(
            Bs + stage * Plan::kBStage + g * kSlice * Plan::kSB, [&](int r) { return wb + (k0 + r) * b; },
            [&](int) { return live; });
    }
  };
  // Gate of the LUT entry feeding reduction index kk of a stage (1 past the last entry: zeros anyway).
  auto scale_of = [&](int step, int kk) {
    const int t = step * Cfg::kGroup + kk / kSlice;
    return (gate == nullptr || t >= slices) ? 1.0f : gate[Cfg::lut()[2 * (begin + t / kSlicesPerEntry) + 1]];
  };

  WarpMma<Cfg, true, Plan::kBKMajor, Plan::kSA, Plan::kSB> mma;
  mma.clear();
  run_pipeline<Cfg::kStages>(total, load, [&](int step) {
    const int stage = step % Cfg::kStages;
    const T* as = As + stage * Plan::kAStage;
    const T* bs = Bs + stage * Plan::kBStage;
    if (Cfg::kGroup > 1) {
      mma.step_sliced(as, bs, [&](int kk) { return scale_of(step, kk); });
    } else {
      const float g = scale_of(step, 0);  // one block per stage: one gate; 0 skips the block's work
      if (g != 0.0f) mma.step(as, bs, g);
    }
  });

  mma.epilogue([&](int r, int c, float v0, float v1) {
    const long long m = m0 + r;
    if (m >= n) return;
    store_pair(out + m * Cfg::kOutDim + static_cast<long long>(col) * b + c, v0, v1, accumulate);
  });
}

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
    unsigned char* bs = stage_b(step);
    const T* wb = w + static_cast<long long>(Cfg::lut()[2 * e + 1]) * b * b;
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
  };

  float d[kTiles][b / 2];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int i = 0; i < b / 2; ++i) d[t][i] = 0.0f;
    wgmma_fence_registers(d[t]);
  }

  // The stage being refilled at step s is the one step s-2 read: with one wgmma group left in
  // flight per step, every warpgroup has finished it once all passed this step's barrier.
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
    const float g = gate == nullptr ? 1.0f : gate[Cfg::lut()[2 * (begin + step / kSlicesPerEntry) + 1]];
    if (g == 0.0f) {  // uniform across the CTA; the stage two steps back must be free next step
      wgmma_wait<0>();
      continue;
    }
    unsigned char* as = stage_a(step) + warpgroup * kRows * kSwizzleRowBytes;
    unsigned char* bs = stage_b(step);
    if (g != 1.0f) {
      scale_shared<T>(bs, Plan::kBBytes, g, threadIdx.x, Cfg::kThreads);
      fence_proxy_async();
      __syncthreads();
    }
    dsd_wgmma_stage<Cfg, kTiles>(d, as, bs);
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int t = 0; t < kTiles; ++t) wgmma_fence_registers(d[t]);
  cp_async_wait<0>();

#pragma unroll
  for (int t = 0; t < kTiles; ++t)
    wgmma_epilogue<b>(d[t], warpgroup * kRows + t * 64, [&](int r, int c, float v0, float v1) {
      const long long m = m0 + r;
      if (m >= n) return;
      store_pair(out + m * Cfg::kOutDim + static_cast<long long>(col) * b + c, v0, v1, accumulate);
    });
}

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

// Synchronises the 128 threads of consumer warpgroup `consumer` (0..3) on named barrier 2 + consumer.
// The ids are spelled out as constants: with an id in a register, ptxas reserves all 16 barriers,
// which keeps a second CTA off the SM.
__device__ __forceinline__ void consumer_barrier(int consumer) {
  switch (consumer) {
    case 0: named_barrier_sync(2, 128); break;
    case 1: named_barrier_sync(3, 128); break;
    case 2: named_barrier_sync(4, 128); break;
    default: named_barrier_sync(5, 128); break;
  }
}

// The wgmmas of one 64-index stage of the swapped product (Yᵀ = Wᵀ·Xᵀ), issued, not committed: d (64
// output features × R rows) += A·B, A the 64 W rows at `as` (MN-major forward: reduction rows of 64
// features, a further group of 64 features 64 rows on; K-major backward-data), B R rows of the X
// tile at `bs` (K-major).
// ROLLED: the 4 wgmmas as a loop, one wgmma statement, for kernels that branch to their roles on
// warpgroup_index (ptxas serializes a rolled wgmma on a path it cannot prove warp-uniform).
template <class Cfg, int R, bool ROLLED = false>
__device__ __forceinline__ void swapped_wgmmas(float (&d)[R / 2], const unsigned char* as, const unsigned char* bs) {
#pragma unroll(ROLLED ? 1 : 4)
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64k16<typename Cfg::T, R, Cfg::kTransW ? 0 : 1, 0>(
        d,
        Cfg::kTransW ? smem_descriptor(as + kk * 32, 16, kSwizzleAtomBytes)
                     : smem_descriptor(as + kk * 16 * kSwizzleRowBytes, 64 * kSwizzleRowBytes, kSwizzleAtomBytes),
        smem_descriptor(bs + kk * 32, 16, kSwizzleAtomBytes));
}

// A swapped consumer's output tile on its way out: Yᵀ, 64 output features from feature0 × R rows
// from row_base (rows at or past n are not stored), rounded to 16-bit pairs. packed[j] holds
// accumulators 2j and 2j + 1, d[4i + 2h + e] being feature 16·warp + lane / 4 + 8h, row
// 8i + 2·(lane % 4) + e.
template <int R>
struct PackedFeatures {
  unsigned packed[R / 4];
  long long feature0;
  int row_base;
};

// Adds Y's old values to a swapped consumer's accumulators (R rows from row_base, 64 features from
// feature0; every consumer thread calls it), in fp32, so that the result is rounded once. They come
// in through the consumer's two staging tiles (out_tile), 64 rows at a time as store_feature_piece
// writes them: each thread copies 16-byte chunks of the rows Y holds (whole 128-byte rows, row-major)
// into the swizzled tile, and ldmatrix.trans hands each thread the old values of its accumulators.
// Loaded per accumulator instead (a 16-bit load and a row check each, R / 2 of them: a branch each),
// the path was a third of the b = 128 forward's cold compile (NVRTC alone: 559-662 ms, 385 with no
// accumulate path at all, 475-479 this way; 2026-12-04). The paired kernel (two calls) gained nothing.
template <class Cfg, int R>
__device__ __forceinline__ void add_old_features(float (&d)[R / 2], const typename Cfg::T* __restrict__ out,
                                                 unsigned char* out_tile, long long feature0, int row_base, int n,
                                                 int consumer) {
  using T = typename Cfg::T;
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  if (threadIdx.x % 128 == 0) bulk_wait_group_read<0>();  // the consumer's stores have read both tiles
  consumer_barrier(consumer);
#pragma unroll
  for (int p = 0; p < R / 64; ++p) {
    // (the tile's reads two pieces ago ended before the barrier of the last piece)
    unsigned char* tile_p = out_tile + (p % 2) * 64 * kSwizzleRowBytes;
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // 64 rows of 8 chunks, 4 per thread
      const int e = threadIdx.x % 128 + 128 * k, row = e / 8, chunk = e % 8;
      const long long m = static_cast<long long>(row_base) + 64 * p + row;
      if (m < n)
        *reinterpret_cast<Chunk16*>(tile_p + swizzled_offset(row, chunk)) =
            *reinterpret_cast<const Chunk16*>(out + m * Cfg::kOutDim + feature0 + 8 * chunk);
    }
    consumer_barrier(consumer);
#pragma unroll
    for (int i = 8 * p; i < 8 * p + 8; i += 2) {
      // the ldmatrix tile q that store_feature_piece's stmatrix writes: packed pairs 2i .. 2i + 3
      const int q = lane / 8, row = 8 * (i - 8 * p + q / 2) + lane % 8, chunk = 2 * warp + q % 2;
      add_ldmatrix<T, true>(d + 4 * i, tile_p + swizzled_offset(row, chunk));
    }
  }
  consumer_barrier(consumer);  // the tiles are read: the pieces' stores may fill them
}

// Rounds a swapped consumer's accumulators into `tile`; with accumulate, Y's old values are added in
// fp32 first (add_old_features, through the staging tiles at out_tile: every consumer thread calls it).
template <class Cfg, int R>
__device__ __forceinline__ void pack_features(float (&d)[R / 2], PackedFeatures<R>& tile,
                                              const typename Cfg::T* __restrict__ out, unsigned char* out_tile,
                                              long long feature0, int row_base, int n, int accumulate, int consumer) {
  using T = typename Cfg::T;
  if (accumulate) add_old_features<Cfg, R>(d, out, out_tile, feature0, row_base, n, consumer);
#pragma unroll
  for (int j = 0; j < R / 4; ++j) tile.packed[j] = pack_pair<T>(d[2 * j], d[2 * j + 1]);
  tile.feature0 = feature0, tile.row_base = row_base;
}

// Stores piece p (rows 64p .. 64p + 63, p below R / 64) of a packed tile through the consumer's two
// staging tiles (out_tile), taken in turn, `piece` counting the pieces over the CTA's life:
// stmatrix.trans writes the rows of a staging tile from the transposed fragments and one thread
// stores it by TMA. Before the barrier that hands a piece to the store, that thread waits until the
// store before it has read the other staging tile, which the next piece fills. p is a run-time value:
// the piece's 16 packed registers are selected from the R / 64 candidates (statically indexed), so
// that one copy of the store serves every piece (one per piece made the kernel's code, and NVRTC's
// time, grow with R / 64 per call site).
template <int R>
__device__ __forceinline__ void store_feature_piece(int p, const PackedFeatures<R>& tile, const TensorMap& map_out,
                                                    unsigned char* out_tile, int& piece, int n, int consumer) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  unsigned char* tile_p = out_tile + (piece % 2) * 64 * kSwizzleRowBytes;
  unsigned v[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = select_static<R / 64>(p, [&](int q) { return tile.packed[16 * q + j]; });
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    // stmatrix tile q: rows 8 (i + q / 2) .., features 16·warp + 8 (q % 2) ..
    const int q = lane / 8, row = 8 * (i + q / 2) + lane % 8, chunk = 2 * warp + q % 2;
    const unsigned r[4] = {v[2 * i], v[2 * i + 1], v[2 * i + 2], v[2 * i + 3]};
    stmatrix_x4_trans(tile_p + swizzled_offset(row, chunk), r);
  }
  fence_proxy_async();
  if (threadIdx.x % 128 == 0) bulk_wait_group_read<0>();
  consumer_barrier(consumer);
  const int row0 = tile.row_base + 64 * p;
  if (threadIdx.x % 128 == 0 && row0 < n) {
    tma_store_2d(map_out, tile_p, static_cast<int>(tile.feature0), row0);
    bulk_commit_group();
  }
  ++piece;
}

// Stores the pieces `first` .. R / 64 - 1 of a packed tile (a rolled loop: one copy of the store).
template <int R>
__device__ __forceinline__ void store_feature_pieces(int first, const PackedFeatures<R>& tile, const TensorMap& map_out,
                                                     unsigned char* out_tile, int& piece, int n, int consumer) {
#pragma unroll 1
  for (int p = first; p < R / 64; ++p) store_feature_piece(p, tile, map_out, out_tile, piece, n, consumer);
}

// Stores a swapped consumer's accumulators at once (pack_features, then every piece).
template <class Cfg, int R>
__device__ __forceinline__ void store_features(float (&d)[R / 2], typename Cfg::T* __restrict__ out,
                                               const TensorMap& map_out, unsigned char* out_tile, int& piece,
                                               long long feature0, int row_base, int n, int accumulate, int consumer) {
  PackedFeatures<R> tile;
  pack_features<Cfg, R>(d, tile, out, out_tile, feature0, row_base, n, accumulate, consumer);
  store_feature_pieces(0, tile, map_out, out_tile, piece, n, consumer);
}

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

// The reduction of split pieces (backward-weight's SddSchedule pieces, the small batch's split
// columns): a piece's accumulators d (TILES m64 tiles of N columns a consumer thread) go to its
// plane; the last of the `pieces` to arrive (counter) adds every plane, in piece order
// (deterministic), into d, sets the counter back to 0 for the next launch and returns true; the
// others return false. Planes: `planes`, `plane` floats apart (16-byte aligned). leader: the thread
// that counts. Every one of the kConsumerThreads consumer threads calls it.
// A plane holds the partials thread-major, not as the tile: every piece runs the same kernel, so a
// consumer thread holds the same elements of the tile in each, and the last piece adds slot by
// slot. Vector v of thread s is float4 v · kConsumerThreads + s: each access a warp's 512
// contiguous bytes, each at a constant offset from one address. Stored as the tile (a float2 per
// accumulator pair, its address from the pair's row and column), the reduction cost a b = 64 row
// group 270 ms of cold compile (415 → 685 ms; PTX 2479 → 3363 lines).
template <int kConsumerThreads, int TILES, int N>
__device__ __forceinline__ bool add_piece_partials(float (&d)[TILES][N / 2], float* planes, long long plane, int piece,
                                                   int pieces, unsigned* counter, int leader) {
  constexpr int kVectors = TILES * N / 8;  // float4s a thread
  static_assert(N % 8 == 0, "whole float4s of a tile's accumulators");
  const int slot = threadIdx.x % kConsumerThreads;  // the consumer threads, one to one
  float4* mine = reinterpret_cast<float4*>(planes + piece * plane) + slot;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const float* a = &d[4 * v / (N / 2)][4 * v % (N / 2)];
    mine[v * kConsumerThreads] = make_float4(a[0], a[1], a[2], a[3]);
  }
  __threadfence();
  named_barrier_sync(1, kConsumerThreads);
  __shared__ int last;
  if (threadIdx.x == leader) last = atomicAdd(counter, 1u) == static_cast<unsigned>(pieces - 1);
  named_barrier_sync(1, kConsumerThreads);
  if (!last) return false;
  __threadfence();
#pragma unroll
  for (int t = 0; t < TILES; ++t)
#pragma unroll
    for (int e = 0; e < N / 2; ++e) d[t][e] = 0.0f;
#pragma unroll 1
  for (int j = 0; j < pieces; ++j) {
    const float4* from = reinterpret_cast<const float4*>(planes + j * plane) + slot;
#pragma unroll
    for (int v = 0; v < kVectors; ++v) {
      const float4 x = __ldcg(from + v * kConsumerThreads);
      float* a = &d[4 * v / (N / 2)][4 * v % (N / 2)];
      a[0] += x.x, a[1] += x.y, a[2] += x.z, a[3] += x.w;
    }
  }
  if (threadIdx.x == leader) *counter = 0;
  return true;
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
  int count, first, stride, items;
  __device__ __forceinline__ explicit DsdTiles(int n) {
    const int row_tiles = (n + Cfg::kBM - 1) / Cfg::kBM;
    if constexpr (Cfg::kSplit) {
      first = Cfg::cta_items()[blockIdx.x];
      items = 1 + Cfg::cta_items()[blockIdx.x + 1] - first;
      stride = 0;
      count = items * row_tiles;
    } else {
      const int tiles = Cfg::kOutBlocks * row_tiles;
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
    for (int i = 0; i < work.count; ++i) {
      const DsdTile tile = next;
      const int m0 = tile.m0, begin = tile.begin, entries = tile.end - begin, total = entries * kSlicesPerEntry;
      if (i + 1 < work.count) next = work.at(i + 1);
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
    }
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

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    sdd_pipelined_kernel(const typename Cfg::T* __restrict__ x, const typename Cfg::T* __restrict__ dy,
                         typename Cfg::T* __restrict__ dw, const float* __restrict__ gate, int n, int accumulate,
               float* __restrict__ workspace) {
  using T = typename Cfg::T;
  drop_call_options<Cfg>(gate, accumulate);
  using Plan = SddPipelinedPlan<Cfg>;
  constexpr int b = Cfg::kBlock;
  static_assert((sizeof(T) == 2 || sizeof(T) == 4) && Cfg::kFeatureLast && Cfg::kBM == b && Cfg::kBN == b,
                "16-bit (or fp32 as TF32), feature last, b × b");
  static_assert(Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  extern __shared__ __align__(128) unsigned char smem[];
  T* As = reinterpret_cast<T*>(smem);
  T* Bs = As + Cfg::kStages * Plan::kStage;

  const int block = blockIdx.x;
  const long long c_base = static_cast<long long>(Cfg::coords()[2 * block]) * b;
  const long long k_base = static_cast<long long>(Cfg::coords()[2 * block + 1]) * b;
  const float g = gate != nullptr ? gate[block] : 1.0f;
  // Split over N (kSplits CTAs per block) when the layout has too few blocks to fill the GPU.
  const SddRange<Cfg> range(n, Cfg::kBK, g);
  const long long n_begin = range.begin, n_end = range.end;
  const int total = range.steps;

  auto load = [&](int step) {
    const int stage = step % Cfg::kStages;
    const long long n0 = n_begin + static_cast<long long>(step) * Cfg::kBK;
    const T* xs = x + n0 * Cfg::kInDim + c_base;
    const T* ds = dy + n0 * Cfg::kOutDim + k_base;
    copy_tile_async<Cfg::kBK, b, Plan::kS, Cfg::kThreads>(
        As + stage * Plan::kStage, [&](int r) { return xs + r * Cfg::kInDim; }, [&](int r) { return n0 + r < n_end; });
    copy_tile_async<Cfg::kBK, b, Plan::kS, Cfg::kThreads>(
        Bs + stage * Plan::kStage, [&](int r) { return ds + r * Cfg::kOutDim; }, [&](int r) { return n0 + r < n_end; });
  };

  WarpMma<Cfg, false, false, Plan::kS, Plan::kS> mma;
  mma.clear();
  run_pipeline<Cfg::kStages>(total, load, [&](int step) {
    const int stage = step % Cfg::kStages;
    mma.step(As + stage * Plan::kStage, Bs + stage * Plan::kStage, 1.0f);
  });

  store_dw_block<Cfg>(EpilogueOf<decltype(mma)>{mma}, dw, block, g, accumulate, workspace);
}

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
      for (int k = item.first; k < item.last; ++k, ++i) {
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
      }
    }
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
