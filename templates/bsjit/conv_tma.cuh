// Block-sparse convolution fprop, updat, and bprop at stride 1, on Hopper (sm_90a) fed by TMA in
// im2col mode, warp-specialized (the data kernel persistent), for the uniform layouts of
// conv_igemm.cuh at b = 64 and 128, 16-bit, channels last. bprop at stride 1 is the forward convolution of dO with the filter's
// taps reversed and its k and c exchanged, padded by the filter's reach less the padding
// (conv_tma_pack_backward_kernel, generator::conv_transposed_geometry): one kernel serves both.
//
// conv_wgmma_data_kernel (conv_wgmma.cuh) gathers each stage's rows with cp.async from every
// thread, works out the rows' coordinates per tile and synchronises the CTA per stage; its short
// reductions (a 3×3 tile over two blocks is 18 stages) paid the pipeline's fill and drain per tile:
// 150-213 TFLOP/s at b = 64 on an H100 against the matmul's 600+ (docs/PERFORMANCE.md, suite C).
// Here the copy engine does the gathering. The input's tensor map is in im2col mode: its bounding
// box is the grid of filter-window corners (lower corner −pad, the traversal stepping by the
// stride), so that one copy of 128 pixels from an output position (n, m, p, q), at
// (q · stride − pad, ...), with the tap's offsets (s · dilation, ...), brings the tile's rows in
// output order across rows and images, zeros where the tap reaches padding or past the last image.
// A tiled map brings the tap's slice of the packed filter ([block][tap][k][c], conv_igemm.cuh).
//
// Warpgroup 0 is the producer (one thread issues a stage's copies, completing on its "full"
// mbarrier); the consumer warpgroups wait on "full", run the stage's wgmmas and free the stage on
// its "empty" mbarrier. The CTAs walk the (tile, block column) items with the column fastest (CTAs
// running together read the same input rows), and the producer runs into the next item while the
// consumers store the last one. Gates: a block gated 0 is skipped by both sides, any other gate
// scales the filter slice in shared memory (as dsd_tma_stages does).
#pragma once

#include "bsjit/conv_wgmma.cuh"
#include "bsjit/matmul_hopper.cuh"

namespace bsjit {
namespace kernels {

// Copies kBM pixels × the map's channels of an im2col map (RANK 4: N, H, W, C; 5: N, D, H, W, C)
// into dst: c the first channel, at[] the first pixel's window corner (W, H, D: innermost first), n
// its image, off[] the tap's offsets (W, H, D), counted on bar.
template <int RANK>
__device__ __forceinline__ void tma_load_im2col(void* dst, const TensorMap& map, int c, const int (&at)[3], int n,
                                                const unsigned short (&off)[3], unsigned long long* bar) {
  static_assert(RANK == 4 || RANK == 5, "2-D or 3-D convolutions");
  if constexpr (RANK == 4)
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5}], [%6], {%7, %8};\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(at[0]), "r"(at[1]), "r"(n),
        "r"(smem_address(bar)), "h"(off[0]), "h"(off[1])
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
        "%5, %6}], [%7], {%8, %9, %10};\n" ::"r"(smem_address(dst)),
        "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(at[0]), "r"(at[1]), "r"(at[2]), "r"(n),
        "r"(smem_address(bar)), "h"(off[0]), "h"(off[1]), "h"(off[2])
        : "memory");
}

// Cfg: T, kB, kStages, kConsumers (2), kThreads (128 · (1 + kConsumers)), kSharedBytes (ConvTmaPlan),
// tables(). RANK: the input map's rank. Grid: at most one CTA per item, items = tiles · block columns.
//
// Swapped, as the matmul's dsd_tma_kernel: a consumer computes Oᵀ for 64 output channels × kR = 128
// rows, the filter slice's 64 rows as wgmma's A (K-major) and 128 gathered pixels as its B, so that
// each wgmma is m64n128 (the plain orientation, m64 rows × n64 channels at b = 64, ran at 195-262
// TFLOP/s on suite C's 3×3 cells); the b / 64 channel groups times the row groups make the
// consumers, kBM = kR · kConsumers / (b / 64) rows a tile. The epilogue is the matmul's: stmatrix
// into two staging tiles per consumer and TMA stores of 64 rows × 64 channels (out as a [rows, K]
// map); with accumulate, the old values are added element by element instead.
template <class Cfg>
struct ConvTmaPlan {
  static constexpr int kR = 128, kGroups = Cfg::kB / 64, kBM = kR * Cfg::kConsumers / kGroups;
  static constexpr int kABytes = kBM * kSwizzleRowBytes, kFilterBytes = Cfg::kB * kSwizzleRowBytes;
  static constexpr int kStageBytes = kABytes + kFilterBytes;
  static constexpr int kBarrierBytes = kSwizzleAtomBytes;  // 2 · kStages mbarriers, padded
  static constexpr int kOutTileBytes = 2 * 64 * kSwizzleRowBytes;  // a consumer's two staging tiles
  static constexpr int kSharedBytes =
      kSwizzleAtomBytes + Cfg::kStages * kStageBytes + kBarrierBytes + Cfg::kConsumers * kOutTileBytes;
};

// The im2col copy's first pixel for output row `row` (over images and positions): its image, and in
// at[] its filter window's corner in the input (W, H, D: innermost first), row · stride − pad.
__device__ __forceinline__ int conv_tma_corner(const ConvDims& p, long long row, int (&at)[3]) {
  const long long positions = static_cast<long long>(p.out[0]) * p.out[1] * p.out[2];
  const int image = static_cast<int>(row / positions);
  long long pos = row - image * positions;
  for (int d = 2; d >= 0; --d) {
    at[2 - d] = static_cast<int>(pos % p.out[d]) * p.stride[d] - p.pad[d];
    pos /= p.out[d];
  }
  return image;
}

// The im2col offsets of filter tap `tap` (W, H, D): its position in the window times the dilation.
__device__ __forceinline__ void conv_tma_offsets(const ConvDims& p, int tap, unsigned short (&off)[3]) {
  int f[3];  // T, R, S
  conv_tap_split(p, tap, f);
#pragma unroll
  for (int d = 0; d < 3; ++d) off[2 - d] = static_cast<unsigned short>(f[d] * p.dilation[d]);
}

// swapped_wgmmas' view of the operands: the filter slice (A) K-major, as backward-data's W.
template <class Cfg>
struct ConvTmaOperands {
  using T = typename Cfg::T;
  static constexpr bool kTransW = true;
};

// kBackward: bprop at stride 1 as the forward convolution of dO (ConvDims p describing it: dO's
// positions and K channels the input, dI's and C the output, the padding (filter − 1) · dilation −
// padding; generator::conv_transposed_geometry) with the filter packed by
// conv_tma_pack_backward_kernel; the walk takes the bprop tables (per input block column, the
// output blocks).
template <class Cfg, int RANK, bool kBackward>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    conv_tma_data_kernel(typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int accumulate,
                          ConvDims p, const __grid_constant__ TensorMap map_in,
                          const __grid_constant__ TensorMap map_filter, const __grid_constant__ TensorMap map_out) {
  using T = typename Cfg::T;
  using Plan = ConvTmaPlan<Cfg>;
  constexpr int b = Cfg::kB, S = Cfg::kStages, kR = Plan::kR, kSlices = b / 64;
  constexpr int kConsumerThreads = 128 * Cfg::kConsumers;
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(Cfg) == 0, "conv_tma_data_kernel needs sm_90a");
#endif
  static_assert(sizeof(T) == 2 && (b == 64 || b == 128), "16-bit, b = 64 or 128");
  static_assert(Cfg::kThreads == 128 + kConsumerThreads && Cfg::kConsumers % Plan::kGroups == 0 && Plan::kBM % 128 == 0,
                "one producer warpgroup, consumers in whole channel groups, tiles of whole 128-pixel copies");
  static_assert(S >= 2 && Plan::kSharedBytes == Cfg::kSharedBytes, "host and device disagree on shared memory");
  static_assert(2 * S * 8 <= Plan::kBarrierBytes, "the mbarriers fit their padding");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);

  const ConvIgemmTables tables = Cfg::tables();
  const int* start = kBackward ? tables.bprop_start : tables.fprop_start;
  const int* entries = kBackward ? tables.bprop_entries : tables.fprop_entries;
  const int columns = p.k / b;
  const long long out_positions = static_cast<long long>(p.out[0]) * p.out[1] * p.out[2];
  const int rows = static_cast<int>(p.n * out_positions);  // the host keeps it below 2^31 (TMA's coordinates)
  const long long items = static_cast<long long>((rows + Plan::kBM - 1) / Plan::kBM) * columns;
  const int taps = p.filter[0] * p.filter[1] * p.filter[2];
  auto gated_off = [&](int block) { return gate != nullptr && gate[block] == 0.0f; };
  ring.init(kConsumerThreads);

  if (threadIdx.x < 128) {  // producer: warp 0 waits for free stages, lane 0 issues the copies
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) prefetch_tensormap(map_in), prefetch_tensormap(map_filter);
    int step = 0;  // this CTA's stages so far, over all its items
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
      const int col = static_cast<int>(item % columns), row0 = static_cast<int>(item / columns) * Plan::kBM;
      // each 128-pixel copy's first output position: its image and window corner (W, H, D)
      int image[Plan::kBM / 128], at[Plan::kBM / 128][3];
#pragma unroll
      for (int h = 0; h < Plan::kBM / 128; ++h) image[h] = conv_tma_corner(p, row0 + 128 * h, at[h]);
      const int first = start[col], count = start[col + 1] - first;
      for (int e = 0; e < count; ++e) {
        const int in_block = entries[2 * (first + e)], block = entries[2 * (first + e) + 1];
        if (gated_off(block)) continue;
        for (int tap = 0; tap < taps; ++tap) {
          unsigned short off[3];
          conv_tma_offsets(p, tap, off);
          const int filter_row = (block * taps + tap) * b;  // the tap's slice in the [blocks · taps · b, b] view
          for (int slice = 0; slice < kSlices; ++slice, ++step) {
            const int round = step / S;
            if (round > 0) mbarrier_wait(&ring.empty[step % S], (round - 1) & 1);  // the whole warp
            if (lane == 0) {
              unsigned long long* bar = &ring.full[step % S];
              unsigned char* stage = ring.stage(step);
              mbarrier_arrive_expect_tx(bar, Plan::kStageBytes);
#pragma unroll
              for (int h = 0; h < Plan::kBM / 128; ++h)
                tma_load_im2col<RANK>(stage + h * 128 * kSwizzleRowBytes, map_in, in_block * b + slice * 64, at[h],
                                      image[h], off, bar);
              tma_load_2d(stage + Plan::kABytes, map_filter, slice * 64, filter_row, bar);
            }
            __syncwarp();
          }
        }
      }
    }
    return;
  }

  const int consumer = threadIdx.x / 128 - 1, group = consumer % Plan::kGroups, part = consumer / Plan::kGroups;
  unsigned char* out_tile = reinterpret_cast<unsigned char*>(ring.full) + Plan::kBarrierBytes +
                            consumer * Plan::kOutTileBytes;
  if (threadIdx.x == 128) prefetch_tensormap(map_out);
  int step = 0, piece = 0;
  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const int col = static_cast<int>(item % columns), row0 = static_cast<int>(item / columns) * Plan::kBM;
    const int first = start[col], count = start[col + 1] - first;
    float d[kR / 2];
#pragma unroll
    for (int i = 0; i < kR / 2; ++i) d[i] = 0.0f;
    wgmma_fence_registers(d);
    int done = 0;  // stages of this item consumed
    for (int e = 0; e < count; ++e) {
      const int block = entries[2 * (first + e) + 1];
      if (gated_off(block)) continue;
      const float g = gate == nullptr ? 1.0f : gate[block];
      for (int j = 0; j < taps * kSlices; ++j, ++step, ++done) {
        mbarrier_wait(&ring.full[step % S], (step / S) & 1);
        unsigned char* stage = ring.stage(step);
        if (g != 1.0f) {  // uniform across the consumers
          scale_shared<T>(stage + Plan::kABytes, Plan::kFilterBytes, g, threadIdx.x - 128, kConsumerThreads);
          fence_proxy_async();
          named_barrier_sync(1, kConsumerThreads);
        }
        wgmma_fence();
        swapped_wgmmas<ConvTmaOperands<Cfg>, kR>(d, stage + Plan::kABytes + group * 64 * kSwizzleRowBytes,
                                  stage + part * kR * kSwizzleRowBytes);
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's wgmmas have finished
        if (done > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);
      }
    }
    wgmma_wait<0>();
    if (done > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);  // the item's last stage
    wgmma_fence_registers(d);
    // d[4i + 2h + e]: channel 16·warp + lane / 4 + 8h of the group, row 8i + 2·(lane % 4) + e of the part
    const int channel0 = col * b + group * 64, row_base = row0 + part * kR;
    if (accumulate) {
      const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
#pragma unroll
      for (int i = 0; i < kR / 8; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int row = row_base + 8 * i + 2 * (lane % 4) + (q & 1);
          if (row < rows) {
            T* o = out + static_cast<long long>(row) * p.k + channel0 + 16 * warp + lane / 4 + 8 * (q >> 1);
            *o = from_float<T>(to_float(*o) + d[4 * i + q]);
          }
        }
    } else {
      PackedFeatures<kR> tile;
#pragma unroll
      for (int j = 0; j < kR / 4; ++j) tile.packed[j] = pack_pair<T>(d[2 * j], d[2 * j + 1]);
      tile.feature0 = channel0, tile.row_base = row_base;
      store_feature_pieces(0, tile, map_out, out_tile, piece, rows, consumer);
    }
  }
  if (threadIdx.x % 128 == 0) bulk_wait_group<0>();  // the stores have read the staging tiles
}

// updat fed by TMA: as conv_wgmma_updat_kernel (CTA (x, y): block and tap x, output positions
// [y · chunk, ...) in stages of 64; workspace[block][tap][k][c] += Σ dO[pos, k] · I[in(pos, tap), c]
// in fp32 atomics), with a producer warpgroup: a stage is 64 rows of dO's block (a tiled copy per 64
// channels of map_dy, [rows, K]) and the 64 input pixels the tap joins to them (an im2col copy per
// 64 channels, offsets the tap's, zeros where it reaches padding), both in 128-byte-swizzled groups
// of 64 channels, MN-major for the wgmmas (positions the reduction). b / 64 consumer warpgroups own
// 64 k rows of the block each, all its c. Cfg::kUpdatStages stages, kUpdatSharedBytes
// (ConvTmaUpdatPlan).
template <class Cfg>
struct ConvTmaUpdatPlan {
  static constexpr int kGroups = Cfg::kB / 64, kGroupBytes = 64 * kSwizzleRowBytes;
  static constexpr int kStageBytes = 2 * kGroups * kGroupBytes;  // dO's groups, then I's
  static constexpr int kSharedBytes = kSwizzleAtomBytes + Cfg::kUpdatStages * kStageBytes + kSwizzleAtomBytes;
};

template <class Cfg, int RANK>
__global__ void __launch_bounds__(128 * (1 + Cfg::kB / 64), 1)
    conv_tma_updat_kernel(float* __restrict__ workspace, const float* __restrict__ gate, int chunk, ConvDims p,
                          const __grid_constant__ TensorMap map_in, const __grid_constant__ TensorMap map_dy) {
  using T = typename Cfg::T;
  using Plan = ConvTmaUpdatPlan<Cfg>;
  constexpr int b = Cfg::kB, S = Cfg::kUpdatStages, kGroups = Plan::kGroups, kGroupBytes = Plan::kGroupBytes;
#ifdef BSJIT_NO_WGMMA
  static_assert(sizeof(Cfg) == 0, "conv_tma_updat_kernel needs sm_90a");
#endif
  static_assert(sizeof(T) == 2 && (b == 64 || b == 128), "16-bit, b = 64 or 128");
  static_assert(S >= 2 && Plan::kSharedBytes == Cfg::kUpdatSharedBytes, "host and device disagree on shared memory");
  static_assert(2 * S * 8 <= kSwizzleAtomBytes, "the mbarriers fit their padding");
  extern __shared__ unsigned char smem_raw[];
  const StageRing<S, Plan::kStageBytes> ring(smem_raw);
  const ConvIgemmTables t = Cfg::tables();
  const ConvUpdatRange range(p, chunk);
  if ((gate != nullptr && gate[range.block] == 0.0f) || range.length <= 0) return;  // the whole CTA
  ring.init(128 * kGroups);
  const int steps = (range.length + 63) / 64;

  if (threadIdx.x < 128) {  // producer
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    if (lane == 0) prefetch_tensormap(map_in), prefetch_tensormap(map_dy);
    const int kb = t.coords[2 * range.block], cb = t.coords[2 * range.block + 1];
    unsigned short off[3];
    conv_tma_offsets(p, range.tap, off);
    for (int step = 0; step < steps; ++step) {
      const int round = step / S;
      if (round > 0) mbarrier_wait(&ring.empty[step % S], (round - 1) & 1);  // the whole warp
      if (lane == 0) {
        const long long row = range.begin + 64LL * step;
        int at[3];
        const int image = conv_tma_corner(p, row, at);
        unsigned long long* bar = &ring.full[step % S];
        unsigned char* stage = ring.stage(step);
        mbarrier_arrive_expect_tx(bar, Plan::kStageBytes);
#pragma unroll
        for (int q = 0; q < kGroups; ++q) {
          tma_load_2d(stage + q * kGroupBytes, map_dy, kb * b + 64 * q, static_cast<int>(row), bar);
          tma_load_im2col<RANK>(stage + (kGroups + q) * kGroupBytes, map_in, cb * b + 64 * q, at, image, off, bar);
        }
      }
      __syncwarp();
    }
    return;
  }

  const int consumer = threadIdx.x / 128 - 1;  // k rows 64 · consumer ..
  float d[b / 2];
#pragma unroll
  for (int i = 0; i < b / 2; ++i) d[i] = 0.0f;
  wgmma_fence_registers(d);
  for (int step = 0; step < steps; ++step) {
    mbarrier_wait(&ring.full[step % S], (step / S) & 1);
    const unsigned char* as = ring.stage(step) + consumer * kGroupBytes;
    const unsigned char* bs = ring.stage(step) + kGroups * kGroupBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // 16 positions further on per k16
      wgmma_m64k16<T, b, 1, 1>(d, smem_descriptor(as + kk * 16 * kSwizzleRowBytes, kGroupBytes, kSwizzleAtomBytes),
                               smem_descriptor(bs + kk * 16 * kSwizzleRowBytes, kGroupBytes, kSwizzleAtomBytes));
    wgmma_commit();
    wgmma_wait<1>();
    if (step > 0) mbarrier_arrive(&ring.empty[(step - 1) % S]);
  }
  wgmma_wait<0>();
  wgmma_fence_registers(d);
  float* w = workspace + (static_cast<long long>(range.block) * range.taps + range.tap) * b * b;
  wgmma_epilogue<b>(d, consumer * 64, [&](int r, int c, float v0, float v1) {
    red_add_pair(w + r * b + c, v0, v1);  // c even: 8-byte aligned
  });
}

// The filter as conv_tma_data_kernel's bprop reads it: per block and tap, the b × b slice with k
// and c exchanged ([block][tap][c][k], k contiguous: K-major for the product's reduction over k), the
// taps in reverse order (the flipped filter of the transposed convolution).
template <class T>
__global__ void conv_tma_pack_backward_kernel(const T* __restrict__ filter, T* __restrict__ packed, int blocks, int b,
                                              int taps) {
  conv_filter_elements(blocks, b, taps, [&](long long e, long long block, int within) {
    const int k = within % b, c = within / b % b, tap = within / (b * b);
    packed[e] = filter[block * b * b * taps + (static_cast<long long>(k) * b + c) * taps + (taps - 1 - tap)];
  });
}

}  // namespace kernels
}  // namespace bsjit
