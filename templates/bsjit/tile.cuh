// The CTA-level building blocks of every matmul kernel: loading a tile into shared memory and
// accumulating As·Bsᵀ into registers, on the tensor cores (mma.sync) or on the FMA pipes.
//
// Shared-memory tiles are stored "k contiguous": As[m][k] (BM × BK) and Bs[n][k] (BN × BK), so a
// tensor-core fragment is two adjacent 16-bit values, one 32-bit load.
#pragma once

#include "bsjit/common.cuh"
#include "bsjit/pipeline.cuh"

namespace bsjit {
namespace kernels {

// Fills dst[ROWS][COLS] (row stride STRIDE) with fetch(r, c), every thread of the CTA taking
// part. CONTIG_COLS says which index is contiguous in global memory, so that consecutive threads
// read consecutive addresses.
template <int ROWS, int COLS, int STRIDE, int THREADS, bool CONTIG_COLS, class T, class Fetch>
__device__ __forceinline__ void load_tile(T* dst, Fetch fetch) {
  constexpr int kCount = ROWS * COLS;
#pragma unroll 4
  for (int i = threadIdx.x; i < kCount; i += THREADS) {
    const int r = CONTIG_COLS ? i / COLS : i % ROWS;
    const int c = CONTIG_COLS ? i % COLS : i / ROWS;
    dst[r * STRIDE + c] = fetch(r, c);
  }
}

// Multiplies every element of tile[ROWS][COLS] by s (gated matmul), every thread taking part.
template <int ROWS, int COLS, int STRIDE, int THREADS, class T>
__device__ __forceinline__ void scale_tile(T* tile, float s) {
  for (int i = threadIdx.x; i < ROWS * COLS; i += THREADS) {
    T& v = tile[(i / COLS) * STRIDE + i % COLS];
    v = from_float<T>(to_float(v) * s);
  }
}

// acc[BM × BN] += As · Bsᵀ, per thread on a fragment of the tile.
template <class Cfg, bool TENSOR_CORES = Cfg::kTensorCores>
struct TileAccumulator;

// Tensor cores: the pipelined kernels' warp tile (pipeline.cuh) on these single-stage K-major tiles.
template <class Cfg>
struct TileAccumulator<Cfg, true> {
  WarpMma<Cfg, true, true, Cfg::kStride, Cfg::kStride> mma;

  __device__ __forceinline__ void clear() { mma.clear(); }
  __device__ __forceinline__ void accumulate(const typename Cfg::T* As, const typename Cfg::T* Bs) {
    mma.step(As, Bs, 1.0f);
  }
  // Calls store(row, col, value) for every element this thread holds.
  template <class Store>
  __device__ __forceinline__ void epilogue(Store store) const {
    mma.epilogue([&](int r, int c, float v0, float v1) {
      store(r, c, v0);
      store(r, c + 1, v1);
    });
  }
};

// FMA pipes (fp32 inputs, and block size 8): THREADS_M × THREADS_N threads, each owning TM rows
// strided by THREADS_M and TN adjacent columns.
template <class Cfg>
struct TileAccumulator<Cfg, false> {
  using T = typename Cfg::T;
  static constexpr int kThreadsN = Cfg::kBN / Cfg::kTN;
  static constexpr int kThreadsM = Cfg::kThreads / kThreadsN;
  static_assert(Cfg::kBN % Cfg::kTN == 0 && Cfg::kThreads % kThreadsN == 0, "thread grid must cover BN");
  static_assert(kThreadsM * Cfg::kTM == Cfg::kBM, "thread grid must cover BM");

  float acc[Cfg::kTM][Cfg::kTN];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < Cfg::kTM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kTN; ++j) acc[i][j] = 0.0f;
  }

  __device__ __forceinline__ void accumulate(const T* As, const T* Bs) {
    const int ty = threadIdx.x / kThreadsN, tx = threadIdx.x % kThreadsN;
#pragma unroll 4
    for (int kk = 0; kk < Cfg::kBK; ++kk) {
      float a[Cfg::kTM], b[Cfg::kTN];
#pragma unroll
      for (int i = 0; i < Cfg::kTM; ++i) a[i] = to_float(As[(ty + i * kThreadsM) * Cfg::kStride + kk]);
#pragma unroll
      for (int j = 0; j < Cfg::kTN; ++j) b[j] = to_float(Bs[(tx * Cfg::kTN + j) * Cfg::kStride + kk]);
#pragma unroll
      for (int i = 0; i < Cfg::kTM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }

  template <class Store>
  __device__ __forceinline__ void epilogue(Store store) const {
    const int ty = threadIdx.x / kThreadsN, tx = threadIdx.x % kThreadsN;
#pragma unroll
    for (int i = 0; i < Cfg::kTM; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kTN; ++j) store(ty + i * kThreadsM, tx * Cfg::kTN + j, acc[i][j]);
  }
};

}  // namespace kernels
}  // namespace bsjit
