#include "bsjit/layout.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "bsjit/error.hpp"

namespace bsjit {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("bsjit-layout-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Writes a .npy file by hand, as numpy would: version 1 or 2 header, given descr and byte payload.
void write_npy_shape(const fs::path& p, const std::string& descr, bool fortran, const std::string& shape,
                     const std::string& payload, int version = 1) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': (" + shape + "), }";
  std::size_t prefix = version == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(p, std::ios::binary);
  out.write("\x93NUMPY", 6);
  out.put(static_cast<char>(version));
  out.put(0);
  std::size_t len = header.size();
  for (std::size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out << header << payload;
}

void write_npy(const fs::path& p, const std::string& descr, bool fortran, std::int64_t r, std::int64_t c,
               const std::string& payload, int version = 1) {
  write_npy_shape(p, descr, fortran, std::to_string(r) + ", " + std::to_string(c), payload, version);
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The 2×3 mask used throughout:  1 0 1 / 0 1 0
const std::vector<std::uint8_t> kMask = {1, 0, 1, 0, 1, 0};

TEST(Layout, DenseAndCoordsAgreeAndOrderBlocksRowMajor) {
  Layout a = Layout::from_dense(2, 3, kMask);
  Layout b = Layout::from_coords(2, 3, {{1, 1}, {0, 2}, {0, 0}, {0, 2}});  // any order, duplicates merged
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.blocks(), 3);
  EXPECT_EQ(a.block_coord(0), (std::pair<std::int64_t, std::int64_t>{0, 0}));
  EXPECT_EQ(a.block_coord(1), (std::pair<std::int64_t, std::int64_t>{0, 2}));
  EXPECT_EQ(a.block_coord(2), (std::pair<std::int64_t, std::int64_t>{1, 1}));
  EXPECT_EQ(a.block_index(0, 2), 1);
  EXPECT_EQ(a.block_index(1, 0), -1);
  EXPECT_TRUE(a.at(1, 1));
  EXPECT_FALSE(a.at(0, 1));
  EXPECT_EQ(a.dense(), kMask);
  EXPECT_THROW(a.block_coord(3), Error);
  EXPECT_THROW(a.block_index(2, 0), Error);
}

TEST(Layout, RejectsBadShapesAndCoordinates) {
  EXPECT_THROW(Layout::from_dense(2, 3, {1, 0, 1}), Error);
  EXPECT_THROW(Layout::from_dense(0, 3, {}), Error);
  EXPECT_THROW(Layout::from_coords(2, 2, {{2, 0}}), Error);
  EXPECT_THROW(Layout::from_coords(2, 2, {{0, -1}}), Error);
}

TEST(Layout, Transposed) {
  Layout t = Layout::from_dense(2, 3, kMask).transposed();
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(t.cols(), 2);
  EXPECT_EQ(t.dense(), (std::vector<std::uint8_t>{1, 0, 0, 1, 1, 0}));
}

TEST(Layout, Stats) {
  LayoutStats s = Layout::from_dense(3, 3, {1, 1, 0, 0, 0, 0, 1, 0, 0}).stats();
  EXPECT_EQ(s.blocks, 3);
  EXPECT_DOUBLE_EQ(s.density, 3.0 / 9.0);
  EXPECT_EQ(s.min_blocks_per_row, 0);
  EXPECT_EQ(s.max_blocks_per_row, 2);
  EXPECT_EQ(s.empty_rows, 1);
  EXPECT_EQ(s.max_blocks_per_col, 2);
  EXPECT_EQ(s.empty_cols, 1);
  EXPECT_DOUBLE_EQ(s.mean_blocks_per_col, 1.0);
}

TEST(Layout, HashIsStableAndSensitive) {
  Layout a = Layout::from_dense(2, 3, kMask);
  // Pinned value: changing the hash changes every cache key, so it must be deliberate.
  EXPECT_EQ(a.hash().hex(), "7f8ac0a1ebbe878348d13a900550ddd4");
  EXPECT_EQ(a.hash(), Layout::from_coords(2, 3, {{1, 1}, {0, 0}, {0, 2}}).hash());
  EXPECT_FALSE(a.hash() == Layout::from_dense(2, 3, {1, 0, 1, 0, 0, 1}).hash());
  EXPECT_FALSE(a.hash() == Layout::from_dense(3, 2, {1, 0, 1, 0, 1, 0}).hash());  // same bits, other shape
  EXPECT_EQ(a.hash().hex().size(), 32u);
}

TEST(Layout, NpyEveryDtypeAndOrder) {
  TempDir dir;
  // Fortran order stores column by column: the 2×3 mask's columns are (1,0), (0,1), (1,0).
  const std::vector<std::uint8_t> fortran = {1, 0, 0, 1, 1, 0};
  struct Case {
    std::string descr;
    std::string c_payload, f_payload;
  };
  std::vector<Case> cases = {
      {"|b1", bytes_of(kMask), bytes_of(fortran)},
      {"|u1", bytes_of(kMask), bytes_of(fortran)},
      {"<i4", bytes_of(std::vector<std::int32_t>(kMask.begin(), kMask.end())),
       bytes_of(std::vector<std::int32_t>(fortran.begin(), fortran.end()))},
      {"<i8", bytes_of(std::vector<std::int64_t>(kMask.begin(), kMask.end())),
       bytes_of(std::vector<std::int64_t>(fortran.begin(), fortran.end()))},
  };
  const Layout want = Layout::from_dense(2, 3, kMask);
  for (const auto& c : cases) {
    for (int version : {1, 2}) {
      auto p = dir.path / ("m" + std::to_string(version) + ".npy");
      write_npy(p, c.descr, false, 2, 3, c.c_payload, version);
      EXPECT_EQ(Layout::from_npy(p), want) << c.descr << " C order, v" << version;
      write_npy(p, c.descr, true, 2, 3, c.f_payload, version);
      EXPECT_EQ(Layout::load(p), want) << c.descr << " Fortran order, v" << version;
    }
  }
  // Values other than 1 count as nonzero; int32 with a large value
  auto p = dir.path / "big.npy";
  write_npy(p, "<i4", false, 1, 2, bytes_of(std::vector<std::int32_t>{0, 1 << 20}));
  EXPECT_EQ(Layout::from_npy(p), Layout::from_dense(1, 2, {0, 1}));
}

TEST(Layout, NpyRoundTrip) {
  TempDir dir;
  std::mt19937 rng(3);
  std::vector<std::uint8_t> m(17 * 23);
  for (auto& v : m) v = rng() % 3 == 0;
  Layout l = Layout::from_dense(17, 23, m);
  l.save_npy(dir.path / "l.npy");
  EXPECT_EQ(Layout::load(dir.path / "l.npy"), l);
  l.save_json(dir.path / "l.json");
  EXPECT_EQ(Layout::load(dir.path / "l.json"), l);
}

TEST(Layout, MalformedNpyFilesAreClearErrors) {
  TempDir dir;
  auto p = dir.path / "bad.npy";
  auto expect_error = [&](const std::string& needle) {
    try {
      Layout::from_npy(p);
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  { std::ofstream(p) << "not a numpy file at all"; }
  expect_error("not a .npy file");
  write_npy(p, "<f4", false, 2, 3, std::string(24, '\0'));
  expect_error("unsupported dtype");
  write_npy(p, "|u1", false, 2, 3, std::string(4, '\1'));  // 4 of 6 bytes
  expect_error("truncated");
  {
    std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 4), }";
    std::ofstream out(p, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(header.size()));
    out.put(0);
    out << header << std::string(24, '\1');
  }
  expect_error("2-D");
  {
    std::ofstream out(p, std::ios::binary);
    out.write("\x93NUMPY\x01\x00\xff\x00", 10);  // header longer than the file
  }
  expect_error("header");
  EXPECT_THROW(Layout::from_npy(dir.path / "missing.npy"), Error);
}

TEST(Layout, JsonBothFormsAndMalformed) {
  TempDir dir;
  auto p = dir.path / "l.json";
  const Layout want = Layout::from_dense(2, 3, kMask);
  { std::ofstream(p) << R"({"mask": [[1, 0, 1], [0, true, false]]})"; }
  EXPECT_EQ(Layout::from_json(p), want);
  { std::ofstream(p) << R"({"rows": 2, "cols": 3, "blocks": [[1, 1], [0, 0], [0, 2]]})"; }
  EXPECT_EQ(Layout::load(p), want);
  for (const char* bad : {R"({"mask": [[1, 0], [1]]})", R"({"rows": 2, "cols": 3, "blocks": [[5, 0]]})",
                          R"({"rows": 2, "blocks": []})", R"({"something": 1})", R"({"mask": [[1, "x"]]})",
                          R"([1, 2)", R"({"rows": 2, "cols": 3, "blocks": [[1]]})"}) {
    { std::ofstream(p) << bad; }
    EXPECT_THROW(Layout::from_json(p), Error) << bad;
  }
  EXPECT_THROW(Layout::load(dir.path / "l.txt"), Error);
}

// Hostile files end in an Error naming what is wrong, never an abort: a shape whose size wraps
// 64 bits, a link to an endless device, dimensions up to 2^31 - 1 with a handful of blocks (nothing
// allocated per row or column), and JSON numbers that are not integers in range.
TEST(Layout, HostileFilesAreClearErrorsAndHugeShapesCostNothing) {
  TempDir dir;
  auto message = [](auto&& load) -> std::string {
    try {
      load();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const auto npy = dir.path / "wrap.npy";
  write_npy(npy, "<i8", false, 1263665316, 1824726041, std::string(64, '\1'));  // rows · cols · 8 wraps
  EXPECT_NE(message([&] { Layout::from_npy(npy); }).find("truncated"), std::string::npos);
  const auto zero = dir.path / "zero.npy";
  fs::create_symlink("/dev/zero", zero);
  EXPECT_NE(message([&] { Layout::from_npy(zero); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(message([&] { Layout::load(dir.path); }).find("unknown extension"), std::string::npos);

  const auto json = dir.path / "l.json";
  { std::ofstream(json) << R"({"rows": 2147483647, "cols": 268435456, "blocks": [[0, 0], [2147483646, 7]]})"; }
  const Layout huge = Layout::from_json(json);
  EXPECT_EQ(huge.blocks(), 2);
  EXPECT_EQ(huge.block_index(2147483646, 7), 1);
  EXPECT_EQ(huge.block_index(5, 5), -1);
  const LayoutStats s = huge.stats();
  EXPECT_EQ(s.empty_rows, 2147483645);
  EXPECT_EQ(s.max_blocks_per_row, 1);
  EXPECT_EQ(s.min_blocks_per_col, 0);
  EXPECT_THROW(huge.dense(), Error) << "no dense mask of 2^59 entries";
  for (const char* bad :
       {R"({"rows": 2147483648, "cols": 1, "blocks": []})", R"({"rows": 1e300, "cols": 1, "blocks": []})",
        R"({"rows": 2.5, "cols": 1, "blocks": []})", R"({"rows": -5, "cols": 1, "blocks": []})",
        R"({"rows": 0, "cols": 1, "blocks": []})", R"({"rows": "2", "cols": 1, "blocks": []})",
        R"({"rows": 2, "cols": 2, "blocks": [[0, 1e300]]})", R"({"rows": 2, "cols": 2, "blocks": [[0.5, 0]]})",
        R"({"rows": 2, "cols": 2, "blocks": [[0, -1]]})", R"({"rows": 2, "cols": 2, "blocks": {"a": 1}})",
        R"({"rows": 18446744073709551615, "cols": 2, "blocks": []})"}) {
    { std::ofstream(json) << bad; }
    const std::string m = message([&] { Layout::from_json(json); });
    EXPECT_NE(m.find("JSON layout"), std::string::npos) << bad << ": " << m;
  }
}

}  // namespace
}  // namespace bsjit

namespace bsjit {
namespace {

// A [heads, rows, cols] mask set as numpy saves it (openai/blocksparse's form): one Layout per head,
// in C and in Fortran order; a 2-D file is one head; from_npy refuses 3-D, naming load_heads.
TEST(Layout, ThreeDimensionalMasksGiveOneLayoutPerHead) {
  TempDir dir;
  // heads 2, rows 2, cols 3: head 0 = [[1 0 1] [0 1 0]], head 1 = [[0 0 0] [1 1 1]]
  const std::uint8_t m[2][2][3] = {{{1, 0, 1}, {0, 1, 0}}, {{0, 0, 0}, {1, 1, 1}}};
  std::string c_order, f_order;
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) c_order.push_back(static_cast<char>(m[h][r][c]));
  for (int c = 0; c < 3; ++c)
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) f_order.push_back(static_cast<char>(m[h][r][c]));
  const Layout head0 = Layout::from_coords(2, 3, {{0, 0}, {0, 2}, {1, 1}});
  const Layout head1 = Layout::from_coords(2, 3, {{1, 0}, {1, 1}, {1, 2}});
  for (bool fortran : {false, true}) {
    const auto p = dir.path / (fortran ? "f.npy" : "c.npy");
    write_npy_shape(p, "|u1", fortran, "2, 2, 3", fortran ? f_order : c_order);
    const auto heads = Layout::load_heads(p);
    ASSERT_EQ(heads.size(), 2u);
    EXPECT_EQ(heads[0], head0) << (fortran ? "Fortran" : "C");
    EXPECT_EQ(heads[1], head1) << (fortran ? "Fortran" : "C");
    try {
      Layout::from_npy(p);
      ADD_FAILURE() << "from_npy takes 2-D files only";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("load_heads"), std::string::npos) << e.what();
    }
  }
  write_npy(dir.path / "two.npy", "|u1", false, 2, 3, c_order.substr(0, 6));
  const auto one = Layout::load_heads(dir.path / "two.npy");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], head0);
  write_npy_shape(dir.path / "short.npy", "|u1", false, "2, 2, 3", c_order.substr(0, 11));
  EXPECT_THROW(Layout::load_heads(dir.path / "short.npy"), Error);
  write_npy_shape(dir.path / "many.npy", "|u1", false, "5000, 1, 1", std::string(5000, '\1'));
  EXPECT_THROW(Layout::load_heads(dir.path / "many.npy"), Error);
}

}  // namespace
}  // namespace bsjit
