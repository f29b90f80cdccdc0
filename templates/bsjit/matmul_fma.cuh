// The FMA kernels, for any block size and dtype (fp32 exact; the fallback where no tensor-core
// family applies).
//
// dsd_kernel: forward Y = X·W and backward-data dX = dY·Wᵀ. One CTA computes a BM × b tile of the
//   output: rows m0 .. m0+BM of N, output block column blockIdx.x. It walks that column's lookup
//   table, (input block, W block) pairs, and for each pair accumulates A[m0.., input block] · W_block
//   (or W_blockᵀ), BK reduction indices at a time.
//
// sdd_kernel: backward-weight dW = Xᵀ·dY on the nonzero blocks only. One CTA computes one b × b
//   block (row c, column k): Xᵀ[c block, :] · dY[:, k block], reducing over N, BK rows of N at a time.
#pragma once

#include "bsjit/matmul_common.cuh"

namespace bsjit {
namespace kernels {

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

}  // namespace kernels
}  // namespace bsjit
