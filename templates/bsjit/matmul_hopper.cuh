// What the Hopper warp-specialized matmul kernels share (dsd_tma, dsd_grouped, dsd_paired and the
// backward-weight units): named barriers of a consumer warpgroup, the wgmmas of the swapped product
// (Yᵀ = Wᵀ·Xᵀ), the epilogue that packs a consumer's Yᵀ tile into features and stores it by TMA, and
// the reduction of split pieces' fp32 partials.
#pragma once

#include "bsjit/matmul_common.cuh"

namespace bsjit {
namespace kernels {

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

// The GPU's nanosecond clock, and a counter read and added to at GPU scope without ordering (the
// gate below only paces CTAs; nothing it guards is data).
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned load_relaxed_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_add_relaxed_gpu(unsigned* p, unsigned v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Keeps the CTAs of a persistent kernel within kLead rounds of each other (round k: every CTA's
// k-th tile; CTA p takes tiles p, p + P, ...). A wave shares X's row tiles and W's blocks in L2
// only while its CTAs run in step, and left alone they drift apart in proportion to time, by their
// SMs' speeds: at C = K = 12288, b = 32, d = 0.25 the forward read 2.4 GB from DRAM at N = 8192
// and 23.4 GB at 32768 (Nsight Compute, H200, a9c199c), where a model of L2 (tools/probes/
// wave_l2_model.cpp: LRU over the X tiles and W blocks each step reads, 50 MB) counts 2.1 and 8.3
// GB with the CTAs in step, 2.2 and 22 GB with their speeds spread by 3% (σ), and 2.1 and 8.5 GB
// with this gate at kLead = 2. Measured on an H100 (91aff75 against a1fd959): 12288² at N = 32768
// ×1.07-2.68 on every op and block size, suite W level but for b = 64 backward-weight, ×0.96
// (docs/PERFORMANCE.md, "The wave paced").
// The producer's copying warp waits, before its round k's first copy, until every CTA has issued
// round k - kLead's last, and counts each of its rounds as it issues that round's last copy. A
// hint, never needed for correctness: a wait gives up after twice the CTA's previous round plus
// kSlackNs (a CTA that is not resident, while another kernel holds SMs, would stall the wave), and
// a CTA that gave up waits no more in this launch. Only rounds every CTA has count, and only
// launches of more than kLead of them wait at all.
// Workspace: the kWaveGateCounters counters at kPieceCounters. Round r counts at r mod
// kWaveGateRounds, so its counter reaches P·(⌊r / kWaveGateRounds⌋ + 1) once every CTA has issued it
// (no CTA is kWaveGateRounds rounds ahead of one it waits for); the last CTA to finish sets every
// counter back to 0 for the next launch on the stream.
struct WaveGate {
  static constexpr int kLead = kWaveGateLead;
  static constexpr unsigned long long kSlackNs = 50000;
  unsigned* counters;  // nullptr: off
  int rounds;
  bool waiting = true;
  unsigned long long round_start = 0, last_round = 0;

  // rounds: those every CTA has (a persistent dsd kernel's tiles / P)
  __device__ __forceinline__ WaveGate(float* workspace, int rounds_)
      : counters(workspace != nullptr && rounds_ > kLead ? reinterpret_cast<unsigned*>(workspace) + kPieceCounters
                                                         : nullptr),
        rounds(rounds_) {}

  // Before round k's first copy; the whole warp (lane 0 polls).
  __device__ __forceinline__ void wait(int k) {
    if (counters != nullptr && threadIdx.x % 32 == 0) {
      const unsigned long long now = global_timer_ns();
      if (k > 0) last_round = now - round_start;
      round_start = now;
      const int r = k - kLead;
      if (waiting && r >= 0 && r < rounds) {
        const unsigned* counter = counters + r % kWaveGateRounds;
        const unsigned target = gridDim.x * static_cast<unsigned>(r / kWaveGateRounds + 1);
        while (load_relaxed_gpu(counter) < target) {
          if (global_timer_ns() - now > 2 * last_round + kSlackNs) {
            waiting = false;
            break;
          }
          __nanosleep(256);
        }
      }
    }
    __syncwarp();
  }
  // After round k's last copy; one thread.
  __device__ __forceinline__ void arrive(int k) const {
    if (counters != nullptr && k < rounds) red_add_relaxed_gpu(counters + k % kWaveGateRounds, 1u);
  }
  // After the CTA's last round; one thread, the one that arrived.
  __device__ __forceinline__ void finish() const {
    if (counters == nullptr) return;
    __threadfence();
    if (atomicAdd(counters + kWaveGateRounds, 1u) != gridDim.x - 1) return;
    __threadfence();
    for (int i = 0; i < kWaveGateCounters; ++i) counters[i] = 0;
  }
};

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

}  // namespace kernels
}  // namespace bsjit
