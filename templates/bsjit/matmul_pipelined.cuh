// dsd_pipelined_kernel, sdd_pipelined_kernel: the products of matmul_fma.cuh for 16-bit inputs with
// the feature axis last on mma.sync tensor cores (sm_80 and later), through a multi-stage cp.async
// pipeline and ldmatrix (pipeline.cuh). The tile walk is flattened into steps (LUT entry, BK slice),
// so the pipeline runs across block boundaries. Also fp32 inputs as TF32 (opt-in), on the same tiles
// of 4-byte elements. Backward-weight may split N over CTAs (Cfg::kSplits), the last to finish a
// block adding the partials in split order.
#pragma once

#include "bsjit/matmul_common.cuh"

namespace bsjit {
namespace kernels {

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

}  // namespace kernels
}  // namespace bsjit
