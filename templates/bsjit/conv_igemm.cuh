// Block-sparse convolution as implicit GEMM on the tensor cores (mma.sync, sm_80 and up), for 16-bit
// activations stored channels last on a uniform layout: blocks of b × b channels, b a multiple of
// 16, each block's input and output channels b-aligned and consecutive.
//
// fprop and bprop are one kernel, conv_igemm_data_kernel, in two directions. A CTA computes a
// BM × b tile of the output: BM rows (output positions of the n images, channels contiguous) by
// one block column of b channels. Its reduction runs over the block column's entries (the layout's
// blocks in that column, from the generator's tables), each filter tap and each BK-wide slice of
// the block's channels; every stage gathers BM rows of the source activation at the positions the
// tap joins to the tile's rows (cp.async, zero-filled where the tap reaches padding or, backward,
// falls between a stride's outputs) and BK × b of the packed filter.
//   fprop:  O[row, k]  = Σ blocks (kb, cb), taps, c   I[in(row, tap), c] · F[k, c, tap]
//   bprop:  dI[row, c] = Σ blocks (kb, cb), taps, k  dO[out(row, tap), k] · F[k, c, tap]
// updat is conv_igemm_updat_kernel: one CTA per block, tap and range of output positions computes
// the b × b product dOᵀ · I(tap) over its range and adds it in fp32 to a workspace (atomics: the
// ranges split the reduction so that the grid fills the GPU); conv_igemm_updat_store_kernel then
// writes the filter gradient in the filter's layout, gated, accumulated where asked.
//
// The filter arrives as the layout stores it, [K_b, C_b, T, R, S] per block; the kernels read it
// packed per tap, [block][tap][k][c] (conv_igemm_pack_kernel), so that one tap's b × b slice is
// rows of 16-byte copies: K-major for fprop (rows k, c contiguous), MN-major for bprop (rows k, c
// the output's columns). With one tap the layout is already packed.
//
// Tile sizes and the tables come from the generator (generator/conv_generator.cpp) through the
// configs DataCfg and UpdatCfg: kB, kBM, kBN, kBK, kStages, kWarpsM, kWarpsN, kThreads, T, and
// tables(): per block column (fprop: output, bprop: input) entries [start[j], start[j + 1]) of
// pairs (the other side's channel block, the block's index); per block its (output, input)
// channel blocks.
#pragma once

#ifndef BSJIT_HOST_EMULATION  // the CPU tests run it (tests/runtime/kernel_emulation.hpp)
#include "bsjit/common.cuh"
#endif
#include "bsjit/conv_dims.cuh"
#include "bsjit/pipeline.cuh"

namespace bsjit {
namespace kernels {

struct ConvIgemmTables {
  const int* fprop_start;    // [K / b + 1]
  const int* fprop_entries;  // pairs (input block, block)
  const int* bprop_start;    // [C / b + 1]
  const int* bprop_entries;  // pairs (output block, block)
  const int* coords;         // per block: (output block, input block)
};

// Filter tap `tap` as (t, r, s).
__device__ __forceinline__ void conv_tap_split(const ConvDims& p, int tap, int* f) {
  f[2] = tap % p.filter[2];
  f[1] = tap / p.filter[2] % p.filter[1];
  f[0] = tap / (p.filter[1] * p.filter[2]);
}

// Division by a divisor fixed for the whole kernel, by a multiply and a shift (Granlund and
// Montgomery): n / d for 0 ≤ n < 2^31 and 1 ≤ d < 2^31, exactly, for a few instructions where the
// hardware's integer division takes some twenty.
struct ConvFastDiv {
  unsigned magic, shift;
  __device__ __forceinline__ explicit ConvFastDiv(int divisor) : shift(0) {
    const unsigned d = static_cast<unsigned>(divisor);
    while ((1u << shift) < d) ++shift;
    magic = static_cast<unsigned>(((1ull << 32) * ((1ull << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ int operator()(int n) const {
    return static_cast<int>((__umulhi(static_cast<unsigned>(n), magic) + static_cast<unsigned>(n)) >> shift);
  }
};

// The stage copies of a ROWS × COLS gathered tile that this thread issues, 16 bytes each, as
// copy_tile_async assigns them: the same rows at every stage (and one column of chunks), so that the
// kernels work out a row's source coordinates once per tile and each stage only adds its tap's shift.
template <class T, int ROWS, int COLS, int THREADS>
struct ConvGatherRows {
  static constexpr int kPer = 16 / sizeof(T), kChunksPerRow = COLS / kPer;
  static constexpr int kCount = ROWS * kChunksPerRow / THREADS;  // rows per thread
  static_assert(COLS % kPer == 0 && THREADS % kChunksPerRow == 0 && ROWS * kChunksPerRow % THREADS == 0,
                "every thread copies whole chunks of the same column, kCount rows");
  __device__ __forceinline__ static int row(int j) { return (threadIdx.x + j * THREADS) / kChunksPerRow; }
  __device__ __forceinline__ static int column() { return threadIdx.x % kChunksPerRow * kPer; }
};

// The rows of the data kernels in classes: bprop's by (i + pad) mod stride per dimension, so that
// a class's rows reach outputs through the same taps, those with tap · dilation ≡ i + pad (mod
// stride), and a stride's holes are never gathered (with stride 2 in H and W, three quarters of
// the taps a row would otherwise gather as zeros); fprop's rows are one class, every tap. Class
// rows: coordinate first[d] + j · step[d] for j < count[d]; its taps: tap0[d] + m · tap_step[d]
// for m < taps[d]. A row at coordinate i reads the source at at(i) + shift(m) per dimension:
// forward at = i · stride − pad and shift = tap · dilation; backward at = ⌊(i + pad) / stride⌋ and
// shift = −⌊tap · dilation / stride⌋ (exact, i + pad and tap · dilation sharing their residue), so
// that shift(m) = shift0[d] + m · shift_step[d] needs no division.
struct ConvRowClass {
  int first[3], step[3], count[3], tap0[3], tap_step[3], taps[3], shift0[3], shift_step[3];
};

template <bool kBackward>
__device__ __forceinline__ ConvRowClass conv_row_class(const ConvDims& p, int index) {
  ConvRowClass c;
#pragma unroll
  for (int d = 2; d >= 0; --d) {
    const int s = kBackward ? p.stride[d] : 1, size = kBackward ? p.in[d] : p.out[d];
    c.first[d] = index % s;
    index /= s;
    c.step[d] = s;
    c.count[d] = size > c.first[d] ? (size - c.first[d] + s - 1) / s : 0;
    const int residue = (c.first[d] + p.pad[d]) % s;
    c.tap0[d] = 0, c.tap_step[d] = 1, c.taps[d] = 0;
    for (int f = 0; f < p.filter[d]; ++f)
      if (f * p.dilation[d] % s == residue) {
        if (c.taps[d] == 0) c.tap0[d] = f;
        if (c.taps[d] == 1) c.tap_step[d] = f - c.tap0[d];  // the solutions step evenly
        ++c.taps[d];
      }
    const int sign = kBackward ? -1 : 1;
    c.shift0[d] = sign * (c.tap0[d] * p.dilation[d] / s);
    c.shift_step[d] = sign * (c.tap_step[d] * p.dilation[d] / s);
  }
  return c;
}

// The data kernels' walk: over this CTA's BM-row tiles of the row classes (grid y strides over
// them, the classes' tiles one after another), and within a tile over its stages in order (BK-wide
// slices of a block fastest, then the class's taps, then the column's entries), with the rows this
// thread gathers (Gather) held in registers: their source coordinates before the tap's shift and
// their position index.
template <class T, bool kBackward, int kB, int kBM, int kBK, int kThreads>
struct ConvDataWalk {
  using Gather = ConvGatherRows<T, kBM, kBK, kThreads>;
  static constexpr int kSlices = kB / kBK;
  static_assert(kB % kBK == 0, "a stage is a slice of one block");

  const ConvDims& p;
  int rows_of[3];  // the output's image
  int src_of[3];   // the gathered activation's image
  int src_channels, out_channels;
  long long positions, src_positions;
  const int* entries;  // the column's: pairs (the other side's channel block, the block)
  int first, count;
  ConvRowClass rc;  // the tile's class
  int per_entry, total;
  int at[Gather::kCount][3];
  long long base[Gather::kCount];
  int slice, m[3], entry;  // the next stage to load

  __device__ __forceinline__ ConvDataWalk(const ConvDims& dims, const ConvIgemmTables& t, int column) : p(dims) {
#pragma unroll
    for (int d = 0; d < 3; ++d) rows_of[d] = kBackward ? p.in[d] : p.out[d], src_of[d] = kBackward ? p.out[d] : p.in[d];
    src_channels = kBackward ? p.k : p.c, out_channels = kBackward ? p.c : p.k;
    positions = static_cast<long long>(rows_of[0]) * rows_of[1] * rows_of[2];
    src_positions = static_cast<long long>(src_of[0]) * src_of[1] * src_of[2];
    const int* start = kBackward ? t.bprop_start : t.fprop_start;
    entries = kBackward ? t.bprop_entries : t.fprop_entries;
    first = start[column], count = start[column + 1] - first;
  }

  // tile() for each of this CTA's tiles, once row_image[r] and row_pos[r] (BM each, shared) hold
  // row r's image (−1: no row) and output position, and the walk stands at the tile's first stage.
  // tile() ends with the CTA synchronised (the next tile rewrites the tables).
  template <class Tile>
  __device__ __forceinline__ void for_each_tile(int* row_image, int* row_pos, Tile tile) {
    const int classes = kBackward ? p.stride[0] * p.stride[1] * p.stride[2] : 1;
    long long item = blockIdx.y, passed = 0;
    for (int cls = 0; cls < classes; ++cls) {
      rc = conv_row_class<kBackward>(p, cls);
      const long long class_positions = static_cast<long long>(rc.count[0]) * rc.count[1] * rc.count[2];
      const long long rows = p.n * class_positions, tiles = (rows + kBM - 1) / kBM;
      per_entry = kSlices * rc.taps[0] * rc.taps[1] * rc.taps[2], total = count * per_entry;
      for (; item - passed < tiles; item += gridDim.y) {
        const long long row0 = (item - passed) * kBM;
        // row r's image (−1: none) and coordinates in the output
        auto coordinates = [&](int r, int* c) -> long long {
          const long long row = row0 + r;
          if (row >= rows) {
            c[0] = c[1] = c[2] = -(1 << 30);  // out of every range, shifted or not
            return -1;
          }
          const long long j = row % class_positions;
          c[0] = rc.first[0] + rc.step[0] * static_cast<int>(j / (rc.count[1] * rc.count[2]));
          c[1] = rc.first[1] + rc.step[1] * static_cast<int>(j / rc.count[2] % rc.count[1]);
          c[2] = rc.first[2] + rc.step[2] * static_cast<int>(j % rc.count[2]);
          return row / class_positions;
        };
        for (int r = threadIdx.x; r < kBM; r += kThreads) {
          int c[3];
          const long long image = coordinates(r, c);
          row_image[r] = static_cast<int>(image);
          row_pos[r] = image < 0 ? 0 : (c[0] * rows_of[1] + c[1]) * rows_of[2] + c[2];
        }
#pragma unroll
        for (int j = 0; j < Gather::kCount; ++j) {
          const long long image = coordinates(Gather::row(j), at[j]);
          if (image >= 0) {
#pragma unroll
            for (int d = 0; d < 3; ++d)
              at[j][d] = kBackward ? (at[j][d] + p.pad[d]) / p.stride[d] : at[j][d] * p.stride[d] - p.pad[d];
          }
          base[j] = image * src_positions +
                    (static_cast<long long>(at[j][0]) * src_of[1] + at[j][1]) * src_of[2] + at[j][2];
        }
        slice = 0, m[0] = m[1] = m[2] = 0, entry = first;
        __syncthreads();
        tile();
      }
      passed += tiles;
    }
  }

  // The next stage's gather: this thread's rows of BK channels of the source at the stage's tap,
  // 16 bytes each to dst(row) (zero-filled where the tap reaches padding or a stride's hole).
  template <class Dst>
  __device__ __forceinline__ void gather(const T* act, Dst dst) const {
    int shift[3];
#pragma unroll
    for (int d = 0; d < 3; ++d) shift[d] = rc.shift0[d] + m[d] * rc.shift_step[d];
    const long long shift_at = (static_cast<long long>(shift[0]) * src_of[1] + shift[1]) * src_of[2] + shift[2];
    const T* src = act + static_cast<long long>(entries[2 * entry]) * kB + slice * kBK + Gather::column();
#pragma unroll
    for (int j = 0; j < Gather::kCount; ++j) {
      bool ok = true;
#pragma unroll
      for (int d = 0; d < 3; ++d) ok = ok && static_cast<unsigned>(at[j][d] + shift[d]) < static_cast<unsigned>(src_of[d]);
      cp_async_16(dst(Gather::row(j)), src + (ok ? base[j] + shift_at : 0) * src_channels, ok);
    }
  }

  // The next stage's b × b slice of the packed filter ([block][tap][k][c]) and its first reduction
  // index in it (the slice's).
  __device__ __forceinline__ const T* filter_tap(const T* filter) const {
    int f[3];
#pragma unroll
    for (int d = 0; d < 3; ++d) f[d] = rc.tap0[d] + m[d] * rc.tap_step[d];
    const int tap = (f[0] * p.filter[1] + f[1]) * p.filter[2] + f[2];
    return filter +
           (static_cast<long long>(entries[2 * entry + 1]) * p.filter[0] * p.filter[1] * p.filter[2] + tap) * kB * kB;
  }

  __device__ __forceinline__ void next() {
    if (++slice == kSlices) {
      slice = 0;
      if (++m[2] == rc.taps[2]) {
        m[2] = 0;
        if (++m[1] == rc.taps[1]) {
          m[1] = 0;
          if (++m[0] == rc.taps[0]) m[0] = 0, ++entry;
        }
      }
    }
  }

  // The gate of the block stage `step` (counted from the tile's first) multiplies, by a cursor of
  // its own: gate(step) comes once per step, in order.
  struct Gates {
    const float* gate;
    const int* block;  // the column's entries' second halves, stride 2
    int per_entry, left;
    __device__ __forceinline__ float operator()() {
      if (gate == nullptr) return 1.0f;
      const float g = gate[*block];
      if (--left == 0) left = per_entry, block += 2;
      return g;
    }
  };
  __device__ __forceinline__ Gates gates(const float* gate) const {
    return {gate, entries + 2 * first + 1, per_entry, per_entry};
  }

  // The output element (r, c) of the tile (c: the block column's channel).
  __device__ __forceinline__ long long output_index(const int* row_image, const int* row_pos, int column, int r,
                                                    int c) const {
    return (row_image[r] * positions + row_pos[r]) * out_channels + static_cast<long long>(column) * kB + c;
  }
};

// O (kBackward false) or dI (true), as the header says. act is I or dO, filter the packed filter.
// Grid: x the output's block columns, y strides over the row classes' BM-row tiles.
template <class Cfg, bool kBackward>
__global__ void __launch_bounds__(Cfg::kThreads)
    conv_igemm_data_kernel(const typename Cfg::T* __restrict__ act, const typename Cfg::T* __restrict__ filter,
                           typename Cfg::T* __restrict__ out, const float* __restrict__ gate, int accumulate,
                           ConvDims p) {
  using T = typename Cfg::T;
  constexpr int kB = Cfg::kB, kBM = Cfg::kBM, kBK = Cfg::kBK, kStages = Cfg::kStages;
  constexpr int kSA = kBK + kPad;                   // As[BM][BK]: K-major
  constexpr int kSB = kBackward ? kB + kPad : kSA;  // Bs[BK][b] (bprop) or Bs[b][BK] (fprop)
  constexpr int kBRows = kBackward ? kBK : kB, kBCols = kBackward ? kB : kBK;
  static_assert(Cfg::kBN == kB, "a CTA's columns are one block column");
  __shared__ __align__(16) T As[kStages][kBM * kSA];
  __shared__ __align__(16) T Bs[kStages][kBRows * kSB];
  __shared__ int row_image[kBM], row_pos[kBM];

  ConvDataWalk<T, kBackward, kB, kBM, kBK, Cfg::kThreads> walk(p, Cfg::tables(), blockIdx.x);
  walk.for_each_tile(row_image, row_pos, [&] {
    WarpMma<Cfg, true, !kBackward, kSA, kSB> mma;
    mma.clear();
    auto gates = walk.gates(gate);
    run_pipeline<kStages>(
        walk.total,
        [&](int step) {
          walk.gather(act, [&](int r) { return As[step % kStages] + r * kSA + decltype(walk)::Gather::column(); });
          const T* w = walk.filter_tap(filter);
          const int k0 = walk.slice * kBK;
          copy_tile_async<kBRows, kBCols, kSB, Cfg::kThreads>(
              Bs[step % kStages], [&](int r) { return kBackward ? w + (k0 + r) * kB : w + r * kB + k0; },
              [](int) { return true; });
          walk.next();
        },
        [&](int step) {
          const float g = gates();
          if (g != 0.0f) mma.step(As[step % kStages], Bs[step % kStages], g);  // uniform across the CTA
        });
    mma.epilogue([&](int r, int c, float v0, float v1) {
      if (row_image[r] >= 0)
        store_pair(out + walk.output_index(row_image, row_pos, blockIdx.x, r, c), v0, v1, accumulate);
    });
    __syncthreads();  // the next tile rewrites the row tables and the stages
  });
}

// updat's CTA: its block and (first) tap (blockIdx.x = block · taps + tap, or with taps in groups
// block · ⌈taps / group⌉ + tap / group), its range of output positions
// [begin, begin + length) (from blockIdx.y · chunk), and the input position each reads through the
// tap. A range's positions lie within 2^30 + positions per image < 2^31 of one another (the
// runtime's bound), so that ConvFastDiv splits them into image and coordinates.
struct ConvUpdatRange {
  const ConvDims& p;
  int block, tap, length, taps;
  long long begin;
  long long image0;  // begin + i is position i + first of image image0
  int first, positions;
  long long in_positions;
  int reach[3];  // the tap's offset from o · stride
  ConvFastDiv per_image, per_line, per_plane;

  // group: the taps a CTA takes (x = block · ⌈taps / group⌉ + the group's index; tap its first)
  __device__ __forceinline__ ConvUpdatRange(const ConvDims& dims, int chunk, int group = 1)
      : p(dims),
        positions(dims.out[0] * dims.out[1] * dims.out[2]),
        per_image(dims.out[0] * dims.out[1] * dims.out[2]),
        per_line(dims.out[2]),
        per_plane(dims.out[1]) {
    taps = p.filter[0] * p.filter[1] * p.filter[2];
    const int groups = conv_tap_groups(taps, group);
    block = blockIdx.x / groups, tap = blockIdx.x % groups * group;
    in_positions = static_cast<long long>(p.in[0]) * p.in[1] * p.in[2];
    const long long rows = static_cast<long long>(p.n) * positions;
    begin = static_cast<long long>(blockIdx.y) * chunk;
    length = begin < rows ? static_cast<int>((begin + chunk < rows ? begin + chunk : rows) - begin) : 0;
    image0 = begin / positions;
    first = static_cast<int>(begin % positions);
    tap_reach(tap, reach);
  }

  // Tap t's offset from o · stride (each dimension).
  __device__ __forceinline__ void tap_reach(int t, int (&r)[3]) const {
    int f[3];
    conv_tap_split(p, t, f);
#pragma unroll
    for (int d = 0; d < 3; ++d) r[d] = f[d] * p.dilation[d] - p.pad[d];
  }

  // Position begin + i: its image (from image0) and output coordinates.
  __device__ __forceinline__ void position(int i, int& image, int (&o)[3]) const {
    const int at = i + first;
    image = per_image(at);
    const int pos = at - image * positions, line = per_line(pos), plane = per_plane(line);
    o[0] = plane, o[1] = line - plane * p.out[1], o[2] = pos - line * p.out[2];
  }

  // The input position (index over images and positions) that output position (image, o) reads at
  // a tap of offset r, or −1 where it reaches padding or !ok.
  __device__ __forceinline__ long long source(int image, const int (&o)[3], const int (&r)[3], bool ok) const {
    int c[3];
#pragma unroll
    for (int d = 0; d < 3; ++d) {
      c[d] = o[d] * p.stride[d] + r[d];
      ok = ok && static_cast<unsigned>(c[d]) < static_cast<unsigned>(p.in[d]);
    }
    return ok ? (image0 + image) * in_positions + (static_cast<long long>(c[0]) * p.in[1] + c[1]) * p.in[2] + c[2]
              : -1;
  }

  // The input position that position begin + i reads at the CTA's (first) tap, or −1 where the tap
  // reaches padding or i is past the range.
  __device__ __forceinline__ long long source(int i) const {
    int image, o[3];
    position(i, image, o);
    return source(image, o, reach, i < length);
  }
};

// The filter gradient's partial sums: CTA (x, y) adds to workspace[block][tap][k][c] (fp32) the
// product over its range of output positions (ConvUpdatRange) of dO[pos, k]ᵀ · I[in(pos, tap), c].
// Blocks gated 0 are skipped.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads)
    conv_igemm_updat_kernel(const typename Cfg::T* __restrict__ in, const typename Cfg::T* __restrict__ grad_out,
                            float* __restrict__ workspace, const float* __restrict__ gate, int chunk, ConvDims p) {
  using T = typename Cfg::T;
  constexpr int kB = Cfg::kB, kBK = Cfg::kBK, kStages = Cfg::kStages, kS = kB + kPad;
  static_assert(Cfg::kBM == kB && Cfg::kBN == kB, "a CTA computes one block's b × b");
  using Gather = ConvGatherRows<T, kBK, kB, Cfg::kThreads>;
  __shared__ __align__(16) T As[kStages][kBK * kS];  // dO rows: [position][k], MN-major
  __shared__ __align__(16) T Bs[kStages][kBK * kS];  // I rows:  [position][c], MN-major

  const ConvIgemmTables t = Cfg::tables();
  const ConvUpdatRange range(p, chunk);
  if ((gate != nullptr && gate[range.block] == 0.0f) || range.length <= 0) return;
  const T* dy = grad_out + range.begin * p.k + static_cast<long long>(t.coords[2 * range.block]) * kB;
  const T* x = in + static_cast<long long>(t.coords[2 * range.block + 1]) * kB + Gather::column();

  WarpMma<Cfg, false, false, kS, kS> mma;
  mma.clear();
  run_pipeline<kStages>(
      (range.length + kBK - 1) / kBK,
      [&](int step) {
        const int i0 = step * kBK;
        copy_tile_async<kBK, kB, kS, Cfg::kThreads>(
            As[step % kStages], [&](int r) { return dy + static_cast<long long>(i0 + r) * p.k; },
            [&](int r) { return i0 + r < range.length; });
#pragma unroll
        for (int j = 0; j < Gather::kCount; ++j) {
          const int r = Gather::row(j);
          const long long s = range.source(i0 + r);
          cp_async_16(Bs[step % kStages] + r * kS + Gather::column(), x + (s < 0 ? 0 : s) * p.c, s >= 0);
        }
      },
      [&](int step) { mma.step(As[step % kStages], Bs[step % kStages], 1.0f); });

  float* w = workspace + (static_cast<long long>(range.block) * range.taps + range.tap) * kB * kB;
  mma.epilogue([&](int r, int c, float v0, float v1) {
    atomicAdd(w + r * kB + c, v0);
    atomicAdd(w + r * kB + c + 1, v1);
  });
}

// f(e, block, within) for every element e of a filter of `blocks` blocks of b × b × taps elements
// (within: e's index in its block), over a grid-stride loop.
template <class F>
__device__ __forceinline__ void conv_filter_elements(int blocks, int b, int taps, F f) {
  const long long per_block = static_cast<long long>(b) * b * taps, total = blocks * per_block;
  for (long long e = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<long long>(gridDim.x) * blockDim.x)
    f(e, e / per_block, static_cast<int>(e % per_block));
}

// The filter gradient from the workspace: element (block, k, c, tap) of the layout's filter
// ([K_b, C_b, taps] per block) is gate[block] · workspace[block][tap][k][c], added to the old value
// with accumulate.
template <class T>
__global__ void conv_igemm_updat_store_kernel(const float* __restrict__ workspace, T* __restrict__ grad_filter,
                                              const float* __restrict__ gate, int accumulate, int blocks, int b,
                                              int taps) {
  conv_filter_elements(blocks, b, taps, [&](long long e, long long block, int within) {
    const int tap = within % taps, c = within / taps % b, k = within / (taps * b);
    const float g = gate != nullptr ? gate[block] : 1.0f;
    const float v = g * workspace[((block * taps + tap) * b + k) * b + c];
    grad_filter[e] = from_float<T>(accumulate ? to_float(grad_filter[e]) + v : v);
  });
}

// The filter packed per tap: packed[block][tap][k][c] = filter[block][k][c][tap].
template <class T>
__global__ void conv_igemm_pack_kernel(const T* __restrict__ filter, T* __restrict__ packed, int blocks, int b,
                                       int taps) {
  conv_filter_elements(blocks, b, taps, [&](long long e, long long block, int within) {
    const int c = within % b, k = within / b % b, tap = within / (b * b);
    packed[e] = filter[block * b * b * taps + (static_cast<long long>(k) * b + c) * taps + tap];
  });
}

}  // namespace kernels
}  // namespace bsjit
