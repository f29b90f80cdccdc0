// Multi-stage shared-memory pipeline on the tensor cores (sm_80+): 16-byte cp.async copies of the
// next STAGES-1 tiles fly while the current one feeds mma.sync through ldmatrix.
//
// Operand tiles in shared memory are either "K-major" (As[m][k], Bs[n][k]: the reduction index is
// contiguous) or "MN-major" (As[k][m], Bs[k][n]); ldmatrix reads the first as stored and the second
// with .trans, so both come from global memory in whatever order is contiguous there. Rows are
// padded by 8 elements (16 bytes): the 8 rows one ldmatrix phase reads then fall in distinct
// 16-byte bank groups for every tile width used here.
//
// fp32 inputs on the tensor cores (TF32, opt-in) use the same tiles of 4-byte elements: K-major
// tiles through ldmatrix (a 16-byte row of an 8 × 8 b16 matrix is 4 fp32 values, which is how the
// m16n8k8 .tf32 fragments lie), padded by 4 elements (16 bytes); MN-major tiles by 32-bit loads
// (.trans would split the values), padded by 8 elements so that row stride ≡ 8 mod 32 banks: the
// loads of a fragment (rows t, columns g) then hit 32 distinct banks.
#pragma once

// The PTX below and common.cuh's: the CPU tests give their own (tests/runtime/kernel_emulation.hpp).
#ifndef BSJIT_HOST_EMULATION
#include "bsjit/common.cuh"
#endif

namespace bsjit {
namespace kernels {

inline constexpr int kPad = 8;  // elements of row padding for 16-bit tiles

// Row padding, in elements, of a tile of T stored K-major or MN-major (see above).
template <class T, bool K_MAJOR>
struct TilePad {
  static constexpr int value = sizeof(T) == 2 || !K_MAJOR ? 8 : 4;
};

#ifndef BSJIT_HOST_EMULATION
__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, bypassing L1; zero-filled when !valid (src must still be a legal address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// Two fp32 values rounded to a 16-bit pair packed in 32 bits, lo in the low half (the lower
// address): an mma A-fragment register, or two adjacent outputs.
template <class T>
__device__ __forceinline__ unsigned pack_pair(float lo, float hi);
template <>
__device__ __forceinline__ unsigned pack_pair<bfloat16_t>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ unsigned pack_pair<half_t>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

#endif  // BSJIT_HOST_EMULATION

// The two 16-bit values of a packed pair (pack_pair's inverse), in fp32.
template <class T>
__device__ __forceinline__ void unpack_pair(unsigned v, float& lo, float& hi) {
  lo = to_float(T{static_cast<unsigned short>(v & 0xffff)});
  hi = to_float(T{static_cast<unsigned short>(v >> 16)});
}

// Two 16-bit values packed in 32 bits, each multiplied by s (gated matmul).
template <class T>
__device__ __forceinline__ unsigned scale_pair(unsigned v, float s) {
  float lo, hi;
  unpack_pair<T>(v, lo, hi);
  return pack_pair<T>(lo * s, hi * s);
}

// Adds to d[0..7], in fp32, the 8 16-bit values ldmatrix (.trans with TRANS) hands this thread from
// the four 8 × 8 tiles at p (pairs in register order): how a consumer adds an output's old values,
// staged in shared memory where its stmatrix (.trans) would write the new ones, to its accumulators.
template <class T, bool TRANS>
__device__ __forceinline__ void add_ldmatrix(float* d, const void* p) {
  unsigned old[4];
  if constexpr (TRANS)
    ldmatrix_x4_trans(old, p);
  else
    ldmatrix_x4(old, p);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float lo, hi;
    unpack_pair<T>(old[k], lo, hi);
    d[2 * k] += lo, d[2 * k + 1] += hi;
  }
}

// Copies a ROWS × COLS tile of 16-bit or 32-bit elements, 16 bytes per cp.async, into dst (row
// stride STRIDE). row(r) gives the global address of row r's first element; valid(r) false
// zero-fills it.
template <int ROWS, int COLS, int STRIDE, int THREADS, class T, class Row, class Valid>
__device__ __forceinline__ void copy_tile_async(T* dst, Row row, Valid valid) {
  constexpr int kPer = 16 / sizeof(T);  // elements per copy
  static_assert(COLS % kPer == 0, "rows are copied 16 bytes at a time");
  constexpr int kChunksPerRow = COLS / kPer, kChunks = ROWS * kChunksPerRow;
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += THREADS) {
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * kPer;
    const bool ok = valid(r);
    cp_async_16(dst + r * STRIDE + c, row(ok ? r : 0) + c, ok);
  }
}

#ifndef BSJIT_HOST_EMULATION
// An fp32 value's bits rounded to TF32 (10 bits of mantissa, to nearest, ties away from zero).
__device__ __forceinline__ unsigned round_tf32(unsigned v) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(__uint_as_float(v)));
  return r;
}
#endif

// A B-fragment register (two 16-bit values, or one fp32 value) scaled by s (gated matmul).
template <class T>
__device__ __forceinline__ unsigned scale_fragment(unsigned v, float s) {
  if constexpr (sizeof(T) == 4)
    return __float_as_uint(__uint_as_float(v) * s);
  else
    return scale_pair<T>(v, s);
}

// Warp-level tensor-core tile: the CTA's warps form WARPS_M × WARPS_N, each owning WM × WN of the
// BM × BN accumulator. A_K_MAJOR / B_K_MAJOR say how the stage tiles are stored (see above); SA and
// SB are their row strides in elements. 16-bit T: m16n8k16; fp32 T: m16n8k8 as TF32.
template <class Cfg, bool A_K_MAJOR, bool B_K_MAJOR, int SA, int SB>
struct WarpMma {
  using T = typename Cfg::T;
  static constexpr int kWM = Cfg::kBM / Cfg::kWarpsM, kWN = Cfg::kBN / Cfg::kWarpsN;
  static constexpr int kMI = kWM / 16, kNI = kWN / 8;
  static constexpr int kK = Mma16816<T>::kK, kPer = 16 / sizeof(T);  // per mma; elements per 16 bytes
  static_assert(Cfg::kWarpsM * Cfg::kWarpsN * 32 == Cfg::kThreads, "warp grid must cover the CTA");
  static_assert(kWM % 16 == 0 && kWN % 16 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
  static_assert(Cfg::kBK % 16 == 0, "k step is 16");

  float acc[kMI][kNI][4];

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  }

  // acc += A·B over one BK stage, B scaled by s when s != 1 (gated matmul).
  __device__ __forceinline__ void step(const T* As, const T* Bs, float s) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK; kk += kK) slice(As, Bs, kk, s);
  }

  // The same with a scale per 16 reduction indices, scale(kk): 0 skips them (stages that hold
  // several blocks, each with its own gate).
  template <class Scale>
  __device__ __forceinline__ void step_sliced(const T* As, const T* Bs, Scale scale) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK; kk += kK) {
      const float s = scale(kk);
      if (s != 0.0f) slice(As, Bs, kk, s);  // uniform across the CTA
    }
  }

  // acc += A[:, kk..kk+kK-1] · B[kk..kk+kK-1, :], B scaled by s when s != 1.
  __device__ __forceinline__ void slice(const T* As, const T* Bs, int kk, float s) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / Cfg::kWarpsN) * kWM, wn = (warp % Cfg::kWarpsN) * kWN;
    const int q = lane / 8, r8 = lane % 8, g = lane / 4, t = lane % 4;
    unsigned a[kMI][4], b[kNI][2];
    // 32-bit element (r, c) of a tile of row stride S (MN-major fp32 fragments)
    auto word = [](const T* tile, int S, int r, int c) { return __float_as_uint(to_float(tile[r * S + c])); };
#pragma unroll
    for (int i = 0; i < kMI; ++i) {
      if (A_K_MAJOR) {
        ldmatrix_x4(a[i], As + (wm + i * 16 + lane % 16) * SA + kk + (lane / 16) * kPer);
      } else if constexpr (sizeof(T) == 2) {
        ldmatrix_x4_trans(a[i], As + (kk + r8 + (q / 2) * 8) * SA + wm + i * 16 + (q % 2) * 8);
      } else {
        const int m = wm + i * 16 + g;
        a[i][0] = word(As, SA, kk + t, m), a[i][1] = word(As, SA, kk + t, m + 8);
        a[i][2] = word(As, SA, kk + t + 4, m), a[i][3] = word(As, SA, kk + t + 4, m + 8);
      }
    }
#pragma unroll
    for (int j = 0; j < kNI; j += 2) {
      unsigned r[4];
      if (B_K_MAJOR) {
        ldmatrix_x4(r, Bs + (wn + j * 8 + r8 + (q / 2) * 8) * SB + kk + (q % 2) * kPer);
      } else if constexpr (sizeof(T) == 2) {
        ldmatrix_x4_trans(r, Bs + (kk + r8 + (q % 2) * 8) * SB + wn + j * 8 + (q / 2) * 8);
      } else {
        const int n = wn + j * 8 + g;
        r[0] = word(Bs, SB, kk + t, n), r[1] = word(Bs, SB, kk + t + 4, n);
        r[2] = word(Bs, SB, kk + t, n + 8), r[3] = word(Bs, SB, kk + t + 4, n + 8);
      }
      b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
    }
    if (s != 1.0f) {
#pragma unroll
      for (int j = 0; j < kNI; ++j) b[j][0] = scale_fragment<T>(b[j][0], s), b[j][1] = scale_fragment<T>(b[j][1], s);
    }
    if constexpr (sizeof(T) == 4) {  // TF32: rounded, as cuBLAS rounds (the tensor cores would truncate)
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[i][e] = round_tf32(a[i][e]);
#pragma unroll
      for (int j = 0; j < kNI; ++j) b[j][0] = round_tf32(b[j][0]), b[j][1] = round_tf32(b[j][1]);
    }
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
      for (int j = 0; j < kNI; ++j) Mma16816<T>::run(acc[i][j], a[i], b[j]);
  }

  // store(row, col, v0, v1): the two adjacent columns col, col+1 of row, for every pair this thread holds.
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
        for (int h = 0; h < 2; ++h)
          store(wm + i * 16 + g + h * 8, wn + j * 8 + 2 * t, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
  }
};

// Drives a STAGES-deep pipeline over `total` stages: load(step) issues the copies of stage `step`
// (into buffer step % STAGES), compute(step) consumes it once it has landed for every thread.
template <int STAGES, class Load, class Compute>
__device__ __forceinline__ void run_pipeline(int total, Load load, Compute compute) {
  static_assert(STAGES >= 2, "a pipeline needs two stages");
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < total) load(s);
    cp_async_commit();  // empty groups keep the count uniform
  }
  for (int step = 0; step < total; ++step) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage `step` has landed for every thread; stage step-1 is free to refill
    if (step + STAGES - 1 < total) load(step + STAGES - 1);
    cp_async_commit();
    compute(step);
  }
  cp_async_wait<0>();
}

// Writes two adjacent outputs as one store (32 bits, or 64 for fp32); with accumulate adds the old
// pair first.
template <class T>
__device__ __forceinline__ void store_pair(T* p, float v0, float v1, int accumulate) {
  if (accumulate) {
    v0 += to_float(p[0]);
    v1 += to_float(p[1]);
  }
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
  } else {
    T pair[2] = {from_float<T>(v0), from_float<T>(v1)};
    *reinterpret_cast<unsigned*>(p) = *reinterpret_cast<const unsigned*>(pair);
  }
}

}  // namespace kernels
}  // namespace bsjit
