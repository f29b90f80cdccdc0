// The layout of a block-sparse convolution: which input channels feed which output channels, in
// blocks, as openai/blocksparse's BlocksparseConv takes it (BCK). Only the channels are sparse: the
// filter taps and the spatial positions stay dense.
//
// A block is a list of input channels and a list of output channels (any sizes; blocks may overlap
// in either, and then their outputs add) with its own filter [K_b, C_b, T, R, S]: the filter of the
// whole layout is the blocks' filters one after the other, in block order. The common case, a
// uniform mask [C / b, K / b] over channel blocks of b, is from_mask (a block-diagonal mask is a
// grouped convolution).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "bsjit/layout.hpp"

namespace bsjit {

struct ConvBlock {
  std::vector<std::int32_t> c;  // input channels, each once
  std::vector<std::int32_t> k;  // output channels, each once
};

class ConvLayout {
 public:
  // Blocks over C input and K output channels. Throws Error for a block with no channel, a channel
  // out of range or listed twice in one block, or no block at all.
  static ConvLayout from_blocks(std::int64_t C, std::int64_t K, std::vector<ConvBlock> blocks);
  // The uniform layout of a [C / b, K / b] block mask: block (r, c) of the mask is input channels
  // [r·b, (r+1)·b) and output channels [c·b, (c+1)·b), in the mask's block order.
  static ConvLayout from_mask(const Layout& mask, int block);
  // JSON: {"C": 64, "K": 96, "blocks": [{"c": [0, 1, ...], "k": [5, 6, ...]}, ...]}, or
  // {"block": 32, "mask": [[1, 0], [0, 1]]} for a uniform one.
  static ConvLayout from_json(const std::filesystem::path& path);
  // from_json where block is 0; else a matmul layout file (Layout::load: .npy or .json) read as a
  // [C / block, K / block] mask (from_mask).
  static ConvLayout load(const std::filesystem::path& path, int block = 0);

  std::int64_t C() const { return C_; }
  std::int64_t K() const { return K_; }
  const std::vector<ConvBlock>& blocks() const { return blocks_; }
  // Elements of the layout's filter for T·R·S taps: Σ K_b · C_b · taps.
  std::int64_t filter_elements(std::int64_t taps) const;
  // Where block i's filter starts in the layout's filter (elements, for `taps` taps).
  std::int64_t filter_offset(std::size_t block, std::int64_t taps) const;

 private:
  ConvLayout(std::int64_t C, std::int64_t K, std::vector<ConvBlock> blocks);
  std::int64_t C_ = 0, K_ = 0;
  std::vector<ConvBlock> blocks_;
};

// Where a convolution reads: 1-, 2- or 3-D (D, H, W; unused dimensions 1), the filter's taps (T, R,
// S), strides, dilations and padding before and after in each dimension.
struct ConvGeometry {
  std::array<std::int64_t, 3> in{1, 1, 1};      // D, H, W
  std::array<std::int64_t, 3> filter{1, 1, 1};  // T, R, S
  std::array<std::int64_t, 3> stride{1, 1, 1};
  std::array<std::int64_t, 3> dilation{1, 1, 1};
  std::array<std::int64_t, 3> pad_before{0, 0, 0};
  std::array<std::int64_t, 3> pad_after{0, 0, 0};

  // The output's M, P, Q: (in + pads − dilation·(filter − 1) − 1) / stride + 1 per dimension.
  std::array<std::int64_t, 3> out() const;
  std::int64_t taps() const { return filter[0] * filter[1] * filter[2]; }
  // Padding as TensorFlow's SAME (the output is ceil(in / stride); the odd pad after) or VALID (none).
  static ConvGeometry same(std::array<std::int64_t, 3> in, std::array<std::int64_t, 3> filter,
                           std::array<std::int64_t, 3> stride = {1, 1, 1},
                           std::array<std::int64_t, 3> dilation = {1, 1, 1});
  static ConvGeometry valid(std::array<std::int64_t, 3> in, std::array<std::int64_t, 3> filter,
                            std::array<std::int64_t, 3> stride = {1, 1, 1},
                            std::array<std::int64_t, 3> dilation = {1, 1, 1});
  // Throws Error when a size is not positive or the output would be empty.
  void check() const;
};

}  // namespace bsjit
