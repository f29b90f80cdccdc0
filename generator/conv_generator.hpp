// Turns (conv layout, dtype, activation order) into the convolution kernels' source, instantiating
// templates/bsjit/conv_direct.cuh (every layout) and conv_igemm.cuh (the tensor cores, uniform
// layouts). The layout's lists are pointer tables (device_tables.hpp), loaded with the module, and
// the sizes a kernel argument, so the source holds neither: one compile per dtype and order (and
// block size, for the tensor cores) serves every layout and geometry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bsjit/conv_layout.hpp"
#include "bsjit/layout.hpp"
#include "bsjit/types.hpp"
#include "device_tables.hpp"
#include "templates/bsjit/conv_dims.cuh"

namespace bsjit::generator {

struct GeneratedConv {
  std::string source, label;
  std::string fprop, bprop, updat;              // name expressions
  int threads = 0;                              // every kernel's CTA
  std::int64_t largest_block = 0;               // filter elements of the largest block: updat's grid x
  std::int64_t rows = 0;                        // the filter's rows l2_normalize scales (and its gain's length)
  std::string l2_normalize, l2_normalize_grad;  // name expressions
  std::string gather, gather_gate;              // name expressions: blocks of T, of float
  DeviceTables tables;                          // kConvBlocks, kConvChannels, kConvOutStart, kConvOutEntries,
                                                // kConvInStart, kConvInEntries, kConvRows (pointers)
};

// The kernels for layout with taps filter taps; deconv chooses l2_normalize's rows (each block's
// output channels, or for a deconvolution its input channels). Throws Error where the layout's
// filter exceeds 2^31 elements or it has more than 65535 blocks (updat's grid y).
GeneratedConv generate_conv(const ConvLayout& layout, std::int64_t taps, DType dtype, bool channels_last,
                            bool deconv = false);

// A 1×1 convolution with stride 1 and no padding, channels last, on a uniform layout of b × b
// blocks (b a matmul block size) is a matmul over n · D · H · W rows: with M the matmul over the
// transposed mask [K / b, C / b], whose weight W' [K, C] holds in its block p the convolution's block
// order[p] ([K_b, C_b], as stored), the convolution's
//   fprop  y = x · W'ᵀ  is M.backward_data(x, W', y),
//   bprop  dx = dy · W' is M.forward(dy, W', dx),
//   updat  dW' = dyᵀ · x is M.backward_weight(dy, x, dW'), block p of it the convolution's order[p].
struct ConvMatmulPlan {
  int block = 0;
  Layout layout;           // [K / b, C / b]
  std::vector<int> order;  // per matmul block, the convolution's block
};
// The plan where the convolution is such a matmul, else nothing.
std::optional<ConvMatmulPlan> conv_matmul_plan(const ConvLayout& layout, const ConvGeometry& geometry,
                                               bool channels_last);

// Where every block of layout is b × b and its input and output channels are b-aligned and
// consecutive: per block its (output block, input block), else nothing. (Each caller takes the
// block sizes its kernels have.)
struct UniformConvLayout {
  int block = 0;
  std::vector<std::pair<int, int>> coords;
};
std::optional<UniformConvLayout> uniform_conv_layout(const ConvLayout& layout);

// The tiles of the tensor-core kernels at block size b (16, 32, 64 or 128): the data kernels (fprop,
// bprop) bm rows × b columns with 4 warps, updat b × b over bk positions a stage; stages as many as
// the 48 KiB of static shared memory hold.
struct ConvIgemmTile {
  int bm, bk, stages, warps_m, warps_n;
  constexpr int threads() const { return 32 * warps_m * warps_n; }
};
struct ConvIgemmTiles {
  ConvIgemmTile data, updat;
};
constexpr ConvIgemmTiles conv_igemm_tiles(int b) {
  const ConvIgemmTile data = b == 16   ? ConvIgemmTile{128, 16, 4, 4, 1}
                             : b == 32 ? ConvIgemmTile{128, 32, 3, 4, 1}
                             : b == 64 ? ConvIgemmTile{128, 32, 3, 2, 2}
                                       : ConvIgemmTile{64, 32, 3, 2, 2};
  const ConvIgemmTile updat = b == 16 ? ConvIgemmTile{16, 32, 3, 1, 1} : ConvIgemmTile{b, 32, b == 128 ? 2 : 3, 2, 2};
  return {data, updat};
}

// The kernels on Hopper's warpgroup tensor cores (templates/bsjit/conv_wgmma.cuh, sm_90a) at b = 64
// and 128. Data kernels: bm rows over `warpgroups` warpgroups of 128 threads, 64 channels a stage,
// `stages` stages in dynamic shared memory (shared_bytes(b), DsdWgmmaPlan's). updat: a warpgroup
// per 64 rows of the block, `updat_taps` taps a CTA sharing each stage's dO, 64 positions a stage,
// `updat_stages` stages.
struct ConvWgmmaTile {
  int bm, stages, warpgroups, updat_stages, updat_taps;
  constexpr int threads() const { return 128 * warpgroups; }
  constexpr int shared_bytes(int b) const { return stages * (bm * 128 + 64 * b * 2) + 1024; }
  static constexpr int updat_threads(int b) { return 128 * (b / 64); }
  static constexpr int updat_rows() { return 64; }
  constexpr int updat_shared_bytes(int b) const { return updat_stages * (1 + updat_taps) * 64 * b * 2 + 1024; }
};
std::optional<ConvWgmmaTile> conv_wgmma_tile(int b);

// conv_tma_fprop_kernel's shape at b = 64 and 128 (ConvTmaPlan): a producer warpgroup and
// `consumers` warpgroups of 64 channels × 128 rows (swapped), so bm(b) = 128 · consumers / (b / 64)
// rows a tile; `stages` stages of bm pixels × 64 channels and the tap's b × 64 filter slice; 1024
// bytes of slack for the swizzle's alignment, 1024 for the mbarriers, two 8 KiB staging tiles a
// consumer for the epilogue's TMA stores.
struct ConvTmaTile {
  int stages, consumers, updat_stages;
  constexpr int bm(int b) const { return 128 * consumers / (b / 64); }
  constexpr int threads() const { return 128 * (1 + consumers); }
  constexpr int shared_bytes(int b) const {
    return 1024 + stages * (bm(b) * 128 + b * 128) + 1024 + consumers * 2 * 64 * 128;
  }
  // updat (conv_tma_updat_kernel, ConvTmaUpdatPlan): a producer and b / 64 consumer warpgroups,
  // stages of 64 rows of dO and 64 input pixels, b channels each
  static constexpr int updat_threads(int b) { return 128 * (1 + b / 64); }
  constexpr int updat_shared_bytes(int b) const { return 1024 + updat_stages * 2 * 64 * b * 2 + 1024; }
};
std::optional<ConvTmaTile> conv_tma_tile(int b);
// The rank of conv_tma_fprop_kernel's input map for a geometry: 4 without depth (D, T and the
// depth's padding trivial: N, H, W, C), else 5; 0 where TMA's im2col mode cannot take it (bounding
// box corners past [-128, 127] at rank 4 or [-16, 15] at rank 5, a tap's reach past the same
// range, a stride past 8). conv_tma_box gives the corners.
int conv_tma_rank(const ConvGeometry& geometry);
// The CTAs of conv_tma_data_kernel's persistent grid: item i is output block column i % columns
// (column_steps[column] its stages) of row tile i / columns, and CTA p of P takes items p, p + P,
// ..., so it meets only the columns ≡ p (mod gcd(P, columns)). Where the columns' steps differ
// (bprop of a layout whose input block columns hold different counts), the CTAs of the longest
// class set the time; of P from max_ctas − min(columns, 64) + 1 to max_ctas (up to 64 columns, one
// of them ≡ 1 mod columns: every CTA meets every column), the one whose busiest CTA has the least
// work (each CTA's counted exactly, a tile its stages plus one), the largest of those; at most
// 64 · (columns + max_ctas) steps of host work a launch.
std::int64_t conv_tma_grid(const std::vector<std::int64_t>& column_steps, std::int64_t items, std::int64_t max_ctas);
// The updat kernels' positions per CTA (a multiple of stage_rows) over `rows` output positions,
// their grid units × ⌈rows / range⌉ CTAs with `resident` of them at a time: at least two waves'
// worth of ranges (units · ranges ≥ 2 · resident), more where that shortens the last wave: of the
// range counts from there up, the one whose CTAs' rounds × (a range's stages +
// kUpdatEpilogueSteps) is least, the fewest of those; at most 65535 ranges and 2^30 positions a
// range. 14 × 14 layers at b = 64, d = 0.25 (192 units, 98 stages each, 264 resident CTAs) took 3
// ranges: 576 CTAs, 3 rounds where the work is 2.2 (their updat ran 1.3× the time of the 56 × 56
// and 28 × 28 layers of as many FLOPs, H100, 2026-12-07, docs/PERFORMANCE.md "Convolution").
std::int64_t conv_updat_range(std::int64_t rows, std::int64_t units, std::int64_t resident, std::int64_t stage_rows);
// A CTA's fp32 atomic adds of its filter-gradient tile at the end of a range (b × b × taps values),
// in stages of the updat kernels (64 positions of dO and the input: b × 64 × 2 × 2 bytes and up).
inline constexpr std::int64_t kUpdatEpilogueSteps = 2;
// bprop at stride 1 as a forward convolution over dO (conv_tma.cuh's kBackward): the geometry of
// dI = conv(dO, F with its taps reversed and its k and c exchanged), dO's positions the input,
// padding (filter − 1) · dilation − padding; nothing where a stride is not 1 or a padding exceeds
// the filter's reach.
std::optional<ConvGeometry> conv_transposed_geometry(const ConvGeometry& geometry);
// The im2col map's bounding box in dimension d (0: D, 1: H, 2: W): the filter-window corners of the
// first and last outputs relative to the image's first and last positions (lower = −pad before).
std::pair<int, int> conv_tma_box(const ConvGeometry& geometry, int d);

// The implicit-GEMM kernels of templates/bsjit/conv_igemm.cuh for a uniform layout (16-bit dtypes,
// channels last): fprop and bprop (conv_igemm_data_kernel both ways), updat and its store, the
// filter's packing. Launch shapes: data kernels `data_threads` threads, grid (output block
// columns, row tiles of `data_rows`); updat `updat_threads`, grid (blocks · taps, position ranges
// that are multiples of `updat_rows`).
struct GeneratedConvIgemm {
  std::string source, label;
  std::string fprop, bprop, updat, updat_store, pack;  // name expressions
  int block = 0, data_threads = 0, data_rows = 0, updat_threads = 0, updat_rows = 0;
  struct Hopper {
    std::string fprop, bprop, updat;                                // name expressions
    int threads = 0, rows = 0, shared_bytes = 0;                    // the data kernels'
    int updat_threads = 0, updat_rows = 0, updat_shared_bytes = 0;  // updat's
    int updat_taps = 1;  // taps a CTA of updat (its grid: blocks · ⌈taps / updat_taps⌉ CTAs a range)
  };
  std::optional<Hopper> hopper;
  // fprop fed by TMA in im2col mode (templates/bsjit/conv_tma.cuh, sm_90a), a source of its own
  // with the same tables; fprop4 / fprop5 take a 4-D (N, H, W, C) or 5-D input map.
  struct Tma {
    std::string source, label, fprop4, fprop5, bprop4, bprop5, updat4, updat5, pack_backward;  // name expressions
    int threads = 0, rows = 0, shared_bytes = 0;
    int updat_threads = 0, updat_shared_bytes = 0;
    std::uint32_t updat_copy_rows = 64;  // positions a stage of updat (ConvUpdatRange's chunks are multiples)
    std::uint32_t copy_rows = 128;  // pixels an im2col copy brings (the kernel's ConvTmaPlan::kR)
  };
  std::optional<Tma> tma;
  DeviceTables tables;  // kIgemmFpropStart, kIgemmFpropEntries, kIgemmBpropStart, kIgemmBpropEntries,
                        // kIgemmCoords (pointers)
};
// hopper: the kernels of conv_wgmma.cuh (fprop, bprop, updat), where conv_wgmma_tile(b) has a
// tile; the runtime takes them on sm_90a (Conv::autotune may keep the mma.sync ones instead).
// Nothing where the kernels do not apply (fp32, channels first, a layout not uniform).
std::optional<GeneratedConvIgemm> generate_conv_igemm(const ConvLayout& layout, DType dtype, bool channels_last);

// blocksparse's ConvEdgeBias groups: the output positions (a deconvolution's: the convolution's
// input positions) whose receptive field reaches padding, grouped by the set of filter taps that
// fall outside the image (a stride's holes in a deconvolution are not outside), numbered in the
// order of each group's first position (row-major). of[position]: its group, or -1 inside.
struct ConvEdges {
  std::vector<int> of, start, positions;  // start[e] .. start[e + 1]: group e's positions
  int edges = 0;
};
ConvEdges conv_edges(const ConvGeometry& geometry, bool deconv);

struct GeneratedConvEdgeBias {
  std::string source, label, forward, grad, sums;  // name expressions
  int threads = 0;
  ConvEdges edges;
  DeviceTables tables;  // kEdgeOf, kEdgeStart, kEdgePositions (pointers)
};
GeneratedConvEdgeBias generate_conv_edge_bias(const ConvGeometry& geometry, bool deconv, DType dtype,
                                              bool channels_last);

// The kernels' sizes argument for a call over n images (the caller has checked that they fit).
kernels::ConvDims conv_dims(const ConvLayout& layout, const ConvGeometry& geometry, std::int64_t n);

}  // namespace bsjit::generator
