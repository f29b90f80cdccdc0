// The convolution cases the reference, the CPU run of the kernels and the GPU tests share:
// openai/blocksparse's own conv test layouts and geometries, plus uniform masks.
#pragma once

#include <cstdint>
#include <vector>

#include "bsjit/conv_layout.hpp"

namespace bsjit::testing {

// blocksparse's conv test layouts: 4 disjoint blocks of 32 → 48 channels (a grouped convolution),
// and 8 overlapping blocks of 16 → 32 channels at strides 8 and 16 (outputs add where they meet).
inline ConvLayout grouped_conv_layout() {
  std::vector<ConvBlock> blocks;
  for (int g = 0; g < 4; ++g) {
    ConvBlock b;
    for (int i = 0; i < 32; ++i) b.c.push_back(g * 32 + i);
    for (int i = 0; i < 48; ++i) b.k.push_back(g * 48 + i);
    blocks.push_back(b);
  }
  return ConvLayout::from_blocks(128, 192, blocks);
}

inline ConvLayout overlapping_conv_layout() {
  std::vector<ConvBlock> blocks;
  for (int g = 0; g < 8; ++g) {
    ConvBlock b;
    for (int i = 0; i < 16; ++i) b.c.push_back(g * 8 + i);
    for (int i = 0; i < 32; ++i) b.k.push_back(g * 16 + i);
    blocks.push_back(b);
  }
  return ConvLayout::from_blocks(8 * 8 + 8, 8 * 16 + 16, blocks);
}

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
