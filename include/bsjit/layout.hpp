// A block-sparsity layout: a 2-D mask over the blocks of a weight matrix W[C, K].
//
// rows = C / block, cols = K / block. Entry (r, c) is true when the b×b block W[r·b:(r+1)·b,
// c·b:(c+1)·b] is stored. The block size is not part of the layout: the same mask serves any b.
//
// Order of the nonzero blocks (the first dimension of W stored as [blocks, b, b]): row-major over
// the mask, i.e. sorted by row, then by column, as numpy.nonzero and openai/blocksparse's
// block_coord give them. Example, a 2×3 mask
//     1 0 1
//     0 1 0
// stores three blocks: index 0 = (0, 0), 1 = (0, 2), 2 = (1, 1).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace bsjit {

struct LayoutStats {
  std::int64_t rows = 0, cols = 0, blocks = 0;
  double density = 0.0;
  std::int64_t min_blocks_per_row = 0, max_blocks_per_row = 0;
  std::int64_t min_blocks_per_col = 0, max_blocks_per_col = 0;
  std::int64_t empty_rows = 0, empty_cols = 0;
  double mean_blocks_per_row = 0.0, mean_blocks_per_col = 0.0;
};

// 128-bit content hash, stable across platforms and releases (changing it changes every cache key).
struct LayoutHash {
  std::array<std::uint64_t, 2> words{};
  std::string hex() const;  // 32 lowercase hex digits, high word first
  bool operator==(const LayoutHash& o) const { return words == o.words; }
};

class Layout {
 public:
  // Dense mask, row-major, rows × cols entries; any nonzero value marks a block.
  static Layout from_dense(std::int64_t rows, std::int64_t cols, const std::vector<std::uint8_t>& mask);
  // Coordinates (row, col) of the nonzero blocks, any order; duplicates are merged.
  static Layout from_coords(std::int64_t rows, std::int64_t cols,
                            const std::vector<std::pair<std::int64_t, std::int64_t>>& coords);
  // A numpy .npy file: 2-D, dtype bool, uint8, int32 or int64, C or Fortran order.
  static Layout from_npy(const std::filesystem::path& path);
  // A JSON file: {"rows": R, "cols": C, "blocks": [[r, c], ...]} or {"mask": [[0, 1, ...], ...]}.
  static Layout from_json(const std::filesystem::path& path);
  // By extension: .npy or .json.
  static Layout load(const std::filesystem::path& path);
  // Attention masks: a .npy of shape [heads, rows, cols] (openai/blocksparse's form, as numpy saves
  // it) gives one Layout per head; a 2-D .npy or a JSON layout gives one.
  static std::vector<Layout> load_heads(const std::filesystem::path& path);

  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  std::int64_t blocks() const { return static_cast<std::int64_t>(coords_.size()); }
  bool at(std::int64_t row, std::int64_t col) const;

  // Block index ↔ (row, col), in the order documented above.
  std::pair<std::int64_t, std::int64_t> block_coord(std::int64_t block) const;
  std::int64_t block_index(std::int64_t row, std::int64_t col) const;  // -1 when not stored
  const std::vector<std::pair<std::int32_t, std::int32_t>>& coords() const { return coords_; }

  // The layout of Wᵀ ([cols, rows] mask). Its block order differs: map with block_index.
  Layout transposed() const;

  LayoutStats stats() const;
  LayoutHash hash() const;
  std::vector<std::uint8_t> dense() const;  // row-major 0/1 mask
  void save_json(const std::filesystem::path& path) const;
  void save_npy(const std::filesystem::path& path) const;  // uint8, C order

  bool operator==(const Layout& o) const {
    return rows_ == o.rows_ && cols_ == o.cols_ && coords_ == o.coords_;
  }

 private:
  Layout(std::int64_t rows, std::int64_t cols, std::vector<std::pair<std::int32_t, std::int32_t>> coords);
  std::int64_t rows_ = 0, cols_ = 0;
  std::vector<std::pair<std::int32_t, std::int32_t>> coords_;  // sorted row-major, unique
};

}  // namespace bsjit
