// Layout construction, canonical form, hashing, statistics and file formats (.npy, .json).
#include "bsjit/layout.hpp"

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bsjit/error.hpp"
#include "json_fields.hpp"

namespace bsjit {
namespace {

constexpr std::int64_t kMaxDim = std::numeric_limits<std::int32_t>::max();

void check_shape(std::int64_t rows, std::int64_t cols, const std::string& where) {
  if (rows <= 0 || cols <= 0 || rows > kMaxDim || cols > kMaxDim)
    throw Error(fmt::format("{}: layout shape [{}, {}] is invalid; expected two positive dimensions "
                            "below 2^31",
                            where, rows, cols));
}

// Layout files larger than this are refused before they are read (a dense .npy mask of 46341 ×
// 46341 blocks; any block size makes such a matrix larger than the kernels address).
constexpr std::uintmax_t kMaxLayoutFile = std::uintmax_t(2) << 30;

// The file's bytes: a regular file (or a link to one) of at most kMaxLayoutFile bytes, so that a
// link to /dev/zero or a named pipe is refused rather than read without end.
std::string read_file(const std::filesystem::path& path, const char* what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec) throw Error(fmt::format("cannot open {} file '{}': {}", what, path.string(), ec.message()));
  if (!std::filesystem::is_regular_file(status))
    throw Error(fmt::format("{} file '{}' is not a regular file", what, path.string()));
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(fmt::format("cannot read {} file '{}': {}", what, path.string(), ec.message()));
  if (size > kMaxLayoutFile)
    throw Error(fmt::format("{} file '{}' has {} bytes; layout files of at most {} bytes are read", what, path.string(),
                            size, kMaxLayoutFile));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open {} file '{}': {}", what, path.string(), std::strerror(errno)));
  std::string data(size, '\0');
  in.read(data.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size))
    throw Error(fmt::format("cannot read {} file '{}': {} of {} bytes read", what, path.string(), in.gcount(), size));
  return data;
}

// --- .npy -----------------------------------------------------------------------------------
// Format: "\x93NUMPY", major, minor, header length (u16 for v1, u32 for v2/v3), then a Python
// dict literal {'descr': '<i4', 'fortran_order': False, 'shape': (R, C), } padded with spaces.

struct NpyHeader {
  std::string descr;
  bool fortran = false;
  std::vector<std::int64_t> shape;
};

std::string npy_field(const std::string& header, const std::string& key, const std::string& file) {
  auto k = header.find("'" + key + "'");
  if (k == std::string::npos) throw Error(fmt::format("malformed .npy '{}': header has no '{}' field", file, key));
  auto colon = header.find(':', k);
  if (colon == std::string::npos) throw Error(fmt::format("malformed .npy '{}': no value for '{}'", file, key));
  auto v = header.find_first_not_of(' ', colon + 1);
  if (v == std::string::npos) throw Error(fmt::format("malformed .npy '{}': no value for '{}'", file, key));
  char open = header[v];
  std::size_t end;
  if (open == '\'' || open == '"') {
    end = header.find(open, v + 1);
    if (end == std::string::npos) throw Error(fmt::format("malformed .npy '{}': unterminated '{}'", file, key));
    return header.substr(v + 1, end - v - 1);
  }
  if (open == '(') {
    end = header.find(')', v);
    if (end == std::string::npos) throw Error(fmt::format("malformed .npy '{}': unterminated shape", file));
    return header.substr(v + 1, end - v - 1);
  }
  end = header.find_first_of(",}", v);
  if (end == std::string::npos) throw Error(fmt::format("malformed .npy '{}': bad value for '{}'", file, key));
  auto s = header.substr(v, end - v);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

NpyHeader parse_npy_header(const std::string& data, std::size_t* payload_offset, const std::string& file) {
  static const char kMagic[] = "\x93NUMPY";
  if (data.size() < 10 || std::memcmp(data.data(), kMagic, 6) != 0)
    throw Error(fmt::format("'{}' is not a .npy file (missing the \\x93NUMPY magic)", file));
  int major = static_cast<unsigned char>(data[6]);
  std::size_t len, start;
  if (major == 1) {
    len = static_cast<unsigned char>(data[8]) | (static_cast<unsigned char>(data[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) throw Error(fmt::format("malformed .npy '{}': truncated header", file));
    len = 0;
    for (int i = 0; i < 4; ++i) len |= static_cast<std::size_t>(static_cast<unsigned char>(data[8 + i])) << (8 * i);
    start = 12;
  } else {
    throw Error(fmt::format("'{}': unsupported .npy format version {}; expected 1, 2 or 3", file, major));
  }
  if (start + len > data.size()) throw Error(fmt::format("malformed .npy '{}': header runs past the end of the file", file));
  std::string header = data.substr(start, len);
  NpyHeader h;
  h.descr = npy_field(header, "descr", file);
  auto fo = npy_field(header, "fortran_order", file);
  if (fo == "True") h.fortran = true;
  else if (fo == "False") h.fortran = false;
  else throw Error(fmt::format("malformed .npy '{}': fortran_order is '{}'", file, fo));
  std::string shape = npy_field(header, "shape", file);
  std::stringstream ss(shape);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    item = item.substr(b);
    while (!item.empty() && (item.back() == ' ' || item.back() == 'L')) item.pop_back();
    try {
      std::size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      h.shape.push_back(v);
    } catch (const std::exception&) {
      throw Error(fmt::format("malformed .npy '{}': bad shape entry '{}'", file, item));
    }
  }
  *payload_offset = start + len;
  return h;
}

}  // namespace

// --- construction ----------------------------------------------------------------------------

// Nothing in a layout grows with its dimensions, only with its blocks: a layout of 2^31 - 1 rows and
// one block takes a few bytes.
Layout::Layout(std::int64_t rows, std::int64_t cols, std::vector<std::pair<std::int32_t, std::int32_t>> coords)
    : rows_(rows), cols_(cols), coords_(std::move(coords)) {
  std::sort(coords_.begin(), coords_.end());
  coords_.erase(std::unique(coords_.begin(), coords_.end()), coords_.end());
}

Layout Layout::from_dense(std::int64_t rows, std::int64_t cols, const std::vector<std::uint8_t>& mask) {
  check_shape(rows, cols, "Layout::from_dense");
  if (static_cast<std::int64_t>(mask.size()) != rows * cols)
    throw Error(fmt::format("Layout::from_dense: mask has {} entries; expected rows × cols = {} × {} = {}",
                            mask.size(), rows, cols, rows * cols));
  std::vector<std::pair<std::int32_t, std::int32_t>> coords;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      if (mask[r * cols + c]) coords.emplace_back(static_cast<std::int32_t>(r), static_cast<std::int32_t>(c));
  return Layout(rows, cols, std::move(coords));
}

Layout Layout::from_coords(std::int64_t rows, std::int64_t cols,
                           const std::vector<std::pair<std::int64_t, std::int64_t>>& coords) {
  check_shape(rows, cols, "Layout::from_coords");
  std::vector<std::pair<std::int32_t, std::int32_t>> out;
  out.reserve(coords.size());
  for (auto& [r, c] : coords) {
    if (r < 0 || r >= rows || c < 0 || c >= cols)
      throw Error(fmt::format("Layout::from_coords: block ({}, {}) is outside the [{}, {}] layout", r, c, rows, cols));
    out.emplace_back(static_cast<std::int32_t>(r), static_cast<std::int32_t>(c));
  }
  return Layout(rows, cols, std::move(out));
}

namespace {

constexpr std::int64_t kMaxHeads = 4096;

// The masks of a .npy file: [rows, cols], or with heads, [heads, rows, cols] (one per head).
std::vector<Layout> npy_masks(const std::filesystem::path& path, bool heads) {
  const std::string file = path.string();
  std::string data = read_file(path, ".npy");
  std::size_t offset = 0;
  NpyHeader h = parse_npy_header(data, &offset, file);
  if (h.shape.size() != 2 && !(heads && h.shape.size() == 3))
    throw Error(fmt::format("'{}': layout must be a 2-D array [C/b, K/b]{}; got {} dimensions", file,
                            heads ? " or a 3-D one [heads, rows, cols]"
                                  : " (a 3-D [heads, rows, cols] mask set: "
                                    "Layout::load_heads)",
                            h.shape.size()));
  const bool three = h.shape.size() == 3;
  const std::int64_t count_heads = three ? h.shape[0] : 1;
  if (count_heads < 1 || count_heads > kMaxHeads)
    throw Error(fmt::format("'{}': {} heads; expected 1 to {}", file, count_heads, kMaxHeads));
  const std::int64_t rows = h.shape[three ? 1 : 0], cols = h.shape[three ? 2 : 1];
  check_shape(rows, cols, file);
  std::string d = h.descr;
  if (d.size() < 3) throw Error(fmt::format("'{}': unsupported dtype '{}'", file, d));
  char order = d[0];
  std::string kind = d.substr(1);
  std::size_t width;
  if (kind == "b1" || kind == "u1" || kind == "i1") width = 1;
  else if (kind == "i4" || kind == "u4") width = 4;
  else if (kind == "i8" || kind == "u8") width = 8;
  else
    throw Error(fmt::format("'{}': unsupported dtype '{}'; expected bool, uint8, int32 or int64", file, d));
  if (order != '<' && order != '>' && order != '|' && order != '=')
    throw Error(fmt::format("'{}': unsupported byte order in dtype '{}'", file, d));
  // each of rows and cols below 2^31 and heads at most 4096: the products fit
  const std::size_t plane = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
  const std::size_t available = (data.size() - offset) / width;
  if (available / static_cast<std::size_t>(count_heads) < plane)  // (no product that could wrap)
    throw Error(fmt::format(
        "'{}': truncated: {} bytes of data; shape {} of '{}' needs {} × {} × {}", file, data.size() - offset,
        three ? fmt::format("({}, {}, {})", count_heads, rows, cols) : fmt::format("({}, {})", rows, cols), d,
        count_heads, plane, width));
  std::vector<std::vector<std::uint8_t>> masks(count_heads, std::vector<std::uint8_t>(plane));
  const auto* p = reinterpret_cast<const unsigned char*>(data.data() + offset);
  for (std::size_t i = 0; i < plane * static_cast<std::size_t>(count_heads); ++i) {
    bool nonzero = false;
    for (std::size_t b = 0; b < width; ++b) nonzero |= p[i * width + b] != 0;  // "≠ 0" is the same in either byte order
    // element i of the file is (head, r, c): in C order the last index varies fastest, in Fortran
    // order the first
    std::size_t head, r, c;
    if (!h.fortran) {
      head = i / plane, r = i % plane / cols, c = i % cols;
    } else {
      const std::size_t rest = i / static_cast<std::size_t>(count_heads);
      head = i % static_cast<std::size_t>(count_heads), r = rest % rows, c = rest / rows;
    }
    masks[head][r * cols + c] = nonzero;
  }
  std::vector<Layout> out;
  for (const auto& m : masks) out.push_back(Layout::from_dense(rows, cols, m));
  return out;
}

}  // namespace

Layout Layout::from_npy(const std::filesystem::path& path) { return npy_masks(path, false).front(); }

Layout Layout::from_json(const std::filesystem::path& path) {
  const std::string file = path.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path, "JSON layout"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("malformed JSON layout '{}': {}", file, e.what()));
  }
  try {
    if (j.contains("mask")) {
      const auto& m = j.at("mask");
      if (!m.is_array() || m.empty() || !m[0].is_array())
        throw Error(fmt::format("JSON layout '{}': 'mask' must be a non-empty list of rows", file));
      std::int64_t rows = m.size(), cols = m[0].size();
      check_shape(rows, cols, file);
      std::vector<std::uint8_t> mask(rows * cols);
      for (std::int64_t r = 0; r < rows; ++r) {
        if (!m[r].is_array() || static_cast<std::int64_t>(m[r].size()) != cols)
          throw Error(fmt::format("JSON layout '{}': mask row {} has {} entries; expected {}", file, r,
                                  m[r].is_array() ? m[r].size() : 0, cols));
        for (std::int64_t c = 0; c < cols; ++c) {
          const auto& v = m[r][c];
          if (v.is_boolean()) mask[r * cols + c] = v.get<bool>();
          else if (v.is_number()) mask[r * cols + c] = v.get<double>() != 0.0;
          else throw Error(fmt::format("JSON layout '{}': mask[{}][{}] is not a number or boolean", file, r, c));
        }
      }
      return from_dense(rows, cols, mask);
    }
    if (j.contains("blocks")) {
      const std::string where = fmt::format("JSON layout '{}'", file);
      const std::int64_t rows = json_integer(j.at("rows"), 1, kMaxDim, where + ": 'rows'"),
                         cols = json_integer(j.at("cols"), 1, kMaxDim, where + ": 'cols'");
      if (!j.at("blocks").is_array()) throw Error(where + ": 'blocks' must be a list of [row, col]");
      std::vector<std::pair<std::int64_t, std::int64_t>> coords;
      for (const auto& b : j.at("blocks")) {
        if (!b.is_array() || b.size() != 2)
          throw Error(fmt::format("{}: each block must be [row, col]; got {}", where, b.dump()));
        coords.emplace_back(json_integer(b[0], 0, rows - 1, where + ": a block's row"),
                            json_integer(b[1], 0, cols - 1, where + ": a block's column"));
      }
      return from_coords(rows, cols, coords);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("malformed JSON layout '{}': {}", file, e.what()));
  }
  throw Error(fmt::format("JSON layout '{}': expected an object with 'mask' or with 'rows', 'cols' and 'blocks'", file));
}

Layout Layout::load(const std::filesystem::path& path) {
  auto ext = path.extension().string();
  if (ext == ".npy") return from_npy(path);
  if (ext == ".json") return from_json(path);
  throw Error(fmt::format("layout file '{}': unknown extension '{}'; expected .npy or .json", path.string(), ext));
}

std::vector<Layout> Layout::load_heads(const std::filesystem::path& path) {
  if (path.extension() == ".npy") return npy_masks(path, true);
  return {load(path)};
}

// --- queries ---------------------------------------------------------------------------------

bool Layout::at(std::int64_t row, std::int64_t col) const { return block_index(row, col) >= 0; }

std::pair<std::int64_t, std::int64_t> Layout::block_coord(std::int64_t block) const {
  if (block < 0 || block >= blocks())
    throw Error(fmt::format("block index {} is out of range; the layout has {} blocks", block, blocks()));
  return coords_[block];
}

std::int64_t Layout::block_index(std::int64_t row, std::int64_t col) const {
  if (row < 0 || row >= rows_ || col < 0 || col >= cols_)
    throw Error(fmt::format("block ({}, {}) is outside the [{}, {}] layout", row, col, rows_, cols_));
  const auto key = std::make_pair(static_cast<std::int32_t>(row), static_cast<std::int32_t>(col));
  auto it = std::lower_bound(coords_.begin(), coords_.end(), key);
  return (it != coords_.end() && *it == key) ? it - coords_.begin() : -1;
}

Layout Layout::transposed() const {
  std::vector<std::pair<std::int32_t, std::int32_t>> t;
  t.reserve(coords_.size());
  for (auto& [r, c] : coords_) t.emplace_back(c, r);
  return Layout(cols_, rows_, std::move(t));
}

std::vector<std::uint8_t> Layout::dense() const {
  if (static_cast<double>(rows_) * static_cast<double>(cols_) > static_cast<double>(kMaxLayoutFile))
    throw Error(
        fmt::format("layout [{}, {}]: a dense mask of more than {} entries is not made", rows_, cols_, kMaxLayoutFile));
  std::vector<std::uint8_t> m(rows_ * cols_, 0);
  for (auto& [r, c] : coords_) m[static_cast<std::int64_t>(r) * cols_ + c] = 1;
  return m;
}

LayoutStats Layout::stats() const {
  LayoutStats s;
  s.rows = rows_;
  s.cols = cols_;
  s.blocks = blocks();
  s.density = static_cast<double>(s.blocks) / (static_cast<double>(rows_) * cols_);
  // from the blocks' row (column) indices, sorted: runs of one index are its blocks (memory in
  // the blocks, not the dimensions)
  auto summarize = [&](std::vector<std::int32_t> at, std::int64_t n, std::int64_t* mn, std::int64_t* mx,
                       std::int64_t* empty, double* mean) {
    std::sort(at.begin(), at.end());
    std::int64_t distinct = 0, lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
    for (std::size_t i = 0; i < at.size();) {
      std::size_t j = i;
      while (j < at.size() && at[j] == at[i]) ++j;
      const auto run = static_cast<std::int64_t>(j - i);
      lo = std::min(lo, run), hi = std::max(hi, run), ++distinct, i = j;
    }
    *empty = n - distinct;
    *mn = *empty > 0 ? 0 : lo;
    *mx = hi;
    *mean = static_cast<double>(at.size()) / static_cast<double>(n);
  };
  std::vector<std::int32_t> rows, cols;
  rows.reserve(coords_.size()), cols.reserve(coords_.size());
  for (auto& [r, c] : coords_) rows.push_back(r), cols.push_back(c);
  summarize(std::move(rows), rows_, &s.min_blocks_per_row, &s.max_blocks_per_row, &s.empty_rows,
            &s.mean_blocks_per_row);
  summarize(std::move(cols), cols_, &s.min_blocks_per_col, &s.max_blocks_per_col, &s.empty_cols,
            &s.mean_blocks_per_col);
  return s;
}

// The hash covers a canonical byte string: "bsjit-layout-v1", rows and cols as little-endian
// int64, then the sorted (row, col) pairs as little-endian int32. Independent of how the layout
// was built and of the host's byte order.
LayoutHash Layout::hash() const {
  std::string bytes = "bsjit-layout-v1";
  auto put = [&bytes](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(static_cast<std::uint64_t>(rows_), 8);
  put(static_cast<std::uint64_t>(cols_), 8);
  for (auto& [r, c] : coords_) {
    put(static_cast<std::uint32_t>(r), 4);
    put(static_cast<std::uint32_t>(c), 4);
  }
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  LayoutHash out;
  out.words = {h.high64, h.low64};
  return out;
}

std::string LayoutHash::hex() const { return fmt::format("{:016x}{:016x}", words[0], words[1]); }

void Layout::save_json(const std::filesystem::path& path) const {
  nlohmann::json j;
  j["rows"] = rows_;
  j["cols"] = cols_;
  auto& b = j["blocks"] = nlohmann::json::array();
  for (auto& [r, c] : coords_) b.push_back({r, c});
  std::ofstream out(path);
  out << j.dump() << "\n";
  if (!out) throw Error(fmt::format("cannot write layout file '{}'", path.string()));
}

void Layout::save_npy(const std::filesystem::path& path) const {
  std::string header = fmt::format("{{'descr': '|u1', 'fortran_order': False, 'shape': ({}, {}), }}", rows_, cols_);
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
  out.write(len, 2);
  out.write(header.data(), header.size());
  auto m = dense();
  out.write(reinterpret_cast<const char*>(m.data()), m.size());
  if (!out) throw Error(fmt::format("cannot write layout file '{}'", path.string()));
}

}  // namespace bsjit
