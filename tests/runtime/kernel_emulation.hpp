// The kernel templates on the CPU: what a template takes from CUDA, given by the host, so that the
// host compiler builds the kernels (with BSJIT_HOST_EMULATION, the templates leave out their PTX
// and take these instead) and a test runs their grids against the double-precision reference.
//
// A grid's CTAs run one after another. Their threads run one after another too for kernels that
// neither synchronize nor exchange data between threads (run_grid with Threads::one_by_one); the
// others (Threads::concurrent) get a std::thread per CUDA thread, a barrier per CTA for
// __syncthreads and one per warp for the warp-wide instructions, which are done as the PTX ISA
// defines them:
//   ldmatrix .x4 (.trans): lanes 8i .. 8i + 7 give the rows of 8 × 8 matrix i; register i of lane l
//     holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of it (of its transpose with .trans);
//   mma.m16n8k16 with fp32 accumulators: the fragments of common.cuh's Mma16816 comment.
// cp.async copies at once (a stage is not read before the barrier that follows its copies, as on
// the GPU), and shared memory is static storage, shared by a CTA's threads. The arithmetic is
// fp32 with products rounded before they are added, where the GPU fuses multiply and add, so
// results agree up to fp32 rounding.
#pragma once

#include <array>
#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>

#define BSJIT_HOST_EMULATION
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim3 threadIdx, blockIdx;
inline EmulatedDim3 blockDim, gridDim;

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
struct float2 {
  float x, y;
};
inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((1ull * a * b) >> 32); }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }

namespace bsjit::emulation {

struct Warp {
  std::barrier<> sync{32};
  std::array<const void*, 32> address{};
  std::array<std::array<unsigned, 4>, 32> a{};
  std::array<std::array<unsigned, 2>, 32> b{};
};
struct Cta {
  explicit Cta(unsigned threads) : sync(threads), warps((threads + 31) / 32) {}
  std::barrier<> sync;
  std::vector<Warp> warps;
};
inline Cta* cta = nullptr;  // the CTA in flight (concurrent threads)

enum class Threads { one_by_one, concurrent };

// kernel() for every thread of a grid_x × grid_y grid of `threads`-thread CTAs.
template <class Kernel>
void run_grid(unsigned grid_x, unsigned grid_y, unsigned threads, Kernel kernel, Threads mode = Threads::one_by_one) {
  gridDim = {grid_x, grid_y, 1};
  blockDim = {threads, 1, 1};
  for (unsigned by = 0; by < grid_y; ++by)
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      if (mode == Threads::one_by_one) {
        for (unsigned tx = 0; tx < threads; ++tx) {
          blockIdx = {bx, by, 0};
          threadIdx = {tx, 0, 0};
          kernel();
        }
        continue;
      }
      Cta one(threads);
      cta = &one;
      std::vector<std::thread> pool;
      for (unsigned tx = 0; tx < threads; ++tx)
        pool.emplace_back([&, tx] {
          blockIdx = {bx, by, 0};
          threadIdx = {tx, 0, 0};
          kernel();
        });
      for (auto& t : pool) t.join();
      cta = nullptr;
    }
}

inline Warp& warp() { return cta->warps[threadIdx.x / 32]; }

}  // namespace bsjit::emulation

inline void __syncthreads() { bsjit::emulation::cta->sync.arrive_and_wait(); }

namespace bsjit::kernels {

struct half_t {
  unsigned short bits;
};
struct bfloat16_t {
  unsigned short bits;
};
inline float to_float(float x) { return x; }
inline float to_float(half_t x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline float to_float(bfloat16_t x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
template <class T>
T from_float(float f);
template <>
inline float from_float<float>(float f) {
  return f;
}
template <>
inline half_t from_float<half_t>(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // round to nearest even, as cvt.rn.f16.f32
  half_t out;
  std::memcpy(&out.bits, &h, 2);
  return out;
}
template <>
inline bfloat16_t from_float<bfloat16_t>(float f) {  // round to nearest even, as cvt.rn.bf16.f32
  unsigned u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<unsigned short>(u >> 16)};
}

// pipeline.cuh's PTX
inline void cp_async_16(void* dst, const void* src, bool valid) {
  if (valid)
    std::memcpy(dst, src, 16);
  else
    std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

// Element (row, col) of the 8 × 8 16-bit matrix whose rows lanes base .. base + 7 gave.
inline unsigned short ldmatrix_element(const emulation::Warp& w, int base, int row, int col) {
  unsigned short v;
  std::memcpy(&v, static_cast<const char*>(w.address[base + row]) + 2 * col, 2);
  return v;
}
template <bool kTrans>
inline void ldmatrix(unsigned (&r)[4], const void* p) {
  emulation::Warp& w = emulation::warp();
  const int lane = threadIdx.x % 32;
  w.address[lane] = p;
  w.sync.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4, col = 2 * (lane % 4);
    const unsigned lo = kTrans ? ldmatrix_element(w, 8 * i, col, row) : ldmatrix_element(w, 8 * i, row, col);
    const unsigned hi = kTrans ? ldmatrix_element(w, 8 * i, col + 1, row) : ldmatrix_element(w, 8 * i, row, col + 1);
    r[i] = lo | hi << 16;
  }
  w.sync.arrive_and_wait();
}
inline void ldmatrix_x4(unsigned (&r)[4], const void* p) { ldmatrix<false>(r, p); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) { ldmatrix<true>(r, p); }

template <class T>
inline unsigned pack_pair(float lo, float hi) {
  const T l = from_float<T>(lo), h = from_float<T>(hi);
  return static_cast<unsigned>(l.bits) | static_cast<unsigned>(h.bits) << 16;
}
inline unsigned round_tf32(unsigned v) { return v; }  // (no TF32 kernel runs here)

// mma.sync.m16n8k16, fp32 accumulators: every lane's fragments, then this lane's four outputs.
template <class T>
struct Mma16816 {
  static constexpr int kK = 16;
  static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    emulation::Warp& w = emulation::warp();
    const int lane = threadIdx.x % 32;
    for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i];
    w.b[lane] = {b[0], b[1]};
    w.sync.arrive_and_wait();
    // value h (0: low half, 1: high) of a packed pair
    auto half = [](unsigned pair, int h) { return to_float(T{static_cast<unsigned short>(pair >> (16 * h))}); };
    // A[row][k] and B[k][col] from the lanes that hold them
    auto A = [&](int row, int k) {
      const int owner = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
      return half(w.a[owner][reg], k % 2);
    };
    auto B = [&](int k, int col) { return half(w.b[col * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2); };
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + e % 2;
      float s = d[e];
      for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
      d[e] = s;
    }
    w.sync.arrive_and_wait();
  }
};

}  // namespace bsjit::kernels
