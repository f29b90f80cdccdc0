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

}  // namespace bsjit::testing
