#include "bsjit/conv_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bsjit/error.hpp"
#include "json_fields.hpp"

namespace bsjit {
namespace {

constexpr std::int64_t kMaxChannels = std::int64_t(1) << 24;
constexpr std::int64_t kMaxEntries = std::int64_t(1) << 26;  // channels listed over all blocks (each side)
constexpr std::uintmax_t kMaxJsonFile = std::uintmax_t(256) << 20;

std::vector<std::int32_t> channel_list(const nlohmann::json& v, std::int64_t count, const std::string& what) {
  if (!v.is_array() || v.empty()) throw Error(fmt::format("{} must be a non-empty list of channels", what));
  std::vector<std::int32_t> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(static_cast<std::int32_t>(json_integer(x, 0, count - 1, what)));
  return out;
}

}  // namespace

ConvLayout::ConvLayout(std::int64_t C, std::int64_t K, std::vector<ConvBlock> blocks)
    : C_(C), K_(K), blocks_(std::move(blocks)) {}

ConvLayout ConvLayout::from_blocks(std::int64_t C, std::int64_t K, std::vector<ConvBlock> blocks) {
  if (C <= 0 || K <= 0 || C > kMaxChannels || K > kMaxChannels)
    throw Error(fmt::format("ConvLayout: {} input and {} output channels; expected 1 to {} each", C, K, kMaxChannels));
  if (blocks.empty()) throw Error("ConvLayout: no block");
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (const auto& [list, count, name] :
         {std::tuple{&blocks[i].c, C, "input"}, std::tuple{&blocks[i].k, K, "output"}}) {
      if (list->empty()) throw Error(fmt::format("ConvLayout: block {} has no {} channel", i, name));
      std::vector<std::int32_t> sorted = *list;
      std::sort(sorted.begin(), sorted.end());
      if (sorted.front() < 0 || sorted.back() >= count)
        throw Error(fmt::format("ConvLayout: block {} names {} channel {}; there are {}", i, name,
                                sorted.front() < 0 ? sorted.front() : sorted.back(), count));
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        throw Error(fmt::format("ConvLayout: block {} lists {} channel {} twice", i, name,
                                *std::adjacent_find(sorted.begin(), sorted.end())));
    }
  }
  return ConvLayout(C, K, std::move(blocks));
}

ConvLayout ConvLayout::load(const std::filesystem::path& path, int block) {
  return block == 0 ? from_json(path) : from_mask(Layout::load(path), block);
}

ConvLayout ConvLayout::from_mask(const Layout& mask, int block) {
  if (block <= 0 || block > 1024) throw Error(fmt::format("ConvLayout::from_mask: block {} is not in 1..1024", block));
  if (mask.rows() * block > kMaxChannels || mask.cols() * block > kMaxChannels || mask.blocks() * block > kMaxEntries)
    throw Error(fmt::format("ConvLayout::from_mask: a [{}, {}] mask of {} blocks at block {} is over {} channels a "
                            "side or {} channel entries",
                            mask.rows(), mask.cols(), mask.blocks(), block, kMaxChannels, kMaxEntries));
  std::vector<ConvBlock> blocks;
  for (const auto& [r, c] : mask.coords()) {
    ConvBlock b;
    for (int i = 0; i < block; ++i) b.c.push_back(r * block + i), b.k.push_back(c * block + i);
    blocks.push_back(std::move(b));
  }
  return from_blocks(mask.rows() * block, mask.cols() * block, std::move(blocks));
}

ConvLayout ConvLayout::from_json(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) || std::filesystem::file_size(path, ec) > kMaxJsonFile)
    throw Error(fmt::format("conv layout '{}': not a regular file of at most {} bytes", file, kMaxJsonFile));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(fmt::format("conv layout '{}' is not a JSON object", file));
  const std::string where = fmt::format("conv layout '{}'", file);
  try {
    if (j.contains("mask")) {
      const int block = static_cast<int>(json_integer(j.at("block"), 1, 1024, where + ": 'block'"));
      const auto& m = j.at("mask");
      if (!m.is_array() || m.empty() || !m[0].is_array() || m[0].empty())
        throw Error(where + ": 'mask' must be a non-empty list of rows");
      const std::int64_t rows = m.size(), cols = m[0].size();
      if (rows * block > kMaxChannels || cols * block > kMaxChannels)
        throw Error(
            fmt::format("{}: {} × {} blocks of {} is over {} channels", where, rows, cols, block, kMaxChannels));
      std::vector<std::uint8_t> dense(rows * cols);
      for (std::int64_t r = 0; r < rows; ++r) {
        if (!m[r].is_array() || static_cast<std::int64_t>(m[r].size()) != cols)
          throw Error(fmt::format("{}: mask row {} does not have {} entries", where, r, cols));
        for (std::int64_t c = 0; c < cols; ++c) {
          const auto& v = m[r][c];
          if (!v.is_boolean() && !v.is_number())
            throw Error(fmt::format("{}: mask[{}][{}] is not a number", where, r, c));
          dense[r * cols + c] = v.is_boolean() ? v.get<bool>() : v.get<double>() != 0.0;
        }
      }
      return from_mask(Layout::from_dense(rows, cols, dense), block);
    }
    const std::int64_t C = json_integer(j.at("C"), 1, kMaxChannels, where + ": 'C'");
    const std::int64_t K = json_integer(j.at("K"), 1, kMaxChannels, where + ": 'K'");
    if (!j.at("blocks").is_array()) throw Error(where + ": 'blocks' must be a list");
    std::vector<ConvBlock> blocks;
    for (const auto& b : j.at("blocks")) {
      if (!b.is_object()) throw Error(where + ": each block must be {\"c\": [...], \"k\": [...]}");
      const std::string at = fmt::format("{}: block {}", where, blocks.size());
      blocks.push_back({channel_list(b.at("c"), C, at + " 'c'"), channel_list(b.at("k"), K, at + " 'k'")});
    }
    return from_blocks(C, K, std::move(blocks));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: {}", where, e.what()));
  }
}

std::int64_t ConvLayout::filter_elements(std::int64_t taps) const { return filter_offset(blocks_.size(), taps); }

std::int64_t ConvLayout::filter_offset(std::size_t block, std::int64_t taps) const {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < block && i < blocks_.size(); ++i)
    n += static_cast<std::int64_t>(blocks_[i].k.size()) * static_cast<std::int64_t>(blocks_[i].c.size()) * taps;
  return n;
}

std::array<std::int64_t, 3> ConvGeometry::out() const {
  std::array<std::int64_t, 3> o{};
  for (int d = 0; d < 3; ++d)
    o[d] = (in[d] + pad_before[d] + pad_after[d] - dilation[d] * (filter[d] - 1) - 1) / stride[d] + 1;
  return o;
}

ConvGeometry ConvGeometry::same(std::array<std::int64_t, 3> in, std::array<std::int64_t, 3> filter,
                                std::array<std::int64_t, 3> stride, std::array<std::int64_t, 3> dilation) {
  ConvGeometry g{in, filter, stride, dilation};
  for (int d = 0; d < 3; ++d) {
    const std::int64_t out = (in[d] + stride[d] - 1) / stride[d];
    const std::int64_t total =
        std::max<std::int64_t>(0, (out - 1) * stride[d] + dilation[d] * (filter[d] - 1) + 1 - in[d]);
    g.pad_before[d] = total / 2, g.pad_after[d] = total - total / 2;
  }
  g.check();
  return g;
}

ConvGeometry ConvGeometry::valid(std::array<std::int64_t, 3> in, std::array<std::int64_t, 3> filter,
                                 std::array<std::int64_t, 3> stride, std::array<std::int64_t, 3> dilation) {
  ConvGeometry g{in, filter, stride, dilation};
  g.check();
  return g;
}

void ConvGeometry::check() const {
  for (int d = 0; d < 3; ++d) {
    if (in[d] < 1 || filter[d] < 1 || stride[d] < 1 || dilation[d] < 1 || pad_before[d] < 0 || pad_after[d] < 0 ||
        in[d] > kMaxChannels || filter[d] > 64 || stride[d] > 64 || dilation[d] > 64)
      throw Error(
          fmt::format("ConvGeometry: dimension {}: input {}, filter {}, stride {}, dilation {}, pads {} {} are "
                      "not all positive (pads at least 0) and within bounds",
                      d, in[d], filter[d], stride[d], dilation[d], pad_before[d], pad_after[d]));
    if (in[d] + pad_before[d] + pad_after[d] < dilation[d] * (filter[d] - 1) + 1)
      throw Error(
          fmt::format("ConvGeometry: dimension {}: the filter ({} taps, dilation {}) is wider than the padded "
                      "input ({})",
                      d, filter[d], dilation[d], in[d] + pad_before[d] + pad_after[d]));
  }
}

}  // namespace bsjit
