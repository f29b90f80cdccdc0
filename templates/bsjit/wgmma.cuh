// Hopper (sm_90a) warpgroup tensor-core primitives: wgmma with both operands in shared memory,
// 128-byte swizzled tiles, and the fences that order them against ordinary and cp.async writes.
//
// A "warpgroup" is 4 consecutive warps (128 threads) starting at a warp index divisible by 4; one
// wgmma.mma_async m64nNk16 multiplies a 64 × 16 A tile by a 16 × N B tile into 64 × N fp32
// accumulators spread over the warpgroup's registers (N/2 per thread).
//
// Shared-memory tiles use the 128-byte swizzle: a tile is made of 1024-byte atoms of 8 rows of 128
// bytes (64 16-bit elements), and the 16-byte chunk j of row r of an atom is stored at chunk
// j ^ (r % 8). Atoms must start at 1024-byte aligned addresses (the hardware swizzles on address
// bits). Two orders are used:
// - K-major (the reduction index contiguous): rows are M (or N) indices, 64 reduction indices per
//   row; the atoms of 8 rows follow each other every 1024 bytes (the "stride byte offset").
// - MN-major (the M or N index contiguous): rows are reduction indices, each holding 64 M/N
//   indices; 8 consecutive reduction rows form an atom (stride byte offset 1024 between them), and
//   further groups of 64 M/N indices sit "leading byte offset" bytes apart.
#pragma once

#include "bsjit/common.cuh"
#include "bsjit/pipeline.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BSJIT_NO_WGMMA 1  // kernels that need wgmma refuse to instantiate (static_assert)
#endif

namespace bsjit {
namespace kernels {

inline constexpr int kSwizzleRowBytes = 128, kSwizzleAtomBytes = 1024;

struct alignas(16) Chunk16 {  // 16 bytes moved by one vector load or store
  unsigned x, y, z, w;
};

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` inside a 128-byte-swizzled tile.
__device__ __forceinline__ int swizzled_offset(int row, int chunk) {
  return row * kSwizzleRowBytes + ((chunk ^ (row & 7)) << 4);
}
// The same in a tile of ROW_BYTES-wide rows swizzled over ROW_BYTES (128, 64 or 32): the hardware XORs
// the chunk with address bits 7.. (chunk j of row r at j ^ ((r · ROW_BYTES / 128) % (ROW_BYTES / 16))).
template <int ROW_BYTES>
__device__ __forceinline__ int swizzled_offset_in(int row, int chunk) {
  static_assert(ROW_BYTES == 128 || ROW_BYTES == 64 || ROW_BYTES == 32, "rows of 128, 64 or 32 bytes");
  return row * ROW_BYTES + ((chunk ^ ((row * ROW_BYTES / 128) % (ROW_BYTES / 16))) << 4);
}

// The first 1024-byte aligned address of dynamic shared memory (swizzled atoms must be aligned;
// kernels reserve kSwizzleAtomBytes extra).
__device__ __forceinline__ unsigned char* swizzle_aligned(unsigned char* p) {
  return p + ((kSwizzleAtomBytes - (smem_address(p) & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
}

// Shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte units),
// and the swizzle span (layout type 1 = 128 bytes, 2 = 64, 3 = 32). With a span of S bytes the
// atoms are 8 rows of S bytes, chunk j of row r stored at j ^ ((r · S / 128) % (S / 16)) — the
// hardware XORs address bits, so atoms start at multiples of 8 · S bytes.
// The address field holds bits 4..17 of the address, so adding (bytes / 16) to a descriptor moves
// it by `bytes` (16-byte multiples) within shared memory (under 256 KiB): see smem_descriptor_add.
template <int SWIZZLE_BYTES>
__device__ __forceinline__ unsigned long long smem_descriptor_swizzled(unsigned addr, int leading_bytes,
                                                                       int stride_bytes) {
  static_assert(SWIZZLE_BYTES == 128 || SWIZZLE_BYTES == 64 || SWIZZLE_BYTES == 32, "swizzle spans: 128, 64, 32 bytes");
  constexpr unsigned long long kLayout = SWIZZLE_BYTES == 128 ? 1 : SWIZZLE_BYTES == 64 ? 2 : 3;
  return ((addr & 0x3ffffu) >> 4) | (static_cast<unsigned long long>((leading_bytes >> 4) & 0x3fff) << 16) |
         (static_cast<unsigned long long>((stride_bytes >> 4) & 0x3fff) << 32) | (kLayout << 62);
}
template <int SWIZZLE_BYTES>
__device__ __forceinline__ unsigned long long smem_descriptor_swizzled(const void* p, int leading_bytes,
                                                                       int stride_bytes) {
  return smem_descriptor_swizzled<SWIZZLE_BYTES>(smem_address(p), leading_bytes, stride_bytes);
}
// The descriptor of the tile `bytes` (a multiple of 16) after the one `desc` describes.
__device__ __forceinline__ unsigned long long smem_descriptor_add(unsigned long long desc, unsigned bytes) {
  // the start address is bits 0-13 of the low word, so the add never carries into the high word
  // (leading and stride offsets, layout), which stays as it was: one 32-bit add
  return (desc & 0xffffffff00000000ull) | (static_cast<unsigned>(desc) + (bytes >> 4));
}
__device__ __forceinline__ unsigned long long smem_descriptor(const void* p, int leading_bytes, int stride_bytes) {
  return smem_descriptor_swizzled<128>(p, leading_bytes, stride_bytes);
}

// The thread's warpgroup, broadcast from lane 0 so that ptxas knows it is uniform in each warp.
// Kernels branch on it to their roles (producer, consumers). Computed from threadIdx.x alone, it
// makes every consumer path divergent for ptxas, and a wgmma in a rolled loop there is serialized
// (C7520, "compiler-inserted WG.AR in divergent path").
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
}

// Writes of the generic proxy (ordinary stores, cp.async) to shared memory become visible to the
// async proxy (wgmma operand reads): each writing thread fences, then the CTA synchronises.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The accumulators of an in-flight wgmma must not be touched by other instructions until it is
// waited for; this tells the compiler each register may have changed (keeps it from moving reads).
template <int R>
__device__ __forceinline__ void wgmma_fence_registers(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The same for A fragments in registers, which an in-flight wgmma still reads: kept live (not
// reused by the compiler) until after the wait.
template <int R, int C>
__device__ __forceinline__ void wgmma_fence_registers(unsigned (&a)[R][C]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

template <class T>
struct IsBfloat16 {
  static constexpr bool value = false;
};
template <>
struct IsBfloat16<bfloat16_t> {
  static constexpr bool value = true;
};

// Inline asm must name every accumulator: the register names and d's "+f" operands, 32 at a time (a
// wgmma of width N lists N / 2 of them first, then its own operands).
#define BSJIT_REGS_0 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define BSJIT_REGS_32 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BSJIT_REGS_64 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define BSJIT_REGS_96 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define BSJIT_ACC8(i)                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define BSJIT_ACC32(i) BSJIT_ACC8(i), BSJIT_ACC8(i + 8), BSJIT_ACC8(i + 16), BSJIT_ACC8(i + 24)

#define BSJIT_WGMMA_M64N32K16(TYPE)                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                       \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPE "." TYPE                                        \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"                         \
               " %16, %17, p, 1, 1, %19, %20;\n}\n"                                                               \
               : BSJIT_ACC8(0), BSJIT_ACC8(8)                                                                     \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))

#define BSJIT_WGMMA_M64N64K16(TYPE)                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                       \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" BSJIT_REGS_0                          \
               "}, %32, %33, p, 1, 1, %35, %36;\n}\n"                                                               \
               : BSJIT_ACC32(0)                                                                                    \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))

#define BSJIT_WGMMA_M64N128K16(TYPE)                                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                       \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" BSJIT_REGS_0 ", " BSJIT_REGS_32      \
               "}, %64, %65, p, 1, 1, %67, %68;\n}\n"                                                               \
               : BSJIT_ACC32(0), BSJIT_ACC32(32)                                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))

#define BSJIT_WGMMA_M64N256K16(TYPE)                                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                      \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {" BSJIT_REGS_0 ", " BSJIT_REGS_32      \
               ", " BSJIT_REGS_64 ", " BSJIT_REGS_96 "}, %128, %129, p, 1, 1, %131, %132;\n}\n"                    \
               : BSJIT_ACC32(0), BSJIT_ACC32(32), BSJIT_ACC32(64), BSJIT_ACC32(96)                                 \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A), "n"(TRANS_B))

// d (64 × N, fp32) += A (64 × 16) · B (16 × N), both from shared memory (accumulate = 0: d = A·B).
// TRANS_A / TRANS_B: 0 for K-major, 1 for MN-major tiles.
template <class T, int N, int TRANS_A, int TRANS_B>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b,
                                             int accumulate = 1) {
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(T) == 0, "wgmma needs the sm_90a target");
#else
  static_assert(N == 32 || N == 64 || N == 128 || N == 256, "wgmma widths used here: 32, 64, 128 and 256");
  constexpr bool kBf16 = IsBfloat16<T>::value;
  if constexpr (N == 32) {
    if constexpr (kBf16) BSJIT_WGMMA_M64N32K16("bf16");
    else BSJIT_WGMMA_M64N32K16("f16");
  } else if constexpr (N == 64) {
    if constexpr (kBf16) BSJIT_WGMMA_M64N64K16("bf16");
    else BSJIT_WGMMA_M64N64K16("f16");
  } else if constexpr (N == 128) {
    if constexpr (kBf16) BSJIT_WGMMA_M64N128K16("bf16");
    else BSJIT_WGMMA_M64N128K16("f16");
  } else {
    if constexpr (kBf16) BSJIT_WGMMA_M64N256K16("bf16");
    else BSJIT_WGMMA_M64N256K16("f16");
  }
#endif
}

// The same with A from registers (64 × 16 over the warpgroup, each warp 16 rows in mma.sync's A
// fragment layout: a[0] rows r / cols 2t.., a[1] row r + 8, a[2] cols + 8, a[3] both): what a
// softmax's probabilities, computed in registers, multiply.
#define BSJIT_WGMMA_RS_M64N64K16(TYPE)                                                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                       \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" BSJIT_REGS_0                          \
               "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                                    \
               : BSJIT_ACC32(0)                                                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TRANS_B))

#define BSJIT_WGMMA_RS_M64N128K16(TYPE)                                                                           \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                       \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" BSJIT_REGS_0 ", " BSJIT_REGS_32      \
               "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                                    \
               : BSJIT_ACC32(0), BSJIT_ACC32(32)                                                                   \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(TRANS_B))

// d (64 × N, fp32) += A (64 × 16, registers) · B (16 × N, shared memory; TRANS_B as above).
template <class T, int N, int TRANS_B>
__device__ __forceinline__ void wgmma_m64k16_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc_b) {
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(T) == 0, "wgmma needs the sm_90a target");
#else
  static_assert(N == 64 || N == 128, "wgmma widths used here: 64 and 128");
  constexpr bool kBf16 = IsBfloat16<T>::value;
  if constexpr (N == 64) {
    if constexpr (kBf16) BSJIT_WGMMA_RS_M64N64K16("bf16");
    else BSJIT_WGMMA_RS_M64N64K16("f16");
  } else {
    if constexpr (kBf16) BSJIT_WGMMA_RS_M64N128K16("bf16");
    else BSJIT_WGMMA_RS_M64N128K16("f16");
  }
#endif
}

// d (64 × N) = A·Bᵀ over K reduction indices (accumulated onto d unless overwrite), both operands
// K-major tiles of 128-byte-swizzled panels of 64 reduction indices: A's 64 rows at a, its panels
// a_rows rows apart; B's N rows at b, panels b_rows apart. Issued, not committed.
template <class T, int N, int K>
__device__ __forceinline__ void wgmma_k_major_tiles(float (&d)[N / 2], const unsigned char* a, int a_rows,
                                                    const unsigned char* b, int b_rows, bool overwrite) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_m64k16<T, N, 0, 0>(d,
                             smem_descriptor(a + (kk / 4) * a_rows * kSwizzleRowBytes + (kk % 4) * 32, 16,
                                             kSwizzleAtomBytes),
                             smem_descriptor(b + (kk / 4) * b_rows * kSwizzleRowBytes + (kk % 4) * 32, 16,
                                             kSwizzleAtomBytes),
                             overwrite && kk == 0 ? 0 : 1);
}

// d (64 × N) += A·B over K reduction indices: A from registers (K / 16 k16 fragments, a[c] for
// indices 16c..16c+15), B an MN-major tile at b (128-byte-swizzled rows of reduction indices, its
// panels of 64 N indices b_rows rows apart). Issued, not committed.
template <class T, int N, int K>
__device__ __forceinline__ void wgmma_registers_mn_major_tile(float (&d)[N / 2], const unsigned (&a)[K / 16][4],
                                                              const unsigned char* b, int b_rows) {
#pragma unroll
  for (int c = 0; c < K / 16; ++c)
    wgmma_m64k16_rs<T, N, 1>(d, a[c],
                             smem_descriptor(b + c * 16 * kSwizzleRowBytes, b_rows * kSwizzleRowBytes, kSwizzleAtomBytes));
}

// The accumulator element of thread `lane` of warp `warp` (within its warpgroup) held in register
// pair 4i + 2h: row warp·16 + lane/4 + 8h, columns 8i + 2·(lane%4) and the next one. f(r, c, e) for
// every pair d[e], d[e + 1] a thread holds, at (r, c) and (r, c + 1) of the 64 × N tile (rows from row0).
template <int N, class F>
__device__ __forceinline__ void wgmma_for_each_pair(int row0, F f) {
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) f(row0 + warp * 16 + lane / 4 + 8 * h, 8 * i + 2 * (lane % 4), 4 * i + 2 * h);
}

// store(r, c, v0, v1) for every pair of a thread's accumulators (wgmma_for_each_pair).
template <int N, class Store>
__device__ __forceinline__ void wgmma_epilogue(const float (&d)[N / 2], int row0, Store store) {
  wgmma_for_each_pair<N>(row0, [&](int r, int c, int e) { store(r, c, d[e], d[e + 1]); });
}


// Stores four 8 × 8 tiles of 16-bit values, each held as in mma.sync's fragments (thread lane: row
// lane / 4, columns 2·(lane % 4) and the next, packed in r[i] for tile i), transposed: row j of
// tile i in shared memory is column j of the fragment, 8 values (16 bytes) at the address that
// thread 8i + j passes (sm_90).
__device__ __forceinline__ void stmatrix_x4_trans(void* p, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(p)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Stores four 8 × 8 tiles of 16-bit values held as in mma.sync's fragments (packed in r[i] for tile
// i), untransposed: row j of tile i goes to the 16 bytes at the address that thread 8i + j passes.
__device__ __forceinline__ void stmatrix_x4(void* p, const unsigned (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address(p)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// --- Tensor memory access (TMA) and mbarriers -------------------------------------------------
//
// A tensor map (CUtensorMap, built on the host by cuTensorMapEncodeTiled) describes a 2-D global
// tensor and the box one copy moves; it is passed by value as a __grid_constant__ kernel
// parameter. One thread issues a copy; the copy engine writes the box into shared memory, swizzled
// as the map says, zero-filling rows past the tensor's end, and counts the bytes on an mbarrier.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Makes initialised barriers visible to the async proxy (the copy engine) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The barrier functions and tma_load_2d take shared-memory addresses (smem_address) or pointers:
// a kernel that computes the addresses once spares the generic-to-shared conversion per call.
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) { mbarrier_arrive(smem_address(bar)); }
// Arrives and announces `bytes` more bytes the copy engine will deliver before the phase completes.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  mbarrier_arrive_expect_tx(smem_address(bar), bytes);
}
// Waits until the barrier's phase of the given parity has completed. On a barrier still in its
// first phase, parity 1 counts as completed (a producer's first wait for free stages).
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
  mbarrier_wait(smem_address(bar), parity);
}
// Fetches a tensor map into the copy engine's descriptor cache ahead of its first copy.
__device__ __forceinline__ void prefetch_tensormap(const TensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&map)) : "memory");
}
// Copies the box at (x, y) (x: the contiguous dimension, in elements) of `map` into dst.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TensorMap& map, int x, int y, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const TensorMap& map, int x, int y, unsigned long long* bar) {
  tma_load_2d(smem_address(dst), map, x, y, smem_address(bar));
}
// The same for a 3-D map: (x, y, z) the box's first element (x contiguous).
__device__ __forceinline__ void tma_load_3d(void* dst, const TensorMap& map, int x, int y, int z,
                                            unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(smem_address(dst)),
      "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(z), "r"(smem_address(bar))
      : "memory");
}
// Copies the box at (x, y) of `map` from shared memory (src, swizzled as the map says) to global
// memory, skipping elements past the tensor's ends; tracked by the issuing thread's bulk groups.
// The writes to src must be made visible to the async proxy first (fence_proxy_async, then a
// barrier of the writers).
__device__ __forceinline__ void tma_store_2d(const TensorMap& map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(&map)),
               "r"(x), "r"(y), "r"(smem_address(src))
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups are still reading their shared-memory sources
// (the source may be written again).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N of this thread's bulk groups are incomplete (their writes done).
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory to dst,
// counted on bar like a TMA copy.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
// Adds `bytes` of fp32 (a multiple of 16, both addresses 16-byte aligned) from shared memory into
// global memory, element by element in L2; tracked by the issuing thread's bulk groups. The writes
// to src must be made visible to the async proxy first (fence_proxy_async, then a barrier of the
// writers).
__device__ __forceinline__ void bulk_reduce_add(float* dst, const void* src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(smem_address(src)), "r"(bytes)
               : "memory");
}
// *p += a, p[1] += b in one 8-byte reduction in L2 (p 8-byte aligned; sm_90).
__device__ __forceinline__ void red_add_pair(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
// The shared memory of a warp-specialized kernel with a ring of S stages of STAGE_BYTES: the stages
// from the first 1024-byte aligned address of dynamic shared memory, then S "full" mbarriers (the
// arrivals of `producers` threads plus the copies' bytes complete one) and S "empty" ones
// (`consumers` arrivals free a stage). Every thread calls init before the ring's first use: thread 0
// initialises the barriers and the CTA synchronises.
template <int S, int STAGE_BYTES>
struct StageRing {
  unsigned char* base;
  unsigned long long *full, *empty;
  __device__ __forceinline__ explicit StageRing(unsigned char* dynamic_smem)
      : base(swizzle_aligned(dynamic_smem)),
        full(reinterpret_cast<unsigned long long*>(base + S * STAGE_BYTES)),
        empty(full + S) {}
  __device__ __forceinline__ void init(unsigned consumers, unsigned producers = 1) const {
    if (threadIdx.x == 0) {
      for (int s = 0; s < S; ++s) mbarrier_init(&full[s], producers), mbarrier_init(&empty[s], consumers);
      fence_barrier_init();
    }
    __syncthreads();
  }
  __device__ __forceinline__ unsigned char* stage(int step) const { return base + (step % S) * STAGE_BYTES; }
};

// A position in a ring of S stages, advanced one step at a time: the stage and the parity of its
// round. Consumers wait for that parity on the stage's "full" barrier, producers for the other on
// its "empty" one (a fresh barrier counts parity 1 as completed, so the first round does not wait).
template <int S>
struct RingCursor {
  int stage = 0;
  unsigned phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == S) stage = 0, phase ^= 1u;
  }
};

// Moves registers between the warpgroups of a warp-specialized kernel: a producer that only issues
// copies gives some back, consumers holding accumulators take them (per thread, multiple of 8).
template <int N>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Synchronises the `threads` threads (whole warps) that use named barrier `id` (1..15; 0 is
// __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` without waiting (the other `threads` - 32k wait with bar.sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace kernels
}  // namespace bsjit
