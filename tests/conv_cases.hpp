// The convolution cases the reference, the CPU run of the kernels and the GPU tests share:
// openai/blocksparse's own conv test layouts (tools/conv_reference) and geometries, plus uniform
// masks.
#pragma once

#include <cstdint>
#include <vector>

#include "bsjit/conv_layout.hpp"
#include "conv_reference.hpp"

namespace bsjit::testing {

inline ConvLayout grouped_conv_layout() { return reference::blocksparse_grouped_layout(); }
inline ConvLayout overlapping_conv_layout() { return reference::blocksparse_overlapping_layout(); }

struct ConvCase {
  const char* name;
  ConvLayout layout;
  ConvGeometry geometry;
  std::int64_t n;
};

// Filters 1×1×1, 1×1×3, 1×1×5 (dilation 2), 1×3×3 (stride 2), 3×3×3; SAME and VALID; odd sizes; N
// of 1, 2, 3 and 28.
inline std::vector<ConvCase> conv_cases() {
  return {
      {"grouped 1x1x1", grouped_conv_layout(), ConvGeometry::valid({1, 3, 5}, {1, 1, 1}), 2},
      {"grouped 3x3 SAME stride 2", grouped_conv_layout(), ConvGeometry::same({1, 6, 7}, {1, 3, 3}, {1, 2, 2}), 1},
      {"overlapping 1x1x3 SAME", overlapping_conv_layout(), ConvGeometry::same({1, 1, 9}, {1, 1, 3}), 2},
      {"overlapping 1x1x5 VALID dilation 2", overlapping_conv_layout(),
       ConvGeometry::valid({1, 1, 13}, {1, 1, 5}, {1, 1, 1}, {1, 1, 2}), 1},
      {"uniform b8 3x3x3 SAME", ConvLayout::from_mask(Layout::from_coords(3, 2, {{0, 0}, {1, 1}, {2, 0}, {2, 1}}), 8),
       ConvGeometry::same({3, 4, 5}, {3, 3, 3}), 1},
      {"uniform b8 1x3x3 VALID odd sizes, N 28", ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 1}, {1, 0}}), 8),
       ConvGeometry::valid({1, 5, 3}, {1, 3, 3}), 28},
      // channels last, a matmul (generator::conv_matmul_plan); channels first, the direct kernels
      {"uniform b16 1x1x1 (a matmul)",
       ConvLayout::from_mask(Layout::from_coords(3, 4, {{0, 1}, {2, 0}, {1, 1}, {0, 3}, {2, 2}}), 16),
       ConvGeometry::valid({2, 3, 5}, {1, 1, 1}), 3}};
}

// Uniform layouts of 16- to 128-channel blocks: with 16-bit activations stored channels last, the
// cases of the tensor-core kernels (templates/bsjit/conv_igemm.cuh); the direct kernels' otherwise.
// Every block size; 1, 2 and 3 dimensions; strides, dilations, SAME and VALID; row tiles cut short;
// an output block column with no block (mask [C / b, K / b]); taps > 1 and a strided 1 × 1; strides
// with dilations and in 3 dimensions (bprop's row classes); enough output positions that updat
// splits them into several ranges.
inline std::vector<ConvCase> tensor_core_conv_cases() {
  const Layout column_empty = Layout::from_coords(3, 3, {{0, 0}, {1, 0}, {2, 2}, {0, 2}});
  return {
      {"uniform b16 3x3 SAME", ConvLayout::from_mask(column_empty, 16), ConvGeometry::same({1, 9, 11}, {1, 3, 3}), 3},
      {"uniform b16 3x3 SAME, N 8", ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 1}, {0, 1}}), 16),
       ConvGeometry::same({1, 16, 16}, {1, 3, 3}), 8},
      {"uniform b32 1x3x3 SAME stride 2 odd sizes", ConvLayout::from_mask(column_empty, 32),
       ConvGeometry::same({1, 7, 9}, {1, 3, 3}, {1, 2, 2}), 2},
      {"uniform b64 3x3x3 VALID dilation 2 in H",
       ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 0}, {1, 1}}), 64),
       ConvGeometry::valid({4, 7, 5}, {3, 3, 3}, {1, 1, 1}, {1, 2, 1}), 2},
      {"uniform b128 1x1x3 SAME dilation 2",
       ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 1}, {1, 0}, {1, 1}}), 128),
       ConvGeometry::same({1, 1, 37}, {1, 1, 3}, {1, 1, 1}, {1, 1, 2}), 2},
      {"uniform b16 1x1x5 SAME stride 2 dilation 3",
       ConvLayout::from_mask(Layout::from_coords(2, 2, {{0, 0}, {1, 0}, {0, 1}}), 16),
       ConvGeometry::same({1, 1, 23}, {1, 1, 5}, {1, 1, 2}, {1, 1, 3}), 2},
      {"uniform b64 3x3x3 SAME stride 2", ConvLayout::from_mask(Layout::from_coords(1, 2, {{0, 0}, {0, 1}}), 64),
       ConvGeometry::same({3, 5, 4}, {3, 3, 3}, {2, 2, 2}), 1},
      {"uniform b32 1x1 stride 2 (not a matmul)",
       ConvLayout::from_mask(Layout::from_coords(2, 3, {{0, 0}, {1, 1}, {0, 2}}), 32),
       ConvGeometry::valid({1, 6, 5}, {1, 1, 1}, {1, 2, 2}), 3}};
}

}  // namespace bsjit::testing
