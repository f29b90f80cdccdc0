// The CTA-level building blocks of every matmul kernel: loading a tile into shared memory and
// accumulating As·Bsᵀ into registers, on the tensor cores (mma.sync) or on the FMA pipes.
//
// Shared-memory tiles are stored "k contiguous": As[m][k] (BM × BK) and Bs[n][k] (BN × BK), so a
// tensor-core fragment is two adjacent 16-bit values, one 32-bit load.
#pragma once

#include "bsjit/common.cuh"

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

// Tensor cores: the CTA's warps form a WARPS_M × WARPS_N grid, each warp owns a WM × WN tile made
// of (WM/16) × (WN/8) m16n8k16 products.
template <class Cfg>
struct TileAccumulator<Cfg, true> {
  using T = typename Cfg::T;
  static constexpr int kWM = Cfg::kBM / Cfg::kWarpsM;
  static constexpr int kWN = Cfg::kBN / Cfg::kWarpsN;
  static constexpr int kMI = kWM / 16;
  static constexpr int kNI = kWN / 8;
  static_assert(Cfg::kWarpsM * Cfg::kWarpsN * 32 == Cfg::kThreads, "warp grid must cover the CTA");
  static_assert(kWM % 16 == 0 && kWN % 8 == 0, "warp tile must be whole m16n8 tiles");
  static_assert(Cfg::kBK % 16 == 0, "tensor-core k step is 16");
  static_assert(Cfg::kStride % 2 == 0, "fragments are 32-bit loads of two 16-bit values");

  float acc[kMI][kNI][4];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  }

  __device__ __forceinline__ void accumulate(const T* As, const T* Bs) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::kWarpsN) * kWM, wn = (warp % Cfg::kWarpsN) * kWN;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK; kk += 16) {
      unsigned a[kMI][4], b[kNI][2];
#pragma unroll
      for (int i = 0; i < kMI; ++i) {
        const T* p = As + (wm + i * 16 + g) * Cfg::kStride + kk + 2 * t;
        a[i][0] = *reinterpret_cast<const unsigned*>(p);
        a[i][1] = *reinterpret_cast<const unsigned*>(p + 8 * Cfg::kStride);
        a[i][2] = *reinterpret_cast<const unsigned*>(p + 8);
        a[i][3] = *reinterpret_cast<const unsigned*>(p + 8 * Cfg::kStride + 8);
      }
#pragma unroll
      for (int j = 0; j < kNI; ++j) {
        const T* p = Bs + (wn + j * 8 + g) * Cfg::kStride + kk + 2 * t;
        b[j][0] = *reinterpret_cast<const unsigned*>(p);
        b[j][1] = *reinterpret_cast<const unsigned*>(p + 8);
      }
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int j = 0; j < kNI; ++j) Mma16816<T>::run(acc[i][j], a[i], b[j]);
    }
  }

  // Calls store(row, col, value) for every element this thread holds.
  template <class Store>
  __device__ __forceinline__ void epilogue(Store store) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::kWarpsN) * kWM, wn = (warp % Cfg::kWarpsN) * kWN;
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) store(wm + i * 16 + g + (e / 2) * 8, wn + j * 8 + 2 * t + e % 2, acc[i][j][e]);
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
