// Device-side basics shared by every bsjit kernel template.
//
// Compiled by NVRTC at run time (and by nvcc in tests), with no CUDA toolkit header: 16-bit types
// and their conversions go through PTX, so a deployment that has only the driver and libnvrtc can
// compile kernels. Nothing host-only (std streams, fmt, spdlog, json) may appear here.
#pragma once

namespace bsjit {
namespace kernels {

// Storage types for 16-bit inputs; arithmetic happens in fp32 or inside the tensor cores.
struct half_t {
  unsigned short bits;
};
struct bfloat16_t {
  unsigned short bits;
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(half_t x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float to_float(bfloat16_t x) {
  return __uint_as_float(static_cast<unsigned>(x.bits) << 16);  // bf16 is the top half of fp32
}

template <class T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ half_t from_float<half_t>(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <>
__device__ __forceinline__ bfloat16_t from_float<bfloat16_t>(float f) {
  bfloat16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

template <class T>
__device__ __forceinline__ T zero() {
  return from_float<T>(0.0f);
}

// at(p) for a run-time p in 0 .. K - 1, from K statically indexed candidates at(0) .. at(K - 1):
// K - 1 selects, so that register arrays stay in registers where a loop over p is rolled (one copy
// of the loop's code for every p).
template <int K, class At>
__device__ __forceinline__ auto select_static(int p, At at) {
  auto v = at(0);
#pragma unroll
  for (int q = 1; q < K; ++q) v = p == q ? at(q) : v;
  return v;
}

// A kernel built for calls without per-call options (Config::kPlain: neither accumulate nor gate)
// drops both at its entry, so that NVVM removes their code: a tenth to a half of a Hopper
// kernel's cold compile (docs/PERFORMANCE.md). The host passes the same arguments to either kernel.
template <class Cfg, class Gate>
__device__ __forceinline__ void drop_call_options(Gate& gate, int& accumulate) {
  if constexpr (Cfg::kPlain) {
    gate = nullptr;
    accumulate = 0;
  }
}

// Tensor-core product D += A·B for one m16n8k16 tile (sm_80+), fp32 accumulators.
// Fragment layout (PTX ISA, "mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..]   a[3] = A[g+8][2t+8..]
//   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   d[0..1] = D[g][2t..2t+1]   d[2..3] = D[g+8][2t..2t+1]
template <class T>
struct Mma16816;

template <>
struct Mma16816<half_t> {
  static constexpr int kK = 16;  // reduction indices per instruction
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct Mma16816<bfloat16_t> {
  static constexpr int kK = 16;
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// fp32 inputs on the tensor cores as TF32 (opt-in: MatMulOptions::tf32): one m16n8k8 tile, the
// hardware reading each input's sign, exponent and top 10 mantissa bits and ignoring the rest (so
// WarpMma rounds the fragments first, round_tf32).
// Fragments (PTX ISA, "mma.m16n8k8" .tf32), g = lane / 4, t = lane % 4:
//   a[0] = A[g][t]   a[1] = A[g+8][t]   a[2] = A[g][t+4]   a[3] = A[g+8][t+4]
//   b[0] = B[t][g]   b[1] = B[t+4][g]   d as for m16n8k16.
template <>
struct Mma16816<float> {
  static constexpr int kK = 8;
  __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

}  // namespace kernels
}  // namespace bsjit
